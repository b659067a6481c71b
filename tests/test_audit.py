"""`gleak audit`: findings, exit codes 0 / 1 / 2, model matching, the report and its JSON Schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from gleak.attacks import build_context, run_attack
from gleak.attacks.base import Attack
from gleak.attacks.requirements import Requirements
from gleak.capture import load_capture
from gleak.models import load_model
from gleak.report.model import SCHEMA_PATH, Report, json_schema

from .conftest import FEDSGD, LENET, MNIST_AUX, ROOT, SAMPLES

MODELS = SAMPLES / "models"
NO_LEAK = ["--threshold", "labels_critical=1.01", "--threshold", "labels_high=1.01",
           "--threshold", "labels_medium_margin=1", "--threshold", "labels_low_margin=1"]
STRICTEST = ["--threshold", "labels_critical=1", "--threshold", "labels_high=1",
             "--threshold", "labels_medium_margin=1", "--threshold", "labels_low_margin=1"]


def validate(data: dict) -> None:
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))


def test_shipped_schema_matches_the_model() -> None:
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(json.dumps(json_schema()))


def test_a_leaking_capture_fails_and_passes_above_what_leaked(gleak, tmp_path: Path) -> None:
    base = ("audit", FEDSGD, "-M", MODELS, "--aux", MNIST_AUX, "--lpips", "off")
    r = gleak(*base, "--format", "json")
    assert r.exit_code == 1, r.stderr
    report = json.loads(r.stdout)
    validate(report)
    (finding,) = [f for f in report["findings"] if f["rule"] == "GLEAK-LABELS"]
    assert finding["severity"] == "critical" and finding["measured"] == 1.0 and finding["chance"] < 0.8
    (cap,) = report["captures"]
    assert cap["model"]["path"].endswith("lenet_untrained.safetensors")  # matched by the recorded sha256
    assert cap["aux"] is not None and sum(cap["truth_counts"]) == 32
    assert any("fcn does not apply" in s for s in cap["skipped"])  # quick: analytic reconstruction only
    # thresholds are rates in [0, 1]: one above 1 (which used to mean "never") is refused in one line
    r = gleak(*base, "--format", "json", *NO_LEAK)
    assert r.exit_code == 2 and "labels_critical" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # the strictest valid ladder still reports the perfect recovery, as critical (exactness is never relaxed)
    r = gleak(*base, "--format", "json", "--fail-on", "none", *STRICTEST)
    assert r.exit_code == 0 and [f["severity"] for f in json.loads(r.stdout)["findings"]] == ["critical"], r.stderr
    r = gleak(*base, "--format", "json", "--fail-on", "none")
    assert r.exit_code == 0 and json.loads(r.stdout)["findings"][0]["severity"] == "critical"
    every = tmp_path / "all"
    r = gleak(*base, "--fail-on", "none", "-o", every, "--format", "table,json,html,sarif,md,junit")
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in every.iterdir()) == ["junit.xml", "report.html", "report.json", "report.md",
                                                      "report.sarif"]
    r = gleak(*base, "--fail-on", "critical")
    assert r.exit_code == 1 and "FAIL" in r.stdout and "GLEAK-LABELS" in r.stdout


def test_a_malformed_capture_among_good_ones_is_an_error_entry(gleak, tmp_path: Path) -> None:
    folder = tmp_path / "caps"
    folder.mkdir()
    shutil.copy(FEDSGD, folder / "good.safetensors")
    shutil.copy(FEDSGD.with_name("fedsgd_b32.truth.safetensors"), folder / "good.truth.safetensors")
    bad = folder / "bad.safetensors"
    data = FEDSGD.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # truncated: the header still says gleak.kind gradient
    out = tmp_path / "out"
    r = gleak("audit", folder, "-M", LENET, "-o", out, "--format", "json", "--lpips", "off")
    assert r.exit_code == 2, (r.stdout, r.stderr)
    report = json.loads((out / "report.json").read_text())
    validate(report)
    by = {Path(c["capture"]["path"]).name: c for c in report["captures"]}
    assert by["bad.safetensors"]["status"] == "error" and by["bad.safetensors"]["error"]
    assert by["good.safetensors"]["status"] == "ok" and report["findings"]  # the good one was still audited


def test_a_capture_whose_model_is_missing_names_its_sha256(gleak, tmp_path: Path) -> None:
    other = MODELS / "lenet_mnist80.safetensors"
    r = gleak("audit", FEDSGD, "-M", other, "-M", MODELS / "lenet_mnist98.safetensors", "--format", "json")
    assert r.exit_code == 2
    (cap,) = json.loads(r.stdout)["captures"]
    recorded = load_capture(FEDSGD).get("gleak.model.sha256")
    assert cap["status"] == "error" and recorded[:12] in cap["error"]


def test_without_truth_the_audit_measures_leakage_on_simulated_batches(gleak, tmp_path: Path) -> None:
    cap = tmp_path / "notruth.safetensors"
    shutil.copy(FEDSGD, cap)
    r = gleak("audit", cap, "-M", LENET, "--aux", MNIST_AUX, "--format", "json", "--confidence", "8")
    assert r.exit_code == 1, r.stderr  # the untrained LeNet-5 leaks: the calibrated estimate is high
    report = json.loads(r.stdout)
    validate(report)
    assert [n["code"] for n in report["notices"]] == ["NO_TRUTH", "RECONSTRUCTION_SKIPPED", "IMAGES_NOT_EXPECTED"]
    expected, agree = report["findings"]
    assert expected["rule"] == "GLEAK-LABELS-EXPECTED" and expected["severity"] == "high"
    assert expected["measured"] >= 0.9 and "simulated" in expected["title"]
    assert 0.68 < expected["chance"] < 0.73 and "uniform" in expected["title"]  # chance of uniform batches, B = 32
    assert agree["rule"] == "GLEAK-LABELS-AGREE" and agree["severity"] == "info" and agree["measured"] > 0.5
    entry = next(a for a in report["captures"][0]["attacks"] if a["attack"] == expected["attack"])
    assert expected["attack"] == "calibrated" and entry["status"] == "ok"  # the calibrated answer, not one attack
    conf = entry["confidence"]
    assert conf["calibrated"] and len(conf["intervals"]) == 10 and f"calibrated ({conf['chosen']})" in expected["title"]
    assert expected["measured"] == conf["expected_iacc"] and expected["chance"] == conf["chance_iacc"]
    low, high = conf["expected_interval"]  # the expectation's 95 % interval, in the title and the detail
    assert low <= conf["expected_iacc"] <= high and f"[{low:.0%}, {high:.0%}]" in expected["title"]
    assert conf["chosen"] in [a["attack"] for a in report["captures"][0]["attacks"]] + ["stacked"]
    off = json.loads(gleak("audit", cap, "-M", LENET, "--aux", MNIST_AUX, "--format", "json", "--confidence", "0")
                     .stdout)
    # --confidence 0: agreement only, and the labels were not assessed (no truth, no calibration): the gate fails
    assert [(f["rule"], f["metric"]) for f in off["findings"]] == [("GLEAK-LABELS-AGREE", "agreement"),
                                                                    ("GLEAK-NOT-ASSESSED", "labels")]
    assert "--confidence above 0" in off["findings"][1]["title"]


def test_uninformative_attacks_give_no_finding_and_a_notice() -> None:
    from gleak.report.model import AttackEntry, CaptureReport, FileRef, Thresholds
    from gleak.runs.audit.findings import expected_finding as _expected_finding
    from gleak.runs.audit.findings import notices_for as _notices

    weak = {"calibrated": True, "informative": False, "expected_iacc": 0.48, "chance_iacc": 0.59, "level": 0.9,
            "half_width": 7, "simulations": 24}
    report = CaptureReport(capture=FileRef(path="c.safetensors"), attacks=[
        AttackEntry(attack="rlu", task="labels", status="ok", counts=[1] * 10, confidence=weak)])
    assert _expected_finding(report, Thresholds()) is None  # worse than chance: never reported as a leak
    ctx = type("Ctx", (), {"model_check": None})()
    report.aux = FileRef(path="aux.safetensors")
    assert [n.code for n in _notices(ctx, report, "c.safetensors", True)] == ["LABELS_UNINFORMATIVE"]  # type: ignore[arg-type]
    strong = {**weak, "informative": True, "expected_iacc": 1.0}
    report.attacks[0].confidence = strong
    finding = _expected_finding(report, Thresholds())
    assert finding is not None and finding.severity == "high"  # exactness needs the truth: never critical


@pytest.mark.parametrize(("args", "fragment"), [
    (("--budget", "huge"), "--budget must be one of"),
    (("--fail-on", "severe"), "--fail-on must be one of"),
    (("--format", "pdf"), "--format must be a comma-separated list"),
    (("--format", "html"), "-o DIR"),
    (("--threshold", "labels_high"), "NAME=VALUE"),
    (("--threshold", "labels_high=lots"), "is not a number"),
    (("--threshold", "bogus=1"), "NAME=VALUE"),
])
def test_bad_options_are_one_line_and_exit_2(gleak, args: tuple[str, ...], fragment: str) -> None:
    r = gleak("audit", FEDSGD, "-M", LENET, *args)
    assert r.exit_code == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_attack_that_raises_is_recorded_as_error_and_the_run_goes_on() -> None:
    class Broken(Attack):
        name = "broken"
        task = "labels"
        requires = Requirements()

        def run(self, ctx, inputs=None):  # type: ignore[no-untyped-def]
            raise ZeroDivisionError("division by zero\nsecond line")

    ctx = build_context(load_capture(FEDSGD), load_model(LENET))
    result = run_attack(Broken(), ctx)
    assert result.status == "error" and result.reason == "ZeroDivisionError: division by zero"


def test_report_model_verdicts() -> None:
    report = Report(gleak_version="x", fail_on="medium")
    assert not report.failed() and report.worst() is None


def test_config_precedence_flags_over_environment_over_file(gleak, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.gleak]\nseed = 3\n[tool.gleak.audit]\nbudget = "standard"\nfail-on = "medium"\nlpips = "off"\n'
        f'model = ["{LENET.as_posix()}"]\n[tool.gleak.audit.threshold]\nlabels_high = 0.95\n')
    monkeypatch.setenv("GLEAK_BUDGET", "full")
    r = gleak("audit", "--show-config", "--fail-on", "low", "--format", "json")
    assert r.exit_code == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["budget"] == {"value": "full", "from": "environment (GLEAK_BUDGET)"}  # env beats the file
    assert shown["fail_on"] == {"value": "low", "from": "command line"}  # the flag beats the file
    assert shown["seed"]["value"] == 3 and "pyproject.toml [tool.gleak]" in shown["seed"]["from"]  # file > default
    assert shown["lpips"]["value"] == "off" and shown["jobs"]["from"] == "default"
    assert "budget" in gleak("audit", "--show-config").stdout  # the table form
    # the file's model and thresholds are used by a real run: labels_high 0.95 < 1.0 still fails
    monkeypatch.delenv("GLEAK_BUDGET")
    r = gleak("audit", FEDSGD, "--format", "json", "--budget", "quick")
    assert r.exit_code == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["seed"] == 3 and report["fail_on"] == "medium" and report["thresholds"]["labels_high"] == 0.95


@pytest.mark.parametrize(("text", "fragment"), [
    ('[tool.gleak.audit]\nbudget = "fast"\n', "[tool.gleak.audit] key 'budget'"),
    ('[tool.gleak.audit]\njobs = "two"\n', "key 'jobs'"),
    ('[tool.gleak]\nbogus = 1\n', "key 'bogus'"),
    ('[tool.gleak\n', "not valid TOML"),
])
def test_bad_config_names_file_key_and_type(gleak, tmp_path: Path, monkeypatch, text: str, fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(text)
    r = gleak("audit", FEDSGD, "-M", LENET)
    assert r.exit_code == 2 and "pyproject.toml" in r.stderr and fragment in r.stderr, r.stderr


@pytest.mark.slow
def test_jobs_give_the_same_report(gleak, tmp_path: Path) -> None:
    args = ("audit", SAMPLES / "captures", "-M", MODELS, "--aux", MNIST_AUX, "--lpips", "off", "--format", "json")
    one, two = gleak(*args), gleak(*args, "--jobs", "2")
    assert one.exit_code == two.exit_code == 1
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert a["findings"] == b["findings"]
    for ca, cb in zip(a["captures"], b["captures"], strict=True):  # same order, same recovered counts
        assert ca["capture"] == cb["capture"]
        assert [x["counts"] for x in ca["attacks"]] == [x["counts"] for x in cb["attacks"]]


def test_attack_options_reach_the_audit_and_its_report(gleak) -> None:
    r = gleak("audit", FEDSGD, "-M", LENET, "--aux", MNIST_AUX, "--format", "json", "-O", "rlu.mc_samples=50")
    assert r.exit_code == 1, r.stderr
    (cap,) = json.loads(r.stdout)["captures"]
    rlu = next(a for a in cap["attacks"] if a["attack"] == "rlu")
    assert rlu["options"]["mc_samples"] == 50 and rlu["status"] == "ok"
    bad = gleak("audit", FEDSGD, "-M", LENET, "-O", "rlu.mc_samples=-3")
    assert bad.exit_code == 2 and "rlu.mc_samples" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_with_format_json_errors_are_json_too(gleak, tmp_path: Path) -> None:
    for args in (("audit", tmp_path / "missing", "-M", LENET), ("labels", FEDSGD, "-M", LENET, "--batch-size", "7")):
        r = gleak(*args, "--format", "json")
        assert r.exit_code == 2 and r.stderr.startswith("error:")
        validate(json.loads(r.stdout))  # the error document is in the shipped schema too
        error = json.loads(r.stdout)["error"]
        assert error["exit_code"] == 2 and error["message"] in r.stderr.replace("\n", " ")


def test_notices_have_stable_codes(gleak) -> None:
    r = gleak("audit", FEDSGD, "-M", LENET, "--format", "json")  # no --aux; quick budget on a CNN
    report = json.loads(r.stdout)
    codes = {n["code"] for n in report["notices"]}
    assert {"NO_AUX", "RECONSTRUCTION_SKIPPED"} <= codes, codes
    from gleak.runs.audit import NOTICE_CODES

    assert codes <= set(NOTICE_CODES)


def test_a_hostile_header_in_a_folder_is_not_a_crash(gleak, tmp_path: Path) -> None:
    """Discovery peeks at every .safetensors header: deeply nested JSON must not end the audit (exit 3)."""
    folder = tmp_path / "caps"
    folder.mkdir()
    header = b"[" * 100_000 + b"]" * 100_000
    (folder / "deep.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    shutil.copy(FEDSGD, folder / "good.safetensors")
    r = gleak("audit", folder, "-M", LENET, "--format", "json", "--accept-unassessed")
    assert r.exit_code == 0, r.stderr  # the hostile file is not a capture; the good one (no truth) is audited
    assert [Path(c["capture"]["path"]).name for c in json.loads(r.stdout)["captures"]] == ["good.safetensors"]


def test_the_expected_labels_finding_follows_the_calibrated_answer_not_one_attack() -> None:
    """The selector's calibrated expectation sets the severity (here medium), even where one attack's own
    calibration alone would say high; when the selector abstains the audit abstains, whatever one attack says."""
    from gleak.report.model import AttackEntry, CaptureReport, FileRef, Thresholds
    from gleak.runs.audit.findings import abstained_finding, label_findings

    single = {"calibrated": True, "informative": True, "expected_iacc": 0.95, "chance_iacc": 0.5, "level": 0.9,
              "half_width": 1, "simulations": 24, "worst_margin": 0.45}
    chosen = {"calibrated": True, "chosen": "stacked", "informative": True, "expected_iacc": 0.75,
              "chance_iacc": 0.5, "level": 0.9, "half_width": 2, "simulations": 24, "worst_margin": 0.25,
              "expected_interval": [0.7, 0.8]}
    report = CaptureReport(capture=FileRef(path="c.safetensors"), attacks=[
        AttackEntry(attack="rlu", task="labels", status="ok", counts=[1, 1], confidence=single),
        AttackEntry(attack="calibrated", task="labels", status="ok", counts=[1, 1], confidence=chosen)])
    found = {f.rule: f for f in label_findings(report, Thresholds())}
    expected = found["GLEAK-LABELS-EXPECTED"]
    assert expected.severity == "medium" and expected.attack == "calibrated" and expected.measured == 0.75
    assert "calibrated (stacked)" in expected.title and "[70%, 80%]" in expected.title
    assert "GLEAK-LABELS-AGREE" not in found  # the selector repeats a candidate's counts: not a second vote
    report.attacks[1] = AttackEntry(attack="calibrated", task="labels", status="abstained", reason="none beats chance",
                                    confidence={**single, "informative": False, "attack": "rlu",
                                                "expected_iacc": 0.52, "worst_margin": -0.01})
    rules = [f.rule for f in label_findings(report, Thresholds())]
    assert rules == ["GLEAK-LABELS-ABSTAINED"]
    abstained = abstained_finding(report)
    assert abstained is not None and abstained.attack == "rlu" and abstained.severity == "info"


@pytest.mark.extended  # spawns worker processes (9 s); make test runs it
@pytest.mark.parametrize(("break_even", "workers"), [(0.0, 2), (1e9, 1)])
def test_jobs_auto_hands_the_rest_to_workers_only_when_it_pays(monkeypatch, tmp_path: Path, break_even: float,
                                                              workers: int) -> None:
    """--jobs auto audits here and starts one worker per CPU for the captures left once they would take longer than
    the break-even at the pace so far (forced here both ways); the report is the same either way."""
    from gleak.runs import parallel
    from gleak.runs.audit import AuditConfig, run_audit

    folder = tmp_path / "caps"
    folder.mkdir()
    for i in range(8):  # 4 audited here before the pace is trusted, then 4 left for 2 workers
        shutil.copy(FEDSGD, folder / f"c{i}.safetensors")
    monkeypatch.setattr(parallel, "AUTO_BREAK_EVEN_SECONDS", break_even)
    monkeypatch.setattr(parallel, "available_cpus", lambda: 2)
    config = AuditConfig(lpips="off", confidence=0)
    auto = run_audit([folder], [LENET], [], config, jobs=0)
    here = run_audit([folder], [LENET], [], config, jobs=1)
    assert auto.workers == workers and here.workers == 1 and auto.jobs == 0
    assert auto.findings == here.findings and len(auto.findings) == 16  # agreement and labels not assessed, each
    assert [c.capture.path for c in auto.captures] == [c.capture.path for c in here.captures]  # the same order


def test_bad_jobs_are_one_line(gleak) -> None:
    for bad in ("0", "-1", "two", "257", "1.5"):
        r = gleak("audit", FEDSGD, "-M", LENET, "--jobs", bad)
        assert r.exit_code == 2 and "--jobs must be auto" in r.stderr and len(r.stderr.strip().splitlines()) == 1


ENV_VALUES = {"budget": "quick", "fail_on": "low", "fail_rounds": "last:2", "format": "json", "executor": "local",
              "address": "127.0.0.1:6379", "jobs": "2", "max_epsilon": "4.0", "accept_unassessed": "1",
              "time_limit": "60"}


def test_show_config_names_the_variable_each_setting_was_read_from(gleak, tmp_path: Path, monkeypatch) -> None:
    """Every GLEAK_* variable the audit reads, set alone: --show-config names that very variable as the source."""
    import re

    import typer

    from gleak.cli import app

    monkeypatch.chdir(tmp_path)
    audit = typer.main.get_command(app).commands["audit"]  # type: ignore[attr-defined]
    declared = {p.name: p.envvar for p in audit.params if getattr(p, "envvar", None)}
    assert set(declared) == set(ENV_VALUES)
    source = "\n".join(p.read_text() for p in (ROOT / "gleak").rglob("*.py"))
    assert set(re.findall(r"\bGLEAK_[A-Z_]+\b", source)) == {*declared.values(), "GLEAK_THREADS"}
    for key, variable in declared.items():
        for other in declared.values():
            monkeypatch.delenv(other, raising=False)
        monkeypatch.setenv(variable, ENV_VALUES[key])
        r = gleak("audit", "--show-config", *([] if key == "format" else ["--format", "json"]))
        assert r.exit_code == 0, (variable, r.stderr)
        shown = json.loads(r.stdout)[key]
        assert shown["from"] == f"environment ({variable})", key
        assert str(shown["value"]) == ENV_VALUES[key] or shown["value"] == int(ENV_VALUES[key])
