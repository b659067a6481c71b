"""The span test of a linear layer's gradient (METHODS-text §1.4, §3.2–§3.3; DAGER, Petrov et al., NeurIPS 2024).

For a linear layer y = W u, the weight gradient is ∇W = Σ_t δ_t u_tᵀ: every row of ∇W lies in span{u_t}, the span
of the inputs the layer saw. When there are fewer distinct inputs than the input width, that span is a strict
subspace, and a candidate input u belongs to the batch exactly when it lies in it. What this module does:

* :func:`row_space` — an orthonormal basis of the row space of a gradient [n_out, d], in float64, with the rank at
  the largest gap of the log singular values (among those above 1e-12 of the largest: below that is rounding);
  the gap's ratio says how clear the rank is (a small gap: the budget is violated, or the gradient is noisy).
* :func:`residuals` — the relative residual ‖u − Π u‖ / ‖u‖ of every candidate row, streamed in blocks.
* :func:`gap_threshold` — where to cut sorted residuals: the largest log-gap among those below ``ceiling``
  (true inputs sit at the float64 floor, others near 1), with the gap's ratio as its confidence.

Shared by the LoRA token attack (:mod:`gleak.attacks.tokens.lora`) and the sentence reconstruction built on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gleak.attacks.tokens.bag import row_blocks

SV_FLOOR = 1e-12  # singular values below this share of the largest are rounding (float64)
SCREEN = 0.1  # residuals the float32 screen puts below this are computed again in float64


@dataclass(frozen=True, kw_only=True)
class RowSpace:
    """An orthonormal basis [r, d] (float64) of a gradient's row space, its rank, the input width d, and the ratio
    s_r / s_(r+1) at the chosen rank (inf when the rank is the full width or every other value is rounding)."""

    basis: torch.Tensor
    rank: int
    width: int
    gap: float
    singular_values: torch.Tensor

    @property
    def full(self) -> bool:
        """The span fills the input space: every vector lies in it, so membership tells nothing."""
        return self.rank >= self.width


def row_space(grad: torch.Tensor, max_rank: int | None = None, min_gap: float = 10.0) -> RowSpace:
    """The row space of ``grad`` [n_out, d] (any float dtype; computed in float64).

    The rank is where the sorted singular values drop the most in log scale, counting the drop from the last value
    above :data:`SV_FLOOR`·s₁ to the floor; when no drop reaches ``min_gap``, every value above the floor counts
    (a full-rank gradient: the gap reported is the largest one seen). ``max_rank`` caps it (DAGER keeps the span
    below the width: §3.2)."""
    g = grad.detach().to(torch.float64).reshape(grad.shape[0], -1)
    d = int(g.shape[1])
    _, s, vh = torch.linalg.svd(g, full_matrices=False)
    top = float(s[0]) if len(s) else 0.0
    if top <= 0:
        return RowSpace(basis=torch.zeros(0, d, dtype=torch.float64), rank=0, width=d, gap=math.inf,
                        singular_values=s)
    floor = SV_FLOOR * top
    above = int((s > floor).sum())
    values = [float(v) for v in s[:above]] + ([max(float(s[above]), floor)] if above < len(s) else [])
    ratios = [values[i] / values[i + 1] for i in range(len(values) - 1)]  # ratios[i]: rank i + 1
    if max_rank is not None:
        ratios = ratios[:max_rank]
    cap = min(above, max_rank) if max_rank is not None else above
    best = max(range(len(ratios)), key=lambda i: ratios[i]) if ratios else None
    if best is None or ratios[best] < min_gap:
        rank, gap = cap, (ratios[best] if best is not None else math.inf)
    else:
        rank, gap = best + 1, ratios[best]
    return RowSpace(basis=vh[:rank].clone(), rank=rank, width=d, gap=gap, singular_values=s)


def residuals(space: RowSpace, candidates: torch.Tensor, chunk_bytes: int = 64 * 2**20) -> torch.Tensor:
    """‖u − Π u‖ / ‖u‖ for every row u of ``candidates`` [N, d] (float64 [N]; 1 for a zero row).

    A float32 screen (√(‖u‖² − ‖Bu‖²), one product) comes first; rows it puts below :data:`SCREEN` are computed
    again exactly in float64 (the screen loses small residuals to cancellation, about 1e-3 at worst), rows above
    keep the screen's value, good to about 1e-5 there. Every cut placed on these residuals lies far below it."""
    out = torch.empty(candidates.shape[0], dtype=torch.float64)
    basis = space.basis
    screen_basis = basis.float()
    for first, block in row_blocks(candidates, chunk_bytes):
        norm = block.norm(dim=1)
        found = torch.ones_like(norm)
        if space.rank:
            single = block.float()
            inside = (single @ screen_basis.T).square().sum(1).double()
            found = ((norm.square() - inside).clamp_min(0).sqrt() / norm.clamp_min(1e-300)).clamp_max(1.0)
            close = (found < SCREEN).nonzero().flatten()
            if len(close):
                rows = block[close]
                rest = rows - (rows @ basis.T) @ basis
                found[close] = rest.norm(dim=1) / norm[close].clamp_min(1e-300)
        out[first:first + len(block)] = torch.where(norm > 0, found, 1.0)
    return out


def gap_threshold(dist: torch.Tensor, ceiling: float = 1e-2) -> tuple[float, float]:
    """(τ, ratio): accept residuals below τ, placed in the largest log-gap between consecutive sorted residuals
    that lie below ``ceiling``·max (plus the first one above it); ratio = the gap's width (1 when nothing is below
    the ceiling). τ is the geometric middle of the gap."""
    s = torch.sort(dist.double()).values
    if len(s) == 0:
        return 0.0, 1.0
    top = float(s[-1])
    low = int((s < ceiling * max(top, 1e-300)).sum())
    if low == 0:
        return 0.0, 1.0
    window = s[:min(low + 1, len(s))].clamp_min(1e-300)
    if len(window) == 1:
        return float(window[0]) * 2, math.inf
    logs = torch.log(window)
    steps = logs[1:] - logs[:-1]
    k = int(torch.argmax(steps))
    tau = math.exp(float((logs[k] + logs[k + 1]) / 2))
    return tau, math.exp(float(steps[k]))
