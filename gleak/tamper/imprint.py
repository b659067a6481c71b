"""The server's closed-form inversion of an imprinted layer (Fowl et al., ICLR 2022, §3; METHODS-server §2, §3.1).

For a linear layer y = Wx + b, ∇W_i = Σ_s δ_{s,i} x_sᵀ and ∇b_i = Σ_s δ_{s,i}. The imprint's rows share one
direction and fire for h·x > c_i; with equal upstream weights, sorting the rows by threshold and differencing
adjacent rows leaves, in each bin, the samples whose measurement falls between two thresholds, and a bin that
holds one sample gives it exactly: x = Δ∇W / Δ∇b. Scale-free: the same holds for a FedAvg update (−η Σ ∇), as long
as each sample stays alone in its bin over the local steps.

The rows come from the global model itself (the duplicate-row cluster the check finds), so no secret is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gleak.errors import GleakError

EMPTY = 1e-9  # a bin whose bias difference is below this share of the largest carries no sample
MAX_ROWS = 4096  # rows of a sparse trap compared pairwise (those with the smallest |∇b|, single examples first)


@dataclass(frozen=True)
class Recovered:
    """Inputs read from single bins (rows, flattened), the bins they came from, and how many bins held anything."""

    inputs: torch.Tensor
    bins: list[int]
    occupied: int


def imprint_rows(weight: torch.Tensor, min_rows: int = 4, level: float = 0.999) -> list[int]:
    """The largest set of rows of ``weight`` parallel to one another (cos ≥ ``level``): the imprint's bins."""
    w = weight.detach().double()
    norms = w.norm(dim=1)
    live = (norms > 0).nonzero().flatten()
    if len(live) < min_rows:
        return []
    unit = w[live] / norms[live, None]
    gram = unit @ unit.T
    members = (gram >= level).sum(1)
    best = int(members.argmax())
    rows = live[(gram[best] >= level)].tolist()
    return rows if len(rows) >= min_rows else []


def bin_differences(weight: torch.Tensor, bias: torch.Tensor, grad_w: torch.Tensor, grad_b: torch.Tensor,
                    rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bins of the imprint rows ``rows`` (global ``weight``/``bias``; the layer's gradient or update
    ``grad_w``/``grad_b``): rows ordered by their threshold −b_i/‖w_i‖, each minus the next one (the last as is).
    Returns (Δ∇W, Δ∇b, the rows in that order), float64; Δ∇W/Δ∇b is the bin's example when it holds one."""
    idx = torch.tensor(rows)
    threshold = -bias.detach().double()[idx] / weight.detach().double()[idx].norm(dim=1)
    ordered = idx[torch.argsort(threshold)]
    gw, gb = grad_w.detach().double()[ordered], grad_b.detach().double()[ordered]
    dw = gw - torch.cat([gw[1:], torch.zeros_like(gw[:1])])
    db = gb - torch.cat([gb[1:], torch.zeros_like(gb[:1])])
    return dw, db, ordered


def invert(weight: torch.Tensor, bias: torch.Tensor, grad_w: torch.Tensor, grad_b: torch.Tensor, rows: list[int],
           batch_size: int | None = None) -> Recovered:
    """Inputs from the imprint rows ``rows`` of a layer (:func:`bin_differences`): each bin with a non-zero bias
    difference divided out; with ``batch_size``, at most that many are kept (those with the largest bias
    difference, breaching's default keeps the smallest |mean ∇W|)."""
    if len(rows) < 2:
        raise GleakError("no imprint rows in this layer (fewer than two parallel rows)")
    dw, db, ordered = bin_differences(weight, bias, grad_w, grad_b, rows)
    scale = float(db.abs().max()) if len(db) else 0.0
    if scale == 0.0:
        raise GleakError("the imprint rows carry no gradient: no sample fired them")
    hit = (db.abs() > EMPTY * scale).nonzero().flatten()
    if batch_size is not None and len(hit) > batch_size:
        hit = hit[torch.argsort(db[hit].abs(), descending=True)[:batch_size]]
        hit = torch.sort(hit).values
    inputs = dw[hit] / db[hit, None]
    return Recovered(inputs=inputs, bins=ordered[hit].tolist(), occupied=len(hit))


def invert_rows(grad_w: torch.Tensor, grad_b: torch.Tensor, limit: int | None = None, agree: float = 1e-4
                ) -> tuple[torch.Tensor, list[int]]:
    """Sparse traps (trap weights, Boenisch et al., EuroS&P 2023): every row that fired gives ∇W_j / ∇b_j, one
    example exactly when it fired for that example alone, a blend otherwise. Rows that fired for the same examples
    agree (exactly, when the next layer reads them with equal weights), so candidates are merged within ``agree``
    (relative) and ranked by how many rows support them, then by the smallest |∇b| (breaching's choice); at most
    ``limit`` are kept. Agreement ranks, it does not prove: only the truth says which came back exactly. Returns
    the inputs and each one's supporting row count."""
    gw, gb = grad_w.detach().double(), grad_b.detach().double()
    live = (gb.abs() > EMPTY * float(gb.abs().max().clamp_min(1e-300))).nonzero().flatten()
    if len(live) == 0:
        raise GleakError("no row of the trap layer fired: the update carries no example")
    live = live[torch.argsort(gb[live].abs())][:MAX_ROWS]  # the smallest |∇b| first: single examples
    ratios = gw[live] / gb[live, None]
    norms = ratios.norm(dim=1).clamp_min(1e-300)
    near = torch.cdist(ratios, ratios) <= agree * norms[:, None]
    label = torch.arange(len(ratios))
    while True:  # connected components of "agrees with": every member takes the smallest index it reaches
        spread = torch.where(near, label[None, :], len(ratios)).min(1).values
        if torch.equal(spread, label):
            break
        label = spread
    groups = torch.unique(label)
    support = [(int((label == g).sum()), int(g)) for g in groups.tolist()]
    support.sort(key=lambda t: (-t[0], t[1]))
    support = support[:limit]
    return ratios[torch.tensor([g for _, g in support])], [n for n, _ in support]
