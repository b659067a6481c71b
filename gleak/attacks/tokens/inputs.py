"""Inputs of a module inside a language model, computed by running the model up to it: a forward pre-hook
records the module's input and stops the pass there (only the layers before it run).

* :func:`module_inputs` — the input of one module for a batch of token sequences.
* :func:`input_kind` — whether that input depends only on the token at its position (the first block's attention
  projections) and on the position too (learned absolute positions), checked on a probe.
* :func:`token_inputs`, :func:`candidate_residuals` — every vocabulary token's input at a position (one-token
  sequences read at that position through ``position_ids``), and a score of each, streamed in chunks of tokens.

Shared by ``lora-tokens`` and the sentence reconstruction (DAGER's candidates; METHODS-text §3.4).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gleak.errors import GleakError
from gleak.timebox import checkpoint

CHUNK_TOKENS = 2048  # candidate tokens per forward pass
MAX_POSITIONS = 512  # position-dependent inputs: positions tested at most (without a recorded max length)


def tested_positions(max_length: int | None, n_positions: int | None) -> int:
    """How many positions to test for position-dependent inputs: the capture's recorded max length, at most
    :data:`MAX_POSITIONS`, and at most the model's position table (a capture that claims longer sequences than the
    model reads cannot hold them; its metadata is not trusted to index the table)."""
    most = min(max_length or MAX_POSITIONS, MAX_POSITIONS)
    return min(most, n_positions) if n_positions else most


class _Stop(Exception):
    """Raised by the pre-hook: the forward pass has reached the adapted module."""


def module_inputs(model: nn.Module, layer: nn.Module, input_ids: torch.Tensor,
                  position_ids: torch.Tensor | None = None, past_key_values: Any = None) -> torch.Tensor:
    """The input of ``layer`` [B, T, d_in] when ``model`` reads ``input_ids`` [B, T] (at ``position_ids`` when
    given; after the cached prefix in ``past_key_values`` when given, which the layers before ``layer`` extend in
    place; no gradient; the pass stops at the layer)."""
    seen: list[torch.Tensor] = []

    def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
        seen.append(args[0].detach())
        raise _Stop

    handle = layer.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            extra: dict[str, Any] = {"position_ids": position_ids} if position_ids is not None else {}
            past = 0
            if past_key_values is not None:
                past = int(past_key_values.get_seq_length())
                extra.update({cache_argument(model): past_key_values, "use_cache": True})
            mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long)
            model(input_ids=input_ids, attention_mask=mask, **extra)
    except _Stop:
        pass
    finally:
        handle.remove()
    if not seen:
        raise GleakError("the base model's forward pass never reached the adapted module")
    return seen[0].reshape(input_ids.shape[0], input_ids.shape[1], -1)


def cache_argument(model: nn.Module) -> str:
    """The forward argument that takes a key/value cache: ``cache`` in newer transformers, ``past_key_values``
    before (still accepted there, with a deprecation warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass(frozen=True)
class InputKind:
    """How an adapted module's input depends on the batch: only on the token at that position (``tokenwise``), and
    then on the position too (``positional``: learned absolute positions)."""

    tokenwise: bool
    positional: bool


def input_kind(model: nn.Module, layer: nn.Module, vocab_size: int) -> InputKind:
    """Probe: the input at the last position for two different prefixes, and at position 0."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (2, 3), generator=gen)
    ids[:, 2] = ids[0, 2]
    if torch.equal(ids[0, :2], ids[1, :2]):
        ids[1, :2] = (ids[0, :2] + 1) % vocab_size
    x = module_inputs(model, layer, ids).double()
    scale = float(x.abs().max()) or 1.0
    tokenwise = bool(torch.allclose(x[0, 2], x[1, 2], rtol=1e-4, atol=1e-5 * scale))
    alone = module_inputs(model, layer, ids[:1, 2:]).double()[0, 0]
    positional = not bool(torch.allclose(alone, x[0, 2], rtol=1e-4, atol=1e-5 * scale))
    return InputKind(tokenwise=tokenwise, positional=positional)


def candidate_residuals(model: nn.Module, layer: nn.Module, vocab_size: int, positions: int,
                        score: Callable[[torch.Tensor], torch.Tensor],
                        progress: Callable[[str], None] | None = None) -> torch.Tensor:
    """``score`` (rows [N, d_in] -> [N] residuals) of every token's input to ``layer`` at each of ``positions``
    positions: [positions, V] float64 (one row when the input does not depend on the position); ``progress`` hears
    of each position done."""
    out = torch.empty(positions, vocab_size, dtype=torch.float64)
    offset = position_offset(model, layer, vocab_size) if positions > 1 else 0
    for p in range(positions):
        out[p] = score(token_inputs(model, layer, vocab_size, p, offset))
        if progress is not None and positions > 1:
            progress(f"layer 1: position {p + 1}/{positions}")
    return out


def position_offset(model: nn.Module, layer: nn.Module, vocab_size: int, probe: int = 6, most: int = 4) -> int:
    """The ``position_ids`` value of a sequence's position 0 as the model numbers it by itself: 0 for most, 2 for
    RoBERTa (its pad index + 1). Found by matching a probe sequence's inputs to one-token probes read at p + k; one
    line when no k up to ``most`` matches (positions numbered some other way)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab_size, (1, probe), generator=gen)
    seen = module_inputs(model, layer, ids)[0].double()
    scale = float(seen.abs().max()) or 1.0
    for k in range(most + 1):
        alone = module_inputs(model, layer, ids.T, torch.arange(probe).unsqueeze(1) + k)[:, 0].double()
        if torch.allclose(alone, seen, rtol=1e-4, atol=1e-5 * scale):
            return k
    raise GleakError("the model numbers its positions in a way gleak cannot match (a token's input alone at "
                     f"position p + k differs from its input in a sequence for every k up to {most})")


