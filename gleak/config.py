"""Configuration files for gleak: ``[tool.gleak]`` / ``[tool.gleak.audit]`` in ``pyproject.toml``, or the same
tables without the ``tool.gleak`` prefix in ``gleak.toml`` (top level and ``[audit]``).

Precedence, highest first: command-line flags > ``GLEAK_*`` environment variables > the file > defaults. The
CLI asks Click where each flag's value came from (command line, environment or default) and takes the file's
value only for defaults. Values are validated by pydantic; a bad value names the file, the key and what it
expected.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gleak.errors import GleakError, shorten

FILES = ("gleak.toml", "pyproject.toml")


class AuditFileSettings(BaseModel):
    """Keys of ``[tool.gleak.audit]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget: Literal["quick", "standard", "full"] | None = None
    fail_on: Literal["info", "low", "medium", "high", "critical", "none"] | None = Field(None, alias="fail-on")
    format: str | None = None
    lpips: Literal["alex", "vgg", "off"] | None = None
    jobs: int | None = Field(None, ge=1, le=256)
    executor: Literal["local", "ray"] | None = None
    address: str | None = None
    model: list[str] | None = None
    aux: list[str] | None = None
    threshold: dict[str, float] | None = None
    option: dict[str, dict[str, str | int | float | bool]] | None = Field(None, alias="options")


class FileSettings(BaseModel):
    """Keys of ``[tool.gleak]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    device: str | None = None
    threads: int | None = Field(None, ge=1, le=1024)
    audit: AuditFileSettings = Field(default_factory=AuditFileSettings)


@dataclass
class LoadedConfig:
    """The settings from one file (or none), and where they came from."""

    path: Path | None = None
    table: str = ""
    settings: FileSettings = field(default_factory=FileSettings)

    def audit_value(self, key: str) -> Any:
        """A key of the audit table, falling back to the top table for seed/device/threads (None if unset)."""
        if key in ("seed", "device", "threads"):
            return getattr(self.settings, key)
        return getattr(self.settings.audit, key.replace("-", "_"))

    def where(self, key: str) -> str:
        section = f"{self.table}.audit" if key not in ("seed", "device", "threads") else self.table
        return f"{self.path} [{section}]" if section else f"{self.path}"


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
        raise GleakError(f"{path}: cannot read the config file ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise GleakError(f"{path}: not valid TOML ({e})") from None
    if path.name == "pyproject.toml" or "tool" in data:
        table = data.get("tool", {}).get("gleak") if isinstance(data.get("tool"), dict) else None
        if table is None:
            return LoadedConfig()
        prefix = "tool.gleak"
    else:
        table, prefix = data, ""
    if not isinstance(table, dict):
        raise GleakError(f"{path}: [{prefix or 'gleak'}] must be a table")
    try:
        settings = FileSettings.model_validate(table)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        section = ".".join(p for p in (prefix, "audit" if loc.startswith("audit.") else "") if p)
        key = loc.removeprefix("audit.")
        raise GleakError(f"{path}: [{section or 'top level'}] key '{key}': {shorten(err['msg'], 160)}"
                         + (f" (got {shorten(repr(err.get('input')), 60)})" if "input" in err else "")) from None
    return LoadedConfig(path, prefix, settings)
