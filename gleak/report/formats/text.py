"""Numbers as people read them, for every renderer (console tables, Markdown, image captions): one formatter."""

from __future__ import annotations

import math

MISSING = "—"  # a value that is absent (None) or not a finite number


def fmt_number(value: float | None, digits: int, *, trim: bool = False) -> str:
    """``value`` with ``digits`` decimals; ``—`` for None, NaN and ±infinity (JSON has none of them, so a report
    that held one records None). ``trim`` drops trailing zeros (``0.250`` -> ``0.25``, ``1.000`` -> ``1``)."""
    if value is None or not math.isfinite(value):
        return MISSING
    text = f"{value:.{digits}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.00"
