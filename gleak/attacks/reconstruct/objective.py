"""Gradient-matching objective shared by dlg, ig and feature (Wang, Liang & He, ICLR 2024, Eq. 8; Geiping et al.,
NeurIPS 2020, Eq. 4). Notes: docs/methods/reconstruction.md#objective.

L(x) = D(∇θ ℓ(f(x), y), ∇θ*) + β·D_f(h(x), h*) + λ_TV·TV(x), where ∇θ* is the captured gradient, y the fixed
training targets, h(x) the dummy's last-layer input and h* the recovered feature.

* l2: D = Σ_i ‖g_i − g*_i‖² (DLG), D_f = ‖h − h*‖².
* cosine: D = 1 − Σ_i⟨g_i, g*_i⟩ / (‖g‖·‖g*‖) with the norms over all tensors jointly (Inverting Gradients),
  D_f = 1 − cos(h, h*).
* TV: anisotropic, mean |Δx| + mean |Δy| of the dummy in model-input space (the inversefed code of Geiping et
  al. and Wang, Liang & He's code; docs/methods/reconstruction.md#tv).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import nn

from gleak.attacks.context import Context
from gleak.errors import GleakError
from gleak.losses import client_loss
from gleak.models.modes import batch_statistics

DISTANCES = ("l2", "cosine")


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation of images [B, C, H, W] (mean absolute neighbour differences)."""
    if x.dim() != 4:
        return x.new_zeros(())
    return (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean() + (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean()


def _total(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """Σ of tensors, added left to right as the builtin ``sum`` does (whose empty sum is the int 0)."""
    items = iter(terms)
    total = next(items, None)
    if total is None:
        raise GleakError("the model has no trainable parameters: no gradient to match")
    for term in items:
        total = total + term
    return total


class GradientMatcher:
    """Evaluates L(x) for dummy inputs x; differentiable in x (double backward through the model)."""

    def __init__(self, ctx: Context, targets: torch.Tensor, distance: str, beta: float = 0.0,
                 feature: torch.Tensor | None = None, tv: float = 0.0) -> None:
        if distance not in DISTANCES:
            raise GleakError(f"distance must be one of {', '.join(DISTANCES)}, got '{distance}'")
        if beta and feature is None:
            raise GleakError("the feature term needs a recovered last-layer feature")
        self.model = ctx.require_model()
        self.batch_stats = ctx.batch_stats  # BatchNorm on the dummy batch's statistics, as the client's step
        self.params, self.target = ctx.parameter_gradients()
        self.target_norm = torch.sqrt(_total((g * g).sum() for g in self.target))
        if not torch.isfinite(self.target_norm) or self.target_norm == 0:
            raise GleakError("the captured gradient is zero or not finite: nothing to match")
        self.targets = targets.to(ctx.device, torch.float32)
        # the targets already include any label smoothing; the captured gradient is mean-reduced
        self.loss_spec = replace(ctx.loss, label_smoothing=0.0, reduction="mean")
        self.distance, self.beta, self.tv = distance, beta, tv
        self.feature = feature.to(ctx.device, torch.float32).flatten() if feature is not None else None
        self.layer: nn.Module = self.model.get_submodule(ctx.layer.name)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        handle = None
        if self.beta:
            handle = self.layer.register_forward_hook(lambda _m, args, _o: captured.append(args[0].flatten(1)))
        try:
            with batch_statistics(self.model, self.batch_stats):
                logits = self.model(x)
        finally:
            if handle is not None:
                handle.remove()
        loss = client_loss(logits, self.targets, self.loss_spec)
        grads = torch.autograd.grad(loss, self.params, create_graph=True)
        if self.distance == "l2":
            value = _total(((g - t) ** 2).sum() for g, t in zip(grads, self.target, strict=True))
        else:
            dot = _total((g * t).sum() for g, t in zip(grads, self.target, strict=True))
            norm = torch.sqrt(_total((g * g).sum() for g in grads)).clamp_min(1e-30)
            value = 1 - dot / (norm * self.target_norm)
        if self.beta:
            if self.feature is None:  # __init__ refuses β without a feature
                raise GleakError("the feature term needs a recovered last-layer feature")
            h = captured[0].mean(0)  # single example: its feature
            if self.distance == "l2":
                value = value + self.beta * ((h - self.feature) ** 2).sum()
            else:
                value = value + self.beta * (1 - torch.nn.functional.cosine_similarity(h, self.feature, dim=0))
        if self.tv:
            value = value + self.tv * total_variation(x)
        return value
