"""Tiny language models for the tests, built in the test (nothing is downloaded): synthetic notes with fake names,
record numbers and dates, a word-level tokenizer trained on them, and random-weight LLaMA-style (untied) and
GPT-2-style (tied) Hugging Face folders. Needs the text extra (transformers, tokenizers)."""

from __future__ import annotations

import random
from pathlib import Path

FIRST = ["Alice", "Bob", "Carol", "Dmitri", "Esther", "Farid", "Grace", "Hiro"]
LAST = ["Smith", "Jones", "Okafor", "Novak", "Silva", "Tanaka"]
NAMES = FIRST + LAST
WORDS = ["the", "patient", "was", "seen", "on", "reports", "pain", "in", "chest", "and", "back", "follow", "up",
         "next", "week", "no", "fever", "cough", "mild", "severe", "blood", "pressure", "normal", "prescribed",
         "rest", "fluids", "called", "nurse", "clinic", "visit"]


def build_notes_and_models(folder: Path, layers: int = 1) -> tuple[Path, Path, Path]:
    """Write ``notes.txt`` (120 synthetic notes) and the ``llama`` and ``gpt2`` model folders (``layers`` blocks)
    under ``folder``; (notes, llama folder, gpt2 folder)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    lines = [f"{rng.choice(FIRST)} {rng.choice(LAST)} record {rng.randint(1000, 9999)} on "
             f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
             + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8))) for _ in range(120)]
    (folder / "notes.txt").write_text("\n".join(lines) + "\n")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[BOS]", "[EOS]"]))
    out = []
    for kind in ("llama", "gpt2"):
        model_dir = folder / kind
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]",
                                                    eos_token="[EOS]", pad_token="[PAD]", padding_side="right")
        fast.save_pretrained(model_dir)
        torch.manual_seed(0)
        if kind == "llama":
            config = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=64, intermediate_size=128,
                                              num_attention_heads=2, num_key_value_heads=2, vocab_size=len(fast),
                                              max_position_embeddings=64, pad_token_id=1, bos_token_id=2,
                                              eos_token_id=3, tie_word_embeddings=False)
            transformers.LlamaForCausalLM(config).save_pretrained(model_dir)
        else:
            config = transformers.GPT2Config(n_layer=layers, n_embd=128, n_head=2, vocab_size=len(fast), n_positions=64,
                                             bos_token_id=2, eos_token_id=3, pad_token_id=1)
            transformers.GPT2LMHeadModel(config).save_pretrained(model_dir)
        out.append(model_dir)
    return folder / "notes.txt", out[0], out[1]
