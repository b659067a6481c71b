"""What a malicious server does to the global model before it sends it (METHODS-server §3), in a copy of ``model``:

- :func:`imprint`: Fowl et al. (ICLR 2022, "Robbing the Fed"), written into the model's first linear layer (the
  parameter-only form): K rows read one measurement h·x, their biases a ladder of the measurement's quantiles, so
  that bin i fires for h·x > c_i; the next linear layer reads those K rows with equal weights, so every bin a
  sample fires gets the same upstream signal and adjacent bins' difference isolates the samples between them.
- :func:`trap_weights`: Boenisch et al. (EuroS&P 2023): each row of the first linear layer draws a random half of
  its inputs as −|z| and the other half as +s·|z|, so the row fires rarely, on few samples.
- :func:`insert_block`: the attacks' published form, a block inserted in front of the model (zoo models).
- :func:`class_fishing`: Wen et al. (ICML 2022): the last layer's weights are zeroed except the target class's rows
  (set to a constant) and every other class's bias is raised to 1000, so only the target's samples send gradient
  into the body.

Stealth knobs: row noise (energy ratio ``noise``), row shuffling, gain, and the trap's scale. Each takes a seed.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from gleak.errors import GleakError
from gleak.registry import Configurable, Registry, TypedOptions, resolve_options, split_name_options


@dataclass(frozen=True)
class Crafted:
    """The tampered model and what only the server knows (which layer, which rows); with ``arch`` and
    ``arch_kwargs``, the architecture to save it as (set when a block was inserted, else the base model's)."""

    model: nn.Module
    layer: str
    rows: list[int]
    arch: str = ""
    arch_kwargs: dict[str, object] = field(default_factory=dict)


def _linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def input_linear(model: nn.Module) -> tuple[str, nn.Linear, nn.Linear | None] | None:
    """The model's first weighted layer when it is linear with a bias (it then reads the flattened input), with the
    next linear layer; None otherwise."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
             and m.weight.dim() >= 2]
    if not found or not isinstance(found[0][1], nn.Linear) or found[0][1].bias is None:
        return None
    later = [m for _, m in found[1:] if isinstance(m, nn.Linear)]
    return found[0][0], found[0][1], later[0] if later else None


def _target(model: nn.Module) -> tuple[str, nn.Linear, nn.Linear | None]:
    found = input_linear(model)
    if found is None:
        raise GleakError("the model's first layer is not linear with a bias: the trap is written into an inserted "
                         "block instead (gleak simulate --server does that for zoo models)")
    return found


def insert_block(model: nn.Module, arch: str, arch_kwargs: dict[str, object], rows: int
                 ) -> tuple[nn.Module, str, dict[str, object]]:
    """``model`` (a zoo model, its weights kept) behind an inserted block of ``rows`` neurons: the published form
    of Robbing the Fed and trap weights. Returns the new model, its architecture and keyword arguments."""
    from gleak.models.zoo import ZOO, Imprinted

    base = arch.removeprefix("zoo:")
    if base not in ZOO or base == "imprinted":
        raise GleakError(f"the model's first layer is not linear, and gleak inserts the server's block only in "
                         f"front of zoo models ({', '.join(n for n in ZOO if n != 'imprinted')}); {arch} is not one")
    wrapped = Imprinted(base, dict(arch_kwargs), rows)
    wrapped.model.load_state_dict(model.state_dict())
    return wrapped.eval(), "imprinted", {"base": base, "base_kwargs": dict(arch_kwargs), "rows": rows}


def _quantiles(bins: int, laplace: bool) -> torch.Tensor:
    """c_1 … c_{K−1} at probabilities i/K of N(0, 1) or Laplace(0, 1/√2); c_0 = −10 stands in for −∞."""
    p = torch.arange(1, bins, dtype=torch.float64) / bins
    if laplace:
        b = 1 / math.sqrt(2)
        c = torch.where(p < 0.5, b * torch.log(2 * p), -b * torch.log(2 - 2 * p))
    else:
        c = math.sqrt(2) * torch.special.erfinv(2 * p - 1)
    return torch.cat([torch.tensor([-10.0], dtype=torch.float64), c])


def measurement(n: int, kind: str, mode: int, gen: torch.Generator) -> torch.Tensor:
    """RtF's measurement row h over n inputs: a DCT-like cosine (``fourier``, mode m), the average, or a standardised
    random vector; each scaled so that h·x is about unit-variance on normalised data."""
    p = torch.arange(n, dtype=torch.float64)
    if kind == "fourier":
        return torch.cos(math.pi * (p + 0.5) * mode / n) * 4 * max(mode, 0.33) / n
    if kind == "avg":
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    if kind == "randn":
        h = torch.randn(n, generator=gen, dtype=torch.float64)
        return (h - h.mean()) / h.std() / math.sqrt(n)
    raise GleakError(f"unknown measurement '{kind}' (fourier, avg or randn)")


def imprint(model: nn.Module, bins: int = 64, linfunc: str = "fourier", mode: int = 32, gain: float = 1.0,
            noise: float = 0.0, shuffle: bool = False, seed: int = 0) -> Crafted:
    """Robbing the Fed in the first linear layer: its first ``bins`` rows become gain·h (plus Gaussian noise of
    energy ``noise`` × the row's), biases −gain·c_i, and the next linear layer reads those rows with one weight per
    output (equal across bins)."""
    out = copy.deepcopy(model)
    name, layer, nxt = _target(out)
    if bins < 2 or bins > layer.out_features:
        raise GleakError(f"bins must be between 2 and {name}'s {layer.out_features} outputs, got {bins}")
    gen = torch.Generator().manual_seed(seed)
    n = layer.in_features
    h = measurement(n, linfunc, mode, gen)
    rows = gain * h.repeat(bins, 1)
    if noise > 0:
        jitter = torch.randn(bins, n, generator=gen, dtype=torch.float64)
        jitter *= (rows.norm(dim=1, keepdim=True) * math.sqrt(noise) / jitter.norm(dim=1, keepdim=True))
        rows = rows + jitter
    bias = -gain * _quantiles(bins, linfunc == "fourier")
    order = torch.randperm(bins, generator=gen) if shuffle else torch.arange(bins)
    with torch.no_grad():
        layer.weight[:bins] = rows[order].to(layer.weight.dtype)
        layer.bias[:bins] = bias[order].to(layer.bias.dtype)
        if nxt is not None:
            column = torch.randn(nxt.out_features, 1, generator=gen, dtype=torch.float64) / math.sqrt(bins)
            nxt.weight[:, :bins] = column.expand(-1, bins).to(nxt.weight.dtype)
    return Crafted(out, name, order.argsort().tolist())


def trap_weights(model: nn.Module, scale: float = 0.95, sigma: float = 0.5, mu: float = 0.0, seed: int = 0
                 ) -> Crafted:
    """Trap weights in every row of the first linear layer: a random half −|z|, z ~ N(0, σ²), the other half
    +s·|z| of the same draws; biases μ."""
    out = copy.deepcopy(model)
    name, layer, nxt = _target(out)
    gen = torch.Generator().manual_seed(seed)
    k, n = layer.weight.shape
    half = n // 2
    w = torch.zeros(k, n, dtype=torch.float64)
    for i in range(k):
        z = torch.randn(half, generator=gen, dtype=torch.float64).abs() * sigma
        perm = torch.randperm(n, generator=gen)
        w[i, perm[:half]] = -z
        w[i, perm[half:2 * half]] = scale * z
    with torch.no_grad():
        layer.weight.copy_(w.to(layer.weight.dtype))
        layer.bias.fill_(mu)
        if nxt is not None:  # equal connections: every row that fires passes on the same upstream signal
            column = torch.randn(nxt.out_features, 1, generator=gen, dtype=torch.float64) / math.sqrt(k)
            nxt.weight[:, :k] = column.expand(-1, k).to(nxt.weight.dtype)
    return Crafted(out, name, list(range(k)))


def class_fishing(model: nn.Module, target: int = 0, class_multiplier: float = 0.5, bias_multiplier: float = 1000.0
                  ) -> Crafted:
    """Class fishing on the last linear layer: weights zeroed except the target's row (``class_multiplier``
    everywhere), every other class's bias ``bias_multiplier``."""
    out = copy.deepcopy(model)
    found = _linears(out)
    if not found:
        raise GleakError("the model has no linear layer to fish with")
    name, layer = found[-1]
    if layer.bias is None:
        raise GleakError(f"{name} has no bias: class fishing needs one")
    if not 0 <= target < layer.out_features:
        raise GleakError(f"target class must be in 0–{layer.out_features - 1}, got {target}")
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[target] = class_multiplier
        keep = float(layer.bias[target])
        layer.bias.fill_(bias_multiplier)
        layer.bias[target] = keep
    return Crafted(out, name, [target])


# ------------------------------------------------------------------------------------------- the crafts by name

SYNTAX = "NAME[:KEY=VALUE,...] (e.g. imprint:bins=128 or trap-weights:scale=0.99)"


class Craft(Configurable):
    """A registered craft: typed options, applied to a copy of the model with a seed. ``input_layer``: it writes
    into a linear layer reading the input (inserted in front of the model when it has none); ``block_width``: the
    option that sizes that block (:meth:`rows`)."""

    kind: ClassVar[str] = "server"
    paper: ClassVar[str]
    input_layer: ClassVar[bool] = True
    block_width: ClassVar[str] = "rows"
    options: TypedOptions

    def rows(self) -> int:
        """The width of the block inserted in front of a model whose first layer is not linear."""
        return int(getattr(self.options, self.block_width))

    def __init__(self, options: TypedOptions) -> None:
        self.options = options

    def apply(self, model: nn.Module, seed: int) -> Crafted:
        raise NotImplementedError

    def describe(self) -> str:
        given = ", ".join(f"{k}={v}" for k, v in self.options.model_dump().items())
        return f"{self.name}" + (f" ({given})" if given else "")


CRAFTS: Registry[Craft] = Registry("server attack", "kind")


class ImprintOptions(TypedOptions):
    bins: int = Field(64, ge=2, le=1 << 16, description="rows of the imprint (bins of the measurement)")
    linfunc: Literal["fourier", "avg", "randn"] = Field("fourier", description="the measurement row h")
    mode: int = Field(32, ge=0, description="the cosine's frequency (fourier)")
    gain: float = Field(1.0, gt=0, description="scale of the rows and biases")
    noise: float = Field(0.0, ge=0, le=100, description="Gaussian noise on the rows, energy relative to the row's")
    shuffle: bool = Field(False, description="shuffle the rows (their order no longer follows the thresholds)")


@CRAFTS.register
class ImprintCraft(Craft):
    name = "imprint"
    paper = "Fowl, Geiping, Czaja, Goldblum & Goldstein, Robbing the Fed, ICLR 2022"
    Options = ImprintOptions

    block_width = "bins"

    def apply(self, model: nn.Module, seed: int) -> Crafted:
        return imprint(model, seed=seed, **self.options.model_dump())


class TrapOptions(TypedOptions):
    scale: float = Field(0.95, gt=0, le=1, description="s: the positive half is s × the negative half")
    sigma: float = Field(0.5, gt=0, description="σ of the weights' magnitudes")
    mu: float = Field(0.0, description="the rows' bias")
    rows: int = Field(64, ge=1, le=1 << 16, description="neurons of the block inserted in front of a model whose "
                      "first layer is not linear (its own first layer's rows otherwise)")


@CRAFTS.register
class TrapCraft(Craft):
    name = "trap-weights"
    paper = "Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov & Papernot, EuroS&P 2023"
    Options = TrapOptions

    def apply(self, model: nn.Module, seed: int) -> Crafted:
        return trap_weights(model, seed=seed, **self.options.model_dump(exclude={"rows"}))


class FishingOptions(TypedOptions):
    target: int = Field(0, ge=0, description="the class whose examples are fished")
    class_multiplier: float = Field(0.5, description="the target row's constant weight")
    bias_multiplier: float = Field(1000.0, description="every other class's bias")


@CRAFTS.register
class FishingCraft(Craft):
    name = "fishing"
    paper = "Wen, Geiping, Fowl, Goldblum & Goldstein, Fishing for User Data, ICML 2022"
    Options = FishingOptions
    input_layer = False

    def apply(self, model: nn.Module, seed: int) -> Crafted:
        return class_fishing(model, **self.options.model_dump())


def parse_craft(text: str, flag: str = "--server") -> Craft:
    """The configured craft of a spec (an unknown name lists the crafts, an unknown key the options; one line)."""
    name, given = split_name_options(text, flag, SYNTAX)
    cls = CRAFTS.lookup(name, where=f"{flag}: ")
    where = {k: f"{flag} {cls.name}:{k}" for k in given}
    return cls(resolve_options(cls, given, sources=where, flag=flag))
