"""``report.json``: the report as JSON, exactly the shipped schema (``gleak/report/schema.json``)."""

from __future__ import annotations

from pathlib import Path

from gleak.report.model import Report

NAME = "json"
FILENAME = "report.json"


def render(report: Report, out_dir: Path | None = None) -> str:
    """The report as indented JSON (non-finite numbers are not allowed by the model's floats: None instead)."""
    return report.model_dump_json(indent=1) + "\n"
