"""Token-recovery maths on [V, d] gradient matrices, streamed over the vocabulary (docs/methods/tokens.md).

Every function reads a stored matrix (float32, bf16 or float64) a block of rows at a time, converts the block to
float64 and keeps only per-row values ([V] float64 vectors) and, for the tied separation, a d × d float64 Gram
matrix. Peak extra memory is therefore about ``chunk_bytes`` + 8·(a few V) + 8·d² bytes (+ 8·d·r for the basis),
never a float64 copy of the matrix, never V × V or (B·T) × V.

* :func:`row_stats` — per-row max |·| and Euclidean norm.
* :func:`log_gap_cut` — how many of the largest scores stand apart: the largest gap of the sorted scores in log
  scale (§2.2(b)).
* :func:`head_subspace`, :func:`residual_ratios` — §2.2(a): an orthonormal basis of 𝓗 = span{h} from reference rows
  (SVD through the Gram matrix, rank at the largest singular-value gap) and ρ_v = ‖(I − Π)g_v‖ / ‖g_v‖.
* :func:`untied_bag`, :func:`tied_bag`, :func:`head_targets`, :func:`position_lengths` — §2.1–§2.4.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

CHUNK_BYTES = 64 * 2**20  # float64 working block of rows
TINY = 1e-300
# Singular values from the float64 Gram matrix are resolved to about sqrt(eps)·s_max; below this share of s_max they
# are rounding, so the rank gap is never sought there.
GRAM_FLOOR = 1e-9


def row_blocks(mat: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, float64 block) over ``mat``'s rows, each block about ``chunk_bytes``."""
    rows = max(1, chunk_bytes // (8 * max(1, mat.shape[1])))
    for first in range(0, mat.shape[0], rows):
        yield first, mat[first:first + rows].double()


def row_stats(mat: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """(max |row|, ‖row‖₂) for every row, float64 [V] each."""
    n = mat.shape[0]
    amax = torch.empty(n, dtype=torch.float64)
    norm = torch.empty(n, dtype=torch.float64)
    for first, block in row_blocks(mat, chunk_bytes):
        amax[first:first + len(block)] = block.abs().amax(1) if block.shape[1] else 0.0
        norm[first:first + len(block)] = block.norm(dim=1)
    return amax, norm


def log_gap_cut(scores: torch.Tensor, max_flag: int, floor: float = 1e-12,
                lowest_above: float | None = None) -> tuple[int, float]:
    """(k, ratio): the k largest scores lie above a gap log s_(k) − log s_(k+1) among the top ``max_flag + 1``
    sorted scores (values below ``floor``·max count as the floor); ratio = s_(k)/s_(k+1).

    The gap is the largest one; with ``lowest_above``, the lowest gap (largest k) whose ratio is at least that,
    when there is one: the edge of the bulk, for scores whose flagged rows spread over decades (ρ on trained
    models)."""
    s = torch.sort(scores.double(), descending=True).values
    top = float(s[0]) if len(s) else 0.0
    if top <= 0 or len(s) < 2:
        return 0, 1.0
    m = min(len(s), max_flag + 1)
    logs = torch.log(s[:m].clamp_min(top * floor))
    gaps = logs[:-1] - logs[1:]
    k = int(torch.argmax(gaps)) + 1
    if lowest_above is not None:
        bulk = float(s[:m].median())  # the edge must lie above the bulk's typical value, not inside its tail
        wide = ((gaps >= math.log(lowest_above)) & (s[1:m] >= 0.1 * bulk)).nonzero().flatten()
        if len(wide):
            k = int(wide.max()) + 1
    return k, math.exp(float(gaps[k - 1]))


@dataclass(kw_only=True)
class Subspace:
    """An orthonormal basis [d, r] (float64) of the estimated head span 𝓗, the singular values of the reference rows
    (descending) and the gap ratio s_r / s_(r+1) that chose r."""

    basis: torch.Tensor
    singular_values: torch.Tensor
    gap: float

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])


