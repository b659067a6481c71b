"""Reports lead with their answer (gleak.report.verdict): the verdict first in every format, --fail-on none never a
green PASS, identical notices once, no run section for a single capture, the lineup picture explained."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from gleak.report.formats import get_format
from gleak.report.formats.console import print_audit
from gleak.report.model import AttackEntry, CaptureReport, FileRef, Finding, Notice, Report
from gleak.report.run_view import build_run_view
from gleak.report.verdict import grouped_notices, notice_text, verdict

from .conftest import FEDSGD, LENET, MNIST_AUX


def capture(path: str, round: int | None = None, client: str | None = None) -> CaptureReport:
    return CaptureReport(capture=FileRef(path=path), round=round, client=client, chance={"iacc": 0.4},
                         attacks=[AttackEntry(attack="llg", task="labels", status="ok", counts=[1],
                                              scores={"iacc": 1.0})])


def report(fail_on: str = "high", captures: int = 1, rounds: bool = False) -> Report:
    caps = [capture(f"c{i}", round=i + 1 if rounds else None, client="a" if rounds else None) for i in range(captures)]
    out = Report(gleak_version="0", fail_on=fail_on, captures=caps,  # type: ignore[arg-type]
                 findings=[Finding(rule="GLEAK-LABELS", severity="critical", capture="c0", title="labels leak")],
                 notices=[Notice(code="RECONSTRUCTION_SKIPPED", message="skipped (budget quick)", capture=f"c{i}")
                          for i in range(captures)])
    out.run = build_run_view(out)
    return out


def console_text(rep: Report) -> str:
    console = Console(width=200, record=True, force_terminal=False)
    print_audit(console, rep)
    return console.export_text()


def test_fail_on_none_is_gate_off_everywhere_never_pass() -> None:
    rep = report(fail_on="none")
    answer = verdict(rep)
    assert answer.status == "GATE OFF" and "worst finding critical" in answer.headline
    html = get_format("html").render(rep)
    assert '<div class="verdict off" id="verdict">GATE OFF</div>' in html and ">PASS<" not in html
    md = get_format("md").render(rep)
    assert md.startswith("## ⚪ gleak audit: **GATE OFF**") and "PASS" not in md
    text = console_text(rep)
    assert text.startswith("GATE OFF") and "PASS" not in text


def test_every_format_opens_with_the_verdict() -> None:
    rep = report()
    html = get_format("html").render(rep)
    body = html[html.index("<body>"):]
    assert body.index('id="verdict"') < body.index("<h1>") < body.index("Findings")
    assert "1 finding at the gate (≥ high in any round); worst critical" in body[:body.index("<h1>")]
    assert get_format("md").render(rep).startswith("## ❌ gleak audit: **FAIL**")
    assert console_text(rep).startswith("FAIL: 1 finding at the gate")


def test_identical_notices_are_shown_once_with_their_count() -> None:
    rep = report(captures=8)
    groups = grouped_notices(rep.notices)
    assert len(groups) == 1 and groups[0].count == 8
    assert notice_text(groups[0]) == ("RECONSTRUCTION_SKIPPED × 8: skipped (budget quick) (c0, c1, c2 and 5 more; "
                                      "report.json lists them)")
    assert console_text(rep).count("RECONSTRUCTION_SKIPPED") == 1
    html = get_format("html").render(rep)
    assert html.count("<code>RECONSTRUCTION_SKIPPED</code>") == 1 and "× 8" in html
    assert get_format("md").render(rep).count("RECONSTRUCTION") == 1
    assert len(get_format("json").render(rep).split("RECONSTRUCTION_SKIPPED")) == 9  # the JSON keeps every one


def test_a_single_capture_gets_no_run_section_a_run_does() -> None:
    single = report(rounds=True)
    assert single.run is not None  # it records a round
    assert 'id="run"' not in get_format("html").render(single)
    assert "Leakage over rounds" not in get_format("md").render(single)
    assert verdict(single).run_line == ""
    run = report(captures=3, rounds=True)
    assert 'id="run"' in get_format("html").render(run)
    assert verdict(run).run_line.startswith("3 rounds, 1 client")


def test_a_long_capture_list_starts_collapsed() -> None:
    short, long = get_format("html").render(report(captures=3)), get_format("html").render(report(captures=25))
    assert re.search(r"<details open>\s*<summary><h3>Captures \(3\)", short)
    assert re.search(r"<details>\s*<summary><h3>Captures \(25\)", long)


@pytest.mark.usefixtures("one_thread")
def test_the_lineup_picture_is_explained_in_the_report(gleak, tmp_path: Path) -> None:
    capture_file = tmp_path / "b8.safetensors"
    shutil.copy(FEDSGD.with_name("fedsgd_b8.safetensors"), capture_file)
    shutil.copy(FEDSGD.with_name("fedsgd_b8.truth.safetensors"), tmp_path / "b8.truth.safetensors")
    result = gleak("audit", capture_file, "--model", LENET, "--aux", MNIST_AUX, "--budget", "standard",
                   "-O", "ig.iterations=20", "-o", tmp_path / "out", "--format", "html", "--fail-on", "none", "-q")
    assert result.exit_code == 0, result.stderr
    html = (tmp_path / "out/report.html").read_text()
    assert "lineup.png" in html
    assert "Green frame: the true input came first" in html and "framed red" in html


def test_findings_past_the_worst_twenty_are_collapsed() -> None:
    rep = report(captures=30)
    rep.findings = [Finding(rule="GLEAK-LABELS", severity="critical" if i < 3 else "low", capture=f"c{i}",
                            title=f"finding {i}") for i in range(30)]
    html = get_format("html").render(rep)
    assert "10 more finding(s), less severe" in html
    assert html.index("finding 0<") < html.index("10 more finding(s)")  # the worst stay in view
    assert html.count("<table class=\"findings\">") == 2
