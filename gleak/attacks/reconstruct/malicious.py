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

import math
from typing import ClassVar

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


def imprint_layer(ctx: Context) -> tuple[str, nn.Linear, list[int]] | str:
    """The first linear layer that reads the whole input and carries an imprint, with its rows; else why not."""
    if ctx.model is None:
        return "needs the global model (--model)"
    shape = ctx.input_shape
    size = math.prod(shape) if shape else None
    for name, layer in ctx.model.named_modules():
        if not isinstance(layer, nn.Linear) or layer.bias is None:
            continue
        if size is not None and layer.in_features != size:
            continue
        if f"{name}.weight" not in ctx.capture.tensors or f"{name}.bias" not in ctx.capture.tensors:
            continue
        rows = imprint_rows(layer.weight)
        if rows:
            return name, layer, rows
    return ("no imprint in the global model: no linear layer reading the input has four or more parallel rows "
            "(gleak check-model finds none either)")


@register
class Imprint(ReconstructionAttack):
    name = "imprint"
    paper = "Fowl, Geiping, Czaja, Goldblum & Goldstein, Robbing the Fed, ICLR 2022"
    summary = "exact inputs from an imprinted global model (a malicious server's): one per single-sample bin"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, gradient_view=False, needs_batch_size=False,
                                                    needs_bias=True)

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        found = imprint_layer(ctx)
        return found if isinstance(found, str) else None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        found = imprint_layer(ctx)
        assert not isinstance(found, str)  # not_applicable checked it
        name, layer, rows = found
        tensors = ctx.capture.tensors
        examples = ctx.total_examples
        out = invert(layer.weight, layer.bias, tensors[f"{name}.weight"], tensors[f"{name}.bias"], rows, examples)
        images, padded = _blank_padded(ctx, out.inputs.float(), examples)
        diag = {"layer": name, "bins": len(rows), "bins_with_examples": out.occupied, "blank": padded,
                "note": "a bin holding one example gives it exactly, one holding several their mean; the batch's "
                        "other examples fell into shared bins and are left blank"}
        return image_output(ctx, images, diag)


def _blank_padded(ctx: Context, found: torch.Tensor, examples: int | None) -> tuple[torch.Tensor, int]:
    padded = max(0, (examples or 0) - len(found))
    if padded:
        found = torch.cat([found, found.new_zeros(padded, found.shape[1])])
    return found.view(len(found), *ctx.require_input_shape()).to(ctx.device), padded


def trap_layer(ctx: Context) -> tuple[str, nn.Linear] | str:
    """The model's first layer when it is linear, reads the input and holds trap weights; else why not."""
    if ctx.model is None:
        return "needs the global model (--model)"
    found = input_linear(ctx.model)
    if found is None:
        return "no trap weights in the global model: its first layer is not linear"
    name, layer, _ = found
    view = LayerView(name, "dense", layer.weight.detach().double(), None, 0)
    if trap_pairing(view) is None:
        return "no trap weights in the global model's first layer (gleak check-model finds none)"
    if f"{name}.weight" not in ctx.capture.tensors or f"{name}.bias" not in ctx.capture.tensors:
        return f"the capture lacks {name}'s weight or bias"
    return name, layer


@register
class TrapWeights(ReconstructionAttack):
    name = "trap-weights"
    paper = "Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov & Papernot, EuroS&P 2023"
    summary = "exact inputs from a trap-weight global model (a malicious server's): one per row that fired alone"
    requires: ClassVar[Requirements] = Requirements(needs_model=True, gradient_view=False, needs_batch_size=False,
                                                    needs_bias=True)

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        found = trap_layer(ctx)
        return found if isinstance(found, str) else None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> ImageOutput:
        found = trap_layer(ctx)
        assert not isinstance(found, str)  # not_applicable checked it
        name, _ = found
        tensors = ctx.capture.tensors
        recovered, support = invert_rows(tensors[f"{name}.weight"], tensors[f"{name}.bias"], ctx.total_examples)
        images, padded = _blank_padded(ctx, recovered.float(), ctx.total_examples)
        diag = {"layer": name, "candidates": len(support), "agreeing": sum(1 for n in support if n >= 2),
                "blank": padded, "note": "a row that fired for one example alone gives it exactly, one that fired "
                                         "for several their blend; rows that fired for the same examples agree "
                                         "either way, so agreement ranks candidates but does not prove them"}
        return image_output(ctx, images, diag)