def token_inputs(model: nn.Module, layer: nn.Module, vocab_size: int, position: int, offset: int = 0
                 ) -> torch.Tensor:
    """Every vocabulary token's input to ``layer`` at ``position`` [V, d_in] (one-token sequences read at that
    position through ``position_ids`` = position + ``offset``, :func:`position_offset`; valid for token-wise
    inputs, :func:`input_kind`)."""
    rows = []
    for first in range(0, vocab_size, CHUNK_TOKENS):
        checkpoint(f"layer 1: position {position + 1}, tokens {first}/{vocab_size}")
        ids = torch.arange(first, min(first + CHUNK_TOKENS, vocab_size)).unsqueeze(1)
        rows.append(module_inputs(model, layer, ids, torch.full_like(ids, position + offset))[:, 0])
    return torch.cat(rows)


def linear_gradient(layer: nn.Module, grad: torch.Tensor) -> torch.Tensor | None:
    """A linear-like module's weight gradient as [d_out, d_in], its rows in the span of the module's inputs (GPT-2's
    Conv1D stores its weight transposed); None for another kind of module."""
    if isinstance(layer, nn.Linear):
        return grad
    if type(layer).__name__ == "Conv1D":
        return grad.T
    return None


def weight_gradients(model: nn.Module, tensors: Mapping[str, torch.Tensor],
                     rows: Callable[[nn.Module, torch.Tensor], torch.Tensor | None]
                     ) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor]]:
    """The model's modules by name, and the 2-D weight gradients (or updates) ``tensors`` holds for them, each read
    by ``rows`` (module, gradient) -> the gradient in the layout the caller tests, or None to leave it out."""
    modules = dict(model.named_modules())
    grads: dict[str, torch.Tensor] = {}
    for path, layer in modules.items():
        grad = tensors.get(f"{path}.weight")
        read = rows(layer, grad) if grad is not None and grad.dim() == 2 else None
        if read is not None:
            grads[path] = read
    return modules, grads


def first_tokenwise(model: nn.Module, layers: Sequence[tuple[str, nn.Module]], vocab_size: int
                    ) -> tuple[InputKind, list[str]] | None:
    """The first modules, in model order, whose input is token-wise (:func:`input_kind`), grouped with the modules
    of the same parent that read the very same input (q, k and v of one block); their names and input kind, or
    None when no module reads token-wise inputs."""
    probe_ids = torch.arange(min(vocab_size, 5)).unsqueeze(0)
    found: list[str] = []
    kind: InputKind | None = None
    probe: torch.Tensor | None = None
    for name, layer in layers:
        if kind is None:
            kind = input_kind(model, layer, vocab_size)
            if not kind.tokenwise:
                kind = None
                continue
            found, probe = [name], module_inputs(model, layer, probe_ids)
        elif name.rsplit(".", 1)[0] == found[0].rsplit(".", 1)[0]:
            seen = module_inputs(model, layer, probe_ids)
            if probe is not None and seen.shape == probe.shape and torch.allclose(seen, probe):
                found.append(name)
    return (kind, found) if kind is not None else None
