"""How sure a label attack is, measured rather than assumed: split-conformal count intervals from self-simulation.

For one capture, gleak simulates ``K`` client contributions with the capture's own settings (the global model, B,
m, learning rate, optimizer, loss, train/eval mode) on batches drawn from the auxiliary data — half with uniform
labels, half Dirichlet(0.5)-skewed, as non-IID clients are — runs each label attack on them, and measures its
errors against the simulated truth:

* ``half_width`` q: the split-conformal quantile of |n̂_j − n_j| over the simulated (batch, class) pairs, so that
  [n̂_j − q, n̂_j + q] holds the true count with probability ≥ ``level`` when the real batch is drawn like the
  simulated ones (Vovk, Gammerman & Shafer, 2005; the split-conformal rule of Lei et al., JASA 2018). It is
  computed for the uniform and for the Dirichlet batches separately and the larger one is kept: a pooled
  quantile holds on average over the two, but under-covers whichever is harder (measured: 0.77–0.80 on skewed
  batches of trained models at a nominal 0.90), and a real client is one or the other;
* ``expected_iacc`` and ``chance_iacc``: the attack's mean iAcc on the simulated batches and the mean chance iAcc
  of the same batches; ``informative`` is False unless the attack beats chance by more than two standard errors
  on the uniform batches *and* on the Dirichlet ones (chance differs a lot between them: 0.87 vs 0.54 for m = 5
  steps of B = 32, so an attack can beat one and not the other). An uninformative attack's counts are no evidence
  of a leak, whatever they look like.

The simulated batches are drawn from one half of the auxiliary data (per class) and the attacks read their
statistics from the other half, as they do on a real capture, whose examples are not in the aux data: with one
pool for both, the attacks' class statistics would contain the very examples of the batch (at B = 128 a skewed
batch holds half the aux examples of its main class), and the measured errors would be too small.

With ``stack=True`` a learned combination of the attacks (:mod:`gleak.attacks.labels.stacking`) is calibrated
too, as the entry ``"stacked"``, from out-of-fold predictions; its fit on all K batches is kept in ``.stack``.

The calibration depends on the model and the settings, not on the captured values, so it is computed once per
(model, aux data, settings) and reused for every capture that shares them (``cache``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gleak.attacks.base import Attack, run_attack
from gleak.attacks.context import Context
from gleak.attacks.labels import stacking
from gleak.attacks.labels.stacking import Stack
from gleak.data import Dataset
from gleak.errors import GleakError
from gleak.metrics.labels import label_scores

LEVEL = 0.9
COMPOSITIONS = ("uniform", "dirichlet")
SIMULATIONS = 24
CACHE_ENTRIES = 16


@dataclass
class Confidence:
    """One attack's calibration for one (model, aux data, settings)."""

    level: float
    half_width: int
    expected_iacc: float
    chance_iacc: float
    informative: bool
    simulations: int
    worst_margin: float = 0.0  # the smaller of (iAcc − chance) over the uniform and the Dirichlet batches
    stack: Stack | None = None  # the "stacked" entry: the fitted combination

    def intervals(self, counts: torch.Tensor, total: int) -> list[list[int]]:
        """[low, high] per class: n̂_j ± q, clipped to [0, total]."""
        q = self.half_width
        return [[max(0, int(c) - q), min(total, int(c) + q)] for c in counts.tolist()]

    def to_json(self, counts: torch.Tensor | None = None, total: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "half_width": self.half_width,
                               "expected_iacc": round(self.expected_iacc, 4), "chance_iacc": round(self.chance_iacc, 4),
                               "informative": self.informative, "simulations": self.simulations,
                               "worst_margin": round(self.worst_margin, 4)}
        if counts is not None and total is not None:
            out["intervals"] = self.intervals(counts, total)
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


def _beats(margins: Sequence[float]) -> bool:
    """Mean margin over chance above zero by more than two standard errors."""
    mean = statistics.fmean(margins)
    spread = statistics.stdev(margins) if len(margins) > 1 else 0.0
    return mean > 0 and mean > 2 * spread / math.sqrt(len(margins))


