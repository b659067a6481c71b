"""The server's side of a crafted global model: the closed-form inversions of its trap layer (maths in
:mod:`gleak.tamper.imprint`, notes in docs/methods/server.md).

- ``imprint``: Robbing the Fed (Fowl, Geiping, Czaja, Goldblum, Goldstein, ICLR 2022). Applies when a linear layer
  reading the input has rows that point one way (check-model's GLEAK-SERVER-IMPRINT); each bin of its thresholds
  that holds one example gives that example exactly.
- ``trap-weights``: When the Curious Abandon Honesty (Boenisch et al., EuroS&P 2023). Applies when that layer holds
  trap weights (GLEAK-SERVER-TRAP-WEIGHTS); each row that fired for one example alone gives it exactly.

Both read a FedSGD gradient or a FedAvg update alike (the ratio is scale-free). Examples no bin or row isolated
are left blank, so that the batch keeps one image per example."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from gleak.attacks.base import NO_INPUTS, ImageOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.reconstruct.base import ReconstructionAttack, image_output
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.tamper.craft import input_linear
from gleak.tamper.imprint import imprint_rows, invert, invert_rows
from gleak.tamper.structure import trap_pairing
from gleak.tamper.views import LayerView


class TrapLayerAttack(ReconstructionAttack):
    """Base of the two inversions: the model's first layer, linear and reading the input, carries the trap
    (:meth:`trap_problem` says why not otherwise); its rows' ratios ∇W_j / ∇b_j are the examples."""

    requires: ClassVar[Requirements] = Requirements(needs_model=True, gradient_view=False, needs_batch_size=False,
                                                    needs_bias=True)
    structure: ClassVar[str]  # what the layer must hold, for the one-line reasons

    def trap_problem(self, name: str, layer: nn.Linear) -> str | None:
        """Why ``layer`` holds no trap this attack inverts, or None."""
        raise NotImplementedError

    def layer(self, ctx: Context) -> tuple[str, nn.Linear] | str:
        """The trapped first layer, or why not (one line)."""
        found = input_linear(ctx.require_model())
        if found is None:
            return f"no {self.structure} in the global model: its first layer is not linear with a bias"
        name, layer, _ = found
        if f"{name}.weight" not in ctx.capture.tensors or f"{name}.bias" not in ctx.capture.tensors:
            return f"the capture lacks {name}'s weight or bias"
        return self.trap_problem(name, layer) or (name, layer)

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        found = self.layer(ctx)
        return found if isinstance(found, str) else None

    def output(self, ctx: Context, found: torch.Tensor, diagnostics: dict[str, Any]) -> ImageOutput:
        """One image per example, as every reconstruction: examples nothing isolated stay blank (the data's mean)."""
        padded = max(0, (ctx.total_examples or 0) - len(found))
        if padded:
            found = torch.cat([found, found.new_zeros(padded, found.shape[1])])
        images = found.view(len(found), *ctx.require_input_shape()).to(ctx.device)
        return image_output(ctx, images, {**diagnostics, "blank": padded})


@register
class Imprint(TrapLayerAttack):
    name = "imprint"
    paper = "Fowl, Geiping, Czaja, Goldblum & Goldstein, Robbing the Fed, ICLR 2022"
    summary = "exact inputs from an imprinted global model (a malicious server's): one per single-sample bin"
    structure = "imprint"

    def trap_problem(self, name: str, layer: nn.Linear) -> str | None:
        if not imprint_rows(layer.weight):
            return (f"no imprint in the global model: its first layer {name} has no four parallel rows (gleak "
                    "check-model finds none either)")
        return None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        found = self.layer(ctx)
        assert not isinstance(found, str)  # not_applicable checked it
        name, layer = found
        rows = imprint_rows(layer.weight)
        tensors = ctx.capture.tensors
        out = invert(layer.weight, layer.bias, tensors[f"{name}.weight"], tensors[f"{name}.bias"], rows,
                     ctx.total_examples)
        return self.output(ctx, out.inputs.float(), {
            "layer": name, "bins": len(rows), "bins_with_examples": out.occupied,
            "note": "a bin holding one example gives it exactly, one holding several their mean; the batch's other "
                    "examples fell into shared bins and are left blank"})


@register
class TrapWeights(TrapLayerAttack):
    name = "trap-weights"
    paper = "Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov & Papernot, EuroS&P 2023"
    summary = "exact inputs from a trap-weight global model (a malicious server's): one per row that fired alone"
    structure = "trap weights"

    def trap_problem(self, name: str, layer: nn.Linear) -> str | None:
        if trap_pairing(LayerView(name, "dense", layer.weight.detach(), None, 0)) is None:
            return f"no trap weights in the global model's first layer {name} (gleak check-model finds none)"
        return None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        found = self.layer(ctx)
        assert not isinstance(found, str)  # not_applicable checked it
        name, _ = found
        tensors = ctx.capture.tensors
        recovered, support = invert_rows(tensors[f"{name}.weight"], tensors[f"{name}.bias"], ctx.total_examples)
        return self.output(ctx, recovered.float(), {
            "layer": name, "candidates": len(support), "agreeing": sum(1 for n in support if n >= 2),
            "note": "a row that fired for one example alone gives it exactly, one that fired for several their "
                    "blend; rows that fired for the same examples agree either way, so agreement ranks candidates "
                    "but does not prove them"})
