"""The first-block dictionary of a language model (METHODS-sparse §1.2): every input its first adapted module can
see, one atom per token (RoPE models: positions act after the projection) or per (token, position) (learned
absolute positions), unit length, for the sparse fit of :mod:`gleak.attacks.tokens.sparse`.

* :func:`first_block_dictionary` — the atoms as the model computes them (a forward pass stopped at the module),
  held when they fit :data:`CACHE_BYTES`, else recomputed a chunk at a time on each pass.
* :class:`PositionalDictionary` — learned positions added before a LayerNorm (GPT-2): LN(E[v] + P[t]) = γ ⊙ c/σ + β
  with c the centred sum, so once β's direction is projected out (a left map, which keeps Y = U_S C) each atom
  points along a_v + b_t, a token part plus a position part. Inner products then cost V + T dot products instead
  of V·T, and nothing of size V·T·d is built; or, split (:meth:`PositionalDictionary.split`), the token parts and
  the position parts as V + T atoms of their own. Used only when the model's own inputs match it on a probe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from gleak.attacks.tokens.inputs import module_inputs, position_offset
from gleak.attacks.tokens.sparse import CHUNK_ATOMS, Dictionary
from gleak.errors import GleakError
from gleak.timebox import checkpoint

CACHE_BYTES = 512 * 2**20  # a dictionary up to this size (float32) is computed once and kept
PROBE_TOLERANCE = 1e-4  # the structured atoms must match the model's own inputs this closely (cosine distance)


class PositionalDictionary(Dictionary):
    """Atoms p·V + v = (a_v + b_p)/‖a_v + b_p‖ with a = P(γ ⊙ centred E) [V, d], b = P(γ ⊙ centred positions)
    [T, d] and P = I − β̂β̂ᵀ (module docstring). Holds a and b in float32 (V·d, not V·T·d) and the atoms' norms
    [T, V] in float64."""

    def __init__(self, tokens: torch.Tensor, positions: torch.Tensor, offset: torch.Tensor) -> None:
        norm = float(offset.norm())
        self.offset = offset.double() / norm if norm > 0 else None
        self.tokens, self.places = self._project(tokens.double()).float(), self._project(positions.double())
        v, d = self.tokens.shape
        self._norms: torch.Tensor | None = None
        super().__init__(size=v * self.places.shape[0], dim=d, chunk=self._rows)

    @property
    def norms(self) -> torch.Tensor:
        """‖a_v + b_t‖ [T, V] float64, computed on first use (the split dictionary never needs it)."""
        if self._norms is None:
            v, t = self.tokens.shape[0], self.places.shape[0]
            norms = torch.empty(t, v, dtype=torch.float64)
            for first in range(0, v, CHUNK_ATOMS):
                part = self.tokens[first:first + CHUNK_ATOMS].double()
                norms[:, first:first + len(part)] = (part.square().sum(1)[None, :] + 2 * self.places @ part.T
                                                     + self.places.square().sum(1)[:, None]).clamp_min(1e-300).sqrt()
            self._norms = norms
        return self._norms

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.offset is None else x - torch.outer(x @ self.offset, self.offset)

    def chunk_at(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The atoms of token ``tokens[i]`` at position ``positions[i]`` [k, d] float64."""
        rows: torch.Tensor = ((self.tokens[tokens].double() + self.places[positions])
                              / self.norms[positions, tokens][:, None])
        return rows

    def _rows(self, first: int, count: int) -> torch.Tensor:
        index = torch.arange(first, first + count)
        vocab = self.tokens.shape[0]
        return self.chunk_at(index % vocab, index // vocab)

    def products(self, m: torch.Tensor, label: str = "atoms") -> Iterator[tuple[int, torch.Tensor]]:
        m = m.double()
        token_part = torch.cat([self.tokens[a:a + CHUNK_ATOMS].double() @ m
                                for a in range(0, self.tokens.shape[0], CHUNK_ATOMS)])
        place_part = self.places @ m
        vocab = self.tokens.shape[0]
        for p in range(self.places.shape[0]):
            checkpoint(f"{label} {p * vocab}/{self.size}")
            yield p * vocab, (token_part + place_part[p]) / self.norms[p][:, None]

    def prepare(self, y: torch.Tensor) -> torch.Tensor:
        return self._project(y.double().T).T

    def pass_cost(self) -> float:
        return float(self.tokens.shape[0]) * self.dim + 2.0 * self.size

    def split(self) -> Dictionary:
        """The token parts a_v and the position parts b_t as atoms of their own (V + T of them, unit length, held
        in float32), with the same projection. P·LN(E[v] + P[t]) = (a_v + b_t)/σ, so the measurement is exactly a
        sparse combination of the batch's distinct tokens and positions: n_tokens + n_positions atoms instead of
        one per (token, position) pair, and no pair ambiguity."""
        both = torch.cat([self.tokens, self.places.float()])
        unit = both / both.norm(dim=1, keepdim=True).clamp_min(1e-30)
        return Dictionary(size=unit.shape[0], dim=self.dim, chunk=_slicer(unit), chunk_atoms=CHUNK_ATOMS,
                          transform=self.prepare)


def first_block_dictionary(model: nn.Module, layer: nn.Module, vocab: int, positions: int, d: int) -> Dictionary:
    """Every candidate first-block input of ``layer``, atom p·V + v = token v at position p: structured when the
    model adds learned positions before a LayerNorm (:class:`PositionalDictionary`), else computed by the model."""
    offset = position_offset(model, layer, vocab) if positions > 1 else 0
    if positions > 1:
        structured = _positional(model, layer, vocab, positions, offset, d)
        if structured is not None:
            return structured
    size = vocab * positions

    def compute(first: int, count: int) -> torch.Tensor:
        index = torch.arange(first, first + count)
        ids, where = (index % vocab).unsqueeze(1), (index // vocab + offset).unsqueeze(1)
        rows = module_inputs(model, layer, ids, where if positions > 1 else None)[:, 0].float()
        if rows.shape[1] != d:
            raise GleakError(f"the adapted module reads {rows.shape[1]} dimensions, lora_A has {d}")
        unit: torch.Tensor = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)
        return unit

    if 4 * size * d <= CACHE_BYTES:
        held = torch.empty(size, d)
        for first in range(0, size, CHUNK_ATOMS):
            checkpoint(f"dictionary: atoms {first}/{size}")
            held[first:first + CHUNK_ATOMS] = compute(first, min(CHUNK_ATOMS, size - first))
        return Dictionary(size=size, dim=d, chunk=_slicer(held), chunk_atoms=CHUNK_ATOMS)
    return Dictionary(size=size, dim=d, chunk=compute, chunk_atoms=CHUNK_ATOMS)


def _slicer(held: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
    return lambda first, count: held[first:first + count]


def _positional(model: nn.Module, layer: nn.Module, vocab: int, positions: int, offset: int, d: int
                ) -> PositionalDictionary | None:
    """The structured dictionary when some LayerNorm of width d over the token embedding plus some position table
    reproduces the module's inputs on a probe; else None."""
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    if not isinstance(embedding, nn.Embedding) or tuple(embedding.weight.shape) != (vocab, d):
        return None
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding) and m is not embedding
              and m.embedding_dim == d and m.num_embeddings >= positions + offset]
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm) and tuple(m.normalized_shape) == (d,)
             and m.elementwise_affine]
    if not tables or not norms:
        return None
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (8, 1), generator=gen)
    where = torch.randint(0, positions, (8, 1), generator=gen)
    seen = module_inputs(model, layer, ids, where + offset)[:, 0].double()
    weight = embedding.weight.detach().double()
    for table in tables[:2]:
        rows = table.weight.detach().double()[offset:offset + positions]
        for norm in norms[:2]:
            gamma, beta = norm.weight.detach().double(), norm.bias.detach().double()
            # the probe first, on its own rows: the whole dictionary is built once, for the pair that matches
            probe = PositionalDictionary(_centred(weight[ids[:, 0]]) * gamma, _centred(rows) * gamma, beta)
            want = probe.prepare(seen.T).T
            want = want / want.norm(dim=1, keepdim=True).clamp_min(1e-300)
            got = probe.chunk_at(torch.arange(len(ids)), where[:, 0])
            if float((1 - (want * got).sum(1)).abs().max()) < PROBE_TOLERANCE:
                return PositionalDictionary(_centred(weight) * gamma, _centred(rows) * gamma, beta)
    return None


def _centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(dim=1, keepdim=True)
