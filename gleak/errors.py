"""One exception type for every problem caused by the user's input (exit code 2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T", bound=str)


TRUTH_CONTRADICTION = "--truth and --no-truth contradict each other; give one"


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


def did_you_mean(name: str, choices: Iterable[str], most: int = 1) -> str:
    """``"; did you mean 'fail-on'?"`` for the choices closest to ``name`` (up to ``most``, joined by "or"), or
    "" when none is close.

    Underscores and dashes count as the same character (``fail_on`` finds ``fail-on``), and so do upper and
    lower case; otherwise :func:`difflib.get_close_matches` decides."""
    import difflib

    options = list(dict.fromkeys(choices))

    def norm(text: str) -> str:
        return text.lower().replace("_", "-")

    exact = [c for c in options if norm(c) == norm(name) and c != name]
    by_norm = {norm(c): c for c in options}
    close = exact or [by_norm[c] for c in difflib.get_close_matches(norm(name), list(by_norm), n=most, cutoff=0.6)]
    return f"; did you mean {' or '.join(repr(c) for c in close[:most])}?" if close else ""


def choose(text: str, choices: Sequence[T], flag: str) -> T:
    """The choice equal to ``text`` (typed as the choices are, e.g. a Literal), or a one-line GleakError naming
    ``flag``, the choices and the closest one."""
    for choice in choices:
        if choice == text:
            return choice
    raise GleakError(f"{flag} must be one of {', '.join(choices)}, got {shorten(repr(text), 40)}"
                     f"{did_you_mean(text, choices)}")
