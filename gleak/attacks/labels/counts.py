"""Label maths shared by every label attack, in one place (docs/methods/label-recovery.md#notation).

* :func:`row_sums` — g_i = Σ_k ∇W[i, k], the per-class signal of iDLG / LLG / ZLG.
* :func:`round_counts` — real-valued counts to non-negative integers that sum exactly to the batch size.
* :func:`logit_grads` — per-example ∂ℓ_n/∂z_n for the capture's loss (CE, focal, BCE; τ, ε), so that attacks
  can form last-layer gradients of any simulated batch without a backward pass through the model:
  ∇W = Σ_n w_n (∂ℓ_n/∂z_n) h_nᵀ and ∇b = Σ_n w_n ∂ℓ_n/∂z_n, with w_n = 1/B for mean reduction.
* :func:`affine_logit_grads` — ∂ℓ/∂z = a_n − c·e_y for losses affine in the one-hot label (CE, BCE), so that
  the gradient under every label comes from one a_n instead of C evaluations.
* :func:`class_posteriors`, :func:`mean_posterior` — per-class and mean posteriors on labelled (auxiliary) data,
  for the posterior attack and ZLG.

Working sets are bounded: functions that would hold [N, C] doubles for large N stream in chunks of about
:data:`CHUNK_BYTES`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from gleak.losses import LossSpec, client_loss

CHUNK_BYTES = 64 * 2**20  # the working set of one streamed chunk (logit gradients of many simulated examples)
ALL_CANDIDATES_MAX_C = 1024  # up to this C, the count systems keep every class as an unknown


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
    per_example_sum = client_loss(z, labels, LossSpec(name=loss.name, reduction="sum", temperature=loss.temperature,
                                                      label_smoothing=loss.label_smoothing,
                                                      focal_gamma=loss.focal_gamma, focal_alpha=loss.focal_alpha))
    (grad,) = torch.autograd.grad(per_example_sum, z)
    return grad


def candidate_count(num_classes: int, examples: int, limit: int | None = None) -> int:
    """How many classes :func:`candidate_classes` keeps (what memory estimates need before any work)."""
    k = limit or (num_classes if num_classes <= ALL_CANDIDATES_MAX_C else max(ALL_CANDIDATES_MAX_C, 4 * examples))
    return min(k, num_classes)


def candidate_classes(score: torch.Tensor, examples: int, limit: int | None = None) -> torch.Tensor:
    """The classes a large-C attack solves for, ascending: all of them up to :data:`ALL_CANDIDATES_MAX_C` (or
    ``limit``), else the ``limit`` (default 4 × ``examples``, at least :data:`ALL_CANDIDATES_MAX_C`) with the
    largest ``score`` — evidence that the class is in the batch, e.g. −∇b_j. At most ``examples`` classes can be
    present, so a few times that many keep every present class while the systems stay [C, K] instead of [C, C]."""
    C = len(score)
    k = candidate_count(C, examples, limit)
    if k >= C:
        return torch.arange(C)
    return torch.sort(torch.topk(score.double(), k).indices).values


def affine_logit_grads(logits: torch.Tensor, loss: LossSpec) -> tuple[torch.Tensor, float] | None:
    """(a [N, C], c) with ∂ℓ_n/∂z_n = a_n − c·e_i for every label i, or None when the loss is not affine in the
    one-hot label (focal). Derived from :func:`logit_grads` itself (two labels), and checked, so that it follows
    the loss definitions exactly: cross-entropy and BCE give a = (softmax or σ(z/τ) − ε/C)/τ, c = (1 − ε)/τ."""
    if loss.name == "focal" or logits.shape[1] < 2:
        return None
    n = len(logits)
    first = logit_grads(logits, torch.zeros(n, dtype=torch.long), loss)
    second = logit_grads(logits, torch.ones(n, dtype=torch.long), loss)
    c = float((second[:, 0] - first[:, 0]).mean()) if n else 1.0
    a = second.clone()
    a[:, 1] += c
    expected = a.clone()
    expected[:, 0] -= c
    scale = float(first.abs().max()) if n else 0.0
    if not torch.allclose(first, expected, rtol=0, atol=1e-9 * (1 + scale)):
        return None  # not affine after all: the caller takes the exact, slower path
    return a, c


def batch_row_sums(dz: torch.Tensor, feature_sums: torch.Tensor, batch_index: torch.Tensor, num_batches: int,
                   weight: float) -> torch.Tensor:
    """Row sums of the last-layer gradient of many simulated batches at once: [num_batches, C].

    ``dz`` [N, C] per-example logit gradients, ``feature_sums`` [N] = Σ_k h_nk, ``batch_index`` [N] the batch of
    each example, ``weight`` the reduction factor (1/B for mean).
    """
    out = torch.zeros(num_batches, dz.shape[1], dtype=torch.float64)
    out.index_add_(0, batch_index, dz.double() * feature_sums.double()[:, None])
    return out * weight


def posterior_chunks(logits: torch.Tensor, temperature: float = 1.0,
                     bce: bool = False) -> Iterator[tuple[slice, torch.Tensor]]:
    """(rows, posteriors) of ``logits`` [N, C] in chunks of about :data:`CHUNK_BYTES`: softmax(z/τ) (σ(z/τ) for
    BCE) in float64, so that no [N, C] float64 copy of a large auxiliary set is ever held."""
    n, width = logits.shape
    step = max(1, CHUNK_BYTES // (max(width, 1) * 8 * 3))
    for first in range(0, n, step):
        rows = slice(first, min(n, first + step))
        zz = logits[rows].double() / temperature
        yield rows, torch.sigmoid(zz) if bce else torch.softmax(zz, dim=1)


def mean_posterior(logits: torch.Tensor, temperature: float = 1.0, bce: bool = False) -> torch.Tensor:
    """p̄_j: the posterior of class j averaged over all rows of ``logits`` (streamed)."""
    total = torch.zeros(logits.shape[1], dtype=torch.float64)
    for _, p in posterior_chunks(logits, temperature, bce):
        total += p.sum(0)
    return total / max(len(logits), 1)


def class_posteriors(logits: torch.Tensor, labels: torch.Tensor, num_classes: int, temperature: float = 1.0,
                     bce: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p̂_j⁺ (mean posterior of class j over examples of class j), p̂_j⁻ (over the others), and the class counts,
    from logits (posteriors as :func:`posterior_chunks`, streamed)."""
    n_pos = torch.bincount(labels, minlength=num_classes)
    own = torch.zeros(num_classes, dtype=torch.float64)
    total = torch.zeros(num_classes, dtype=torch.float64)
    for rows, p in posterior_chunks(logits, temperature, bce):
        y = labels[rows]
        own.index_add_(0, y, p[torch.arange(len(y)), y])
        total += p.sum(0)
    positive = own / n_pos.clamp_min(1)
    negative = (total - own) / (len(labels) - n_pos).clamp_min(1)
    return positive, negative, n_pos
