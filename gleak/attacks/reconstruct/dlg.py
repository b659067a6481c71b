"""DLG (Zhu et al., NeurIPS 2019): match the captured gradient in L2 with L-BFGS, labels fixed.

Zhu et al. optimise the label jointly; like iDLG and Wang, Liang & He (ICLR 2024, §4.3, "we fix the labels
and only optimize the input image") gleak fixes the labels to those recovered beforehand. Defaults: L-BFGS
lr 1, up to 20 inner iterations per step, 300 steps (as Wang, Liang & He's code runs on LeNet; see
``OPTIMISERS`` in base.py for measurements), no image prior (as DLG).
Notes: docs/methods/reconstruction.md#dlg.
"""

from __future__ import annotations

from typing import ClassVar

from gleak.attacks.base import ImageOutput, register
from gleak.attacks.context import Context
from gleak.attacks.reconstruct.base import ReconstructionAttack


@register
class DLG(ReconstructionAttack):
    name = "dlg"
    paper = "Zhu, Liu & Han, Deep Leakage from Gradients, NeurIPS 2019"
    summary = "inputs whose gradient matches the capture in L2 (L-BFGS), labels fixed"
    default_tv: ClassVar[float] = 0.0

    def run(self, ctx: Context) -> ImageOutput:
        return self.match_gradients(ctx, "l2", self.default_tv if self.options.tv is None else self.options.tv)
