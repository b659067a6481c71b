"""The attack base class, what attacks return, their run inputs, and running one attack on a Context."""

from __future__ import annotations

import math
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gleak.attacks.options import AttackOptions
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError, shorten
from gleak.registry import Configurable, resolve_options
from gleak.report.model import Status
from gleak.timebox import Deadline, OutOfTime, current, running

if TYPE_CHECKING:
    from gleak.attacks.context import Context
    from gleak.generator.file import GeneratorFile


@dataclass(kw_only=True, frozen=True)
class RunInputs:
    """What the caller hands one run of an attack, beside the :class:`~gleak.attacks.context.Context`: never
    options (those are typed and set by :meth:`Attack.configure`), and unused by attacks that do not need them.

    ``targets`` [B, C] are the training targets as the client's loss saw them (from recovered labels, the truth or
    a labels report); ``feature`` [d] is the single example's last-layer input (feature, fcn); ``progress`` is
    called as the optimiser goes (restart, step, steps, loss); ``generator`` is a loaded image generator file
    (:class:`gleak.generator.file.GeneratorFile`, for fgla and rgla)."""

    targets: torch.Tensor | None = None
    feature: torch.Tensor | None = None
    progress: Callable[[int, int, int, float], None] | None = None
    generator: GeneratorFile | None = None
    note: Callable[[str], None] | None = None  # a line of progress from attacks without an optimiser (text)


NO_INPUTS = RunInputs()


