"""Image-reconstruction metrics: PSNR, SSIM, LPIPS after optimal one-to-one matching.

A batch reconstruction comes out in any order, so each reconstruction is first paired with one true image
by the Hungarian method (scipy ``linear_sum_assignment``) on the mean squared error; the metrics are then
per matched pair and averaged. Images are float tensors [N, C, H, W] in [0, 1]. PSNR and SSIM come from
scikit-image with its defaults, as Wang, Liang & He (ICLR 2024) compute them (SSIM: 7×7 uniform window,
sample covariance, K = 0.01/0.03, averaged over channels), except that we use data range 1 on float images
where their code passes uint8 images with data_range = 256 (which reads about 0.03 dB higher than the
correct 255). Details: docs/methods/reconstruction.md#metrics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from gleak.metrics.perceptual import LPIPSModel

BASELINE_MARGIN = 1.0  # dB a reconstruction must beat the trivial baseline (baseline_psnr) by to count as one


def psnr(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB (data range 1); identical images give +inf."""
    x, y = _numpy(recon), _numpy(truth)
    with np.errstate(divide="ignore"):
        values = [peak_signal_noise_ratio(t, r, data_range=1.0)  # type: ignore[no-untyped-call]  # skimage: no hints
                  for r, t in zip(x, y, strict=True)]
    return torch.tensor(values, dtype=torch.float64)


def baseline_psnr(truth: torch.Tensor) -> tuple[float, str]:
    """Mean PSNR (dB) against ``truth`` [B, C, H, W] of the stronger of two guesses that need no attack.

    Each image's flat mean colour (the best constant image; it beats flat grey 0.5 everywhere, and by far
    on dark MNIST digits), and for B ≥ 2 each image's leave-one-out batch mean (the mean of the *other*
    true images: the plain batch mean would contain the image itself, and for B = 1 be it)."""
    truth = truth.detach().float().cpu()
    flat = truth.mean(dim=(-2, -1), keepdim=True).expand_as(truth)
    best = (float(psnr(flat, truth).mean()), "flat image of its mean colour")
    if len(truth) >= 2:
        others = (truth.sum(0, keepdim=True) - truth) / (len(truth) - 1)
        mean = float(psnr(others, truth).mean())
        if mean > best[0]:
            best = (mean, "mean of the other true images")
    return best


def ssim(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-image SSIM (scikit-image defaults: 7×7 uniform window; data range 1; channels averaged)."""
    x, y = _numpy(recon), _numpy(truth)
    return torch.tensor([ssim_pair(t, r) for r, t in zip(x, y, strict=True)], dtype=torch.float64)


def ssim_pair(truth: np.ndarray, recon: np.ndarray) -> float:
    """SSIM of two float images [C, H, W] (scikit-image defaults; data range 1; channels averaged)."""
    # scikit-image ships no type information
    value = structural_similarity(truth, recon, data_range=1.0, channel_axis=0)  # type: ignore[no-untyped-call]
    return float(value)


def _numpy(images: torch.Tensor) -> np.ndarray:
    if images.dim() != 4:
        raise ValueError(f"expected images [N, C, H, W], got shape {list(images.shape)}")
    return images.detach().double().clamp(0, 1).cpu().numpy()


def match(recon: torch.Tensor, truth: torch.Tensor) -> list[int]:
    """For each true image, the index of the reconstruction paired with it (min total MSE, Hungarian)."""
    if recon.shape[1:] != truth.shape[1:]:
        raise ValueError(f"reconstructions {list(recon.shape[1:])} and truth {list(truth.shape[1:])} differ in shape")
    cost = ((truth.double().flatten(1)[:, None, :] - recon.double().flatten(1)[None, :, :]) ** 2).mean(-1)
    rows, cols = linear_sum_assignment(cost.numpy())
    order = [0] * len(truth)
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        order[r] = c
    return order


def image_scores(recon: torch.Tensor, truth: torch.Tensor, lpips: LPIPSModel | None = None) -> dict[str, Any]:
    """Matched per-image and mean PSNR / SSIM / LPIPS (LPIPS: a value, or the reason it is unavailable)."""
    if len(recon) != len(truth):
        raise ValueError(f"{len(recon)} reconstructions for {len(truth)} true images")
    order = match(recon, truth)
    paired = recon[order]
    p, s = psnr(paired, truth), ssim(paired, truth)
    out: dict[str, Any] = {"matching": order, "psnr": p.tolist(), "ssim": s.tolist(),
                           "mean": {"psnr": float(p.mean()), "ssim": float(s.mean())}}
    if lpips is not None and lpips.available:
        values, upsampled = lpips.distance(paired, truth)
        out["lpips"] = values.tolist()
        out["mean"]["lpips"] = float(values.mean())
        out["lpips_info"] = {"net": lpips.net, "source": lpips.source, "upsampled_to_32px": upsampled}
    else:
        out["lpips"] = None
        out["lpips_info"] = {"unavailable": lpips.reason if lpips is not None else "not requested"}
    return out
