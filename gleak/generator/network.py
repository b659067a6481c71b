"""The feature-to-image decoder of Xue et al. (FGLA, INFOCOM 2023), scaled to small images.

FGLA reshapes a ResNet-50 feature to 2048×7×7 and up-samples it five times (transposed convolution, LeakyReLU,
three residual blocks) to 224×224, ending in a 1×1 convolution and a sigmoid. Our features are vectors of any
length d (the last layer's input) and our images are small, so the decoder here

1. standardises the feature with the training set's per-dimension mean and std (features of different models
   differ in scale by orders of magnitude);
2. projects it with one linear layer to ``width·2^(k−1)`` channels at ``ceil(H/2^k) × ceil(W/2^k)``;
3. runs k up-sampling stages (ConvTranspose2d k3 s2, LeakyReLU, ``res_blocks`` residual blocks), halving the
   channels each time (never below 8);
4. maps to the image channels with a 1×1 convolution and a sigmoid, and crops the centre to H×W.

k is the smallest number of doublings that brings the start size to 8 pixels or less (2 for 28×28 and 32×32).
Output pixels are in [0, 1], the data's own scale, not normalised. Notes: docs/methods/generative.md.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

MAX_SIDE = 1024
MAX_FEATURE_DIM = 1 << 22


class DecoderSpec(BaseModel):
    """Everything that fixes the decoder's shape; stored in the generator file and validated on load."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    feature_dim: int = Field(ge=1, le=MAX_FEATURE_DIM)
    image_shape: tuple[int, int, int]
    width: int = Field(32, ge=4, le=1024)
    res_blocks: int = Field(1, ge=0, le=8)

    def model_post_init(self, __context: Any) -> None:
        c, h, w = self.image_shape
        if not (1 <= c <= 16 and 4 <= h <= MAX_SIDE and 4 <= w <= MAX_SIDE):
            raise ValueError(f"image shape {list(self.image_shape)} is outside [1..16, 4..{MAX_SIDE}, 4..{MAX_SIDE}]")

    @property
    def stages(self) -> int:
        side = max(self.image_shape[1:])
        return max(1, math.ceil(math.log2(side / 8)))

    @property
    def start(self) -> tuple[int, int]:
        k = 2 ** self.stages
        return -(-self.image_shape[1] // k), -(-self.image_shape[2] // k)

    def channels(self, stage: int) -> int:
        """Channels entering up-sampling stage ``stage`` (0-based); stage k is the last one's output."""
        return max(8, self.width * 2 ** (self.stages - 1 - stage)) if stage < self.stages else \
            max(8, self.width // 2)


class ResidualBlock(nn.Module):
    """conv3×3 → BN → LeakyReLU → conv3×3 → BN, plus the input, then LeakyReLU (FGLA's ResConv)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.LeakyReLU(0.01),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))
        self.act = nn.LeakyReLU(0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(x + self.body(x))
        return out


class FeatureDecoder(nn.Module):
    """Feature vector [N, d] -> image [N, C, H, W] in [0, 1] (see the module docstring)."""

    feature_mean: torch.Tensor
    feature_std: torch.Tensor

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        h0, w0 = spec.start
        c0 = spec.channels(0)
        self.register_buffer("feature_mean", torch.zeros(spec.feature_dim))
        self.register_buffer("feature_std", torch.ones(spec.feature_dim))
        self.project = nn.Linear(spec.feature_dim, c0 * h0 * w0)
        stages: list[nn.Module] = []
        for s in range(spec.stages):
            cin, cout = spec.channels(s), spec.channels(s + 1)
            stages += [nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1), nn.LeakyReLU(0.01)]
            stages += [ResidualBlock(cout) for _ in range(spec.res_blocks)]
        self.up = nn.Sequential(*stages)
        self.out = nn.Conv2d(spec.channels(spec.stages), spec.image_shape[0], 1)

    def set_feature_scale(self, features: torch.Tensor) -> None:
        """Standardise inputs by the per-dimension mean and std of ``features`` (the training features)."""
        f = features.detach().double()
        self.feature_mean.copy_(f.mean(0).float())
        std = f.std(0, unbiased=False)
        floor = max(float(std.max()) * 1e-3, 1e-12)  # constant dimensions are not blown up
        self.feature_std.copy_(std.clamp_min(floor).float())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h0, w0 = self.spec.start
        x = (features - self.feature_mean) / self.feature_std
        x = self.project(x).view(len(features), self.spec.channels(0), h0, w0)
        x = torch.sigmoid(self.out(self.up(x)))
        _, h, w = self.spec.image_shape
        top, left = (x.shape[2] - h) // 2, (x.shape[3] - w) // 2
        return x[:, :, top:top + h, left:left + w]

    @torch.no_grad()
    def generate(self, features: torch.Tensor, chunk: int = 256) -> torch.Tensor:
        """Images for ``features`` in eval mode, on the decoder's device, returned on the CPU."""
        was = self.training
        self.eval()
        device = self.feature_mean.device
        try:
            out = [self(features[i:i + chunk].float().to(device)).cpu() for i in range(0, len(features), chunk)]
        finally:
            self.train(was)
        return torch.cat(out) if out else torch.empty(0, *self.spec.image_shape)
