"""Client training losses as the captures record them: cross-entropy, focal, BCE; temperature, smoothing.

Shared by :mod:`gleak.capture` (user-side capture helpers) and :mod:`gleak.simulate`, so that a simulated
client and the attacks agree on one definition:

* logits are divided by the temperature τ first (Zhang, Guo & Li, ICLR 2024 PML workshop, §3.1, Table 1);
* targets y are one-hot or soft (mixup), then smoothed as y ← (1 − ε)·y + ε/C (PyTorch's convention);
* cross-entropy ℓ = −Σ_c y_c log p_c; focal ℓ = −Σ_c y_c α (1 − p_c)^γ log p_c (Lin et al., ICCV 2017);
  BCE ℓ = Σ_c BCE(σ(z_c), y_c) (one-vs-all, summed over classes);
* reduction "mean" averages ℓ over the batch, "sum" adds it up.

More in docs/methods/fl-updates.md#losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gleak.errors import GleakError

LOSSES = ("cross_entropy", "focal", "bce")


@dataclass(kw_only=True, frozen=True)
class LossSpec:
    name: str = "cross_entropy"
    reduction: str = "mean"
    temperature: float = 1.0
    label_smoothing: float = 0.0
    focal_gamma: float = 2.0
    focal_alpha: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise GleakError(f"unknown loss '{self.name}'; choose one of {', '.join(LOSSES)}")
        if self.reduction not in ("mean", "sum"):
            raise GleakError(f"loss reduction must be 'mean' or 'sum', got '{self.reduction}'")
        if not self.temperature > 0:
            raise GleakError(f"temperature must be > 0, got {self.temperature}")
        if not 0 <= self.label_smoothing < 1:
            raise GleakError(f"label smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.focal_gamma < 0 or self.focal_alpha <= 0:
            raise GleakError("focal loss needs γ ≥ 0 and α > 0")

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"gleak.loss": self.name, "gleak.loss.reduction": self.reduction,
                                "gleak.temperature": self.temperature,
                                "gleak.label_smoothing": self.label_smoothing}
        if self.name == "focal":
            meta["gleak.focal.gamma"] = self.focal_gamma
            meta["gleak.focal.alpha"] = self.focal_alpha
        return meta

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> LossSpec:
        return cls(
            name=meta.get("gleak.loss", "cross_entropy"),
            reduction=meta.get("gleak.loss.reduction", "mean"),
            temperature=meta.get("gleak.temperature", 1.0),
            label_smoothing=meta.get("gleak.label_smoothing", 0.0),
            focal_gamma=meta.get("gleak.focal.gamma", 2.0),
            focal_alpha=meta.get("gleak.focal.alpha", 1.0),
        )


def soft_targets(labels: torch.Tensor, num_classes: int, label_smoothing: float = 0.0) -> torch.Tensor:
    """Targets as [B, C] probabilities: one-hot (or the given soft labels), then smoothed."""
    if labels.dim() == 1:
        y = F.one_hot(labels.long(), num_classes).to(torch.get_default_dtype())
    elif labels.dim() == 2 and labels.shape[1] == num_classes:
        y = labels.to(torch.get_default_dtype())
    else:
        raise GleakError(f"labels of shape {list(labels.shape)} do not fit {num_classes} classes")
    if label_smoothing:
        y = (1 - label_smoothing) * y + label_smoothing / num_classes
    return y


def client_loss(logits: torch.Tensor, labels: torch.Tensor, spec: LossSpec) -> torch.Tensor:
    """The scalar training loss of one batch (see the module docstring for the definitions)."""
    z = logits / spec.temperature
    y = soft_targets(labels, z.shape[-1], spec.label_smoothing).to(z.dtype)
    if spec.name == "bce":
        per = F.binary_cross_entropy_with_logits(z, y, reduction="none").sum(dim=-1)
    else:
        logp = F.log_softmax(z, dim=-1)
        if spec.name == "focal":
            weight = spec.focal_alpha * (1 - logp.exp()).clamp_min(0).pow(spec.focal_gamma)
            per = -(y * weight * logp).sum(dim=-1)
        else:
            per = -(y * logp).sum(dim=-1)
    return per.mean() if spec.reduction == "mean" else per.sum()
