"""The run behind ``gleak inspect``: what a capture holds, and which last layer and attacks apply."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from gleak.attacks import REGISTRY, build_context
from gleak.capture import Capture, check_model_hash, load_capture, truth_path_for, validate_against_model
from gleak.data.images import Dataset
from gleak.errors import GleakError
from gleak.io import companion_exists
from gleak.models import LoadedModel, find_last_layer, guess_last_layer, load_model
from gleak.models.peft import check_adapter_fits
from gleak.models.text import head_key
from gleak.report.model import InspectReport
from gleak.runs.inputs import ModelSpec


def applicable_attacks(capture: Capture, loaded: LoadedModel, fc_layer: str | None, allow_model_mismatch: bool = False
                       ) -> tuple[dict[str, str | None], dict[str, Any] | None]:
    """Each registered attack -> None when it can run here, else the reason (auxiliary data assumed given);
    and the mode the attacks run the model in."""
    ctx = build_context(capture, loaded, fc_layer=fc_layer, allow_model_mismatch=allow_model_mismatch)
    if ctx.input_shape is not None:  # assume the user will pass --aux: a placeholder with the right shape
        placeholder = Dataset(torch.zeros(1, *ctx.input_shape), torch.zeros(1, dtype=torch.long), (0.0,), (1.0,))
        ctx = ctx.with_aux(placeholder)
    return {name: cls().not_applicable(ctx) for name, cls in REGISTRY.items()}, ctx.model_mode()


def run_inspect(capture_path: Path, model: ModelSpec | None = None, fc_layer: str | None = None,
                allow_model_mismatch: bool = False) -> InspectReport:
    """Everything ``gleak inspect`` shows: the capture's tensors and metadata, the ground-truth companion, the
    model check, the detected last layer and, with a model, which attacks apply."""
    capture = load_capture(capture_path)
    truth = truth_path_for(capture_path)
    info: dict[str, Any] = {
        "file": str(capture_path),
        "kind": capture.kind,
        "capture_schema_version": capture.get("gleak.schema_version"),  # schema_version: the report's own
        "num_tensors": len(capture.tensors),
        "num_parameters": capture.num_parameters(),
        "batch_size": capture.batch_size,
        "local_steps": capture.local_steps,
        "truth_file": str(truth) if companion_exists(truth) else None,
        "metadata": {k: capture.meta[k] for k in sorted(capture.meta)},
        "unknown_metadata": dict(sorted(capture.extra.items())),
        "tensors": [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                    for n, t in capture.tensors.items()],
        "model": None,
    }
    if capture.get("gleak.modality") == "text" and fc_layer is None:
        return _inspect_text(capture, info, model, allow_model_mismatch)
    if model is None or model.path is None:
        layer = guess_last_layer(capture.tensors, override=fc_layer, num_classes=capture.num_classes)
    else:
        loaded = load_model(model.path, model.arch, model.arch_kwargs, model.trust_pickle, model.trust_remote_code)
        validate_against_model(capture, loaded.module)
        check = check_model_hash(capture, loaded.weights_sha256, allow_model_mismatch)
        info["model"] = {"file": str(model.path), "source": loaded.source, "arch": loaded.arch,
                         "weights_sha256": loaded.weights_sha256, "model_check": check,
                         "matches_capture": None if check.recorded_sha256 is None else check.status == "match"}
        shape = capture.input_shape or loaded.input_shape
        layer = find_last_layer(loaded.module, capture.tensors, input_shape=shape, override=fc_layer)
        info["attacks"], info["model"]["mode"] = applicable_attacks(capture, loaded, fc_layer, allow_model_mismatch)
    info["last_layer"] = {
        "name": layer.name, "weight_key": layer.weight_key, "bias_key": layer.bias_key,
        "weight_shape": [layer.num_classes, layer.feature_dim], "has_bias": layer.bias_key is not None,
        "num_classes": layer.num_classes, "feature_dim": layer.feature_dim, "reason": layer.reason,
    }
    return InspectReport.build(info)  # typed: a missing or mistyped key fails here


TOKEN_ATTACKS = "gleak.attacks.tokens"  # the package of the attacks on token batches


def _text_attacks(capture: Capture) -> dict[str, str | None]:
    """Each registered attack on a text capture: the token attacks apply (each says what it needs when it runs);
    the image and label attacks of the last layer are reported as not applicable, in one line each."""
    task = capture.get("gleak.task")
    image = "an image attack; this capture holds token batches (gleak.modality = text)"
    label = ("a label attack on a classifier's head: not wired for text captures yet (gleak.task = "
             "sequence_classification)") if task == "sequence_classification" else image
    reasons: dict[str, str | None] = {}
    for name, cls in REGISTRY.items():
        module = cls.__module__
        if module.startswith(TOKEN_ATTACKS):
            reasons[name] = None
        else:
            reasons[name] = label if ".labels." in module else image
    return reasons


def _text_head(capture: Capture) -> dict[str, Any]:
    """The output layer of a text capture: the LM head (the input embedding when tied) or the classifier."""
    task = str(capture.get("gleak.task") or "causal_lm")
    key = head_key(capture.tensors, task, capture.get("gleak.vocab_size"))
    if key is None:
        raise GleakError(f"no {'LM head' if task == 'causal_lm' else 'classifier'} weight found among the capture's "
                         "tensors; pass --fc-layer NAME")
    weight = capture.tensors[key]
    name = key.removesuffix(".weight")
    bias = name + ".bias" if name + ".bias" in capture.tensors else None
    tied = task == "causal_lm" and not name.endswith("lm_head")
    reason = ("text capture: the LM head, tied to the input embedding (GPT-2 style: one tensor for both)" if tied
              else "text capture: the LM head" if task == "causal_lm" else "text capture: the classification head")
    return {"name": name, "weight_key": key, "bias_key": bias, "weight_shape": list(weight.shape),
            "has_bias": bias is not None, "num_classes": int(weight.shape[0]), "feature_dim": int(weight.shape[1]),
            "reason": reason}


def _lora_layer(capture: Capture) -> dict[str, Any]:
    """A LoRA capture holds the adapter only, no head: the first ``lora_A`` (r × d), whose rows lie in the span of
    the adapted layer's inputs once ``lora_B`` ≠ 0 (METHODS-text §3.9)."""
    keys = [k for k, t in capture.tensors.items() if ".lora_A." in k and t.dim() == 2]
    if not keys:
        raise GleakError("a LoRA capture (gleak.peft.type = lora) with no lora_A tensor; pass --fc-layer NAME")
    weight = capture.tensors[keys[0]]
    return {"name": keys[0].removesuffix(".weight"), "weight_key": keys[0], "bias_key": None,
            "weight_shape": list(weight.shape), "has_bias": False, "num_classes": int(weight.shape[0]),
            "feature_dim": int(weight.shape[1]),
            "reason": f"LoRA capture (r = {capture.get('gleak.peft.r')}): no head among the adapter's tensors; the "
                      "first lora_A, whose rows span that layer's inputs once lora_B ≠ 0 (METHODS-text §3.9)"}


