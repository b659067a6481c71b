"""What every reconstruction attack shares: its options, the requirements, and model input <-> pixels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from gleak.attacks.base import Attack, ImageOutput, Requirements
from gleak.attacks.context import Context
from gleak.attacks.reconstruct.objective import DISTANCES, GradientMatcher
from gleak.attacks.reconstruct.optimize import Progress, adam, lbfgs
from gleak.errors import GleakError

# distance -> (optimiser, default iterations, default step size): DLG's L-BFGS for L2 (300 steps of up to
# 20 inner iterations, as Wang, Liang & He's code (ICLR 2024) runs on LeNet: on CIFAR-10 images 0–2 with the
# iDLG CNN, dlg reaches 53/25/26 dB after 100 steps and 67/42/45 dB after 300, in ≤ 6,800 evaluations, under a
# minute on one core; steps after convergence end early and cost a few evaluations each), Inverting Gradients'
# Adam for cosine (its CIFAR-10 schedule, 4,800 steps). See docs/methods/reconstruction.md#optimisers.
OPTIMISERS: dict[str, tuple[str, int, float]] = {"l2": ("lbfgs", 300, 1.0), "cosine": ("adam", 4800, 0.1)}


@dataclass
class ReconOptions:
    """Inputs and knobs of a reconstruction. ``None`` means the attack's own default."""

    targets: torch.Tensor | None = None  # [B, C] training targets as the client's loss saw them
    feature: torch.Tensor | None = None  # [d] last-layer input of the single example (feature, fcn)
    iterations: int | None = None
    restarts: int = 1
    lr: float | None = None
    tv: float | None = None
    distance: str | None = None  # 'l2' or 'cosine' (feature attack)
    beta: float | None = None  # weight of the feature term (feature attack)
    signed: bool | None = None  # Adam on the signed gradient (ig, feature with cosine)
    progress: Progress | None = None


class ReconstructionAttack(Attack):
    """Base of the image attacks; the CLI sets :attr:`options` before running one."""

    task: ClassVar[str] = "reconstruct"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_model_forward=True,
                                                    needs_batch_forward=True)

    def __init__(self) -> None:
        self.options = ReconOptions()

    def not_applicable(self, ctx: Context) -> str | None:
        reason = super().not_applicable(ctx)
        if reason:
            return reason
        if ctx.input_shape is None:
            return "needs the input shape (gleak.input_shape in the capture, or a zoo model)"
        return None

    def targets(self, ctx: Context) -> torch.Tensor:
        t = self.options.targets
        if t is None:
            raise GleakError("reconstruction needs labels (targets); none were given")
        if t.shape != (ctx.batch_size, ctx.num_classes):
            raise GleakError(f"labels of shape {list(t.shape)} do not fit B = {ctx.batch_size}, "
                             f"C = {ctx.num_classes}")
        return t

    def match_gradients(self, ctx: Context, distance: str, tv: float, beta: float = 0.0) -> ImageOutput:
        """Gradient matching (objective.py) with the distance's optimiser; dlg, ig and feature differ only in
        the distance, the TV weight and the feature term β."""
        if distance not in DISTANCES:
            raise GleakError(f"--distance must be one of {', '.join(DISTANCES)}, got '{distance}'")
        o = self.options
        optimiser, default_iterations, default_lr = OPTIMISERS[distance]
        iterations = o.iterations if o.iterations is not None else default_iterations
        if iterations < 1:
            raise GleakError("--iterations must be ≥ 1")
        matcher = GradientMatcher(ctx, self.targets(ctx), distance, beta=beta, feature=o.feature, tv=tv)
        shape = (ctx.require_batch_size(), *ctx.require_input_shape())
        lr = o.lr or default_lr
        if optimiser == "lbfgs":
            sol = lbfgs(matcher, shape, iterations, o.restarts, lr, self.generator(ctx), ctx.device, o.progress)
        else:
            sol = adam(matcher, shape, iterations, o.restarts, lr, self.generator(ctx), ctx.device, input_box(ctx),
                       bool(o.signed), o.progress)
            optimiser = "adam-signed" if o.signed else "adam"
        diag: dict[str, Any] = {"distance": distance, "optimizer": optimiser, "iterations": iterations,
                                "restarts": o.restarts, "tv": tv, "beta": beta, "loss": sol.loss,
                                "best_restart": sol.restart, "restart_losses": sol.losses,
                                "iterations_run": sol.iterations_run, "evaluations_run": sol.evaluations_run}
        return image_output(ctx, sol.inputs, diag)


def to_pixels(ctx: Context, inputs: torch.Tensor) -> torch.Tensor:
    """Model inputs -> images in [0, 1] (undoing gleak.data.mean/std when the capture records them)."""
    x = inputs.detach().float().cpu()
    rng = ctx.pixel_range()
    if rng is not None:
        mean, std = rng
        x = x * std + mean
    if x.dim() == 2 and ctx.input_shape is not None:
        x = x.view(-1, *ctx.input_shape)
    if x.dim() == 3:  # [B, H, W] -> grey
        x = x.unsqueeze(1)
    return x.clamp(0, 1)


def input_box(ctx: Context) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Bounds of valid model inputs (pixels in [0, 1], normalised), shaped to broadcast; None if unknown."""
    rng = ctx.pixel_range()
    if rng is None:
        return None
    mean, std = rng
    return ((0 - mean) / std).to(ctx.device), ((1 - mean) / std).to(ctx.device)


def image_output(ctx: Context, inputs: torch.Tensor, diagnostics: dict[str, Any]) -> ImageOutput:
    warnings = [] if ctx.pixel_range() is not None else [
        "the capture records no gleak.data.mean/std: images are the raw model inputs clamped to [0, 1]"]
    return ImageOutput(to_pixels(ctx, inputs), diagnostics, warnings)
