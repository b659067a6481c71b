#!/usr/bin/env bash
# The wheel works outside the clone: build it, install it (not editable) in a clean venv, and from an empty folder run
# gleak --version, the README's first `gleak labels`, and an audit that writes JSON, HTML and SARIF. That needs the
# package data: the report schema and templates, the label attacks' YAML and the shipped LPIPS trunk.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
command -v uv >/dev/null 2>&1 || "$PY" -m pip install -q uv
UV="$(command -v uv || echo "$PY -m uv")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
$UV build -q --wheel -o "$work/dist"
wheel=$(ls "$work"/dist/gleak-*.whl)
for data in gleak/report/schema.json gleak/report/templates/report.html.j2 gleak/metrics/weights/lpips_alex_trunk.safetensors \
            gleak/attacks/labels/; do
    "$PY" - "$wheel" "$data" <<'PY' || { echo "error: the wheel lacks $data" >&2; exit 1; }
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
want = sys.argv[2]
ok = any(n.endswith(".yaml") and n.startswith(want) for n in names) if want.endswith("/") else want in names
sys.exit(0 if ok else 1)
PY
done
$UV venv -q -p "$PY" "$work/venv"
# the versions CI locked (gleak's own requirements come from the wheel's metadata)
VIRTUAL_ENV="$work/venv" $UV pip install -q -r lock/dev.txt
VIRTUAL_ENV="$work/venv" $UV pip install -q --no-deps "$wheel"
G="$work/venv/bin/gleak"
S="$ROOT/samples"
mkdir "$work/elsewhere" && cd "$work/elsewhere"
"$G" --version
"$G" labels "$S/captures/fedsgd_b32.safetensors" --model "$S/models/lenet_untrained.safetensors" \
    --aux "$S/data/mnist_aux.safetensors" > labels.txt
grep -q "rlu" labels.txt
"$G" audit "$S/captures/fedsgd_b8.safetensors" --model "$S/models/lenet_untrained.safetensors" \
    --aux "$S/data/mnist_aux.safetensors" --budget standard -o audit --format json,html,sarif --fail-on none -q
"$work/venv/bin/python" - <<'PY'
import json, pathlib
from importlib.resources import files
import gleak
assert "site-packages" in gleak.__file__, gleak.__file__  # the installed wheel, not the clone
schema = json.loads(files("gleak.report").joinpath("schema.json").read_text())
report = json.loads(pathlib.Path("audit/report.json").read_text())
sarif = json.loads(pathlib.Path("audit/report.sarif").read_text())
html = pathlib.Path("audit/report.html").read_text()
assert report["report"] == "audit" and report["captures"], "empty audit"
assert sarif["version"] == "2.1.0" and "<html" in html.lower()
from gleak.metrics.perceptual import load_lpips
lpips = load_lpips("alex")
assert lpips.available and "site-packages" in (lpips.source or ""), lpips.reason or lpips.source
print(f"wheel {gleak.__version__} from {pathlib.Path(gleak.__file__).parent}: labels, audit (json, html, sarif) "
      f"written outside the clone; schema {schema['$id']}; LPIPS from {lpips.source}")
PY
