"""How a setting is declared, read and explained.

A setting is a field of a pydantic model (:class:`~gleak.settings.audit.AuditSettings`) whose ``Annotated``
metadata carries a :class:`Cli`: its flags, help, ``GLEAK_*`` variable and config key. Everything else derives from
that one declaration: the command's Typer options (:mod:`gleak.cli.settings_options`), the config files' tables
(:mod:`gleak.settings.files`), ``--show-config``, the errors naming where a bad value came from (:class:`Source`),
and the docs' option tables (:func:`settings_table`, checked against the docs by a test).

Why not pydantic-settings: it merges its sources without recording which one gave each value (pydantic-settings
issue 756 asks for it; the debug log of PR 906 prints it but exposes nothing to read), and its validation errors do
not name the source either (PR 544, closed). gleak needs both, for ``--show-config`` and for errors that name the
flag, the variable or the file's key (issue 31). Click already reads each variable (and shows it in ``--help``), and
the config files need messages naming the file, the table and the key; what is left to merge is the few lines of
:func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from gleak.errors import GleakError, Origin, did_you_mean
from gleak.settings.values import Problem

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails  # the type of ValidationError.errors()' items (pydantic's own package)

S = TypeVar("S", bound=BaseModel)
Table = Literal["audit", "top"]


@dataclass(frozen=True)
class Cli:
    """How a setting appears outside Python: its flags (the first long one names it in errors), help, the
    ``GLEAK_*`` variable Click reads it from, and where config files hold it (``table``: the ``[audit]`` table, the
    top table, or None: the command line only, for the reason in ``not_in_files``). ``cli_type`` is what the
    command line parses when that is not the field's type (text for a list of formats); ``file_type`` is what a
    file holds when not the field's type (a table of thresholds); ``merge``: a file's value and the command line's
    are combined (name by name), not replaced."""

    flags: tuple[str, ...]
    help: str
    env: str | None = None
    metavar: str | None = None
    table: Table | None = "audit"
    key: str | None = None  # the config key, when not the field's name with dashes
    not_in_files: str = ""
    cli_type: object = None
    file_type: object = None
    merge: bool = False
    shown: Callable[[Any], object] | None = None  # how a value is written back (jobs 0 -> "auto"), when not as it is
    relative_to_file: bool = False  # paths in a config file are relative to the file

    @property
    def flag(self) -> str:
        """The flag errors name: the longest (``--fail-on``; ``--option`` for ``-O``)."""
        return max(self.flags, key=len)


def cli_of(field: FieldInfo) -> Cli:
    """The :class:`Cli` declaration among a field's metadata."""
    for item in field.metadata:
        if isinstance(item, Cli):
            return item
    raise TypeError("a setting needs a Cli(...) in its Annotated metadata")  # pragma: no cover - declarations


def declared(cls: type[BaseModel]) -> dict[str, tuple[FieldInfo, Cli]]:
    """Every setting of ``cls`` in declaration order: name -> (field, its Cli)."""
    return {name: (field, cli_of(field)) for name, field in cls.model_fields.items()}


def config_key(name: str, cli: Cli) -> str:
    """The key a config file writes: ``fail-on`` for ``fail_on``, unless declared otherwise."""
    return cli.key or name.replace("_", "-")


def annotation_of(field: FieldInfo) -> Any:
    """The field's type with its constraints and validators (what :class:`~pydantic.TypeAdapter` validates)."""
    rules = [m for m in field.metadata if not isinstance(m, Cli)]
    return Annotated[tuple([field.annotation, *rules])] if rules else field.annotation


# -------------------------------------------------------------------------------------------- where from
@dataclass(frozen=True)
class Source:
    """Where a setting's value came from: ``command line``, ``environment`` (the variable), ``config`` (the file's
    table and key), ``merged`` (a config table, then command-line items) or ``default``."""

    kind: Literal["command line", "environment", "config", "merged", "default"]
    flag: str
    env: str | None = None
    table: str | None = None  # ``pyproject.toml [tool.gleak.audit]``
    key: str | None = None  # ``fail-on``

    def __str__(self) -> str:
        if self.kind == "environment":
            return f"environment ({self.env})"
        if self.kind == "config":
            return f"config {self.table}"
        if self.kind == "merged":
            return "config file, then the command line"
        return self.kind

    def origin(self) -> Origin:
        """The :class:`~gleak.errors.Origin` an error about this value names."""
        if self.kind == "environment":
            return Origin(self.flag, env=self.env)
        if self.kind == "config" and self.table is not None:
            return Origin(self.flag, table=self.table, key=self.key)
        return Origin(self.flag)


@dataclass(frozen=True)
class Given:
    """A value the command line gave (typed on it, or read by Click from ``env``)."""

    value: object
    source: Literal["command line", "environment"]
    env: str | None = None


class FileLayer(Protocol):
    """A config file as :func:`resolve` reads it (:class:`gleak.settings.files.LoadedConfig`)."""

    def lookup(self, name: str, cli: Cli) -> tuple[Any, Source] | None: ...


@dataclass(frozen=True)
class Resolved(Generic[S]):
    """The settings of one run, and where each came from."""

    settings: S
    sources: Mapping[str, Source]

    def shown(self) -> dict[str, dict[str, Any]]:
        """``--show-config``: each setting that a file may hold, its value as a person writes it, and its source."""
        out: dict[str, dict[str, Any]] = {}
        for name, (_, cli) in declared(type(self.settings)).items():
            if cli.table is not None:
                out[name] = {"value": written(getattr(self.settings, name), cli), "from": str(self.sources[name])}
        return out