def _inspect_text(capture: Capture, info: dict[str, Any], model: ModelSpec | None,
                  allow_model_mismatch: bool) -> InspectReport:
    """``gleak inspect`` on a text capture: the model check and the token attacks that apply, no image maths."""
    lora = capture.get("gleak.peft.type") == "lora"
    info["last_layer"] = _lora_layer(capture) if lora else _text_head(capture)
    if model is not None and model.path is not None:
        loaded = load_model(model.path, model.arch, model.arch_kwargs, model.trust_pickle, model.trust_remote_code)
        if loaded.metadata.get("gleak.modality") != "text":
            raise GleakError(f"{model.path} is not a language model, but the capture holds token batches "
                             "(gleak.modality = text): pass the Hugging Face model folder the client trained")
        if lora:  # the base model: the adapter's names and shapes are what peft makes of it with the recorded LoRA
            settings = {"r": capture.get("gleak.peft.r"), "lora_alpha": capture.get("gleak.peft.alpha"),
                        "target_modules": capture.get("gleak.peft.target_modules")}
            check_adapter_fits(copy.deepcopy(loaded.module), settings, capture.tensors)
        else:
            validate_against_model(capture, loaded.module)
        check = check_model_hash(capture, loaded.weights_sha256, allow_model_mismatch)
        info["model"] = {"file": str(model.path), "source": loaded.source, "arch": loaded.arch,
                         "weights_sha256": loaded.weights_sha256, "model_check": check,
                         "matches_capture": None if check.recorded_sha256 is None else check.status == "match",
                         "mode": None}
        info["attacks"] = _text_attacks(capture)
    return InspectReport.build(info)
