"""Time bounds and progress for long work: a :class:`Deadline` (monotonic), its shares, and the checkpoints that
long loops call.

A run that must end in time makes a :class:`Deadline` (``Deadline.after(120, "audit", budget="quick")``), hands each
stage a :meth:`~Deadline.share` of what is left, and runs the stage under :func:`running`. Inside, the long loops
call :func:`checkpoint` (``checkpoint(f"position {i}/{n}")``) between chunks of work: past the deadline in force it
raises :class:`OutOfTime`, a :class:`~gleak.errors.GleakError` whose one line says what stopped, where, and at which
share of which budget; an attack run by :func:`gleak.attacks.base.run_attack` turns it into status ``failed``. Like
a cancel scope, the deadline in force is the innermost one :func:`running` set in this thread (a context variable,
never a cache): the maths functions take no deadline argument, and a checkpoint outside any scope does nothing.

The same checkpoints are the progress of long work: under :func:`reporting` each one sends a line
``dager: position 37/150, 12 s`` (the scope's name, where, the seconds since the scope began) to a sink, which the
command line throttles (:class:`Throttled`: a plain line at most every 30 s when stderr is not a terminal)."""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from gleak.errors import GleakError

Clock = Callable[[], float]
PROGRESS_EVERY = 30.0  # seconds between two plain progress lines (stderr not a terminal)


class OutOfTime(GleakError):
    """Work stopped at its time share: ``what`` stopped at ``where`` (one line, the share and budget named)."""

    def __init__(self, message: str, what: str = "", where: str = "") -> None:
        super().__init__(message)
        self.what, self.where = what, where


@dataclass(frozen=True, kw_only=True)
class Deadline:
    """A point in time (on ``clock``, :func:`time.monotonic` unless a test injects one) by which ``what`` must end;
    ``end`` None: unbounded. ``seconds`` is the size of this share when it was made and ``budget`` the budget it
    came from, both for the messages; ``share_of`` names the share a renamed view (:meth:`named`) runs under."""

    what: str
    end: float | None
    seconds: float | None = None
    budget: str | None = None
    share_of: str | None = None
    clock: Clock = field(default=time.monotonic, repr=False, compare=False)
    began: float = field(default=math.nan, compare=False)

    def __post_init__(self) -> None:
        if math.isnan(self.began):
            object.__setattr__(self, "began", self.clock())

    @classmethod
    def after(cls, seconds: float | None, what: str, *, budget: str | None = None, clock: Clock = time.monotonic
              ) -> Deadline:
        """``seconds`` from now (None: unbounded); a negative number is a caller's bug."""
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"a deadline needs seconds ≥ 0, got {seconds}")
        now = clock()
        return cls(what=what, end=None if seconds is None else now + seconds, seconds=seconds, budget=budget,
                   clock=clock, began=now)

    @classmethod
    def unbounded(cls, what: str = "", clock: Clock = time.monotonic) -> Deadline:
        """No bound: :meth:`check` never raises (progress still flows)."""
        return cls.after(None, what, clock=clock)

    @property
    def bounded(self) -> bool:
        return self.end is not None

    def elapsed(self) -> float:
        """Seconds since this deadline (or share, or view) was made."""
        return self.clock() - self.began

    def remaining(self) -> float:
        """Seconds left (≥ 0; infinite when unbounded)."""
        return math.inf if self.end is None else max(0.0, self.end - self.clock())

    def expired(self) -> bool:
        return self.end is not None and self.clock() >= self.end

    def share(self, what: str, *, fraction: float | None = None, seconds: float | None = None) -> Deadline:
        """A child deadline for ``what``: ``fraction`` (0 < f ≤ 1) of the time left now, or ``seconds``, or both
        (the smaller); never past this deadline's end. Neither: the rest of this one, under the new name."""
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"a share's fraction must be in (0, 1], got {fraction}")
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"a share needs seconds ≥ 0, got {seconds}")
        now = self.clock()
        left = math.inf if self.end is None else max(0.0, self.end - now)
        size = left
        if fraction is not None and self.end is not None:
            size = min(size, fraction * left)
        if seconds is not None:
            size = min(size, seconds)
        end = None if size == math.inf else min(now + size, math.inf if self.end is None else self.end)
        return replace(self, what=what, end=end, seconds=None if end is None else size, share_of=None, began=now)

    def named(self, what: str) -> Deadline:
        """The same end under another name (an attack running in a stage's share), its clock of elapsed time
        restarted: messages name ``what`` and the share it runs under."""
        return replace(self, what=what, share_of=self.share_of or self.what, began=self.clock())

    def share_text(self) -> str:
        """``its time share (45 s of budget quick)``, or ``the time share of tokens (…)`` for a named view."""
        size = f"{self.seconds:.0f} s" if self.seconds is not None else "no bound"
        of = f" of budget {self.budget}" if self.budget else ""
        whose = "its time share" if self.share_of in (None, self.what) else f"the time share of {self.share_of}"
        return f"{whose} ({size}{of})"

    def reason(self, where: str = "") -> str:
        """``dager stopped at its time share (45 s of budget quick) at position 37/150``."""
        return f"{self.what} stopped at {self.share_text()}" + (f" at {where}" if where else "")

    def check(self, where: str = "") -> None:
        """Raise :class:`OutOfTime` (one line, :meth:`reason`) when past the end; otherwise nothing."""
        if self.expired():
            raise OutOfTime(self.reason(where), self.what, where)


