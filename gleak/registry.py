"""Named plug-ins with typed options, written once: the attack registry uses it, and so will the defenses.

A :class:`Registry` maps names to classes that declare a ``name``, a group (an attack's ``task``) and an
``Options`` model (:class:`TypedOptions`: frozen pydantic, unknown keys refused). Lookups of unknown names are a
one-line :class:`~gleak.errors.GleakError` with a "did you mean" drawn only from the candidates of the group
asked for; ``-O NAME.KEY=VALUE`` assignments are parsed and validated against a class's ``Options`` here.

Only this module (and the plug-ins' own modules) import pydantic; the CLI imports it inside command bodies, so
that ``gleak --help`` and usage errors stay fast."""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gleak.errors import GleakError, did_you_mean, shorten


class TypedOptions(BaseModel):
    """Base of every plug-in's options: frozen, unknown keys refused, defaults validated, floats finite.

    Declare each option with a default and ``Field(description=...)``, the help line listings show."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


class Configurable:
    """Base of every registered class: its name and its options model (none by default)."""

    name: ClassVar[str]
    Options: ClassVar[type[TypedOptions]] = TypedOptions


P = TypeVar("P", bound=Configurable)


class Registry(Generic[P]):
    """Classes by name, grouped by the class attribute ``group_attr`` (``task`` for attacks).

    ``noun`` names a member in messages ("attack"); ``group_nouns`` names a group's members ("labels" ->
    "label"). Iterating and indexing work like a read-only mapping of name -> class."""

    def __init__(self, noun: str, group_attr: str, group_nouns: Mapping[str, str] | None = None) -> None:
        self.noun = noun
        self.group_attr = group_attr
        self.group_nouns = dict(group_nouns or {})
        self._classes: dict[str, type[P]] = {}

    def register(self, cls: type[P]) -> type[P]:
        """Class decorator: add ``cls`` under ``cls.name`` (a name registered twice is a bug)."""
        if cls.name in self._classes:
            raise RuntimeError(f"{self.noun} {cls.name!r} registered twice")
        self._classes[cls.name] = cls
        return cls

    def group_of(self, cls: type[P]) -> str:
        return str(getattr(cls, self.group_attr))

    def in_group(self, group: str | None) -> list[type[P]]:
        """The classes of ``group`` (all with None), in registration order."""
        return [c for c in self._classes.values() if group is None or self.group_of(c) == group]

    def lookup(self, name: str, group: str | None = None, *, where: str = "") -> type[P]:
        """The class registered as ``name``; with ``group``, only classes of that group count.

        An unknown name (or one of another group) is a GleakError listing the candidates, with a "did you mean"
        drawn only from them; ``where`` prefixes the message (e.g. ``"-O: "``)."""
        candidates = sorted(c.name for c in self.in_group(group))
        if name in candidates:
            return self._classes[name]
        listed = f"Known {self.noun}s" if group is None else f"{self._group_noun(group).capitalize()} {self.noun}s"
        other = self._classes.get(name)
        if other is not None and group is not None:
            what = (f"'{name}' is a {self._group_noun(self.group_of(other))} {self.noun}, not a "
                    f"{self._group_noun(group)} {self.noun}.")
        else:
            what = f"unknown {self.noun} {shorten(repr(name), 60)}" + (did_you_mean(name, candidates, most=3) or ".")
        raise GleakError(f"{where}{what} {listed}: {', '.join(candidates)}")

    def _group_noun(self, group: str) -> str:
        return self.group_nouns.get(group, group)

    def __getitem__(self, name: str) -> type[P]:
        return self._classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def items(self) -> list[tuple[str, type[P]]]:
        return list(self._classes.items())

    def values(self) -> list[type[P]]:
        return list(self._classes.values())

    def get(self, name: str) -> type[P] | None:
        return self._classes.get(name)


# ------------------------------------------------------------------------------------------- typed options
def parse_assignments(items: Sequence[str], flag: str = "-O", owner_word: str = "NAME",
                      example: str = "rlu.mc_samples=500") -> dict[str, dict[str, str]]:
    """``["rlu.mc_samples=500", "ig.lr=0.05"]`` -> ``{"rlu": {"mc_samples": "500"}, "ig": {"lr": "0.05"}}``.

    Keys may be written with dashes (``mc-samples``). The same key twice with different values is an error."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        head, eq, value = item.partition("=")
        owner, dot, key = head.partition(".")
        owner, key, value = owner.strip(), key.strip().replace("-", "_"), value.strip()
        if not eq or not dot or not owner or not key:
            raise GleakError(f"{flag} expects {owner_word}.KEY=VALUE (e.g. {flag} {example}), "
                             f"got {shorten(repr(item), 60)}")
        given = out.setdefault(owner, {})
        if key in given and given[key] != value:
            raise GleakError(f"{flag} {owner}.{key} is given twice ({shorten(repr(given[key]), 30)} and "
                             f"{shorten(repr(value), 30)}); give it once")
        given[key] = value
    return out


