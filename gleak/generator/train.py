"""Training a feature-to-image decoder on auxiliary data (Xue et al., FGLA, INFOCOM 2023, §IV; the RGLA paper,
RGLA, ICLR 2024, §4.1).

The model's last-layer inputs of the auxiliary images are computed once (the model in eval mode); a held-out
share of the images is set aside, the decoder learns feature -> image with MSE on pixels in [0, 1] (FGLA's
loss) and Adam, and reports the held-out MSE and PSNR. ``loss="rgla"`` adds RGLA's fine-tuning stage: a few
more epochs on −PSNR + 10·(1 − SSIM) + 10·LPIPS (the LPIPS term only where LPIPS weights are installed).
Everything random (split, initialisation, batch order) comes from the seed, so a seed gives the same file
on the same machine and thread count. Notes: docs/methods/generative.md#training.
"""

from __future__ import annotations

import math
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from gleak.data.images import Dataset
from gleak.errors import GleakError
from gleak.generator.network import DecoderSpec, FeatureDecoder
from gleak.models import LastLayer, forward

# (phase, epoch, epochs, train loss, held-out loss or None)
EpochCallback = Callable[[str, int, int, float, float | None], None]


DecoderLoss = Literal["mse", "rgla"]  # pixel MSE (FGLA), or MSE then fine-tuning on −PSNR + SSIM (RGLA)
LOSSES: tuple[DecoderLoss, ...] = typing.get_args(DecoderLoss)

class TrainSettings(BaseModel):
    """How the decoder is trained (``gleak train-generator`` flags)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: int = Field(10, ge=1, le=100_000)
    batch_size: int = Field(64, ge=1, le=65_536)
    lr: float = Field(1e-3, gt=0, le=10)
    holdout: float = Field(0.1, ge=0, lt=1)
    width: int = Field(32, ge=4, le=1024)
    res_blocks: int = Field(1, ge=0, le=8)
    loss: DecoderLoss = "mse"
    finetune_epochs: int = Field(3, ge=0, le=10_000)
    finetune_lr: float = Field(1e-4, gt=0, le=10)
    seed: int = Field(0, ge=0, le=2**63 - 1)


@dataclass
class TrainResult:
    decoder: FeatureDecoder
    train_loss: float  # last epoch's mean training loss (MSE, or the fine-tune loss)
    train_mse: float  # MSE of the final decoder on the training images
    heldout_mse: float | None
    heldout_psnr: float | None  # mean per-image PSNR (dB) of the held-out images
    train_examples: int
    heldout_examples: int
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # mean per-image PSNR (dB) of predicting the training images' mean image for every held-out image: the
    # floor a decoder that ignores its feature reaches
    baseline_psnr: float | None = None

    def summary(self) -> dict[str, Any]:
        """The numbers the generator file records under ``gleak.train.*``."""
        out: dict[str, Any] = {"train_loss": round(self.train_loss, 8), "train_mse": round(self.train_mse, 8),
                               "train_examples": self.train_examples, "heldout_examples": self.heldout_examples}
        if self.heldout_mse is not None and self.heldout_psnr is not None:
            out.update(heldout_mse=round(self.heldout_mse, 8), heldout_psnr=round(self.heldout_psnr, 4))
        if self.baseline_psnr is not None:
            out["heldout_baseline_psnr"] = round(self.baseline_psnr, 4)
        return out


def aux_features(model: nn.Module, layer: LastLayer, data: Dataset, device: torch.device) -> torch.Tensor:
    """The last-layer inputs [N, d] of every auxiliary image (model in its loaded, eval mode)."""
    inputs, _ = data.batch(range(len(data)))
    feats, _ = forward.features_and_logits(model, layer, inputs, device)
    feats = feats.float().flatten(1)
    if not bool(torch.isfinite(feats).all()):
        raise GleakError("the model's features of the auxiliary data hold NaN or Inf")
    return feats


def split(n: int, holdout: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffled (train, held-out) indices; the held-out share is rounded, at least one example if > 0."""
    order = torch.randperm(n, generator=gen)
    k = 0 if holdout == 0 else max(1, round(n * holdout))
    if n - k < 1:
        raise GleakError(f"{n} auxiliary examples leave none to train on with --holdout {holdout}")
    return order[k:], order[:k]


