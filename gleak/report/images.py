"""PNG files for reconstructions: one per image and a grid with the truth above the reconstruction."""

from __future__ import annotations

import io

import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.utils import make_grid

MIN_SHOWN = 64  # small images (28 px digits) are enlarged, pixel for pixel, to at least this size


def png_bytes(image: torch.Tensor) -> bytes:
    """One image [C, H, W] in [0, 1] as PNG bytes (grey or RGB), deterministic."""
    x = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    array = x[0].numpy() if x.shape[0] == 1 else x.permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _enlarge(images: torch.Tensor) -> torch.Tensor:
    side = min(images.shape[-2:])
    factor = max(1, -(-MIN_SHOWN // side))
    return F.interpolate(images, scale_factor=factor, mode="nearest") if factor > 1 else images


def grid(rows: list[torch.Tensor], per_row: int | None = None) -> torch.Tensor:
    """Image rows (each [N, C, H, W], same N) stacked into one picture: row 0 on top, 2 px white gaps.

    With many images each row wraps after ``per_row`` columns (default: up to 16)."""
    n = len(rows[0])
    per_row = per_row or min(n, 16)
    blocks = []
    for start in range(0, n, per_row):
        for r in rows:
            block = r[start:start + per_row]
            if len(block) < per_row:  # pad the last line with blank cells
                block = torch.cat([block, torch.ones(per_row - len(block), *block.shape[1:])])
            blocks.append(block)
    stacked = _enlarge(torch.cat(blocks).float().clamp(0, 1))
    if stacked.shape[1] == 1:
        stacked = stacked.repeat(1, 3, 1, 1)
    return make_grid(stacked, nrow=per_row, padding=2, pad_value=1.0)
