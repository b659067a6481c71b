"""The run behind ``gleak inspect``: what a capture holds, and which last layer and attacks apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gleak.attacks import REGISTRY, build_context
from gleak.capture import Capture, check_model_hash, load_capture, truth_path_for, validate_against_model
from gleak.data import Dataset
from gleak.io import companion_exists
from gleak.models import LoadedModel, find_last_layer, guess_last_layer, load_model
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
    if model is None or model.path is None:
        layer = guess_last_layer(capture.tensors, override=fc_layer, num_classes=capture.num_classes)
    else:
        loaded = load_model(model.path, model.arch, model.arch_kwargs, model.trust_pickle)
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
