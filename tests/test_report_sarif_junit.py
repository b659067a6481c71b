"""report.sarif and junit.xml: SARIF valid against the official 2.1.0 schema and fit for GitHub code scanning;
JUnit XML that parses back with the right counts, whatever the capture paths contain."""

from __future__ import annotations

import json
import math
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema
import pytest

from gleak.report.formats import get_format
from gleak.report.formats import junit as junit_format
from gleak.report.formats import sarif as sarif_format
from gleak.report.model import (
    SEVERITIES,
    AttackEntry,
    CaptureReport,
    FileRef,
    Finding,
    Notice,
    Report,
)

SCHEMA_PATH = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"
# RFC 3986 URI-reference characters (no query or fragment: a file path never has one)
URI_REFERENCE = re.compile(r"^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-F]{2})*$")
EVIL = 'caps/<script>&"\x01.safetensors'
OUTSIDE = "/nonexistent-gleak-elsewhere/c.safetensors"


def make_report(tmp_path: Path, *, fail_on: str = "high", with_error: bool = True) -> Report:
    """Four captures (run with the working directory at ``tmp_path``): A relative under it, B absolute under it,
    C outside it without ground truth, D unreadable with a hostile name; findings of every severity."""
    a = "caps/a.safetensors"
    b = str(tmp_path / "sub" / "b x:1.safetensors")
    captures = [
        CaptureReport(
            capture=FileRef(path=a, sha256="0" * 64), batch_size=4, num_classes=10, truth_counts=[1, 3] + [0] * 8,
            chance={"iacc": 0.31}, seconds=2.0,
            attacks=[
                AttackEntry(attack="llg", task="labels", status="ok", seconds=0.25, counts=[1, 3] + [0] * 8,
                            scores={"iacc": 1.0, "exact": 1.0}),
                AttackEntry(attack="ig", task="reconstruct", status="ok", seconds=1.5, scores={"psnr": 16.0}),
            ]),
        CaptureReport(
            capture=FileRef(path=b), batch_size=1, num_classes=10, truth_counts=[1] + [0] * 9,
            chance={"iacc": 0.1},
            attacks=[AttackEntry(attack="softlabel", task="labels", status="ok", counts=[1] + [0] * 9,
                                 scores={"iacc": 0.2, "soft_success": 1.0, "soft_l1": 1e-5})],
            skipped=["reconstruction skipped (budget quick: analytic attacks only)"]),
        CaptureReport(
            capture=FileRef(path=OUTSIDE), batch_size=8, num_classes=10,
            attacks=[AttackEntry(attack="llg", task="labels", status="ok", counts=[8] + [0] * 9),
                     AttackEntry(attack="idlg", task="labels", status="not_applicable", reason="B > 1")],
            skipped=["idlg: B > 1", "reconstruction skipped (fcn does not apply: no bias)"]),
    ]
    if with_error:
        captures.append(CaptureReport(capture=FileRef(path=EVIL), status="error",
                                      error='not a safetensors file: <b>&"bad"</b>'))
    findings = [
        Finding(rule="GLEAK-LABELS", severity="critical", capture=a, title="llg recovers 100% of the labels",
                measured=1.0, metric="iacc", chance=0.31, threshold=1.0, attack="llg"),
        Finding(rule="GLEAK-IMAGES", severity="medium", capture=a, title="ig reconstructs the inputs at 16.0 dB",
                measured=16.0, metric="psnr", chance=12.5, threshold=15.5, attack="ig", detail="SSIM 0.4"),
        Finding(rule="GLEAK-SOFT-LABEL", severity="high", capture=b, title="softlabel recovers the soft label",
                measured=1e-5, metric="soft_l1", threshold=1e-3, attack="softlabel"),
        Finding(rule="GLEAK-LABELS", severity="low", capture=b, title="softlabel recovers 20% of the labels",
                measured=0.2, metric="iacc", chance=0.1, threshold=0.15, attack="softlabel"),
        Finding(rule="GLEAK-LABELS-AGREE", severity="info", capture=OUTSIDE, title="2 of 2 label attacks agree",
                measured=math.nan, metric="agreement", attack="llg"),
        Finding(rule="GLEAK-NEW-THING", severity="medium", capture=OUTSIDE, title="a future finding type",
                measured=math.inf),
    ]
    return Report(gleak_version="0.1.0", command=["gleak", "audit", "caps dir", "--fail-on", fail_on],
                  fail_on=fail_on, captures=captures, findings=findings, seconds=4.5,  # type: ignore[arg-type]
                  notices=[Notice(code="NO_TRUTH", message="no ground truth", capture=OUTSIDE)])


