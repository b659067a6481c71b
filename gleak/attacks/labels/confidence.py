"""How sure a label attack is, measured rather than assumed: split-conformal count intervals from self-simulation.

For one capture, gleak simulates ``K`` client contributions with the capture's own settings (the global model, B,
m, learning rate, optimizer, loss, train/eval mode) on batches drawn from the auxiliary data, in two
*compositions* — even-numbered ones ``uniform`` (every label drawn uniformly from the classes of the aux data, as an
IID client's are), odd-numbered ones ``dirichlet`` (a non-IID client: labels drawn from skewed class shares, those
of one of 10 clients with Dirichlet(α = 0.5) shares, the same for all its local steps; :mod:`gleak.simulate.images`) —
runs each label attack on them, and measures its errors against the simulated truth:

* ``half_width`` q: the split-conformal quantile of |n̂_j − n_j| over the simulated (batch, class) pairs, so that
  [n̂_j − q, n̂_j + q] holds the true count with probability ≥ ``level`` when the real batch is drawn like the
  simulated ones (Vovk, Gammerman & Shafer, 2005; the split-conformal rule of Lei et al., JASA 2018). It is
  computed for the uniform and for the Dirichlet batches separately and the larger one is kept: a pooled
  quantile holds on average over the two, but under-covers whichever is harder (measured: 0.77–0.80 on skewed
  batches of trained models at a nominal 0.90), and a real client is one or the other;
* per composition (``by_composition``): the attack's mean iAcc on that composition's simulated batches
  (``expected_iacc``) beside the chance iAcc of random guessing *for batches drawn the same way* (``chance_iacc``:
  the exact chance of a known batch, :func:`gleak.metrics.labels.chance_scores`, averaged over
  :data:`CHANCE_DRAWS` seeded label draws of the composition), and their difference. Chance differs a lot between
  the compositions (0.87 vs 0.54 for m = 5 steps of B = 32): a chance averaged over a mixture of both understates
  the chance of an IID client's batch (0.60 instead of 0.71 for B = 32) and overstates the leak, so no number here
  mixes them. The headline ``expected_iacc`` / ``chance_iacc`` are those of the composition named by
  ``composition``, the one where the attack's margin over chance is smallest (``worst_margin``);
* ``informative`` is False unless the attack beats chance by more than two standard errors on the uniform batches
  *and* on the Dirichlet ones (margins paired batch by batch), and its mean iAcc is above the composition's chance
  on both. An uninformative attack's counts are no evidence of a leak, whatever they look like;
* ``fit`` (with the recovered counts): whether the counts could come from a batch drawn like the simulated ones —
  the share of batches of the mixture (half uniform, half Dirichlet, as simulated) whose labels are at least as
  concentrated (Σ n_j(n_j − 1) / (N(N − 1)), the probability that two of the batch's labels agree). Below
  :data:`FIT_LEVEL` the counts do not fit the mixture, and the expected iAcc and the intervals may not apply
  to this batch: a warning says so.

The simulated batches are drawn from one half of the auxiliary data (per class) and the attacks read their
statistics from the other half, as they do on a real capture, whose examples are not in the aux data: with one
pool for both, the attacks' class statistics would contain the very examples of the batch (at B = 128 a skewed
batch holds half the aux examples of its main class), and the measured errors would be too small.

With ``stack=True`` a learned combination of the attacks (:mod:`gleak.attacks.labels.stacking`) is calibrated
too, as the entry ``"stacked"``, from out-of-fold predictions; its fit on all K batches is kept in ``.stack``.

The calibration depends on the model and the settings, not on the captured values, so it is computed once per
(model, aux data, settings) and reused for every capture that shares them (``cache``: a
:class:`CalibrationCache` owned by whoever runs the attacks, e.g. one audit or one sweep; there is no
process-wide cache).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gleak.attacks.base import Attack, run_attack
from gleak.attacks.context import Context
from gleak.attacks.labels import stacking
from gleak.attacks.labels.stacking import Stack
from gleak.data.images import Dataset
from gleak.errors import GleakError
from gleak.lru import BoundedLRU
from gleak.metrics.labels import chance_scores, label_scores

LEVEL = 0.9
COMPOSITIONS = ("uniform", "dirichlet")
SIMULATIONS = 24
CACHE_ENTRIES = 32  # calibrations a CalibrationCache keeps by default (least recently used dropped first)
DIRICHLET_ALPHA = 0.5  # the skewed batches' concentration (ClientConfig.dirichlet_alpha's default)
CHANCE_DRAWS = 2000  # seeded label draws per composition: its chance iAcc (± 0.002) and the fit's reference
FIT_LEVEL = 0.01  # recovered counts more concentrated than all but this share of the mixture's batches: no fit


def concentration(counts: np.ndarray | torch.Tensor | Sequence[int]) -> np.ndarray:
    """Σ_j n_j(n_j − 1) / (N(N − 1)) per row of ``counts`` [..., C]: the probability that two different labels of
    the batch agree (1: one class; about 1/C: spread evenly). 0 for batches of fewer than 2 labels."""
    n = np.asarray(counts, dtype=np.float64)
    total = n.sum(-1)
    pairs = np.maximum(total * (total - 1), 1.0)
    return np.asarray((n * (n - 1)).sum(-1) / pairs)


@dataclass(frozen=True, eq=False)
class Composition:
    """How one kind of simulated batch draws its labels, and random guessing on such batches.

    ``chance_iacc`` is the expected iAcc of guessing the ``total`` labels uniformly over the ``num_classes``
    classes, for a batch drawn this way; ``reference`` holds the sorted concentrations of the seeded draws that
    estimated it (the reference of :meth:`tail`)."""

    name: str  # "uniform" or "dirichlet"
    total: int  # labels per contribution: m·B
    num_classes: int  # C: random guesses are uniform over all C classes
    classes: tuple[int, ...]  # the classes labels are drawn from: those of the aux data
    alpha: float | None
    chance_iacc: float
    draws: int
    reference: np.ndarray

    @property
    def assumes(self) -> str:
        """The assumption, in words."""
        k = len(self.classes)
        if self.name == "uniform":
            return f"every label drawn uniformly from the {k} classes of the aux data (an IID client)"
        from gleak.simulate.images import DIRICHLET_CLIENTS

        return (f"a non-IID client: labels drawn from its skewed class shares (one of {DIRICHLET_CLIENTS} clients "
                f"with Dirichlet(α = {self.alpha:g}) shares over the {k} classes of the aux data), the same shares "
                "for every local step")

    @property
    def label(self) -> str:
        """``uniform`` or ``dirichlet(0.5)``."""
        return f"dirichlet({self.alpha:g})" if self.name == "dirichlet" and self.alpha is not None else self.name

    def tail(self, counts: torch.Tensor | Sequence[int]) -> float:
        """The share of batches drawn this way whose labels are at least as concentrated as ``counts`` (Monte Carlo,
        +1 smoothed); 0 when ``counts`` hold labels of a class this composition never draws."""
        n = np.asarray(counts, dtype=np.int64)
        outside = [j for j in np.nonzero(n)[0].tolist() if j not in self.classes]
        if outside:
            return 0.0
        observed = float(concentration(n)) - 1e-12
        at_least = len(self.reference) - int(np.searchsorted(self.reference, observed, side="left"))
        return (at_least + 1) / (len(self.reference) + 1)


def draw_counts(name: str, total: int, num_classes: int, classes: Iterable[int], alpha: float = DIRICHLET_ALPHA,
                draws: int = CHANCE_DRAWS, seed: int = 0) -> np.ndarray:
    """[draws, C] label counts of ``total`` labels drawn as :mod:`gleak.simulate.images` draws them: ``uniform`` (each
    label uniform over ``classes``) or ``dirichlet`` (per draw, class weights Beta(α, (10 − 1)·α) normalised over
    ``classes``, the client's shares, then every label from them)."""
    from gleak.simulate.images import DIRICHLET_CLIENTS

    present = np.asarray(sorted(set(classes)), dtype=np.int64)
    rng = np.random.default_rng(seed)
    out = np.zeros((draws, num_classes), dtype=np.int64)
    if name == "uniform":
        out[:, present] = rng.multinomial(total, np.full(len(present), 1.0 / len(present)), size=draws)
    elif name == "dirichlet":
        g1 = rng.gamma(alpha, size=(draws, len(present)))
        g2 = rng.gamma((DIRICHLET_CLIENTS - 1) * alpha, size=(draws, len(present)))
        weights = g1 / (g1 + g2)
        out[:, present] = rng.multinomial(total, weights / weights.sum(1, keepdims=True))
    else:
        raise GleakError(f"unknown composition '{name}'; choose {', '.join(COMPOSITIONS)}")
    return out


def mean_chance_iacc(counts: np.ndarray) -> float:
    """The mean over the rows of ``counts`` [draws, C] of each batch's chance iAcc
    (:func:`gleak.metrics.labels.chance_scores`, computed once per distinct batch up to the order of classes, on
    which it does not depend)."""
    distinct, times = np.unique(np.sort(counts, axis=1), axis=0, return_counts=True)
    chances = np.array([chance_scores(torch.from_numpy(row))["iacc"] for row in distinct])
    return float((chances * times).sum() / times.sum())


def composition(name: str, total: int, num_classes: int, classes: Iterable[int], alpha: float = DIRICHLET_ALPHA,
                draws: int = CHANCE_DRAWS, seed: int = 0) -> Composition:
    """The :class:`Composition` ``name`` for contributions of ``total`` labels drawn from ``classes``, with its chance
    iAcc estimated on ``draws`` seeded draws (standard error about 0.001 for uniform batches, 0.003 for Dirichlet)."""
    counts = draw_counts(name, total, num_classes, classes, alpha, draws, seed)
    return Composition(name, total, num_classes, tuple(sorted(set(classes))), alpha if name == "dirichlet" else None,
                       mean_chance_iacc(counts), draws, np.sort(concentration(counts)))


@dataclass
class Measured:
    """One attack on the simulated batches of one composition: its mean iAcc, the composition's chance iAcc, and
    whether it beats chance there (by two standard errors of the paired margins, and on average)."""

    simulations: int
    expected_iacc: float
    chance_iacc: float
    beats_chance: bool
    interval: tuple[float, float] | None = None  # 95 % t-interval of the mean iAcc over the simulated batches

    @property
    def margin(self) -> float:
        return self.expected_iacc - self.chance_iacc


@dataclass
class Confidence:
    """One attack's calibration for one (model, aux data, settings).

    ``expected_iacc`` and ``chance_iacc`` are those of the composition ``composition`` (the smallest margin over
    chance, ``worst_margin``); ``by_composition`` holds every composition's, ``compositions`` their assumptions."""

    level: float
    half_width: int
    expected_iacc: float
    chance_iacc: float
    informative: bool
    simulations: int
    worst_margin: float = 0.0  # the smaller of (iAcc − chance) over the uniform and the Dirichlet batches
    stack: Stack | None = None  # the "stacked" entry: the fitted combination
    composition: str = ""  # the composition of expected_iacc / chance_iacc: the one with the smaller margin
    by_composition: dict[str, Measured] = field(default_factory=dict)
    compositions: dict[str, Composition] = field(default_factory=dict)

    def intervals(self, counts: torch.Tensor, total: int) -> list[list[int]]:
        """[low, high] per class: n̂_j ± q, clipped to [0, total]."""
        q = self.half_width
        return [[max(0, int(c) - q), min(total, int(c) + q)] for c in counts.tolist()]

    def describe(self) -> str:
        """'uniform: iAcc 0.870 vs chance 0.930 (−0.060); dirichlet(0.5): 0.600 vs 0.540 (+0.060)'."""
        parts = []
        for i, (name, m) in enumerate(self.by_composition.items()):
            label = self.compositions[name].label if name in self.compositions else name
            parts.append(f"{label}: {'iAcc ' if i == 0 else ''}{m.expected_iacc:.3f} vs {'chance ' if i == 0 else ''}"
                         f"{m.chance_iacc:.3f} ({m.margin:+.3f})")
        return "; ".join(parts)

    def fit(self, counts: torch.Tensor | Sequence[int]) -> dict[str, Any] | None:
        """Whether ``counts`` could come from a batch drawn like the simulated ones (the mixture of the
        compositions, in equal shares): the mixture's tail share of batches at least as concentrated; None when the
        calibration has no compositions."""
        if not self.compositions:
            return None
        tails = {name: c.tail(counts) for name, c in self.compositions.items()}
        p = statistics.fmean(tails.values())
        return {"statistic": "concentration", "value": round(float(concentration(np.asarray(counts))), 4),
                "p_value": round(p, 4), "by_composition": {n: round(t, 4) for n, t in tails.items()},
                "fits": p >= FIT_LEVEL}

    def fit_warning(self, counts: torch.Tensor | Sequence[int]) -> str | None:
        """The warning when ``counts`` do not fit the simulated compositions, else None."""
        fit = self.fit(counts)
        if fit is None or fit["fits"]:
            return None
        outside = any(t == 0.0 for t in fit["by_composition"].values())
        what = ("fall in classes the aux data does not hold" if outside else
                f"are more concentrated than {100 * (1 - fit['p_value']):.1f} % of the batches simulated like this "
                f"one ({' and '.join(c.label for c in self.compositions.values())})")
        return (f"the recovered counts {what}: the batch does not fit the compositions the calibration assumes, so "
                "its expected iAcc and intervals may not apply")

    def to_json(self, counts: torch.Tensor | None = None, total: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "half_width": self.half_width, "composition": self.composition,
                               "expected_iacc": round(self.expected_iacc, 4), "chance_iacc": round(self.chance_iacc, 4),
                               "informative": self.informative, "simulations": self.simulations,
                               "worst_margin": round(self.worst_margin, 4)}
        head = self.by_composition.get(self.composition)
        if head is not None and head.interval is not None:
            out["expected_interval"] = [round(v, 4) for v in head.interval]
        if self.by_composition:
            out["by_composition"] = {name: _measured_json(m, self.compositions.get(name))
                                     for name, m in self.by_composition.items()}
        if counts is not None and total is not None:
            out["intervals"] = self.intervals(counts, total)
            fit = self.fit(counts)
            if fit is not None:
                out["fit"] = fit
        return out


class CalibrationCache(BoundedLRU[tuple[Any, ...], dict[str, Confidence]]):
    """Calibrations already made, keyed by (model weights, aux data, settings, attacks, options): a bounded LRU
    owned by whoever runs the attacks (an audit, a sweep, a host program) and passed to :func:`calibrate`.

    At most ``max_entries`` (default :data:`CACHE_ENTRIES`, 32) calibrations are kept; storing one more drops the
    least recently used. Separate from the aux-set forward caches (those keep tensors, this keeps summaries)."""

    def __init__(self, max_entries: int = CACHE_ENTRIES) -> None:
        super().__init__(max_entries)


def _measured_json(m: Measured, comp: Composition | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if comp is not None:
        out["assumes"] = comp.assumes
        if comp.alpha is not None:
            out["alpha"] = comp.alpha
    out.update({"simulations": m.simulations, "expected_iacc": round(m.expected_iacc, 4),
                "chance_iacc": round(m.chance_iacc, 4), "margin": round(m.margin, 4), "beats_chance": m.beats_chance})
    if m.interval is not None:
        out["interval"] = [round(v, 4) for v in m.interval]
    if comp is not None:
        out["chance_draws"] = comp.draws
    return out


def best_informative(calibrated: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The attack to trust: among the informative ones, the best worst-case margin over chance (a real batch may be
    uniform or skewed), then the narrower intervals; None when none is informative. Takes ``to_json`` dicts."""
    informative = [n for n, c in calibrated.items() if c.get("informative")]
    if not informative:
        return None
    def margin(c: Mapping[str, Any]) -> float:  # reports without worst_margin: the mean margin
        return float(c.get("worst_margin", c["expected_iacc"] - c["chance_iacc"]))

    return max(informative, key=lambda n: (margin(calibrated[n]), -calibrated[n]["half_width"]))


def conformal_half_width(errors: Sequence[int], level: float) -> int:
    """The ⌈(n + 1)·level⌉-th smallest error (split conformal); the largest possible error when n is too small."""
    ordered = sorted(errors)
    rank = math.ceil((len(ordered) + 1) * level)
    if not ordered:
        raise GleakError("no simulated errors to calibrate on")
    return int(ordered[min(rank, len(ordered)) - 1])


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student's t interval of the mean of ``values``, clipped to [0, 1] (None for fewer than two values)."""
    from scipy.stats import t

    if len(values) < 2:
        return None
    mean, spread = statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))
    half = float(t.ppf(0.5 + level / 2, len(values) - 1)) * spread
    return max(0.0, mean - half), min(1.0, mean + half)


def _beats(margins: Sequence[float]) -> bool:
    """Mean margin over chance above zero by more than two standard errors."""
    mean = statistics.fmean(margins)
    spread = statistics.stdev(margins) if len(margins) > 1 else 0.0
    return mean > 0 and mean > 2 * spread / math.sqrt(len(margins))


def client_settings(ctx: Context) -> dict[str, Any]:
    """The ClientConfig fields that reproduce the capture's client (without seed and composition), its recorded
    defenses included (those gleak's registry can rebuild: :func:`unsimulated_defenses` names the others)."""
    from gleak.defenses import rebuild_defenses, recorded_defenses

    cap = ctx.capture
    defenses, _ = rebuild_defenses(recorded_defenses(cap))
    update = ctx.kind == "update"
    optimizer = cap.get("gleak.optimizer") or "sgd"
    return {"batch_size": int(ctx.batch_size or 1), "local_steps": int(ctx.local_steps or 1),
            "scheme": "fedavg" if update else "fedsgd",
            "learning_rate": float(cap.get("gleak.learning_rate") or 0.01),
            "optimizer": optimizer if update else "sgd",
            "momentum": float(cap.value("gleak.momentum")) if update and optimizer in ("sgdm", "nag") else 0.9,
            "weight_decay": float(cap.value("gleak.weight_decay") or 0.0) if update else 0.0,
            "loss": ctx.loss, "train_mode": bool(cap.value("gleak.model.train_mode")), "defenses": tuple(defenses)}


def unsimulated_defenses(ctx: Context) -> list[str]:
    """The recorded defenses a simulated twin of the capture cannot apply (not in gleak's registry)."""
    from gleak.defenses import rebuild_defenses, recorded_defenses

    return rebuild_defenses(recorded_defenses(ctx.capture))[1]


def split_aux(aux: Dataset, seed: int) -> tuple[Dataset, Dataset]:
    """(batch pool, statistics) halves of the auxiliary data, per class; a class with one example is in both."""
    gen = torch.Generator().manual_seed(seed)
    pool: list[torch.Tensor] = []
    stats: list[torch.Tensor] = []
    for idx in aux.indices_by_class().values():
        if len(idx) == 1:
            pool.append(idx)
            stats.append(idx)
            continue
        order = idx[torch.randperm(len(idx), generator=gen)]
        pool.append(order[: len(idx) // 2])
        stats.append(order[len(idx) // 2:])
    return aux.subset(torch.cat(pool)), aux.subset(torch.cat(stats))


@dataclass
class _Tally:
    """One candidate's record on the simulated batches, by composition: errors, iAcc and margins over each batch's
    chance."""

    errors: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in COMPOSITIONS})
    margins: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in COMPOSITIONS})
    iaccs: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in COMPOSITIONS})

    @property
    def runs(self) -> int:
        return sum(len(v) for v in self.iaccs.values())

    def add(self, counts: torch.Tensor, true: torch.Tensor, composition: str, chance: float) -> None:
        self.errors[composition] += (counts - true).abs().tolist()
        iacc = label_scores(counts, true)["iacc"]
        self.iaccs[composition].append(iacc)
        self.margins[composition].append(iacc - chance)

    def summary(self, level: float, compositions: Mapping[str, Composition], stack: Stack | None = None,
                ) -> Confidence:
        """Intervals from the larger per-composition quantile; expected vs chance per composition (the composition's
        own chance); informative only when every composition beats chance; the headline numbers those of the
        composition with the smallest margin."""
        measured = {name: Measured(len(self.iaccs[name]), statistics.fmean(self.iaccs[name]),
                                   compositions[name].chance_iacc, False, mean_interval(self.iaccs[name]))
                    for name in COMPOSITIONS if self.iaccs[name]}
        for name, m in measured.items():
            m.beats_chance = _beats(self.margins[name]) and m.margin > 0
        informative = bool(measured) and all(m.beats_chance for m in measured.values())
        worst = min(measured, key=lambda n: measured[n].margin) if measured else ""
        head = measured.get(worst, Measured(0, 0.0, 0.0, False))
        half_width = max(conformal_half_width(e, level) for e in self.errors.values() if e)
        return Confidence(level, half_width, head.expected_iacc, head.chance_iacc, informative, self.runs,
                          head.margin, stack, worst, measured, dict(compositions))


