"""Errors that name their source (issue 35): a bad audit setting names the flag, the GLEAK_* variable or the config
file and key it came from; --labels truth with --no-truth says what clashes; a sweep made for another model is
refused by `gleak audit --sweep`, and one that records no model hash is shown as unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gleak.errors import LABELS_TRUTH_OFF
from gleak.models import load_model
from gleak.report.model import SweepReport

from .conftest import FEDSGD, LENET, MNIST_CLIENT, SAMPLES

pytestmark = pytest.mark.usefixtures("one_thread")

SMOOTHING = SAMPLES / "captures/smoothing_1.safetensors"
AUDIT_VARIABLES = ("GLEAK_BUDGET", "GLEAK_FAIL_ON", "GLEAK_FAIL_ROUNDS", "GLEAK_FORMAT", "GLEAK_EXECUTOR",
                   "GLEAK_RAY_ADDRESS", "GLEAK_JOBS", "GLEAK_THREADS")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GLEAK_* variable and no config file but the test's own (the working directory is the test's folder)."""
    for name in AUDIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def one_error_line(r) -> str:  # type: ignore[no-untyped-def]
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return str(lines[0].removeprefix("error: "))


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("GLEAK_BUDGET", "quik", "GLEAK_BUDGET='quik' must be one of quick, standard, full; did you mean 'quick'?"),
    ("GLEAK_FAIL_ON", "hihg", "GLEAK_FAIL_ON='hihg' must be one of info, low, medium, high, critical, none; "
                              "did you mean 'high'?"),
    ("GLEAK_FAIL_ROUNDS", "lst:2", "GLEAK_FAIL_ROUNDS='lst:2' must be any (a finding in any round fails), last:K"),
    ("GLEAK_FORMAT", "jsn", "GLEAK_FORMAT='jsn' must be a comma-separated list of table, json, html, sarif, md, "
                            "junit; did you mean 'json'?"),
    ("GLEAK_EXECUTOR", "rya", "GLEAK_EXECUTOR='rya' must be one of local, ray; did you mean 'ray'?"),
    ("GLEAK_RAY_ADDRESS", "127.0.0.1:6379", "GLEAK_RAY_ADDRESS='127.0.0.1:6379' is a Ray cluster's address: use it "
                                           "with --executor ray (the executor is 'local', from the default)"),
    ("GLEAK_JOBS", "0", "GLEAK_JOBS='0' must be auto or a whole number from 1 to 256"),
    ("GLEAK_THREADS", "0", "Invalid value for '--threads' (env var: 'GLEAK_THREADS'): must be a finite number ≥ 1"),
])
def test_a_bad_value_from_the_environment_names_the_variable(gleak, monkeypatch: pytest.MonkeyPatch, variable: str,
                                                             value: str, expected: str) -> None:
    monkeypatch.setenv(variable, value)
    line = one_error_line(gleak("audit", FEDSGD, "-M", LENET))
    assert line.startswith(expected), line
    if variable != "GLEAK_THREADS":  # Click words that one; the others never blame a flag that was not given
        assert "--" + variable.removeprefix("GLEAK_").lower().replace("_", "-") + " must" not in line


@pytest.mark.parametrize(("args", "expected"), [
    (("--fail-on", "hihg"), "--fail-on must be one of info, low, medium, high, critical, none, got 'hihg'; did you "
                            "mean 'high'?"),
    (("--format", "jsn"), "--format must be a comma-separated list of table, json, html, sarif, md, junit, got "
                          "'jsn'; did you mean 'json'?"),
    (("--jobs", "0"), "--jobs must be auto or a whole number from 1 to 256, got '0'"),
    (("--fail-rounds", "lst"), "--fail-rounds must be any (a finding in any round fails)"),
    (("--address", "h:1"), "--address is a Ray cluster's address: use it with --executor ray"),
])
def test_a_bad_flag_names_the_flag(gleak, args: tuple[str, ...], expected: str) -> None:
    assert one_error_line(gleak("audit", FEDSGD, "-M", LENET, *args)).startswith(expected)


