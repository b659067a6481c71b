"""An audit's report files, written together: the run's plots, one file per format, report.html with a sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gleak.io import OutputSet
from gleak.report.formats import get_format
from gleak.report.model import Report, SweepReport


def write_outputs(report: Report, formats: Sequence[str], out_dir: Path,
                  sweep: SweepReport | None = None) -> list[Path]:
    """Write ``report`` into ``out_dir`` as ``formats`` (file formats: json, html, sarif, md, junit; not table),
    all or none: the run's plots first (listed in ``report.run.plots``), then each format's file; with ``sweep``,
    report.html carries its plots and tables. Returns the paths written."""
    from gleak.report.verdict import has_run

    with OutputSet(out_dir, True) as out:
        if report.run is not None and has_run(report):  # the series' plots, or ε alone
            from gleak.report.plots import run_plots

            for name, data in run_plots(report.run).items():
                out.write_bytes(name, data)
                report.run.plots.append(name)
        for name in formats:
            fmt = get_format(name)
            if name == "html" and sweep is not None:
                from gleak.report.formats.html import render as render_html

                out.write_bytes(fmt.FILENAME, render_html(report, out_dir, sweep).encode("utf-8"))
                continue
            out.write_bytes(fmt.FILENAME, fmt.render(report, out_dir).encode("utf-8"))
        return out.commit()
