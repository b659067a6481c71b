"""Overrides that act in the calling thread only, for vetting untrusted files inside someone else's process.

gleak is also a library: a Flower or Ray server, or any program that imports ``gleak.runs``, may load a model in one
thread while its other threads unpickle, call ``torch.load``, log and warn as usual. A safety check that swapped
``pickle.loads`` or the loggers for the whole process would refuse or swallow their calls too. So:

* :func:`overridden` replaces an attribute (``pickle.loads``, ``torch.load``, …) by a dispatcher while any thread is
  inside it. The dispatcher calls the override only for the threads that asked for it, and the original for every
  other thread; the original is put back when the last such thread leaves (unless someone replaced the attribute in
  the meantime, in which case theirs is kept).
* :func:`warnings_dropped` drops the Python warnings that the calling thread raises (torch's deprecation notices while
  it loads a file), where :func:`warnings.catch_warnings` would change the filters of every thread.
* :func:`logs_captured` collects the log records that the calling thread emits on the ``torch`` loggers, and keeps them
  off those loggers' handlers (stderr); records of other threads pass as before.

Torch offers no per-call hook for what its loaders unpickle or evaluate, hence the dispatchers
(:mod:`gleak.models.export_archive` lists each one and why it is needed)."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Override = tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]  # owner, attribute, make(original)

_local = threading.local()  # .overrides: {(id(owner), name): replacement} of this thread; .records: list or None
_lock = threading.Lock()


@dataclass
class _Installed:
    owner: Any
    name: str
    original: Callable[..., Any]
    dispatcher: Callable[..., Any]
    users: int = 0


_installed: dict[tuple[int, str], _Installed] = {}


def _dispatcher(key: tuple[int, str], original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        replacement = getattr(_local, "overrides", {}).get(key)
        return original(*args, **kwargs) if replacement is None else replacement(*args, **kwargs)

    dispatch.__name__ = getattr(original, "__name__", "dispatch")
    dispatch.__qualname__ = getattr(original, "__qualname__", dispatch.__name__)
    dispatch.__doc__ = getattr(original, "__doc__", None)
    dispatch.__wrapped__ = original  # type: ignore[attr-defined]
    return dispatch


@contextmanager
def overridden(overrides: Sequence[Override]) -> Iterator[None]:
    """Inside, ``owner.name`` calls ``make(original)`` in this thread, and ``original`` in every other thread."""
    mine: dict[tuple[int, str], Callable[..., Any]] = {}
    taken: list[tuple[int, str]] = []
    try:
        with _lock:
            for owner, name, make in overrides:
                key = (id(owner), name)
                entry = _installed.get(key)
                if entry is None:
                    original = getattr(owner, name)
                    entry = _installed[key] = _Installed(owner, name, original, _dispatcher(key, original))
                    setattr(owner, name, entry.dispatcher)
                entry.users += 1
                taken.append(key)
                mine[key] = make(entry.original)
        before = getattr(_local, "overrides", {})
        _local.overrides = {**before, **mine}
        try:
            yield
        finally:
            _local.overrides = before
    finally:
        with _lock:
            for key in taken:
                entry = _installed[key]
                entry.users -= 1
                if entry.users == 0:
                    del _installed[key]
                    if getattr(entry.owner, entry.name) is entry.dispatcher:
                        setattr(entry.owner, entry.name, entry.original)


class _ThreadLogs(logging.Filter):
    """A filter on the torch loggers' handlers: a record emitted by a capturing thread is kept in that thread's list
    and not handled; any other record passes."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: dict[int, list[logging.LogRecord]] = {}
        self.handlers: list[logging.Handler] = []
        self.users = 0

    def filter(self, record: logging.LogRecord) -> bool:
        records = self.lists.get(record.thread or 0)
        if records is None:
            return True
        if not any(r is record for r in records[-4:]):  # one record can reach several handlers
            records.append(record)
        return False


_logs = _ThreadLogs()


def _torch_handlers(prefix: str) -> list[logging.Handler]:
    loggers = [logging.getLogger(prefix)] + [
        lg for name, lg in list(logging.root.manager.loggerDict.items())
        if name.startswith(prefix + ".") and isinstance(lg, logging.Logger) and lg.handlers]
    seen: dict[int, logging.Handler] = {}
    for lg in loggers:
        for handler in lg.handlers:
            seen.setdefault(id(handler), handler)
    return list(seen.values())


@contextmanager
def logs_captured(records: list[logging.LogRecord], prefix: str = "torch") -> Iterator[None]:
    """Collect into ``records`` what this thread logs on the ``prefix`` loggers' own handlers, instead of printing
    it. Loggers that propagate to the host's root logger are left alone: the host decides what it shows."""
    me = threading.get_ident()
    with _lock:
        if _logs.users == 0:
            _logs.handlers = _torch_handlers(prefix)
            for handler in _logs.handlers:
                handler.addFilter(_logs)
        _logs.users += 1
        _logs.lists[me] = records
    try:
        yield
    finally:
        with _lock:
            _logs.lists.pop(me, None)
            _logs.users -= 1
            if _logs.users == 0:
                for handler in _logs.handlers:
                    handler.removeFilter(_logs)
                _logs.handlers = []


def _dropped(original: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args, **kwargs: None


def warnings_dropped() -> Override:
    """The override for :func:`overridden` that drops this thread's warnings instead of printing them."""
    return (warnings, "showwarning", _dropped)
