"""One exception type for every problem caused by the user's input (exit code 2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

INTERRUPTED = 130  # the exit status after Ctrl-C (128 + SIGINT), as shells report it

T = TypeVar("T", bound=str)


TRUTH_CONTRADICTION = "--truth and --no-truth contradict each other; give one"
LABELS_TRUTH_OFF = "--labels truth uses the ground truth, which --no-truth turns off; drop one of them"


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


@dataclass(frozen=True)
class Origin:
    """Where a setting's value came from, as an error names it: the flag (``--fail-on``), the environment variable
    Click read it from (``env="GLEAK_FAIL_ON"``), or a config file's key (``table="pyproject.toml
    [tool.gleak.audit]"``, ``key="fail-on"``). A value from a variable or a file is shown with its name, so the
    line says what to fix and where."""

    flag: str
    env: str | None = None
    table: str | None = None
    key: str | None = None

    def subject(self, value: object) -> str:
        """``--fail-on``, ``GLEAK_FAIL_ON='hihg'`` or ``pyproject.toml [tool.gleak.audit] fail-on = 'hihg'``."""
        shown = shorten(repr(value), 60)
        if self.table is not None:
            return f"{self.table} {self.key} = {shown}"
        if self.env is not None:
            return f"{self.env}={shown}"
        return self.flag

    def bad(self, value: object, problem: str, hint: str = "") -> str:
        """One line for a bad value: ``--fail-on must be one of …, got 'hihg'; did you mean 'high'?``,
        ``GLEAK_FAIL_ON='hihg' must be one of …; did you mean 'high'?`` or ``pyproject.toml [tool.gleak.audit] key
        'fail-on': must be one of …, got 'hihg'; did you mean 'high'?`` (as :mod:`gleak.settings.files` words the
        problems it finds when it reads the file)."""
        shown = shorten(repr(value), 60)
        if self.table is not None:
            return f"{self.table} key '{self.key}': {problem}, got {shown}{hint}"
        if self.env is not None:
            return f"{self.env}={shown} {problem}{hint}"
        return f"{self.flag} {problem}, got {shown}{hint}"


def choose(text: str, choices: Sequence[T], flag: str | Origin) -> T:
    """The choice equal to ``text`` (typed as the choices are, e.g. a Literal), or a one-line GleakError naming
    ``flag`` (or where the value came from: an :class:`Origin`), the choices and the closest one."""
    for choice in choices:
        if choice == text:
            return choice
    origin = flag if isinstance(flag, Origin) else Origin(flag)
    raise GleakError(origin.bad(text, f"must be one of {', '.join(choices)}", did_you_mean(text, choices)))
