"""One exception type for every problem caused by the user's input (exit code 2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T", bound=str)


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


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'fail-on'?"`` for the choice closest to ``name``, or "" when none is close.

    Underscores and dashes count as the same character (``fail_on`` finds ``fail-on``), and so do upper and
    lower case; otherwise :func:`difflib.get_close_matches` decides."""
    import difflib

    options = list(dict.fromkeys(choices))

    def norm(text: str) -> str:
        return text.lower().replace("_", "-")

    exact = [c for c in options if norm(c) == norm(name) and c != name]
    if exact:
        return f"; did you mean '{exact[0]}'?"
    by_norm = {norm(c): c for c in options}
    close = difflib.get_close_matches(norm(name), list(by_norm), n=1, cutoff=0.6)
    return f"; did you mean '{by_norm[close[0]]}'?" if close else ""


def choose(text: str, choices: Sequence[T], flag: str) -> T:
    """The choice equal to ``text`` (typed as the choices are, e.g. a Literal), or a one-line GleakError naming
    ``flag``, the choices and the closest one."""
    for choice in choices:
        if choice == text:
            return choice
    raise GleakError(f"{flag} must be one of {', '.join(choices)}, got {shorten(repr(text), 40)}"
                     f"{did_you_mean(text, choices)}")
