"""The run behind ``gleak sweep``: how much each attack still recovers as a defense gets stronger, and what the
defense costs.

Trial t simulates the client once on the real data with seed ``seed + t·TRIAL_STRIDE`` (the undefended baseline,
shared by every defense). Every contribution defense, at every strength, is applied to that same contribution with the
trial's seed (so a Gaussian sweep adds the same draw, scaled); DP-SGD, which acts while the client trains, simulates
the same batch again with the defense (:class:`gleak.simulate.images.ClientConfig` ``defenses``). Each point is
attacked as ``gleak labels`` and ``gleak reconstruct`` attack a capture, scored against the simulated truth, and its
utility measured against the clean contribution of the same trial; the rows aggregate over the trials. The curves are
paired: every point sees the same batches. With ``utility="accuracy"`` each point's defense also trains the model for
a few FedAvg rounds, scored on held-out data (:mod:`gleak.runs.sweep_accuracy`).

Trials run in this process or in worker processes (``jobs``); each trial is a function of its seed alone, so the
rows do not depend on where it ran.

Defense specs (``--defense``) are ``NAME[:KEY=VALUE,...][=V1,V2,...]``: see :func:`split_sweep` for the rule; a
defense's other sweepable options (``also_sweeps``: dpsgd's target ``epsilon``) are swept as
``NAME:[KEY=VALUE,...,]OPTION=V1,V2,...`` (:func:`split_named`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from gleak import __version__
from gleak.attacks import Context, build_context, get_attack
from gleak.attacks.base import RunInputs
from gleak.attacks.labels.confidence import CalibrationCache
from gleak.attacks.plan import run_label_attacks, select_attacks
from gleak.attacks.registry import attack_class, resolve_assignments
from gleak.capture import Capture, Truth
from gleak.data.images import Dataset, load_dataset
from gleak.defenses import (
    DEFENSES,
    Defense,
    apply_defenses,
    build_defense,
    contribution_distortion,
    split_spec,
)
from gleak.errors import GleakError, shorten
from gleak.metrics.identification import DEFAULT_DISTRACTORS
from gleak.metrics.labels import chance_scores, truth_counts
from gleak.models import LoadedModel, load_model
from gleak.report.model import (
    BASELINE,
    EpsilonTerms,
    SweepDefense,
    SweepMetric,
    SweepReport,
    SweepRow,
    SweepSettings,
    SweepTraining,
    SweepUtility,
)
from gleak.report.privacy import terms_of
from gleak.reproducible import zero_timings
from gleak.runs.inputs import ModelSpec, check_model_fits_data, memory_limit, resolve_device, soft_truth
from gleak.runs.sweep_accuracy import (
    DEFAULT_ROUNDS,
    DEFAULT_TRAIN_LR,
    DEFAULT_TRAIN_STEPS,
    EVAL_FRACTION,
    TRAIN_SEED_OFFSET,
    UTILITIES,
    Split,
    Training,
    load_eval,
    split_data,
    train_points,
)
from gleak.simulate.images import ClientConfig, simulate_client

if TYPE_CHECKING:
    from gleak.attacks.reconstruct.inputs import ReconInputs
    from gleak.generator.file import GeneratorFile

FLAG = "--defense"
SPEC_SYNTAX = ("NAME[:KEY=VALUE,...][=V1,V2,...] (e.g. gaussian=1e-3,1e-2 or topk:scope=global=0.9,0.99; "
               "dpsgd:epsilon=0.5,1,2 sweeps a target ε)")
TRIAL_STRIDE = 1_000_003  # trial t simulates with seed + t·TRIAL_STRIDE
DEFAULT_TRIALS = 5
DEFAULT_ITERATIONS = 200  # the reconstruction attacks' bound: a sweep runs them many times
DEFAULT_CONFIDENCE = 24  # batches simulated from aux to calibrate the calibrated selector (its own default)
PSNR_CAP = 100.0  # dB recorded for an exact reconstruction (infinite PSNR: JSON has no infinity)
CALIBRATED = "calibrated"
CALIBRATED_SKIPPED = ("calibrated skipped: it calibrates the label attacks on batches simulated from auxiliary data; "
                      "give --aux to run it")
Progress = Callable[[int, int, str], None]  # (points done, points in all, what is running)


# ----------------------------------------------------------------------------------------- defense specs
def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def split_sweep(text: str) -> tuple[str, list[str] | None]:
    """``(spec, strengths as written)`` of a sweep's ``--defense``; strengths None when it gives none.

    The rule: the strengths are the text after the **last** ``=`` when (1) that text is a comma-separated list of
    numbers and (2) the text before it is a whole ``NAME[:KEY=VALUE,...]`` — a bare name, or a name whose every
    option item after ``:`` has its own ``=``. Otherwise the whole text is the spec (one point). So
    ``topk:scope=global=0.9,0.99`` is topk with scope=global at ratios 0.9 and 0.99, ``dpsgd:max_grad_norm=1=0.5,1``
    is DP-SGD with C = 1 at z = 0.5 and 1, while ``gaussian:sigma=0.1`` is one point (``gaussian:sigma`` is not a
    whole spec) and ``gaussian:relative=true,sigma=0.1`` too."""
    head, eq, tail = text.rpartition("=")
    if not eq:
        return text, None
    tokens = [t.strip() for t in tail.split(",")]
    if not all(_number(t) is not None for t in tokens):
        return text, None
    _, colon, options = head.partition(":")
    if colon and not all("=" in item for item in options.split(",")):
        return text, None
    return head, tokens


def split_named(text: str, keys: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(spec without the swept option, the option, its values as written)`` of a sweep over a named option,
    ``NAME:[KEY=VALUE,...,]KEY=V1,V2,...`` — the option is one of ``keys`` (a defense's ``also_sweeps``, e.g.
    dpsgd's ``epsilon``) and every item after it is a number — else None. So ``dpsgd:epsilon=0.5,1,2`` is DP-SGD
    aimed at ε = 0.5, 1 and 2, and ``dpsgd:max_grad_norm=2,epsilon=1,4`` the same with C = 2."""
    name, colon, rest = text.partition(":")
    if not colon or not keys:
        return None
    items = [item.strip() for item in rest.split(",")]
    for i, item in enumerate(items):
        key, eq, first = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in keys:
            continue
        tokens = [first.strip(), *items[i + 1:]]
        if all(_number(t) is not None for t in tokens) and all("=" in x for x in items[:i]):
            return ":".join((name, ",".join(items[:i]))) if i else name, key, tokens
        return None
    return None


