"""Configuration files for gleak: ``[tool.gleak]`` / ``[tool.gleak.audit]`` in ``pyproject.toml``, or the same
tables without the ``tool.gleak`` prefix in ``gleak.toml`` (top level and ``[audit]``).

Keys of the top table: ``seed``, ``device``, ``threads``. Keys of the audit table: ``budget``, ``fail-on``,
``fail-rounds``, ``format``, ``lpips``, ``jobs``, ``executor``, ``address``, ``model`` and ``aux`` (lists of paths,
relative to the file), ``arch`` (the architecture of weight files: a zoo name, ``torchvision:NAME`` or
``package.module:factory``) and ``arch-kwargs`` (its arguments: an inline table such as ``{activation =
"sigmoid"}``, or a JSON object in a string), the ``threshold`` table (severity thresholds, see
:data:`THRESHOLD_BOUNDS`) and the ``options`` table (``rlu = {mc_samples = 500}``, as ``-O rlu.mc_samples=500``).

``trust-pickle`` cannot be set in a file, on purpose: loading a pickled model runs its code, so trusting one stays
a decision made on the command line (``--trust-pickle``), never one that a file in the audited repository makes.

Precedence, highest first: command-line flags > ``GLEAK_*`` environment variables > the file > defaults. The
CLI asks Click where each flag's value came from (command line, environment or default) and takes the file's
value only for defaults. Values are validated here; a bad one is one plain sentence naming the file, the table
and the key ("gleak.toml [audit] key 'jobs': must be ≥ 1, got 0"), an unknown key comes with a "did you mean".
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gleak.errors import GleakError, Origin, did_you_mean, shorten

if TYPE_CHECKING:
    from gleak.report.model import Thresholds

FILES = ("gleak.toml", "pyproject.toml")
TOP_KEYS = ("seed", "device", "threads")  # keys of the top table that `audit_value` falls back to
NOT_IN_FILES = {"trust-pickle": "trusting a pickle (which runs code when loaded) is decided on the command line "
                                "only: pass --trust-pickle"}

# name -> (lowest, highest or None, what the value is): the range every severity threshold must lie in
THRESHOLD_BOUNDS: dict[str, tuple[float, float | None, str]] = {
    "labels_critical": (0.0, 1.0, "an iAcc"),
    "labels_high": (0.0, 1.0, "an iAcc"),
    "labels_medium_margin": (0.0, 1.0, "iAcc above chance"),
    "labels_low_margin": (0.0, 1.0, "iAcc above chance"),
    "image_critical": (0.0, 1.0, "identification over chance, κ"),
    "image_high": (0.0, 1.0, "identification over chance, κ"),
    "image_medium": (0.0, 1.0, "identification over chance, κ"),
    "image_low": (0.0, 1.0, "identification over chance, κ"),
}
# thresholds of earlier releases -> why they are gone (image findings are judged by identification, not PSNR)
RETIRED_THRESHOLDS = {name: f"'{name}' was retired: image findings are judged by identification over chance "
                            f"(κ in [0, 1]), set '{new}' instead (docs/audit.md)"
                      for name, new in (("image_critical_psnr", "image_critical"), ("image_high_psnr", "image_high"),
                                        ("image_medium_margin", "image_medium"),
                                        ("image_low_margin", "image_low"))}


class AuditFileSettings(BaseModel):
    """Keys of ``[tool.gleak.audit]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: Literal["quick", "standard", "full"] | None = None
    fail_on: Literal["info", "low", "medium", "high", "critical", "none"] | None = Field(None, alias="fail-on")
    fail_rounds: str | None = Field(None, alias="fail-rounds")
    format: str | None = None
    lpips: Literal["alex", "vgg", "off"] | None = None
    jobs: int | None = Field(None, ge=1, le=256, description='workers; "auto" is the default (unset)')
    executor: Literal["local", "ray"] | None = None
    address: str | None = None
    model: list[str] | None = None
    aux: list[str] | None = None
    arch: str | None = Field(None, min_length=1, max_length=1000)
    arch_kwargs: str | None = Field(None, alias="arch-kwargs", description="a JSON object (read from an inline "
                                    "table or a JSON string), as --arch-kwargs takes it")
    threshold: dict[str, float] | None = None
    option: dict[str, dict[str, str | int | float | bool]] | None = Field(None, alias="options")
    max_epsilon: float | None = Field(None, alias="max-epsilon", gt=0, allow_inf_nan=False,
                                      description="the privacy budget (--max-epsilon)")

    @field_validator("fail_rounds")
    @classmethod
    def _fail_rounds(cls, value: str | None) -> str | None:
        """any, all or last:K (gleak.report.model.normal_fail_rounds)."""
        from gleak.report.model import FAIL_ROUNDS_EXPECTED, normal_fail_rounds

        if value is None:
            return None
        normal = normal_fail_rounds(value)
        if normal is None:
            raise ValueError(f"must be {FAIL_ROUNDS_EXPECTED}, got {shorten(repr(value), 40)}")
        return normal

    @field_validator("jobs", mode="before")
    @classmethod
    def _auto_jobs(cls, value: Any) -> Any:
        """``jobs = "auto"`` is the default: left unset."""
        return None if isinstance(value, str) and value.strip().lower() == "auto" else value

    @field_validator("model", "aux", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        """``model = "m.safetensors"`` means ``model = ["m.safetensors"]``."""
        return [value] if isinstance(value, str) else value

    @field_validator("arch_kwargs", mode="before")
    @classmethod
    def _arch_kwargs_as_json(cls, value: Any) -> Any:
        """An inline table, or a string holding a JSON object -> the JSON text (what ``--arch-kwargs`` takes)."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                raise ValueError("must be a table or a JSON object in a string, e.g. {activation = \"sigmoid\"} "
                                 f"or '{{\"activation\": \"sigmoid\"}}'; got {shorten(repr(value), 60)}") from None
        if not isinstance(value, dict):
            raise ValueError("must be a table of architecture arguments, e.g. {activation = \"sigmoid\"}; got "
                             f"{shorten(repr(value), 60)}")
        try:
            return json.dumps(value, default=_toml_json)
        except (TypeError, ValueError, RecursionError) as e:
            raise ValueError(f"must hold JSON values only ({e})") from None


def _toml_json(value: Any) -> Any:
    """TOML dates and times in arch-kwargs become their ISO text (JSON has no such type)."""
    isoformat = getattr(value, "isoformat", None)
    if isoformat is None:
        raise TypeError(f"{type(value).__name__} is not a JSON value")
    return isoformat()


class FileSettings(BaseModel):
    """Keys of ``[tool.gleak]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    device: str | None = None

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        """auto, cpu, cuda or cuda:N, as --device takes it."""
        import re

        if value is None or value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d{1,4}", value):
            return value
        hint = did_you_mean(value, ("auto", "cpu", "cuda"))
        raise ValueError(f"must be auto, cpu, cuda or cuda:N, got {shorten(repr(value), 40)}{hint}")
    threads: int | None = Field(None, ge=1, le=1024)
    audit: AuditFileSettings = Field(default_factory=AuditFileSettings)


@dataclass
class LoadedConfig:
    """The settings from one file (or none), and where they came from."""

    path: Path | None = None
    table: str = ""
    settings: FileSettings = field(default_factory=FileSettings)

    def audit_value(self, key: str) -> Any:
        """A key of the audit table (``fail-on`` or ``fail_on``), falling back to the top table for seed, device
        and threads (None if unset). ``arch-kwargs`` comes back as JSON text, as ``--arch-kwargs`` takes it."""
        if key in TOP_KEYS:
            return getattr(self.settings, key)
        return getattr(self.settings.audit, key.replace("-", "_"))

    def where(self, key: str) -> str:
        section = f"{self.table}.audit" if key not in TOP_KEYS else self.table
        if key not in TOP_KEYS and not self.table:
            section = "audit"
        return f"{self.path} [{section}]" if section else f"{self.path}"

    def origin(self, key: str, flag: str) -> Origin:
        """Where ``key`` (``fail_on``, ``option``) is set in this file, for an error about its value:
        ``pyproject.toml [tool.gleak.audit]`` and ``fail-on`` (the file as :func:`config_error` names it)."""
        parts = [] if key in TOP_KEYS else ["audit"]
        name = "options" if key == "option" else key.replace("_", "-")
        return Origin(flag, table=_at(_shown(self.path) if self.path else "?", _table(self.table, parts)), key=name)


def find_config(explicit: Path | None = None, start: Path | None = None) -> LoadedConfig:
    """The config to use: ``explicit`` (--config), else gleak.toml, else pyproject.toml with a
    ``[tool.gleak]`` table, in the working directory; an empty config when there is none."""
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
        settings = FileSettings.model_validate(table)
    except ValidationError as e:
        raise GleakError(config_error(_shown(path), prefix, e, table)) from None
    thresholds = settings.audit.threshold or {}
    for name, value in thresholds.items():
        where = _at(_shown(path), _table(prefix, ("audit", "threshold")))
        if name in RETIRED_THRESHOLDS:
            raise GleakError(f"{where}: {RETIRED_THRESHOLDS[name]}")
        if name not in THRESHOLD_BOUNDS:
            raise GleakError(f"{where}: unknown threshold '{shorten(name, 40)}'{did_you_mean(name, THRESHOLD_BOUNDS)}"
                             f" (thresholds: {', '.join(THRESHOLD_BOUNDS)})")
        problem = threshold_problem(name, value)
        if problem:
            raise GleakError(f"{where} key '{name}': {problem}")
    return LoadedConfig(path, prefix, settings)


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


def _keys(model: type[BaseModel]) -> list[str]:
    """The keys a table takes, as written in the file (``fail-on``, not ``fail_on``)."""
    return [f.alias or name for name, f in model.model_fields.items()]


# what each pydantic error type means, in words; {e} is the error's ctx (expected values, bounds)
_PLAIN = {
    "int_parsing": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number", "float_parsing": "must be a number", "float_type": "must be a number",
    "finite_number": "must be a finite number", "string_type": "must be a string (in quotes)",
    "list_type": "must be a list, e.g. [\"a\", \"b\"]", "dict_type": "must be a table",
    "model_type": "must be a table", "model_attributes_type": "must be a table", "bool_type": "must be true or false",
    "bool_parsing": "must be true or false", "string_too_short": "must not be empty",
    "string_too_long": "is too long",
}


def config_error(file: str, prefix: str, error: ValidationError, data: Mapping[str, Any] | None = None) -> str:
    """One plain sentence for the first problem pydantic found in a config file (and how many more there are):
    ``gleak.toml [audit]: unknown key 'fail_on'; did you mean 'fail-on'? (keys: …)``,
    ``gleak.toml [audit] key 'jobs': must be ≥ 1, got 0``."""
    errors = error.errors()
    first = errors[0]
    loc = list(first["loc"])
    # a value of the options table fails once per member of its union type: one problem per key
    problems = len({tuple(e["loc"][:4]) if e["loc"][1:2] == ("options",) else tuple(e["loc"]) for e in errors})
    more = f" (and {problems - 1} more problem{'s' if problems > 2 else ''})" if problems > 1 else ""
    # the model (table) the failing key belongs to, and the key's path below it
    model: type[BaseModel] = FileSettings
    parts: list[str | int] = []
    if len(loc) > 1 and loc[0] == "audit":
        model, parts, loc = AuditFileSettings, ["audit"], loc[1:]
    if first["type"] == "extra_forbidden":
        key = str(loc[-1])
        table = _table(prefix, [*parts, *loc[:-1]])
        if key.replace("_", "-") in NOT_IN_FILES:
            reason = NOT_IN_FILES[key.replace("_", "-")]
            return f"{_at(file, table)}: '{shorten(key, 40)}' cannot be set in a config file: {reason}{more}"
        elsewhere = ""
        if model is FileSettings and key in _keys(AuditFileSettings):
            elsewhere = f"; it belongs in [{_table(prefix, ['audit'])}]"
        elif model is AuditFileSettings and key in TOP_KEYS:
            elsewhere = f"; it belongs in [{_table(prefix, [])}]" if prefix else "; it belongs at the top level"
        hint = elsewhere or did_you_mean(key, _keys(model))
        return (f"{_at(file, table)}: unknown key '{shorten(key, 40)}'{hint} (keys: {', '.join(_keys(model))})"
                f"{more}")
    key_path = [str(p) for p in loc]
    # a value of the options table fails once per member of its union type: name the value, not the members
    if key_path[:1] == ["options"] and len(key_path) > 3:
        key_path = key_path[:3]
        message = "must be a string, a number or true/false"
    else:
        message = _plain_message(first)
    key = key_path[-1] if key_path else "?"
    table = _table(prefix, [*parts, *key_path[:-1]])
    got = f", got {shorten(repr(first['input']), 60)}" if "input" in first and first["type"] != "value_error" else ""
    if first["type"] == "literal_error" and isinstance(first.get("input"), str):  # fail-on = "hihg": 'high'?
        got += did_you_mean(first["input"], _literal_choices(first))
    return f"{_at(file, table)} key '{shorten(key, 40)}': {message}{got}{more}"


def _literal_choices(err: Any) -> list[str]:
    """The values a literal_error allowed (``'info', 'low' or 'none'`` in its context), for a "did you mean"."""
    import re

    return re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))


