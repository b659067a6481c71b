"""``junit.xml``: the audit as JUnit XML, for CI systems that show test results (GitLab, Jenkins, Azure, ...).

One ``<testsuite name="gleak audit">`` with one ``<testcase>`` per capture and check; ``classname`` is the capture
path and ``name`` the check:

* ``input`` — the capture could be read and audited; a capture that could not is an ``<error>`` (and has no
  other test case, since nothing else ran);
* ``labels`` (``GLEAK-LABELS``, ``GLEAK-LABELS-AGREE``, ``GLEAK-LABELS-EXPECTED``, ``GLEAK-LABELS-ABSTAINED``),
  ``soft-label`` (``GLEAK-SOFT-LABEL``) and ``images`` (``GLEAK-IMAGES``, ``GLEAK-IMAGES-EXPECTED``) — a
  ``<failure>`` when a finding is at or above ``--fail-on``; a pass, with the findings below it in
  ``<system-out>``, otherwise; ``<skipped>`` when the check did not run (the reason from the capture's
  ``skipped`` list where it has one). A language model's capture has the one check ``tokens``
  (``GLEAK-TEXT-TOKENS``) instead.

With ``--fail-rounds last:K`` a capture outside the K latest rounds fails no check: its findings are listed in
``<system-out>``; with ``all`` no capture check fails and the run's ``gate`` case below decides. When captures
record rounds (the report's run view), a second ``<testsuite name="gleak audit: rounds">`` holds one case per round
(``classname`` ``run``, ``name`` ``round N`` or ``unknown round``: a ``<failure>`` when a gated round has a finding
at or above ``--fail-on``, the round's series in ``<system-out>``) and the case ``gate``, failing when the audit
does.

Findings of a type gleak does not know become a check named after the rule. Text is escaped by ElementTree;
characters XML 1.0 cannot hold at all (control characters, undecodable file-name bytes) are written as
``\\xNN`` / ``\\uNNNN`` escapes so that the file always parses.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gleak.report.model import NOT_ASSESSED, CaptureReport, Finding, Report, RunView, severity_rank
from gleak.report.run_view import gate_text

NAME = "junit"
FILENAME = "junit.xml"

SUITE = "gleak audit"
ROUNDS_SUITE = "gleak audit: rounds"
CHECKS: tuple[str, ...] = ("labels", "soft-label", "images")
TEXT_CHECKS: tuple[str, ...] = ("tokens", "text")  # a language model's capture
CHECK_OF_RULE: dict[str, str] = {
    "GLEAK-LABELS": "labels",
    "GLEAK-LABELS-AGREE": "labels",
    "GLEAK-LABELS-EXPECTED": "labels",
    "GLEAK-LABELS-ABSTAINED": "labels",
    "GLEAK-SOFT-LABEL": "soft-label",
    "GLEAK-IMAGES": "images",
    "GLEAK-IMAGES-EXPECTED": "images",
    "GLEAK-TEXT-TOKENS": "tokens",
    "GLEAK-TEXT": "text",
    "GLEAK-TEXT-EXPECTED": "text",
    "GLEAK-TEXT-TOKENS-EXPECTED": "tokens",
}

# Everything outside XML 1.0's Char production: C0 controls but tab/newline/return, surrogates, U+FFFE/U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with the characters XML 1.0 cannot represent replaced by visible escapes."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


THREAT_CHECK = {"labels": "labels", "images": "images", "tokens": "tokens", "sentences": "text"}


def check_of(rule: str, threat: str | None = None) -> str:
    """The check (test case name) a finding type belongs to; GLEAK-NOT-ASSESSED: the check of its threat."""
    if rule == NOT_ASSESSED and threat in THREAT_CHECK:
        return THREAT_CHECK[str(threat)]
    return CHECK_OF_RULE.get(rule) or rule.removeprefix("GLEAK-").lower()


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _describe(f: Finding) -> str:
    line = f"[{f.severity}] {f.rule}: {f.title}"
    if f.measured is not None:
        line += f" (measured {f.metric or 'value'} {_fmt(f.measured)}"
        if f.chance is not None:
            line += f", chance {_fmt(f.chance)}"
        if f.threshold is not None:
            line += f", threshold {_fmt(f.threshold)}"
        line += ")"
    if f.detail:
        line += f"; {f.detail}"
    return line


def _label_attacks(capture: CaptureReport) -> list[str]:
    return [a.attack for a in capture.attacks if a.task == "labels"]


def _skipped_entries(capture: CaptureReport, check: str) -> list[str]:
    """The capture's ``skipped`` entries that concern ``check``."""
    if check == "images":
        return [s for s in capture.skipped if s.startswith("reconstruction")]
    if check in ("labels", "soft-label"):
        names = set(_label_attacks(capture))
        return [s for s in capture.skipped if s.split(":", 1)[0].strip() in names]
    return []