@dataclass(kw_only=True, frozen=True)
class DefenseSweep:
    """One ``--defense`` of a sweep: the defense, the options kept fixed, and its points — (strength, the configured
    defense) for each value, or one point at the configured options when no values are given (``swept`` False)."""

    text: str
    name: str
    strength: str | None
    fixed: Mapping[str, str]
    swept: bool
    points: tuple[tuple[float | None, Defense], ...]

    @property
    def training(self) -> bool:
        return bool(self.points[0][1].training)

    @property
    def values(self) -> tuple[float, ...]:
        """The strengths run, in the order given (empty: one point at the configured options)."""
        return tuple(v for v, _ in self.points if v is not None) if self.swept else ()


def parse_sweep(text: str) -> DefenseSweep:
    """A sweep's ``--defense``, every point built and validated as :func:`gleak.defenses.parse_defense` validates one
    spec (unknown defense or key, a bad value: one line naming it and the choices)."""
    spec, tokens = split_sweep(text)
    named = None
    if tokens is None and "=" not in spec.partition(":")[0]:
        cls = DEFENSES.get(spec.partition(":")[0].strip())
        named = split_named(spec, cls.also_sweeps) if cls is not None else None
    if named is not None:
        spec, _, tokens = named
    if tokens is None and "=" in spec.partition(":")[0]:
        raise GleakError(f"{FLAG} {shorten(repr(text), 60)}: expected {SPEC_SYNTAX}; the strengths after the last "
                         "'=' must be numbers separated by commas")
    try:
        name, fixed = split_spec(spec, FLAG)
    except GleakError as e:
        raise GleakError(f"{e}; a sweep's strengths follow the whole spec: {SPEC_SYNTAX}") from None
    cls = DEFENSES.lookup(name, where=f"{FLAG}: ")
    strength = named[1] if named is not None else cls.strength
    if tokens is None:  # one point: a named alternative strength given (dpsgd:epsilon=2,delta=1e-6) is its strength
        strength = next((k for k in cls.also_sweeps if k in fixed), strength)

    def value_of(defense: Defense) -> float | None:
        value = getattr(defense.options, strength) if strength else None
        return None if value is None else float(value)

    if tokens is None:
        defense = build_defense(cls, fixed, FLAG)
        return DefenseSweep(text=text, name=cls.name, strength=strength, fixed=dict(fixed), swept=False,
                            points=((value_of(defense), defense),))
    if strength is None:
        varied = ", ".join(sorted(c.name for c in DEFENSES.values() if c.strength))
        raise GleakError(f"{FLAG} {shorten(text, 60)}: {cls.name} has no strength option to sweep; give --defense "
                         f"{cls.name} alone for one point (defenses with a strength: {varied})")
    if strength in fixed:
        raise GleakError(f"{FLAG} {shorten(text, 60)}: {strength} is the strength the sweep varies; give its values "
                         f"after '=' only, not also as {strength}={fixed[strength]}")
    assert strength is not None
    sources = {k: f"{FLAG} {cls.name}:{k}" for k in fixed}
    points: list[tuple[float | None, Defense]] = []
    values: list[float] = []
    for token in tokens:
        value = float(token)
        if not math.isfinite(value):
            raise GleakError(f"{FLAG} {cls.name}: strengths must be finite numbers, got {shorten(token, 20)!r}")
        if value in values:
            raise GleakError(f"{FLAG} {cls.name}: the strength {token} is given twice")
        defense = build_defense(cls, {**fixed, strength: value}, FLAG,
                                {**sources, strength: f"{FLAG} {cls.name} {strength}={token}"})
        values.append(value)
        points.append((value_of(defense), defense))
    return DefenseSweep(text=text, name=cls.name, strength=strength, fixed=dict(fixed), swept=True,
                        points=tuple(points))


