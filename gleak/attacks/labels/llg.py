"""LLG, LLG* and LLG+ (Wainakh et al., PoPETs 2022): impact and offset estimation, then Algorithm 1.

Equation and algorithm numbers are those of the 2021 preprint; notes: docs/methods/label-recovery.md#llg.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import DUMMY_CHUNK_BYTES, Context
from gleak.attacks.labels.counts import CHUNK_BYTES, affine_logit_grads, batch_row_sums, logit_grads, row_sums
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements

REPEATS = 10  # R in the reference code (`n = 10`); the default of LLGEstimateOptions.repeats


class LLGEstimateOptions(AttackOptions):
    """LLG* and LLG+: how many simulated batches per class estimate the impact and offsets."""

    repeats: int = Field(REPEATS, ge=1, le=1000, description="R: simulated one-label batches per class for the "
                         "impact and offsets (Eq. 13–14)")


def llg_extract(g: torch.Tensor, impact: float, offsets: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Algorithm 1 of Wainakh et al. (PoPETs 2022): counts per class from row sums ``g``, impact m (< 0) and offsets s.

    Lines 1–5 add every class with g_i < 0 (Property 1), each lowering G_i by m; line 7 calibrates
    G ← G − s; lines 8–12 add argmin G until |E| = B. As in the LLG+ reference code we take the negative
    classes in ascending order and stop at B, so the counts always sum to B (Alg. 1 itself has no cap).
    """
    G = g.double().clone()
    counts = torch.zeros(len(g), dtype=torch.long)
    negative = torch.nonzero(g < 0).flatten()
    negative = negative[torch.argsort(g[negative], stable=True)][:batch_size]
    counts[negative] += 1
    G[negative] -= impact
    G -= offsets.double()
    for _ in range(batch_size - int(counts.sum())):
        i = int(torch.argmin(G))
        counts[i] += 1
        G[i] -= impact
    return counts


def _safe_impact(impact: float, g: torch.Tensor, batch_size: int) -> tuple[float, list[str]]:
    if impact < 0:
        return impact, []
    fallback = -float(g.abs().mean()) / batch_size or -1.0
    return fallback, [f"impact estimate was {impact:.3g} (not negative); used −mean|g|/B = {fallback:.3g}"]


def _impact_offsets(own: torch.Tensor, own_label: torch.Tensor, totals: torch.Tensor, num_batches: int,
                    batch_size: int, num_classes: int) -> tuple[float, torch.Tensor]:
    """Impact (Eq. 13) and offsets (Eq. 14) from the simulated one-label batches' statistics: ``own`` [batches] the
    row sum g_i of each batch's own label i, ``own_label`` [batches] that label, ``totals`` [C] every batch's row
    sums added up. Offsets: the mean row sum of class j over the batches not labelled j."""
    impact = float(own.mean()) / batch_size * (1 + 1 / num_classes)  # Σ_i ḡ_i/(n·B)·(1 + 1/n), over the R runs
    own_by_class = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, own_label, own)
    labelled = torch.bincount(own_label, minlength=num_classes)
    return impact, (totals - own_by_class) / (num_batches - labelled).clamp_min(1)


