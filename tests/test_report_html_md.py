"""report.html and report.md: self-contained, escaped, and showing what the report holds."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest
from PIL import Image

from gleak.report.formats import get_format
from gleak.report.formats.html import bar_chart_svg, embed_png
from gleak.report.formats.markdown import md_escape
from gleak.report.model import (
    SEVERITIES,
    AttackEntry,
    CaptureReport,
    FileRef,
    Finding,
    Notice,
    Report,
)

SCRIPT = "<script>alert(1)</script>"
LINK = "[click](http://evil.example)"
EVIL = f"runs/{SCRIPT}{LINK}.safetensors"
GRID = "attacks/capture-1/invertinggradients/grid.png"


def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (200, 30, 30)).save(path, format="PNG")


def _report(fail_on: str = "high") -> Report:
    evil = CaptureReport(
        capture=FileRef(path=EVIL, sha256="ab" * 32),
        status="error",
        error=f"cannot read {SCRIPT} {LINK}",
        assumptions=[f"assumed from metadata: {SCRIPT}"],
        skipped=[f"rlu: {LINK}"],
    )
    clean = CaptureReport(
        capture=FileRef(path="runs/clean.safetensors", sha256="0123456789abcdef" * 4),
        model=FileRef(path="models/lenet.safetensors", sha256="fe" * 32),
        truth=FileRef(path="data/truth.safetensors", sha256=None),
        kind="fedsgd",
        batch_size=4,
        local_steps=1,
        num_classes=5,
        last_layer="fc.weight",
        assumptions=["softmax cross-entropy, mean reduction"],
        truth_counts=[2, 0, 1, 1, 0],
        chance={"iacc": 0.42, "cacc": 0.5},
        attacks=[
            AttackEntry(attack="llg", task="labels", status="ok", seconds=0.1, counts=[2, 0, 1, 0, 1],
                        scores={"iacc": 0.75, "cacc": 0.6, "exact": 0.6}),
            AttackEntry(attack="ilrg", task="labels", status="ok", seconds=0.2, counts=[2, 0, 1, 1, 0],
                        scores={"iacc": 1.0, "cacc": 1.0, "exact": 1.0},
                        soft_label=[0.5, 0.0, 0.25, 0.25, 0.0]),
            AttackEntry(attack="rlu", task="labels", status="not_applicable", reason=f"needs m > 1 {LINK}"),
            AttackEntry(attack="invertinggradients", task="reconstruct", status="ok", seconds=3.5,
                        scores={"psnr": 24.5, "ssim": 0.81, "lpips": 0.12}, artifacts=[GRID, "attacks/x.json"]),
            AttackEntry(attack="dlg", task="reconstruct", status="ok", seconds=1.0, scores={"psnr": 12.0},
                        artifacts=["../outside.png", "missing.png"]),
        ],
        skipped=["cpl: budget quick"],
    )
    findings = [
        Finding(rule=f"GLEAK-{s.upper()}", severity=s, capture=clean.capture.path, title=f"a {s} finding",
                measured=0.75, metric="iacc", chance=0.42, threshold=0.2, attack="llg")
        for s in SEVERITIES
    ]
    findings.append(Finding(rule="GLEAK-LABELS", severity="low", capture=EVIL, title=f"title {SCRIPT}",
                            detail=LINK))
    return Report(
        gleak_version="0.1.0",
        command=["gleak", "audit", EVIL, "--budget", "quick", "-o", "out dir"],
        fail_on=fail_on,  # type: ignore[arg-type]
        captures=[evil, clean],
        findings=findings,
        notices=[Notice(code="NO_TRUTH", message=f"no truth for {LINK} {SCRIPT}", capture=EVIL)],
    )


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    _png(out / GRID)
    _png(tmp_path / "outside.png")  # exists, but outside the output folder: never read
    return out


def test_html_escapes_untrusted_text(out_dir: Path) -> None:
    html = get_format("html").render(_report(), out_dir)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert LINK in html  # as text: HTML has no Markdown links
    assert 'href="http' not in html
    # error, assumption, skipped, reason, notice, finding title and the command all appear escaped
    for needle in ("cannot read &lt;script&gt;", "assumed from metadata: &lt;script&gt;", "rlu: [click]",
                   "needs m &gt; 1 [click]", "no truth for [click]", "title &lt;script&gt;"):
        assert needle in html, needle


def test_html_is_self_contained(out_dir: Path) -> None:
    html = get_format("html").render(_report(), out_dir)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert "http://" not in html.replace("http://evil.example", "")  # the only URL is the untrusted text
    assert "https://" not in html
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "<style>" in html


def test_html_embeds_png_grid(out_dir: Path) -> None:
    html = get_format("html").render(_report(), out_dir)
    uris = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(uris) == 1  # the grid; ../outside.png is outside out_dir, missing.png does not exist
    image = Image.open(io.BytesIO(base64.b64decode(uris[0])))
    assert image.format == "PNG" and image.size == (8, 6)
    assert "PSNR 24.50 dB, SSIM 0.810, LPIPS 0.120" in html
    assert "outside the output folder" in html and "file not found" in html
    # without an output folder nothing is read
    assert "data:image/png" not in get_format("html").render(_report(), None)


def test_embed_png_refuses_non_png_and_large(tmp_path: Path) -> None:
    (tmp_path / "fake.png").write_bytes(b"not a png")
    assert embed_png(tmp_path, "fake.png") == (None, "not embedded: not a PNG file")
    big = tmp_path / "big.png"
    with big.open("wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.truncate(20 * 1024 * 1024)
    assert embed_png(tmp_path, "big.png")[0] is None


def test_html_chart_sections_and_verdict(out_dir: Path) -> None:
    report = _report()
    html = get_format("html").render(report, out_dir)
    assert html.count("<svg") == 1  # the error capture has no chart
    # true counts beside the best label attack by iAcc (ilrg): 5 classes x 2 series
    assert len(re.findall(r'<rect class="bar s0"', html)) == 5
    assert len(re.findall(r'<rect class="bar s1"', html)) == 5
    assert ">true<" in html and ">ilrg<" in html and "ilrg (best iAcc" in html
    for i in range(len(report.captures)):
        assert f'id="capture-{i}"' in html and f'href="#capture-{i}"' in html
    assert report.failed() and report.has_errors()  # a capture that could not be audited outranks the gate
    assert '<div class="verdict error" id="verdict">ERROR</div>' in html
    assert "1 of 2 capture(s) could not be audited; 2 findings at the gate" in html
    for s in SEVERITIES:
        assert f'badge sev-{s}"' in html
    assert "high: 1" in html and "low: 2" in html
    assert "sha256:0123456789ab" in html  # short sha
    assert "0.500 0.000 0.250 0.250 0.000" in html  # soft labels
    assert "cpl: budget quick" in html
    assert "labels_high" in html and "image_critical" in html  # thresholds table
    assert "gleak 0.1.0" in html and "schema v2" in html
    # the command, shell-quoted, then escaped
    assert "gleak audit &#39;runs/&lt;script&gt;" in html and "&#39;out dir&#39;" in html

    audited = [c for c in report.captures if c.status != "error"]
    passing = report.model_copy(update={"fail_on": "critical", "findings": report.findings[:4], "captures": audited})
    assert not passing.failed()
    assert '<div class="verdict pass" id="verdict">PASS</div>' in get_format("html").render(passing, out_dir)
    failing = report.model_copy(update={"captures": audited})
    assert '<div class="verdict fail" id="verdict">FAIL</div>' in get_format("html").render(failing, out_dir)


def test_bar_chart_svg_escapes_labels() -> None:
    svg = bar_chart_svg([("a<b>", [1, 2, 3]), ("x", [0, 0])], class_names=["<i>", "1", "2"])
    assert "<b>" not in svg and "<i>" not in svg and "a&lt;b&gt;" in svg and "&lt;i&gt;" in svg
    assert svg.count('class="bar s0"') == 3 and svg.count('class="bar s1"') == 3
    assert bar_chart_svg([]) == ""


def test_md_escape() -> None:
    assert md_escape(LINK) == r"\[click\]\(http\://evil\.example\)"
    assert md_escape(SCRIPT) == "&lt;script&gt;alert\\(1\\)&lt;/script&gt;"
    assert md_escape("a|b\nc\r\nd") == r"a\|b c  d"
    assert md_escape(r"\*_`#+-.!{}") == r"\\\*\_\`\#\+\-\.\!\{\}"
    assert md_escape("&amp;") == "&amp;amp;"


def test_markdown_summary() -> None:
    report = _report()
    md = get_format("md").render(report)
    assert "<script" not in md and "&lt;script&gt;" in md
    assert r"\[click\]" in md and "](http" not in md and "http://" not in md
    assert md.startswith("## ❌ gleak audit: **ERROR**")  # one capture could not be audited
    lines = md.splitlines()
    findings = [line for line in lines if line.startswith("| **")]
    assert len(findings) == len(report.findings)
    assert any(line.startswith("| **critical** | runs/clean\\.safetensors | GLEAK\\-CRITICAL |") for line in lines)
    assert "| 0.75 | 0.42 | 0.2 |" in md
    rows = [line for line in lines if line.startswith("| runs/")]
    assert len(rows) == len(report.captures)
    assert "| runs/clean\\.safetensors | ok | ilrg | 1 | +0.580 | 12.00 / 24.50 dB |" in md
    assert rows[0].count("|") - rows[0].count("\\|") == 7  # the error row stays one row of six cells
    assert "NO\\_TRUTH" in md

    passing = report.model_copy(update={"fail_on": "critical", "findings": report.findings[:4],
                                        "captures": [c for c in report.captures if c.status != "error"]})
    assert "gleak audit: **PASS**" in get_format("md").render(passing)


def test_empty_report_renders() -> None:
    report = Report(gleak_version="0.1.0")
    html = get_format("html").render(report)
    assert '<div class="verdict pass" id="verdict">PASS</div>' in html and "No findings." in html
    assert "gleak audit: **PASS**" in get_format("md").render(report)