@pytest.fixture
def report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Report:
    monkeypatch.chdir(tmp_path)
    return make_report(tmp_path)


def strict_json(text: str) -> Any:
    def reject(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


# ---------------------------------------------------------------------------------------------------- SARIF


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    assert cls is jsonschema.Draft7Validator  # the schema declares draft-07
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def render_sarif(report: Report) -> dict[str, Any]:
    fmt = get_format("sarif")
    assert (fmt.NAME, fmt.FILENAME) == ("sarif", "report.sarif")
    text = fmt.render(report)
    assert text.endswith("\n")
    return strict_json(text)  # type: ignore[no-any-return]


def is_relative_reference(uri: str) -> bool:
    parts = urlsplit(uri)
    return not parts.scheme and not parts.netloc and not uri.startswith("/") and not re.match(r"^[A-Za-z]:", uri)


def test_sarif_valid_against_official_schema(report: Report, sarif_validator: Any) -> None:
    log = render_sarif(report)
    errors = sorted(sarif_validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    assert log["version"] == "2.1.0"
    assert len(log["runs"]) == 1
    driver = log["runs"][0]["tool"]["driver"]
    assert driver["name"] == "gleak"
    assert driver["version"] == driver["semanticVersion"] == "0.1.0"
    assert "informationUri" not in driver


def test_sarif_is_fit_for_github_code_scanning(report: Report) -> None:
    run = render_sarif(report)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids))
    for rule in rules:
        props = rule["properties"]
        assert {"security", "privacy"} <= set(props["tags"])
        assert isinstance(props["security-severity"], str)
        assert 0.0 <= float(props["security-severity"]) <= 10.0
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] and rule["help"]["markdown"]
    assert {"GLEAK-LABELS", "GLEAK-SOFT-LABEL", "GLEAK-IMAGES", "GLEAK-LABELS-AGREE", "GLEAK-INPUT-ERROR",
            "GLEAK-NEW-THING"} <= set(ids)
    labels_help = rules[ids.index("GLEAK-LABELS")]["help"]["markdown"]
    for mitigation in ("secure aggregation", "DP-SGD", "Opacus", "larger batches", "bias"):
        assert mitigation.lower() in labels_help.lower(), mitigation

    results = run["results"]
    assert len(results) == len(report.findings) + 1  # plus the unreadable capture
    uris = set()
    for result in results:
        assert result["ruleId"] in ids
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"]
        assert result["locations"], result
        location = result["locations"][0]["physicalLocation"]
        uri = location["artifactLocation"]["uri"]
        assert uri and "\\" not in uri and not re.match(r"^[A-Za-z]:", uri)
        assert URI_REFERENCE.match(uri), uri  # jsonschema checks "uri-reference" only with rfc3987 installed
        assert location["region"]["startLine"] == 1
        assert result["partialFingerprints"]
        uris.add(uri)
    # under the working directory: relative, posix, percent-encoded where URIs need it
    assert uris == {"caps/a.safetensors", "sub/b%20x%3A1.safetensors", OUTSIDE,
                    "caps/%3Cscript%3E&%22%01.safetensors"}
    for uri in uris - {OUTSIDE}:
        assert is_relative_reference(uri), uri
    assert unquote("sub/b%20x%3A1.safetensors") == "sub/b x:1.safetensors"


