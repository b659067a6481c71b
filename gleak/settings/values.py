"""The values gleak's settings take, and the parsers that read them as people write them.

The vocabularies (budgets, severities, gates, formats, LPIPS networks) and the severity :class:`Thresholds` are
shared by the settings, the runs and the reports (:mod:`gleak.report.model` re-exports them). Each parser takes what
a flag, a ``GLEAK_*`` variable or a config file holds (text, a list, a table) and returns the typed value, or raises
:class:`Problem`: what is wrong in words, and a "did you mean" where one fits. Where the value came from is added by
whoever reads it (:mod:`gleak.settings.declare`), never here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gleak.errors import GleakError, did_you_mean, shorten

Severity = Literal["info", "low", "medium", "high", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "low", "medium", "high", "critical")
FailOn = Severity | Literal["none"]  # the gate: the lowest severity that fails, or none
FAIL_ON: tuple[FailOn, ...] = (*SEVERITIES, "none")
if TYPE_CHECKING:
    FailOnChoice = FailOn
else:  # one Literal of every choice, so that a bad value is one error naming them all (not one per member)
    FailOnChoice = Literal[FAIL_ON]
Budget = Literal["quick", "standard", "full"]
BUDGETS: tuple[Budget, ...] = ("quick", "standard", "full")
ExecutorName = Literal["local", "ray"]
EXECUTORS: tuple[ExecutorName, ...] = ("local", "ray")
FORMATS = ("table", "json", "html", "sarif", "md", "junit")
FAIL_ROUNDS_PATTERN = r"^(any|all|last:[1-9][0-9]{0,8})$"
"""The gate over a run's rounds: ``any`` round (a finding in any capture), ``last:K`` (only the K highest-numbered
rounds, and captures without a round), ``all`` (a finding in every round)."""
FAIL_ROUNDS_EXPECTED = ("any (a finding in any round fails), last:K (only the K latest rounds, e.g. last:3) or all "
                        "(a finding in every round)")
MAX_SEED = 2**63 - 1
MAX_JOBS = 256
MAX_THREADS = 1024


class LpipsNetwork(StrEnum):
    """The LPIPS network of the image scores (a str, so it compares and serialises as its name)."""

    alex = "alex"
    vgg = "vgg"
    off = "off"


LpipsName = Literal["alex", "vgg", "off"]
LPIPS_NETWORKS: tuple[str, ...] = tuple(n.value for n in LpipsNetwork)

T = TypeVar("T")


class Problem(ValueError):
    """What is wrong with a value, in words (``must be one of quick, standard, full``), and a hint (``; did you mean
    'quick'?``); the reader adds the value and where it came from."""

    def __init__(self, problem: str, hint: str = "", *, says_value: bool = False) -> None:
        super().__init__(problem + hint)
        self.problem = problem
        self.hint = hint
        self.says_value = says_value  # the words already quote the value (a --threshold item): not repeated


def one_of(value: object, choices: Sequence[T]) -> T:
    """The choice equal to ``value``, else a :class:`Problem` naming the choices and the closest one."""
    for choice in choices:
        if choice == value:
            return choice
    names = [str(c) for c in choices]
    raise Problem(f"must be one of {', '.join(names)}", did_you_mean(str(value), names))


def normal_fail_rounds(value: object) -> str | None:
    """``any``, ``all`` or ``last:K`` (K ≥ 1) as written in reports, or None when ``value`` is none of them."""
    text = str(value).strip().lower().replace(" ", "")
    if text in ("any", "all"):
        return text
    head, _, k = text.partition(":")
    if head == "last" and k.isdigit() and 1 <= int(k) <= 10**9 - 1:
        return f"last:{int(k)}"
    return None


def fail_rounds(value: object) -> str:
    """``any``, ``all`` or ``last:K``, normalised (``LAST: 3`` -> ``last:3``)."""
    normal = normal_fail_rounds(value)
    if normal is None:
        raise Problem(f"must be {FAIL_ROUNDS_EXPECTED}")
    return normal


def formats(value: object) -> tuple[str, ...]:
    """``table,json`` (or a list of names) -> ``("table", "json")``, each once, in the order given."""
    if isinstance(value, str):
        names = [n.strip().lower() for n in value.split(",") if n.strip()]
    elif isinstance(value, Iterable):
        names = [str(n).strip().lower() for n in value]
    else:
        raise Problem(f"must be a comma-separated list of {', '.join(FORMATS)}")
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        raise Problem(f"must be a comma-separated list of {', '.join(FORMATS)}",
                      did_you_mean(bad[0], FORMATS) if len(bad) == 1 else "")
    return tuple(dict.fromkeys(names))


def jobs(value: object) -> int:
    """``auto`` (0, as the library writes it, or nothing) or a whole number of workers from 1 to :data:`MAX_JOBS`."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_JOBS:
        return value
    text = str(value).strip().lower()
    if text == "auto":
        return 0
    if not text.isdigit() or not 1 <= int(text) <= MAX_JOBS:
        raise Problem(f"must be auto or a whole number from 1 to {MAX_JOBS}")
    return int(text)


