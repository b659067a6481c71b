"""Config files: ``[tool.gleak]`` / ``[tool.gleak.audit]`` in ``pyproject.toml``, or the same tables without the
``tool.gleak`` prefix in ``gleak.toml`` (top level and ``[audit]``).

The tables and their keys are not written here: they follow the declarations (:mod:`gleak.settings.audit`), each
setting under the key and in the table its :class:`~gleak.settings.declare.Cli` names. Paths (``model``, ``aux``)
are relative to the file. ``trust-pickle`` cannot be set in a file, on purpose: loading a pickled model runs its
code, so trusting one stays a decision made on the command line, never one that a file in the audited repository
makes.

A file is read and validated whole before any work; a bad key or value is one plain sentence naming the file, the
table and the key (``gleak.toml [audit] key 'jobs': must be auto or a whole number from 1 to 256, got 0``), an
unknown key comes with a "did you mean" (or the table it belongs in).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from gleak.errors import GleakError, did_you_mean, shorten
from gleak.settings.audit import AuditSettings, GlobalSettings
from gleak.settings.declare import (
    Cli,
    Source,
    Table,
    annotation_of,
    config_key,
    declared,
    literal_choices,
    plain_message,
)
from gleak.settings.values import RETIRED_THRESHOLDS, THRESHOLD_BOUNDS, Problem, threshold_problem

FILES = ("gleak.toml", "pyproject.toml")
SECTIONS: tuple[type[BaseModel], ...] = (GlobalSettings, AuditSettings)  # whose settings files may hold


def _settings(table: Table) -> dict[str, tuple[Any, Cli]]:
    """name -> (field, Cli) of every setting a file holds in ``table``."""
    return {name: (f, cli) for model in SECTIONS for name, (f, cli) in declared(model).items() if cli.table == table}


def _table_model(name: str, table: Table, **extra: Any) -> type[BaseModel]:
    """The pydantic model of one table of a config file, built from the declarations: each key optional, typed
    as the file holds it."""
    fields: dict[str, Any] = {
        key: (Optional[cli.file_type or annotation_of(f)], Field(None, alias=config_key(key, cli)))  # noqa: UP045
        for key, (f, cli) in _settings(table).items()}
    return create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields, **extra)


def top_table() -> type[BaseModel]:
    """The model of a config file's top table (its ``audit`` table inside), built from the declarations when a
    file is read (not at import: ``gleak --help`` stays fast)."""
    audit = _table_model("AuditTable", "audit")
    return _table_model("TopTable", "top", audit=(audit, Field(default_factory=audit)))


# keys that a file may not hold -> why (trust-pickle: a file must never decide to run a pickle's code)
NOT_IN_FILES = {config_key(name, cli): cli.not_in_files for model in SECTIONS
                for name, (_, cli) in declared(model).items() if cli.table is None and cli.not_in_files}


@dataclass(kw_only=True)
class LoadedConfig:
    """The settings from one file (or none), and where they came from."""

    path: Path | None = None
    table: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)  # the file's [tool.gleak] table as written
    checked: BaseModel | None = None  # the same, validated

    def lookup(self, name: str, cli: Cli) -> tuple[Any, Source] | None:
        """Setting ``name``'s value in this file and its source, or None when the file does not set it. A key whose
        file form differs from the setting's (a table of thresholds) comes as the file holds it, checked; paths
        are made relative to the file."""
        if self.path is None or cli.table is None:
            return None
        audit = cli.table == "audit"
        raw = (self.data.get("audit") or {} if audit else self.data).get(config_key(name, cli))
        if raw is None:
            return None
        if cli.file_type is not None and self.checked is not None:
            raw = getattr(self.checked.audit if audit else self.checked, name)  # type: ignore[attr-defined]
        if cli.relative_to_file:
            raw = [p if Path(p).is_absolute() else self.path.parent / p for p in raw]
        where = _at(_shown(self.path), _table(self.table, ["audit"] if audit else []))
        return raw, Source("config", cli.flag, table=where, key=config_key(name, cli))

    def value(self, name: str) -> Any:
        """Setting ``name`` as this file sets it (None when it does not)."""
        for model in SECTIONS:
            if name in model.model_fields:
                found = self.lookup(name, declared(model)[name][1])
                return None if found is None else found[0]
        raise KeyError(name)


def find_config(explicit: Path | None = None, start: Path | None = None) -> LoadedConfig:
    """The config to use: ``explicit`` (--config), else gleak.toml, else pyproject.toml with a ``[tool.gleak]``
    table, in the working directory; an empty config when there is none."""
    if explicit is not None:
        if not explicit.is_file():
            raise GleakError(f"--config {explicit}: no such file")
        return load_config(explicit)
    folder = start or Path.cwd()
    for name in FILES:
        path = folder / name
        if path.is_file():
            loaded = load_config(path)
            if loaded.path is not None:
                return loaded
    return LoadedConfig()


def load_config(path: Path) -> LoadedConfig:
    """Read and validate one file; pyproject.toml without ``[tool.gleak]`` gives an empty config."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise GleakError(f"{_shown(path)}: cannot read the config file ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise GleakError(f"{_shown(path)}: not valid TOML ({e})") from None
    if path.name == "pyproject.toml" or "tool" in data:
        table = data.get("tool", {}).get("gleak") if isinstance(data.get("tool"), dict) else None
        if table is None:
            return LoadedConfig()
        prefix = "tool.gleak"
    else:
        table, prefix = data, ""
    if not isinstance(table, dict):
        raise GleakError(f"{_shown(path)}: [{prefix or 'gleak'}] must be a table")
    try:
        checked = top_table().model_validate(table)
    except ValidationError as e:
        raise GleakError(config_error(_shown(path), prefix, e)) from None
    _check_thresholds(checked.audit.thresholds or {}, _at(_shown(path), _table(prefix, ("audit", "threshold"))))  # type: ignore[attr-defined]
    return LoadedConfig(path=path, table=prefix, data=table, checked=checked)


