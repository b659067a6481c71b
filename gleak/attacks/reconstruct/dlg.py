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
from gleak.attacks.reconstruct.base import ReconstructionAttack, image_output
from gleak.attacks.reconstruct.objective import GradientMatcher
from gleak.attacks.reconstruct.optimize import lbfgs


@register
class DLG(ReconstructionAttack):
    name = "dlg"
    paper = "Zhu, Liu & Han, Deep Leakage from Gradients, NeurIPS 2019"
    summary = "inputs whose gradient matches the capture in L2 (L-BFGS), labels fixed"
    default_iterations: ClassVar[int] = 100
    default_lr: ClassVar[float] = 1.0
    default_tv: ClassVar[float] = 0.0

    def run(self, ctx: Context) -> ImageOutput:
        o = self.options
        tv = o.tv if o.tv is not None else self.default_tv
        matcher = GradientMatcher(ctx, self.targets(ctx), "l2", tv=tv)
        shape = (ctx.batch_size, *ctx.input_shape)
        sol = lbfgs(matcher, shape, self.iterations(), o.restarts, o.lr or self.default_lr, self.generator(ctx),
                    ctx.device, o.progress)
        diag = {"distance": "l2", "optimizer": "lbfgs", "iterations": self.iterations(), "restarts": o.restarts,
                "tv": tv, "loss": sol.loss, "best_restart": sol.restart, "restart_losses": sol.losses,
                "iterations_run": sol.iterations_run}
        return image_output(ctx, sol.inputs, diag, list(o.notes))