def _skip_reason(capture: CaptureReport, check: str) -> str | None:
    """Why ``check`` did not run on ``capture``, or None when it ran."""
    has_truth = capture.truth_counts is not None or capture.chance is not None
    if check == "labels":
        ran = [a for a in capture.attacks if a.task == "labels" and a.status == "ok"]
        if ran and has_truth:
            return None
        if ran:
            return "no ground truth: the recovered labels could not be scored"
        return "; ".join(_skipped_entries(capture, check)) or "no label attack ran"
    if check == "soft-label":
        if any(a.task == "labels" and a.scores and "soft_success" in a.scores for a in capture.attacks):
            return None
        if not has_truth:
            return "no ground truth: soft labels could not be scored"
        if capture.batch_size is not None and capture.batch_size != 1:
            return f"soft-label recovery applies to a single example (batch size {capture.batch_size})"
        return "no label attack recovered a soft label"
    if check in ("tokens", "text"):  # the audit's own answer (gleak.runs.audit.coverage)
        threat = "tokens" if check == "tokens" else "sentences"
        cover = next((c for c in capture.coverage or [] if c.threat == threat), None)
        if cover is None:
            return f"no {threat} attack ran"
        return None if cover.status == "assessed" else cover.reason or cover.status
    if check == "images":
        recon = [a for a in capture.attacks if a.task == "reconstruct"]
        if any(a.scores and a.scores.get("psnr") is not None for a in recon) or capture.expected_images:
            return None
        reasons = _skipped_entries(capture, check)
        reasons += [f"{a.attack} {a.status}: {a.reason}" if a.reason else f"{a.attack} {a.status}"
                    for a in recon if a.status != "ok"]
        if not reasons and recon and not has_truth:
            reasons.append("no ground truth: the reconstructions could not be scored")
        return "; ".join(reasons) or "no reconstruction ran"
    return None


def _check_seconds(capture: CaptureReport, check: str) -> float:
    if check == "tokens":
        return sum(t.seconds for t in capture.tokens or [])
    if check == "text":
        return capture.sentences.seconds if capture.sentences is not None else 0.0
    task = {"labels": "labels", "images": "reconstruct"}.get(check)
    return sum(a.seconds for a in capture.attacks if a.task == task) if task else 0.0


class _Suite:
    def __init__(self, report: Report, name: str = SUITE) -> None:
        self.report = report
        self.element = ET.Element("testsuite", name=name)
        self.tests = self.failures = self.errors = self.skipped = 0

    def case(self, classname: str, name: str, seconds: float = 0.0) -> ET.Element:
        self.tests += 1
        return ET.SubElement(self.element, "testcase", classname=xml_text(classname), name=xml_text(name),
                             time=f"{max(seconds, 0.0):.3f}")

    def check(self, classname: str, name: str, findings: list[Finding], skip: str | None, seconds: float,
              gated: bool = True) -> None:
        case = self.case(classname, name, seconds)
        fail_rank = severity_rank(self.report.fail_on)
        failing = sorted((f for f in findings if severity_rank(f.severity) >= fail_rank),
                         key=lambda f: -severity_rank(f.severity))
        outside = failing if not gated else []
        failing = failing if gated else []
        if failing:
            self.failures += 1
            worst = failing[0]
            failure = ET.SubElement(case, "failure", message=xml_text(_describe(worst)), type=xml_text(worst.rule))
            failure.text = xml_text("\n".join(_describe(f) for f in failing))
        elif skip is not None and not findings:
            self.skipped += 1
            ET.SubElement(case, "skipped", message=xml_text(skip))
        below = [f for f in findings if severity_rank(f.severity) < fail_rank]
        text = []
        if outside:
            text.append(f"findings outside the gate ({gate_text(self.report)}):\n"
                        + "\n".join(_describe(f) for f in outside))
        if below:
            text.append(f"findings below --fail-on {self.report.fail_on}:\n" + "\n".join(_describe(f) for f in below))
        if text:
            ET.SubElement(case, "system-out").text = xml_text("\n".join(text))

    def totals(self, seconds: float) -> dict[str, str]:
        counts = {"tests": str(self.tests), "failures": str(self.failures), "errors": str(self.errors),
                  "skipped": str(self.skipped), "time": f"{max(seconds, 0.0):.3f}"}
        self.element.attrib.update(counts)
        return counts