def _check_thresholds(thresholds: Mapping[str, float], where: str) -> None:
    """Every name of the file's threshold table known (retired ones explained) and every value in its range."""
    for name, value in thresholds.items():
        if name in RETIRED_THRESHOLDS:
            raise GleakError(f"{where}: {RETIRED_THRESHOLDS[name]}")
        if name not in THRESHOLD_BOUNDS:
            raise GleakError(f"{where}: unknown threshold '{shorten(name, 40)}'{did_you_mean(name, THRESHOLD_BOUNDS)}"
                             f" (thresholds: {', '.join(THRESHOLD_BOUNDS)})")
        problem = threshold_problem(name, value)
        if problem:
            raise GleakError(f"{where} key '{name}': {problem}")


def _shown(path: Path) -> str:
    """The config file as messages name it: relative to the working directory when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (OSError, ValueError):
        return shorten(str(path), 160)


def _table(prefix: str, parts: Sequence[str | int]) -> str:
    """The TOML table a key lives in: ``tool.gleak.audit``, ``audit``, ``tool.gleak``, or "" (gleak.toml's top)."""
    return ".".join(str(p) for p in (prefix, *parts) if p != "")


def _at(file: str, table: str) -> str:
    """``gleak.toml [audit]``, or ``gleak.toml (top level)``."""
    return f"{file} [{table}]" if table else f"{file} (top level)"


def _keys(table: Table) -> list[str]:
    """The keys a table takes, as written in the file (``fail-on``, not ``fail_on``)."""
    return [config_key(name, cli) for name, (_, cli) in _settings(table).items()]


def config_error(file: str, prefix: str, error: ValidationError) -> str:
    """One plain sentence for the first problem pydantic found in a config file (and how many more there are):
    ``gleak.toml [audit]: unknown key 'fail_on'; did you mean 'fail-on'? (keys: …)``,
    ``gleak.toml [audit] key 'jobs': must be auto or a whole number from 1 to 256, got 0``."""
    errors = error.errors()
    first = errors[0]
    loc = list(first["loc"])
    # a value of the options table fails once per member of its union type: one problem per key
    problems = len({tuple(e["loc"][:4]) if e["loc"][1:2] == ("options",) else tuple(e["loc"]) for e in errors})
    more = f" (and {problems - 1} more problem{'s' if problems > 2 else ''})" if problems > 1 else ""
    # the table the failing key belongs to, and the key's path below it
    table: Table = "top"
    parts: list[str | int] = []
    if len(loc) > 1 and loc[0] == "audit":
        table, parts, loc = "audit", ["audit"], loc[1:]
    if first["type"] == "extra_forbidden":
        return _unknown_key(file, prefix, table, parts, loc, more)
    key_path = [str(p) for p in loc]
    # a value of the options table fails once per member of its union type: name the value, not the members
    if key_path[:1] == ["options"] and len(key_path) > 3:
        key_path = key_path[:3]
        message = "must be a string, a number or true/false"
    else:
        message = plain_message(first)
    key = key_path[-1] if key_path else "?"
    where = _at(file, _table(prefix, [*parts, *key_path[:-1]]))
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, Problem) and cause.says_value:
        return f"{where} key '{shorten(key, 40)}': {cause}{more}"
    got = f", got {shorten(repr(first['input']), 60)}" if "input" in first and (
        first["type"] != "value_error" or isinstance(cause, Problem)) else ""
    if isinstance(cause, Problem):
        got += cause.hint
    elif first["type"] == "literal_error" and isinstance(first.get("input"), str):  # fail-on = "hihg": 'high'?
        got += did_you_mean(first["input"], literal_choices(first))
    return f"{where} key '{shorten(key, 40)}': {message}{got}{more}"


def _unknown_key(file: str, prefix: str, table: Table, parts: list[str | int], loc: list[str | int], more: str) -> str:
    """An unknown key: the key it was meant to be, or the table it belongs in, or why a file may not set it."""
    key = str(loc[-1])
    where = _at(file, _table(prefix, [*parts, *loc[:-1]]))
    if key.replace("_", "-") in NOT_IN_FILES:
        return f"{where}: '{shorten(key, 40)}' cannot be set in a config file: {NOT_IN_FILES[key.replace('_', '-')]}" \
               f"{more}"
    elsewhere = ""
    if table == "top" and key in _keys("audit"):
        elsewhere = f"; it belongs in [{_table(prefix, ['audit'])}]"
    elif table == "audit" and key in _keys("top"):
        elsewhere = f"; it belongs in [{_table(prefix, [])}]" if prefix else "; it belongs at the top level"
    keys = _keys(table) + (["audit"] if table == "top" else [])
    hint = elsewhere or did_you_mean(key, keys)
    return f"{where}: unknown key '{shorten(key, 40)}'{hint} (keys: {', '.join(keys)}){more}"