# ----------------------------------------------------------------------------------------- attacks
@dataclass(kw_only=True, frozen=True)
class AttackPlan:
    """What every point runs: the label attacks (the calibrated selector's candidates too), whether the selector
    runs, the reconstruction attacks, the attacks that get rows (in order), and what was left out."""

    labels: tuple[str, ...]
    calibrated: bool
    reconstruct: tuple[str, ...]
    rows: tuple[str, ...]
    notices: tuple[str, ...] = ()


def plan_attacks(names: Sequence[str], aux: bool, generator: bool,
                 options: Mapping[str, Mapping[str, str]]) -> AttackPlan:
    """The attacks of ``--attack`` (none: the default label attacks, and the calibrated selector when there is
    auxiliary data), every name and ``-O`` checked."""
    notices: list[str] = []
    if not names:
        labels = tuple(a.name for a in select_attacks("labels", None))
        if not aux:
            notices.append(CALIBRATED_SKIPPED)
        calibrated = aux
        plan = AttackPlan(labels=labels, calibrated=calibrated, reconstruct=(),
                          rows=labels + ((CALIBRATED,) if calibrated else ()), notices=tuple(notices))
    else:
        named: list[str] = list(dict.fromkeys(n.strip() for n in names))
        label_names: list[str] = []
        recon: list[str] = []
        for name in named:
            cls = attack_class(name, where="--attack: ")
            if cls.name == CALIBRATED:
                if not aux:
                    raise GleakError("--attack calibrated calibrates the label attacks on batches simulated from "
                                     "auxiliary data: give --aux")
                continue
            (label_names if cls.task == "labels" else recon).append(cls.name)
        calibrated = CALIBRATED in named
        candidates = tuple(label_names) or (tuple(a.name for a in select_attacks("labels", None)) if calibrated
                                            else ())
        rows = tuple(n for n in named if n in label_names or n == CALIBRATED)
        plan = AttackPlan(labels=candidates, calibrated=calibrated, reconstruct=tuple(recon), rows=rows)
    from gleak.attacks.reconstruct.generative import GenerativeAttack

    generative = [n for n in plan.reconstruct if issubclass(attack_class(n), GenerativeAttack)]
    if generative and not generator:
        raise GleakError(f"{generative[0]} reconstructs through an image generator: give --generator "
                         "(gleak train-generator makes one)")
    if generator and not generative:
        raise GleakError("--generator is for the generative attacks (fgla, rgla); name one with --attack")
    resolve_assignments(options)  # every attack, key and value checked
    for name, values in options.items():
        if name == CALIBRATED:
            raise GleakError("-O calibrated.*: the sweep calibrates the selector on --confidence batches; set that")
        if name not in plan.labels and name not in plan.reconstruct:
            key = next(iter(values), "?")
            raise GleakError(f"-O {name}.{key}: {name} does not run in this sweep (--attack names what runs)")
    return plan