def _class_pools(labels: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """The classes present in ``labels``, ascending, and the indices of each one's examples."""
    order = torch.argsort(labels, stable=True)
    classes, counts = torch.unique_consecutive(labels[order], return_counts=True)
    return classes.tolist(), list(torch.split(order, counts.tolist()))


def _dummy_statistics(ctx: Context, feature_sums: torch.Tensor, logits: torch.Tensor, repeats: int,
                      batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLG*: the same R·B dummy examples under every label i (rep r holds examples r·B … r·B + B − 1); returns the
    own-label row sums [R·C] (batch (i, r) at i·R + r), their labels and the column totals [C].

    Streamed: for losses whose logit gradient is affine in the one-hot label (cross-entropy and BCE, with any
    temperature and smoothing: ∂ℓ/∂z = a − c·e_i) in closed form from a [R·B, C]; otherwise label by label in
    chunks that fit :data:`CHUNK_BYTES`. Never R·C·B × C at once."""
    C, R, B = ctx.num_classes, repeats, batch_size
    s = feature_sums.double()
    rep = torch.arange(R * B) // B
    labels = torch.arange(C).repeat_interleave(R)
    rows_per_chunk = max(1, CHUNK_BYTES // (C * 8 * 8))  # logit gradients of two labels and their autograd
    per_rep = torch.zeros(R, C, dtype=torch.float64)  # A_r = Σ_{n in rep r} a_n·s_n
    c = None
    for first in range(0, R * B, rows_per_chunk):
        part = slice(first, first + rows_per_chunk)
        affine = affine_logit_grads(logits[part], ctx.loss)
        if affine is None or (c is not None and abs(affine[1] - c) > 1e-12 * (1 + abs(c))):
            c = None
            break
        a, c = affine
        per_rep.index_add_(0, rep[part], a * s[part, None])
    if c is not None:
        s_rep = torch.zeros(R, dtype=torch.float64).index_add_(0, rep, s)  # S_r
        own = (per_rep.T - c * s_rep[None, :]).reshape(-1) / B  # [C·R]: (A_r[i] − c·S_r)/B at i·R + r
        totals = (C * per_rep.sum(0) - c * float(s_rep.sum())) / B
        return own, labels, totals
    own = torch.empty(C * R, dtype=torch.float64)
    totals = torch.zeros(C, dtype=torch.float64)
    step = max(1, CHUNK_BYTES // (R * B * C * 8 * 6))  # labels per chunk; ~6 [R·B, C] doubles in flight each
    for first in range(0, C, step):
        chunk = torch.arange(first, min(C, first + step))
        dz = logit_grads(logits.repeat(len(chunk), 1), chunk.repeat_interleave(R * B), ctx.loss)
        batch = (torch.arange(len(chunk)).repeat_interleave(R * B)) * R + rep.repeat(len(chunk))
        rows = batch_row_sums(dz, s.repeat(len(chunk)), batch, len(chunk) * R, 1.0 / B)  # [|chunk|·R, C]
        own[first * R:(first + len(chunk)) * R] = rows[torch.arange(len(rows)), chunk.repeat_interleave(R)]
        totals += rows.sum(0)
    return own, labels, totals


class _LLGBase(Attack):
    paper = "Wainakh et al., User-Level Label Leakage from Gradients in Federated Learning, PoPETs 2022"

    def estimate(self, ctx: Context, g: torch.Tensor) -> tuple[float, torch.Tensor, dict[str, Any]]:
        raise NotImplementedError

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        g = row_sums(ctx.require_grad_weight())
        B = ctx.require_batch_size()
        impact, offsets, extra = self.estimate(ctx, g)
        impact, warnings = _safe_impact(impact, g, B)
        counts = llg_extract(g, impact, offsets, B)
        if int((g < 0).sum()) > B:
            warnings.append(f"{int((g < 0).sum())} classes have negative gradients but B = {B}; "
                            "kept the most negative")
        return LabelOutput(counts, diagnostics={"impact": impact, "offsets": offsets, **extra}, warnings=warnings)


@register
class LLG(_LLGBase):
    """LLG: gradients only. m = (Σ_{g_i<0} g_i / B)·(1 + 1/C) (Eq. 12), offsets 0."""

    name = "llg"
    summary = "label counts from gradient row sums; impact from the negative rows"
    requires = Requirements(needs_nonneg_features=True)

    def estimate(self, ctx: Context, g: torch.Tensor) -> tuple[float, torch.Tensor, dict[str, Any]]:
        impact = float(g[g < 0].sum()) / ctx.require_batch_size() * (1 + 1 / ctx.num_classes)
        return impact, torch.zeros_like(g), {}


@register
class LLGStar(_LLGBase):
    """LLG*: white-box model. R = 10 dummy batches per class on the same model give the impact (Eq. 13)
    and offsets (Eq. 14). Dummy images are U(0, 1) pixels normalised like the data (the reference
    `random_()` draws huge integers, a bug); the same R·B images serve every label, which is exact because
    the label changes only ∂ℓ/∂z, not the forward pass."""

    name = "llg-star"
    summary = "LLG with impact and offsets estimated on dummy batches through the model"
    requires = Requirements(needs_model_forward=True, needs_nonneg_features=True)
    Options: ClassVar[type[AttackOptions]] = LLGEstimateOptions
    options: LLGEstimateOptions
    memory_hint = "-O llg-star.repeats"

    def memory_bytes(self, ctx: Context) -> int:
        C, n = ctx.num_classes, self.options.repeats * (ctx.batch_size or 1)
        image = 4 * int(torch.Size(ctx.input_shape or (1,)).numel())
        return (n * (4 * C + 8) + min(n * image, DUMMY_CHUNK_BYTES) + min(n * C * 8 * 8, CHUNK_BYTES)
                + 8 * self.options.repeats * C * 3)

    def estimate(self, ctx: Context, g: torch.Tensor) -> tuple[float, torch.Tensor, dict[str, Any]]:
        C, B, R = ctx.num_classes, ctx.require_batch_size(), self.options.repeats
        h_sums, z = ctx.dummy_forward(R * B, "random", self.rng(ctx))  # [R·B], [R·B, C]
        own, labels, totals = _dummy_statistics(ctx, h_sums, z, R, B)
        impact, offsets = _impact_offsets(own, labels, totals, R * C, B, C)
        return impact, offsets, {"dummy": "random", "repeats": R}


@register
class LLGPlus(_LLGBase):
    """LLG+: auxiliary data. As LLG*, with batches of B auxiliary images of class i (drawn with replacement,
    seeded); with classes missing from the auxiliary data, the impact averages over the classes present."""

    name = "llg-plus"
    summary = "LLG with impact and offsets estimated on auxiliary data"
    requires = Requirements(needs_aux=True, needs_model_forward=True, needs_nonneg_features=True)
    Options: ClassVar[type[AttackOptions]] = LLGEstimateOptions
    options: LLGEstimateOptions
    memory_hint = "-O llg-plus.repeats"

    def memory_bytes(self, ctx: Context) -> int:
        C, N = ctx.num_classes, len(ctx.aux) if ctx.aux is not None else 0
        return 8 * (3 * N + 2 * self.options.repeats * C + 2 * C) + min(N * C * 8 * 6, CHUNK_BYTES)

    def estimate(self, ctx: Context, g: torch.Tensor) -> tuple[float, torch.Tensor, dict[str, Any]]:
        C, B = ctx.num_classes, ctx.require_batch_size()
        h, z, y = ctx.aux_forward()
        gen = self.rng(ctx)
        # every pick of class c sits in a batch labelled c: its logit gradient is fixed, so a batch's row sums are
        # sums of per-example rows v_n = ∂ℓ_n/∂z·Σ_k h_nk, and only two statistics of them are needed: the own
        # entry v_n[y_n] of every pick, and Σ_n (picks of n)·v_n — streamed over the aux examples, twice
        s = h.double().sum(1)
        step = max(1, CHUNK_BYTES // (C * 8 * 6))

        whole = step >= len(y)  # small enough to keep: one pass over the aux examples instead of two
        kept: dict[int, torch.Tensor] = {}

        def rows(part: slice) -> torch.Tensor:
            if part.start in kept:
                return kept[part.start]
            v = logit_grads(z[part], y[part], ctx.loss) * s[part, None]
            if whole:
                kept[part.start] = v
            return v

        own_entry = torch.empty(len(y), dtype=torch.float64)
        for first in range(0, len(y), step):
            part = slice(first, first + step)
            own_entry[part] = rows(part)[torch.arange(len(y[part])), y[part]]
        pools = {int(c): pool for c, pool in zip(*_class_pools(y), strict=True)}
        present = sorted(pools)
        picked = torch.zeros(len(y), dtype=torch.float64)
        own_list, batch_label = [], []
        for _ in range(self.options.repeats):
            for c in present:
                pick = pools[c][torch.randint(len(pools[c]), (B,), generator=gen)]
                picked.index_add_(0, pick, torch.ones(B, dtype=torch.float64))
                own_list.append(float(own_entry[pick].sum()) / B)
                batch_label.append(c)
        totals = torch.zeros(C, dtype=torch.float64)
        for first in range(0, len(y), step):
            part = slice(first, first + step)
            totals += (picked[part, None] * rows(part)).sum(0)
        own = torch.tensor(own_list, dtype=torch.float64)
        impact, offsets = _impact_offsets(own, torch.tensor(batch_label), totals / B, len(batch_label), B, C)
        return impact, offsets, {"aux_classes": len(present), "repeats": self.options.repeats}
