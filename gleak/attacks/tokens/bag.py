"""Token-recovery maths on [V, d] gradient matrices, streamed over the vocabulary (docs/methods/tokens.md).

Every function reads a stored matrix (float32, bf16 or float64) a block of rows at a time, converts the block to
float64 and keeps only per-row values ([V] float64 vectors) and, for the tied separation, a d × d float64 Gram
matrix and its eigenvectors, plus a float32 [V, 48] table of residual ratios. Peak extra memory is therefore about
2·``chunk_bytes`` + 8·(a few V) + 4·48·V + 2·8·d² bytes, never a float64 copy of the matrix, never V × V or
(B·T) × V.

* :func:`row_stats` — per-row max |·| and Euclidean norm.
* :func:`log_gap_cut` — how many of the largest scores stand apart: the largest gap of the sorted scores in log
  scale (§2.2(b)).
* :func:`head_spectrum`, :func:`residual_sweep`, :func:`rank_cuts`, :func:`pick_rank` — §2.2(a): the singular
  vectors of reference rows (through the Gram matrix), ρ_v(r) = ‖(I − Π_r)g_v‖ / ‖g_v‖ for a grid of ranks r in one
  pass, each rank's widest gap (no minimum ratio: issue 44), and the rank whose ρ separate best;
  :func:`rank_votes` a confidence per row; :func:`residual_ratios` for one basis.
* :func:`untied_bag`, :func:`tied_bag`, :func:`head_targets`, :func:`position_lengths` — §2.1–§2.4.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch

from gleak.timebox import checkpoint

CHUNK_BYTES = 64 * 2**20  # float64 working block of rows
TINY = 1e-300
# Singular values from the float64 Gram matrix are resolved to about sqrt(eps)·s_max; below this share of s_max they
# are rounding and their directions arbitrary, so no candidate rank reaches there.
GRAM_FLOOR = 1e-9
RANK_POINTS = 48  # candidate ranks of the head span tried by the tied separation
ROUNDS = 3  # estimates of the head span: from the smaller rows, then from the rows the last estimate explains


def row_blocks(mat: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, float64 block) over ``mat``'s rows, each block about ``chunk_bytes``."""
    rows = max(1, chunk_bytes // (8 * max(1, mat.shape[1])))
    for first in range(0, mat.shape[0], rows):
        checkpoint(f"rows {first}/{mat.shape[0]}")  # the deadline in force (gleak.timebox), and progress
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
    (descending) and the residual-ratio gap s_k / s_(k+1) that chose r (:func:`pick_rank`)."""

    basis: torch.Tensor
    singular_values: torch.Tensor
    gap: float

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])


def head_spectrum(mat: torch.Tensor, reference: torch.Tensor, chunk_bytes: int = CHUNK_BYTES
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(singular values [d], right singular vectors [d, d], both float64, descending) of the stacked *unit* rows of
    ``mat`` where ``reference``, from the eigen-decomposition of their Gram matrix Σ u uᵀ (d × d, accumulated over
    the vocabulary; never the rows themselves). Unit rows: every head-only row lies in 𝓗 whatever its norm, so
    small rows count as much as large ones. Values below :data:`GRAM_FLOOR` of the largest are rounding."""
    d = mat.shape[1]
    gram = torch.zeros(d, d, dtype=torch.float64)
    for first, block in row_blocks(mat, chunk_bytes):
        keep = block[reference[first:first + len(block)]]
        keep = keep / keep.norm(dim=1, keepdim=True).clamp_min(TINY)
        gram.addmm_(keep.T, keep)
    eig, vec = torch.linalg.eigh(gram)
    return eig.flip(0).clamp_min(0.0).sqrt(), vec.flip(1).contiguous()


def rank_grid(limit: int, points: int = RANK_POINTS) -> list[int]:
    """Candidate ranks 1 … ``limit``: all of them when there are at most ``points``, else ``points`` evenly spaced
    (1 and ``limit`` included)."""
    if limit < 1:
        return []
    if limit <= points:
        return list(range(1, limit + 1))
    return sorted({round(1 + i * (limit - 1) / (points - 1)) for i in range(points)})


def residual_sweep(mat: torch.Tensor, vectors: torch.Tensor, ranks: list[int], chunk_bytes: int = CHUNK_BYTES
                   ) -> torch.Tensor:
    """ρ_v(r) = ‖(I − Π_r)g_v‖ / ‖g_v‖ for every row and every r in ``ranks`` (ascending), Π_r the projection onto the
    first r columns of the orthonormal ``vectors`` [d, d]: float32 [V, len(ranks)] (0 for a zero row). One pass:
    the squared coordinates of each block in the full basis are summed between consecutive ranks and the tails
    added up from the end (sums of positive terms: no cancellation, so ρ stays exact down to ~1e-8)."""
    n = mat.shape[0]
    d = vectors.shape[1]
    edges = [*ranks, d]
    out = torch.empty(n, len(ranks), dtype=torch.float32)
    for first, block in row_blocks(mat, chunk_bytes):
        coords = (block @ vectors).square_()
        parts = torch.stack([coords[:, a:b].sum(1) for a, b in pairwise(edges)], 1)
        del coords
        tails = parts.flip(1).cumsum(1).flip(1)
        total = torch.linalg.vector_norm(block, dim=1, keepdim=True).square()
        rho = torch.where(total > 0, (tails / total.clamp_min(TINY)).sqrt(), torch.zeros_like(tails))
        out[first:first + len(block)] = rho.float()
    return out


@dataclass(kw_only=True)
class RankChoice:
    """The rank whose residual ratios separate best: its index in the candidate list, the rank, how many rows lie
    above the chosen gap (k) and the gap's ratio."""

    index: int
    rank: int
    flagged: int
    gap: float


def rank_cuts(rho: torch.Tensor, live: torch.Tensor, max_flag: int) -> list[tuple[int, float]]:
    """For every candidate rank (column of ``rho``): (k, ratio), the largest log-gap of the sorted ρ of the ``live``
    rows (those above the numerical floor; :func:`log_gap_cut` among the top ``max_flag`` + 1). No minimum ratio:
    the widest gap is where the rows the span explains end, however narrow it is."""
    n = int(live.sum())
    limit = min(max_flag, max(1, n - 1))
    return [log_gap_cut(rho[live, j], limit, floor=1e-9) for j in range(rho.shape[1])]


def pick_rank(rho: torch.Tensor, ranks: list[int], max_flag: int, live: torch.Tensor | None = None
              ) -> RankChoice | None:
    """Among the candidate ranks r (columns of ``rho``), the one whose sorted ρ (of the ``live`` rows; all when
    None) show the widest gap (:func:`rank_cuts`); None when there is no candidate."""
    live = torch.ones(rho.shape[0], dtype=torch.bool) if live is None else live
    best: RankChoice | None = None
    for j, (k, ratio) in enumerate(rank_cuts(rho, live, max_flag)):
        if best is None or ratio > best.gap:
            best = RankChoice(index=j, rank=ranks[j], flagged=k, gap=ratio)
    return best


def rank_votes(rho: torch.Tensor, cuts: list[tuple[int, float]], live: torch.Tensor) -> torch.Tensor:
    """A confidence in [0, 1] per row: the share of the candidate ranks, each weighted by its log-gap, whose cut
    (:func:`rank_cuts`) flags the row. 1: every rank that separates at all flags it; near 0: only ranks whose
    separation is weak do (float64 [V])."""
    votes = torch.zeros(rho.shape[0], dtype=torch.float64)
    total = 0.0
    for j, (k, ratio) in enumerate(cuts):
        weight = math.log(max(ratio, 1.0))
        if weight <= 0 or k < 1:
            continue
        order = torch.argsort(torch.where(live, rho[:, j], -1.0), descending=True)
        votes[order[:k]] += weight
        total += weight
    return votes / total if total > 0 else votes


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
    confidence: torch.Tensor | None = None  # per row in [0, 1], when the method gives one (tied: rank_votes)


def untied_bag(mat: torch.Tensor, relative: float = 0.0, max_tokens: int | None = None,
               chunk_bytes: int = CHUNK_BYTES) -> Bag:
    """§2.1: a row is present when max|row| > ``relative`` · max over the matrix (float64; default 0: any non-zero
    row, since an absent token's row is exactly zero — §2.1's 10⁻⁶ missed an input seen once at a position the
    model predicts with certainty, 8·10⁻⁷ of the largest entry). When more rows pass than
    the batch can hold distinct tokens (``max_tokens``, B·T per step, when known; else when every row passes), the
    contribution is dense (weight decay, noise), the exact test is meaningless, and the row-norm log-gap cut
    decides instead (said in the warnings). Before issue 44 a fixed share (half the rows) decided that, which a
    large batch over a small vocabulary crosses with every row exact."""
    amax, norm = row_stats(mat, chunk_bytes)
    top = float(amax.max()) if len(amax) else 0.0
    scores = amax / top if top > 0 else torch.zeros_like(amax)
    flagged = scores > relative
    method = "nonzero-rows"
    warnings = []
    diagnostics: dict[str, Any] = {"relative_threshold": relative}
    passed = int(flagged.sum())
    if len(flagged) > 1 and (passed > max_tokens if max_tokens else passed == len(flagged)):
        k, ratio = log_gap_cut(norm, max(1, min(len(norm) - 1, max_tokens or len(norm) // 2)))
        order = torch.argsort(norm, descending=True)
        flagged = torch.zeros_like(flagged)
        flagged[order[:k]] = True
        scores = norm / float(norm.max())
        method = "row-norm-gap"
        diagnostics["gap_ratio"] = ratio
        warnings.append(f"the embedding contribution is dense ({passed} of {len(amax)} rows non-zero"
                        + (f", more than the {max_tokens} tokens the batch can hold" if max_tokens else "")
                        + ": weight decay or noise?), so rows were cut at the largest row-norm gap")
    return Bag(flagged=flagged, scores=scores, counts=rough_counts(norm, flagged), method=method,
               diagnostics=diagnostics, warnings=warnings)


def row_norm_bag(norm: torch.Tensor, max_flag: int, why: str | None = None) -> Bag:
    """§2.2(b): the rows above the largest log-gap of the sorted row norms (``why``: the warning saying why the
    separation was not used; None for the plain baseline)."""
    k, ratio = log_gap_cut(norm, max_flag)
    flagged = torch.zeros(len(norm), dtype=torch.bool)
    flagged[torch.argsort(norm, descending=True)[:k]] = True
    top = float(norm.max()) if len(norm) else 0.0
    warnings = [] if why is None else [
        f"span-residual separation not used: {why}; fell back to the row-norm gap cut, which also flags "
        "target-only tokens and misses inputs on confident (trained) models"]
    return Bag(flagged=flagged, scores=norm / top if top > 0 else norm, counts=rough_counts(norm, flagged),
               method="row-norm-gap", diagnostics={"gap_ratio": ratio}, warnings=warnings)


@dataclass(kw_only=True)
class _Estimate:
    """One estimate of the head span and the separation it gives (:func:`tied_bag`)."""

    sub: Subspace
    rho: torch.Tensor
    flagged: torch.Tensor
    confidence: torch.Tensor
    cut: float | None


def tied_bag(mat: torch.Tensor, exclude: int, rho_threshold: float | None = None,
             min_gap: float | None = None, max_rank: int | None = None, max_tokens: int | None = None,
             chunk_bytes: int = CHUNK_BYTES) -> tuple[Bag, Subspace | None]:
    """§2.2: separate the input part of a tied embedding gradient from the head part, which lies in 𝓗 = span{h}.

    (a) Reference rows: first all but the ``exclude`` largest-norm rows and the rows at the numerical floor; their
    singular vectors (:func:`head_spectrum`) give nested candidate bases of 𝓗. The rank is not read off the
    spectrum (on trained models and multi-step updates it decays over decades without a gap at M) but chosen by
    the separation itself: for up to :data:`RANK_POINTS` ranks r ≤ min(``max_rank``, d − 2) with singular values
    above :data:`GRAM_FLOOR`, ρ_v(r) = ‖(I − Π_r)g_v‖/‖g_v‖ for every row (:func:`residual_sweep`, one pass); each
    rank's ρ are cut at their widest log-gap and the rank with the widest one wins (:func:`pick_rank`). Flagged =
    ρ above that gap (or above ``rho_threshold``). Then the estimate is checked on the capture itself and redone
    from the rows it explains: the reference becomes every row above the floor but the flagged ones and as many
    again below them (a guard band), which brings back the large head-only rows the first exclusion dropped (a
    trimmed subspace fit), up to :data:`ROUNDS` estimates or until the reference repeats; the estimate whose gap
    is widest is kept. Every row gets a confidence (:func:`rank_votes`): the gap-weighted share of the ranks that
    flag it. A cut flags at most ``max_tokens`` rows (the batch's distinct tokens cannot outnumber its B·T
    positions per step, when they are known; else half the vocabulary): on trained models the head-only rows fall
    into populations whose edges are gaps too, beyond any number of tokens the batch can hold.

    No ratio decides between this and (b): the widest gap is used however narrow (its width is in the
    diagnostics, ``separation``), so a weaker separation moves the cut, never the method. (b), the row-norm
    log-gap cut, runs when the span cannot be estimated (too few rows), or when ``min_gap`` is given and the
    widest gap is narrower (the rule before issue 44, on request). ``Bag.method`` says which was used.

    Returns the bag and the subspace (None when (b) decided)."""
    v, d = mat.shape
    _, norm = row_stats(mat, chunk_bytes)
    top = float(norm.max()) if v else 0.0
    max_flag = max(1, min(v // 2, max_tokens or v))
    if min_gap is not None and not math.isfinite(min_gap):
        return row_norm_bag(norm, max_flag), None
    live = norm > top * 1e-12
    reference = live.clone()
    reference[torch.argsort(norm, descending=True)[:max(0, min(exclude, v // 2))]] = False
    limit = min(d - 2, max_rank if max_rank is not None else d - 2)
    diagnostics: dict[str, Any] = {"reference_rows": int(reference.sum()), "excluded_largest": exclude}
    why = None
    estimates: list[_Estimate] = []
    for attempt in range(ROUNDS):
        if int(reference.sum()) < 2:
            why = "too few reference rows to estimate the head span"
            break
        s, vectors = head_spectrum(mat, reference, chunk_bytes)
        ranks = rank_grid(min(limit, int((s > GRAM_FLOOR * s[0]).sum())) if s[0] > 0 else 0)
        if not ranks:
            why = "the reference rows are zero, or the width leaves no room for a head span"
            break
        sweep = residual_sweep(mat, vectors, ranks, chunk_bytes)
        cuts = rank_cuts(sweep, live, max_flag)
        j = max(range(len(cuts)), key=lambda i: cuts[i][1])
        k, gap = cuts[j]
        rho = sweep[:, j].double()
        order = torch.argsort(torch.where(live, rho, torch.full_like(rho, -1.0)), descending=True)
        flagged = torch.zeros(v, dtype=torch.bool)
        flagged[order[:k]] = True
        cut = math.sqrt(float(rho[order[k - 1]]) * float(rho[order[k]])) if 0 < k < len(order) else None
        estimates.append(_Estimate(sub=Subspace(basis=vectors[:, :ranks[j]].contiguous(), singular_values=s, gap=gap),
                                   rho=rho, flagged=flagged, confidence=rank_votes(sweep, cuts, live), cut=cut))
        del sweep
        diagnostics.update({f"rank_{attempt}": ranks[j], f"rho_gap_{attempt}": gap,
                            f"singular_value_at_rank_{attempt}": float(s[ranks[j] - 1] / s[0])})
        explained = live.clone()
        explained[order[:min(2 * k, v // 2)]] = False  # the flagged rows and a guard band as wide below them
        if torch.equal(explained, reference):
            break
        reference = explained
    if not estimates:
        bag = row_norm_bag(norm, max_flag, why)
        bag.diagnostics = {**diagnostics, **bag.diagnostics}
        return bag, None
    chosen = max(range(len(estimates)), key=lambda i: estimates[i].sub.gap)
    best = estimates[chosen]
    diagnostics.update({"estimate": chosen, "separation": best.sub.gap, "rho_threshold": best.cut})
    if min_gap is not None and best.sub.gap < min_gap and rho_threshold is None:  # the old rule, as it was
        bag = row_norm_bag(norm, max(1, v // 2), f"the residual ratios ρ show no gap of at least min_gap = {min_gap:g} "
                           f"at any rank of the head span (widest {best.sub.gap:.3g})")
        bag.diagnostics = {**diagnostics, **bag.diagnostics}
        return bag, None
    flagged = best.flagged
    if rho_threshold is not None:
        flagged = best.rho > rho_threshold
        diagnostics["rho_threshold"] = rho_threshold
    borderline = (best.confidence > 0) & (best.confidence < 1)
    diagnostics["borderline"] = int(borderline.sum())
    return Bag(flagged=flagged, scores=best.rho, counts=rough_counts(best.rho * norm, flagged),
               method="span-residual", diagnostics=diagnostics, confidence=best.confidence), best.sub


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
                     relative: float = 0.0) -> Lengths:
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
