"""The data test of a received model, run on the client's own examples before training (METHODS-server §6, D1):
how many of a probe batch a server could copy exactly from this model's first layer.

For a linear first layer y = Wx + b, each row j gives ∇W_j / ∇b_j = x_s exactly when one example s alone reaches
it (trap weights, sparse imprints, and the occasional selective neuron of an honest model), and the difference of
two adjacent rows of a parallel-row cluster does the same for the examples between their thresholds (cumulative
imprints, Fowl et al., ICLR 2022). The client knows its examples, so it can count those copies: the leakable
fraction L = examples copied exactly / B, what an analytic server extracts from this batch. Nothing leaves the
device, and no secret of the server is needed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gleak.tamper.craft import input_linear
from gleak.tamper.imprint import bin_differences, imprint_rows

EXACT = 1e-3  # relative error (‖x̂ − x‖ / ‖x‖) of a copy: 60 dB; float32 rounding of an exact ratio sits near 1e-6
TRAP_SHARE = 0.5  # half the batch copied exactly: honest models measured at ≤ 0.17 (docs/methods/server.md)
SUSPICIOUS_SHARE = 0.1  # a tenth: reported (honest trained MLPs reach it: passive leakage at the first layer)


@dataclass(frozen=True)
class Leaks:
    """The first layer read, the examples a server could copy from it exactly, and the probe's size."""

    layer: str
    copied: int
    batch: int
    rows: int  # candidate rows or row differences that reached at least one example

    @property
    def share(self) -> float:
        return self.copied / self.batch if self.batch else 0.0


def _candidates(gw: torch.Tensor, gb: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Every row ratio ∇W_j / ∇b_j, and every adjacent difference's ratio inside the parallel-row cluster."""
    out = []
    live = gb.abs() > 1e-12 * float(gb.abs().max().clamp_min(1e-300))
    if bool(live.any()):
        out.append(gw[live] / gb[live, None])
    rows = imprint_rows(weight)
    if len(rows) >= 2:
        dw, db, _ = bin_differences(weight, bias, gw, gb, rows)
        keep = db.abs() > 1e-12 * float(db.abs().max().clamp_min(1e-300))
        if bool(keep.any()):
            out.append(dw[keep] / db[keep, None])
    return torch.cat(out) if out else gw.new_zeros(0, gw.shape[1])


def exact_leaks(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> Leaks | str:
    """The leak census of ``model``'s first linear layer on a probe batch (cross-entropy, summed); a one-line
    reason when the model has no linear first layer (convolutional traps are not measured)."""
    found = input_linear(model)
    if found is None:
        return "the model's first layer is not linear with a bias, so no example is copied from it in one ratio"
    name, layer, _ = found
    model = model.eval()
    with torch.enable_grad():
        loss = nn.functional.cross_entropy(model(inputs), labels, reduction="sum")
        gw, gb = torch.autograd.grad(loss, [layer.weight, layer.bias])
    gw, gb = gw.detach().double(), gb.detach().double()
    cand = _candidates(gw, gb, layer.weight.detach().double(), layer.bias.detach().double())
    flat = inputs.detach().double().flatten(1)
    if len(cand) == 0:
        return Leaks(name, 0, len(flat), 0)
    copied: set[int] = set()
    norms = flat.norm(dim=1).clamp_min(1e-12)
    for start in range(0, len(cand), 1024):
        dist = torch.cdist(cand[start:start + 1024], flat) / norms[None, :]
        best = dist.min(1)
        copied.update(best.indices[best.values <= EXACT].tolist())
    return Leaks(name, len(copied), len(flat), len(cand))
