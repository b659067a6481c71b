"""The federated task of the example, FlowerTune-style: a LoRA adapter (peft) fine-tuned on a frozen LLaMA-style
model, each client on its shard of the shipped synthetic clinical notes; only the adapter's arrays travel.

Plain transformers + peft; the only gleak call is :func:`gleak.integrations.flower.record_batch`, the optional hook
that lets the capture mod write each client's ground truth (the token batches it trained on) beside its update.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context

from gleak.integrations.flower import LoraApp, record_batch

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "samples" / "text" / "notes-llama"  # the base model every client fine-tunes (2 layers, d = 64)
NOTES = ROOT / "samples" / "text" / "notes.txt"  # 300 synthetic notes: fake names, record numbers, dates
# FlowerTune's defaults for the adapter (r 32, alpha 64, peft's targets for LLaMA), without dropout: dropout on the
# adapter's input would make the client's update differ from what anyone can recompute
R, ALPHA, TARGETS = 32, 64, ["q_proj", "v_proj"]


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")


def lora_app(max_length: int) -> LoraApp:
    """What gleak needs to know about this app (for the capture mod and the audit strategy)."""
    return LoraApp(BASE, lora_config(), max_length=max_length)


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(BASE), local_files_only=True)


def new_model(seed: int = 0) -> Any:
    """The base model with a fresh LoRA adapter (the same for every seed-0 call: the initial global adapter)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(BASE), local_files_only=True)
    torch.manual_seed(seed)
    return get_peft_model(base, lora_config())


def adapter_arrays(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's state dict as peft saves it: what a FlowerTune client sends back."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def set_adapter(model: Any, arrays: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, arrays)


def shard(partition: int, partitions: int) -> list[str]:
    """Client ``partition``'s notes (every ``partitions``-th line)."""
    lines = [line for line in NOTES.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[partition::partitions]


def train(model: Any, notes: list[str], steps: int, batch_size: int, lr: float, max_length: int, seed: int,
          context: Context | None = None) -> float:
    """``steps`` SGD steps of next-token loss on random batches of the shard (truncated to ``max_length`` tokens);
    each batch is recorded for the truth file."""
    rng = random.Random(seed)
    trainable = [p for p in model.parameters() if p.requires_grad]  # the adapter only
    optimizer = torch.optim.SGD(trainable, lr=lr)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        batch = tokenizer()(rng.sample(notes, batch_size), return_tensors="pt", padding=True, truncation=True,
                            max_length=max_length)
        if context is not None:
            record_batch(context, batch)  # the documented hook: ground truth for the audit (tests, red teams)
        optimizer.zero_grad()
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        optimizer.step()
    return float(loss.detach())
