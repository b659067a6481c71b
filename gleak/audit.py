"""Deprecated: ``gleak audit`` as a library now lives in :mod:`gleak.runs.audit`. This module re-exports its
public names for one release (0.1.x) so that code written against ``gleak.audit`` keeps working; import from
``gleak.runs.audit`` instead."""

import warnings

from gleak.runs.audit import (
    BUDGETS,
    NOTICE_CODES,
    AuditConfig,
    CaptureResult,
    ModelSet,
    audit_capture,
    audit_loaded,
    find_captures,
    find_models,
    run_audit,
)

warnings.warn("gleak.audit is deprecated: import from gleak.runs.audit", DeprecationWarning, stacklevel=2)

__all__ = ["BUDGETS", "NOTICE_CODES", "AuditConfig", "CaptureResult", "ModelSet", "audit_capture", "audit_loaded",
           "find_captures", "find_models", "run_audit"]
