"""The audit run behind ``gleak audit``: many captures, each matched to its model and auxiliary data, attacked
within a budget, scored, judged by finding rules; one :class:`~gleak.report.model.Report`.

:func:`run_audit` audits files; :func:`audit_loaded` audits a capture already in memory (the Flower strategy and
the NVFlare filter use it)."""

from gleak.runs.audit.capture import CaptureResult, audit_capture, audit_loaded
from gleak.runs.audit.findings import NOTICE_CODES
from gleak.runs.audit.run import run_audit
from gleak.runs.audit.setup import BUDGETS, AuditConfig, ModelSet, find_captures, find_models

__all__ = ["BUDGETS", "NOTICE_CODES", "AuditConfig", "CaptureResult", "ModelSet", "audit_capture", "audit_loaded",
           "find_captures", "find_models", "run_audit"]