def test_sarif_levels_severities_and_properties(report: Report) -> None:
    run = render_sarif(report)["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    expected_level = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}
    findings = [r for r in run["results"] if r["ruleId"] != "GLEAK-INPUT-ERROR"]
    assert {r["properties"]["severity"] for r in findings} == set(SEVERITIES)
    for result in findings:
        props = result["properties"]
        assert result["level"] == expected_level[props["severity"]]
        assert props["security-severity"] == sarif_format.SECURITY_SEVERITY[props["severity"]]
        assert {"measured", "chance", "threshold", "attack", "severity"} <= set(props)
    labels = next(r for r in findings if r["ruleId"] == "GLEAK-LABELS" and r["properties"]["severity"] == "critical")
    assert {"measured": 1.0, "chance": 0.31, "threshold": 1.0, "attack": "llg"}.items() <= labels["properties"].items()
    assert "1" in labels["message"]["text"] and "0.31" in labels["message"]["text"]
    assert labels["message"]["text"].startswith("llg recovers 100% of the labels")
    # non-finite measurements become null, never NaN/Infinity
    agree = next(r for r in findings if r["ruleId"] == "GLEAK-LABELS-AGREE")
    assert agree["properties"]["measured"] is None
    # a rule's security-severity is the worst of its results; unknown rules get a generic one
    assert rules["GLEAK-LABELS"]["properties"]["security-severity"] == "9.5"
    assert rules["GLEAK-IMAGES"]["properties"]["security-severity"] == "5.5"
    assert rules["GLEAK-SOFT-LABEL"]["properties"]["security-severity"] == "8.0"
    assert rules["GLEAK-LABELS-AGREE"]["properties"]["security-severity"] == "0.0"
    assert rules["GLEAK-NEW-THING"]["name"] == "GleakNewThing"

    error = next(r for r in run["results"] if r["ruleId"] == "GLEAK-INPUT-ERROR")
    assert error["level"] == "error"
    assert "not a safetensors file" in error["message"]["text"]

    invocation = run["invocations"][0]
    assert invocation["executionSuccessful"] is False
    assert invocation["commandLine"] == shlex.join(report.command) == "gleak audit 'caps dir' --fail-on high"
    assert invocation["toolExecutionNotifications"][0]["descriptor"]["id"] == "NO_TRUTH"


def test_sarif_fingerprints_are_stable_and_distinct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = render_sarif(make_report(tmp_path))["runs"][0]["results"]
    again = render_sarif(make_report(tmp_path))["runs"][0]["results"]
    prints = [json.dumps(r["partialFingerprints"], sort_keys=True) for r in first]
    assert prints == [json.dumps(r["partialFingerprints"], sort_keys=True) for r in again]
    assert len(set(prints)) == len(prints)


def test_sarif_clean_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sarif_validator: Any) -> None:
    monkeypatch.chdir(tmp_path)
    empty = Report(gleak_version="0.1.0")
    log = render_sarif(empty)
    assert not list(sarif_validator.iter_errors(log))
    run = log["runs"][0]
    assert run["results"] == []
    assert run["invocations"] == [{"executionSuccessful": True}]
    ok = render_sarif(make_report(tmp_path, with_error=False))
    assert ok["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_artifact_uri(tmp_path: Path) -> None:
    uri = sarif_format.artifact_uri
    (tmp_path / "d").mkdir()
    assert uri("d/x.safetensors", tmp_path) == "d/x.safetensors"
    assert uri(str(tmp_path / "d" / "x.safetensors"), tmp_path) == "d/x.safetensors"
    assert uri("./d/../d/x.safetensors", tmp_path) == "d/x.safetensors"
    assert uri("../up.safetensors", tmp_path) == "../up.safetensors"  # outside: as given
    assert uri("/elsewhere/x y.bin", tmp_path) == "/elsewhere/x%20y.bin"
    assert uri("C:\\data\\caps\\x.bin", tmp_path) == "/data/caps/x.bin"  # never a drive (it reads as a scheme)
    assert uri("\\\\server\\share\\x.bin", tmp_path) == "/x.bin"
    assert uri("a:b#c?.bin", tmp_path) == "a%3Ab%23c%3F.bin"
    assert is_relative_reference(uri("a:b.bin", tmp_path))
    assert uri("caf\udce9.bin", tmp_path) == "caf%E9.bin"  # an undecodable file-name byte
    assert uri("caf\u00e9.bin", tmp_path) == "caf%C3%A9.bin"


# ---------------------------------------------------------------------------------------------------- JUnit


def render_junit(report: Report) -> tuple[str, ET.Element]:
    fmt = get_format("junit")
    assert (fmt.NAME, fmt.FILENAME) == ("junit", "junit.xml")
    text = fmt.render(report)
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n')
    return text, ET.fromstring(text.encode("utf-8"))


def cases(root: ET.Element) -> dict[tuple[str, str], ET.Element]:
    suite = root.find("testsuite")
    assert suite is not None
    found = {(c.get("classname", ""), c.get("name", "")): c for c in suite.iter("testcase")}
    assert len(found) == len(suite.findall("testcase"))
    return found


def outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def test_junit_counts_and_outcomes(report: Report, tmp_path: Path) -> None:
    _, root = render_junit(report)
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    assert suite.get("name") == "gleak audit"
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "14", "failures": "2", "errors": "1", "skipped": "4"}
    assert float(suite.get("time", "")) == 4.5
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")}

    found = cases(root)
    outcomes = [outcome(c) for c in found.values()]
    assert outcomes.count("failure") == 2 and outcomes.count("error") == 1 and outcomes.count("skipped") == 4

    a, b = "caps/a.safetensors", str(tmp_path / "sub" / "b x:1.safetensors")
    assert {name: outcome(found[a, name]) for name in ("input", "labels", "soft-label", "images")} == {
        "input": "passed", "labels": "failure", "soft-label": "skipped", "images": "passed"}
    failure = found[a, "labels"].find("failure")
    assert failure is not None and failure.get("type") == "GLEAK-LABELS"
    assert "llg recovers 100% of the labels" in failure.get("message", "")
    assert float(found[a, "labels"].get("time", "")) == 0.25
    images_out = found[a, "images"].findtext("system-out") or ""
    assert "GLEAK-IMAGES" in images_out and "[medium]" in images_out  # below --fail-on high: passes, noted

    assert {name: outcome(found[b, name]) for name in ("input", "labels", "soft-label", "images")} == {
        "input": "passed", "labels": "passed", "soft-label": "failure", "images": "skipped"}
    skipped = found[b, "images"].find("skipped")
    assert skipped is not None and "budget quick" in skipped.get("message", "")
    assert "[low]" in (found[b, "labels"].findtext("system-out") or "")
    assert "measured agreement n/a" in (found[OUTSIDE, "labels"].findtext("system-out") or "")  # NaN

    assert {name: outcome(found[OUTSIDE, name]) for name in ("input", "labels", "soft-label", "images",
                                                             "new-thing")} == {
        "input": "passed", "labels": "passed", "soft-label": "skipped", "images": "skipped", "new-thing": "passed"}
    assert "no ground truth" in (found[OUTSIDE, "soft-label"].find("skipped").get("message", ""))  # type: ignore[union-attr]
    assert "fcn does not apply" in (found[OUTSIDE, "images"].find("skipped").get("message", ""))  # type: ignore[union-attr]


