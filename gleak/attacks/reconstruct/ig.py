"""Inverting Gradients (Geiping et al., NeurIPS 2020): cosine gradient distance + total variation, Adam
with step decay, inputs kept in the pixel box, best iterate kept, restarts.

Defaults: 4,800 iterations, lr 0.1, decay ×0.1 at 3/8, 5/8 and 7/8 (the paper's CIFAR-10 schedule), TV
weight 1e-2 (Wang, Liang & He's value for untrained LeNet, ICLR 2024; the paper uses 1e-4 on ImageNet-scale
ResNets), one restart (``--restarts``; the paper uses 8 for its ResNet results). The paper steps Adam on the
*signed* gradient; Wang, Liang & He's cosine runs — the setting of their Table 3 — use plain Adam, and on the
untrained iDLG sigmoid CNN (CIFAR-10, B = 1) plain Adam reached 20–24 dB where the signed variant stalled at
12–16 dB, so plain Adam is the default and ``--signed`` gives the paper's variant.
Notes: docs/methods/reconstruction.md#ig.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.reconstruct.base import (
    HELP,
    MAX_ITERATIONS,
    MAX_STEP,
    OPTIMISERS,
    ReconSettings,
    ReconstructionAttack,
)
from gleak.attacks.registry import register


class IGOptions(ReconSettings):
    iterations: int | None = Field(OPTIMISERS["cosine"][1], ge=1, le=MAX_ITERATIONS, description="Adam steps "
                                   "(step decay ×0.1 at 3/8, 5/8 and 7/8)")
    lr: float | None = Field(OPTIMISERS["cosine"][2], gt=0, le=MAX_STEP, description="Adam step size (> 0)")
    signed: bool = Field(False, description=HELP["signed"])


@register
class InvertingGradients(ReconstructionAttack):
    name = "ig"
    paper = "Geiping, Bauermeister, Dröge & Moeller, Inverting Gradients, NeurIPS 2020"
    summary = "inputs whose gradient points the captured way (cosine + TV prior, Adam), labels fixed"
    Options: ClassVar[type[AttackOptions]] = IGOptions

    def distance(self, settings: ReconSettings) -> str:
        return "cosine"

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        return self.match_gradients(ctx, inputs)