def train_decoder(features: torch.Tensor, images: torch.Tensor, settings: TrainSettings,
                  device: torch.device | str = "cpu", on_epoch: EpochCallback | None = None) -> TrainResult:
    """Train a decoder from ``features`` [N, d] to ``images`` [N, C, H, W] (pixels in [0, 1])."""
    started = time.perf_counter()
    if len(features) != len(images):
        raise GleakError(f"{len(features)} features for {len(images)} images")
    gen = torch.Generator().manual_seed(settings.seed)
    train_idx, held_idx = split(len(features), settings.holdout, gen)
    if images.dim() != 4:
        raise GleakError(f"images must be [N, C, H, W], got {list(images.shape)}")
    channels, height, width = (int(n) for n in images.shape[1:])
    spec = DecoderSpec(feature_dim=features.shape[1], image_shape=(channels, height, width),
                       width=settings.width, res_blocks=settings.res_blocks)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        decoder = FeatureDecoder(spec)
    decoder.set_feature_scale(features[train_idx])
    decoder.to(device)
    x_tr, y_tr = features[train_idx].to(device), images[train_idx].float().to(device)
    x_ho, y_ho = features[held_idx].to(device), images[held_idx].float().to(device)
    history: list[dict[str, Any]] = []
    notes: list[str] = []

    def run_phase(name: str, epochs: int, lr: float, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  ) -> float:
        opt = torch.optim.Adam(decoder.parameters(), lr=lr)
        last = math.nan
        for epoch in range(epochs):
            decoder.train()
            order = torch.randperm(len(x_tr), generator=gen).to(device)
            total, seen = 0.0, 0
            for start in range(0, len(order), settings.batch_size):
                idx = order[start:start + settings.batch_size]
                if len(idx) < 2 and len(order) >= 2:
                    continue  # BatchNorm needs two examples; a lone last example waits for the next epoch
                loss = loss_fn(decoder(x_tr[idx]), y_tr[idx])
                if not bool(torch.isfinite(loss)):
                    raise GleakError(f"training diverged in epoch {epoch + 1} ({name}); try a smaller --lr")
                opt.zero_grad(set_to_none=True)
                torch.autograd.backward(loss)  # loss.backward(), typed
                opt.step()
                total += float(loss.detach()) * len(idx)
                seen += len(idx)
            last = total / max(seen, 1)
            held = _mse(decoder, x_ho, y_ho) if len(x_ho) else None
            history.append({"phase": name, "epoch": epoch + 1, "loss": last, "heldout_mse": held})
            if on_epoch is not None:
                on_epoch(name, epoch + 1, epochs, last, held)
        return last

    if len(x_tr) < 2:
        raise GleakError("training a generator needs at least 2 training examples (BatchNorm)")
    final = run_phase("mse", settings.epochs, settings.lr, F.mse_loss)
    if settings.loss == "rgla" and settings.finetune_epochs:
        fine, note = rgla_finetune_loss()
        if note:
            notes.append(note)
        final = run_phase("rgla", settings.finetune_epochs, settings.finetune_lr, fine)
    decoder.eval()
    train_mse = _mse(decoder, x_tr, y_tr)
    held_mse, held_psnr, base_psnr = None, None, None
    if len(x_ho):
        held_mse = _mse(decoder, x_ho, y_ho)
        with torch.no_grad():
            per = F.mse_loss(decoder(x_ho), y_ho, reduction="none").flatten(1).mean(1).clamp_min(1e-12)
            base = (y_ho - y_tr.mean(0, keepdim=True)).square().flatten(1).mean(1).clamp_min(1e-12)
        held_psnr = float((-10 * per.log10()).mean())
        base_psnr = float((-10 * base.log10()).mean())
    return TrainResult(decoder.cpu(), final, train_mse, held_mse, held_psnr, len(x_tr), len(x_ho),
                       time.perf_counter() - started, history, notes, base_psnr)


@torch.no_grad()
def _mse(decoder: FeatureDecoder, x: torch.Tensor, y: torch.Tensor, chunk: int = 512) -> float:
    was = decoder.training
    decoder.eval()
    total = sum(float(F.mse_loss(decoder(x[i:i + chunk]), y[i:i + chunk], reduction="sum"))
                for i in range(0, len(x), chunk))
    decoder.train(was)
    return total / max(y.numel(), 1)


def ssim_torch(a: torch.Tensor, b: torch.Tensor, window: int = 7) -> torch.Tensor:
    """Mean SSIM of images in [0, 1] with a uniform ``window``² window (scikit-image's defaults, data range 1),
    differentiable; used as a training loss only (reports use scikit-image)."""
    c1, c2 = 0.01**2, 0.03**2
    ch = a.shape[1]
    kernel = torch.full((ch, 1, window, window), 1.0 / window**2, dtype=a.dtype, device=a.device)

    def blur(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, kernel, groups=ch)

    n = window**2
    cov = n / (n - 1)  # scikit-image uses the sample covariance
    mu_a, mu_b = blur(a), blur(b)
    va = cov * (blur(a * a) - mu_a**2)
    vb = cov * (blur(b * b) - mu_b**2)
    vab = cov * (blur(a * b) - mu_a * mu_b)
    s = ((2 * mu_a * mu_b + c1) * (2 * vab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (va + vb + c2))
    return s.mean()


def rgla_finetune_loss() -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str | None]:
    """RGLA's generator fine-tuning loss −PSNR + 10·(1 − SSIM) + 10·LPIPS (the RGLA paper, ICLR 2024, §4.1 and its
    released training script); without LPIPS weights the LPIPS term is left out, and the note says so."""
    from gleak.metrics.perceptual import MIN_SIDE, load_lpips

    lp = load_lpips("alex")
    module = lp.module
    note = None if module is not None else f"fine-tuning without the LPIPS term: {lp.reason}"
    if module is not None:
        module.requires_grad_(False)

    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mse = F.mse_loss(pred, target).clamp_min(1e-10)
        value = 10 * mse.log10() + 10 * (1 - ssim_torch(pred, target))  # −PSNR = 10·log10(MSE)
        if module is not None:
            a, b = pred, target
            if a.shape[1] == 1:
                a, b = a.repeat(1, 3, 1, 1), b.repeat(1, 3, 1, 1)
            if min(a.shape[-2:]) < MIN_SIDE:
                a = F.interpolate(a, size=(MIN_SIDE, MIN_SIDE), mode="bilinear", align_corners=False)
                b = F.interpolate(b, size=(MIN_SIDE, MIN_SIDE), mode="bilinear", align_corners=False)
            module.to(a.device)
            value = value + 10 * module(a * 2 - 1, b * 2 - 1).mean()
        return value

    return loss, note