def head_subspace(mat: torch.Tensor, reference: torch.Tensor, max_rank: int | None = None,
                  chunk_bytes: int = CHUNK_BYTES) -> Subspace:
    """Basis of span{rows of ``mat`` where ``reference``}, from the eigenvectors of the Gram matrix Σ u uᵀ of the
    unit reference rows u (d × d, float64, accumulated over the vocabulary).

    The rank r ≤ ``max_rank`` (≤ d − 1) is at the largest singular-value gap (METHODS-text §2.2(a)) after the
    first direction: the first is the common mean of the h's, which always belongs to 𝓗 and whose gap to the
    rest dominates in multi-step updates (the h's drift between steps and the spectrum decays without a clean
    gap at M)."""
    d = mat.shape[1]
    gram = torch.zeros(d, d, dtype=torch.float64)
    for first, block in row_blocks(mat, chunk_bytes):
        keep = block[reference[first:first + len(block)]]
        keep = keep / keep.norm(dim=1, keepdim=True).clamp_min(TINY)  # directions: small rows count as much
        gram.addmm_(keep.T, keep)
    eig, vec = torch.linalg.eigh(gram)
    eig, vec = eig.flip(0).clamp_min(0.0), vec.flip(1)
    s = eig.sqrt()
    top = float(s[0]) if d else 0.0
    limit = min(d - 1, max_rank if max_rank is not None else d - 1)
    if top <= 0 or limit < 1:
        return Subspace(basis=vec[:, :0], singular_values=s, gap=1.0)
    clamped = s.clamp_min(top * GRAM_FLOOR)
    logs = torch.log(clamped[:limit + 1])
    gaps = logs[:-1] - logs[1:]
    r = int(torch.argmax(gaps[1:])) + 2 if len(gaps) > 1 else 1
    gap = math.exp(float(gaps[r - 1]))
    return Subspace(basis=vec[:, :r].contiguous(), singular_values=s, gap=gap)


def residual_ratios(mat: torch.Tensor, basis: torch.Tensor, chunk_bytes: int = CHUNK_BYTES
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ρ_v, ‖(I − Π)g_v‖) for every row: the share of the row outside span(``basis``), float64 [V] each (ρ = 0
    for a zero row). Scale-free, so the stored tensor's sign and scale do not matter."""
    n = mat.shape[0]
    rho = torch.empty(n, dtype=torch.float64)
    res = torch.empty(n, dtype=torch.float64)
    for first, block in row_blocks(mat, chunk_bytes):
        resid = block - (block @ basis) @ basis.T
        rn = resid.norm(dim=1)
        total = block.norm(dim=1)
        res[first:first + len(block)] = rn
        rho[first:first + len(block)] = torch.where(total > 0, rn / total.clamp_min(TINY), torch.zeros_like(rn))
    return rho, res


def rough_counts(norms: torch.Tensor, flagged: torch.Tensor) -> torch.Tensor:
    """count ≈ max(1, round(‖row‖ / median ‖row‖ of the flagged rows)) for the flagged rows, 0 elsewhere: a row
    is the sum of its occurrences' gradients and the median flagged row is taken as one occurrence (§2.1, a
    heuristic: counts are not identifiable from one row)."""
    counts = torch.zeros(len(norms), dtype=torch.long)
    if not bool(flagged.any()):
        return counts
    unit = float(norms[flagged].median())
    if unit <= 0:
        counts[flagged] = 1
        return counts
    counts[flagged] = torch.round(norms[flagged] / unit).clamp_min(1).long()
    return counts


