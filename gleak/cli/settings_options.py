"""Typer options built from the settings' declarations (:mod:`gleak.settings`), so that a flag, its help, its
``GLEAK_*`` variable and its range are written once, where the setting is declared.

- :func:`option` turns one shared declaration (``Seed``, ``Device``, …) into a Typer option type.
- :func:`with_settings` gives a command one option per setting of a settings model, and hands the command what the
  command line set (:class:`~gleak.settings.Given`: the value, and whether Click read it from the flag or the
  variable) for :func:`gleak.settings.resolve` to merge with the config file.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Optional, TypeVar, cast

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gleak.errors import shorten
from gleak.settings.declare import Cli, Given, cli_of, declared, written

F = TypeVar("F", bound=Callable[..., Any])


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[Any, Any, Any], Any]:
    """A Typer callback that accepts a finite number within [low, high] (open ends as asked), or None.

    Click's own ranges let NaN through (every comparison with NaN is false), so every numeric option of gleak
    is checked here instead: one line, naming the option and the range."""

    def check(ctx: Any, param: Any, value: Any) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        lo = "" if low is None else ("> " if low_open else "≥ ") + _bound(low)
        hi = "" if high is None else ("< " if high_open else "≤ ") + _bound(high)
        expected = " and ".join(x for x in (lo, hi) if x) or "finite"
        bad = not math.isfinite(value) or (
            low is not None and (value < low or (low_open and value == low))) or (
            high is not None and (value > high or (high_open and value == high)))
        if bad:
            raise typer.BadParameter(f"must be a finite number {expected}, got {shorten(str(value), 40)}")
        return value

    return check


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(field: FieldInfo) -> Callable[[Any, Any, Any], Any] | None:
    """The range check of a numeric setting, from its declared bounds (None when it declares none)."""
    low = high = None
    low_open = high_open = False
    for rule in field.metadata:
        if isinstance(rule, (Ge, Gt)):
            low, low_open = float(cast(float, rule.ge if isinstance(rule, Ge) else rule.gt)), isinstance(rule, Gt)
        elif isinstance(rule, (Le, Lt)):
            high, high_open = float(cast(float, rule.le if isinstance(rule, Le) else rule.lt)), isinstance(rule, Lt)
    if low is None and high is None:
        return None
    return number(low, high, low_open=low_open, high_open=high_open)


def _typer_option(field: FieldInfo, cli: Cli) -> Any:
    """``Annotated[type, typer.Option(...)]`` for one setting."""
    kind = cli.cli_type or field.annotation
    numeric = kind in (int, float, Optional[int], Optional[float])  # noqa: UP045 - compared with the annotation
    info = typer.Option(*cli.flags, envvar=cli.env, metavar=cli.metavar, help=cli.help,
                        callback=_range(field) if numeric else None)
    return Annotated[kind, info]


def _default(field: FieldInfo, cli: Cli) -> Any:
    """The default the command line shows, as a person writes it (None for the settings with no single value)."""
    if field.default_factory is not None:  # a table (thresholds, options): no one value to show; not built here
        return None
    default = field.get_default()
    if field.annotation is bool:
        return bool(default)
    if default in (None, (), {}) or isinstance(default, BaseModel):
        return None
    return written(default, cli)


def option(declaration: Any) -> Any:
    """The Typer option type of a shared declaration (``SeedOpt = option(Seed)``); the command writes the
    default (``seed: SeedOpt = 0``)."""
    field = FieldInfo.from_annotation(declaration)
    return _typer_option(field, cli_of(field))


def with_settings(*models: type[BaseModel], first: tuple[str, ...] = ("ctx",)) -> Callable[[F], F]:
    """Replace the command's keyword-only ``given`` parameter by one option per setting of ``models``, after the
    parameters named in ``first`` and before the command's other ones (the order ``--help`` lists them in); the
    command is called with ``given``: what the command line set (flag or variable), by setting. The options'
    defaults are the declared ones, shown in ``--help``; a value that Click took from its default is not given, so
    a config file can set it."""

    def decorate(fn: F) -> F:
        settings = {name: item for model in models for name, item in declared(model).items()}
        signature = inspect.signature(fn, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "given"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=_typer_option(field, cli),
                                   default=_default(field, cli))
                 for name, (field, cli) in settings.items()]
        head = [p for p in own if p.name in first]
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.name not in first]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            ctx = kwargs.get("ctx") or next(a for a in args if isinstance(a, typer.Context))
            given: dict[str, Given] = {}
            for name, (_, cli) in settings.items():
                value = kwargs.pop(name)
                source = ctx.get_parameter_source(name)
                kind = None if source is None else str(source.name)
                if isinstance(value, Enum):
                    value = value.value
                if kind == "COMMANDLINE":
                    given[name] = Given(value, "command line")
                elif kind == "ENVIRONMENT":
                    given[name] = Given(value, "environment", env=cli.env)
            return fn(*args, given=given, **kwargs)

        parameters = [*head, *added, *rest]
        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters if p.annotation is not p.empty}
        del command.__wrapped__  # Typer reads the signature above, not the function's own
        return cast(F, command)

    return decorate