def _composition(i: int) -> str:
    """Simulated batch i: even ones uniform, odd ones Dirichlet(0.5)."""
    return COMPOSITIONS[i % 2]


def calibrate(ctx: Context, attacks: Sequence[Attack], simulations: int = SIMULATIONS, level: float = LEVEL,
              seed: int = 0, cache: CalibrationCache | None = None, stack: bool = False,
              ) -> tuple[dict[str, Confidence], str | None]:
    """Each attack's :class:`Confidence` for ``ctx``'s settings, and why there is none (one line) if there is not.
    ``cache`` (the caller's): calibrations reused for the same model weights, aux data and settings; None: none."""
    from gleak.attacks.context import build_context
    from gleak.io import tensors_sha256
    from gleak.metrics.labels import truth_counts
    from gleak.models.loading import LoadedModel
    from gleak.simulate.images import ClientConfig, simulate_client

    if ctx.aux is None:
        return {}, "not calibrated: needs auxiliary data (--aux) to simulate batches like the client's"
    if ctx.model is None or ctx.no_forward_reason:
        return {}, f"not calibrated: {ctx.no_forward_reason or 'needs the model'}"
    if not ctx.batch_size:
        return {}, "not calibrated: the batch size is unknown"
    if ctx.no_batch_forward_reason:  # simulating a client trains on batches of B: a fixed-batch export cannot
        return {}, f"not calibrated: the simulated clients' training {ctx.no_batch_forward_reason}"
    settings = client_settings(ctx)
    names = tuple(a.name for a in attacks)
    options = tuple(repr(a.used_options()) for a in attacks)
    sha = tensors_sha256(ctx.model.state_dict())  # the weights themselves, not an object id, key the cache
    key = (sha, ctx.aux.source, len(ctx.aux), id(ctx.aux), ctx.layer.name, repr(sorted(settings.items())), names,
           options, simulations, level, seed, stack)
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        return cached, None
    try:
        loaded = LoadedModel(ctx.model, "calibration", None, {}, ctx.input_shape, sha, {})
        tallies = {a.name: _Tally() for a in attacks}
        pool, stats = split_aux(ctx.aux, seed)
        total = settings["batch_size"] * settings["local_steps"]
        compositions = {name: composition(name, total, ctx.num_classes, pool.indices_by_class(), DIRICHLET_ALPHA,
                                          seed=seed + j) for j, name in enumerate(COMPOSITIONS)}
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        chance: list[float] = []
        for i in range(simulations):
            config = ClientConfig(**settings, composition=_composition(i), dirichlet_alpha=DIRICHLET_ALPHA,
                                  seed=seed + 7919 * i)
            capture, truth = simulate_client(ctx.model, pool, config)
            sim = build_context(capture, loaded, stats, ctx.device, seed + i, ctx.layer.name, loss=ctx.loss)
            true = truth_counts(truth.labels, ctx.num_classes)
            chance.append(chance_scores(true)["iacc"])
            found: dict[str, torch.Tensor] = {}
            for attack in attacks:
                result = run_attack(attack, sim)
                if result.status == "ok":
                    found[attack.name] = result.labels.counts
                    tallies[attack.name].add(found[attack.name], true, _composition(i), chance[-1])
            if stack:
                xs.append(stacking.features(sim, found, names))
                ys.append(true)
    except GleakError as e:
        return {}, f"not calibrated: simulating the client failed ({e})"
    # an attack that rarely runs in these settings gets no calibration rather than a weak one
    out = {name: t.summary(level, compositions) for name, t in tallies.items()
           if t.runs >= max(2, simulations // 2)}
    if stack and len(xs) >= 4:
        combined = _Tally()
        for i, counts in enumerate(stacking.out_of_fold(xs, ys, names, ctx.total_examples or 0)):
            combined.add(counts, ys[i], _composition(i), chance[i])
        out["stacked"] = combined.summary(level, compositions, stacking.fit(xs, ys, names))
    if cache is not None:
        cache.put(key, out)
    return out, None