# ----------------------------------------------------------------------------------------- the request
@dataclass(kw_only=True, frozen=True)
class SweepRequest:
    """``gleak sweep``: the global model, the client's data, the ``--defense`` specs, the attacks (none: the default
    label attacks and, with ``aux``, the calibrated selector), ``-O`` assignments, how the client trains, how many
    trials, and where trials run (``jobs`` 0: auto; 1: here; N: N worker processes)."""

    model: ModelSpec
    data: Path
    defenses: tuple[str, ...]
    attacks: tuple[str, ...] = ()
    aux: Path | None = None
    generator: Path | None = None
    options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    batch_size: int = 8
    local_steps: int = 1
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    iterations: int | None = None  # None: DEFAULT_ITERATIONS (and -O ATTACK.iterations may set one attack's)
    confidence: int = DEFAULT_CONFIDENCE
    jobs: int = 1
    device: str = "auto"
    utility: str = "cosine"  # "accuracy": also train the model under every point's defense (sweep_accuracy)
    train_rounds: int = DEFAULT_ROUNDS
    train_steps: int = DEFAULT_TRAIN_STEPS
    train_lr: float = DEFAULT_TRAIN_LR
    eval_data: Path | None = None

    @property
    def accuracy(self) -> bool:
        return self.utility == "accuracy"

    @property
    def training(self) -> Training:
        """How the utility model trains (``--utility accuracy``)."""
        return Training(rounds=self.train_rounds, steps=self.train_steps, batch_size=self.batch_size,
                        lr=self.train_lr, seed=self.seed)

    @property
    def scheme(self) -> str:
        return "fedsgd" if self.local_steps == 1 else "fedavg"

    def client(self, trial: int) -> ClientConfig:
        """The client of trial ``trial`` (undefended)."""
        return ClientConfig(batch_size=self.batch_size, local_steps=self.local_steps, scheme=self.scheme,
                            seed=self.trial_seed(trial))

    @property
    def bound(self) -> int:
        """The reconstruction attacks' iteration bound."""
        return DEFAULT_ITERATIONS if self.iterations is None else self.iterations

    def trial_seed(self, trial: int) -> int:
        return self.seed + TRIAL_STRIDE * trial

    def check(self) -> tuple[list[DefenseSweep], AttackPlan]:
        """Every spec, attack and number checked before any file is read (one-line GleakErrors)."""
        if not self.defenses:
            raise GleakError(f"give at least one {FLAG} {SPEC_SYNTAX} (gleak defenses lists them)")
        if self.model.path is None:
            raise GleakError("sweep needs the global model (--model)")
        for what, value, low in (("--trials", self.trials, 1), ("--batch-size", self.batch_size, 1),
                                 ("--local-steps", self.local_steps, 1), ("--iterations", self.bound, 1),
                                 ("--confidence", self.confidence, 4), ("--seed", self.seed, 0)):
            if value < low:
                raise GleakError(f"{what} must be ≥ {low}, got {value}")
        if self.utility not in UTILITIES:
            raise GleakError(f"--utility {shorten(self.utility, 20)!r}: choose {' or '.join(UTILITIES)}")
        if self.accuracy:
            for what, value in (("--train-rounds", self.train_rounds), ("--train-steps", self.train_steps)):
                if value < 1:
                    raise GleakError(f"{what} must be ≥ 1, got {value}")
            if not (math.isfinite(self.train_lr) and self.train_lr > 0):
                raise GleakError(f"--train-lr must be a number > 0, got {self.train_lr}")
        elif self.eval_data is not None:
            raise GleakError("--eval-data is the test set of --utility accuracy: give --utility accuracy too")
        sweeps = [parse_sweep(text) for text in self.defenses]
        names = [s.name for s in sweeps]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise GleakError(f"{FLAG} {twice} is given twice; give each defense once, with all its strengths")
        ClientConfig(batch_size=self.batch_size, local_steps=self.local_steps, scheme=self.scheme)  # validates
        both = next((name for name, values in self.options.items() if "iterations" in values), None)
        if both is not None and self.iterations is not None:
            raise GleakError(f"--iterations and -O {both}.iterations both set the iteration bound; give one")
        return sweeps, plan_attacks(self.attacks, self.aux is not None, self.generator is not None, self.options)


# ----------------------------------------------------------------------------------------- one trial
@dataclass
class PointResult:
    """One point of one trial: each attack's score (None: no answer) and why not, the chance of the metric for this
    batch, the utility of the defended contribution, and DP-SGD's ε."""

    scores: dict[str, float | None]
    reasons: dict[str, str]
    chance: dict[str, float | None]
    utility: dict[str, float]
    epsilon: float | None = None
    epsilon_terms: EpsilonTerms | None = None


