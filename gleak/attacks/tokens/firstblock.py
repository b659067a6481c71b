"""The first block's span test as a check of the token bag of a full fine-tuning capture (METHODS-text §1.4, §3.4;
DAGER's layer-1 token sets, Petrov et al., NeurIPS 2024).

The first block's attention projections (GPT-2's c_attn, q/k/v of LLaMA-style models) read inputs u that depend
only on the token (and, with learned positions, its position): u = LN(E[v] + P[p]), or RMSNorm(E[v]). Their weight
gradient Σ_t δ_t u_tᵀ keeps span{u_t}, so while the batch has fewer distinct such inputs than the width, a
candidate token belongs to the batch's inputs exactly when its u lies in that span (at some position). The test
is independent of the embedding gradient the bag is read from, which makes it the check of that bag's cut.

As for the bag's own separation, no ratio decides: on a model that knows its domain the δ_t of confident
positions are tiny, the gradient's singular values decay over decades without a drop at the number of inputs, and
a rank read at a fixed drop either refuses (full rank) or keeps a span so wide that its threshold admits absent
tokens. The rank is chosen by the separation instead:

* :func:`first_block` — the right singular vectors of the first token-wise projections' weight gradients (each
  scaled to unit Frobenius norm, stacked), or a one-line :class:`~gleak.errors.GleakError` saying why there is none;
* :func:`distance_sweep` — for chosen tokens and a grid of ranks, the relative distance of their first-block input
  to the span of the first r singular vectors, the smallest over the positions tested, in one streamed pass;
* :func:`check_bag` — each rank's sorted distances cut at their widest normalized log-gap among the closest
  tokens (:func:`spacing_cut`), the ranks' cuts put to a weighted vote (:func:`rank_vote`); the tokens most of the
  weight puts below the cut are *proven*; when that evidence outweighs the bag's own, the proven set replaces the
  bag's verdict on the tokens tested.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import nn

from gleak.attacks.tokens.bag import Bag, rank_grid
from gleak.attacks.tokens.inputs import (
    CHUNK_TOKENS,
    first_tokenwise,
    linear_gradient,
    module_inputs,
    position_offset,
    weight_gradients,
)
from gleak.attacks.tokens.spantest import margin
from gleak.errors import GleakError
from gleak.timebox import checkpoint

MAX_TESTS = 2**18  # token-position pairs tested at most: the candidates are the bag's best-scored tokens
SV_FLOOR = 1e-12  # singular values below this share of the largest are rounding (float64)
FLOOR = 1e-12  # distances below this count as this (log scale)


@dataclass(frozen=True, kw_only=True)
class FirstBlock:
    """The first block's projections (``paths``), the one whose input is computed (``layer``), whether that input
    depends on the position and the ``position_ids`` value of a sequence's position 0, the right singular vectors
    [d_in, d_in] (float32, by decreasing singular value; a whole basis) of their stacked weight gradients, and how
    many of them lie above the rounding (``rank``)."""

    paths: list[str]
    layer: nn.Module
    positional: bool
    offset: int
    vectors: torch.Tensor
    rank: int


def first_block(model: nn.Module, tensors: Mapping[str, torch.Tensor], vocab_size: int) -> FirstBlock:
    """The first projections, in model order, whose input is token-wise and whose weight gradient (or update) is in
    ``tensors`` (keyed by ``named_parameters()`` names), with the singular vectors of their gradients (each module's
    scaled to unit norm, so that q, k and v count alike); a one-line GleakError when there is none."""
    modules, grads = weight_gradients(model, tensors, linear_gradient)
    group = first_tokenwise(model, [(p, modules[p]) for p in grads], vocab_size)
    if group is None:
        raise GleakError("no projection with a weight gradient in the capture reads token-wise inputs (the first "
                         "attention block's c_attn or q/k/v_proj)")
    kind, paths = group
    stacked = torch.cat([grads[p].double() / grads[p].double().norm().clamp_min(1e-300) for p in paths])
    _, s, vh = torch.linalg.svd(stacked, full_matrices=True)
    keep = int((s > SV_FLOOR * s[0]).sum()) if len(s) and s[0] > 0 else 0
    if keep < 2:
        raise GleakError(f"the first block's weight gradient ({paths[0]}) is zero or of rank one: nothing to test")
    layer = modules[paths[0]]
    offset = position_offset(model, layer, vocab_size) if kind.positional else 0
    return FirstBlock(paths=paths, layer=layer, positional=kind.positional, offset=offset,
                      vectors=vh.T.float().contiguous(), rank=keep)


def distance_sweep(model: nn.Module, block: FirstBlock, ids: torch.Tensor, positions: int, ranks: list[int]
                   ) -> torch.Tensor:
    """‖u − Π_r u‖ / ‖u‖ for the first-block input u of each token in ``ids`` [N] and each rank r in ``ranks``
    (ascending; Π_r the projection on the first r singular vectors), the smallest over positions 0 … ``positions``
    − 1 (one for position-free inputs): float32 [N, len(ranks)]. The squared coordinates in the whole basis are
    summed between ranks and added up from the end (positive terms: no cancellation); float32 is enough, the inputs
    themselves come from a float32 forward pass."""
    vectors = block.vectors
    edges = [*ranks, vectors.shape[1]]
    best = torch.full((len(ids), len(ranks)), math.inf)
    for p in range(positions if block.positional else 1):
        for first in range(0, len(ids), CHUNK_TOKENS):
            checkpoint(f"first block: position {p + 1}/{positions}, tokens {first}/{len(ids)}")
            chunk = ids[first:first + CHUNK_TOKENS].unsqueeze(1)
            u = module_inputs(model, block.layer, chunk, torch.full_like(chunk, p + block.offset))[:, 0].float()
            coords = (u @ vectors).square_()
            parts = torch.stack([coords[:, a:b].sum(1) for a, b in pairwise(edges)], 1)
            tails = parts.flip(1).cumsum(1).flip(1)
            dist = (tails / u.square().sum(1, keepdim=True).clamp_min(1e-30)).sqrt()
            part = slice(first, first + len(chunk))
            best[part] = torch.minimum(best[part], dist)
    return best


def spacing_cut(dist: torch.Tensor, most: int) -> tuple[int, float, float]:
    """(k, ratio, weight): the k closest of ``dist`` lie below the log-gap with the largest normalized spacing
    k·log(d_(k+1)/d_(k)) among the ``most`` + 1 closest (Rényi's representation: under a smooth distribution these
    are alike, so a gap that sets apart more tokens counts more, and a lone token near a span that nearly fills the
    width, the extreme of many draws, does not pass for a proof); ratio = d_(k+1)/d_(k)."""
    s = torch.sort(dist.double().clamp_min(FLOOR)).values[:most + 1]
    if len(s) < 2:
        return 0, 1.0, 0.0
    gaps = torch.log(s[1:]) - torch.log(s[:-1])
    weight = gaps * torch.arange(1, len(s), dtype=torch.float64)
    k = int(torch.argmax(weight)) + 1
    return k, math.exp(float(gaps[k - 1])), float(weight[k - 1])


def rank_vote(below: list[torch.Tensor], weights: list[float], count: int) -> torch.Tensor:
    """For each of ``count`` tokens the share of the ranks, each weighted by its normalized spacing
    (:func:`spacing_cut`'s weight), whose cut puts it below the gap (``below[j]``: the indices rank j's cut keeps). A
    present input, once its direction is inside the span, stays below every larger rank's cut, so on a trained
    model the inputs show a plateau of ranks that agree, while a single rank whose gap is wide only because some
    inputs are not yet inside (a transient) is outvoted; a token proven by more than half the weight is proven
    (issue 44: one rank's widest gap missed the inputs the model predicts with certainty)."""
    votes = torch.zeros(count, dtype=torch.float64)
    total = 0.0
    for kept, weight in zip(below, weights, strict=True):
        if len(kept) and weight > 0:
            votes[kept] += weight
            total += weight
    return votes / total if total > 0 else votes


def check_bag(bag: Bag, model: nn.Module, tensors: Mapping[str, torch.Tensor], vocab_size: int, positions: int,
              max_tokens: int | None = None) -> Bag:
    """``bag`` checked with the first block's span test (else ``bag`` with the reason in
    ``diagnostics.first_block``).

    Tested: the bag's best-scored tokens (every flagged one, then by score), as many as :data:`MAX_TESTS`
    token-position pairs allow. For up to 48 ranks r below the width (and below ``max_tokens``, the batch's
    distinct inputs at most, when known) that leave the span room below the width (DAGER's margin, §3.2), the
    tested tokens' distances (:func:`distance_sweep`) are cut at their largest normalized spacing among the
    min(``max_tokens``, r) + 1 closest (:func:`spacing_cut`; an r-dimensional span holds at most r inputs in
    general position), and the ranks vote, each by the weight of its cut (:func:`rank_vote`): the tokens below
    the cut of more than half the weight are proven. The first block's evidence (k · log gap at the widest rank
    that agrees with the vote) and the bag's (its flagged count × log of its ρ gap) are both normalized spacings
    of relative residuals to a span: when the first block's is the larger, the proven set is the verdict on the
    tested tokens (proven ones join the bag, the others leave it); otherwise the bag stands and the check is
    reported."""
    try:
        block = first_block(model, tensors, vocab_size)
    except GleakError as e:
        return _noted(bag, {"first_block": f"not run: {e}"})
    positions = max(1, positions) if block.positional else 1
    flagged = bag.flagged
    n = min(vocab_size, max(int(flagged.sum()), MAX_TESTS // positions))
    order = torch.argsort(bag.scores.double() + flagged.double() * (1 + float(bag.scores.abs().max())),
                          descending=True)
    tested = order[:n]
    width = block.vectors.shape[0]
    limit = min(block.rank, width - margin(width), max_tokens or width)  # a span with room left (DAGER, §3.2)
    ranks = rank_grid(limit)
    if not ranks or n < 2:
        return _noted(bag, {"first_block": "not run: no room for a span below the width"})
    dist = distance_sweep(model, block, tested, positions, ranks)
    most = min(n - 1, max_tokens or n - 1)
    # an r-dimensional span holds at most r tokens' inputs in general position: a cut below more is no proof
    cuts = [spacing_cut(dist[:, j], min(most, r)) for j, r in enumerate(ranks)]
    below = [torch.argsort(dist[:, j])[:k] for j, (k, _, _) in enumerate(cuts)]
    votes = rank_vote(below, [w for _, _, w in cuts], len(tested))
    close = votes > 0.5
    proven = torch.zeros_like(flagged)
    proven[tested[close]] = True
    # the separation of the vote: the widest gap among the ranks whose cut is the vote's set (the best-weighted
    # rank's when none is)
    agree = [j for j, kept in enumerate(below) if len(kept) == int(close.sum()) and bool(close[kept].all())]
    chosen = max(agree or range(len(cuts)), key=lambda j: cuts[j][2])
    separation, weight = cuts[chosen][1], cuts[chosen][2]
    was_tested = torch.zeros_like(flagged)
    was_tested[tested] = True
    # both separations as normalized spacings (k · log gap): a gap that sets apart more tokens is the stronger
    # evidence, so a bag whose cut is wide only above its few most certain inputs does not outweigh a span test
    # that proves every input
    own = int(flagged.sum()) * math.log(max(1.0, float(bag.diagnostics.get("separation") or 1.0)))
    decides = weight > own
    out = (flagged & ~was_tested) | proven if decides else flagged
    counts = bag.counts.clone()
    counts[~out] = 0
    counts[out] = counts[out].clamp_min(1)
    info = {"modules": block.paths, "rank": ranks[chosen], "ranks_agreeing": len(agree), "positions": positions,
            "tested": n, "proven": int(proven.sum()), "added": int((proven & ~flagged).sum()),
            "not_proven": int((flagged & was_tested & ~proven).sum()), "separation": separation,
            "weight": weight, "bag_weight": own, "decided": decides}
    confidence = bag.confidence
    if decides and confidence is not None:
        confidence = confidence.clone()
        confidence[tested] = votes.to(confidence.dtype)
    return Bag(flagged=out, scores=bag.scores, counts=counts,
               method=f"{bag.method} + first block" if decides else bag.method,
               diagnostics={**bag.diagnostics, "first_block": info}, warnings=list(bag.warnings),
               confidence=confidence)


def _noted(bag: Bag, extra: dict[str, object]) -> Bag:
    return Bag(flagged=bag.flagged, scores=bag.scores, counts=bag.counts, method=bag.method,
               diagnostics={**bag.diagnostics, **extra}, warnings=list(bag.warnings), confidence=bag.confidence)
