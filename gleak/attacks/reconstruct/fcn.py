"""Analytic layer-by-layer inversion of a fully-connected ReLU network (Wang, Liang & He, ICLR 2024, §4.2,
Eq. 6–7; notes: docs/methods/reconstruction.md#fcn).

For one example, every linear layer ℓ has ∇W_ℓ = δ_ℓ · x_{ℓ−1}ᵀ with δ_ℓ = ∂L/∂z_ℓ, so its input is any
non-zero row of ∇W_ℓ divided by the matching δ. Going down from the recovered last-layer input x_{L−1}
(``softlabel``'s x* = λ·∇W[r]):

1. δ_L = ∇W_L x_{L−1} / ‖x_{L−1}‖² (= p − y);
2. for ℓ = L−1 … 1: δ_ℓ = (W_{ℓ+1}ᵀ δ_{ℓ+1}) ⊙ 1[x_ℓ > 0], then x_{ℓ−1} = ∇W_ℓᵀ δ_ℓ / ‖δ_ℓ‖².

Step 2's division is the least-squares combination of all rows; the paper divides one row (Eq. 7) and the
reference notebook averages the row ratios — all agree on exact data, the weighted form keeps rows with a
tiny δ from amplifying float32 rounding. A layer with a bias gives δ_ℓ = ∇b_ℓ directly (then no feature is
needed when the last layer has one). Applies only to chains of Linear layers with ReLU between them.
"""

from __future__ import annotations

import itertools
from typing import ClassVar

from torch import nn

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.reconstruct.base import ReconstructionAttack, image_output
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError

PASS_THROUGH = (nn.Flatten, nn.Identity, nn.Dropout)
RELU_OFF = 1e-6  # relative to the layer's largest activation: below this a unit counts as switched off


def linear_chain(model: nn.Module) -> tuple[list[tuple[str, nn.Linear]], str | None]:
    """The model's Linear layers in order, if it is Linear (ReLU Linear)*; else the reason it is not."""
    layers: list[tuple[str, nn.Linear]] = []
    expect_relu = False
    for name, module in model.named_modules():
        if list(module.children()):
            continue  # containers
        if isinstance(module, nn.Linear):
            if expect_relu:
                return [], f"'{name}' follows another linear layer without a ReLU between them"
            layers.append((name, module))
            expect_relu = True
        elif isinstance(module, nn.ReLU):
            if not expect_relu:
                return [], f"ReLU '{name}' does not follow a linear layer"
            expect_relu = False
        elif not isinstance(module, PASS_THROUGH):
            return [], (f"analytic inversion needs a fully-connected ReLU network; this model has a "
                        f"{type(module).__name__} ('{name}')")
    if not layers or not expect_relu:
        return [], "analytic inversion needs a network that ends in a linear layer"
    for (n1, a), (n2, b) in itertools.pairwise(layers):
        if a.out_features != b.in_features:
            return [], f"'{n1}' outputs {a.out_features} values but '{n2}' takes {b.in_features}"
    return layers, None


@register
class AnalyticFCN(ReconstructionAttack):
    name = "fcn"
    paper = ("Wang, Liang & He, Towards Eliminating Hard Label Constraints in Gradient Inversion Attacks, "
             "ICLR 2024 (§4.2)")
    summary = "exact input of one example through a fully-connected ReLU network, layer by layer"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, needs_model_forward=True, single_sample=True)

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        layers, why = linear_chain(ctx.require_model())
        if why:
            return why
        if layers[-1][0] != ctx.layer.name:
            return f"the chain ends in '{layers[-1][0]}', not the detected last layer '{ctx.layer.name}'"
        return None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        layers, _ = linear_chain(ctx.require_model())
        params, grads = ctx.parameter_gradients()
        by_param = {id(p): g.double().cpu() for p, g in zip(params, grads, strict=True)}
        top_name, top = layers[-1]
        gw = by_param[id(top.weight)]
        if top.bias is not None:
            delta = by_param[id(top.bias)]
            x = None
        else:
            if inputs.feature is None:
                raise GleakError("needs the last-layer input of the example (softlabel recovers it) because "
                                 f"'{top_name}' has no bias")
            x = inputs.feature.double().flatten().cpu()
            if x.numel() != top.in_features:
                raise GleakError(f"the recovered feature has {x.numel()} values, '{top_name}' takes "
                                 f"{top.in_features}")
            delta = gw @ x / (x @ x)
        used_rows = []
        for i in range(len(layers) - 1, -1, -1):
            name, layer = layers[i]
            gw = by_param[id(layer.weight)]
            if i < len(layers) - 1:  # propagate δ from the layer above through ReLU
                upper = layers[i + 1][1]
                if layer.bias is not None:
                    delta = by_param[id(layer.bias)]
                else:
                    assert x is not None
                    on = x > RELU_OFF * x.abs().max().clamp_min(1e-300)
                    delta = (upper.weight.detach().double().cpu().T @ delta) * on
            norm = float(delta @ delta)
            if norm == 0.0 or norm != norm:
                raise GleakError(f"the gradient vanishes at '{name}': nothing is left to invert")
            x = gw.T @ delta / norm
            used_rows.append(int((delta != 0).sum()))
        assert x is not None
        pixels_in = x.float().view(1, *ctx.require_input_shape())
        diag = {"layers": [n for n, _ in layers], "active_rows": used_rows[::-1],
                "feature_source": "bias" if top.bias is not None else "recovered feature"}
        return image_output(ctx, pixels_in, diag)