@dataclass(kw_only=True)
class Bag:
    """Flagged rows (a bool mask [V]), per-token scores [V] (higher = more likely present), rough counts [V] and
    how they were found."""

    flagged: torch.Tensor
    scores: torch.Tensor
    counts: torch.Tensor
    method: str
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def untied_bag(mat: torch.Tensor, relative: float = 1e-6, max_share: float = 0.5,
               chunk_bytes: int = CHUNK_BYTES) -> Bag:
    """§2.1: a row is present when max|row| > ``relative`` · max over the matrix (float64). When more than
    ``max_share`` of the rows pass (a dense contribution: weight decay, noise), the exact test is meaningless and
    the row-norm log-gap cut decides instead (said in the warnings)."""
    amax, norm = row_stats(mat, chunk_bytes)
    top = float(amax.max()) if len(amax) else 0.0
    scores = amax / top if top > 0 else torch.zeros_like(amax)
    flagged = scores > relative
    method = "nonzero-rows"
    warnings = []
    diagnostics: dict[str, Any] = {"relative_threshold": relative}
    if int(flagged.sum()) > max_share * len(flagged):
        k, ratio = log_gap_cut(norm, int(max_share * len(norm)))
        order = torch.argsort(norm, descending=True)
        flagged = torch.zeros_like(flagged)
        flagged[order[:k]] = True
        scores = norm / float(norm.max())
        method = "row-norm-gap"
        diagnostics["gap_ratio"] = ratio
        warnings.append(f"the embedding contribution is dense ({int((amax > relative * top).sum())} of {len(amax)} "
                        "rows non-zero: weight decay or noise?), so rows were cut at the largest row-norm gap")
    return Bag(flagged=flagged, scores=scores, counts=rough_counts(norm, flagged), method=method,
               diagnostics=diagnostics, warnings=warnings)


