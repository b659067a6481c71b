"""A learned combination of the label attacks, fitted on contributions simulated like the capture (stacking).

Each label attack reads a different part of the last-layer gradient through a different approximation, and which
one is right changes with the model and the setting (docs/methods/label-recovery.md#calibrated). Stacking
(Wolpert, Neural Networks 1992; Breiman, Machine Learning 1996) fits one ridge regression of the true count of
class j on, per class,

* every attack's count n̂_j (an attack that did not run on a batch contributes the prior T/C),
* the raw last-layer statistics of the capture: the bias entry Δb_j, the row sum Σ_k ΔW_jk, the row read through
  the weights (ΔW·Wᵀ)_jj and through the mean auxiliary feature of class j (ΔW·H̄ᵀ)_jj, and ‖Δb‖₁,

over the K·C (batch, class) pairs of the K simulated contributions, with the weights shared by all classes. The
raw statistics carry what the attacks' closed forms discard (for multi-step updates only RLU applies, and the
regression learns how the update's bias and weight rows move with the counts at this model and learning rate).
Its own errors are measured out of fold (each simulated batch predicted by a fit that did not see it), so its
confidence is as honest as the single attacks'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from gleak.attacks.context import Context
from gleak.attacks.labels.counts import round_counts
from gleak.errors import GleakError

RIDGE = 1.0  # on standardised features; the fits have ≥ 10 rows per coefficient at the default K
FOLDS = 6


def features(ctx: Context, counts: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """[C, F] per-class features of one contribution: the raw statistics, then each named attack's counts."""
    layer, C = ctx.layer, ctx.num_classes
    if layer.grad_weight is None:
        raise GleakError("the capture has no last-layer tensor to combine the attacks on")
    gw = layer.grad_weight.double()
    gb = layer.grad_bias.double() if layer.grad_bias is not None else torch.zeros(C, dtype=torch.float64)
    h, _, y = ctx.aux_forward()
    h = h.double().flatten(1)
    onehot = torch.nn.functional.one_hot(y.long(), C).double()
    n = onehot.sum(0)
    means = torch.where((n > 0)[:, None], onehot.T @ h / n.clamp_min(1)[:, None], h.mean(0))  # absent class: overall
    prior = torch.full((C,), (ctx.total_examples or 0) / C, dtype=torch.float64)
    cols = [gb, gw.sum(1), (gw * layer.weight.double()).sum(1), (gw * means).sum(1), gb.abs().sum().expand(C)]
    cols += [counts[n].double() if n in counts else prior for n in names]
    return torch.stack(cols, 1)


@dataclass
class Stack:
    """Ridge weights on standardised features, with the standardisation."""

    names: tuple[str, ...]
    mean: torch.Tensor
    scale: torch.Tensor
    weights: torch.Tensor
    intercept: float

    def predict(self, x: torch.Tensor, total: int) -> torch.Tensor:
        """Counts that sum to ``total`` from one contribution's [C, F] features."""
        real = ((x - self.mean) / self.scale) @ self.weights + self.intercept
        return round_counts(real.numpy(), total)

    def counts_for(self, ctx: Context, found: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The combination's counts for ``ctx``, given the counts the combined attacks found on it."""
        return self.predict(features(ctx, found, self.names), ctx.total_examples or 0)


def fit(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], names: Sequence[str], ridge: float = RIDGE) -> Stack:
    """The ridge fit of the true counts on the features over all (batch, class) pairs."""
    x = torch.cat(list(xs)).double()
    y = torch.cat(list(ys)).double()
    mean, spread = x.mean(0), x.std(0)
    constant = spread <= 1e-12 * (1 + mean.abs())  # e.g. an attack that never ran: its ridge weight solves to 0
    scale = torch.where(constant, torch.ones_like(spread), spread)
    z = torch.where(constant[None, :], 0.0, (x - mean) / scale)
    intercept = float(y.mean())
    gram = z.T @ z + ridge * torch.eye(z.shape[1], dtype=torch.float64)
    weights = torch.linalg.solve(gram, z.T @ (y - intercept))
    return Stack(tuple(names), mean, scale, weights, intercept)


def out_of_fold(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], names: Sequence[str], total: int,
                folds: int = FOLDS) -> list[torch.Tensor]:
    """Each simulated batch's counts predicted by a fit on the other folds (interleaved folds of batches)."""
    k = min(folds, len(xs))
    out: list[torch.Tensor] = [torch.empty(0)] * len(xs)
    for f in range(k):
        train = [i for i in range(len(xs)) if i % k != f]
        model = fit([xs[i] for i in train], [ys[i] for i in train], names)
        for i in range(f, len(xs), k):
            out[i] = model.predict(xs[i], total)
    return out


__all__ = ["Stack", "features", "fit", "out_of_fold"]
