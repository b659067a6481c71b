"""DLG (Zhu et al., NeurIPS 2019): match the captured gradient in L2 with L-BFGS, labels fixed.

Zhu et al. optimise the label jointly; like iDLG and seed 000 (§5.1, "we fix the labels and only optimise the
input image") gleak fixes the labels to those recovered beforehand. Defaults: L-BFGS lr 1, up to 20 inner
iterations per step, 100 steps (seed 000 runs 300 for LeNet, METHODS §10; on the iDLG CNN 100 steps already
reach 35–40 dB and keep a single example under a minute on a CPU), no image prior (as DLG).
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
