"""LLG, LLG* and LLG+ (Wainakh et al., PoPETs 2022): impact and offset estimation, then Algorithm 1.

Equation and algorithm numbers are those of the 2021 preprint; notes: docs/methods/label-recovery.md#llg.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import batch_row_sums, logit_grads, row_sums
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


def _estimate_from_batches(ctx: Context, features: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                           batch_index: torch.Tensor, batch_label: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Impact (Eq. 13) and offsets (Eq. 14) from simulated one-label batches on the same model."""
    C, B = ctx.num_classes, ctx.require_batch_size()
    dz = logit_grads(logits, labels, ctx.loss)
    rows = batch_row_sums(dz, features.double().sum(1), batch_index, len(batch_label), 1.0 / B)  # [R·C, C]
    own = rows[torch.arange(len(batch_label)), batch_label]  # g_i of the batch labelled i
    impact = float(own.mean()) / B * (1 + 1 / C)  # Eq. 13: Σ_i ḡ_i/(n·B)·(1 + 1/n), averaged over the R runs
    other = torch.ones_like(rows, dtype=torch.bool)
    other[torch.arange(len(batch_label)), batch_label] = False
    offsets = (rows * other).sum(0) / other.sum(0).clamp_min(1)
    return impact, offsets


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

    def estimate(self, ctx: Context, g: torch.Tensor) -> tuple[float, torch.Tensor, dict[str, Any]]:
        C, B, R = ctx.num_classes, ctx.require_batch_size(), self.options.repeats
        images = ctx.dummy_inputs(R * B, "random", self.rng(ctx))
        h, z = ctx.features_and_logits(images)  # [R·B, d], [R·B, C]
        # batch (rep r, label i) holds dummy images r·B … r·B + B − 1, all labelled i
        rep = torch.arange(R * B) // B
        h_all = h.repeat(C, 1)
        z_all = z.repeat(C, 1)
        labels = torch.arange(C).repeat_interleave(R * B)
        batch_index = labels * R + rep.repeat(C)
        batch_label = torch.arange(C).repeat_interleave(R)
        impact, offsets = _estimate_from_batches(ctx, h_all, z_all, labels, batch_index, batch_label)
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

    def estimate(self, ctx: Context, g: torch.Tensor) -> tuple[float, torch.Tensor, dict[str, Any]]:
        C, B = ctx.num_classes, ctx.require_batch_size()
        h, z, y = ctx.aux_forward()
        gen = self.rng(ctx)
        present = [c for c in range(C) if bool((y == c).any())]
        picks, batch_label = [], []
        for _ in range(self.options.repeats):
            for c in present:
                pool = torch.nonzero(y == c).flatten()
                picks.append(pool[torch.randint(len(pool), (B,), generator=gen)])
                batch_label.append(c)
        idx = torch.cat(picks)
        labels = y[idx]
        batch_index = torch.arange(len(batch_label)).repeat_interleave(B)
        impact, offsets = _estimate_from_batches(ctx, h[idx], z[idx], labels, batch_index,
                                                 torch.tensor(batch_label))
        return impact, offsets, {"aux_classes": len(present), "repeats": self.options.repeats}
