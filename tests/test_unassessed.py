"""Nothing passes unassessed (issue 44): every threat of a capture is measured, or a GLEAK-NOT-ASSESSED finding says
why not; the verdict is then INCONCLUSIVE (exit 1), never PASS, unless --accept-unassessed (flag, variable, config
key) accepts it; an applicable attack that failed keeps the gate from passing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from gleak.report.formats import get_format
from gleak.report.formats.console import print_audit
from gleak.report.model import NOT_ASSESSED, AttackEntry, CaptureReport, FileRef, Finding, Report, ThreatCoverage
from gleak.report.verdict import verdict
from gleak.runs.audit.coverage import image_coverage, label_coverage, not_assessed_findings

from .conftest import FEDSGD, LENET, MNIST_AUX


def unassessed(capture: str = "c0", threat: str = "tokens", accept: bool = False) -> Finding:
    cap = CaptureReport(capture=FileRef(path=capture),
                        coverage=[ThreatCoverage(threat=threat, status="not_assessed", reason="rank 16 of 16")])  # type: ignore[arg-type]
    (finding,) = not_assessed_findings(cap, accept)
    return finding


def audit_report(findings: list[Finding], fail_on: str = "high", accept: bool = False) -> Report:
    return Report(gleak_version="0", fail_on=fail_on, accept_unassessed=accept,  # type: ignore[arg-type]
                  captures=[CaptureReport(capture=FileRef(path="c0"))], findings=findings)


def test_an_unassessed_threat_is_inconclusive_at_any_gate_but_none() -> None:
    for fail_on in ("info", "high", "critical"):
        rep = audit_report([unassessed()], fail_on)
        answer = verdict(rep)
        assert rep.failed() and rep.inconclusive() and answer.status == "INCONCLUSIVE", fail_on
        assert "1 threat (tokens) not assessed" in answer.headline
    off = audit_report([unassessed()], "none")
    assert not off.failed() and verdict(off).status == "GATE OFF"


def test_a_leak_at_the_gate_is_fail_and_still_names_what_was_not_assessed() -> None:
    leak = Finding(rule="GLEAK-TEXT-TOKENS", severity="critical", capture="c0", title="tokens leak")
    rep = audit_report([leak, unassessed(threat="sentences")])
    answer = verdict(rep)
    assert answer.status == "FAIL" and not rep.inconclusive() and "1 threat (sentences) not assessed" in answer.headline


def test_accepting_unassessed_captures_passes_and_says_so() -> None:
    finding = unassessed(accept=True)
    assert finding.severity == "info" and "accepted" in (finding.detail or "")
    rep = audit_report([finding], accept=True)
    answer = verdict(rep)
    assert not rep.failed() and answer.status == "PASS" and "not assessed, accepted" in answer.headline


def test_every_format_says_inconclusive() -> None:
    rep = audit_report([unassessed()])
    console = Console(width=100, record=True, force_terminal=False)
    print_audit(console, rep)
    text = console.export_text()
    assert text.startswith("INCONCLUSIVE") and "GLEAK-NOT-ASSESSED" in text and "PASS" not in text
    for name in ("html", "md", "sarif", "junit", "json"):
        body = get_format(name).render(rep)
        assert "GLEAK-NOT-ASSESSED" in body.replace("\\-", "-"), name
        if name in ("html", "md"):
            assert "INCONCLUSIVE" in body, name
    sarif = json.loads(get_format("sarif").render(rep))
    rules = {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert NOT_ASSESSED in rules and sarif["runs"][0]["properties"]["failed"] is True
    assert 'name="tokens"' in get_format("junit").render(rep)  # the threat's own check, failed


def labels(*statuses: str, scores: bool = False) -> CaptureReport:
    return CaptureReport(capture=FileRef(path="c"), attacks=[
        AttackEntry(attack=f"a{i}", task="labels", status=s, reason=None if s == "ok" else "why", counts=[1],  # type: ignore[arg-type]
                    scores={"iacc": 1.0} if scores and s == "ok" else None) for i, s in enumerate(statuses)])


def test_labels_are_assessed_only_when_scored_and_no_applicable_attack_failed() -> None:
    assert label_coverage(labels("ok", scores=True)).status == "assessed"
    assert label_coverage(labels("ok", "not_applicable", scores=True)).status == "assessed"
    failed = label_coverage(labels("ok", "failed", scores=True))
    assert failed.status == "not_assessed" and "a1 failed: why" in (failed.reason or "") and failed.by
    unscored = label_coverage(labels("ok"))
    assert unscored.status == "not_assessed" and "no truth" in (unscored.reason or "")
    none_ran = label_coverage(labels("not_applicable", "error"))
    assert none_ran.status == "not_assessed" and "a1 error" in (none_ran.reason or "")


def test_images_outside_the_quick_budget_are_said_beside_pass() -> None:
    cap = CaptureReport(capture=FileRef(path="c"))
    cover = image_coverage(cap, None, "reconstruction skipped (budget quick)", True, True, None)
    assert cover.status == "outside_budget"
    cap.coverage = [cover]
    rep = Report(gleak_version="0", budget="quick", captures=[cap])
    answer = verdict(rep)
    assert answer.status == "PASS" and "images of 1 capture outside budget quick" in answer.headline
    assert image_coverage(cap, None, "ig does not apply", True, False, None).status == "not_assessed"


def test_an_image_capture_without_truth_nor_aux_is_inconclusive(gleak, tmp_path: Path) -> None:
    shutil.copy(FEDSGD, tmp_path / "c.safetensors")  # no truth beside it
    r = gleak("audit", tmp_path / "c.safetensors", "-M", LENET, "--format", "json")
    assert r.exit_code == 1 and "INCONCLUSIVE" in r.stderr, r.stderr
    report = json.loads(r.stdout)
    (finding,) = [f for f in report["findings"] if f["rule"] == NOT_ASSESSED]
    assert finding["metric"] == "labels" and finding["severity"] == "high"
    # with aux data the labels are calibrated on simulated batches: assessed (the expected leak fails the gate)
    r = gleak("audit", tmp_path / "c.safetensors", "-M", LENET, "--aux", MNIST_AUX, "--format", "json",
              "--confidence", "4")
    report = json.loads(r.stdout)
    assert {c["threat"]: c["status"] for c in report["captures"][0]["coverage"]}["labels"] == "assessed"
    assert NOT_ASSESSED not in {f["rule"] for f in report["findings"]}


def test_the_config_file_accepts_unassessed_captures(gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(FEDSGD, tmp_path / "c.safetensors")
    (tmp_path / "gleak.toml").write_text("[audit]\naccept-unassessed = true\n")
    monkeypatch.chdir(tmp_path)
    r = gleak("audit", "c.safetensors", "-M", LENET, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert [f["severity"] for f in json.loads(r.stdout)["findings"] if f["rule"] == NOT_ASSESSED] == ["info"]
    shown = json.loads(gleak("audit", "--show-config", "--format", "json").stdout)["accept_unassessed"]
    assert shown["value"] is True and "gleak.toml" in shown["from"]
