"""What the generative attacks (fgla, rgla) share: per-example features from the last layer's gradient, then
images from a generator trained on auxiliary data (``gleak train-generator``).

They need no forward pass of the client's batch and no optimisation over pixels; their images are only as
good as the generator (its held-out PSNR is the ceiling). Without a generator they still return what they
recover (features, and rgla's logits) in :attr:`ImageOutput.recovered`, with a warning instead of images.
Notes: docs/methods/generative.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from gleak.attacks.base import ImageOutput, Requirements
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions, resolve_options
from gleak.attacks.reconstruct.base import ReconstructionAttack
from gleak.errors import GleakError

NO_GENERATOR = ("no generator was given, so no images: the recovered features (and logits) are written instead; "
                "train one with `gleak train-generator` and pass --generator")


class GenerativeAttack(ReconstructionAttack):
    """Base of fgla and rgla: labels as targets in, features (and images through the generator) out."""

    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_bias=True)

    def __init__(self) -> None:
        super().__init__()
        self.typed: AttackOptions = self.Options()

    def configure(self, values: Mapping[str, Any] | None = None,
                  sources: Mapping[str, str] | None = None) -> AttackOptions:
        """Validate ``values`` into this attack's own options; the run inputs (targets, generator, progress) stay
        in :attr:`options`."""
        self.typed = resolve_options(type(self), values or {}, sources)
        return self.typed

    def used_options(self) -> AttackOptions:
        return self.typed

    def not_applicable(self, ctx: Context) -> str | None:
        return ctx.check_requirements(self.requires) or self.generator_problem(ctx)

    def generator_problem(self, ctx: Context) -> str | None:
        """Why the given generator does not fit this model and capture (None if it does, or none is given)."""
        from gleak.generator.file import check_fits

        gen = self.options.generator
        if gen is None:
            return None
        try:
            check_fits(gen, model_sha256=ctx.model_check.actual if ctx.model_check is not None else None,
                       layer=ctx.layer.name, feature_dim=ctx.layer.feature_dim, input_shape=ctx.input_shape)
        except GleakError as e:
            return str(e)
        return None

    def hard_labels(self, ctx: Context) -> torch.Tensor:
        """One class per example from the targets (the top class of each row)."""
        return self.targets(ctx).argmax(1)

    def decode(self, ctx: Context, features: torch.Tensor, diagnostics: dict[str, Any],
               recovered: dict[str, torch.Tensor], warnings: list[str]) -> ImageOutput:
        """Images from ``features`` through the generator (or none, with a warning, without one)."""
        from gleak.generator.file import check_fits

        gen = self.options.generator
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
