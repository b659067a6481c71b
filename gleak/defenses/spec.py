"""Defense specs as users write them: ``NAME[:KEY=VALUE,...]``, e.g. ``clip:norm=4`` or
``topk:ratio=0.999,scope=global``; a list value joins its items with ``+`` (``tensors=fc.weight+fc.bias``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gleak.defenses.base import DEFENSES, Defense
from gleak.registry import resolve_options, split_name_options

SYNTAX = "NAME[:KEY=VALUE,...] (e.g. clip:norm=4 or gaussian:sigma=0.01)"


def split_spec(text: str, flag: str = "--defense") -> tuple[str, dict[str, str]]:
    """``"clip:norm=4"`` -> ``("clip", {"norm": "4"})``; malformed text is one line naming the syntax."""
    return split_name_options(text, flag, SYNTAX)


def build_defense(cls_or_name: str | type[Defense], given: Mapping[str, Any], flag: str = "--defense",
                  sources: Mapping[str, str] | None = None) -> Defense:
    """The defense (a class, or a name looked up: an unknown one lists the defenses) configured with ``given``
    options, validated (an unknown key lists the options, a bad value says which and why; one line each).
    ``sources`` names where each key came from (default: ``FLAG NAME:KEY``)."""
    cls = DEFENSES.lookup(cls_or_name, where=f"{flag}: ") if isinstance(cls_or_name, str) else cls_or_name
    where = sources if sources is not None else {k: f"{flag} {cls.name}:{k}" for k in given}
    return cls(resolve_options(cls, given, sources=where, flag=flag))  # type: ignore[arg-type]


def parse_defense(text: str, flag: str = "--defense") -> Defense:
    """The configured defense of a spec; an unknown name lists the defenses, an unknown key the options, a bad
    value says which and why (one line each)."""
    name, given = split_spec(text, flag)
    return build_defense(name, given, flag)
