"""A federated client of a language model, simulated on text: one FedSGD gradient or m local steps on token
batches, written as a text capture and its ground truth (docs/capture-format.md, "Captures of token batches").

Each local step takes B examples of the data: distinct across the whole contribution when the data has m·B of
them, else distinct within each step. All m·B examples are tokenised together, so every step's batch is padded to
the same length T (the truth holds exactly what the model saw). The model runs in eval mode unless asked otherwise
(dropout would make the client's inputs differ from what an attacker recomputes; METHODS-text §6)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from gleak.capture import (
    Capture,
    TextTruth,
    capture_lora_gradients,
    capture_lora_update,
    capture_token_gradients,
    capture_token_update,
    model_logits,
    token_loss,
)
from gleak.data.text import TextData, tokenize
from gleak.defenses import apply_defenses
from gleak.errors import GleakError
from gleak.io import tensors_sha256
from gleak.models.peft import LoraAdapter, LoraSpec, adapter_state, load_adapter_state, wrap_lora
from gleak.models.text import text_limits
from gleak.simulate.images import ClientConfig, local_optimizer
from gleak.timebox import checkpoint


@dataclass(kw_only=True, frozen=True)
class TextClientOptions:
    """What a text client adds to :class:`~gleak.simulate.images.ClientConfig`: the truncation length, the model's mode,
    and the folder's task and tokenizer (from :class:`gleak.models.text.TextModelInfo`)."""

    task: str = "causal_lm"
    max_length: int | None = None
    train_mode: bool = False
    tokenizer_sha256: str | None = None
    num_labels: int | None = None


def refuse_image_options(config: ClientConfig) -> None:
    """Options that only make sense for images (or are not supported for text yet) are errors, in one line."""
    loss = config.loss
    refused = [
        (config.mixup, "--mixup mixes images; it does not apply to text"),
        (config.composition != "uniform", "--composition/--labels/--dirichlet-alpha draw batches by image class; a "
                                          "text client takes random examples"),
        (loss.name != "cross_entropy", "text clients train with cross-entropy (--loss cross_entropy)"),
        (loss.reduction != "mean", "text losses are the mean over the non-pad targets (--reduction mean)"),
        (loss.label_smoothing != 0 or loss.temperature != 1,
         "--label-smoothing/--temperature do not apply to text clients yet"),
        (any(d.training for d in config.defenses), "dpsgd is not supported for text clients yet; the defenses on "
                                                   "what the client sends (gaussian, clip, topk, …) are"),
    ]
    for bad, message in refused:
        if bad:
            raise GleakError(message)


@contextlib.contextmanager
def interruptible(module: nn.Module) -> Iterator[None]:
    """Ctrl-C inside a backward pass of ``module``: torch runs a CPU backward in C++ without returning to Python, so
    a signal waits for the whole pass (8 s measured on a 2-core machine); a no-op hook on each trainable parameter
    returns to Python as each gradient is made, where KeyboardInterrupt is raised (0.1 s). Gradients unchanged."""
    handles = [p.register_hook(_no_op)  # type: ignore[no-untyped-call]  # torch: no hints
               for p in module.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _no_op(grad: torch.Tensor) -> None:
    return None


def _pick(n: int, config: ClientConfig) -> list[list[int]]:
    """Example indices per step (see the module's docstring)."""
    gen = torch.Generator().manual_seed(config.seed)
    b, m = config.batch_size, config.local_steps
    if n >= b * m:
        order = torch.randperm(n, generator=gen).tolist()
        return [order[i * b:(i + 1) * b] for i in range(m)]
    return [torch.randperm(n, generator=gen)[:b].tolist() for _ in range(m)]


def _meta(config: ClientConfig) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "gleak.batch_size": config.batch_size, "gleak.num_examples": config.batch_size * config.local_steps,
        "gleak.local_steps": config.local_steps, "gleak.learning_rate": config.learning_rate,
        "gleak.optimizer": config.optimizer, "gleak.weight_decay": config.weight_decay,
        "gleak.fl.scheme": config.scheme, "gleak.seed": config.seed, "gleak.batch.composition": "random",
    }
    if config.optimizer in ("sgdm", "nag"):
        meta["gleak.momentum"] = config.momentum
    if config.scheme == "fedprox":
        meta["gleak.fl.mu"] = config.mu
    return meta


def simulate_text_client(model: nn.Module, tokenizer: Any, data: TextData, config: ClientConfig,
                         options: TextClientOptions, device: torch.device | str = "cpu",
                         notices: list[str] | None = None) -> tuple[Capture, TextTruth]:
    """Run the text client on ``data`` from ``model`` (left unchanged); return the capture and its truth. The
    tokens are checked against the model first (:func:`gleak.data.text.tokenize`: its positions, vocabulary and pad
    token; one line otherwise); what was done to fit them (truncation, the pad used) is appended to ``notices``."""
    capture, truth, _ = _text_client(model, tokenizer, data, config, options, None, torch.device(device),
                                     notices=notices)
    return capture, truth


