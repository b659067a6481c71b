"""Every JSON document gleak writes validates against the shipped schema, and names its model in ``report``."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gleak import __version__
from gleak.report.model import SCHEMA_PATH, InspectReport, LabelsReport, ReconstructReport

from .conftest import CNN, FEDSGD, LENET, SAMPLES

CIFAR_B8 = SAMPLES / "captures/cifar10_b8.safetensors"


def check(data: dict, report: str) -> None:
    """Valid against the shipped (combined) schema, with the common header naming ``report``."""
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert data["schema_version"] == "2" and data["tool"] == "gleak" and data["gleak_version"] == __version__
    assert data["report"] == report


def test_labels_json_and_report_file(gleak, tmp_path: Path) -> None:
    r = gleak("labels", FEDSGD, "--model", LENET, "-a", "llg", "-a", "ilrg", "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    check(data, "labels")
    assert {r.attack for r in LabelsReport.model_validate(data).results} == {"llg", "ilrg"}
    out = tmp_path / "labels.json"
    r = gleak("labels", FEDSGD, "--model", LENET, "-a", "llg", "-o", out)
    assert r.exit_code == 0, r.stderr
    check(json.loads(out.read_text()), "labels")


def test_reconstruct_json_and_metrics_file(gleak, tmp_path: Path) -> None:
    out = tmp_path / "recon"
    r = gleak("reconstruct", CIFAR_B8, "-M", CNN, "-o", out, "-a", "ig", "-O", "ig.iterations=2", "--lpips", "off",
              "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    check(data, "reconstruct")
    metrics = json.loads((out / "metrics.json").read_text())
    check(metrics, "reconstruct")
    assert ReconstructReport.model_validate(metrics).attack == "ig"
    assert metrics["metrics"] is not None and metrics["baseline"] is not None  # the sample has ground truth


@pytest.mark.parametrize("with_model", [False, True], ids=["capture-only", "with-model"])
def test_inspect_json(gleak, with_model: bool) -> None:
    r = gleak("inspect", FEDSGD, *(["--model", LENET] if with_model else []), "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    check(data, "inspect")
    report = InspectReport.model_validate(data)
    assert (report.model is not None) == with_model and ("attacks" in data) == with_model
    assert report.capture_schema_version == 1


def test_each_report_matches_only_its_own_model(gleak) -> None:
    data = json.loads(gleak("inspect", FEDSGD, "--format", "json").stdout)
    schema = json.loads(SCHEMA_PATH.read_text())
    for wrong in ("labels", "reconstruct", "audit"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**data, "report": wrong}, schema)
    del data["last_layer"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_one_model_check_type_and_the_report_models_import_without_torch() -> None:
    """The model-hash check has one type: what gleak.capture.check_model_hash returns is what the reports record
    (gleak.model_check, re-exported by both); and gleak.report.model stays importable without torch."""
    import subprocess
    import sys

    from gleak import capture, model_check
    from gleak.report import model

    assert capture.ModelCheck is model.ModelCheck is model_check.ModelCheck
    probe = "import sys, gleak.report.model; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False", r.stderr
