"""A bounded least-recently-used store: the one mechanism behind gleak's caches (calibrations, model hashes, model
checks), each owned by whoever runs the work, never module-level state."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """At most ``max_entries`` values by key; storing one more drops the least recently used (a get counts as a
    use)."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"a {type(self).__name__} keeps at least 1 entry, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value stored under ``key`` (now the most recently used), or None."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        """Store ``value`` under ``key``, dropping the least recently used entries past ``max_entries``."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
