"""report.html in a real browser: headless Chromium (Debian packages chromium, chromium-driver) loads it with no
console errors, every embedded image decodes, the summary and every capture section are there, and a screenshot
is saved. Skipped only where Chromium or its WebDriver is not installed; .ci/run installs them
(scripts/install-chromium.sh)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from gleak.report.formats import get_format
from gleak.report.model import AttackEntry, CaptureReport, FileRef, Finding, Report

from .conftest import FEDSGD, MNIST_AUX, SAMPLES

SMOOTHING = SAMPLES / "captures/smoothing_1.safetensors"
WIDTH, HEIGHT = 1280, 1600

# What the page looks like once loaded: evaluated by the WebDriver (DevTools), so the report's CSP, which
# forbids page scripts, does not apply.
INSPECT = """
const imgs = [...document.images];
return {
  ready: document.readyState,
  title: document.title,
  summary: !!document.querySelector('#summary h2') && !!document.querySelector('#verdict'),
  thresholds: !!document.querySelector('#thresholds table'),
  sections: [...document.querySelectorAll('section.capture')].map(s => s.id),
  toc: [...document.querySelectorAll('nav.toc a')].map(a => a.getAttribute('href')),
  images: imgs.map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})),
};
"""


def _find(*names: str) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


@dataclass
class Page:
    ready: str
    title: str
    summary: bool
    thresholds: bool
    sections: list[str]
    toc: list[str]
    images: list[dict[str, Any]]
    errors: list[str]
    screenshot: Path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = _find("chromium", "chromium-browser")
    chromedriver = _find("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("headless Chromium not installed (Debian: apt-get install chromium chromium-driver, "
                    "or scripts/install-chromium.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    # both paths given: Selenium Manager is never asked to find or download a browser or driver
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--force-device-scale-factor=1", f"--window-size={WIDTH},{HEIGHT}", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(30)
    # the viewport itself, not the window around it, is WIDTH x HEIGHT
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver: Any, html: Path, screenshot: Path) -> Page:
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(html.resolve().as_uri())
    state = driver.execute_script(INSPECT)
    logs = driver.get_log("browser")
    errors = [f"{e['level']}: {e['message']}" for e in logs if e["level"] == "SEVERE"]
    assert driver.save_screenshot(str(screenshot))
    return Page(**state, errors=errors, screenshot=screenshot)


def _check(page: Page, n_captures: int) -> None:
    assert page.ready == "complete"
    assert page.title.startswith("gleak audit: ")
    assert page.errors == []  # no console errors: CSP violations, failed loads, ...
    assert page.summary and page.thresholds
    want = [f"capture-{i}" for i in range(n_captures)]
    assert page.sections == want
    assert page.toc == [f"#{s}" for s in want]
    for img in page.images:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img
    with Image.open(page.screenshot) as shot:
        assert shot.format == "PNG" and shot.size == (WIDTH, HEIGHT)
        # not a blank page: the verdict badge and text give more than a handful of colours
        colors = shot.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is None or len(colors) > 20


def test_audit_report_renders_in_chromium(gleak, browser, tmp_path: Path) -> None:
    """A real ``gleak audit`` report of two captures."""
    out = tmp_path / "audit"
    r = gleak("audit", FEDSGD, SMOOTHING, "-M", SAMPLES / "models", "--aux", MNIST_AUX,
              "--format", "html", "-o", out, "--lpips", "off")
    assert r.exit_code == 1, r.stderr  # the samples leak
    page = _open(browser, out / "report.html", tmp_path / "audit.png")
    _check(page, n_captures=2)
    assert page.title == "gleak audit: FAIL"


def _grid(path: Path, size: tuple[int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size)
    image.putdata([(x * 255 // size[0], y * 255 // size[1], 128) for y in range(size[1]) for x in range(size[0])])
    image.save(path, format="PNG")


def test_embedded_images_decode_in_chromium(browser, tmp_path: Path) -> None:
    """Reconstruction grids are embedded as data: URIs that the browser decodes at their own size; an error
    capture gets its section too."""
    out = tmp_path / "out"
    grids = {"captures/a/ig_grid.png": (96, 64), "captures/a/feature_grid.png": (40, 30)}
    for rel, size in grids.items():
        _grid(out / rel, size)
    ok = CaptureReport(
        capture=FileRef(path="runs/a.safetensors", sha256="ab" * 32),
        model=FileRef(path="models/lenet.safetensors", sha256="cd" * 32),
        kind="fedsgd", batch_size=2, local_steps=1, num_classes=3, truth_counts=[1, 1, 0],
        chance={"iacc": 0.5},
        attacks=[
            AttackEntry(attack="llg", task="labels", status="ok", seconds=0.1, counts=[1, 1, 0],
                        scores={"iacc": 1.0}),
            AttackEntry(attack="ig", task="reconstruct", status="ok", seconds=2.0, scores={"psnr": 21.0},
                        artifacts=["captures/a/ig_grid.png"]),
            AttackEntry(attack="feature", task="reconstruct", status="ok", seconds=1.0, scores={"psnr": 30.0},
                        artifacts=["captures/a/feature_grid.png"]),
        ],
    )
    broken = CaptureReport(capture=FileRef(path="runs/b.safetensors", sha256=None), status="error",
                           error="cannot read runs/b.safetensors")
    report = Report(gleak_version="0.1.0", command=["gleak", "audit", "runs"], captures=[ok, broken],
                    findings=[Finding(rule="GLEAK-LABELS", severity="high", capture="runs/a.safetensors",
                                      title="labels leak", measured=1.0, metric="iacc", chance=0.5,
                                      threshold=0.2, attack="llg")])
    html = out / "report.html"
    html.write_text(get_format("html").render(report, out), encoding="utf-8")
    page = _open(browser, html, tmp_path / "images.png")
    _check(page, n_captures=2)
    assert page.title == "gleak audit: ERROR"  # one capture could not be audited (exit 2)
    assert [(i["width"], i["height"]) for i in page.images] == list(grids.values())

    # the checks see a broken image: same page, one grid's bytes cut short
    text = html.read_text(encoding="utf-8")
    start = text.index("data:image/png;base64,") + len("data:image/png;base64,")
    html.write_text(text[:start] + text[start + 200:], encoding="utf-8")
    page = _open(browser, html, tmp_path / "broken.png")
    assert [i["width"] > 0 for i in page.images] == [False, True]


def test_run_view_plots_and_sortable_clients_in_chromium(browser, tmp_path: Path) -> None:
    """A run's report: the leakage-over-rounds plot is there with its accessible name, the page's one script runs
    under its CSP hash (no console error), and the per-client table sorts when a header is clicked."""
    from selenium.webdriver.common.by import By

    from gleak.report.run_view import build_run_view

    captures, findings = [], []
    for r in range(4):
        for client, iacc in (("alpha", 1.0 - 0.2 * r), ("beta", 0.9), ("gamma", 0.5)):
            path = f"run/r{r}-{client}.safetensors"
            captures.append(CaptureReport(capture=FileRef(path=path), round=r, client=client, chance={"iacc": 0.4},
                                          attacks=[AttackEntry(attack="llg", task="labels", status="ok",
                                                               counts=[1], scores={"iacc": iacc})]))
            if iacc >= 0.9:
                findings.append(Finding(rule="GLEAK-LABELS", severity="high", capture=path, title="labels leak"))
    report = Report(gleak_version="0.1.0", captures=captures, findings=findings, fail_rounds="last:2")
    report.run = build_run_view(report)
    html = tmp_path / "report.html"
    html.write_text(get_format("html").render(report, tmp_path), encoding="utf-8")
    page = _open(browser, html, tmp_path / "run.png")
    _check(page, n_captures=len(captures))
    plots = browser.execute_script(
        "return [...document.querySelectorAll('#run svg.run-plot')].map(s => [s.getAttribute('aria-label'), "
        "s.querySelector('title').textContent, s.getBoundingClientRect().width])")
    assert [p[:2] for p in plots] == [["best label iAcc over rounds"] * 2]
    assert plots[0][2] > 200  # drawn, not collapsed

    def first_column() -> list[str]:
        return browser.execute_script("return [...document.querySelectorAll('table.clients tbody tr')]"
                                      ".map(r => r.cells[0].textContent)")

    assert first_column() == ["alpha", "beta", "gamma"]  # worst first: alpha and beta high, alpha's latest round 1
    button = browser.find_element(By.XPATH, "//table[contains(@class,'clients')]//th[1]/button")
    button.click()
    assert first_column() == ["alpha", "beta", "gamma"]
    button.click()  # descending by name
    assert first_column() == ["gamma", "beta", "alpha"]
    assert browser.find_element(By.XPATH, "//table[contains(@class,'clients')]//th[1]").get_attribute(
        "aria-sort") == "descending"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
