"""Sentence-reconstruction attacks on language-model captures (task ``text``): DAGER (exact, analytic).

Maths in :mod:`gleak.attacks.text.dager`; notes in docs/methods/text.md.
"""

from __future__ import annotations

from pydantic import Field

from gleak.attacks.base import NO_INPUTS, RunInputs, TextOutput
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.text.base import SentenceAttack
from gleak.attacks.text.dager import run_dager
from gleak.attacks.text.encoder import MAX_COMBINATIONS
from gleak.attacks.text.prefix import CHUNK_TOKENS
from gleak.attacks.tokens.lora import DAGER, load_global_adapter
from gleak.attacks.tokens.view import is_lora_only, token_view
from gleak.errors import GleakError
from gleak.models.peft import adapter_path_for


class DagerOptions(AttackOptions):
    min_gap: float = Field(100.0, gt=1, description="the smallest gap (ratio) between the residuals of inputs "
                           "accepted and the rest; below it the threshold falls back to the span's spectral bound "
                           "(first block) or the first block's threshold (prefix steps)")
    span_gap: float = Field(10.0, gt=1, description="the smallest drop (ratio) of a gradient's singular values "
                            "accepted as its rank; a module without one is set aside as saturated or noisy")
    max_combinations: int = Field(MAX_COMBINATIONS, ge=1, description="encoders (BERT): sequences of one length "
                                  "scored exhaustively; beyond it, a coordinate search from B starts")


@register
class Dager(SentenceAttack):
    """DAGER (Petrov, Dimitrov, Baader, Müller, Vechev, NeurIPS 2024): exact sequences from the first two blocks'
    attention-input gradients (full fine-tuning) or adapters (LoRA), by span membership of every token's first-block
    input and every prefix's second-block input; the last token of each sequence from the LM head (METHODS-text
    §3, §2.3). Fails in one line, naming the rank, when a span fills its room."""

    name = "dager"
    paper = DAGER
    summary = "exact sentences from the first two blocks' gradient spans (full or LoRA; rank-limited)"
    Options = DagerOptions
    options: DagerOptions

    reads_classifiers = True

    def memory_bytes(self, ctx: Context) -> int:
        """A [positions, V] float64 residual table, a chunk of candidate inputs with their first block's keys and
        values, and the head solve's chunks."""
        spec = ctx.text_model
        if spec is None:
            return 0
        positions = spec.max_length or 1
        return 8 * positions * spec.vocab_size + 4 * CHUNK_TOKENS * spec.hidden_size * 6 + (128 << 20)

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TextOutput:
        spec, model = ctx.text_model, ctx.model
        if spec is None or model is None:  # pragma: no cover - not_applicable guards both
            raise GleakError("needs a language model's capture and its model")
        tensors = ctx.capture.tensors
        head, scale = None, 1.0
        if not is_lora_only(tensors):
            view = token_view(tensors, spec)
            head = view.head if view.head is not None else view.embedding
            scale = view.scale
        beside = adapter_path_for(ctx.capture.path).name if ctx.capture.path else "NAME.adapter"
        missing = ("a fresh adapter's lora_A gradient is zero (lora_B starts at 0), and the inputs show only through "
                   "lora_B's gradient projected by the global adapter's lora_A, which is not here: put the global "
                   f"adapter folder beside the capture as {beside}/")
        found = run_dager(model, spec, dict(tensors), head=head, head_scale=scale,
                          stored_adapter=load_global_adapter(ctx.capture.path) if is_lora_only(tensors) else None,
                          missing_global=missing, min_gap=self.options.min_gap,
                          span_gap=self.options.span_gap, max_combinations=self.options.max_combinations,
                          padding_side=str(ctx.capture.get("gleak.tokenizer.padding_side") or "right"),
                          progress=inputs.note)
        return TextOutput(sequences=found.sequences, exact=found.exact,
                          diagnostics={"method": "dager", **found.diagnostics,
                                       "last_from_head": found.last_from_head}, warnings=found.warnings)


from gleak.attacks.text import tag as _tag  # noqa: E402, F401  (registers tag, the gradient-matching baseline)