def auto_none(value: object) -> object:
    """``"auto"`` (any case) is the default: no value."""
    return None if isinstance(value, str) and value.strip().lower() == "auto" else value


def shown_jobs(value: int) -> str | int:
    """How a jobs value is written: ``auto`` for 0."""
    return "auto" if value == 0 else value


def device(value: object) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    text = str(value)
    if text in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d{1,4}", text):
        return text
    raise Problem("must be auto, cpu, cuda or cuda:N", did_you_mean(text, ("auto", "cpu", "cuda")))


def listed(value: object) -> object:
    """One item where a list is expected means a list of one (``model = "m.safetensors"``)."""
    return [value] if isinstance(value, str) else value


def paths(value: object) -> tuple[Path, ...]:
    """One path or a list of them (``model = "m.safetensors"`` means a list of one)."""
    if value is None:
        return ()
    if isinstance(value, (str, Path)):
        return (Path(value),)
    if not isinstance(value, Iterable):
        raise Problem("must be a path or a list of paths")
    return tuple(Path(p) for p in value)


def attack_options(value: object) -> dict[str, dict[str, str]]:
    """``-O`` assignments by attack: ``["rlu.mc_samples=500"]`` or a config file's table ``{rlu = {mc_samples =
    500}}`` -> ``{"rlu": {"mc_samples": "500"}}`` (values as text, which each attack's options then validate)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(a): {str(k): str(v) for k, v in values.items()} for a, values in value.items()}
    if not isinstance(value, Iterable) or isinstance(value, str):
        raise Problem("must be ATTACK.KEY=VALUE items or a table of attacks")
    from gleak.registry import parse_assignments  # here: its typed options' models cost start-up time

    return parse_assignments([str(v) for v in value], "-O", "ATTACK", "rlu.mc_samples=500")


def arch_kwargs_text(value: object) -> str:
    """A config file's ``arch-kwargs`` (an inline table, or a string holding a JSON object) -> the JSON text
    ``--arch-kwargs`` takes."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise Problem("must be a table or a JSON object in a string, e.g. {activation = \"sigmoid\"} or "
                          "'{\"activation\": \"sigmoid\"}'") from None
    if not isinstance(value, dict):
        raise Problem("must be a table of architecture arguments, e.g. {activation = \"sigmoid\"}")
    try:
        return json.dumps(value, default=_toml_json)
    except (TypeError, ValueError, RecursionError) as e:
        raise Problem(f"must hold JSON values only ({e})") from None


def _toml_json(value: object) -> object:
    """TOML dates and times in arch-kwargs become their ISO text (JSON has no such type)."""
    isoformat = getattr(value, "isoformat", None)
    if isoformat is None:
        raise TypeError(f"{type(value).__name__} is not a JSON value")
    return isoformat()