def test_a_flag_beats_a_bad_variable_and_is_what_the_error_names(gleak, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLEAK_FAIL_ON", "high")
    line = one_error_line(gleak("audit", FEDSGD, "-M", LENET, "--fail-on", "hihg"))
    assert line.startswith("--fail-on must be one of") and "GLEAK_FAIL_ON" not in line


@pytest.mark.parametrize(("text", "expected"), [
    ('[tool.gleak.audit]\nfail-on = "hihg"\n', "pyproject.toml [tool.gleak.audit] key 'fail-on': must be info, low, "
                                               "medium, high, critical or none, got 'hihg'; did you mean 'high'?"),
    ('[tool.gleak.audit]\nformat = "jsn"\n', "pyproject.toml [tool.gleak.audit] key 'format': must be a "
                                             "comma-separated list of table, json, html, sarif, md, junit, got 'jsn'; "
                                             "did you mean 'json'?"),
    ('[tool.gleak.audit]\naddress = "h:1"\n', "pyproject.toml [tool.gleak.audit] address = 'h:1' is a Ray cluster's "
                                              "address: use it with --executor ray"),
    ('[tool.gleak.audit.options]\nrlu = {mc_sampels = 5}\n', "pyproject.toml [tool.gleak.audit.options.rlu] key "
                                                             "'mc_sampels': rlu has no option 'mc_sampels'; did you "
                                                             "mean 'mc_samples'?"),
    ('[tool.gleak.audit.options]\nrl = {mc_samples = 5}\n', "pyproject.toml [tool.gleak.audit.options]: unknown "
                                                            "attack 'rl'; did you mean 'rlu'"),
    ('[tool.gleak.audit.options]\nrlu = {mc_samples = "many"}\n', "pyproject.toml [tool.gleak.audit.options.rlu] "
                                                                  "key 'mc_samples': "),
    ('[tool.gleak]\ndevice = "cdu"\n', "pyproject.toml [tool.gleak] key 'device': must be auto, cpu, cuda or cuda:N, "
                                       "got 'cdu'"),
])
def test_a_bad_value_from_a_config_file_names_the_file_and_the_key(gleak, tmp_path: Path, text: str,
                                                                   expected: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    line = one_error_line(gleak("audit", FEDSGD, "-M", LENET))
    assert line.startswith(expected), line
    assert not line.startswith("-O")


def test_gleak_toml_is_named_as_gleak_toml(gleak, tmp_path: Path) -> None:
    (tmp_path / "gleak.toml").write_text('[audit.options]\nrlu = {mc_sampels = 5}\n')
    line = one_error_line(gleak("audit", FEDSGD, "-M", LENET))
    assert line.startswith("gleak.toml [audit.options.rlu] key 'mc_sampels': rlu has no option"), line


def test_labels_truth_with_no_truth_says_what_clashes(gleak, tmp_path: Path) -> None:
    assert SMOOTHING.with_name("smoothing_1.truth.safetensors").is_file()  # the file exists: it is not missing
    line = one_error_line(gleak("reconstruct", SMOOTHING, "-M", LENET, "-o", tmp_path / "o", "--labels", "truth",
                                "--no-truth"))
    assert line == LABELS_TRUTH_OFF == ("--labels truth uses the ground truth, which --no-truth turns off; drop "
                                        "one of them")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------- the sweep's model

def write_sweep(folder: Path, model_sha256: str | None) -> Path:
    """A small valid sweep.json (no rows) made with LENET, recording ``model_sha256`` (or no hash)."""
    settings = {"model": "elsewhere/lenet.safetensors", "arch": None, "data": "d.safetensors", "aux": None,
                "generator": None, "batch_size": 8, "local_steps": 1, "scheme": "fedsgd", "trials": 1, "seed": 0,
                "trial_stride": 1, "attacks": [], "iterations": 1, "confidence": 0, "distractors": 9, "jobs": 1,
                "workers": 1, "threads": 1, "device": "cpu"}
    if model_sha256 is not None:
        settings["model_sha256"] = model_sha256
    report = SweepReport.build({"settings": settings, "defenses": [], "rows": [], "notices": [], "seconds": 1.0})
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps(report.to_json()))
    return folder


AUDIT = ("audit", FEDSGD, "-M", LENET, "-f", "html", "--fail-on", "none", "--lpips", "off", "--confidence", "0", "-q")


def test_a_sweep_of_another_model_is_refused_in_one_line(gleak, tmp_path: Path) -> None:
    other = "ab" * 32
    sweep = write_sweep(tmp_path / "sweep", other)
    line = one_error_line(gleak(*AUDIT, "--sweep", sweep, "-o", tmp_path / "out"))
    assert line.startswith(f"--sweep {sweep}: the sweep was made for another model (sha256 {other[:12]}…"), line
    assert "--allow-model-mismatch" in line and not (tmp_path / "out").exists()
    r = gleak(*AUDIT, "--sweep", sweep, "-o", tmp_path / "allowed", "--allow-model-mismatch")
    assert r.exit_code == 0, r.stderr
    html = (tmp_path / "allowed" / "report.html").read_text()
    assert f"made for another model (sha256 {other[:12]}…) than the audited one" in html


def test_a_sweep_of_this_model_is_shown_as_checked_and_one_without_a_hash_as_unchecked(gleak, tmp_path: Path) -> None:
    sha = load_model(LENET).weights_sha256
    r = gleak(*AUDIT, "--sweep", write_sweep(tmp_path / "same", sha), "-o", tmp_path / "a")
    assert r.exit_code == 0, r.stderr
    html = (tmp_path / "a" / "report.html").read_text()
    assert "records no model hash" not in html and "another model" not in html
    r = gleak(*AUDIT, "--sweep", write_sweep(tmp_path / "old", None), "-o", tmp_path / "b")
    assert r.exit_code == 0, r.stderr
    html = (tmp_path / "b" / "report.html").read_text()
    assert "this sweep records no model hash (settings.model_sha256): it was not checked against the audited " \
           "model" in html


def test_the_sweep_names_gleak_jobs_too(gleak, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GLEAK_JOBS", "many")
    result = gleak("sweep", "--model", LENET, "--data", MNIST_CLIENT, "--defense", "sign", "-o", tmp_path / "s")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "GLEAK_JOBS='many' must be auto or a whole number" in result.stderr
