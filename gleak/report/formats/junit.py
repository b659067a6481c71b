"""``junit.xml``: the audit as JUnit XML, for CI systems that show test results (GitLab, Jenkins, Azure, ...).

One ``<testsuite name="gleak audit">`` with one ``<testcase>`` per capture and check; ``classname`` is the capture
path and ``name`` the check:

* ``input`` — the capture could be read and audited; a capture that could not is an ``<error>`` (and has no
  other test case, since nothing else ran);
* ``labels`` (``GLEAK-LABELS``, ``GLEAK-LABELS-AGREE``, ``GLEAK-LABELS-EXPECTED``, ``GLEAK-LABELS-ABSTAINED``),
  ``soft-label`` (``GLEAK-SOFT-LABEL``) and ``images`` (``GLEAK-IMAGES``, ``GLEAK-IMAGES-EXPECTED``) — a
  ``<failure>`` when a finding is at or above ``--fail-on``; a pass, with the findings below it in
  ``<system-out>``, otherwise; ``<skipped>`` when the check did not run (the reason from the capture's
  ``skipped`` list where it has one).

Findings of a type gleak does not know become a check named after the rule. Text is escaped by ElementTree;
characters XML 1.0 cannot hold at all (control characters, undecodable file-name bytes) are written as
``\\xNN`` / ``\\uNNNN`` escapes so that the file always parses.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gleak.report.model import CaptureReport, Finding, Report, severity_rank

NAME = "junit"
FILENAME = "junit.xml"

SUITE = "gleak audit"
CHECKS: tuple[str, ...] = ("labels", "soft-label", "images")
CHECK_OF_RULE: dict[str, str] = {
    "GLEAK-LABELS": "labels",
    "GLEAK-LABELS-AGREE": "labels",
    "GLEAK-LABELS-EXPECTED": "labels",
    "GLEAK-LABELS-ABSTAINED": "labels",
    "GLEAK-SOFT-LABEL": "soft-label",
    "GLEAK-IMAGES": "images",
    "GLEAK-IMAGES-EXPECTED": "images",
}

# Everything outside XML 1.0's Char production: C0 controls but tab/newline/return, surrogates, U+FFFE/U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with the characters XML 1.0 cannot represent replaced by visible escapes."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


def check_of(rule: str) -> str:
    """The check (test case name) a finding type belongs to."""
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
    task = {"labels": "labels", "images": "reconstruct"}.get(check)
    return sum(a.seconds for a in capture.attacks if a.task == task) if task else 0.0


class _Suite:
    def __init__(self, report: Report) -> None:
        self.report = report
        self.element = ET.Element("testsuite")
        self.tests = self.failures = self.errors = self.skipped = 0

    def case(self, classname: str, name: str, seconds: float = 0.0) -> ET.Element:
        self.tests += 1
        return ET.SubElement(self.element, "testcase", classname=xml_text(classname), name=xml_text(name),
                             time=f"{max(seconds, 0.0):.3f}")

    def check(self, classname: str, name: str, findings: list[Finding], skip: str | None, seconds: float) -> None:
        case = self.case(classname, name, seconds)
        fail_rank = severity_rank(self.report.fail_on)
        failing = sorted((f for f in findings if severity_rank(f.severity) >= fail_rank),
                         key=lambda f: -severity_rank(f.severity))
        if failing:
            self.failures += 1
            worst = failing[0]
            failure = ET.SubElement(case, "failure", message=xml_text(_describe(worst)), type=xml_text(worst.rule))
            failure.text = xml_text("\n".join(_describe(f) for f in failing))
        elif skip is not None and not findings:
            self.skipped += 1
            ET.SubElement(case, "skipped", message=xml_text(skip))
        below = [f for f in findings if severity_rank(f.severity) < fail_rank]
        if below:
            out = ET.SubElement(case, "system-out")
            out.text = xml_text(f"findings below --fail-on {self.report.fail_on}:\n"
                                + "\n".join(_describe(f) for f in below))


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
        checks = list(CHECKS) + sorted({check_of(f.rule) for f in findings} - set(CHECKS))
        for check in checks:
            mine = [f for f in findings if check_of(f.rule) == check]
            suite.check(path, check, mine, _skip_reason(capture, check), _check_seconds(capture, check))
    for path, findings in by_capture.items():  # findings on a capture the report does not list
        if path in seen:
            continue
        for check in sorted({check_of(f.rule) for f in findings}):
            suite.check(path, check, [f for f in findings if check_of(f.rule) == check], None, 0.0)

    counts = {"tests": str(suite.tests), "failures": str(suite.failures), "errors": str(suite.errors),
              "skipped": str(suite.skipped), "time": f"{max(report.seconds, 0.0):.3f}"}
    root = ET.Element("testsuites", {"name": SUITE, **counts})
    suite.element.attrib.update({"name": SUITE, **counts})
    properties = ET.Element("properties")
    for key, value in (("gleak_version", report.gleak_version), ("budget", report.budget),
                       ("fail_on", report.fail_on), ("seed", str(report.seed)), ("device", report.device)):
        ET.SubElement(properties, "property", name=key, value=xml_text(value))
    suite.element.insert(0, properties)
    root.append(suite.element)
    return root


def render(report: Report, out_dir: Path | None = None) -> str:
    """The JUnit XML document, with its XML declaration."""
    root = build(report)
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
