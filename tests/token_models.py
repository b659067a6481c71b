"""Tiny Hugging Face language models, token batches, gradients and FedAvg updates for the token-attack tests and
bench/tokens.py (transformers is imported by the callers' importorskip first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from gleak.attacks import Context, run_attack
from gleak.attacks.base import AttackResult
from gleak.attacks.registry import get_attack
from gleak.attacks.tokens.view import TextModelSpec
from gleak.capture import Capture
from gleak.losses import LossSpec
from gleak.models.lastlayer import LastLayer


def gpt2(d: int = 128, vocab: int = 1000, layers: int = 2, seed: int = 0) -> nn.Module:
    """A random tied GPT-2 (n_positions 64), eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_embd=d, n_head=2, vocab_size=vocab, n_positions=64, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0, tie_word_embeddings=True)
    return GPT2LMHeadModel(config).eval()


def llama(d: int = 128, vocab: int = 1000, layers: int = 2, seed: int = 0) -> nn.Module:
    """A random LLaMA-style model with an untied head (RoPE, RMSNorm), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def adapt(base: nn.Module, r: int, trained: bool, seed: int = 0, targets: list[str] | None = None) -> nn.Module:
    """``base`` (copied) with a LoRA adapter on the attention input projections (GPT-2's c_attn; ``targets``, by
    default q, k and v, otherwise); ``trained`` gives lora_B random values, as after some rounds (a fresh adapter
    has lora_B = 0). peft is imported by the callers' importorskip first."""
    import copy

    import peft

    torch.manual_seed(seed)
    gpt = base.config.model_type == "gpt2"
    config = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, fan_in_fan_out=gpt,
                             target_modules=["c_attn"] if gpt else (targets or ["q_proj", "k_proj", "v_proj"]))
    model: nn.Module = peft.get_peft_model(copy.deepcopy(base), config).eval()
    if trained:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02)
    return model


def spec_of(model: nn.Module, kind: Literal["gradient", "update"] = "gradient", steps: int = 1,
            lr: float | None = None, batch_size: int | None = None, max_length: int | None = None) -> TextModelSpec:
    """What the loader would describe (read from the HF config here)."""
    c: Any = model.config
    n_positions = getattr(c, "n_positions", None) if c.model_type == "gpt2" else None
    return TextModelSpec(model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                         tie_word_embeddings=bool(c.tie_word_embeddings), n_positions=n_positions,
                         pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                         kind=kind, local_steps=steps, learning_rate=lr, batch_size=batch_size,
                         max_length=max_length)


def token_batch(batch: int, vocab: int, lengths: tuple[int, int], seed: int, pad: int = 0,
                left: bool = False, low: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids in [low, vocab) with random lengths in ``lengths`` (inclusive), padded to the longest."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=gen).tolist()
    width = max(sizes)
    ids = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for i, n in enumerate(sizes):
        where = slice(width - n, width) if left else slice(0, n)
        ids[i, where] = torch.randint(low, vocab, (n,), generator=gen)
        mask[i, where] = 1
    return ids, mask


def lm_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over non-pad targets (labels = ids with pads −100; the model shifts)."""
    loss: torch.Tensor = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    return loss


def gradient(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The FedSGD gradient, keyed by ``named_parameters()`` names (tied weights once)."""
    model.zero_grad()
    lm_loss(model, ids, mask).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def fedavg_update(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, steps: int, lr: float
                  ) -> dict[str, torch.Tensor]:
    """Δ = θ_steps − θ_0 after ``steps`` plain SGD steps on the batch (the model is restored afterwards)."""
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        lm_loss(model, ids, mask).backward()
        opt.step()
    delta = {n: p.detach() - start[n] for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    return delta


def text_context(tensors: Mapping[str, torch.Tensor], spec: TextModelSpec) -> Context:
    """A Context for a text capture, built without files (the lead's build_context will fill ``text_model``)."""
    capture = Capture(tensors=dict(tensors), meta={"gleak.kind": spec.kind, "gleak.local_steps": spec.local_steps})
    emb = next(iter(tensors.values()))
    layer = LastLayer(name="lm_head", weight_key="lm_head.weight", bias_key=None, weight=emb, bias=None,
                      grad_weight=None, grad_bias=None, num_classes=spec.vocab_size, feature_dim=spec.hidden_size,
                      reason="text capture")
    return Context(capture=capture, layer=layer, model=None, num_classes=spec.vocab_size,
                   batch_size=spec.batch_size, local_steps=spec.local_steps, loss=LossSpec(), text_model=spec)


def run_token_attack(name: str, ctx: Context, options: Mapping[str, Any] | None = None) -> AttackResult:
    attack = get_attack(name, "tokens")
    if options:
        attack.configure(options)
    return run_attack(attack, ctx)
