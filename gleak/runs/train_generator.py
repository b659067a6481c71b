"""The run behind ``gleak train-generator``: features of the auxiliary images through the model's last layer,
a feature-to-image decoder trained on them (:mod:`gleak.generator.train`), and the generator file bound to the
model's weights and last layer; the run's summary as a :class:`gleak.report.model.TrainGeneratorReport`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gleak.data.images import Dataset, load_dataset
from gleak.errors import GleakError
from gleak.generator.file import save_generator
from gleak.generator.train import TrainResult, TrainSettings, aux_features, train_decoder
from gleak.io import safetensors_kind, show, tensors_sha256
from gleak.models import LastLayer, find_last_layer, load_model
from gleak.report.model import TrainGeneratorReport
from gleak.runs.inputs import ModelSpec, resolve_device

OTHER_KINDS = {"gradient": "a capture", "update": "a capture", "truth": "a ground-truth file",
               "generator": "a generator file"}
# (phase "mse" or the fine-tuning loss, epoch, epochs, train loss, held-out MSE or None)
EpochCallback = Callable[[str, int, int, float, float | None], None]


@dataclass(kw_only=True, frozen=True)
class TrainGeneratorRequest:
    """``gleak train-generator``: the model, the auxiliary data, the training settings, the output file."""

    model: ModelSpec
    aux: Path
    output: Path
    settings: TrainSettings
    fc_layer: str | None = None
    device: str = "auto"
    force: bool = False


def load_aux(path: Path) -> Dataset:
    """The auxiliary data set; another gleak file (a capture, a ground truth, a generator) is named as such."""
    try:
        return load_dataset(path)
    except GleakError:
        kind = safetensors_kind(path)
        if kind in OTHER_KINDS:
            raise GleakError(f"--aux {show(path)} is {OTHER_KINDS[kind]} (gleak.kind={kind}), not auxiliary "
                             "data: pass images and labels (a .safetensors data set with 'images' and 'labels', or "
                             "an image folder)") from None
        raise


def run_train_generator(request: TrainGeneratorRequest, on_features: Callable[[int], None] | None = None,
                        on_epoch: EpochCallback | None = None) -> TrainGeneratorReport:
    """Load, train, write the generator file; the summary. ``on_features`` is called with the number of
    auxiliary images before their features are computed, ``on_epoch`` after every epoch."""
    started = time.perf_counter()
    settings = request.settings
    where = resolve_device(request.device)
    m = request.model
    if m.path is None:
        raise GleakError("train-generator needs the model (--model)")
    loaded = load_model(m.path, m.arch, m.arch_kwargs, m.trust_pickle, m.trust_remote_code)
    data = load_aux(request.aux)
    # a torchvision architecture's 3×224×224 is a default, not a constraint (as `gleak simulate` treats it)
    fixed = None if (loaded.arch or "").startswith("torchvision:") else loaded.input_shape
    if fixed is not None and tuple(fixed) != data.input_shape:
        raise GleakError(f"auxiliary data {show(request.aux)} has images of {list(data.input_shape)}, the model "
                         f"takes {list(fixed)}")
    layer = find_last_layer(loaded.module, None, input_shape=fixed or data.input_shape, override=request.fc_layer)
    data.check_classes(layer.num_classes)
    notes: list[str] = []
    if all(v == 0 for v in data.mean) and all(v == 1 for v in data.std):
        notes.append("the auxiliary data records no normalisation: the model saw raw pixels in [0, 1]")
    module = loaded.module.to(where).eval()
    if on_features is not None:
        on_features(len(data))
    features = aux_features(module, layer, data, where)
    result = train_decoder(features, data.images, settings, where, on_epoch)
    notes += result.notes
    if result.heldout_examples == 0:
        notes.append("--holdout 0: no held-out images, so no held-out MSE or PSNR")
    elif (result.heldout_psnr is not None and result.baseline_psnr is not None
          and result.heldout_psnr <= result.baseline_psnr):
        notes.append(f"held-out PSNR {result.heldout_psnr:.2f} dB is not above the mean-image baseline "
                     f"({result.baseline_psnr:.2f} dB): the decoder is no better than predicting the mean image yet "
                     "(more epochs or more auxiliary images may help)")
    if where.type == "cuda":
        notes.append("trained on CUDA: GPU kernels are not bit-for-bit deterministic, so the same seed may give "
                     "slightly different weights")
    aux_sha = tensors_sha256({"images": data.images, "labels": data.labels})
    # the hash captures record as gleak.model.sha256 (computed here for a loader that does not give it)
    model_sha = loaded.weights_sha256 or tensors_sha256(loaded.module.state_dict())
    train_meta: dict[str, Any] = {"epochs": settings.epochs, "batch_size": settings.batch_size, "lr": settings.lr,
                                  "loss": settings.loss, "seed": settings.seed, "holdout": settings.holdout}
    if settings.loss == "rgla":
        train_meta["finetune_epochs"] = settings.finetune_epochs
    train_meta.update(result.summary())
    written = save_generator(request.output, result.decoder, model_sha256=model_sha, layer=layer.name,
                             mean=data.mean, std=data.std, aux_sha256=aux_sha, aux_examples=len(data),
                             aux_source=data.source or request.aux.name, train=train_meta, force=request.force)
    return _report(written, m.path, model_sha, layer, request.aux, aux_sha, data, settings, result, where, notes,
                   time.perf_counter() - started)


def _report(written: Path, model: Path, model_sha: str, layer: LastLayer, aux: Path, aux_sha: str, data: Dataset,
            settings: TrainSettings, result: TrainResult, device: torch.device, notes: list[str],
            total_seconds: float) -> TrainGeneratorReport:
    """The run's summary (its JSON is printed with --format json; the table renders the same)."""
    def num(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)

    beaten = None
    if result.heldout_psnr is not None and result.baseline_psnr is not None:
        beaten = result.heldout_psnr > result.baseline_psnr
    return TrainGeneratorReport.build({
        "file": str(written), "model": str(model), "model_sha256": model_sha, "layer": layer.name,
        "feature_dim": int(layer.feature_dim), "num_classes": int(layer.num_classes),
        "aux": str(aux), "aux_sha256": aux_sha, "image_shape": list(data.input_shape),
        "mean": list(data.mean), "std": list(data.std),
        "examples": {"total": len(data), "train": result.train_examples, "heldout": result.heldout_examples},
        "settings": settings.model_dump(exclude=set() if settings.loss == "rgla" else {"finetune_epochs",
                                                                                       "finetune_lr"}),
        "train_loss": num(result.train_loss, 8), "train_mse": num(result.train_mse, 8),
        "heldout_mse": num(result.heldout_mse, 8), "heldout_psnr": num(result.heldout_psnr, 4),
        "baseline_psnr": num(result.baseline_psnr, 4), "baseline_beaten": beaten,
        "seconds": round(result.seconds, 3), "total_seconds": round(total_seconds, 3),
        "threads": torch.get_num_threads(), "device": str(device),
        "history": [{**h, "loss": num(h["loss"], 8), "heldout_mse": num(h["heldout_mse"], 8)}
                    for h in result.history],
        "notes": notes,
    })