def test_junit_hostile_capture_path_round_trips(report: Report) -> None:
    text, root = render_junit(report)
    assert "<script>" not in text and "\x01" not in text
    errors = [c for c in cases(root).values() if c.find("error") is not None]
    assert len(errors) == 1
    case = errors[0]
    assert case.get("classname") == EVIL.replace("\x01", "\\x01")  # the one character XML cannot hold, escaped
    assert case.get("name") == "input"
    error = case.find("error")
    assert error is not None
    assert error.get("message") == 'not a safetensors file: <b>&"bad"</b>'
    assert error.text == 'not a safetensors file: <b>&"bad"</b>'
    assert error.get("type") == "GLEAK-INPUT-ERROR"


def test_junit_fail_on_threshold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _, root = render_junit(make_report(tmp_path, fail_on="critical", with_error=False))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("errors"), suite.get("tests")) == ("1", "0", "13")
    _, root = render_junit(make_report(tmp_path, fail_on="info", with_error=False))
    suite = root.find("testsuite")
    assert suite is not None
    assert suite.get("failures") == "6"  # a: labels, images; b: labels, soft-label; outside: labels, new-thing
    assert suite.get("skipped") == "4"


def test_junit_xml_text_escapes_what_xml_cannot_hold() -> None:
    assert junit_format.xml_text("ok\ttab\nnl") == "ok\ttab\nnl"
    assert junit_format.xml_text("a\x00b\x1bc\udce9\ufffe") == "a\\x00b\\x1bc\\udce9\\ufffe"
    assert junit_format.check_of("GLEAK-FOO-BAR") == "foo-bar"