def _settings(ctx: Context) -> dict[str, Any]:
    """The ClientConfig fields that reproduce the capture's client (without seed and composition)."""
    cap = ctx.capture
    update = ctx.kind == "update"
    optimizer = cap.get("gleak.optimizer") or "sgd"
    return {"batch_size": int(ctx.batch_size or 1), "local_steps": int(ctx.local_steps or 1),
            "scheme": "fedavg" if update else "fedsgd",
            "learning_rate": float(cap.get("gleak.learning_rate") or 0.01),
            "optimizer": optimizer if update else "sgd",
            "momentum": float(cap.value("gleak.momentum")) if update and optimizer in ("sgdm", "nag") else 0.9,
            "weight_decay": float(cap.value("gleak.weight_decay") or 0.0) if update else 0.0,
            "loss": ctx.loss, "train_mode": bool(cap.value("gleak.model.train_mode"))}


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
    """One candidate's record on the simulated batches: errors and margins over chance by composition, iAcc."""

    errors: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in COMPOSITIONS})
    margins: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in COMPOSITIONS})
    iacc: list[float] = field(default_factory=list)
    chance: list[float] = field(default_factory=list)

    def add(self, counts: torch.Tensor, true: torch.Tensor, composition: str, chance: float) -> None:
        self.errors[composition] += (counts - true).abs().tolist()
        self.iacc.append(label_scores(counts, true)["iacc"])
        self.chance.append(chance)
        self.margins[composition].append(self.iacc[-1] - chance)

    def summary(self, level: float, stack: Stack | None = None) -> Confidence:
        """Intervals from the larger per-composition quantile; informative only when both compositions beat chance."""
        groups = [m for m in self.margins.values() if m]
        informative = bool(groups) and all(_beats(m) for m in groups)
        worst = min(statistics.fmean(m) for m in groups) if groups else 0.0
        half_width = max(conformal_half_width(e, level) for e in self.errors.values() if e)
        return Confidence(level, half_width, statistics.fmean(self.iacc), statistics.fmean(self.chance), informative,
                          len(self.iacc), worst, stack)


def _composition(i: int) -> str:
    """Simulated batch i: even ones uniform, odd ones Dirichlet(0.5)."""
    return COMPOSITIONS[i % 2]


def calibrate(ctx: Context, attacks: Sequence[Attack], simulations: int = SIMULATIONS, level: float = LEVEL,
              seed: int = 0, cache: dict[tuple[Any, ...], dict[str, Confidence]] | None = None, stack: bool = False,
              ) -> tuple[dict[str, Confidence], str | None]:
    """Each attack's :class:`Confidence` for ``ctx``'s settings, and why there is none (one line) if there is not."""
    from gleak.attacks.context import build_context
    from gleak.io import tensors_sha256
    from gleak.metrics.labels import chance_scores, truth_counts
    from gleak.models.loading import LoadedModel
    from gleak.simulate import ClientConfig, simulate_client

    if ctx.aux is None:
        return {}, "not calibrated: needs auxiliary data (--aux) to simulate batches like the client's"
    if ctx.model is None or ctx.no_forward_reason:
        return {}, f"not calibrated: {ctx.no_forward_reason or 'needs the model'}"
    if not ctx.batch_size:
        return {}, "not calibrated: the batch size is unknown"
    settings = _settings(ctx)
    names = tuple(a.name for a in attacks)
    options = tuple(repr(a.used_options()) for a in attacks)
    sha = tensors_sha256(ctx.model.state_dict())  # the weights themselves, not an object id, key the cache
    key = (sha, ctx.aux.source, len(ctx.aux), id(ctx.aux), ctx.layer.name, repr(sorted(settings.items())), names,
           options, simulations, level, seed, stack)
    if cache is not None and key in cache:
        return cache[key], None
    try:
        loaded = LoadedModel(ctx.model, "calibration", None, {}, ctx.input_shape, sha, {})
        tallies = {a.name: _Tally() for a in attacks}
        pool, stats = split_aux(ctx.aux, seed)
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        chance: list[float] = []
        for i in range(simulations):
            config = ClientConfig(**settings, composition=_composition(i), seed=seed + 7919 * i)
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
    out = {name: t.summary(level) for name, t in tallies.items() if len(t.iacc) >= max(2, simulations // 2)}
    if stack and len(xs) >= 4:
        combined = _Tally()
        for i, counts in enumerate(stacking.out_of_fold(xs, ys, names, ctx.total_examples or 0)):
            combined.add(counts, ys[i], _composition(i), chance[i])
        out["stacked"] = combined.summary(level, stacking.fit(xs, ys, names))
    if cache is not None:
        if len(cache) >= CACHE_ENTRIES:
            cache.pop(next(iter(cache)))
        cache[key] = out
    return out, None
