"""A sweep's files: :func:`write_sweep` writes ``sweep.json``, ``sweep.md`` and each defense's plot;
:func:`load_sweep` reads ``sweep.json`` back (``gleak audit --sweep``) without the sweep runner."""

from __future__ import annotations

import json
from pathlib import Path

from gleak.errors import GleakError, shorten
from gleak.io import OutputSet, read_json_input, show
from gleak.registry import first_error
from gleak.report.model import BASELINE, SweepReport

REPORT_FILE = "sweep.json"
MARKDOWN_FILE = "sweep.md"


def write_sweep(report: SweepReport, folder: Path, force: bool = False) -> list[Path]:
    """``sweep.json``, ``sweep.md``, each defense's plot and the privacy–utility plot (PNG and SVG) in ``folder``:
    all of them or, on any failure, none (a folder this call created is removed again)."""
    from gleak.report.plots import figure_png
    from gleak.report.sweep_plots import (
        PRIVACY_UTILITY,
        figure,
        markdown,
        privacy_utility_figure,
        privacy_utility_svg,
        svg_document,
    )

    with OutputSet(folder, force) as out:
        out.write_bytes(REPORT_FILE, (json.dumps(report.to_json(), indent=2) + "\n").encode("utf-8"))
        for defense in report.defenses:
            fig = figure(report, defense.name)  # drawn once (its layout fixed), saved as both
            out.write_bytes(f"{defense.plot}.png", figure_png(fig))
            out.write_bytes(f"{defense.plot}.svg", svg_document(report, defense.name, fig).encode("utf-8"))
        fig = privacy_utility_figure(report)
        out.write_bytes(f"{PRIVACY_UTILITY}.png", figure_png(fig))
        out.write_bytes(f"{PRIVACY_UTILITY}.svg", privacy_utility_svg(report, fig).encode("utf-8"))
        out.write_bytes(MARKDOWN_FILE, markdown(report).encode("utf-8"))
        return out.commit()


def load_sweep(path: Path) -> SweepReport:
    """A sweep's ``sweep.json`` (``path`` is the sweep's folder or the file), validated against
    :class:`~gleak.report.model.SweepReport`: an untrusted file, refused in one line when it is not one."""
    from pydantic import ValidationError

    try:
        file = path / REPORT_FILE if path.is_dir() else path
    except OSError as exc:
        raise GleakError(f"cannot read {show(path)}: {exc.strerror or type(exc).__name__}") from None
    data = read_json_input(file, "sweep report")
    if not isinstance(data, dict) or data.get("report") != "sweep":
        got = data.get("report") if isinstance(data, dict) else type(data).__name__
        raise GleakError(f"{show(file)}: not a gleak sweep report (report: {shorten(repr(got), 40)})")
    try:
        report = SweepReport.model_validate(data)
    except ValidationError as e:
        loc, msg, _ = first_error(e, limit=160)
        raise GleakError(f"{show(file)}: not a valid sweep report: {shorten(loc, 80)}: {msg}") from None
    names = [d.name for d in report.defenses]
    plots = [d.plot for d in report.defenses]
    if len(set(names)) != len(names) or len(set(plots)) != len(plots):
        raise GleakError(f"{show(file)}: not a valid sweep report: a defense or plot is listed twice")
    stray = next((r.defense for r in report.rows if r.defense != BASELINE and r.defense not in names), None)
    if stray is not None:
        raise GleakError(f"{show(file)}: not a valid sweep report: rows of defense {stray!r}, which it does not list")
    return report
