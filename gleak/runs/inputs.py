"""Opening what a run reads — capture, model, ground truth, auxiliary data — into a validated
:class:`~gleak.attacks.Context`, and choosing the device. ``gleak labels`` and ``gleak reconstruct`` start here;
the audit opens its files in :mod:`gleak.runs.audit.capture` with the same checks."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gleak.attacks import Context, build_context
from gleak.capture import TextTruth, Truth, load_capture, load_text_truth, load_truth, truth_path_for
from gleak.data.images import Dataset, load_dataset
from gleak.data.text import check_token_batch_fits
from gleak.errors import TRUTH_CONTRADICTION, GleakError
from gleak.io import companion_exists, show
from gleak.losses import LossSpec
from gleak.models import LoadedModel, load_model
from gleak.report.model import ModelMode

DEVICES = ("auto", "cpu", "cuda")


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


MEMORY_FRACTION = 0.5  # of the memory available when a run starts, the default --max-memory


def available_memory() -> int | None:
    """Bytes the system can still give this process (Linux MemAvailable; else free pages), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def memory_limit(gigabytes: float | None = None) -> int | None:
    """The bytes an attack may add: ``gigabytes`` (``--max-memory``) when given, else :data:`MEMORY_FRACTION` of the
    memory available now (None: no limit known). The one place that default is filled: each run calls this once,
    where it starts (``gleak labels``/``reconstruct``: :func:`open_inputs`; the audit: ``AuditConfig.resolved``; the
    sweep: its set-up)."""
    if gigabytes is not None:
        return int(gigabytes * 1e9)
    free = available_memory()
    return int(free * MEMORY_FRACTION) if free else None


@dataclass(kw_only=True, frozen=True)
class ModelSpec:
    """How to load the global model: the file and, for weight files, its architecture (see
    :func:`gleak.models.load_model`). Pickles run code: ``trust_pickle`` is the user's decision, and so is
    ``trust_remote_code`` (a Hugging Face folder whose config needs the folder's own code)."""

    path: Path | None = None
    arch: str | None = None
    arch_kwargs: str | None = None
    trust_pickle: bool = False
    trust_remote_code: bool = False


@dataclass(kw_only=True, frozen=True)
class InputSpec:
    """Everything one capture's run opens: the capture, its model, auxiliary data, ground truth (``truth`` given,
    or ``NAME.truth.safetensors`` beside the capture unless ``no_truth``), and how to read them.

    ``loss_overrides`` (LossSpec field -> value, None ignored) beat the capture's metadata."""

    capture: Path
    model: ModelSpec = field(default_factory=ModelSpec)
    aux: Path | None = None
    truth: Path | None = None
    no_truth: bool = False
    fc_layer: str | None = None
    device: str = "auto"
    seed: int = 0
    batch_size: int | None = None
    loss_overrides: Mapping[str, Any] = field(default_factory=dict)
    allow_model_mismatch: bool = False
    max_memory: float | None = None  # GB an attack may add (None: the default of :func:`memory_limit`)

    def truth_file(self) -> Path | None:
        """The ground-truth file this run reads, or None."""
        if self.no_truth:
            return None
        if self.truth is not None:
            return self.truth
        beside = truth_path_for(self.capture)
        return beside if companion_exists(beside) else None


@dataclass
class Inputs:
    """An opened capture: its validated Context, the ground truth (checked against it) and where it came from."""

    spec: InputSpec
    ctx: Context
    truth: Truth | None
    truth_path: Path | None
    text_truth: TextTruth | None = None  # a language model's capture: the token batches it was made from


def open_inputs(spec: InputSpec) -> Inputs:
    """Load and validate everything ``spec`` names (every problem is a one-line GleakError)."""
    if spec.truth is not None and spec.no_truth:
        raise GleakError(TRUTH_CONTRADICTION)
    if spec.batch_size is not None and spec.batch_size < 1:
        raise GleakError("--batch-size must be ≥ 1")
    cap = load_capture(spec.capture)
    m = spec.model
    loaded = (load_model(m.path, m.arch, m.arch_kwargs, m.trust_pickle, m.trust_remote_code) if m.path is not None
              else None)
    aux_data = load_dataset(spec.aux) if spec.aux is not None else None
    loss = LossSpec.from_metadata(cap.meta)
    overrides = {k: v for k, v in spec.loss_overrides.items() if v is not None}
    if overrides:
        loss = replace(loss, **overrides)  # validates through LossSpec.__post_init__
    ctx = build_context(cap, loaded, aux_data, resolve_device(spec.device), spec.seed, spec.fc_layer,
                        spec.batch_size, loss, spec.allow_model_mismatch,
                        memory_limit(spec.max_memory))
    truth_file = spec.truth_file()
    if ctx.text_model is not None:
        text_truth = load_text_truth(truth_file, cap) if truth_file is not None else None
        if text_truth is not None and truth_file is not None:
            check_token_batch_fits(text_truth.input_ids, text_truth.attention_mask, ctx.text_model.vocab_size,
                                   ctx.text_model.n_positions, f"ground truth {show(truth_file)}")
        return Inputs(spec, ctx, None, truth_file, text_truth)
    truth = load_truth(truth_file, cap) if truth_file is not None else None
    if truth is not None:
        truth.check(ctx.num_classes, ctx.total_examples, f"ground truth {truth_file}")
    return Inputs(spec, ctx, truth, truth_file)


def soft_truth(ctx: Context, truth: Truth | None) -> torch.Tensor | None:
    """The single example's true label as a probability vector (one-hot for a hard label); None unless the
    capture holds exactly one example and its truth is known."""
    if truth is None or ctx.total_examples != 1:
        return None
    lab = truth.labels
    return lab[0].double() if lab.dim() == 2 else torch.nn.functional.one_hot(lab[0], ctx.num_classes).double()


def model_mode_of(ctx: Context) -> ModelMode | None:
    """The mode the attacks run the model in, as reports record it (None without a model)."""
    mode = ctx.model_mode()
    return ModelMode.model_validate(mode) if mode is not None else None


def check_model_fits_data(loaded: LoadedModel, data: Dataset) -> None:
    """A zoo model records the input shape it takes: data of another shape is one line, before any work (weight
    files of torchvision or a user's architecture are checked by running them)."""
    from_zoo = loaded.arch is not None and not loaded.arch.startswith("torchvision:")
    if from_zoo and loaded.input_shape and tuple(loaded.input_shape) != data.input_shape:
        raise GleakError(f"the model expects inputs {list(loaded.input_shape)}, the data has "
                         f"{list(data.input_shape)}")
