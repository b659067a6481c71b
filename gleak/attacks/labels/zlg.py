"""ZLG / ZLG+ (Geng et al., arXiv 2021, as re-implemented in Chen & Vikalo's RLU code): g_j ≈ (p̄_j − n_j/B)·Ō.

Notes: docs/methods/label-recovery.md#zlg.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import CHUNK_BYTES, mean_posterior, round_counts, row_sums
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements

DUMMY_SAMPLES = 256  # the default of ZLGOptions.dummy_samples


class ZLGOptions(AttackOptions):
    dummy_samples: int = Field(DUMMY_SAMPLES, ge=1, le=65_536, description="random dummy inputs that estimate p̄ "
                               "and Ō")


class _ZLGBase(Attack):
    """n_j = [B·p̄_j − B·ε/C − τ·B·g_j/Ō] / (1 − ε), then rounded to sum B.

    From g_j = (1/B)Σ_n (p_nj − y_nj)·O_n/τ with O_n = Σ_k h_nk, approximated by the means p̄_j and Ō
    (the τ and ε terms extend the published formula to the recorded temperature and smoothing).
    p̄_j is the mean posterior of class j over *all* estimation samples, as the derivation asks; RLU's
    ZLG+ code averages only over samples of class j, which we do not follow.
    """

    paper = "Geng et al., Towards General Deep Leakage in Federated Learning, 2021 (ZLG; RLU's re-implementation)"

    def samples(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        B, C = ctx.require_batch_size(), ctx.num_classes
        h, z = self.samples(ctx)
        tau, eps = ctx.loss.temperature, ctx.loss.label_smoothing
        p_bar = mean_posterior(z, tau)
        o_bar = float(h.double().sum(1).mean()) if len(h) else 0.0
        g = row_sums(ctx.require_grad_weight())
        real = (B * p_bar - B * eps / C - tau * B * g / o_bar) / (1 - eps)
        warnings = []
        if ctx.loss.name != "cross_entropy":
            warnings.append(f"ZLG's estimate is derived for cross-entropy; the capture used {ctx.loss.name}")
        return LabelOutput(round_counts(real, B), diagnostics={"raw_counts": real, "p_bar": p_bar, "o_bar": o_bar},
                           warnings=warnings)


@register
class ZLG(_ZLGBase):
    name = "zlg"
    summary = "label counts from row sums with p̄ and Ō estimated on dummy images"
    requires = Requirements(needs_model_forward=True, needs_nonneg_features=True)
    Options: ClassVar[type[AttackOptions]] = ZLGOptions
    options: ZLGOptions
    memory_hint = "-O zlg.dummy_samples"

    def memory_bytes(self, ctx: Context) -> int:
        n, C = self.options.dummy_samples, ctx.num_classes
        image = 4 * int(torch.Size(ctx.input_shape or (1,)).numel())
        return n * (image + 4 * (C + ctx.layer.feature_dim)) + min(n * C * 8 * 3, CHUNK_BYTES)

    def samples(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        return ctx.features_and_logits(ctx.dummy_inputs(self.options.dummy_samples, "random", self.rng(ctx)))


@register
class ZLGPlus(_ZLGBase):
    name = "zlg-plus"
    summary = "ZLG with p̄ and Ō estimated on auxiliary data"
    requires = Requirements(needs_aux=True, needs_model_forward=True, needs_nonneg_features=True)

    def samples(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        h, z, _ = ctx.aux_forward()
        return h, z