def split_name_options(text: str, flag: str, syntax: str) -> tuple[str, dict[str, str]]:
    """``"NAME:KEY=VALUE,..."`` -> ``("NAME", {"KEY": "VALUE", ...})`` (dashes in keys read as underscores);
    malformed text is one line naming ``syntax``."""
    name, _, rest = str(text).partition(":")
    name = name.strip()
    if not name:
        raise GleakError(f"{flag} {shorten(repr(text), 60)}: expected {syntax}")
    given: dict[str, str] = {}
    for item in rest.split(",") if rest.strip() else []:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key or not value.strip():
            raise GleakError(f"{flag} {shorten(repr(text), 60)}: expected {syntax}; {shorten(repr(item), 40)} is not "
                             "KEY=VALUE")
        if key in given:
            raise GleakError(f"{flag} {name}: {key} is given twice; give it once")
        given[key] = value.strip()
    return name, given


def resolve_options(owner: type[Configurable], given: Mapping[str, Any],
                    sources: Mapping[str, str] | None = None, flag: str = "-O") -> TypedOptions:
    """``owner.Options`` validated from ``given`` (strings are converted; keys not given keep their defaults).

    ``sources`` names where a key came from in messages (``{"lr": "--lr"}``); the default is ``-O NAME.KEY``.
    An unknown key lists the valid ones; a bad value gives pydantic's first message, shortened."""
    model = owner.Options
    fields = list(model.model_fields)

    def where(key: str) -> str:
        return (sources or {}).get(key, f"{flag} {owner.name}.{key}")

    for key in given:
        if key not in model.model_fields:
            hint = did_you_mean(key, fields)
            valid = f"its options: {', '.join(fields)}" if fields else "it takes no options"
            raise GleakError(f"{where(key)}: {owner.name} has no option {shorten(repr(key), 40)}{hint} ({valid})")
    try:
        return model.model_validate(dict(given))
    except ValidationError as e:
        loc, msg, got = first_error(e, indices=False)
        key = loc.split(".")[0] if loc else ""
        label = where(key) if key else f"{flag} {owner.name}"  # a check across options (e.g. two that conflict)
        raise GleakError(f"{label}: {msg.removeprefix('Value error, ')}{got if key else ''}") from None


def first_error(e: ValidationError, *, indices: bool = True, limit: int = 200) -> tuple[str, str, str]:
    """The first of a pydantic error's messages, for one line: (its location, dotted — list indices left out unless
    ``indices``; its message, shortened to ``limit``; ``", got INPUT"`` shortened, or "" when it has no input)."""
    first = e.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"] if indices or not isinstance(p, int))
    got = f", got {shorten(repr(first['input']), 40)}" if "input" in first else ""
    return loc, shorten(first["msg"], limit), got


def describe_options(owner: type[Configurable]) -> list[dict[str, Any]]:
    """One entry per option: name, type, default (JSON; None means chosen automatically), the allowed range
    where there is one, and the help line."""
    out = []
    for name, info in owner.Options.model_fields.items():
        entry: dict[str, Any] = {"name": name, "type": _type_name(info.annotation), "default": _jsonable(info.default),
                                 "help": info.description or ""}
        bounds = _bounds(info.metadata)
        if bounds:
            entry["range"] = bounds
        out.append(entry)
    return out


def format_default(value: Any) -> str:
    """A default as listings print it: ``auto`` for None, ``true``/``false``, numbers with ``g``."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _type_name(annotation: Any) -> str:
    if annotation is None:
        return "none"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and len(args) < len(typing.get_args(annotation)):  # X | None: None means "automatic"
        return " | ".join(_type_name(a) for a in args)
    return getattr(annotation, "__name__", str(annotation))


def _bounds(metadata: list[Any]) -> str:
    parts = []
    for item in metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} {format_default(value)}")
    return ", ".join(parts)


def _jsonable(value: Any) -> Any:
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def check_flag_conflicts(flags: Mapping[str, Any], assignments: Mapping[str, Mapping[str, str]],
                         owners: Sequence[str] | None = None) -> None:
    """A dedicated flag (``--lr``) and ``-O NAME.lr`` may not both set an option: a GleakError naming both.
    ``owners`` limits the check to the plug-ins the flags belong to (all by default)."""
    for name, values in assignments.items():
        if owners is not None and name not in owners:
            continue
        for key in values:
            if key in flags:
                raise GleakError(f"--{key} and -O {name}.{key} set the same option; give one")