def tied_bag(mat: torch.Tensor, exclude: int, rho_threshold: float | None = None,
             min_gap: float = 10.0, max_rank: int | None = None, chunk_bytes: int = CHUNK_BYTES
             ) -> tuple[Bag, Subspace | None]:
    """§2.2: separate the input part of a tied embedding gradient from the head part, which lies in 𝓗 = span{h}.

    (a) Reference rows = all but the ``exclude`` largest-norm rows and the rows at the numerical floor; 𝓗 from
    their SVD (rank at the largest singular-value gap); ρ_v = ‖(I − Π)g_v‖/‖g_v‖; flagged = ρ above
    ``rho_threshold`` (default: the largest log-gap of the sorted ρ); the flagged rows leave the reference set and
    𝓗 is estimated once more. When 𝓗 fills the space (rank d − 1: M ≥ d), or the sorted ρ have no gap of at least
    ``min_gap``, (b): the row-norm log-gap cut. ``Bag.method`` says which was used.

    Returns the bag and the subspace (None when (b) decided)."""
    v = mat.shape[0]
    _, norm = row_stats(mat, chunk_bytes)
    top = float(norm.max()) if v else 0.0
    max_flag = max(1, v // 2)
    exclude = max(0, min(exclude, v // 2))
    order = torch.argsort(norm, descending=True)
    reference = norm > top * 1e-12
    reference[order[:exclude]] = False
    diagnostics: dict[str, Any] = {"reference_rows": int(reference.sum()), "excluded_largest": exclude}
    why = None
    sub = None
    rho = torch.zeros(v, dtype=torch.float64)
    flagged = torch.zeros(v, dtype=torch.bool)
    for attempt in range(2):
        if int(reference.sum()) < 2:
            why = "too few reference rows to estimate the head span"
            break
        sub = head_subspace(mat, reference, max_rank, chunk_bytes)
        diagnostics[f"rank_{attempt}"] = sub.rank
        diagnostics[f"singular_gap_{attempt}"] = sub.gap
        if sub.rank >= mat.shape[1] - 1 or (max_rank is not None and sub.rank >= max_rank):
            why = (f"the head part fills the space (rank {sub.rank} of d = {mat.shape[1]}): more scored positions "
                   "than the width?")
            break
        rho, _ = residual_ratios(mat, sub.basis, chunk_bytes)
        if rho_threshold is not None:
            flagged = rho > rho_threshold
            diagnostics["rho_threshold"] = rho_threshold
        else:
            k, ratio = log_gap_cut(rho, max_flag, floor=1e-9, lowest_above=min_gap)
            diagnostics[f"rho_gap_{attempt}"] = ratio
            if ratio < min_gap:
                why = f"the residual ratios ρ show no clear gap (best {ratio:.3g} < {min_gap:g})"
                break
            srt = torch.sort(rho, descending=True).values
            cut = math.sqrt(float(srt[k - 1]) * float(srt[k]))
            diagnostics["rho_threshold"] = cut
            flagged = rho > cut
        if attempt == 0:
            reference = reference & ~flagged
            diagnostics["reference_rows"] = int(reference.sum())
    if why is None and sub is not None:
        _, resid = residual_ratios(mat, sub.basis, chunk_bytes)
        return Bag(flagged=flagged, scores=rho, counts=rough_counts(resid, flagged), method="span-residual",
                   diagnostics=diagnostics), sub
    k, ratio = log_gap_cut(norm, max_flag)
    flagged = torch.zeros(v, dtype=torch.bool)
    flagged[order[:k]] = True
    diagnostics["gap_ratio"] = ratio
    return Bag(flagged=flagged, scores=norm / top if top > 0 else norm, counts=rough_counts(norm, flagged),
               method="row-norm-gap", diagnostics=diagnostics,
               warnings=[f"span-residual separation not used: {why}; fell back to the row-norm gap cut, which also "
                         "flags target-only tokens and misses inputs on confident (trained) models"]), None


def head_targets(mat: torch.Tensor, candidates: torch.Tensor | None = None, max_flag: int | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> Bag:
    """§2.3: next-token targets from an LM-head gradient [V, d] (or the pure head rows of a tied one): a target's row
    carries −(c_v/M)·Σ h, an absent token's only (1/M)·Σ p_v h, about V times smaller at random weights. Flagged =
    rows above the largest row-norm log-gap (among ``candidates`` when given); counts = round(‖row‖ / median
    flagged ‖row‖) (rough: one occurrence is taken to be the median flagged row)."""
    _, norm = row_stats(mat, chunk_bytes)
    pool = norm if candidates is None else torch.where(candidates, norm, torch.zeros_like(norm))
    limit = max_flag if max_flag is not None else max(1, len(norm) // 2)
    k, ratio = log_gap_cut(pool, limit)
    flagged = torch.zeros(len(norm), dtype=torch.bool)
    flagged[torch.argsort(pool, descending=True)[:k]] = True
    top = float(pool.max()) if len(pool) else 0.0
    return Bag(flagged=flagged, scores=pool / top if top > 0 else pool, counts=rough_counts(norm, flagged),
               method="row-norm-gap", diagnostics={"gap_ratio": ratio})


@dataclass(kw_only=True)
class Lengths:
    """§2.4 from a learned position table's gradient: the longest sequence, per-position row norms, and (when B is
    known) a heuristic histogram of lengths."""

    max_length: int | None
    last_position: int | None
    position_norms: torch.Tensor
    histogram: dict[int, int] | None
    warnings: list[str] = field(default_factory=list)


def position_lengths(mat: torch.Tensor, offset: int, causal: bool, batch_size: int | None = None,
                     relative: float = 1e-6) -> Lengths:
    """T_max = (2 for next-token loss, else 1) + the largest position t whose row ∇P[t] is non-zero (max|row| >
    ``relative`` · max). With B known, the number of sequences still active at t is read as
    n_t ≈ B·‖∇P[t]‖² / ‖∇P[0]‖² (per-sequence gradients taken as uncorrelated and equally large; made
    non-increasing), and the lengths as where n_t steps down: a heuristic."""
    amax, norm = row_stats(mat[offset:])
    top = float(amax.max()) if len(amax) else 0.0
    warnings: list[str] = []
    if top <= 0:
        return Lengths(max_length=None, last_position=None, position_norms=norm, histogram=None,
                       warnings=["the position-table gradient is zero"])
    nonzero = (amax > relative * top).nonzero().flatten()
    last = int(nonzero.max())
    if len(nonzero) == len(amax):
        warnings.append("every position row is non-zero (sequences fill the table, or the update is dense): the "
                        "maximum length is a lower bound")
    extra = 2 if causal else 1
    histogram = None
    if batch_size and float(norm[0]) > 0:
        active = (batch_size * (norm[: last + 1] / norm[0]) ** 2).clamp(0, batch_size)
        active = torch.cummin(active, 0).values.round().long().clamp_min(1)
        active[0] = batch_size
        histogram = {}
        for t in range(last + 1):
            nxt = int(active[t + 1]) if t + 1 <= last else 0
            ends = int(active[t]) - nxt
            if ends > 0:
                histogram[t + extra] = ends
    return Lengths(max_length=last + extra, last_position=last, position_norms=norm[: last + 1], histogram=histogram,
                   warnings=warnings)
