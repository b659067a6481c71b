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


def psnr(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB (data range 1); identical images give +inf."""
    x, y = _numpy(recon), _numpy(truth)
    with np.errstate(divide="ignore"):
        values = [peak_signal_noise_ratio(t, r, data_range=1.0) for r, t in zip(x, y, strict=True)]
    return torch.tensor(values, dtype=torch.float64)


def ssim(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-image SSIM (scikit-image defaults: 7×7 uniform window; data range 1; channels averaged)."""
    x, y = _numpy(recon), _numpy(truth)
    return torch.tensor([structural_similarity(t, r, data_range=1.0, channel_axis=0)
                         for r, t in zip(x, y, strict=True)], dtype=torch.float64)


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
