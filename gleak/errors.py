"""One exception type for every problem caused by the user's input (exit code 2)."""

from __future__ import annotations


class GleakError(Exception):
    """Bad input: an unreadable file, a mismatch, missing metadata. The CLI prints it in one line, exit 2."""

    exit_code = 2
    reported = False  # True when the command already wrote its JSON report (which says why) to stdout


class ReportedError(GleakError):
    """Bad input whose JSON report (with the reasons) has already been written: no second JSON document."""

    reported = True


def shorten(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis and the full length, for error messages."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 30, 10)]}… ({len(text):,} characters)"
