"""Scoring what an attack recovered against the ground truth: images (matched one-to-one; PSNR / SSIM / LPIPS
and the no-attack baseline; identification in a lineup) and per-example outputs (logits, features).
``gleak reconstruct`` and the audit both score through here; label counts are scored where the label attacks run
(:mod:`gleak.attacks.plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gleak.attacks import Context
from gleak.capture import Truth
from gleak.errors import GleakError

if TYPE_CHECKING:
    from gleak.metrics.identification import Distractors, Identification


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (reports hold no NaN or infinity)."""
    return float(value) if isinstance(value, int | float) and value == value and abs(value) != float("inf") else None


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
    (:func:`gleak.metrics.images.baseline_psnr`); beating it needs :data:`~gleak.metrics.images.BASELINE_MARGIN` dB."""
    from gleak.attacks.reconstruct.base import to_pixels
    from gleak.metrics.images import BASELINE_MARGIN, baseline_psnr, image_scores
    from gleak.metrics.perceptual import load_lpips

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
    given = logits if logits is not None else feats
    if given is None:
        return None
    ref = given.double()
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


def truth_classes(truth: Truth) -> list[int | None]:
    """Each true example's class: its hard label, or the top class of a soft one."""
    from gleak.metrics.labels import hard_labels

    return [int(c) for c in hard_labels(truth.labels).tolist()]


NO_LINEUP = ("identification needs auxiliary data (--aux) of the capture's inputs for distractors: another image "
             "of the batch has its own reconstruction and cannot stand in a lineup")


def identification_of(ctx: Context, images: torch.Tensor, truth_pixels: torch.Tensor, truth: Truth,
                      distractors: int, seed: int, similarity: str | None = None,
                      ) -> tuple[Identification, Distractors] | None:
    """The lineup of every true image (:mod:`gleak.metrics.identification`): its K ``distractors`` drawn (seeded)
    from ``ctx``'s auxiliary data, of the true image's class where it has enough; None without fitting aux data
    (:data:`NO_LINEUP` says why)."""
    from gleak.metrics.identification import DEFAULT_SIMILARITY, draw_distractors, identify

    aux = ctx.aux
    if aux is None or tuple(aux.images.shape[1:]) != tuple(truth_pixels.shape[1:]):
        return None
    drawn = draw_distractors(truth_pixels, truth_classes(truth), aux.images, aux.labels, distractors, seed)
    return identify(images, truth_pixels, drawn, similarity or DEFAULT_SIMILARITY), drawn
