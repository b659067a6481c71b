"""What every reconstruction attack shares: its options, the requirements, and model input <-> pixels.

Two kinds of settings, kept apart: the user's *options* (iterations, restarts, lr, tv and per attack distance,
beta, signed), declared as frozen typed models (:class:`ReconSettings` and its subclasses in dlg.py, ig.py,
feature.py) and set only through :meth:`~gleak.attacks.base.Attack.configure`; and the *run inputs* (targets,
feature, progress, generator) that the caller hands each run as :class:`~gleak.attacks.base.RunInputs`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.reconstruct.objective import DISTANCES, GradientMatcher
from gleak.attacks.reconstruct.optimize import adam, lbfgs
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError

# distance -> (optimiser, default iterations, default step size): DLG's L-BFGS for L2 (300 steps of up to
# 20 inner iterations, as Wang, Liang & He's code (ICLR 2024) runs on LeNet: on CIFAR-10 images 0–2 with the
# iDLG CNN, dlg reaches 53/25/26 dB after 100 steps and 67/42/45 dB after 300, in ≤ 6,800 evaluations, under a
# minute on one core; steps after convergence end early and cost a few evaluations each), Inverting Gradients'
# Adam for cosine (its CIFAR-10 schedule, 4,800 steps). See docs/methods/reconstruction.md#optimisers.
OPTIMISERS: dict[str, tuple[str, int, float]] = {"l2": ("lbfgs", 300, 1.0), "cosine": ("adam", 4800, 0.1)}
MAX_ITERATIONS = 10_000_000
MAX_RESTARTS = 1_000
MAX_STEP, MAX_WEIGHT = 1e6, 1e12
Distance = Literal["l2", "cosine"]  # DISTANCES of objective.py
HELP = {
    "iterations": "optimiser steps: L-BFGS outer steps (up to 20 evaluations each) or Adam steps; auto: 300 "
                  "for l2, 4800 for cosine",
    "restarts": "random restarts; the one with the lowest loss is kept",
    "lr": "step size (> 0); auto: 1 for l2 (L-BFGS), 0.1 for cosine (Adam)",
    "tv": "weight of the total-variation prior (≥ 0)",
    "distance": "gradient distance: l2 (L-BFGS, as DLG) or cosine (Adam, as Inverting Gradients)",
    "beta": "weight β of the feature term (≥ 0)",
    "signed": "Adam on the signed gradient (Inverting Gradients' variant)",
}


class ReconSettings(AttackOptions):
    """Options of every gradient-matching attack; None (iterations, lr) means the optimiser's default
    (L-BFGS: 300 steps, lr 1; Adam: 4,800 steps, lr 0.1)."""

    iterations: int | None = Field(None, ge=1, le=MAX_ITERATIONS, description=HELP["iterations"])
    restarts: int = Field(1, ge=1, le=MAX_RESTARTS, description=HELP["restarts"])
    lr: float | None = Field(None, gt=0, le=MAX_STEP, description=HELP["lr"])
    tv: float = Field(1e-2, ge=0, le=MAX_WEIGHT, description=HELP["tv"])


class ReconstructionAttack(Attack):
    """Base of the image attacks. Options are typed (:meth:`configure`); the run inputs (targets, feature,
    progress, generator) come with each run as :class:`~gleak.attacks.base.RunInputs`."""

    task: ClassVar[str] = "reconstruct"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_model_forward=True,
                                                    needs_batch_forward=True)

    def used_options(self) -> AttackOptions:
        """The attack's typed options, an automatic iteration count or step size replaced by the value the
        optimiser uses."""
        typed = self.options
        if isinstance(typed, ReconSettings):
            _, iterations, lr = OPTIMISERS[self.distance(typed)]
            fill = {k: v for k, v in (("iterations", iterations), ("lr", lr)) if getattr(typed, k) is None}
            return typed.model_copy(update=fill) if fill else typed
        return typed

    def settings(self) -> ReconSettings:
        """:meth:`used_options` of a gradient-matching attack."""
        typed = self.used_options()
        if not isinstance(typed, ReconSettings):
            raise TypeError(f"{self.name} has no gradient-matching options")
        return typed

    def distance(self, settings: ReconSettings) -> str:
        """The gradient distance the attack matches with under ``settings``."""
        return str(getattr(settings, "distance", "l2"))

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        if ctx.input_shape is None:
            return "needs the input shape (gleak.input_shape in the capture, or a zoo model)"
        return None

    def targets(self, ctx: Context, inputs: RunInputs) -> torch.Tensor:
        """The run's targets, checked against B and C."""
        t = inputs.targets
        if t is None:
            raise GleakError("reconstruction needs labels (targets); none were given")
        if t.shape != (ctx.batch_size, ctx.num_classes):
            raise GleakError(f"labels of shape {list(t.shape)} do not fit B = {ctx.batch_size}, "
                             f"C = {ctx.num_classes}")
        return t

    def match_gradients(self, ctx: Context, inputs: RunInputs, beta: float = 0.0) -> ImageOutput:
        """Gradient matching (objective.py) with the distance's optimiser, all settings from
        :meth:`settings`; dlg, ig and feature differ only in the distance, the TV weight and the feature term β."""
        s = self.settings()
        distance = self.distance(s)
        if distance not in DISTANCES:
            raise GleakError(f"--distance must be one of {', '.join(DISTANCES)}, got '{distance}'")
        optimiser = OPTIMISERS[distance][0]
        iterations, lr, tv, signed = s.iterations, s.lr, s.tv, bool(getattr(s, "signed", False))
        assert iterations is not None and lr is not None  # filled in by used_options
        matcher = GradientMatcher(ctx, self.targets(ctx, inputs), distance, beta=beta, feature=inputs.feature, tv=tv)
        shape = (ctx.require_batch_size(), *ctx.require_input_shape())
        if optimiser == "lbfgs":
            sol = lbfgs(matcher, shape, iterations, s.restarts, lr, self.rng(ctx), ctx.device, inputs.progress)
        else:
            sol = adam(matcher, shape, iterations, s.restarts, lr, self.rng(ctx), ctx.device, input_box(ctx),
                       signed, inputs.progress)
            optimiser = "adam-signed" if signed else "adam"
        diag: dict[str, Any] = {"distance": distance, "optimizer": optimiser, "iterations": iterations,
                                "restarts": s.restarts, "tv": tv, "beta": beta, "loss": sol.loss,
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
