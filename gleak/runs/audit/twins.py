"""Twin batches of a language model's capture: batches drawn from ``--aux`` text and simulated as the capture was
made (same model and adapter, B, truncation length, FedSGD or the recorded local steps, learning rate and
optimiser), each with its own truth. The audit attacks them the way it attacked the capture and scores them against
that truth: the leakage to expect from batches like the capture's when its own truth is not there (CI never has it).

A twin costs what the client's round cost (a FedAvg twin is m local steps), so twins are made one at a time (one in
memory) and stop when the time left would not fit another.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gleak.attacks import Context
from gleak.capture import TextTruth
from gleak.data.text import TextData
from gleak.errors import GleakError
from gleak.runs.audit.setup import AuditConfig

TEXT_TWINS = {"quick": 2, "standard": 3, "full": 4}  # twin batches per capture without truth, at most


@dataclass(frozen=True)
class Twin:
    """One twin batch: its context (the capture's, with the twin's capture) and its truth."""

    ctx: Context
    truth: TextTruth
    seconds: float  # what simulating it took


def text_twins(ctx: Context, text_aux: tuple[Path, TextData], count: int, config: AuditConfig,
               model_folder: Path | None, time_left: Callable[[], float] | None = None) -> Iterator[Twin]:
    """Up to ``count`` twins of ``ctx``'s capture, one at a time. ``time_left`` (seconds left once the twin is
    attacked; None: no bound): a twin starts only when that time fits one more, judged by the slowest twin so far
    (the first when it is positive: the twin itself then runs under the deadline in force). Raises
    :class:`~gleak.errors.GleakError` when no twin can be made (no folder, no global adapter, too little aux text)."""
    from gleak.attacks.tokens.lora import load_global_adapter
    from gleak.models.peft import LoraSpec, spec_of_config
    from gleak.models.text import load_tokenizer
    from gleak.simulate.images import ClientConfig
    from gleak.simulate.text import TextClientOptions, simulate_lora_client, simulate_text_client

    spec, model = ctx.text_model, ctx.model
    if spec is None or model is None or model_folder is None:
        raise GleakError("twin batches need the model's Hugging Face folder")
    lora: tuple[LoraSpec, dict[str, Any]] | None = None
    if ctx.capture.get("gleak.peft.type") is not None:
        # the twins fine-tune the same adapter from the global one beside the capture, which DAGER also reads
        stored = load_global_adapter(ctx.capture.path)
        if stored is None:
            raise GleakError("twin batches of a LoRA capture need its global adapter beside it (NAME.adapter/, as "
                             "gleak simulate --peft and the Flower mod write it)")
        lora = (spec_of_config(stored[0]), stored[1])
    tokenizer = load_tokenizer(model_folder, trust_remote_code=config.trust_remote_code)
    b = ctx.batch_size or 1
    steps = ctx.local_steps
    lr = float(ctx.capture.get("gleak.learning_rate") or 0.01)
    path, data = text_aux
    if len(data) < b:
        raise GleakError(f"--aux {path.name} has {len(data)} examples, fewer than a batch of {b}")
    classes = ctx.capture.get("gleak.num_classes")
    options = TextClientOptions(task=spec.task, max_length=spec.max_length,
                                num_labels=int(classes) if isinstance(classes, int) else None)
    slowest = 0.0
    for k in range(count):
        if time_left is not None and time_left() <= slowest:
            return
        started = time.perf_counter()
        client = ClientConfig(batch_size=b, local_steps=steps, scheme="fedsgd" if steps == 1 else "fedavg",
                              learning_rate=lr, optimizer=str(ctx.capture.get("gleak.optimizer") or "sgd"),
                              train_mode=False, seed=ctx.seed + 1000 + k)
        if lora is None:
            capture, truth = simulate_text_client(model, tokenizer, data, client, options)
        else:
            capture, truth, _ = simulate_lora_client(model, tokenizer, data, client, options, lora[0], start=lora[1])
            capture.path = ctx.capture.path  # the same global adapter beside it
        twin = dataclasses.replace(ctx, capture=capture, batch_size=capture.batch_size, _cache={})
        seconds = time.perf_counter() - started
        slowest = max(slowest, seconds)
        yield Twin(ctx=twin, truth=truth, seconds=seconds)


def spread(values: list[float]) -> dict[str, float]:
    """Mean, min and max of one score over the twins (the interval the findings quote: the range over the twins)."""
    return {"mean": round(sum(values) / len(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}
