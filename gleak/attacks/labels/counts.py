"""Label maths shared by every label attack (one place, DESIGN §3).

* :func:`row_sums` — g_i = Σ_k ∇W[i, k], the per-class signal of iDLG / LLG / ZLG.
* :func:`round_counts` — real-valued counts to non-negative integers that sum exactly to the batch size.
* :func:`logit_grads` — per-example ∂ℓ_n/∂z_n for the capture's loss (CE, focal, BCE; τ, ε), so that attacks
  can form last-layer gradients of any simulated batch without a backward pass through the model:
  ∇W = Σ_n w_n (∂ℓ_n/∂z_n) h_nᵀ and ∇b = Σ_n w_n ∂ℓ_n/∂z_n, with w_n = 1/B for mean reduction.
* :func:`softmax_stats` — per-class positive/negative posteriors and logit means/covariances on labelled data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gleak.losses import LossSpec, client_loss


def row_sums(grad_weight: torch.Tensor) -> torch.Tensor:
    """g_i = Σ_k ∇W[i, k] in float64 (LLG Eq. 7, iDLG)."""
    return grad_weight.double().sum(dim=1)


def round_counts(real: torch.Tensor | np.ndarray, total: int) -> torch.Tensor:
    """Non-negative integers n with Σn = ``total`` that stay as close as possible to ``real``.

    Negative and non-finite entries count as 0. Largest-remainder rounding: floor first, then hand the
    missing units to the largest fractional remainders r − n; when the floors already exceed ``total``
    (the real counts sum to more than B), take units back from the smallest remainders among n ≥ 1.
    Every step moves one unit where |n − r| grows least, which minimises Σ|n − r| (a separable convex cost).
    """
    r = torch.as_tensor(np.asarray(real, dtype=np.float64)).clone()
    r[~torch.isfinite(r)] = 0.0
    r = r.clamp_min(0.0)
    if total < 0:
        raise ValueError("total must be ≥ 0")
    n = torch.floor(r)
    n = torch.minimum(n, torch.full_like(n, float(total)))
    deficit = int(total - n.sum().item())
    while deficit > 0:
        take = min(deficit, len(n))
        order = torch.argsort(r - n, descending=True, stable=True)
        n[order[:take]] += 1
        deficit -= take
    while deficit < 0:
        remainder = torch.where(n > 0, r - n, torch.full_like(r, float("inf")))
        candidates = int((n > 0).sum())
        take = min(-deficit, candidates)
        order = torch.argsort(remainder, stable=True)
        n[order[:take]] -= 1
        deficit += take
    return n.long()


def logit_grads(logits: torch.Tensor, labels: torch.Tensor, loss: LossSpec) -> torch.Tensor:
    """∂ℓ_n/∂z_n for every example (unreduced), for the loss exactly as :mod:`gleak.losses` defines it."""
    z = logits.detach().double().requires_grad_(True)
    per_example_sum = client_loss(z, labels, LossSpec(loss.name, "sum", loss.temperature, loss.label_smoothing,
                                                      loss.focal_gamma, loss.focal_alpha))
    (grad,) = torch.autograd.grad(per_example_sum, z)
    return grad


def batch_row_sums(dz: torch.Tensor, feature_sums: torch.Tensor, batch_index: torch.Tensor, num_batches: int,
                   weight: float) -> torch.Tensor:
    """Row sums of the last-layer gradient of many simulated batches at once: [num_batches, C].

    ``dz`` [N, C] per-example logit gradients, ``feature_sums`` [N] = Σ_k h_nk, ``batch_index`` [N] the batch of
    each example, ``weight`` the reduction factor (1/B for mean).
    """
    out = torch.zeros(num_batches, dz.shape[1], dtype=torch.float64)
    out.index_add_(0, batch_index, dz.double() * feature_sums.double()[:, None])
    return out * weight


@dataclass(frozen=True)
class SoftmaxStats:
    """Per-class statistics of the model on labelled (auxiliary) data, temperature applied."""

    positive: torch.Tensor  # p̂_j⁺ = mean over examples of class j of softmax(z/τ)_j        [C]
    negative: torch.Tensor  # p̂_j⁻ = mean over examples not of class j of softmax(z/τ)_j    [C]
    mean_prob: torch.Tensor  # mean softmax vector over all examples                          [C]
    logit_mean: torch.Tensor  # per-class mean logit vector μ_c                               [C, C]
    logit_cov: torch.Tensor  # per-class logit covariance Σ_c                                 [C, C, C]
    present: torch.Tensor  # classes with at least one example                                [C] bool
    feature_sum_mean: float  # Ō = mean over examples of Σ_k h_k


def softmax_stats(logits: torch.Tensor, labels: torch.Tensor, feature_sums: torch.Tensor, num_classes: int,
                  temperature: float = 1.0) -> SoftmaxStats:
    z = logits.double()
    p = torch.softmax(z / temperature, dim=1)
    onehot = torch.nn.functional.one_hot(labels, num_classes).bool()
    count_pos = onehot.sum(0)
    count_neg = len(labels) - count_pos
    positive = torch.where(onehot, p, 0).sum(0) / count_pos.clamp_min(1)
    negative = torch.where(~onehot, p, 0).sum(0) / count_neg.clamp_min(1)
    means = torch.zeros(num_classes, num_classes, dtype=torch.float64)
    covs = torch.zeros(num_classes, num_classes, num_classes, dtype=torch.float64)
    for c in range(num_classes):
        zc = z[labels == c]
        if len(zc):
            means[c] = zc.mean(0)
        if len(zc) > 1:
            covs[c] = torch.cov(zc.T)
    return SoftmaxStats(positive, negative, p.mean(0), means, covs, count_pos > 0,
                        float(feature_sums.double().mean()))
