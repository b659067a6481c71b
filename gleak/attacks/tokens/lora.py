"""The bag of input tokens from a LoRA update (METHODS-text §3.9; the layer-1 span test of DAGER, Petrov et al.,
NeurIPS 2024, App. B.4), on captures whose embeddings and head were frozen.

A LoRA adapter on a first-block projection (q/k/v, GPT-2's c_attn) sees inputs from a finite set: one vector per
token (RMSNorm(E[v]) for LLaMA-style models, rotary positions come later) or per (token, position) (GPT-2:
LN(E[v] + P[p])). Its factors' gradients keep that span:

* ∇A = s Σ_t (Bᵀ δ_t) u_tᵀ: rows in span{u_t}. Non-zero once B ≠ 0 (a trained adapter, or the second local step
  of a fresh one). Stacking the A rows of every adapted module that reads the same input tests the candidates
  against one span of rank ≤ min(Σ r, n).
* ∇B = s Σ_t δ_t (A u_t)ᵀ: rows in span{A u_t} ⊂ ℝʳ. The only trace at initialisation (B = 0 makes ∇A exactly 0),
  tested through the global adapter's A.

Either way the test is exact while the batch has fewer distinct inputs n than the span's room (Σ r, or r); at or
beyond it the rank saturates and the attack says so, naming the rank, instead of guessing.

The candidates are computed by running the base model up to the adapted module (a forward pre-hook stops it
there), so any architecture whose first projections read token-wise inputs works; whether they do is checked on a
probe (the module's input for a token must not depend on the tokens before it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, RunInputs, TokenOutput
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.attacks.tokens.adapters import lora_factors
from gleak.attacks.tokens.inputs import CHUNK_TOKENS, candidate_residuals, first_tokenwise, tested_positions
from gleak.attacks.tokens.span import gap_threshold
from gleak.attacks.tokens.spantest import finite, lora_span
from gleak.attacks.tokens.view import is_lora_only
from gleak.errors import GleakError
from gleak.models.peft import adapter_path_for

DAGER = ("Petrov, Dimitrov, Baader, Müller, Vechev, DAGER: Exact Gradient Inversion for Large Language Models, "
         "NeurIPS 2024")


def load_global_adapter(capture_path: Path | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """The global adapter's config and tensors when its folder sits beside the capture (``NAME.adapter/``, as
    ``gleak simulate --peft`` and the Flower mod write it), else None. Safetensors only (never a pickle)."""
    from gleak.models.peft import is_adapter_dir, load_adapter

    if capture_path is None or not is_adapter_dir(adapter_path_for(capture_path)):
        return None
    return load_adapter(adapter_path_for(capture_path))


def global_adapter(capture_path: Path | None) -> dict[str, torch.Tensor] | None:
    """The global adapter's tensors beside the capture (:func:`load_global_adapter`), else None."""
    loaded = load_global_adapter(capture_path)
    return loaded[1] if loaded is not None else None


class LoraTokensOptions(AttackOptions):
    min_gap: float = Field(100.0, gt=1, description="the smallest gap (ratio) between the residuals of the tokens "
                           "accepted and the rest; below it the attack reports no clear separation")


@register
class LoraTokens(Attack):
    """The bag of input tokens from a LoRA adapter's update: first-block adapter factors tested against every
    vocabulary token's input (module docstring; METHODS-text §3.9, DAGER's layer-1 test, Petrov et al., NeurIPS
    2024). Scores: −log10 of the smallest residual over positions. Counts: the positions a token passes at (1 for
    position-free inputs)."""

    task = "tokens"
    requires = Requirements(needs_text=True, gradient_view=False, needs_batch_size=False)
    name = "lora-tokens"
    paper = DAGER
    summary = "bag of input tokens from a LoRA update's first-block adapters (span test; rank-limited)"
    Options = LoraTokensOptions
    options: LoraTokensOptions

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        if not is_lora_only(ctx.capture.tensors):
            return "not a LoRA update (token-bag reads the embedding gradient of a full fine-tuning capture)"
        if ctx.model is None:
            return "needs the base model (--model DIR)"
        return None

    def memory_bytes(self, ctx: Context) -> int:
        spec = ctx.text_model
        if spec is None:
            return 0
        positions = spec.max_length or 1
        return 8 * positions * spec.vocab_size * 2 + 4 * CHUNK_TOKENS * positions * spec.hidden_size * 4

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TokenOutput:
        spec, model = ctx.text_model, ctx.model
        if spec is None or model is None:  # pragma: no cover - not_applicable guards both
            raise GleakError("needs a language model's capture and its base model")
        factors = lora_factors(ctx.capture.tensors, model)
        vocab = spec.vocab_size
        group = first_tokenwise(model, [(f.module, f.layer) for f in factors], vocab)
        if group is None:
            raise GleakError("no adapted module reads token-wise inputs (LoRA on the first block's attention "
                             "projections: q/k/v, or c_attn); deeper adapters' inputs mix the batch, so the tokens "
                             "cannot be tested one by one")
        kind, paths = group
        members = [f for f in factors if f.module in paths]
        positions = 1
        if kind.positional:
            positions = tested_positions(spec.max_length, spec.n_positions)
        names = [f.module for f in members]
        stored = global_adapter(ctx.capture.path)
        beside = adapter_path_for(ctx.capture.path).name if ctx.capture.path else "NAME.adapter"
        missing = ("a fresh adapter's lora_A gradient is zero (lora_B starts at 0), and the inputs show only through "
                   "lora_B's gradient projected by the global adapter's lora_A, which is not here: put the global "
                   f"adapter folder beside the capture as {beside}/")
        attempts: list[str] = []
        for test in lora_span(members, stored, self.options.min_gap, missing):
            if isinstance(test, str):
                attempts.append(test)
                continue
            try:
                dist = candidate_residuals(model, members[0].layer, vocab, positions, test.residual)
                return self._separate(dist, {**test.diagnostics, "modules": names, "positions": positions})
            except GleakError as e:
                attempts.append(str(e))
        raise GleakError(attempts[0] if len(attempts) == 1 or attempts[-1] == missing else
                         f"{attempts[0]}; through lora_B: {attempts[-1]}")

    def _separate(self, dist: torch.Tensor, diagnostics: dict[str, Any]) -> TokenOutput:
        """The tokens whose residual falls below the gap (at any position), or a one-line GleakError."""
        tau, ratio = gap_threshold(dist.flatten())
        if ratio < self.options.min_gap:
            raise GleakError(f"no clear gap between the tokens' residuals (largest {ratio:.3g}× < "
                             f"{self.options.min_gap:g}×): the adapter's span does not single out the batch's tokens")
        passed = dist < tau
        ids = passed.any(0).nonzero().flatten()
        return TokenOutput(token_ids=ids, counts=passed.sum(0)[ids],
                           scores=-torch.log10(dist.amin(0).clamp_min(1e-300)),
                           diagnostics={"method": "lora-span", **diagnostics, "threshold": tau,
                                        "gap_ratio": finite(ratio)})
