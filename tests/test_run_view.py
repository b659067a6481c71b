"""The run view of an audit: captures grouped by gleak.fl.round / gleak.fl.client_id, series computed from the
report (no attack runs again), the gate over rounds (--fail-rounds), and every format that shows it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from gleak.capture import save_capture
from gleak.data.images import load_dataset
from gleak.errors import GleakError
from gleak.models import build_zoo_model, save_model
from gleak.report.formats import get_format
from gleak.report.model import AttackEntry, CaptureReport, FileRef, Finding, Report
from gleak.report.plots import plot_name, svg_markup
from gleak.report.run_view import build_run_view
from gleak.runs.audit.setup import parse_fail_rounds
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import MNIST_CLIENT

pytestmark = pytest.mark.usefixtures("one_thread")


def _capture(path: str, round: int | None, client: str | None, iacc: float, chance: float) -> CaptureReport:
    return CaptureReport(capture=FileRef(path=path), round=round, client=client, chance={"iacc": chance},
                         attacks=[AttackEntry(attack="llg", task="labels", status="ok", counts=[1],
                                              scores={"iacc": iacc}),
                                  AttackEntry(attack="zlg", task="labels", status="ok", counts=[1],
                                              scores={"iacc": iacc / 2})])


def _finding(path: str, severity: str = "high") -> Finding:
    return Finding(rule="GLEAK-LABELS", severity=severity, capture=path, title=f"leak in {path}")  # type: ignore[arg-type]


def _report(leaking: dict[str, str], fail_rounds: str = "any", fail_on: str = "high") -> Report:
    """Rounds 10, 2 and 1 (given out of order) × clients a and b, plus one capture without a round or client."""
    captures = []
    for r, iaccs in ((10, (0.5, 0.6)), (2, (0.9, 0.7)), (1, (1.0, 0.8))):
        for client, iacc in zip("ab", iaccs, strict=True):
            captures.append(_capture(f"r{r}-{client}", r, client, iacc, 0.4))
    captures.append(_capture("loose", None, None, 0.3, 0.5))
    report = Report(gleak_version="0", captures=captures, fail_rounds=fail_rounds, fail_on=fail_on,  # type: ignore[arg-type]
                    findings=[_finding(path, severity) for path, severity in leaking.items()])
    report.run = build_run_view(report)
    return report


def test_rounds_are_ordered_by_number_with_the_unknown_round_last_and_series_from_the_scores() -> None:
    report = _report({"r1-a": "critical", "r2-b": "medium"})
    view = report.run
    assert view is not None
    assert [r.round for r in view.rounds] == [1, 2, 10, None]
    first = view.rounds[0]
    assert (first.captures, first.clients, first.worst, first.findings) == (2, 2, "critical", 1)
    point = first.series["label_iacc"]  # the best attack per capture (llg), then max / median over the round
    assert (point.n, point.max, point.median, point.chance) == (2, 1.0, 0.9, 0.4)
    assert view.rounds[-1].series["label_iacc"].max == 0.3  # the capture without a round still appears
    assert [s.name for s in view.series] == ["label_iacc"]  # only series some capture has
    assert view.series[0].title == "best label iAcc over rounds"
    clients = {c.client: c for c in view.clients}
    assert clients["a"].worst == "critical" and clients["a"].worst_round == 1 and clients["a"].rounds == 3
    assert clients["b"].worst == "medium" and clients["b"].worst_round == 2
    assert clients[None].captures == 1 and clients[None].worst is None
    assert view.clients[0].client == "a"  # worst first
    assert view.clear_from == 2  # no finding >= high from round 2 on (round 2's is medium)
    assert view.series_clear_from == {"label_iacc": 10}  # no GLEAK-LABELS finding at all from round 10 on


def test_a_report_without_round_or_client_metadata_has_no_run_view() -> None:
    report = Report(gleak_version="0", captures=[_capture("x", None, None, 1.0, 0.5)])
    assert build_run_view(report) is None


@pytest.mark.parametrize(("leaking", "scope", "fails"), [
    ({"r1-a": "high"}, "any", True),  # a leak only in the first round
    ({"r1-a": "high"}, "last:2", False),  # ... is outside the last two rounds (2 and 10)
    ({"r1-a": "high"}, "all", False),
    ({"r2-a": "high"}, "last:2", True),
    ({"r1-a": "high", "r2-b": "critical", "r10-a": "high"}, "all", True),  # a leak throughout
    ({"r1-a": "high", "r10-a": "high"}, "all", False),  # round 2 is clean
    ({"loose": "high"}, "last:1", True),  # a capture without a round is never exempt
    ({"r10-a": "medium"}, "last:1", False),  # below --fail-on
    ({"r1-a": "high"}, "last:5", True),  # K larger than the run: every round
])
def test_the_gate_over_rounds(leaking: dict[str, str], scope: str, fails: bool) -> None:
    report = _report(leaking, scope)
    assert report.failed() is fails
    rendered = get_format("junit").render(report)
    gate = ET.fromstring(rendered.split("\n", 1)[1]).find(".//testcase[@name='gate']")
    assert gate is not None and (gate.find("failure") is not None) is fails
    assert ("FAIL" if fails else "PASS") in get_format("md").render(report).splitlines()[0]


def test_without_rounds_every_scope_is_any() -> None:
    report = Report(gleak_version="0", captures=[_capture("x", None, "a", 1.0, 0.5)],
                    findings=[_finding("x")], fail_rounds="last:1")
    assert report.failed()


@pytest.mark.parametrize("bad", ["last:0", "last", "last:-1", "first:2", "some", "last:x", ""])
def test_bad_fail_rounds_are_one_line(bad: str) -> None:
    with pytest.raises(GleakError, match="--fail-rounds must be any"):
        parse_fail_rounds(bad)


def test_fail_rounds_is_normalised() -> None:
    assert parse_fail_rounds(" Last:03 ") == "last:3" and parse_fail_rounds("ALL") == "all"


def test_plots_have_an_accessible_name_and_the_same_bytes_each_time() -> None:
    report = _report({"r1-a": "critical"})
    assert report.run is not None
    info = report.run.series[0]
    svg = svg_markup(report.run, info)
    assert svg.startswith('<svg role="img" aria-label="best label iAcc over rounds"')
    assert "<title>best label iAcc over rounds</title>" in svg
    assert svg == svg_markup(report.run, info)
    assert plot_name(info) == "run-label_iacc.png"


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 rounds × 2 clients of an untrained LeNet-5 (one global model per round) and one capture without round or
    client metadata, with ground truth."""
    root = tmp_path_factory.mktemp("run")
    (root / "models").mkdir()
    (root / "captures").mkdir()
    client = load_dataset(MNIST_CLIENT)
    torch.set_num_threads(1)
    for r in (2, 0, 1):
        torch.manual_seed(r)
        model = build_zoo_model("lenet")
        save_model(model, root / "models" / f"round-{r}.safetensors", "lenet")
        for c in range(2):
            capture, truth = simulate_client(model, client, ClientConfig(batch_size=4, seed=10 * r + c))
            capture.meta.update({"gleak.fl.round": r, "gleak.fl.client_id": f"client-{c}"})
            save_capture(capture, root / "captures" / f"r{r}-c{c}.safetensors", truth=truth)
    capture, truth = simulate_client(model, client, ClientConfig(batch_size=4, seed=99))
    save_capture(capture, root / "captures" / "loose.safetensors", truth=truth)
    return root


