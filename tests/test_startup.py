"""Start-up and CLI rough edges: no torch for help/version/usage errors, --version, --threads, attack names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gleak import __version__
from gleak.attacks import get_attack
from gleak.errors import GleakError

from .conftest import CNN, FEDSGD, LENET, ROOT

CIFAR_CAPTURE = ROOT / "samples/captures/cifar10_b8.safetensors"
LABEL_ATTACKS = ("idlg", "ilrg", "llg", "llg-plus", "llg-star", "posterior", "rlu", "softlabel", "zlg", "zlg-plus")

# Runs the CLI in-process for each argument list, then prints whether torch was imported along the way.
PROBE = """
import json, sys
from gleak.cli import app
codes = []
for args in json.loads(sys.argv[1]):
    try:
        app(args)
    except SystemExit as e:
        codes.append(e.code)
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}))
"""


@pytest.fixture(autouse=True)
def keep_threads():
    """The CLI sets torch's thread count: give it back after each test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_python_dash_m_help_does_not_import_torch() -> None:
    code = ("import runpy, sys\nsys.argv = ['gleak', '--help']\ntry:\n"
            "    runpy.run_module('gleak', run_name='__main__')\n"
            "finally:\n    sys.stderr.write('TORCH=%s' % ('torch' in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "reconstruct" in r.stdout
    assert r.stderr.endswith("TORCH=False"), r.stderr


def test_help_version_and_usage_errors_do_not_import_torch(tmp_path: Path) -> None:
    cases = [["--help"], ["--version"], *[[c, "--help"] for c in ("inspect", "attacks", "simulate", "labels",
                                                                   "reconstruct")],
             ["labels"], ["reconstruct", str(FEDSGD)], ["labels", str(FEDSGD), "--batch-size", "0"],
             ["--bogus"], ["nonsense"], ["--threads", "0", "labels", str(FEDSGD)]]
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True, cwd=ROOT)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["codes"] == [0] * 7 + [2] * 6
    assert out["torch"] is False


def test_help_does_not_import_transformers() -> None:
    """The text extra (issue 37) loads only when a language model is read: `gleak --help` and every command's help
    stay fast with it installed."""
    cases = [["--help"], *[[c, "--help"] for c in ("inspect", "simulate", "labels", "audit")]]
    code = PROBE.replace('"torch": "torch" in sys.modules', '"torch": "transformers" in sys.modules')
    r = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True, cwd=ROOT)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["codes"] == [0] * len(cases)
    assert out["torch"] is False  # here: whether transformers was imported


def test_version(gleak) -> None:
    r = gleak("--version")
    assert r.exit_code == 0 and r.stdout == f"gleak {__version__}\n"


def test_threads_default_option_and_env(gleak, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("GLEAK_THREADS", raising=False)
    args = ("labels", FEDSGD, "--model", LENET, "--format", "json", "-a", "llg")
    assert json.loads(gleak(*args).stdout)["threads"] == 1  # the default
    r = gleak("--threads", "2", *args, "-v")
    assert r.exit_code == 0 and json.loads(r.stdout)["threads"] == 2 and "threads: 2" in r.stderr
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("GLEAK_THREADS", "3")
    out = tmp_path / "report.json"
    assert gleak(*args, "-o", out).exit_code == 0
    assert json.loads(out.read_text())["threads"] == 3
    assert json.loads(gleak("--threads", "1", *args).stdout)["threads"] == 1  # the option beats the variable
    monkeypatch.setenv("GLEAK_THREADS", "many")
    r = gleak(*args)
    assert r.exit_code == 2 and "GLEAK_THREADS" in r.stderr


def test_did_you_mean() -> None:
    with pytest.raises(GleakError, match="did you mean 'idlg'"):
        get_attack("idgl")
    with pytest.raises(GleakError, match="did you mean 'zlg-plus'"):
        get_attack("zlgplus", task="labels")
    with pytest.raises(GleakError) as e:
        get_attack("qqqq")
    assert "did you mean" not in str(e.value) and "Known attacks: calibrated, dager, dlg" in str(e.value)


def test_labels_suggests_label_attacks_only(gleak) -> None:
    r = gleak("labels", FEDSGD, "--model", LENET, "-a", "idgl")
    assert r.exit_code == 2 and "did you mean 'idlg'?" in r.stderr
    assert "'ig'" not in r.stderr and " dlg," not in r.stderr


@pytest.mark.parametrize(("name", "fragment"), [
    ("idlg", "'idlg' is a label attack, not a reconstruction attack."),
    ("idl", "did you mean 'dlg'?"),
])
def test_reconstruct_attack_errors_name_reconstruction_attacks_only(gleak, tmp_path: Path, name: str,
                                                                    fragment: str) -> None:
    r = gleak("reconstruct", CIFAR_CAPTURE, "--model", CNN, "-o", tmp_path / "out", "-a", name)
    assert r.exit_code == 2 and fragment in r.stderr, r.stderr
    assert "Reconstruction attacks: dlg, fcn, feature, fgla, ig, imprint, rgla, trap-weights, or auto" in r.stderr
    named = r.stderr.replace(f"'{name}'", "")
    assert not [a for a in LABEL_ATTACKS if f"'{a}'" in named or f" {a}," in named]


@pytest.mark.parametrize("command", ["inspect", "attacks", "simulate", "labels", "reconstruct", "audit"])
def test_help_placeholders(gleak, command: str) -> None:
    text = gleak(command, "--help").stdout
    assert "<bool>" not in text and "{capture}" not in text and "<list[" not in text and "<str>" not in text
    if command not in ("attacks", "simulate", "audit"):
        assert f"gleak {command} [OPTIONS] CAPTURE" in text and "CAPTURE" in text
    if command == "reconstruct":
        assert "Global model file (required)" in " ".join(text.replace("│", " ").split())


def test_overwrite_message_names_the_option_only(gleak, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    out.write_text("{}")
    r = gleak("labels", FEDSGD, "--model", LENET, "-o", out)
    assert r.exit_code == 2 and "pass --force to overwrite" in r.stderr and "force=True" not in r.stderr
