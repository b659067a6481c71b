"""DLG (Zhu et al., NeurIPS 2019): match the captured gradient in L2 with L-BFGS, labels fixed.

Zhu et al. optimise the label jointly; like iDLG and Wang, Liang & He (ICLR 2024, §4.3, "we fix the labels
and only optimize the input image") gleak fixes the labels to those recovered beforehand. Defaults: L-BFGS
lr 1, up to 20 inner iterations per step, 300 steps (as Wang, Liang & He's code runs on LeNet; see
``OPTIMISERS`` in base.py for measurements), no image prior (as DLG).
Notes: docs/methods/reconstruction.md#dlg.
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
    MAX_WEIGHT,
    OPTIMISERS,
    ReconSettings,
    ReconstructionAttack,
)
from gleak.attacks.registry import register


class DLGOptions(ReconSettings):
    iterations: int | None = Field(OPTIMISERS["l2"][1], ge=1, le=MAX_ITERATIONS, description="L-BFGS outer steps "
                                   "(each up to 20 evaluations)")
    lr: float | None = Field(OPTIMISERS["l2"][2], gt=0, le=MAX_STEP, description="L-BFGS step size (> 0)")
    tv: float = Field(0.0, ge=0, le=MAX_WEIGHT, description=HELP["tv"] + "; DLG uses none")


@register
class DLG(ReconstructionAttack):
    name = "dlg"
    paper = "Zhu, Liu & Han, Deep Leakage from Gradients, NeurIPS 2019"
    summary = "inputs whose gradient matches the capture in L2 (L-BFGS), labels fixed"
    Options: ClassVar[type[AttackOptions]] = DLGOptions

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        return self.match_gradients(ctx, inputs)