def test_audit_of_a_run_writes_the_run_view_in_every_format(gleak, run_folder: Path, tmp_path: Path) -> None:
    import jsonschema

    from gleak.report.model import SCHEMA_PATH

    out = tmp_path / "audit"
    r = gleak("--threads", "1", "audit", run_folder / "captures", "--model", run_folder / "models", "--lpips", "off",
              "--format", "json,html,md,junit,sarif", "-o", out, "--fail-rounds", "last:1")
    assert r.exit_code == 1, r.stderr  # untrained LeNet-5: labels leak in every round, the last one included
    data = json.loads((out / "report.json").read_text())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert data["schema_version"] == "2" and data["fail_rounds"] == "last:1"
    view = data["run"]
    assert [g["round"] for g in view["rounds"]] == [0, 1, 2, None]
    assert [g["captures"] for g in view["rounds"]] == [2, 2, 2, 1]
    assert [g["gated"] for g in view["rounds"]] == [False, False, True, True]
    assert view["plots"] == ["run-label_iacc.png"]
    assert (out / "run-label_iacc.png").read_bytes().startswith(b"\x89PNG")
    # the series is the captures' own best iAcc: nothing ran twice
    best = {c["capture"]["path"]: max(a["scores"]["iacc"] for a in c["attacks"] if a["scores"])
            for c in data["captures"]}
    zero = [v for p, v in best.items() if Path(p).name.startswith("r0-")]
    assert view["rounds"][0]["series"]["label_iacc"]["max"] == pytest.approx(max(zero), abs=1e-4)
    html = (out / "report.html").read_text()
    assert 'aria-label="best label iAcc over rounds"' in html and "unknown round" in html
    assert 'class="sortable clients"' in html and "script-src 'sha256-" in html
    assert "the last round (2) still has a finding ≥ high" in html and "built-in method" not in html
    md = (out / "report.md").read_text()
    assert "### Leakage over rounds" in md and "![best label iAcc over rounds](run-label_iacc.png)" in md
    assert "| unknown round |" in md and "| 0 (not gated) |" in md
    junit = ET.parse(out / "junit.xml").getroot()
    rounds = junit.find("testsuite[@name='gleak audit: rounds']")
    assert rounds is not None
    assert [c.get("name") for c in rounds.findall("testcase")] == ["round 0", "round 1", "round 2", "unknown round",
                                                                   "gate"]
    sarif = json.loads((out / "report.sarif").read_text())
    assert len({res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                for res in sarif["runs"][0]["results"]}) == 7  # still one result per capture (and rule)


def test_audit_refuses_a_bad_fail_rounds_in_one_line(gleak, run_folder: Path) -> None:
    r = gleak("audit", run_folder / "captures", "--model", run_folder / "models", "--fail-rounds", "last:0")
    assert r.exit_code == 2
    assert r.stderr.strip().count("\n") == 0 and "--fail-rounds" in r.stderr