# ------------------------------------------------------------------------------------------------ thresholds
class Thresholds(BaseModel):
    """Where each severity starts. Defaults and their sources are documented in docs/audit.md ("Findings and
    thresholds"). Label thresholds are rates in [0, 1]; image thresholds are identification over chance, κ in
    [0, 1]."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built when first used: --help stays fast

    labels_critical: float = Field(1.0, ge=0, le=1, description="best iAcc: every label recovered exactly")
    labels_high: float = Field(0.9, ge=0, le=1, description="best iAcc")
    labels_medium_margin: float = Field(0.2, ge=0, le=1, description="best iAcc minus the chance iAcc")
    labels_low_margin: float = Field(0.05, ge=0, le=1, description="best iAcc minus the chance iAcc")
    image_critical: float = Field(0.9, ge=0, le=1, description="identification over chance κ = (rate − chance) / "
                                  "(1 − chance) of the reconstructions' lineups")
    image_high: float = Field(0.6, ge=0, le=1, description="identification over chance κ")
    image_medium: float = Field(0.3, ge=0, le=1, description="identification over chance κ")
    image_low: float = Field(0.1, ge=0, le=1, description="identification over chance κ (and the rate's interval "
                             "above chance)")


def _unit(name: str) -> str:
    """What threshold ``name`` measures, for its range errors."""
    if name.startswith("labels_"):
        return "iAcc above chance" if name.endswith("_margin") else "an iAcc"
    return "identification over chance, κ"


def _bounds(name: str) -> tuple[float, float | None]:
    low: float = 0.0
    high: float | None = None
    for rule in Thresholds.model_fields[name].metadata:
        low = float(getattr(rule, "ge", low))
        high = float(rule.le) if getattr(rule, "le", None) is not None else high
    return low, high


# name -> (lowest, highest or None, what the value is): read from the fields of Thresholds
THRESHOLD_BOUNDS: dict[str, tuple[float, float | None, str]] = {
    name: (*_bounds(name), _unit(name)) for name in Thresholds.model_fields}
# thresholds of earlier releases -> why they are gone (image findings are judged by identification, not PSNR)
RETIRED_THRESHOLDS = {name: f"'{name}' was retired: image findings are judged by identification over chance "
                            f"(κ in [0, 1]), set '{new}' instead (docs/audit.md)"
                      for name, new in (("image_critical_psnr", "image_critical"), ("image_high_psnr", "image_high"),
                                        ("image_medium_margin", "image_medium"),
                                        ("image_low_margin", "image_low"))}


def threshold_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be the threshold ``name`` (outside :data:`THRESHOLD_BOUNDS`, not finite), or None."""
    low, high, what = THRESHOLD_BOUNDS[name]
    if not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if value < low or (high is not None and value > high):
        span = f"between {low:g} and {high:g}" if high is not None else f"≥ {low:g}"
        return f"must be {span} ({what}), got {value:g}"
    return None


def threshold_item(item: str) -> tuple[str, float]:
    """``labels_high=0.95`` (``--threshold``) -> ``("labels_high", 0.95)``, the name and the value checked."""
    name, sep, text = item.partition("=")
    name = name.strip()
    if name in RETIRED_THRESHOLDS:
        raise Problem(RETIRED_THRESHOLDS[name], says_value=True)
    if not sep or name not in THRESHOLD_BOUNDS:
        raise Problem(f"takes NAME=VALUE with NAME one of {', '.join(THRESHOLD_BOUNDS)}; got "
                      f"{shorten(repr(item), 60)}{did_you_mean(name, THRESHOLD_BOUNDS) if name else ''}",
                      says_value=True)
    try:
        value = float(text)
    except ValueError:
        raise Problem(f"{name}: {shorten(repr(text), 40)} is not a number", says_value=True) from None
    problem = threshold_problem(name, value)
    if problem:
        raise Problem(f"{name} {problem}", says_value=True)
    return name, value


def parse_thresholds(items: Sequence[str]) -> Thresholds:
    """``["labels_high=0.95", …]`` (``--threshold``, repeatable) -> Thresholds, every name and value checked: an
    unknown name (with a "did you mean"), a value that is not a number, or one outside its range
    (:data:`THRESHOLD_BOUNDS`) is a GleakError naming the option."""
    try:
        return thresholds(list(items))
    except Problem as e:
        raise GleakError(f"--threshold {e}") from None


def thresholds(value: object) -> Thresholds:
    """Thresholds from a config file's table (checked when the file is read), ``--threshold NAME=VALUE`` items, or
    a list of both in precedence order (the file's, then the command line's, which win name by name)."""
    if isinstance(value, Thresholds):
        return value
    values: dict[str, float] = {}
    for part in _flat(value):
        if isinstance(part, Mapping):
            values.update({str(k): float(v) for k, v in part.items()})
        else:
            name, number = threshold_item(str(part))
            values[name] = number
    return Thresholds(**values)


def _flat(value: object) -> list[object]:
    """A value and the lists within it, as one list (tables and text items kept whole)."""
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flat(part)]
    return [] if value is None else [value]
