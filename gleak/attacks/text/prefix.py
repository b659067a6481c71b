"""The second-block inputs of DAGER's candidate extensions s + (v,) at their new position (METHODS-text §3.5),
with the prefixes' keys and values computed once per step.

Without a cache each candidate runs its whole prefix through the first block again: a step at position i costs
(frontier × options × i) token passes, so long sequences grow with the square of their length. The model's own
key/value cache (transformers' ``DynamicCache``, its public constructor and iteration) holds each prefix's first
block once; every candidate then runs one token. The cached inputs are checked against the full pass on two
candidates at every step; where a model or a transformers version gives different inputs (or has no such cache),
the full pass is used and the diagnostics say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gleak.attacks.tokens.inputs import module_inputs
from gleak.errors import GleakError
from gleak.timebox import OutOfTime, checkpoint

CHUNK_TOKENS = 1 << 15  # token positions (prefix included) held per forward pass or cache
CHECKED = 2  # candidates recomputed without the cache at every step
AGREE = 1e-4  # largest relative difference between the cached and the full inputs


class PrefixInputs:
    """Inputs of ``layer`` at the last position of each candidate sequence (all of one length)."""

    def __init__(self, model: nn.Module, layer: nn.Module, chunk_tokens: int = CHUNK_TOKENS) -> None:
        self.model, self.layer, self.chunk_tokens = model, layer, chunk_tokens
        self.cached = True
        self.why: str | None = None

    @property
    def diagnostics(self) -> dict[str, Any]:
        return {"prefix_cache": "on" if self.cached else f"off: {self.why}"}

    def __call__(self, cands: Sequence[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(x [N, d]: each candidate's input at its last position, before [N, d]: at the position before, or None
        for one-token candidates)."""
        i = len(cands[0]) - 1
        if i > 0 and self.cached:
            try:
                found = self._cached(cands, i)
                full, _ = self._full(cands[:CHECKED], i)
                scale = float(full.abs().max()) or 1.0
                if float((found[0][:CHECKED] - full).abs().max()) <= AGREE * scale:
                    return found
                self.why = "the cached inputs differ from the full pass"
            except OutOfTime:
                raise
            except (TypeError, ValueError, AttributeError, KeyError, IndexError, RuntimeError, NotImplementedError,
                    ImportError, GleakError) as e:  # a model or version whose cache does not work this way
                self.why = f"{type(e).__name__}: {e}".splitlines()[0][:160]
            self.cached = False
        return self._full(cands, i)

    def _full(self, cands: Sequence[tuple[int, ...]], i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        xs, befores = [], []
        rows = max(1, self.chunk_tokens // (i + 1))
        for first in range(0, len(cands), rows):
            checkpoint(f"layer 2: position {i + 1}, candidates {first}/{len(cands)}")
            ids = torch.tensor(cands[first:first + rows], dtype=torch.long)
            inputs = module_inputs(self.model, self.layer, ids)
            xs.append(inputs[:, i])
            if i > 0:
                befores.append(inputs[:, i - 1])
        return torch.cat(xs), (torch.cat(befores) if i > 0 else None)

    def _cached(self, cands: Sequence[tuple[int, ...]], i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers import DynamicCache

        prefixes: dict[tuple[int, ...], int] = {}
        owner = torch.tensor([prefixes.setdefault(c[:-1], len(prefixes)) for c in cands], dtype=torch.long)
        last = torch.tensor([c[-1] for c in cands], dtype=torch.long)
        order = list(prefixes)
        xs = torch.empty(len(cands), 0)
        befores = torch.empty(len(cands), 0)
        per_block = max(1, self.chunk_tokens // i)
        for start in range(0, len(order), per_block):
            block = torch.tensor(order[start:start + per_block], dtype=torch.long)
            cache = DynamicCache()
            seen = module_inputs(self.model, self.layer, block, past_key_values=cache)[:, -1]
            layers = [tuple(entry[:2]) for entry in cache if entry[0] is not None and entry[0].numel()]
            mine = ((owner >= start) & (owner < start + len(block))).nonzero().flatten()
            rows = max(1, self.chunk_tokens // (i + 1))
            for first in range(0, len(mine), rows):
                checkpoint(f"layer 2: position {i + 1}, candidates {int(mine[first])}/{len(cands)}")
                pick = mine[first:first + rows]
                local = owner[pick] - start
                grown = DynamicCache(ddp_cache_data=[(k[local], v[local]) for k, v in layers])
                x = module_inputs(self.model, self.layer, last[pick].unsqueeze(1), past_key_values=grown)[:, 0]
                if xs.shape[1] == 0:
                    xs = x.new_empty(len(cands), x.shape[1])
                    befores = x.new_empty(len(cands), x.shape[1])
                xs[pick] = x
                befores[pick] = seen[local]
        return xs, befores
