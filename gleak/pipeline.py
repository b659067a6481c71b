"""The library pipeline's first stage: open what the attacks read (capture, model, auxiliary data, ground
truth) into a validated :class:`~gleak.attacks.Context`. ``gleak labels``, ``reconstruct`` and ``audit`` all
start here; the CLI only parses options and renders results."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gleak.attacks import Context, build_context
from gleak.attacks.base import AttackResult
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


@dataclass
class ScoredImages:
    """Reconstructions scored against the truth: the images reordered to pair with the true ones, the matched
    per-image and mean PSNR / SSIM / LPIPS, and the no-attack baseline."""

    images: torch.Tensor
    truth: torch.Tensor
    metrics: dict[str, Any]
    baseline_psnr: float
    baseline_kind: str
    baseline_beaten: bool


def score_reconstruction(ctx: Context, images: torch.Tensor, truth: Truth, lpips: str = "alex") -> ScoredImages:
    """Match ``images`` (pixels in [0, 1]) one-to-one to the true inputs and score them (``gleak reconstruct`` and
    ``gleak audit`` both call this). The baseline is the better of two guesses that need no attack
    (:func:`gleak.report.images.baseline_psnr`); beating it needs :data:`~gleak.report.images.BASELINE_MARGIN` dB."""
    from gleak.attacks.reconstruct.base import to_pixels
    from gleak.metrics.images import image_scores
    from gleak.metrics.perceptual import load_lpips
    from gleak.report.images import BASELINE_MARGIN, baseline_psnr

    truth_pixels = to_pixels(ctx, truth.inputs)
    if truth_pixels.shape != images.shape:
        raise GleakError(f"ground-truth inputs {list(truth_pixels.shape)} do not match the reconstruction "
                         f"{list(images.shape)}")
    scorer = load_lpips(lpips) if lpips != "off" else None
    metrics = image_scores(images, truth_pixels, scorer)
    floor, kind = baseline_psnr(truth_pixels)
    return ScoredImages(images[metrics["matching"]], truth_pixels, metrics, floor, kind,
                        bool(metrics["mean"]["psnr"] >= floor + BASELINE_MARGIN))


def score_outputs(ctx: Context, truth: Truth, recovered: dict[str, torch.Tensor],
                  classes: list[int]) -> dict[str, Any] | None:
    """How close recovered per-example logits and features are to the true ones (the truth inputs through the
    model, in the client's mode): logit mean squared error (the RGLA paper's Table 6 measure) and feature cosine
    similarity. Rows are matched one-to-one to the truth (Hungarian, within equal labels where the truth has
    hard labels): the attack's row order follows its labels, not the client's batch. None when nothing to score."""
    from scipy.optimize import linear_sum_assignment

    logits, feats = recovered.get("logits"), recovered.get("features")
    if (logits is None and feats is None) or ctx.model is None or ctx.no_forward_reason:
        return None
    true_h, true_z = ctx.features_and_logits(truth.inputs)
    true_h, true_z = true_h.double().flatten(1), true_z.double()
    n = len(true_z)
    ref = logits.double() if logits is not None else feats.double()  # type: ignore[union-attr]
    target = true_z if logits is not None else true_h
    if len(ref) != n or ref.shape[1] != target.shape[1]:
        return None
    if logits is not None:
        cost = torch.cdist(ref, target).pow(2)
    else:
        cost = 1 - torch.nn.functional.normalize(ref, dim=1) @ torch.nn.functional.normalize(target, dim=1).T
    if truth.labels.dim() == 1 and len(classes) == n:
        mismatch = torch.tensor(classes).view(-1, 1) != truth.labels.view(1, -1)
        cost = cost + mismatch.double() * (float(cost.max()) + 1) * 10
    rows, cols = linear_sum_assignment(cost.numpy())
    order = torch.as_tensor(cols[rows.argsort()])
    out: dict[str, Any] = {"matching": order.tolist()}
    if logits is not None:
        err = (logits.double() - true_z[order]).pow(2)
        out["logit_mse"] = float(err.mean())
        out["logit_sq_error"] = err.sum(1).tolist()
    if feats is not None and feats.shape[1] == true_h.shape[1]:
        cos = torch.nn.functional.cosine_similarity(feats.double(), true_h[order], dim=1)
        out["feature_cosine"] = cos.tolist()
        out["feature_cosine_mean"] = float(cos.mean())
        out["feature_cosine_min"] = float(cos.min())
    return out


def labels_report(inputs: Inputs, results: list[AttackResult], counts: torch.Tensor | None) -> dict[str, Any]:
    """``gleak labels``' report data (typed by :class:`gleak.report.model.LabelsReport`): the capture, the loss,
    the truth and chance baseline, each attack's result, the threads."""
    from gleak.metrics.labels import chance_scores

    ctx = inputs.ctx
    return {
        "capture": str(ctx.capture.path), "kind": ctx.kind, "batch_size": ctx.batch_size,
        "local_steps": ctx.local_steps, "num_classes": ctx.num_classes,
        "last_layer": ctx.layer.name, "gradient_note": ctx.gradient_note,
        "loss": {"name": ctx.loss.name, "reduction": ctx.loss.reduction, "temperature": ctx.loss.temperature,
                 "label_smoothing": ctx.loss.label_smoothing, "focal_gamma": ctx.loss.focal_gamma,
                 "focal_alpha": ctx.loss.focal_alpha},
        "truth_file": str(inputs.truth_path) if inputs.truth_path else None,
        "model_check": ctx.model_check.to_json() if ctx.model_check is not None else None,
        "model_mode": ctx.model_mode(),
        "truth_counts": counts.tolist() if counts is not None else None,
        "chance": chance_scores(counts) if counts is not None else None,
        "results": [r.to_json() for r in results],
        "threads": torch.get_num_threads(),
    }