def _plain_message(err: Any) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"must be {expected}" if expected else "is not one of the values allowed"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        symbol = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "?")
        return f"must be {symbol} {bound}"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if kind in _PLAIN:
        return _PLAIN[kind]
    text = str(err["msg"])
    return text[:1].lower() + text[1:]


def threshold_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be the threshold ``name`` (outside :data:`THRESHOLD_BOUNDS`, not finite), or None."""
    low, high, what = THRESHOLD_BOUNDS[name]
    if not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if value < low or (high is not None and value > high):
        span = f"between {_g(low)} and {_g(high)}" if high is not None else f"≥ {_g(low)}"
        return f"must be {span} ({what}), got {_g(value)}"
    return None


def _g(x: float) -> str:
    return f"{x:g}"


def parse_thresholds(items: Sequence[str]) -> Thresholds:
    """``["labels_high=0.95", …]`` (``--threshold``, repeatable) -> Thresholds, every name and value checked:
    an unknown name (with a "did you mean"), a value that is not a number, or one outside its range
    (:data:`THRESHOLD_BOUNDS`: iAcc thresholds and margins, and identification over chance, in [0, 1]) is a
    GleakError naming the option."""
    from gleak.report.model import Thresholds

    values: dict[str, float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if name in RETIRED_THRESHOLDS:
            raise GleakError(f"--threshold {RETIRED_THRESHOLDS[name]}")
        if not sep or name not in THRESHOLD_BOUNDS:
            raise GleakError(f"--threshold takes NAME=VALUE with NAME one of {', '.join(THRESHOLD_BOUNDS)}; "
                             f"got {shorten(repr(item), 60)}{did_you_mean(name, THRESHOLD_BOUNDS) if name else ''}")
        try:
            value = float(text)
        except ValueError:
            raise GleakError(f"--threshold {name}: {shorten(repr(text), 40)} is not a number") from None
        problem = threshold_problem(name, value)
        if problem:
            raise GleakError(f"--threshold {name} {problem}")
        values[name] = value
    return Thresholds(**values)
