"""The contribution defenses: noise, clipping, sparsification, quantization, sign. Each is tested against its
definition (tests/test_defenses.py): noise mean and spread, the clipped norm, the exact share of zeros, the number
of levels."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from pydantic import Field

from gleak.defenses.base import ContributionOptions, Defense, DefenseOptions, register


class GaussianOptions(ContributionOptions):
    sigma: float = Field(0.01, ge=0, description="standard deviation σ of the added noise (absolute; with "
                         "relative=true, a multiple of each tensor's RMS)")
    relative: bool = Field(False, description="σ times each tensor's root-mean-square value instead of absolute")


@register
class Gaussian(Defense):
    name = "gaussian"
    summary = "add Gaussian noise N(0, σ²) to every entry (σ absolute, or relative to each tensor's RMS)"
    source = ("the source papers' noise defense: Wang, Liang & He (ICLR 2024) Table 5; Chen & Vikalo (ICML 2024) "
              "Table 6; RGLA Table 2")
    strength = "sigma"
    Options: ClassVar[type[DefenseOptions]] = GaussianOptions
    options: GaussianOptions

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        out = {}
        for name, x in tensors.items():
            scale = self.options.sigma * (float(x.pow(2).mean().sqrt()) if self.options.relative else 1.0)
            out[name] = x + scale * torch.randn(x.shape, generator=generator, dtype=torch.float64)
        return out


class LaplaceOptions(ContributionOptions):
    scale: float = Field(0.01, ge=0, description="scale b of the added Laplace noise (variance 2b²)")


@register
class Laplace(Defense):
    name = "laplace"
    summary = "add Laplace noise Lap(0, b) to every entry"
    source = "Wang, Liang & He (ICLR 2024) Table 5 (Laplace noise)"
    strength = "scale"
    Options: ClassVar[type[DefenseOptions]] = LaplaceOptions
    options: LaplaceOptions

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        out = {}
        for name, x in tensors.items():  # inverse CDF of a uniform draw in (−1/2, 1/2): seeded, no distribution object
            u = torch.rand(x.shape, generator=generator, dtype=torch.float64) - 0.5
            out[name] = x - self.options.scale * torch.sign(u) * torch.log1p(-2 * u.abs())
        return out


class ClipOptions(ContributionOptions):
    norm: float = Field(4.0, gt=0, description="bound C on the L2 norm of the whole contribution (the selected "
                        "tensors together)")


@register
class Clip(Defense):
    name = "clip"
    summary = "scale the whole contribution down to L2 norm ≤ C (unchanged when already inside)"
    source = "DP-SGD's clipping step (Abadi et al., CCS 2016), per update as in DP-FedAvg; RGLA Table 2 (C = 4)"
    strength = "norm"
    Options: ClassVar[type[DefenseOptions]] = ClipOptions
    options: ClipOptions

    def per_tensor(self) -> bool:
        return False

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        total = math.sqrt(sum(float(x.pow(2).sum()) for x in tensors.values()))
        factor = min(1.0, self.options.norm / total) if total > 0 else 1.0
        return {name: x * factor for name, x in tensors.items()}


class TopkOptions(ContributionOptions):
    ratio: float = Field(0.9, ge=0, lt=1, description="fraction of the entries zeroed, the smallest in magnitude "
                         "(0.99 and 0.999 are the papers' 99 % / 99.9 % compression)")
    scope: Literal["tensor", "global"] = Field("tensor", description="rank magnitudes within each tensor, or across "
                                               "all selected tensors together")


@register
class Topk(Defense):
    name = "topk"
    summary = "gradient compression: zero the smallest-magnitude fraction `ratio` of the entries, keep the rest"
    source = ("pruning / compression by magnitude: Zhu, Liu & Han (NeurIPS 2019); LLG (Wainakh et al.) Fig. 5; "
              "RGLA Tables 2 and 12")
    strength = "ratio"
    Options: ClassVar[type[DefenseOptions]] = TopkOptions
    options: TopkOptions

    def per_tensor(self) -> bool:
        return self.options.scope == "tensor"

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        if self.options.scope == "tensor":
            return {name: _zero_smallest(x.flatten(), self.options.ratio).view_as(x) for name, x in tensors.items()}
        names = list(tensors)
        flat = _zero_smallest(torch.cat([tensors[n].flatten() for n in names]), self.options.ratio)
        out, start = {}, 0
        for n in names:
            size = tensors[n].numel()
            out[n] = flat[start:start + size].view_as(tensors[n])
            start += size
        return out


def _zero_smallest(flat: torch.Tensor, ratio: float) -> torch.Tensor:
    """``flat`` with exactly ⌊ratio·n⌋ entries of smallest magnitude set to 0 (ties broken by position)."""
    k = math.floor(ratio * flat.numel())
    out = flat.clone()
    if k > 0:
        out[torch.argsort(flat.abs(), stable=True)[:k]] = 0
    return out


class QuantizeOptions(ContributionOptions):
    bits: int = Field(8, ge=1, le=16, description="bits k per entry: 2^k uniform levels between each tensor's "
                      "minimum and maximum")
    stochastic: bool = Field(False, description="round to a neighbouring level at random, unbiased (else to the "
                             "nearest)")


@register
class Quantize(Defense):
    name = "quantize"
    summary = "uniform k-bit quantization of each tensor (2^k levels from its min to its max)"
    source = "low-precision updates, e.g. QSGD (Alistarh et al., NeurIPS 2017)"
    strength = "bits"
    Options: ClassVar[type[DefenseOptions]] = QuantizeOptions
    options: QuantizeOptions

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        steps = 2 ** self.options.bits - 1
        out = {}
        for name, x in tensors.items():
            lo, hi = (float(x.min()), float(x.max())) if x.numel() else (0.0, 0.0)
            if not hi > lo:
                out[name] = x.clone()
                continue
            scaled = (x - lo) / (hi - lo) * steps
            if self.options.stochastic:
                floor = scaled.floor()
                up = torch.rand(x.shape, generator=generator, dtype=torch.float64) < (scaled - floor)
                level = (floor + up.to(torch.float64)).clamp(0, steps)
            else:
                level = scaled.round()
            out[name] = lo + level * (hi - lo) / steps
        return out


class SignOptions(ContributionOptions):
    scale: Literal["none", "mean"] = Field("none", description="none: ±1 (and 0); mean: ±(mean |x| of the tensor), "
                                           "which keeps each tensor's magnitude")


@register
class Sign(Defense):
    name = "sign"
    summary = "keep only the sign of every entry (signSGD), optionally times the tensor's mean magnitude"
    source = "signSGD (Bernstein et al., ICML 2018)"
    Options: ClassVar[type[DefenseOptions]] = SignOptions
    options: SignOptions

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {name: torch.sign(x) * (float(x.abs().mean()) if self.options.scale == "mean" and x.numel() else 1.0)
                for name, x in tensors.items()}
