"""Gradient matching with Wang, Liang & He's feature term (ICLR 2024, Eq. 8): L = D(∇θ, ∇θ*) + β·D(h(x), h*).

h* is the example's last-layer input recovered beforehand: x* = λ·∇W[r] by ``softlabel`` (Wang, Liang & He,
§3.1), or ∇W[i]/∇b[i] when the last layer has a bias. gleak matches all gradients plus β times the feature
term (the reference code's 'gf' mode; the paper's column "α = 2, β = 2" is this mode with f_scalar = 2, see
docs/methods/reconstruction.md#objective), β = 2 by default. Distance l2 runs DLG's L-BFGS, cosine runs
Inverting Gradients' Adam; the TV weight defaults to 1e-2 (Wang, Liang & He's value for untrained models);
300 L-BFGS steps or 4,800 Adam steps by default. Single example only: a batch has no one feature.
Notes: docs/methods/reconstruction.md#feature.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.reconstruct.base import HELP, MAX_WEIGHT, Distance, ReconSettings, ReconstructionAttack
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError


class FeatureOptions(ReconSettings):
    distance: Distance = Field("l2", description=HELP["distance"])
    beta: float = Field(2.0, ge=0, le=MAX_WEIGHT, description=HELP["beta"])
    signed: bool = Field(False, description=HELP["signed"] + "; with distance cosine only")


@register
class FeatureMatching(ReconstructionAttack):
    name = "feature"
    paper = ("Wang, Liang & He, Towards Eliminating Hard Label Constraints in Gradient Inversion Attacks, "
             "ICLR 2024")
    summary = "gradient matching plus a term pulling the dummy's last-layer input to the recovered feature"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_model_forward=True,
                                                    needs_batch_forward=True, single_sample=True)
    Options: ClassVar[type[AttackOptions]] = FeatureOptions

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        if inputs.feature is None:
            raise GleakError("no last-layer feature was recovered for this example (softlabel found none and the "
                             "last layer has no bias)")
        settings = self.settings()
        assert isinstance(settings, FeatureOptions)
        return self.match_gradients(ctx, inputs, settings.beta)
