"""What every reconstruction attack shares: its options, the requirements, and model input <-> pixels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from gleak.attacks.base import Attack, ImageOutput, Requirements
from gleak.attacks.context import Context
from gleak.errors import GleakError

# progress(restart, iteration, iterations, loss)
Progress = Callable[[int, int, int, float], None]


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
    notes: list[str] = field(default_factory=list)


class ReconstructionAttack(Attack):
    """Base of the image attacks; the CLI sets :attr:`options` before running one."""

    task: ClassVar[str] = "reconstruct"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_model_forward=True)
    default_iterations: ClassVar[int] = 100

    def __init__(self) -> None:
        self.options = ReconOptions()

    def not_applicable(self, ctx: Context) -> str | None:
        reason = super().not_applicable(ctx)
        if reason:
            return reason
        if ctx.input_shape is None:
            return "needs the input shape (gleak.input_shape in the capture, or a zoo model)"
        return None

    def iterations(self) -> int:
        n = self.options.iterations if self.options.iterations is not None else self.default_iterations
        if n < 1:
            raise GleakError("--iterations must be ≥ 1")
        return n

    def targets(self, ctx: Context) -> torch.Tensor:
        t = self.options.targets
        if t is None:
            raise GleakError("reconstruction needs labels (targets); none were given")
        if t.shape != (ctx.batch_size, ctx.num_classes):
            raise GleakError(f"labels of shape {list(t.shape)} do not fit B = {ctx.batch_size}, "
                             f"C = {ctx.num_classes}")
        return t


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


def image_output(ctx: Context, inputs: torch.Tensor, diagnostics: dict, warnings: list[str]) -> ImageOutput:
    if ctx.pixel_range() is None:
        warnings = [*warnings, "the capture records no gleak.data.mean/std: images are the raw model inputs "
                    "clamped to [0, 1]"]
    return ImageOutput(to_pixels(ctx, inputs), diagnostics, warnings)
