"""Membership tests of a module's inputs against the span its gradient keeps (METHODS-text §1.4, §3.2–§3.3, §3.9;
DAGER, Petrov et al., NeurIPS 2024).

A :class:`SpanTest` scores candidate inputs u [N, d_in] of one group of modules that read the same vector (q, k
and v of a block; GPT-2's c_attn) by their relative distance to the span: about the rounding floor for inputs the
batch had, about 1 for others. Built from

* the weight gradients (or updates) of a full fine-tuning capture: :func:`weight_span`, the union of the modules'
  row spaces (a query at position 0 attends only to itself, so q's gradient misses that input while k's and v's
  hold it);
* a LoRA update's lora_A factors (rows in span{u}): :func:`lora_a_span`; or its lora_B factors through the global
  adapter's A (rows in span{A·u}; the only trace of a fresh adapter, whose ∇A is exactly 0): :func:`lora_b_span`.

Each refuses in one line, naming the rank, when the span fills the room (the batch has at least as many distinct
inputs as the gradient can hold), instead of testing against a span that contains everything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gleak.attacks.tokens.adapters import LoraFactors, lora_a_is_zero
from gleak.attacks.tokens.span import RowSpace, residuals, row_space
from gleak.errors import GleakError

SPAN_MARGIN = 20  # DAGER keeps the span at least this far below the width (§3.2, Δ_b = 20)


@dataclass(frozen=True, kw_only=True)
class SpanTest:
    """``residual(u)`` [N, d_in] -> [N] relative distances to the span; ``noise`` the span's relative noise floor
    (s_(r+1)/s_r of the weakest module read: true inputs sit about there); ``diagnostics`` for reports."""

    residual: Callable[[torch.Tensor], torch.Tensor]
    noise: float
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def threshold(self, floor: float = 1e-6) -> float:
        """The spectral threshold: the geometric middle between the noise floor (at least ``floor``, the rounding
        of a float32 forward pass) and 1, where inputs outside the span sit."""
        return math.sqrt(max(self.noise, floor))


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def margin(width: int) -> int:
    """How far below the width a span must stay to be a test: DAGER's 20, less for narrow layers."""
    return max(1, min(SPAN_MARGIN, width // 8))


def saturated(what: str, rank: int, room: int, detail: str) -> str:
    return (f"the {what} gradient has rank {rank} of at most {room} ({detail}): the batch has at least that many "
            "distinct inputs there, so the span holds them all and no input can be told apart (the span test needs "
            "fewer distinct tokens than the rank: METHODS-text §3.2, §3.9)")


def weight_span(grads: Sequence[torch.Tensor], names: Sequence[str], min_gap: float) -> SpanTest:
    """The union of the row spaces of weight gradients [d_out, d_in] that read one input (full fine-tuning)."""
    width = int(grads[0].shape[1])
    own = [(row_space(g.double()), min(g.shape)) for g in grads]
    room = width - margin(width)
    # a module at full rank (its own rows or the width) holds every input: set aside, as one without a clear gap
    clean = [sp for sp, rows in own if sp.rank < min(room, rows) and sp.gap >= min_gap]
    if not clean:
        worst = max((sp for sp, _ in own), key=lambda sp: sp.rank)
        where = f"{names[0].rsplit('.', 1)[0]} weight"
        if worst.rank < room and all(sp.rank < rows for sp, rows in own):
            raise GleakError(f"the {where} gradient has no clear rank (its singular values fall by at most "
                             f"{worst.gap:.3g}× at once, under {min_gap:g}×): too noisy for the span test (a "
                             "float32 update of several local steps, or added noise), or the batch is near the width "
                             f"{width}")
        raise GleakError(saturated(where, worst.rank, width, f"width {width}"))
    union = row_space(torch.cat([sp.basis for sp in clean]))
    if union.rank >= room:
        raise GleakError(saturated("stacked weight", union.rank, width, f"width {width}"))
    space = union
    return SpanTest(residual=lambda u: residuals(space, u), noise=max(1 / sp.gap for sp in clean),
                    diagnostics={"rank": space.rank, "width": width, "modules_read": len(clean),
                                 "sv_gap": finite(min(sp.gap for sp in clean))})


def lora_a_span(members: Sequence[LoraFactors], min_gap: float) -> SpanTest:
    """The union of the lora_A gradients' row spaces (rows in span{u})."""
    own = [(f, row_space(f.a.double())) for f in members]
    clean = [sp for f, sp in own if sp.rank < min(f.a.shape) and sp.gap >= min_gap]
    if not clean:
        raise GleakError(saturated("lora_A", max(sp.rank for _, sp in own), members[0].rank, _lora(members)))
    space = row_space(torch.cat([sp.basis for sp in clean]))
    return SpanTest(residual=lambda u: residuals(space, u), noise=max(1 / sp.gap for sp in clean),
                    diagnostics={"case": "lora_A rows", "rank": space.rank, "modules_read": len(clean),
                                 "sv_gap": finite(min(sp.gap for sp in clean))})


def lora_b_span(members: Sequence[LoraFactors], stored: Mapping[str, torch.Tensor], min_gap: float) -> SpanTest:
    """Each lora_B gradient's row space in ℝʳ against A·u with the global adapter's A (``stored``, by the capture's
    names); an input is in when it lies in any unsaturated module's span."""
    spaces: list[tuple[RowSpace, torch.Tensor]] = []
    ranks = []
    for f in members:
        if f.a_name not in stored or tuple(stored[f.a_name].shape) != tuple(f.a.shape):
            raise GleakError(f"the global adapter has no {f.a_name} of shape {list(f.a.shape)}")
        space = row_space(f.b.double())
        ranks.append(space.rank)
        if space.rank < f.rank and space.gap >= min_gap:
            spaces.append((space, stored[f.a_name].double()))
    if not spaces:
        raise GleakError(saturated("lora_B", max(ranks), members[0].rank, _lora(members)))

    def nearest(u: torch.Tensor) -> torch.Tensor:
        u = u.double()
        return torch.stack([residuals(sp, u @ a_m.T) for sp, a_m in spaces]).amin(0)

    return SpanTest(residual=nearest, noise=max(1 / sp.gap for sp, _ in spaces),
                    diagnostics={"case": "lora_B rows through the global A",
                                 "rank": max(sp.rank for sp, _ in spaces), "modules_read": len(spaces),
                                 "sv_gap": finite(min(sp.gap for sp, _ in spaces))})


def lora_span(members: Sequence[LoraFactors], stored: Mapping[str, torch.Tensor] | None, min_gap: float,
              missing_global: str) -> list[SpanTest | str]:
    """The LoRA tests worth trying, in order (A first: exact and needs no global adapter; B through the global A
    when A is zero, a fresh adapter's gradient, or moved only by rounding), each a test or why it cannot be
    built."""
    out: list[SpanTest | str] = []
    if not lora_a_is_zero(members):
        try:
            out.append(lora_a_span(members, min_gap))
        except GleakError as e:
            out.append(str(e))
    if stored is None:
        out.append(missing_global)
    else:
        try:
            out.append(lora_b_span(members, stored, min_gap))
        except GleakError as e:
            out.append(str(e))
    return out


def _lora(members: Sequence[LoraFactors]) -> str:
    where = f"{len(members)} modules" if len(members) > 1 else members[0].module
    return f"LoRA r = {members[0].rank} on {where}"