class Abstained(GleakError):
    """Raised by an attack that ran and answers that it cannot tell (e.g. the calibrated selector when no candidate
    beats chance): :func:`run_attack` records status ``abstained`` with this reason and ``confidence`` (the
    calibration the answer rests on), and no output."""

    def __init__(self, reason: str, confidence: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.confidence = confidence


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
class TokenOutput:
    """What a token attack returns (gleak.attacks.tokens): the recovered token ids with rough counts (ids only,
    never decoded text), per-token scores [V] for downstream thresholds (not serialised), and extras.

    ``max_length`` and ``lengths`` (a histogram length -> sequences) come from the position attack."""

    token_ids: torch.Tensor
    counts: torch.Tensor
    scores: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # per recovered token, in [0, 1], where the attack measures one
    max_length: int | None = None
    lengths: dict[int, int] | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def bag(self) -> dict[int, int]:
        """token id -> count."""
        return {int(t): int(c) for t, c in zip(self.token_ids.tolist(), self.counts.tolist(), strict=True)}


@dataclass
class TextOutput:
    """What a sentence-reconstruction attack returns (gleak.attacks.text): token ids per recovered sequence (never
    decoded text), whether each passed every exactness test of the attack, and extras."""

    sequences: list[list[int]]
    exact: list[bool] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class AttackResult:
    """One attack on one capture: status ok / not_applicable / failed / error / abstained, output, time, reason,
    scores, and the options it ran with (JSON values; see :meth:`Attack.used_options`)."""

    attack: str
    status: Status
    seconds: float = 0.0
    reason: str | None = None
    output: LabelOutput | ImageOutput | TokenOutput | TextOutput | None = None
    warnings: list[str] = field(default_factory=list)
    scores: dict[str, float] | None = None
    options: dict[str, Any] | None = None
    confidence: dict[str, Any] | None = None  # label attacks: calibrated intervals (attacks.labels.confidence)
    out_of_time: bool = False  # failed because it reached its time share (gleak.timebox.OutOfTime)

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
        if isinstance(self.output, TokenOutput):
            out["tokens"] = [{"id": t, "count": c} for t, c in self.output.bag().items()]
            if self.output.max_length is not None:
                out["max_length"] = self.output.max_length
            if self.output.lengths is not None:
                out["lengths"] = {str(k): v for k, v in self.output.lengths.items()}
            out["diagnostics"] = jsonable(self.output.diagnostics)
        elif isinstance(self.output, TextOutput):
            out["sequences"] = [list(s) for s in self.output.sequences]
            out["exact"] = list(self.output.exact)
            out["diagnostics"] = jsonable(self.output.diagnostics)
        elif isinstance(self.output, ImageOutput):
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


class Attack(Configurable, ABC):
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
    memory_hint: ClassVar[str] = ""  # the option that lowers the attack's memory, named when it is skipped
    options: AttackOptions

    def __init__(self) -> None:
        self.options = self.Options()

    def configure(self, values: Mapping[str, Any] | None = None,
                  sources: Mapping[str, str] | None = None) -> AttackOptions:
        """Set the options from ``values`` (strings are converted; keys not given take their defaults) and return
        them. An unknown key or a bad value is a one-line GleakError; ``sources`` names the flag a key came from."""
        typed = resolve_options(type(self), values or {}, sources)
        assert isinstance(typed, AttackOptions)
        self.options = typed
        return typed

    def used_options(self) -> AttackOptions:
        """The options this attack runs with (what reports record)."""
        return self.options

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        """Why this attack cannot run on ``ctx`` with ``inputs`` (one line), or None. Extend for attack-specific
        checks."""
        return ctx.check_requirements(self.requires)

    @abstractmethod
    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput | ImageOutput | TokenOutput | TextOutput:
        """Recover labels (or images, or tokens). Raise GleakError for a problem with the input that stops the
        attack."""

    def memory_bytes(self, ctx: Context) -> int:
        """About how much memory a run adds, estimated from B, C, d and the options before anything is allocated
        (checked against ``ctx.max_memory`` by :func:`run_attack`). The default: a few float64 copies of the last
        layer's gradient. Attacks with larger working sets override it."""
        return LAYER_COPIES * ctx.num_classes * ctx.layer.feature_dim * 8

    def rng(self, ctx: Context) -> torch.Generator:
        """A generator seeded from the run's seed and this attack's name: same seed, same report."""
        return torch.Generator().manual_seed((ctx.seed * 1_000_003 + zlib.crc32(self.name.encode())) % 2**63)


def run_attack(attack: Attack, ctx: Context, inputs: RunInputs = NO_INPUTS) -> AttackResult:
    """Check applicability (with ``inputs``), run with timing, attach soft-requirement warnings. Never raises:
    bad input is status ``failed``, an unexpected exception status ``error``, an :class:`Abstained` answer status
    ``abstained``, each with a one-line reason.

    The attack runs under the earlier of ``ctx.deadline`` and the deadline in force (:mod:`gleak.timebox`), named
    after it: one that reaches it stops at its next checkpoint, status ``failed`` with ``out_of_time`` set and the
    reason saying where it stopped."""
    try:
        options = attack.used_options().model_dump(mode="json")
    except GleakError as e:
        return AttackResult(attack.name, "failed", reason=str(e))
    reason = attack.not_applicable(ctx, inputs) or memory_refusal(attack, ctx)
    if reason:
        return AttackResult(attack.name, "not_applicable", reason=reason, options=options)
    warnings = list(ctx.soft_warnings(attack.requires))
    start = time.perf_counter()
    scope = earliest(ctx.deadline, current()).named(attack.name)
    try:
        with running(scope):
            scope.check("its start")
            output = attack.run(ctx, inputs)
    except OutOfTime as e:
        return AttackResult(attack.name, "failed", time.perf_counter() - start, reason=str(e), warnings=warnings,
                            options=options, out_of_time=True)
    except Abstained as e:
        return AttackResult(attack.name, "abstained", time.perf_counter() - start, reason=str(e), warnings=warnings,
                            options=options, confidence=e.confidence)
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


def earliest(*deadlines: Deadline | None) -> Deadline:
    """The deadline that ends first among those given (an unbounded one when none is)."""
    given = [d for d in deadlines if d is not None]
    bounded = [d for d in given if d.end is not None]
    if bounded:
        return min(bounded, key=lambda d: d.end if d.end is not None else 0.0)
    return given[0] if given else Deadline.unbounded()


LAYER_COPIES = 4  # the default working set: this many float64 copies of the [C, d] last-layer gradient


def memory_refusal(attack: Attack, ctx: Context) -> str | None:
    """Why ``attack`` would need more memory than ``ctx.max_memory`` allows (one line naming what to lower), or
    None. Counts the auxiliary forward too when the attack needs it and it has not run yet."""
    if ctx.max_memory is None:
        return None
    need = attack.memory_bytes(ctx) + (ctx.aux_forward_bytes() if attack.requires.needs_aux else 0)
    if need <= ctx.max_memory:
        return None
    lower = f"lower {attack.memory_hint} or " if attack.memory_hint else ""
    return (f"needs about {format_bytes(need)} of memory, more than --max-memory {format_bytes(ctx.max_memory)}: "
            f"{lower}raise --max-memory")


def format_bytes(n: float) -> str:
    """``1.5 GB``, ``320 MB``: decimal units, as --max-memory takes them."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
