"""Per-attack options: each attack declares a small frozen pydantic model (its ``Options``), and the CLI's
``-O ATTACK.KEY=VALUE`` sets its fields (pydantic converts the strings and checks the ranges).

Only this module and the attacks import pydantic; the CLI imports this module inside command bodies, so that
``gleak --help`` and usage errors stay fast. Every problem is a :class:`~gleak.errors.GleakError` of one line."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from gleak.attacks.base import Attack


class AttackOptions(BaseModel):
    """Base of every attack's options: frozen, unknown keys refused, defaults validated, floats finite.

    Declare each option with a default and ``Field(description=...)``, the help line `gleak attacks` shows."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


def parse_option_assignments(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["rlu.mc_samples=500", "ig.lr=0.05"]`` -> ``{"rlu": {"mc_samples": "500"}, "ig": {"lr": "0.05"}}``.

    Keys may be written with dashes (``mc-samples``). The same key twice with different values is an error."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        head, eq, value = item.partition("=")
        attack, dot, key = head.partition(".")
        attack, key, value = attack.strip(), key.strip().replace("-", "_"), value.strip()
        if not eq or not dot or not attack or not key:
            raise GleakError(f"-O expects ATTACK.KEY=VALUE (e.g. -O rlu.mc_samples=500), got {shorten(repr(item), 60)}")
        given = out.setdefault(attack, {})
        if key in given and given[key] != value:
            raise GleakError(f"-O {attack}.{key} is given twice ({shorten(repr(given[key]), 30)} and "
                             f"{shorten(repr(value), 30)}); give it once")
        given[key] = value
    return out


def lookup_attack(name: str, task: str | None = None) -> type[Attack]:
    """The attack class named by ``-O`` (:func:`gleak.attacks.base.attack_class`, messages prefixed ``-O:``)."""
    from gleak.attacks.base import attack_class

    return attack_class(name, task, where="-O: ")


def resolve_options(attack_cls: type[Attack], given: Mapping[str, Any],
                    sources: Mapping[str, str] | None = None) -> AttackOptions:
    """``attack_cls.Options`` validated from ``given`` (strings are converted; keys not given keep their defaults).

    ``sources`` names where a key came from in messages (``{"lr": "--lr"}``); the default is ``-O ATTACK.KEY``.
    An unknown key lists the valid ones; a bad value gives pydantic's first message, shortened."""
    model = attack_cls.Options
    fields = list(model.model_fields)

    def where(key: str) -> str:
        return (sources or {}).get(key, f"-O {attack_cls.name}.{key}")

    for key in given:
        if key not in model.model_fields:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            valid = f"its options: {', '.join(fields)}" if fields else "it takes no options"
            raise GleakError(f"{where(key)}: {attack_cls.name} has no option {shorten(repr(key), 40)}{hint} ({valid})")
    try:
        return model.model_validate(dict(given))
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"] if not isinstance(p, int))
        key = loc.split(".")[0] if loc else ""
        message = first["msg"]
        label = where(key) if key else f"{attack_cls.name} options"
        shown = f", got {shorten(repr(first['input']), 40)}" if key and "input" in first else ""
        raise GleakError(f"{label}: {shorten(message, 200)}{shown}") from None


def resolve_assignments(assignments: Mapping[str, Mapping[str, str]],
                        task: str | None = None) -> dict[str, AttackOptions]:
    """Every attack named by ``-O`` checked (known, of ``task``) and its values validated, in one pass."""
    return {name: resolve_options(lookup_attack(name, task), values) for name, values in assignments.items()}


def describe_options(attack_cls: type[Attack]) -> list[dict[str, Any]]:
    """One entry per option of the attack: name, type, default (JSON; None means chosen automatically), the
    allowed range where there is one, and the help line."""
    out = []
    for name, info in attack_cls.Options.model_fields.items():
        entry: dict[str, Any] = {"name": name, "type": _type_name(info.annotation), "default": _jsonable(info.default),
                                 "help": info.description or ""}
        bounds = _bounds(info.metadata)
        if bounds:
            entry["range"] = bounds
        out.append(entry)
    return out


def format_default(value: Any) -> str:
    """A default as `gleak attacks` prints it: ``auto`` for None, ``true``/``false``, numbers with ``g``."""
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