Point = tuple[int, int]  # (defense index, strength index); BASE_POINT: the undefended baseline
BASE_POINT: Point = (-1, -1)
Trial = dict[Point, PointResult]


@dataclass
class _Setup:
    """What a process runs trials with: the request, its checked specs and plan, the model, data, aux data and
    generator loaded once, and the caches shared by every point (model forwards of the aux data, the selector's
    calibration: both depend on the model and settings, not on the defense)."""

    request: SweepRequest
    sweeps: list[DefenseSweep]
    plan: AttackPlan
    loaded: LoadedModel | None  # None once released (:meth:`release`)
    data: Dataset | None
    aux: Dataset | None
    generator: GeneratorFile | None
    device: torch.device
    max_memory: int | None
    forward_cache: dict[str, Any] = field(default_factory=dict)
    calibration_cache: CalibrationCache = field(default_factory=CalibrationCache)  # bounded (CACHE_ENTRIES)
    model_sha256: str = ""  # the model's tensors hash, kept when the model is released (audit --sweep checks it)

    @classmethod
    def open(cls, request: SweepRequest) -> _Setup:
        sweeps, plan = request.check()
        m = request.model
        assert m.path is not None  # checked
        loaded = load_model(m.path, m.arch, m.arch_kwargs, m.trust_pickle, m.trust_remote_code)
        data = load_dataset(request.data)
        check_model_fits_data(loaded, data)
        aux = load_dataset(request.aux) if request.aux is not None else None
        device = resolve_device(request.device)
        generator = None
        if request.generator is not None:
            from gleak.generator.file import load_generator

            generator = load_generator(request.generator, device)
        return cls(request, sweeps, plan, loaded, data, aux, generator, device, memory_limit(),
                   model_sha256=loaded.weights_sha256)

    def held(self) -> tuple[LoadedModel, Dataset]:
        """The model and the client's data (a RuntimeError once :meth:`release` dropped them)."""
        if self.loaded is None or self.data is None:
            raise RuntimeError("the sweep's inputs were released: its trials run in worker processes")
        return self.loaded, self.data

    def release(self) -> None:
        """Drop the loaded inputs and caches before worker processes load their own: what is left (the request,
        the specs and the plan) is what the rows need."""
        self.loaded = self.data = self.aux = self.generator = None
        self.forward_cache.clear()
        self.calibration_cache.clear()

    @property
    def points(self) -> list[Point]:
        return [BASE_POINT] + [(i, j) for i, s in enumerate(self.sweeps) for j in range(len(s.points))]

    def metric(self, attack: str) -> SweepMetric:
        if attack not in self.plan.reconstruct:
            return "iacc"
        return "identification_kappa" if self.request.aux is not None else "psnr"

    def describe(self, point: Point) -> str:
        if point == BASE_POINT:
            return "undefended"
        sweep = self.sweeps[point[0]]
        value = sweep.points[point[1]][0]
        return sweep.name if value is None or sweep.strength is None else f"{sweep.name} {sweep.strength}={value:g}"


def run_trial(setup: _Setup, trial: int, tick: Callable[[str], None] | None = None) -> Trial:
    """Every point of trial ``trial``: the baseline, then each defense at each strength (``tick`` after each)."""
    request = setup.request
    seed = request.trial_seed(trial)
    config = request.client(trial)
    loaded, data = setup.held()
    clean, truth = simulate_client(loaded.module, data, config, setup.device)
    out: Trial = {BASE_POINT: _score(setup, clean, truth, seed, {"relative_l2_error": 0.0, "cosine": 1.0})}
    if tick:
        tick(setup.describe(BASE_POINT))
    for i, sweep in enumerate(setup.sweeps):
        for j, (_, defense) in enumerate(sweep.points):
            epsilon, terms = None, None
            if defense.training:  # the same batch, trained with the defense
                defended, dp_truth = simulate_client(loaded.module, data,
                                                     replace(config, defenses=(defense,)), setup.device)
                if not torch.equal(dp_truth.labels, truth.labels):
                    raise RuntimeError("the defended client drew another batch than the undefended one")
                epsilon, terms = float(defended.value("gleak.dp.epsilon")), terms_of(defended.meta)
            else:
                defended = apply_defenses(clean, [defense], seed)
            utility = contribution_distortion(clean, defended)
            out[(i, j)] = _score(setup, defended, truth, seed, utility, epsilon)
            out[(i, j)].epsilon_terms = terms
            if tick:
                tick(setup.describe((i, j)))
    return out


