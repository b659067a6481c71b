"""Same inputs and seed, same bytes: the time stamps and timings gleak writes into its files.

A time stamp comes from the input where one exists (a defended capture keeps the time of the capture it came from),
else from ``SOURCE_DATE_EPOCH`` when that is set (the reproducible-builds convention: seconds since 1970, UTC), else
from the clock. With ``SOURCE_DATE_EPOCH`` set, the timings of a run (seconds, stage times, iterations per second)
are also written as 0, so that two runs give identical files (docs/capture-format.md, "Reproducible files")."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from pydantic import BaseModel

_Model = TypeVar("_Model", bound="BaseModel")

ENV = "SOURCE_DATE_EPOCH"
# the report fields that hold how long something took, zeroed when ENV is set (floats -> 0.0, the others -> None)
TIMING_FIELDS = frozenset({"seconds", "total_seconds", "attack_seconds", "stage_seconds", "iterations_per_second",
                           "evaluations_per_second", "training_seconds"})


def source_date_epoch() -> datetime | None:
    """``SOURCE_DATE_EPOCH`` as a UTC time, or None when it is unset or empty; anything else is one error line."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or len(text) > 12:
        raise GleakError(f"{ENV} must be a whole number of seconds since 1970-01-01 UTC, got {shorten(text, 40)!r}")
    return datetime.fromtimestamp(int(text), UTC)


def reproducible() -> bool:
    """Whether ``SOURCE_DATE_EPOCH`` asks for reproducible files."""
    return source_date_epoch() is not None


def created_at(from_input: str | None = None, *, clock: bool = True) -> str | None:
    """The time stamp to write: the input's own where it has one, else ``SOURCE_DATE_EPOCH``, else now (or None
    when ``clock`` is False: a file derived from an input without a time keeps having none)."""
    if from_input:
        return from_input
    when = source_date_epoch()
    if when is None and clock:
        when = datetime.now(UTC)
    return None if when is None else when.isoformat(timespec="seconds")


def zero_timings(model: _Model) -> _Model:
    """``model`` (a pydantic report, walked with its sub-models, lists and dicts) with every timing set to 0 (None
    where a timing is optional) when ``SOURCE_DATE_EPOCH`` is set; unchanged otherwise. Returns ``model``."""
    if reproducible():
        _zero(model, depth=0)
    return model


def _zero(value: Any, depth: int) -> None:
    if depth > 64:
        return
    fields = getattr(type(value), "model_fields", None)
    if isinstance(fields, dict):
        for name in fields:
            current = getattr(value, name, None)
            if name in TIMING_FIELDS:
                object.__setattr__(value, name, 0.0 if isinstance(current, (int, float)) and
                                   not isinstance(current, bool) else None)
            else:
                _zero(current, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _zero(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _zero(item, depth + 1)
