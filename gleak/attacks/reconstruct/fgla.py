"""FGLA (Xue et al., Fast Generation-Based Gradient Leakage Attacks, IEEE INFOCOM 2023).

Each example's last-layer input is read off the row of its label: f_i = (∇W[y_i] − o_W)/(∇b[y_i] − o_b), the
offsets o being the mean of the rows of classes absent from the batch times (B − 1)/B (the authors' code);
a generator turns the features into images. Examples that share a label get the same feature, so the same
image: FGLA's known limit, which RGLA (rgla) removes. Notes: docs/methods/generative.md#fgla.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.reconstruct.disaggregate import fgla_features
from gleak.attacks.reconstruct.generative import GenerativeAttack
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements


@register
class FGLA(GenerativeAttack):
    name = "fgla"
    paper = ("Xue et al., Fast Generation-Based Gradient Leakage Attacks against Highly Compressed Gradients, "
             "INFOCOM 2023")
    summary = "each example's feature from its label's gradient row, then a trained generator (duplicates collide)"
    requires: ClassVar[Requirements] = Requirements(needs_bias=True)

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        labels = self.hard_labels(ctx, inputs)
        features = fgla_features(ctx.require_grad_weight(), ctx.require_grad_bias(), labels)
        shared = int(len(labels) - len(torch.unique(labels)))
        warnings = [f"{shared} of {len(labels)} examples share a label with another: FGLA gives them the same "
                    "feature (and image)"] if shared else []
        diag = {"labels": labels.tolist(), "examples_sharing_a_label": shared}
        return self.decode(ctx, inputs, features, diag, {}, warnings)