def _score(setup: _Setup, capture: Capture, truth: Truth, seed: int, utility: dict[str, float],
           epsilon: float | None = None) -> PointResult:
    """Attack one (defended) contribution and score every attack of the plan against the truth."""
    request, plan = setup.request, setup.plan
    ctx = build_context(capture, setup.held()[0], None, setup.device, request.seed, max_memory=setup.max_memory)
    if setup.aux is not None:
        ctx = ctx.with_aux(setup.aux, setup.forward_cache)
    counts = truth_counts(truth.labels, ctx.num_classes)
    chance_iacc = chance_scores(counts)["iacc"]
    result = PointResult({}, {}, {}, utility, epsilon)
    if plan.labels:
        attacks = [get_attack(name, "labels") for name in plan.labels]
        for attack in attacks:
            attack.configure(request.options.get(attack.name, {}))
        simulations = request.confidence if plan.calibrated else 0
        ran = {r.attack: r for r in run_label_attacks(ctx, attacks, counts, None, soft_truth(ctx, truth), simulations,
                                                      setup.calibration_cache, combine=plan.calibrated)}
        for name in plan.rows:
            r = ran.get(name)
            result.chance[name] = chance_iacc
            if r is not None and r.status == "ok" and r.scores is not None:  # scored by run_label_attacks
                result.scores[name] = r.scores["iacc"]
            else:
                result.scores[name] = None
                result.reasons[name] = "did not run" if r is None else f"{r.status}: {r.reason or r.status}"
    prepared: list[ReconInputs | GleakError] = []  # the targets, prepared once for every reconstruction attack
    for name in plan.reconstruct:
        score, chance, why = _reconstruct(setup, ctx, truth, name, seed, prepared)
        # κ's chance is 0 by definition, whether the attack ran or not; PSNR's is the trial's no-attack baseline
        result.scores[name], result.chance[name] = score, 0.0 if setup.aux is not None else chance
        if why is not None:
            result.reasons[name] = why
    return result


def _reconstruct(setup: _Setup, ctx: Context, truth: Truth, name: str, seed: int,
                 prepared: list[ReconInputs | GleakError]) -> tuple[float | None, float | None, str | None]:
    """(score, chance, why no score) of reconstruction ``name`` on ``ctx``: identification over chance κ of its
    lineup with aux data (chance 0), else the mean PSNR (chance: the no-attack baseline's PSNR). ``prepared``
    holds the point's targets (or why there are none) once the first applicable attack has prepared them."""
    from gleak.attacks.reconstruct.inputs import prepare
    from gleak.runs.reconstruct import reconstruct, wants_feature
    from gleak.runs.scoring import identification_of

    attack = get_attack(name, "reconstruct")
    bounds = {"iterations": setup.request.bound} if "iterations" in attack.Options.model_fields else {}
    attack.configure({**bounds, **setup.request.options.get(name, {})})
    reason = attack.not_applicable(ctx, RunInputs(generator=setup.generator))
    if reason:
        return None, 0.0 if setup.aux is not None else None, f"not_applicable: {reason}"
    if not prepared:
        try:
            prepared.append(prepare(ctx, "auto", truth, want_feature=any(map(wants_feature, setup.plan.reconstruct))))
        except GleakError as e:
            prepared.append(e)
    if isinstance(prepared[0], GleakError):
        return None, None, f"failed: {prepared[0]}"
    try:
        done = reconstruct(ctx, attack, "auto", truth, setup.generator, lpips="off", prepared=prepared[0])
    except GleakError as e:
        return None, None, f"failed: {e}"
    if not done.ok or done.scored is None or done.images is None or done.truth_pixels is None:
        return None, None, done.scoring_error or f"{done.result.status}: {done.result.reason or 'no images'}"
    if setup.aux is not None:
        found = identification_of(ctx, done.images, done.truth_pixels, truth, DEFAULT_DISTRACTORS, seed)
        if found is None:
            return None, 0.0, "no lineup: the auxiliary data does not fit the capture's images"
        return found[0].kappa, 0.0, None
    psnr = done.scored.metrics["mean"]["psnr"]
    psnr = PSNR_CAP if psnr is None or not math.isfinite(psnr) else min(float(psnr), PSNR_CAP)
    return psnr, float(done.scored.baseline_psnr), None


