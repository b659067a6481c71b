"""What the generative attacks (fgla, rgla) share: per-example features from the last layer's gradient, then
images from a generator trained on auxiliary data (``gleak train-generator``).

They need no forward pass of the client's batch and no optimisation over pixels; their images are only as
good as the generator (its held-out PSNR is the ceiling). Without a generator they still return what they
recover (features, and rgla's logits) in :attr:`ImageOutput.recovered`, with a warning instead of images.
Notes: docs/methods/generative.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.reconstruct.base import ReconstructionAttack
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError

NO_GENERATOR = ("no generator was given, so no images: the recovered features (and logits) are written instead; "
                "train one with `gleak train-generator` and pass --generator")


class GenerativeAttack(ReconstructionAttack):
    """Base of fgla and rgla: labels as targets in, features (and images through the generator) out."""

    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_bias=True)

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        return ctx.check_requirements(self.requires) or self.generator_problem(ctx, inputs)

    def generator_problem(self, ctx: Context, inputs: RunInputs) -> str | None:
        """Why the run's generator does not fit this model and capture (None if it does, or none is given)."""
        from gleak.generator.file import check_fits

        gen = inputs.generator
        if gen is None:
            return None
        try:
            check_fits(gen, model_sha256=ctx.model_check.model_sha256 if ctx.model_check is not None else None,
                       layer=ctx.layer.name, feature_dim=ctx.layer.feature_dim, input_shape=ctx.input_shape)
        except GleakError as e:
            return str(e)
        return None

    def hard_labels(self, ctx: Context, inputs: RunInputs) -> torch.Tensor:
        """One class per example from the targets (the top class of each row)."""
        return self.targets(ctx, inputs).argmax(1)

    def decode(self, ctx: Context, inputs: RunInputs, features: torch.Tensor, diagnostics: dict[str, Any],
               recovered: dict[str, torch.Tensor], warnings: list[str]) -> ImageOutput:
        """Images from ``features`` through the generator (or none, with a warning, without one)."""
        from gleak.generator.file import check_fits

        gen = inputs.generator
        recovered = {**recovered, "features": features.float()}
        if gen is None:
            return ImageOutput(None, diagnostics, [*warnings, NO_GENERATOR], recovered)
        rng = ctx.pixel_range()
        mean = tuple(rng[0].flatten().tolist()) if rng is not None else None
        std = tuple(rng[1].flatten().tolist()) if rng is not None else None
        soft = check_fits(gen, model_sha256=None, layer=ctx.layer.name, feature_dim=ctx.layer.feature_dim,
                          input_shape=None, mean=mean, std=std)
        images = gen.decoder.generate(features.float())
        diagnostics = {**diagnostics, "generator": gen.describe()}
        return ImageOutput(images.clamp(0, 1), diagnostics, [*warnings, *soft], recovered)
