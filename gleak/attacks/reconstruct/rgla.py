"""RGLA: Reverse Gradient Leakage Attack using Inverted Cross-Entropy Loss Function (anonymous authors, ICLR 2024
submission under double-blind review).

1. Recover the batch's model outputs Ŷ′ [B, C] from the last layer's gradient by solving Prop. 1
   (∇W·Wᵀ = D′ᵀ(Ŷ′ − 1bᵀ)), Eq. 3 (∇b = D′ᵀ1) and Prop. 2 (the batch loss ≈ −(1/B)·Σ ln(∇b_y + λ_y/B)),
   where D′ = ∂ℓ/∂Ŷ′ (Eq. 4–7);
2. features F′ = pinv(D′ᵀ)·∇W (Eq. 5);
3. images = G(F′) with a generator trained on auxiliary data.

Where gleak departs from the paper, and why (measured in bench/rgla.py; docs/methods/generative.md#rgla):

* solver ``lm`` (default): Levenberg–Marquardt on the scaled residuals instead of 20,000 Adam steps. The paper's
  losses are sums of squares of exactly these residuals; LM reaches their zero in tens of evaluations where
  Adam stalls at 10⁻²–10⁻⁵ logit error. ``solver=adam`` runs the paper's Adam (α = 10⁴, 1, 100; lr 10⁻³).
* two stages per start: with Prop. 2, then on the exact equations alone (Prop. 2 is an approximation whose
  error grows with accuracy, Table 5; it should pick the basin, not bias the answer);
* starts: FGLA's features pushed through the last layer (Table 7 finds this the fastest start), with a little
  noise so that equal labels do not start — and so stay — equal; plus ``restarts`` standard-normal starts.
  The random starts run only when the FGLA start does not solve the exact equations (``all_starts`` runs them
  all); among the end points that solve them, the one nearest Prop. 2's loss is kept.

Not applicable beyond B = C + 1 (more unknowns than equations, §4.2 and §6), without a bias, or without the
model's last-layer weights. Without a generator it returns the logits and features only.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.reconstruct.disaggregate import (
    OutputSystem,
    adam_fit,
    batch_loss_estimate,
    choose,
    features_from_outputs,
    fgla_features,
    fit_outputs,
)
from gleak.attacks.reconstruct.generative import GenerativeAttack
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements

START_NOISE = 1e-3  # relative size of the noise added to the FGLA start (breaks the symmetry of equal labels)


class RGLAOptions(AttackOptions):
    solver: Literal["lm", "adam"] = Field(
        "lm", description="lm: Levenberg–Marquardt on the scaled equations (gleak's default); adam: the paper's "
                          "Adam on Eq. 7")
    restarts: int = Field(2, ge=0, le=1000, description="lm: standard-normal starts tried after the FGLA start "
                                                        "(all of them with all_starts, else only while no start has "
                                                        "solved the equations exactly)")
    all_starts: bool = Field(False, description="lm: run every start and keep the exact solution nearest Prop. 2's "
                                                "loss, even when the FGLA start already solves the equations")
    evaluations: int = Field(500, ge=1, le=1_000_000, description="lm: residual evaluations per stage and start")
    loss_weight: float = Field(1.0, ge=0, le=1e6, description="lm: weight of Prop. 2's loss equation in the first "
                                                              "stage (0: exact equations only)")
    iterations: int = Field(20_000, ge=1, le=10_000_000, description="adam: steps (paper: 20,000)")
    lr: float = Field(1e-3, gt=0, le=1e3, description="adam: step size (paper: 10⁻³)")
    alpha_w: float = Field(1e4, ge=0, le=1e12, description="adam: weight α1 of L_w (paper: 10⁴)")
    alpha_b: float = Field(1.0, ge=0, le=1e12, description="adam: weight α2 of L_b (paper: 1)")
    alpha_loss: float = Field(100.0, ge=0, le=1e12, description="adam: weight α3 of L_loss (paper: 100)")


@register
class RGLA(GenerativeAttack):
    name = "rgla"
    paper = ("RGLA: Reverse Gradient Leakage Attack using Inverted Cross-Entropy Loss Function (anonymous, ICLR 2024 "
             "submission)")
    summary = ("recovers each example's logits from the last layer's gradient, then its feature (Eq. 5), then "
               "an image through a trained generator; works with repeated labels, B ≤ C + 1")
    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_bias=True)
    Options: ClassVar[type[AttackOptions]] = RGLAOptions

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        B, C = ctx.batch_size, ctx.num_classes
        if B is not None and B > C + 1:
            return (f"B = {B} > C + 1 = {C + 1}: the gradient's C² + C equations cannot determine B·C = {B * C} "
                    "outputs (RGLA paper, §4.2)")
        return None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        opts = self.used_options()
        assert isinstance(opts, RGLAOptions)
        targets = self.targets(ctx, inputs)
        gw, gb = ctx.require_grad_weight(), ctx.require_grad_bias()
        weight, bias = ctx.layer.weight.double().cpu(), ctx.require_bias().double().cpu()
        B, C = targets.shape
        labels = targets.argmax(1)
        warnings: list[str] = []
        hard = bool(torch.allclose(targets, torch.nn.functional.one_hot(labels, C).to(targets.dtype)))
        estimate, kept = (batch_loss_estimate(gb, labels, C) if hard else (None, 0))
        if not hard:
            warnings.append("soft targets (label smoothing or mixup): Prop. 2's loss estimate needs hard labels and "
                            "is left out")
        elif estimate is None:
            warnings.append("Prop. 2's loss estimate is undefined for this gradient (every log argument ≤ 0); "
                            "it is left out")
        system = OutputSystem(gw.cpu(), gb.cpu(), weight, bias, targets.cpu(), estimate)
        gen = self.rng(ctx)
        progress = inputs.progress
        if opts.solver == "adam":
            start = torch.randn((B, C), generator=gen, dtype=torch.float64)
            fit = choose(system, [adam_fit(system, start, alphas=(opts.alpha_w, opts.alpha_b, opts.alpha_loss),
                                           lr=opts.lr, iterations=opts.iterations, progress=progress)])
        else:
            f0 = fgla_features(gw.cpu(), gb.cpu(), labels)
            y0 = f0 @ weight.T + bias
            y0 = y0 + START_NOISE * float(y0.std().clamp_min(1e-12)) * torch.randn(y0.shape, generator=gen,
                                                                                    dtype=torch.float64)
            starts = [("fgla", y0)] + [(f"randn{k + 1}", torch.randn((B, C), generator=gen, dtype=torch.float64))
                                       for k in range(opts.restarts)]
            fit = fit_outputs(system, starts, max_evaluations=opts.evaluations, loss_weight=opts.loss_weight,
                              stop_when_exact=not opts.all_starts, progress=progress)
        if not fit.exact:
            warnings.append(f"no start solved the gradient equations exactly (best squared residual "
                            f"{fit.chosen.residual:.2e}): the logits and features are approximate")
        if B >= C:
            warnings.append(f"B = {B} ≥ C = {C}: D′ has rank ≤ C − 1 < B, so Eq. 5 fixes the features only up to "
                            "one direction (the least-norm solution is used)")
        features = features_from_outputs(gw.cpu(), fit.d)
        diag: dict[str, Any] = {
            "solver": opts.solver, "labels": labels.tolist(), "loss_estimate": estimate,
            "loss_estimate_terms": kept, "exact": fit.exact, "chosen_start": fit.chosen.start,
            "residual": fit.chosen.residual, "loss_gap": fit.chosen.loss_gap, "evaluations_run": fit.evaluations,
            "candidates": [{"start": c.start, "residual": c.residual, "loss_gap": c.loss_gap,
                            "evaluations": c.evaluations} for c in fit.candidates],
            "examples_sharing_a_label": int(B - len(torch.unique(labels))),
        }
        return self.decode(ctx, inputs, features, diag, {"logits": fit.logits.float()}, warnings)
