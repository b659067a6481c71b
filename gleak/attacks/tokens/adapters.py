"""LoRA adapter tensors in a capture, by the base-model module they adapt (METHODS-text §3.9).

A LoRA capture's tensors are named as peft saves an adapter (``base_model.model.<module>.lora_A.weight``; the
adapter's name may sit before ``.weight`` as in ``named_parameters()``). :func:`lora_factors` pairs each module's
A [r, d_in] and B [d_out, r] and checks them against the base model: the module exists, is linear-like with those
widths, and both factors are there with the same rank. Every problem is one line (:class:`GleakError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gleak.errors import GleakError, shorten

LORA_NAME = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<factor>lora_A|lora_B)(?:\.[^.]+)?\.weight$")


@dataclass(frozen=True, kw_only=True)
class LoraFactors:
    """One adapted module: its path in the base model, the module, and the captured A [r, d_in] and B [d_out, r]
    (gradients, or updates as stored)."""

    module: str
    layer: nn.Module
    a_name: str
    b_name: str
    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


def _widths(layer: nn.Module) -> tuple[int, int] | None:
    """(d_in, d_out) of a linear-like module: nn.Linear, or transformers' Conv1D (GPT-2; weight [d_in, d_out])."""
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    if isinstance(layer, nn.Linear):
        return int(weight.shape[1]), int(weight.shape[0])
    if type(layer).__name__ == "Conv1D":
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def lora_factors(tensors: Mapping[str, torch.Tensor], model: nn.Module) -> list[LoraFactors]:
    """The adapted modules of ``model`` in ``tensors`` (module order of the model), each with its A and B."""
    found: dict[str, dict[str, str]] = {}
    other = []
    for name in tensors:
        m = LORA_NAME.match(name)
        if m is None:
            other.append(name)
            continue
        found.setdefault(m["module"], {})[m["factor"]] = name
    if other:
        raise GleakError(f"not LoRA adapter tensors: {shorten(', '.join(other[:3]), 160)}"
                         + (f" (+{len(other) - 3} more)" if len(other) > 3 else "")
                         + " (a LoRA capture holds only lora_A/lora_B weights; embeddings trained with "
                           "modules_to_save are not supported yet)")
    modules = dict(model.named_modules())
    out = []
    for path, factors in found.items():
        if set(factors) != {"lora_A", "lora_B"}:
            lacking = "lora_B" if "lora_A" in factors else "lora_A"
            raise GleakError(f"the capture has {path}'s {next(iter(factors))} but not its {lacking}")
        layer = modules.get(path)
        if layer is None:
            raise GleakError(f"the adapter adapts {path}, which the base model does not have: give --model the base "
                             "model the adapter was trained on")
        widths = _widths(layer)
        a, b = tensors[factors["lora_A"]], tensors[factors["lora_B"]]
        if widths is None:
            raise GleakError(f"{path} is a {type(layer).__name__}: only LoRA on linear layers is read")
        d_in, d_out = widths
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != d_in or b.shape[0] != d_out or a.shape[0] != b.shape[1]:
            raise GleakError(f"{path}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit the module "
                             f"({d_in} in, {d_out} out) with one rank")
        out.append(LoraFactors(module=path, layer=layer, a_name=factors["lora_A"], b_name=factors["lora_B"], a=a,
                               b=b))
    order = {name: i for i, name in enumerate(modules)}
    return sorted(out, key=lambda f: order[f.module])


def lora_a_is_zero(members: Sequence[LoraFactors]) -> bool:
    """Every lora_A is zero next to the lora_B ones: a fresh adapter's gradient (lora_B starts at 0, which makes
    ∇A exactly 0), where only lora_B holds the inputs."""
    a_scale = max(float(f.a.double().abs().max()) for f in members)
    b_scale = max(float(f.b.double().abs().max()) for f in members) or 1.0
    return a_scale <= 1e-9 * b_scale
