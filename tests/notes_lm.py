"""A GPT-2-style (tied) language model that knows the domain: trained here on the synthetic clinical notes of
scripts/make_text_samples.py with a byte-level BPE tokenizer, then attacked on notes of another generator seed (new
patients, dates and numbers). Used by tests/test_token_attacks.py (tiny, a few seconds) and bench/tokens.py
(d = 768, cached under /tmp). Needs transformers and tokenizers; nothing is downloaded."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
PAD = "<|endoftext|>"  # id 0: GPT-2's end-of-text, used to pad (masked out of the loss)


def make_notes(seed: int) -> list[str]:
    """300 synthetic notes from scripts/make_text_samples.py's generator (seed 0 is samples/text/notes.txt)."""
    spec = importlib.util.spec_from_file_location("make_text_samples", ROOT / "scripts" / "make_text_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    notes: list[str] = module.make_notes(seed)
    return notes


def bpe_tokenizer(lines: list[str], vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``lines`` (at most ``vocab_size`` tokens, id 0 =
    :data:`PAD`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    return tok


def encode(tok: Any, lines: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [len(lines), T]: each line truncated to ``max_length`` tokens, right-padded with id 0
    to the longest."""
    rows = [e.ids[:max_length] for e in tok.encode_batch(lines)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


def _loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    return out


def train_gpt2(tok: Any, lines: list[str], *, d: int, layers: int, heads: int, steps: int, lr: float,
               batch: int = 16, length: int = 48, warmup: int = 0, held: list[str] | None = None,
               target_loss: float | None = None, every: int = 5, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """A tied GPT-2 (n_positions 128) trained with Adam on random ``batch`` lines of ``lines`` (first ``length``
    tokens), at most ``steps`` steps (linear warm-up over ``warmup``); with ``held`` and ``target_loss``, stops at
    the first check (every ``every`` steps) where the mean loss on the held-out lines is at most the target. Eval
    mode on return; the info holds the final train loss, the held-out loss (when given), steps and seconds."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=tok.get_vocab_size(), n_positions=128,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    held_batch = encode(tok, held[:64], length) if held else None
    start = time.perf_counter()
    info: dict[str, Any] = {}
    loss = torch.zeros(())
    step = 0
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / warmup) if warmup else lr
        pick = torch.randint(len(lines), (batch,), generator=gen).tolist()
        ids, mask = encode(tok, [lines[i] for i in pick], length)
        loss = _loss(model, ids, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if held_batch is not None and target_loss is not None and step % every == 0:
            model.eval()
            with torch.no_grad():
                info["held_loss"] = float(_loss(model, *held_batch))
            model.train()
            if info["held_loss"] <= target_loss:
                break
    model.eval()
    if held_batch is not None and "held_loss" not in info:
        with torch.no_grad():
            info["held_loss"] = float(_loss(model, *held_batch))
    info.update(train_loss=float(loss.detach()), steps=step, seconds=time.perf_counter() - start)
    return model, info
