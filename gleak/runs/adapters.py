"""The run behind ``gleak capture``: a pair of LoRA adapter folders (the global adapter of a round and one client's
adapter after local training, as FlowerTune apps exchange them) turned into a capture of the client's update,
bound to the base model's hash (docs/capture-format.md, "LoRA captures")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gleak.capture import OPTIMIZERS, Capture, capture_lora_update, check_finite, save_capture
from gleak.errors import GleakError
from gleak.io import check_writable, show
from gleak.models import load_model
from gleak.models.peft import check_adapter_fits, check_same_lora, check_same_tensors, load_adapter
from gleak.runs.inputs import ModelSpec


@dataclass(kw_only=True, frozen=True)
class AdapterCaptureRequest:
    """``gleak capture GLOBAL CLIENT --model BASE -o OUT``: the two adapter folders, the base model, what the
    client's training is known to have been (None: not recorded) and where the capture goes."""

    global_adapter: Path
    client_adapter: Path
    model: ModelSpec
    output: Path
    learning_rate: float | None = None
    local_steps: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    round: int | None = None
    client_id: str | None = None
    force: bool = False


@dataclass
class AdapterCaptureRun:
    """The capture written (``capture.path``), and the file."""

    capture: Capture
    written: Path


def run_adapter_capture(request: AdapterCaptureRequest) -> AdapterCaptureRun:
    """Check the output can be written; read both adapters (LoRA only, safetensors unless --trust-pickle) and check
    they belong together (same LoRA settings, same tensor names and shapes, finite values); load the base model and
    check the adapter fits it; write Δ = client − global with the text and ``gleak.peft.*`` keys."""
    if request.optimizer is not None and request.optimizer not in OPTIMIZERS:
        raise GleakError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got '{request.optimizer}'")
    check_writable(request.output, request.force)
    m = request.model
    if m.path is None:
        raise GleakError("capture needs the base model the adapters were trained on (--model DIR)")
    global_config, global_state = load_adapter(request.global_adapter, m.trust_pickle)
    client_config, client_state = load_adapter(request.client_adapter, m.trust_pickle)
    check_same_lora(global_config, client_config)
    check_same_tensors(global_state, client_state)
    check_finite(global_state, "global adapter tensor")
    check_finite(client_state, "client adapter tensor")
    loaded = load_model(m.path, m.arch, m.arch_kwargs, m.trust_pickle, m.trust_remote_code)
    meta = loaded.metadata
    if meta.get("gleak.modality") != "text":
        raise GleakError(f"{show(m.path)} is not a language model folder: pass the base model the adapters were "
                         "trained on (config.json, model.safetensors)")
    if meta.get("gleak.task") != "causal_lm":
        raise GleakError("LoRA captures support causal language models (*ForCausalLM, *LMHeadModel) for now")
    check_adapter_fits(loaded.module, global_config, global_state)
    extra: dict[str, Any] = {"gleak.fl.round": request.round, "gleak.fl.client_id": request.client_id,
                             "gleak.peft.base_model": _base_name(global_config)}
    capture = capture_lora_update(
        global_state, client_state, adapter_config=global_config, base_sha256=loaded.weights_sha256,
        vocab_size=int(meta["gleak.vocab_size"]) if "gleak.vocab_size" in meta else None,
        learning_rate=request.learning_rate, local_steps=request.local_steps, batch_size=request.batch_size,
        optimizer=request.optimizer, tokenizer_sha256=meta.get("gleak.tokenizer.sha256"),
        metadata={k: v for k, v in extra.items() if v is not None})
    written = save_capture(capture, request.output, force=request.force)
    return AdapterCaptureRun(capture, written)


def _base_name(config: dict[str, Any]) -> str | None:
    """The adapter config's ``base_model_name_or_path``, recorded as written (never resolved or compared)."""
    value = config.get("base_model_name_or_path")
    return value if isinstance(value, str) and value else None
