"""Label maths shared by every label attack, in one place (docs/methods/label-recovery.md#notation).

* :func:`row_sums` — g_i = Σ_k ∇W[i, k], the per-class signal of iDLG / LLG / ZLG.
* :func:`round_counts` — real-valued counts to non-negative integers that sum exactly to the batch size.
* :func:`logit_grads` — per-example ∂ℓ_n/∂z_n for the capture's loss (CE, focal, BCE; τ, ε), so that attacks
  can form last-layer gradients of any simulated batch without a backward pass through the model:
  ∇W = Σ_n w_n (∂ℓ_n/∂z_n) h_nᵀ and ∇b = Σ_n w_n ∂ℓ_n/∂z_n, with w_n = 1/B for mean reduction.
* :func:`class_posteriors`, :func:`class_logit_stats` — per-class posteriors and logit means/covariances on
  labelled (auxiliary) data, for the posterior attack and RLU.
"""

from __future__ import annotations

import numpy as np
import torch

from gleak.losses import LossSpec, client_loss


def row_sums(grad_weight: torch.Tensor) -> torch.Tensor:
    """g_i = Σ_k ∇W[i, k] in float64 (Wainakh et al., PoPETs 2022, Property 2; iDLG)."""
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


def class_posteriors(probs: torch.Tensor, labels: torch.Tensor,
                     num_classes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p̂_j⁺ (mean prob of class j over examples of class j), p̂_j⁻ (over the others), and the class counts."""
    p = probs.double()
    onehot = torch.nn.functional.one_hot(labels, num_classes).bool()
    n_pos = onehot.sum(0)
    positive = torch.where(onehot, p, 0).sum(0) / n_pos.clamp_min(1)
    negative = torch.where(~onehot, p, 0).sum(0) / (len(labels) - n_pos).clamp_min(1)
    return positive, negative, n_pos


def class_logit_stats(logits: torch.Tensor, labels: torch.Tensor,
                      num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class logit means μ [C, C] and covariances Σ [C, C, C] (RLU Assumption 3.1); classes without
    examples get the overall mean and covariance."""
    z = logits.double()
    C = num_classes
    mean = torch.empty(C, C, dtype=torch.float64)
    cov = torch.empty(C, C, C, dtype=torch.float64)
    overall_mean = z.mean(0)
    overall_cov = torch.cov(z.T) if len(z) > 1 else torch.zeros(C, C, dtype=torch.float64)
    for n in range(C):
        zn = z[labels == n]
        mean[n] = zn.mean(0) if len(zn) else overall_mean
        cov[n] = torch.cov(zn.T) if len(zn) > 1 else overall_cov
    return mean, cov