def _gated(report: Report, capture: CaptureReport) -> bool:
    """Whether the gate looks at this capture's findings (see the module docstring)."""
    if report.fail_rounds == "any" or not any(c.round is not None for c in report.captures):
        return True
    if report.fail_rounds == "all":
        return False
    return capture.round is None or capture.round in report.gated_rounds()


def _rounds_suite(report: Report, view: RunView) -> _Suite:
    suite = _Suite(report, ROUNDS_SUITE)
    fail_rank = severity_rank(report.fail_on)
    scope_all = report.fail_rounds == "all"
    for r in view.rounds:
        case = suite.case("run", "unknown round" if r.round is None else f"round {r.round}")
        series = "; ".join(f"{name}: max {_fmt(p.max)}, median {_fmt(p.median)}"
                           + (f", chance {_fmt(p.chance)}" if p.chance is not None else "")
                           for name, p in r.series.items())
        summary = (f"{r.captures} capture(s), {r.clients} client(s), {r.findings} finding(s), worst "
                   f"{r.worst or 'none'}" + (f"; {series}" if series else ""))
        if r.worst is not None and severity_rank(r.worst) >= fail_rank and r.gated and not scope_all:
            suite.failures += 1
            ET.SubElement(case, "failure", message=xml_text(f"round has a finding ≥ {report.fail_on}"),
                          type="GLEAK-ROUND").text = xml_text(summary)
        ET.SubElement(case, "system-out").text = xml_text(summary + ("" if r.gated else " (outside the gate)"))
    case = suite.case("run", "gate")
    if report.failed():
        suite.failures += 1
        ET.SubElement(case, "failure", message=xml_text(f"a finding {gate_text(report)}"), type="GLEAK-GATE")
    return suite


def build(report: Report) -> ET.Element:
    """The ``<testsuites>`` element of ``report``."""
    suite = _Suite(report)
    by_capture: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_capture.setdefault(f.capture, []).append(f)

    seen: set[str] = set()
    for capture in report.captures:
        path = capture.capture.path
        seen.add(path)
        findings = by_capture.get(path, [])
        if capture.status == "error":
            case = suite.case(path, "input", capture.seconds)
            suite.errors += 1
            message = capture.error or "the capture could not be audited"
            error = ET.SubElement(case, "error", message=xml_text(message), type="GLEAK-INPUT-ERROR")
            error.text = xml_text(message)
            continue
        suite.case(path, "input", 0.0)
        base = TEXT_CHECKS if capture.tokens is not None else CHECKS
        checks = list(base) + sorted({check_of(f.rule, f.metric) for f in findings} - set(base))
        for check in checks:
            mine = [f for f in findings if check_of(f.rule, f.metric) == check]
            suite.check(path, check, mine, _skip_reason(capture, check), _check_seconds(capture, check),
                        _gated(report, capture))
    for path, findings in by_capture.items():  # findings on a capture the report does not list
        if path in seen:
            continue
        for check in sorted({check_of(f.rule, f.metric) for f in findings}):
            suite.check(path, check, [f for f in findings if check_of(f.rule, f.metric) == check], None, 0.0)

    suites = [suite] + ([_rounds_suite(report, report.run)] if report.run is not None else [])
    totals = [s.totals(report.seconds if i == 0 else 0.0) for i, s in enumerate(suites)]
    counts = {k: str(sum(int(t[k]) for t in totals)) for k in ("tests", "failures", "errors", "skipped")}
    root = ET.Element("testsuites", {"name": SUITE, **counts, "time": f"{max(report.seconds, 0.0):.3f}"})
    properties = ET.Element("properties")
    for key, value in (("gleak_version", report.gleak_version), ("budget", report.budget),
                       ("fail_on", report.fail_on), ("fail_rounds", report.fail_rounds), ("seed", str(report.seed)),
                       ("device", report.device)):
        ET.SubElement(properties, "property", name=key, value=xml_text(value))
    suite.element.insert(0, properties)
    root.extend(s.element for s in suites)
    return root


def render(report: Report, out_dir: Path | None = None) -> str:
    """The JUnit XML document, with its XML declaration."""
    root = build(report)
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
