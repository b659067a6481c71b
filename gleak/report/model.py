"""The audit report: one versioned, typed result model (pydantic v2) that every output format renders.

``Report`` is what ``gleak audit`` builds and what the formatters in :mod:`gleak.report.formats` read. Its JSON
Schema ships as ``gleak/report/schema.json`` (regenerate with ``python -m gleak.report.model``); tests check
that the shipped file matches the model and validate every JSON gleak writes against it.

Untrusted text (file names, metadata, reasons quoting them) is stored as given: escaping is each formatter's
job (HTML, Markdown, XML), never the model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal["1"] = "1"
SCHEMA_PATH = Path(__file__).with_name("schema.json")

Severity = Literal["info", "low", "medium", "high", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "low", "medium", "high", "critical")
Status = Literal["ok", "not_applicable", "failed", "error"]


def severity_rank(severity: str) -> int:
    """Position of ``severity`` in :data:`SEVERITIES` (info = 0 … critical = 4)."""
    return [str(s) for s in SEVERITIES].index(severity)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileRef(_Model):
    """An input file: its path as given and the sha256 of its bytes."""

    path: str
    sha256: str | None = None


class AttackEntry(_Model):
    """One attack on one capture."""

    attack: str
    task: Literal["labels", "reconstruct"]
    status: Status
    seconds: float = 0.0
    reason: str | None = Field(None, description="why it did not apply, failed or raised (one line)")
    counts: list[int] | None = Field(None, description="recovered examples per class (label attacks)")
    soft_label: list[float] | None = None
    scores: dict[str, float | None] | None = Field(None, description="against the ground truth, when known")
    options: dict[str, Any] = Field(default_factory=dict, description="the options the attack ran with")
    warnings: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list, description="files written for this attack (relative)")


class Finding(_Model):
    """A leak measured against a documented threshold."""

    rule: str = Field(description="stable finding type, e.g. GLEAK-LABELS")
    severity: Severity
    capture: str
    title: str
    measured: float | None = None
    metric: str | None = None
    chance: float | None = Field(None, description="the same metric for random guessing, where one exists")
    threshold: float | None = Field(None, description="the value at which this severity starts")
    attack: str | None = None
    detail: str | None = None


class Notice(_Model):
    """A warning with a stable code (e.g. NO_TRUTH, SKIPPED)."""

    code: str
    message: str
    capture: str | None = None


class CaptureReport(_Model):
    """Everything the audit learned from one capture (or why it could not read it)."""

    capture: FileRef
    status: Literal["ok", "error"] = "ok"
    error: str | None = None
    model: FileRef | None = None
    aux: FileRef | None = None
    truth: FileRef | None = None
    kind: str | None = None
    batch_size: int | None = None
    local_steps: int | None = None
    num_classes: int | None = None
    last_layer: str | None = None
    loss: dict[str, Any] | None = None
    model_mode: str | None = None
    assumptions: list[str] = Field(default_factory=list, description="what the attacks assumed, and from where")
    truth_counts: list[int] | None = None
    chance: dict[str, float] | None = None
    attacks: list[AttackEntry] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="planned work left out, and why")
    seconds: float = 0.0


class Thresholds(_Model):
    """Where each severity starts. Defaults and their sources are documented in the README ("Audit in CI")."""

    labels_critical: float = Field(1.0, description="best iAcc: every label recovered exactly")
    labels_high: float = Field(0.9, description="best iAcc")
    labels_medium_margin: float = Field(0.2, description="best iAcc minus the chance iAcc")
    labels_low_margin: float = Field(0.05, description="best iAcc minus the chance iAcc")
    image_critical_psnr: float = Field(30.0, description="mean PSNR (dB) of the matched reconstructions")
    image_high_psnr: float = Field(20.0, description="mean PSNR (dB)")
    image_medium_margin: float = Field(3.0, description="mean PSNR above the no-attack baseline (dB)")
    image_low_margin: float = Field(1.0, description="mean PSNR above the no-attack baseline (dB)")


class Report(_Model):
    """The whole audit."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    tool: Literal["gleak"] = "gleak"
    gleak_version: str
    command: list[str] = Field(default_factory=list, description="how to reproduce the run")
    budget: Literal["quick", "standard", "full"] = "quick"
    fail_on: Severity | Literal["none"] = "high"
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    jobs: int = 1
    thresholds: Thresholds = Field(default_factory=Thresholds)
    captures: list[CaptureReport] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    notices: list[Notice] = Field(default_factory=list)
    seconds: float = 0.0

    def worst(self) -> Severity | None:
        """The highest severity among the findings, or None."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=severity_rank)

    def failed(self) -> bool:
        """Whether a finding is at or above ``fail_on`` (never with ``none``)."""
        if self.fail_on == "none":
            return False
        return any(severity_rank(f.severity) >= severity_rank(self.fail_on) for f in self.findings)

    def has_errors(self) -> bool:
        """Whether any capture could not be audited (bad input)."""
        return any(c.status == "error" for c in self.captures)


def json_schema() -> dict[str, Any]:
    """The report's JSON Schema (draft 2020-12), as shipped in ``schema.json``."""
    schema = Report.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://gleak.invalid/report/v{SCHEMA_VERSION}/schema.json"
    return schema


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
