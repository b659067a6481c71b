"""Posterior-probability label recovery (Zhang, Guo & Li, ICLR 2024 PML workshop, Theorem 2): counts from the
bias gradient and the positive/negative posteriors of the global model on auxiliary data, for CE, focal loss,
BCE, τ and ε. Notes: docs/methods/label-recovery.md#posterior."""

from __future__ import annotations

import torch

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import class_posteriors, round_counts
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements

P_MAX = 1 - 1e-7
DEN_MIN = 1e-9


def focal_coefficient(p_pos: torch.Tensor, gamma: float, alpha: float, temperature: float) -> torch.Tensor:
    """φ̂_j = (1/τ)·α·(1 − p̂⁺)^γ·(1 − γ·p̂⁺·ln p̂⁺ / (1 − p̂⁺)) (Zhang, Guo & Li, Theorem 2); φ̂ = 1/τ for CE.

    ``p_pos`` must already be clamped below 1; as p̂⁺ → 1 the term tends to 0 (for γ > 0), handled by clamping.
    """
    p = p_pos.double()
    if gamma == 0:
        return torch.full_like(p, alpha / temperature)
    return (alpha / temperature) * (1 - p).pow(gamma) * (1 - gamma * p * torch.log(p) / (1 - p))


@register
class Posterior(Attack):
    """λ_j = B·[(p̂⁻_j − y⁻) − ∇b̄_j/φ̂_j] / [(p̂⁻_j − y⁻) − (p̂⁺_j − y⁺)] (Theorem 2), then clipped to [0, B] and
    rounded to sum to B by largest remainder (the paper leaves the rounding open).

    p̂⁺_j / p̂⁻_j: mean posterior of class j over auxiliary examples of / not of class j, with the temperature
    applied (softmax; sigmoid for BCE, whose logit gradient σ(z) − y has the same form). Label embedding:
    the paper writes smoothing as y⁺ = 1 − ε, y⁻ = ε/(C − 1); gleak's captures define smoothing as PyTorch
    does (y⁺ = 1 − ε + ε/C, y⁻ = ε/C) and we use the capture's definition, since that produced the gradient.
    """

    name = "posterior"
    paper = ("Zhang, Guo & Li, Posterior Probability-based Label Recovery Attack in Federated Learning, "
             "ICLR 2024 workshop on privacy regulation and protection in ML")
    summary = "label counts from the bias gradient and aux-data posteriors; focal/BCE/τ/ε aware"
    requires = Requirements(needs_bias=True, needs_aux=True, needs_model_forward=True)

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        C, B = ctx.num_classes, ctx.require_batch_size()
        loss = ctx.loss
        _, z, y = ctx.aux_forward()
        p_pos, p_neg, n_pos = class_posteriors(z, y, C, loss.temperature, bce=loss.name == "bce")
        warnings = []
        missing = (n_pos == 0).nonzero().flatten().tolist()
        if missing:
            warnings.append(f"no auxiliary examples of classes {missing}; their counts are unreliable")
        if bool((p_pos > P_MAX).any()):
            warnings.append(f"p̂⁺ ≈ 1 for classes {(p_pos > P_MAX).nonzero().flatten().tolist()} (a very confident "
                            f"model): clamped to {P_MAX} so that φ̂ stays finite")
        p_pos = p_pos.clamp(1e-12, P_MAX)
        gamma, alpha = (loss.focal_gamma, loss.focal_alpha) if loss.name == "focal" else (0.0, 1.0)
        phi = focal_coefficient(p_pos, gamma, alpha, loss.temperature)
        eps = loss.label_smoothing
        y_pos, y_neg = 1 - eps + eps / C, eps / C
        numerator = (p_neg - y_neg) - ctx.require_grad_bias() / phi
        denominator = (p_neg - y_neg) - (p_pos - y_pos)
        tiny = denominator.abs() < DEN_MIN
        if bool(tiny.any()):
            warnings.append(f"positive and negative posteriors coincide for classes {tiny.nonzero().flatten().tolist()}"
                            "; their counts set to 0")
        lam = B * numerator / torch.where(tiny, torch.ones_like(denominator), denominator)
        lam = torch.where(tiny, torch.zeros_like(lam), lam)
        if not bool(torch.isfinite(lam).all()):
            warnings.append("non-finite count estimates replaced by 0")
        counts = round_counts(lam.clamp(0, B), B)
        return LabelOutput(counts, diagnostics={"raw_counts": lam, "p_pos": p_pos, "p_neg": p_neg, "phi": phi,
                                                "loss": loss.name, "gamma": gamma, "temperature": loss.temperature,
                                                "smoothing": eps}, warnings=warnings)


__all__ = ["Posterior", "focal_coefficient"]