def written(value: Any, cli: Cli | None = None) -> Any:
    """A value as a person writes it: text for paths, ``table,json`` for formats, a table for thresholds."""
    if cli is not None and cli.shown is not None:
        return cli.shown(value)
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value) and value:
        return ",".join(value)
    if isinstance(value, tuple):
        return [str(v) for v in value]
    return value


def resolve(cls: type[S], given: Mapping[str, Given], file: FileLayer | None = None) -> Resolved[S]:
    """Flags > ``GLEAK_*`` variables > the config file > defaults, setting by setting; each value validated as the
    field declares, and a bad one is one :class:`~gleak.errors.GleakError` naming where it came from."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for name, (field, cli) in declared(cls).items():
        picked = _pick(name, cli, given.get(name), file)
        if picked is None:
            sources[name] = Source("default", cli.flag)
            continue
        raw, source = picked
        try:
            values[name] = TypeAdapter(annotation_of(field)).validate_python(raw)
        except ValidationError as e:  # a validator's Problem arrives wrapped, in the error's context
            raise GleakError(bad_value(e, raw, source.origin())) from None
        sources[name] = source
    return Resolved(cls.model_validate(values), sources)


def _pick(name: str, cli: Cli, given: Given | None, file: FileLayer | None) -> tuple[Any, Source] | None:
    """The value that wins and its source: the command line's (or Click's from the variable), else the file's."""
    from_file = file.lookup(name, cli) if file is not None and cli.table is not None else None
    if given is not None and given.value not in (None, [], ()):
        if cli.merge and from_file is not None and given.source == "command line":
            return [from_file[0], given.value], Source("merged", cli.flag)
        return given.value, Source(given.source, cli.flag, env=given.env)
    return from_file


# -------------------------------------------------------------------------------------------- errors in words
def bad_value(error: ValidationError, raw: object, origin: Origin) -> str:
    """One line for the first problem of a value from a flag, a variable or a file: ``--fail-on must be one of …,
    got 'hihg'; did you mean 'high'?``."""
    first = error.errors()[0]
    context = first.get("ctx") or {}
    cause = context.get("error")
    if isinstance(cause, Problem):
        if cause.says_value:
            return _quoting(origin, str(cause))
        return origin.bad(raw, cause.problem, cause.hint)
    if first["type"] == "literal_error":
        choices = literal_choices(first)
        return origin.bad(raw, f"must be one of {', '.join(choices)}", did_you_mean(str(raw), choices))
    return origin.bad(raw, plain_message(first))


def setting_error(error: ValidationError) -> str:
    """One line for a bad value given to a settings model in Python, naming the setting (``budget must be one of
    quick, standard, full, got 'fast'; did you mean 'full'?``)."""
    first = error.errors()[0]
    name = ".".join(str(p) for p in first["loc"]) or "settings"
    return bad_value(error, first.get("input"), Origin(name))


def _quoting(origin: Origin, words: str) -> str:
    """A problem whose words already quote the value: after the flag, the variable or the file's key."""
    if origin.table is not None:
        return f"{origin.table} key '{origin.key}': {words}"
    if origin.env is not None:
        return f"{origin.env}: {words}"
    return f"{origin.flag} {words}"


def literal_choices(err: ErrorDetails) -> list[str]:
    """The values a literal_error allowed (``'info', 'low' or 'none'`` in its context)."""
    import re

    return re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))


# what each pydantic error type means, in words
PLAIN = {
    "int_parsing": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number", "float_parsing": "must be a number", "float_type": "must be a number",
    "finite_number": "must be a finite number", "string_type": "must be a string (in quotes)",
    "list_type": "must be a list, e.g. [\"a\", \"b\"]", "dict_type": "must be a table",
    "model_type": "must be a table", "model_attributes_type": "must be a table", "bool_type": "must be true or false",
    "bool_parsing": "must be true or false", "string_too_short": "must not be empty",
    "string_too_long": "is too long", "extra_forbidden": "is not a setting",
}
SYMBOLS = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤", "less_than": "<"}


def plain_message(err: ErrorDetails) -> str:
    """A pydantic error in gleak's words: ``must be ≥ 1``, ``must be quick, standard or full``."""
    kind, ctx = err["type"], err.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, Problem):
        return cause.problem
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"must be {expected}" if expected else "is not one of the values allowed"
    if kind in SYMBOLS:
        return f"must be {SYMBOLS[kind]} {next(iter(ctx.values()), '?')}"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if kind in PLAIN:
        return PLAIN[kind]
    text = str(err["msg"])
    return text[:1].lower() + text[1:]


# -------------------------------------------------------------------------------------------- the docs' tables
def settings_table(*models: type[BaseModel], prefix: str = "tool.gleak") -> str:
    """The Markdown table of the settings of ``models`` that the docs show (a test keeps the docs equal to it)."""
    rows = ["| Flag | Variable | Config key | Default | What it sets |", "|---|---|---|---|---|"]
    for model in models:
        for name, (field, cli) in declared(model).items():
            flags = ", ".join(f"`{f}`" for f in sorted(cli.flags, key=len, reverse=True))
            env = f"`{cli.env}`" if cli.env else ""
            if cli.table is None:
                key = "command line only"
            else:
                key = f"`{config_key(name, cli)}` in `[{prefix}{'.audit' if cli.table == 'audit' else ''}]`"
            default = field.get_default(call_default_factory=True)
            empty = default is None or default is False or default in ((), {}) or isinstance(default, BaseModel)
            shown = "" if empty and cli.shown is None else f"`{written(default, cli)}`"
            rows.append(f"| {flags} | {env} | {key} | {shown} | {cli.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


__all__ = ["Cli", "FileLayer", "Given", "Resolved", "Source", "bad_value", "cli_of", "config_key", "declared",
           "plain_message", "resolve", "settings_table", "written"]