def simulate_lora_client(model: nn.Module, tokenizer: Any, data: TextData, config: ClientConfig,
                         options: TextClientOptions, lora: LoraSpec, device: torch.device | str = "cpu",
                         start: Mapping[str, torch.Tensor] | None = None, notices: list[str] | None = None
                         ) -> tuple[Capture, TextTruth, LoraAdapter]:
    """The text client fine-tuning a LoRA adapter on a causal LM (``model`` left unchanged): a fresh one drawn from
    ``config.seed``, or the global adapter ``start`` (peft's saved names) when given; only the adapter trains.
    Returns the capture of the adapter's gradient or update (docs/capture-format.md, "LoRA captures"), its truth,
    and the global adapter it started from. Inputs are checked and ``notices`` filled as
    :func:`simulate_text_client` does."""
    if options.task != "causal_lm":
        raise GleakError("--peft supports causal language models (*ForCausalLM, *LMHeadModel) for now")
    capture, truth, adapter = _text_client(model, tokenizer, data, config, options, lora, torch.device(device),
                                           start, notices)
    assert adapter is not None
    return capture, truth, adapter


def _text_client(model: nn.Module, tokenizer: Any, data: TextData, config: ClientConfig, options: TextClientOptions,
                 lora: LoraSpec | None, device: torch.device, start: Mapping[str, torch.Tensor] | None = None,
                 notices: list[str] | None = None) -> tuple[Capture, TextTruth, LoraAdapter | None]:
    """The one text client behind :func:`simulate_text_client` and :func:`simulate_lora_client`."""
    refuse_image_options(config)
    if config.batch_size > len(data):
        raise GleakError(f"a batch of {config.batch_size} examples needs at least that many; the data has {len(data)}")
    classify = options.task == "sequence_classification"
    if classify and data.labels is None:
        raise GleakError(f"{data.path}: a sequence classifier trains on labelled text: give a .jsonl file with a "
                         "\"label\" (class index) on every line")
    steps = _pick(len(data), config)
    flat = [i for step in steps for i in step]
    positions, vocab_size = text_limits(model)
    batch = tokenize(tokenizer, [data.texts[i] for i in flat], options.max_length, positions=positions,
                     vocab_size=vocab_size)
    if notices is not None:
        notices.extend(batch.notices)
    labels = torch.tensor([data.labels[i] for i in flat], dtype=torch.int64) if classify and data.labels else None
    if labels is not None and options.num_labels is not None and int(labels.max()) >= options.num_labels:
        raise GleakError(f"the data has label {int(labels.max())} but the model has {options.num_labels} classes")
    task_keys: dict[str, Any] = {
        "task": options.task, "tokenizer_sha256": options.tokenizer_sha256, "padding_side": batch.padding_side,
        "max_length": batch.truncation if options.max_length else int(batch.input_ids.shape[1]),
        "pad_token_id": batch.pad_token_id,
        "train_mode": options.train_mode}
    global_model = copy.deepcopy(model).to(device)
    base_sha256 = tensors_sha256(global_model.state_dict()) if lora is not None else ""
    if lora is not None:  # peft changes the copy in place: the base model's hash is taken first
        global_model = wrap_lora(global_model, lora, seed=config.seed)
        if start is not None:
            load_adapter_state(global_model, start)
    adapter = LoraAdapter.of(global_model) if lora is not None else None
    torch.manual_seed(config.seed)  # dropout, when the client trains in train mode
    b = config.batch_size
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    if config.kind == "gradient" and adapter is not None:
        with interruptible(global_model):
            capture = capture_lora_gradients(global_model, ids, mask, None if labels is None else labels.to(device),
                                             base_sha256=base_sha256, metadata=_meta(config), **task_keys)
    elif config.kind == "gradient":
        with interruptible(global_model):
            capture = capture_token_gradients(global_model, ids, mask, None if labels is None else labels.to(device),
                                              metadata=_meta(config), **task_keys)
    else:
        local = copy.deepcopy(global_model).train(options.train_mode)
        anchor = {n: p.detach().clone() for n, p in global_model.named_parameters() if p.requires_grad}
        trainable = [p for p in local.parameters() if p.requires_grad]
        opt = local_optimizer(trainable, config)
        for step in range(config.local_steps):
            checkpoint(f"local step {step + 1}/{config.local_steps}")  # a twin batch under the audit's deadline
            rows = slice(step * b, (step + 1) * b)
            opt.zero_grad(set_to_none=True)
            logits = model_logits(local(input_ids=ids[rows], attention_mask=mask[rows]))
            loss = token_loss(logits, ids[rows], mask[rows], None if labels is None else labels[rows].to(device),
                              options.task)
            if config.scheme == "fedprox":
                prox = sum(((p - anchor[n]) ** 2).sum() for n, p in local.named_parameters() if p.requires_grad)
                loss = loss + config.mu / 2 * prox
            with interruptible(local):
                torch.autograd.backward(loss)
            opt.step()
        how: dict[str, Any] = {
            "learning_rate": config.learning_rate, "local_steps": config.local_steps, "batch_size": b,
            "optimizer": config.optimizer, "momentum": config.momentum if config.optimizer in ("sgdm", "nag") else None,
            "weight_decay": config.weight_decay, "scheme": config.scheme, "metadata": _meta(config)}
        if adapter is not None:
            embeddings = cast(Any, global_model).get_input_embeddings()
            capture = capture_lora_update(adapter.tensors, adapter_state(local), adapter_config=adapter.config,
                                          base_sha256=base_sha256, vocab_size=int(embeddings.num_embeddings),
                                          **how, **task_keys)
        else:
            capture = capture_token_update(global_model, local, **how, **task_keys)
    if classify and options.num_labels is not None:
        capture.meta["gleak.num_classes"] = options.num_labels
    if config.defenses:
        capture = apply_defenses(capture, list(config.defenses), config.seed)
    truth = TextTruth(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels,
                      meta={"gleak.batch_size": b, "gleak.local_steps": config.local_steps})
    return capture, truth, adapter