_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("gleak_deadline", default=None)
_PROGRESS: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("gleak_progress",
                                                                                          default=None)


def current() -> Deadline | None:
    """The deadline in force in this thread (the innermost :func:`running`), or None."""
    return _DEADLINE.get()


@contextlib.contextmanager
def running(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Make ``deadline`` the one in force for the block (None: the one outside stays)."""
    if deadline is None:
        yield current()
        return
    token = _DEADLINE.set(deadline)
    try:
        yield deadline
    finally:
        _DEADLINE.reset(token)


@contextlib.contextmanager
def reporting(sink: Callable[[str], None] | None) -> Iterator[None]:
    """Send every :func:`checkpoint`'s progress line in the block to ``sink`` (None: to nobody)."""
    token = _PROGRESS.set(sink)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def checkpoint(where: str) -> None:
    """A point in a long loop where work may stop: the progress line (``what: where, N s``) to the sink in force,
    then :class:`OutOfTime` when the deadline in force has passed. Cheap; nothing outside a scope."""
    deadline = _DEADLINE.get()
    sink = _PROGRESS.get()
    if sink is not None:
        sink(f"{deadline.what}: {where}, {deadline.elapsed():.0f} s" if deadline is not None and deadline.what
             else where)
    if deadline is not None:
        deadline.check(where)


class Forecast:
    """A loop of ``total`` like steps (an optimiser's) under the deadline in force when it is made: once ``after``
    steps are done, :meth:`check` stops it at once (:class:`OutOfTime`) when the steps left, at the pace so far,
    would not end before the deadline, instead of running into it (the time goes to the stages after it)."""

    def __init__(self, total: int, unit: str = "steps", after: int = 3) -> None:
        self.deadline = current()
        self.total, self.unit, self.after = total, unit, max(1, after)
        self.began = self.deadline.clock() if self.deadline is not None else 0.0

    def check(self, done: int) -> None:
        """After ``done`` steps: :class:`OutOfTime` when the rest would not fit (one line with the pace)."""
        d = self.deadline
        if d is None or d.end is None or done < self.after or done >= self.total:
            return
        spent = d.clock() - self.began
        each = spent / done
        if each * (self.total - done) > d.remaining():
            where = f"{done} of {self.total} {self.unit}"
            raise OutOfTime(f"{d.what} stopped after {where}: at {each:.3g} s each it would need about "
                            f"{each * self.total:.0f} s, more than {d.share_text()}", d.what, where)


class Throttled:
    """A progress sink that passes a line on to ``write`` at most every ``every`` seconds (the first once ``every``
    seconds have gone by since it was made), for logs that are not a terminal. ``clock``: injected in tests."""

    def __init__(self, write: Callable[[str], None], every: float = PROGRESS_EVERY, clock: Clock = time.monotonic
                 ) -> None:
        self.write, self.every, self.clock = write, every, clock
        self.last = clock()
        self.lines = 0

    def __call__(self, line: str) -> None:
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self.lines += 1
            self.write(line)
