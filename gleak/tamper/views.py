"""Neuron-major views of a model's weights: one row per neuron, one column per input it reads (METHODS-server §5).

nn.Linear is (out, in); ConvNd flattens each kernel to (out, in·∏k); Hugging Face's Conv1D (GPT-2) stores
(in, out) and is transposed; nn.MultiheadAttention's packed in-projection is split into Q, K and V. Embeddings and
vocabulary-sized heads are marked: their rows are tokens, which only the embedding tests read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Role = Literal["dense", "conv", "embedding"]


@dataclass(frozen=True)
class LayerView:
    """One weight as rows (neurons) × fan-in on the CPU (float32, or float64 when stored so), with its bias (None
    when it has none)."""

    name: str
    role: Role
    weight: torch.Tensor
    bias: torch.Tensor | None
    order: int  # position among the model's weighted layers (0 = the first one the input meets)

    @property
    def rows(self) -> int:
        return int(self.weight.shape[0])

    @property
    def fan_in(self) -> int:
        return int(self.weight.shape[1])


def _matrix(t: torch.Tensor) -> torch.Tensor:
    dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    return t.detach().to("cpu", dtype).reshape(t.shape[0], -1)


def _bias(layer: nn.Module) -> torch.Tensor | None:
    b = getattr(layer, "bias", None)
    return b.detach().to("cpu", torch.float64).flatten() if isinstance(b, torch.Tensor) else None


def layer_views(model: nn.Module) -> Iterator[LayerView]:
    """Every weighted layer of ``model`` in definition order (shared weights once)."""
    seen: set[int] = set()
    order = 0
    vocab = None
    getter = getattr(model, "get_input_embeddings", None)
    emb = getter() if callable(getter) else None
    if isinstance(emb, nn.Embedding):
        vocab = int(emb.weight.shape[0])
    for name, layer in model.named_modules():
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or id(weight) in seen:
            continue
        seen.add(id(weight))
        bias = _bias(layer)
        label = name or "(model)"
        if isinstance(layer, nn.Embedding) or (vocab is not None and weight.dim() == 2 and weight.shape[0] == vocab):
            yield LayerView(label, "embedding", _matrix(weight), None, order)
        elif type(layer).__name__ == "Conv1D" and weight.dim() == 2:  # transformers' GPT-2 layer: (in, out)
            yield LayerView(label, "dense", _matrix(weight.T), bias, order)
        elif isinstance(layer, nn.modules.conv._ConvNd):
            yield LayerView(label, "conv", _matrix(weight), bias, order)
        else:
            yield LayerView(label, "dense", _matrix(weight), bias, order)
        order += 1
    for name, layer in model.named_modules():  # packed attention projections (weight is in_proj_weight)
        packed = getattr(layer, "in_proj_weight", None)
        if isinstance(layer, nn.MultiheadAttention) and isinstance(packed, torch.Tensor):
            bias = layer.in_proj_bias
            for k, part in enumerate(("q", "k", "v")):
                rows = packed.shape[0] // 3
                sl = slice(k * rows, (k + 1) * rows)
                yield LayerView(f"{name}.in_proj[{part}]", "dense", _matrix(packed[sl]),
                                None if bias is None else bias.detach().double()[sl], order)
            order += 1


EMBEDDING_NAMES = ("embed", "wte", "wpe", "word_embeddings", "position_embeddings", "token_type_embeddings")


def tensor_views(tensors: dict[str, torch.Tensor]) -> Iterator[LayerView]:
    """Views from a bare state dict (no architecture): 2-D weights as (out, in), higher ones as kernels; each
    ``NAME.weight``'s bias is ``NAME.bias`` when the shapes agree. Embeddings are known by name, and an output head
    by having as many rows as the token embedding (its rows are tokens too)."""
    vocab = {int(t.shape[0]) for k, t in tensors.items()
             if t.dim() == 2 and any(n in k for n in EMBEDDING_NAMES) and "position" not in k and "wpe" not in k}
    order = 0
    for key, t in tensors.items():
        if t.dim() < 2 or not t.is_floating_point():
            continue
        stem = key.removesuffix(".weight")
        bias = tensors.get(f"{stem}.bias") if key.endswith(".weight") else None
        b = bias.detach().double().flatten() if bias is not None and bias.numel() == t.shape[0] else None
        token_rows = t.dim() == 2 and int(t.shape[0]) in vocab
        role: Role = "embedding" if token_rows or any(n in key for n in EMBEDDING_NAMES) else (
            "conv" if t.dim() > 2 else "dense")
        yield LayerView(stem, role, _matrix(t), b, order)
        order += 1
