"""Attack base class, declared requirements, the one registry, and running an attack on a Context."""

from __future__ import annotations

import math
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gleak.attacks.options import AttackOptions, resolve_options
from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from gleak.attacks.context import Context


@dataclass(frozen=True)
class Requirements:
    """What an attack needs. Hard needs make it not applicable (with a reason); soft ones only warn."""

    kinds: frozenset[str] = frozenset({"gradient", "update"})
    gradient_view: bool = True  # needs ∇W as one step's gradient: a gradient, or a one-step SGD update
    needs_bias: bool = False
    needs_model: bool = False  # the global model's weights (e.g. to evaluate the last layer)
    needs_model_forward: bool = False
    needs_batch_forward: bool = False  # runs the model on the client's whole batch at once (gradient matching)
    needs_aux: bool = False
    single_sample: bool = False
    needs_batch_size: bool = True
    needs_nonneg_features: bool = False  # soft: the result is marked when the features go negative

    def describe(self) -> list[str]:
        out = []
        if self.kinds == frozenset({"update"}):
            out.append("update")
        elif self.gradient_view:
            out.append("gradient or 1-step update")
        else:
            out.append("gradient or update (any steps)")
        for flag, text in ((self.needs_bias, "bias"), (self.needs_model, "model"),
                           (self.needs_model_forward, "model forward"),
                           (self.needs_batch_forward, "forward of the whole batch"),
                           (self.needs_aux, "aux data"), (self.single_sample, "B = 1"),
                           (self.needs_batch_size, "known B"), (self.needs_nonneg_features, "features ≥ 0 (soft)")):
            if flag:
                out.append(text)
        return out


@dataclass
class LabelOutput:
    """What a label attack returns: per-class counts (summing to B, or m·B for updates), plus extras."""

    counts: torch.Tensor
    soft_label: torch.Tensor | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class ImageOutput:
    """What a reconstruction attack returns: images in pixel space [B, C, H, W] within [0, 1], plus extras.

    ``recovered`` holds per-example tensors an attack recovers on the way (the generative attacks' logits and
    features); ``images`` is None only when such an attack had no generator to turn them into images."""

    images: torch.Tensor | None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    recovered: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class AttackResult:
    """One attack on one capture: status ok / not_applicable / failed, output, time, reason, scores, and the
    options it ran with (JSON values; see :meth:`Attack.used_options`)."""

    attack: str
    status: str
    seconds: float = 0.0
    reason: str | None = None
    output: LabelOutput | ImageOutput | None = None
    warnings: list[str] = field(default_factory=list)
    scores: dict[str, float] | None = None
    options: dict[str, Any] | None = None
    confidence: dict[str, Any] | None = None  # label attacks: calibrated intervals (attacks.labels.confidence)

    @property
    def labels(self) -> LabelOutput:
        """The label output of a successful label attack (a TypeError for anything else: a caller's bug)."""
        if not isinstance(self.output, LabelOutput):
            raise TypeError(f"{self.attack} ({self.status}) has no label output")
        return self.output

    @property
    def images(self) -> ImageOutput:
        """The image output of a successful reconstruction (a TypeError for anything else: a caller's bug)."""
        if not isinstance(self.output, ImageOutput):
            raise TypeError(f"{self.attack} ({self.status}) has no image output")
        return self.output

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attack": self.attack, "status": self.status, "seconds": round(self.seconds, 6)}
        if self.reason:
            out["reason"] = self.reason
        if self.options is not None:
            out["options"] = self.options
        if isinstance(self.output, ImageOutput):
            out["images"] = list(self.output.images.shape) if self.output.images is not None else None
            out["diagnostics"] = jsonable(self.output.diagnostics)
        elif self.output is not None:
            out["counts"] = [int(c) for c in self.output.counts.tolist()]
            if self.output.soft_label is not None:
                out["soft_label"] = [float(v) for v in self.output.soft_label.tolist()]
            out["diagnostics"] = jsonable(self.output.diagnostics)
        out["warnings"] = self.warnings
        if self.scores is not None:
            out["scores"] = {k: round(v, 6) for k, v in self.scores.items()}
        if self.confidence is not None:
            out["confidence"] = self.confidence
        return out


def jsonable(value: Any) -> Any:
    """Plain JSON values: tensors as lists, floats to 9 significant digits (so that an error of 1e-13 stays
    1e-13, not 0), inf/NaN as null."""
    if isinstance(value, torch.Tensor):
        return jsonable(value.tolist())
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.9g}") if math.isfinite(value) else None
    return value


