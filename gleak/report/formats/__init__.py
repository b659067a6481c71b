"""Output formats of the audit report: one module per format, one interface.

Each format module defines ``NAME`` (what ``--format`` takes), ``FILENAME`` (the file written in ``-o DIR``)
and ``render(report, out_dir) -> str``: the whole file's text, built from the :class:`~gleak.report.model.Report`
alone (``out_dir`` is where the report's relative artifact paths, such as image grids, can be read from to
embed them). Formats never compute anything the report does not hold, and they escape untrusted text
(file names, metadata, reasons) for their own syntax.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol, cast

from gleak.report.model import Report

# --format name -> module under gleak.report.formats (imported on use: jinja2 and friends stay off start-up)
MODULES = {"json": "json_format", "html": "html", "sarif": "sarif", "md": "markdown", "junit": "junit"}


class Format(Protocol):
    NAME: str
    FILENAME: str

    def render(self, report: Report, out_dir: Path | None = None) -> str: ...


def get_format(name: str) -> Format:
    """The format module called ``name`` (one of :data:`MODULES`)."""
    return cast(Format, importlib.import_module(f"gleak.report.formats.{MODULES[name]}"))  # each module is a Format
