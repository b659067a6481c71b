"""The library pipeline's first stage: open what the attacks read (capture, model, auxiliary data, ground
truth) into a validated :class:`~gleak.attacks.Context`. ``gleak labels``, ``reconstruct`` and ``audit`` all
start here; the CLI only parses options and renders results."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gleak.attacks import Context, build_context
from gleak.capture import Truth, load_capture, load_truth, truth_path_for
from gleak.data import load_dataset
from gleak.errors import GleakError
from gleak.losses import LossSpec
from gleak.models import load_model


def resolve_device(device: str) -> torch.device:
    """The torch device for ``auto``, ``cpu`` or ``cuda[:N]``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise GleakError(f"--device {device} requested but no CUDA device is available")
        return torch.device(device)
    raise GleakError(f"--device must be auto, cpu or cuda, got '{device}'")


@dataclass
class Inputs:
    ctx: Context
    truth: Truth | None
    truth_path: Path | None


def open_inputs(capture: Path, model: Path | None, arch: str | None, arch_kwargs: str | None, trust_pickle: bool,
                aux: Path | None, truth: Path | None, no_truth: bool, fc_layer: str | None, device: str, seed: int,
                batch_size: int | None, loss_overrides: dict[str, Any] | None = None,
                allow_model_mismatch: bool = False) -> Inputs:
    """Load and validate everything; ``loss_overrides`` (LossSpec field -> value) beat the capture's metadata."""
    cap = load_capture(capture)
    loaded = load_model(model, arch, arch_kwargs, trust_pickle) if model is not None else None
    aux_data = load_dataset(aux) if aux is not None else None
    if batch_size is not None and batch_size < 1:
        raise GleakError("--batch-size must be ≥ 1")
    loss = LossSpec.from_metadata(cap.meta)
    overrides = {k: v for k, v in (loss_overrides or {}).items() if v is not None}
    if overrides:
        loss = replace(loss, **overrides)  # validates through LossSpec.__post_init__
    ctx = build_context(cap, loaded, aux_data, resolve_device(device), seed, fc_layer, batch_size, loss,
                        allow_model_mismatch)
    truth_file = None if no_truth else (truth or (truth_path_for(capture) if truth_path_for(capture).exists()
                                                  else None))
    loaded_truth = load_truth(truth_file, cap) if truth_file else None
    if loaded_truth is not None:
        loaded_truth.check(ctx.num_classes, ctx.total_examples, f"ground truth {truth_file}")
    return Inputs(ctx, loaded_truth, truth_file)