class Attack(ABC):
    """One attack from one paper. Subclasses set the class variables and implement :meth:`run`.

    ``Options`` is the attack's options model (frozen pydantic, see :mod:`gleak.attacks.options`; the default
    declares none); :attr:`options` holds the instance's values, defaults until :meth:`configure` sets them, and
    the attack reads its tuning from there."""

    name: ClassVar[str]
    task: ClassVar[str] = "labels"
    paper: ClassVar[str]
    summary: ClassVar[str]
    requires: ClassVar[Requirements] = Requirements()
    Options: ClassVar[type[AttackOptions]] = AttackOptions
    default: ClassVar[bool] = True  # runs when no attack is named; False: only on request (-a NAME)
    options: AttackOptions

    def __init__(self) -> None:
        self.options = self.Options()

    def configure(self, values: Mapping[str, Any] | None = None,
                  sources: Mapping[str, str] | None = None) -> AttackOptions:
        """Set the options from ``values`` (strings are converted; keys not given take their defaults) and return
        them. An unknown key or a bad value is a one-line GleakError; ``sources`` names the flag a key came from."""
        self.options = resolve_options(type(self), values or {}, sources)
        return self.options

    def used_options(self) -> AttackOptions:
        """The options this attack runs with (what reports record)."""
        return self.options

    def not_applicable(self, ctx: Context) -> str | None:
        """Why this attack cannot run on ``ctx`` (one line), or None. Extend for attack-specific checks."""
        return ctx.check_requirements(self.requires)

    @abstractmethod
    def run(self, ctx: Context) -> LabelOutput | ImageOutput:
        """Recover labels (or images). Raise GleakError for a problem with the input that stops the attack."""

    def generator(self, ctx: Context) -> torch.Generator:
        """A generator seeded from the run's seed and this attack's name: same seed, same report."""
        return torch.Generator().manual_seed((ctx.seed * 1_000_003 + zlib.crc32(self.name.encode())) % 2**63)


REGISTRY: dict[str, type[Attack]] = {}


def register(cls: type[Attack]) -> type[Attack]:
    if cls.name in REGISTRY:
        raise RuntimeError(f"attack {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def attack_class(name: str, task: str | None = None, where: str = "") -> type[Attack]:
    """The registered attack class ``name``; with ``task``, only attacks of that task count.

    An unknown name (or one of another task) is a GleakError listing the candidates, with a "did you mean"
    drawn only from them; ``where`` prefixes the message (e.g. ``"-O: "``)."""
    import difflib

    candidates = sorted(n for n, cls in REGISTRY.items() if task is None or cls.task == task)
    if name in candidates:
        return REGISTRY[name]
    listed = "Known attacks" if task is None else f"{_task_noun(task).capitalize()} attacks"
    other = REGISTRY.get(name)
    if other is not None and task is not None:
        what = f"'{name}' is a {_task_noun(other.task)} attack, not a {_task_noun(task)} attack."
    else:
        close = difflib.get_close_matches(name.lower(), candidates, n=3, cutoff=0.6)
        what = f"unknown attack {shorten(repr(name), 60)}" + (
            f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ".")
    raise GleakError(f"{where}{what} {listed}: {', '.join(candidates)}")


def get_attack(name: str, task: str | None = None) -> Attack:
    """A fresh instance of the attack called ``name`` (see :func:`attack_class`)."""
    return attack_class(name, task)()


def _task_noun(task: str) -> str:
    return {"labels": "label", "reconstruct": "reconstruction"}.get(task, task)


def attacks_for(task: str) -> list[Attack]:
    return [cls() for cls in REGISTRY.values() if cls.task == task]


def run_attack(attack: Attack, ctx: Context) -> AttackResult:
    """Check applicability, run with timing, attach soft-requirement warnings. Never raises: bad input is status
    ``failed``, an unexpected exception status ``error``, each with a one-line reason."""
    try:
        options = attack.used_options().model_dump(mode="json")
    except GleakError as e:
        return AttackResult(attack.name, "failed", reason=str(e))
    reason = attack.not_applicable(ctx)
    if reason:
        return AttackResult(attack.name, "not_applicable", reason=reason, options=options)
    warnings = list(ctx.soft_warnings(attack.requires))
    start = time.perf_counter()
    try:
        output = attack.run(ctx)
    except GleakError as e:
        return AttackResult(attack.name, "failed", time.perf_counter() - start, reason=str(e), warnings=warnings,
                            options=options)
    except Exception as e:  # a bug or an input nobody anticipated: recorded, and the run goes on
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        return AttackResult(attack.name, "error", time.perf_counter() - start,
                            reason=shorten(f"{type(e).__name__}: {first}" if first else type(e).__name__, 300),
                            warnings=warnings, options=options)
    seconds = time.perf_counter() - start
    return AttackResult(attack.name, "ok", seconds, output=output, warnings=warnings + output.warnings,
                        options=options)
