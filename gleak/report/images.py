"""PNG files for reconstructions: one per image and a grid with the truth above the reconstruction."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

MIN_SHOWN = 64  # small images (28 px digits) are enlarged, pixel for pixel, to at least this size
PADDING = 2  # white gap between grid cells, in pixels
LINE_GAP = 2  # extra pixels between caption lines


def png_bytes(image: torch.Tensor) -> bytes:
    """One image [C, H, W] in [0, 1] as PNG bytes (grey or RGB), deterministic."""
    x = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    array = x[0].numpy() if x.shape[0] == 1 else x.permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def enlarge(images: torch.Tensor) -> torch.Tensor:
    """Images [N, C, H, W] scaled up pixel for pixel (nearest) until the short side is ≥ MIN_SHOWN."""
    side = min(images.shape[-2:])
    factor = max(1, -(-MIN_SHOWN // side))
    return F.interpolate(images, scale_factor=factor, mode="nearest") if factor > 1 else images


_enlarge = enlarge  # the earlier private name


def grid(rows: list[torch.Tensor], per_row: int | None = None,
         captions: Sequence[Sequence[str]] | None = None) -> torch.Tensor:
    """Image rows (each [N, C, H, W], same N) stacked into one picture: row 0 on top, 2 px white gaps.

    With many images each row wraps after ``per_row`` columns (default: up to 16). ``captions`` (lines of
    text per image) are written in a white band under the last row of each line of cells."""
    n = len(rows[0])
    per_row = per_row or min(n, 16)
    blocks = []
    for start in range(0, n, per_row):
        for r in rows:
            block = r[start:start + per_row]
            if len(block) < per_row:  # pad the last line with blank cells
                block = torch.cat([block, torch.ones(per_row - len(block), *block.shape[1:])])
            blocks.append(block)
    stacked = enlarge(torch.cat(blocks).float().clamp(0, 1))
    if stacked.shape[1] == 1:
        stacked = stacked.repeat(1, 3, 1, 1)
    picture = tile(stacked, per_row)
    if captions is None:
        return picture
    if len(captions) != n:
        raise ValueError(f"{len(captions)} captions for {n} images")
    return _captioned(picture, captions, per_row, len(rows), (int(stacked.shape[-2]), int(stacked.shape[-1])))


def tile(images: torch.Tensor, per_row: int) -> torch.Tensor:
    """Images [N, 3, H, W] laid out ``per_row`` to a line on white, PADDING pixels around every cell.

    (torchvision's ``make_grid`` does the same, but importing torchvision.utils costs seconds of start-up.)"""
    n, channels, height, width = images.shape
    lines = -(-n // per_row)
    step_y, step_x = height + PADDING, width + PADDING
    picture = torch.ones(channels, lines * step_y + PADDING, per_row * step_x + PADDING)
    for i, image in enumerate(images):
        row, col = divmod(i, per_row)
        y, x = PADDING + row * step_y, PADDING + col * step_x
        picture[:, y:y + height, x:x + width] = image
    return picture


def _captioned(picture: torch.Tensor, captions: Sequence[Sequence[str]], per_row: int, rows: int,
               cell: tuple[int, int]) -> torch.Tensor:
    """``picture`` (a bare grid) with a text band inserted under every ``rows`` rows of cells."""
    font = ImageFont.load_default()
    _left, top, _right, bottom = font.getbbox("Ag")
    line = int(bottom) + LINE_GAP
    lines = max((len(c) for c in captions), default=0)
    band = lines * line + 2 * PADDING
    height, width = cell
    step_y, step_x = height + PADDING, width + PADDING
    blocks = -(-len(captions) // per_row)
    pieces, y = [], 0
    for b in range(blocks):
        end = PADDING + (b + 1) * rows * step_y  # just below the block's last row and its gap
        pieces += [picture[:, y:end], torch.ones(3, band, picture.shape[-1])]
        y = end
    pieces.append(picture[:, y:])
    tall = torch.cat(pieces, dim=1)
    array = (tall.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    image = Image.fromarray(array)
    draw = ImageDraw.Draw(image)
    for i, text in enumerate(captions):
        b, col = divmod(i, per_row)
        band_top = PADDING + (b + 1) * rows * step_y + b * band
        x0 = PADDING + col * step_x
        for k, words in enumerate(text):
            shown = draw.textlength(words, font=font)
            draw.text((x0 + max(0.0, (width - shown) / 2), band_top + PADDING + k * line - top), words,
                      fill=(0, 0, 0), font=font)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255


IDENTIFIED = (0.1, 0.65, 0.2)  # frame of a true image picked first in its lineup (green)
MISSED = (0.85, 0.1, 0.1)  # frame of a distractor picked before the true image (red)
TRUE_PLACE = (0.2, 0.4, 0.9)  # frame of a true image that was not picked first (blue)
FRAME = 3  # frame width, in enlarged pixels


def lineup_picture(recons: torch.Tensor, truth: torch.Tensor, distractors: Sequence[torch.Tensor],
                   matched: Sequence[int], scores: Sequence[Sequence[float]], rows: int = 16) -> torch.Tensor:
    """The lineups as a picture, one row per true image (the first ``rows``): the reconstruction matched to it,
    then its K + 1 candidates from most to least similar to the reconstruction. The true image is framed green
    when it comes first (identified); otherwise it is framed blue and the distractor picked first red."""
    lines: list[torch.Tensor] = []
    width = 2 + max((len(d) for d in distractors[:rows]), default=0)
    for j in range(min(rows, len(truth))):
        candidates = torch.cat([truth[j:j + 1], distractors[j]]).float().clamp(0, 1)
        order = sorted(range(len(candidates)), key=lambda c: -scores[j][c])
        recon = recons[matched[j]:matched[j] + 1] if matched[j] >= 0 else torch.ones_like(truth[j:j + 1])
        cells = enlarge(torch.cat([recon.float().clamp(0, 1), candidates[order]]))
        if cells.shape[1] == 1:
            cells = cells.repeat(1, 3, 1, 1)
        truth_at = 1 + order.index(0)
        _frame(cells[truth_at], IDENTIFIED if truth_at == 1 else TRUE_PLACE)
        if truth_at != 1:
            _frame(cells[1], MISSED)
        if len(cells) < width:
            cells = torch.cat([cells, torch.ones(width - len(cells), *cells.shape[1:])])
        lines.append(cells)
    return tile(torch.cat(lines), width)


def _frame(cell: torch.Tensor, colour: tuple[float, float, float]) -> None:
    """Paint a FRAME-pixel border of ``colour`` on ``cell`` [3, H, W] in place."""
    value = torch.tensor(colour).view(3, 1, 1)
    cell[:, :FRAME, :] = value
    cell[:, -FRAME:, :] = value
    cell[:, :, :FRAME] = value
    cell[:, :, -FRAME:] = value