# ----------------------------------------------------------------------------------------- trials, here or in workers
_WORKER: dict[str, _Setup] = {}


def _worker_init(request: SweepRequest, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER["setup"] = _Setup.open(request)


def _worker_trial(trial: int) -> Trial:
    return run_trial(_WORKER["setup"], trial)


AUTO_WARM_UP = 2  # trials run here before the pace is trusted: a trial is long (every point attacked), so the
# second one already measures the pace (the first pays for warming up), and fewer trials are left to wait for


def _pool(request: SweepRequest, trials: Sequence[int], workers: int) -> Iterator[tuple[int, Trial]]:
    """``trials`` run by ``workers`` spawned processes (each loads the inputs once and gets its share of this
    process's threads); yields (trial, result) as they finish. An error in any trial stops the rest."""
    from gleak.runs.parallel import pool

    threads = max(1, torch.get_num_threads() // workers)
    for i, trial in pool(trials, _worker_init, (request, threads), _worker_trial, workers):
        yield trials[i], trial


def _run_trials(setup: _Setup, jobs: int, progress: Progress | None) -> tuple[list[Trial], int]:
    """Every trial's points, in trial order, and the number of processes that ran them: here (``jobs`` 1), in
    ``jobs`` workers, or (``jobs`` 0, auto) here until a pool pays for the trials left
    (:func:`gleak.runs.parallel.pool_pays`, after :data:`AUTO_WARM_UP` trials), then one worker per
    CPU (at most one per trial left). Before a pool starts, this process drops its loaded inputs
    (:meth:`_Setup.release`)."""
    from gleak.runs import parallel

    count = setup.request.trials
    per_trial = len(setup.points)
    total = count * per_trial
    results: dict[int, Trial] = {}
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, what)

    def ticker(t: int) -> Callable[[str], None]:
        return lambda what: tick(f"trial {t + 1}/{count}: {what}")

    workers = 1
    if jobs != 1 and count > 1 and (jobs > 1 or parallel.available_cpus() > 1):
        if jobs > 1:
            workers = min(jobs, count)
            todo = list(range(count))
        else:  # auto: measure here first
            todo = []
            seconds: list[float] = []
            for t in range(count):
                started = time.perf_counter()
                results[t] = run_trial(setup, t, ticker(t))
                seconds.append(time.perf_counter() - started)
                left = count - t - 1
                if parallel.pool_pays(seconds, left, min(parallel.available_cpus(), left), AUTO_WARM_UP):
                    todo = list(range(t + 1, count))
                    workers = min(parallel.available_cpus(), left)
                    break
        if todo:
            setup.release()
            for t, trial in _pool(setup.request, todo, workers):
                results[t] = trial
                done += per_trial
                if progress:
                    progress(done, total, f"trial {t + 1}/{count} done ({workers} workers)")
    for t in range(count):
        if t not in results:
            results[t] = run_trial(setup, t, ticker(t))
    return [results[t] for t in range(count)], workers


# ----------------------------------------------------------------------------------------- the run
def run_sweep(request: SweepRequest, progress: Progress | None = None) -> SweepReport:
    """Check the request, load the inputs, run every trial at every point, and aggregate the rows."""
    started = time.perf_counter()
    setup = _Setup.open(request)
    split = _split(setup) if request.accuracy else None
    accuracies: dict[Point, float] = {}
    training_seconds = None
    if split is not None:  # before the trials: a pool of workers releases this process's model
        points = setup.points
        chosen = [None if p == BASE_POINT else setup.sweeps[p[0]].points[p[1]][1] for p in points]
        done = 0

        def tick(what: str) -> None:
            nonlocal done
            done += 1
            if progress:
                progress(done, len(points), f"training: {what}")

        got, training_seconds = train_points(setup.held()[0].module, split, request.training,
                                             [(setup.describe(p), d) for p, d in zip(points, chosen, strict=True)],
                                             setup.device, tick)
        accuracies = dict(zip(points, got, strict=True))
    trials, workers = _run_trials(setup, request.jobs, progress)
    rows = _rows(setup, trials, accuracies)
    plan = setup.plan
    m = request.model
    settings = SweepSettings(
        model=str(m.path), model_sha256=setup.model_sha256, arch=m.arch, data=str(request.data),
        aux=str(request.aux) if request.aux else None,
        generator=str(request.generator) if request.generator else None, batch_size=request.batch_size,
        local_steps=request.local_steps, scheme="fedsgd" if request.scheme == "fedsgd" else "fedavg",
        trials=request.trials, seed=request.seed, trial_stride=TRIAL_STRIDE,
        attacks=list(plan.rows + plan.reconstruct), iterations=request.bound,
        confidence=request.confidence if plan.calibrated else 0, distractors=DEFAULT_DISTRACTORS, jobs=request.jobs,
        workers=workers, threads=torch.get_num_threads(), device=str(setup.device),
        utility="accuracy" if request.accuracy else "cosine",
        training=None if split is None else SweepTraining(
            rounds=request.train_rounds, local_steps=request.train_steps, batch_size=request.batch_size,
            learning_rate=request.train_lr, seed_offset=TRAIN_SEED_OFFSET, train_size=len(split.train),
            eval_size=len(split.test), eval_data=str(request.eval_data) if request.eval_data else None,
            eval_fraction=EVAL_FRACTION if split.held_out is not None else None))
    defenses = [SweepDefense(name=s.name, spec=s.text, strength=s.strength, fixed=dict(s.fixed),
                             values=list(s.values), training=s.training, plot=s.name) for s in setup.sweeps]
    notices = list(plan.notices)
    for attack in settings.attacks:  # an attack with no answer anywhere: say why once, not only in its rows
        mine = [r for r in rows if r.attack == attack]
        if all(r.trials == 0 for r in mine):
            notices.append(f"{attack} gave no answer at any point ({mine[0].reason or 'no reason recorded'})")
    return zero_timings(SweepReport(gleak_version=__version__, settings=settings, defenses=defenses, rows=rows,
                                    notices=notices, seconds=round(time.perf_counter() - started, 3),
                                    training_seconds=None if training_seconds is None else
                                    round(training_seconds, 3)))


def _split(setup: _Setup) -> Split:
    """The utility training's data: all of --data and --eval-data to test on, else a seeded held-out split."""
    request = setup.request
    loaded, data = setup.held()
    if request.eval_data is not None:
        return Split(data, load_eval(request.eval_data, loaded, data), None)
    return split_data(data, request.seed)


def _round(value: float) -> float:
    return round(float(value), 6)


def _mean(values: Sequence[float]) -> float | None:
    return _round(statistics.fmean(values)) if values else None


def _rows(setup: _Setup, trials: list[Trial], accuracies: Mapping[Point, float] | None = None) -> list[SweepRow]:
    """One row per (point, attack), the baseline first, over the trials; ``accuracies``: each point's test accuracy
    (``--utility accuracy``)."""
    rows: list[SweepRow] = []
    attacks = list(setup.plan.rows + setup.plan.reconstruct)
    for point in setup.points:
        results = [trial[point] for trial in trials]
        strength: float | Literal["none"] | None
        if point == BASE_POINT:
            defense, strength = BASELINE, "none"
        else:
            sweep = setup.sweeps[point[0]]
            defense, strength = sweep.name, sweep.points[point[1]][0]
        means = {k: statistics.fmean(r.utility[k] for r in results) for k in ("relative_l2_error", "cosine")}
        if not all(math.isfinite(v) for v in means.values()):
            raise GleakError("the simulated contribution is all zeros in a trial, so a defense's utility (its change "
                             "relative to the contribution) cannot be measured; check the model and data")
        utility = SweepUtility(**{k: _round(v) for k, v in means.items()},
                               accuracy=(accuracies or {}).get(point))
        epsilons = [r.epsilon for r in results if r.epsilon is not None]
        epsilon = _mean(epsilons)
        # the same in every trial: q is B over the client's data size, the steps --local-steps, z picked for them
        terms = next((r.epsilon_terms for r in results if r.epsilon_terms is not None), None)
        for attack in attacks:
            scores = [s for r in results if (s := r.scores.get(attack)) is not None]
            chances = [c for r in results if (c := r.chance.get(attack)) is not None]
            reason = next((r.reasons[attack] for r in results if attack in r.reasons and r.scores.get(attack) is None),
                          None)
            rows.append(SweepRow(
                defense=defense, strength=strength, attack=attack, metric=setup.metric(attack), mean=_mean(scores),
                std=_round(statistics.stdev(scores)) if len(scores) > 1 else (0.0 if scores else None),
                trials=len(scores), failed=len(results) - len(scores),
                reason=shorten(" ".join(reason.split()), 300) if reason else None,
                chance=_mean(chances), utility=utility, epsilon=epsilon, epsilon_terms=terms))
    return rows
