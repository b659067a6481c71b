"""What the token attacks read: a plain description of a language model and the capture's tensors by role.

:class:`TextModelSpec` describes the model and the contribution (no ``transformers`` object: the loader fills it
from a Hugging Face config). :func:`token_view` finds, among a mapping of parameter name -> tensor (the names of
``model.named_parameters()``; a tied head appears once, as the embedding), the token-embedding matrix [V, d], the
LM head [V, d] (None when tied or absent) and the learned position table [n_ctx, d] (None for RoPE models), by
name patterns checked against the shapes the description gives. Notes: docs/methods/tokens.md#view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from gleak.errors import GleakError

# Name endings, most specific first; a match must also have the expected shape.
EMBEDDING_NAMES = ("wte.weight", "embed_tokens.weight", "word_embeddings.weight", "embed_in.weight",
                   "tok_embeddings.weight", "token_embedding.weight")
HEAD_NAMES = ("lm_head.weight", "embed_out.weight")
POSITION_NAMES = ("wpe.weight", "position_embeddings.weight", "embed_positions.weight")
LORA_MARKERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")
POSITION_OFFSETS = (0, 2)  # OPT's learned positions start at row 2

LORA_REASON = ("this update holds only LoRA adapter tensors (lora_A/lora_B): the token embeddings and the LM head "
               "were frozen, so the bag of tokens, the next-token counts and the positions cannot be read from it "
               "(lora-tokens and sparse-tokens read the adapter instead)")


@dataclass(kw_only=True, frozen=True)
class TextModelSpec:
    """A language model and the contribution a client sent, as plain values.

    ``task``: ``causal_lm`` (next-token loss over non-pad targets, HF convention: labels = input ids with pads
    −100) or ``sequence_classification``. ``kind``: ``gradient`` (FedSGD) or ``update`` (Δ = θ_E − θ_0 after
    ``local_steps`` steps at ``learning_rate``). ``batch_size`` and ``max_length`` (the tokenizer's padded length),
    when known, only size the reference set of the tied separation (§2.2(a))."""

    model_type: str
    vocab_size: int
    hidden_size: int
    tie_word_embeddings: bool
    n_positions: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    task: Literal["causal_lm", "sequence_classification"] = "causal_lm"
    kind: Literal["gradient", "update"] = "gradient"
    local_steps: int = 1
    learning_rate: float | None = None
    batch_size: int | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.vocab_size < 2 or self.hidden_size < 1:
            raise GleakError(f"a text model needs vocab_size ≥ 2 and hidden_size ≥ 1, got {self.vocab_size} and "
                             f"{self.hidden_size}")
        if self.local_steps < 1:
            raise GleakError(f"local_steps must be ≥ 1, got {self.local_steps}")

    @property
    def tied_lm(self) -> bool:
        """The embedding gradient mixes the input part and the head part (§2.2): tied, under next-token loss."""
        return self.tie_word_embeddings and self.task == "causal_lm"


@dataclass(kw_only=True, frozen=True)
class TokenView:
    """The capture's tensors the token attacks read, as stored (no float64 copy of a [V, d] matrix is made here).

    ``scale`` turns a stored tensor into the gradient direction: +1 for a gradient, −1/(η·steps) for an update
    (−Δ, the update direction; −1 when η is unknown: every token attack is invariant to a positive scale)."""

    spec: TextModelSpec
    embedding_name: str
    embedding: torch.Tensor
    head_name: str | None
    head: torch.Tensor | None
    position_name: str | None
    positions: torch.Tensor | None
    position_offset: int
    scale: float
    note: str


def is_lora_only(tensors: Mapping[str, torch.Tensor]) -> bool:
    """True when every tensor is a LoRA adapter factor (and there is at least one)."""
    return bool(tensors) and all(any(m in name for m in LORA_MARKERS) for name in tensors)


def _find(tensors: Mapping[str, torch.Tensor], endings: tuple[str, ...],
          fits: tuple[tuple[int, int], ...]) -> tuple[str, torch.Tensor] | None:
    for ending in endings:
        for name, tensor in tensors.items():
            if any(m in name for m in LORA_MARKERS) or not (name == ending or name.endswith("." + ending)):
                continue
            if tensor.dim() == 2 and tuple(tensor.shape) in fits:
                return name, tensor
    return None


def token_view(tensors: Mapping[str, torch.Tensor], spec: TextModelSpec) -> TokenView:
    """Find the embedding, head and position tensors of ``spec``'s model in ``tensors``; a one-line GleakError
    when the embedding cannot be found (or the capture is a LoRA adapter: :data:`LORA_REASON`)."""
    v, d = spec.vocab_size, spec.hidden_size
    if is_lora_only(tensors):
        raise GleakError(LORA_REASON)
    emb = _find(tensors, EMBEDDING_NAMES, ((v, d),))
    if emb is None:
        near = [f"{n} {list(t.shape)}" for n, t in tensors.items() if n.endswith(EMBEDDING_NAMES)]
        raise GleakError(f"no token-embedding matrix of shape [{v}, {d}] among the capture's tensors (looked for "
                         f"names ending in {', '.join(EMBEDDING_NAMES)})"
                         + (f"; found {', '.join(near[:3])}" if near else ""))
    head = None
    if not spec.tie_word_embeddings:
        head = _find(tensors, HEAD_NAMES, ((v, d),))
    pos = None
    if spec.n_positions is not None:
        pos = _find(tensors, POSITION_NAMES, tuple((spec.n_positions + k, d) for k in POSITION_OFFSETS))
    notes = []
    if spec.kind == "update":
        if spec.learning_rate:
            steps = spec.learning_rate * spec.local_steps
            scale = -1.0 / steps
            notes.append(f"update read as the pseudo-gradient −Δ/(η·steps) = −Δ/{steps:g}")
        else:
            scale = -1.0
            notes.append("update read as its direction −Δ (no learning rate recorded; the attacks need only the "
                         "direction)")
        if spec.local_steps > 1:
            notes.append(f"{spec.local_steps} local steps: rows mix gradients taken at moving weights")
    else:
        scale = 1.0
    return TokenView(spec=spec, embedding_name=emb[0], embedding=emb[1], head_name=head[0] if head else None,
                     head=head[1] if head else None, position_name=pos[0] if pos else None,
                     positions=pos[1] if pos else None,
                     position_offset=(int(pos[1].shape[0]) - (spec.n_positions or 0)) if pos else 0,
                     scale=scale, note="; ".join(notes))
