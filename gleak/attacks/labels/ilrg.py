"""iLRG (Ma et al., ICLR 2023): instance-wise batch label restoration from the last layer's gradients."""

from __future__ import annotations

import numpy as np
import torch

from gleak.attacks.base import Attack, LabelOutput, Requirements, register
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import round_counts

TINY = 1e-300


@register
class ILRG(Attack):
    """Solve A k = v for the class counts k (METHODS §3).

    ê_j = ∇W[j]/∇b[j] is the gradient-weighted mean feature of class j; p̂⁽ʲ⁾ = softmax(fc(ê_j)/τ) its
    posterior. Row 0 of A is all ones (Σk = B); row i+1 holds p̂⁽ʲ⁾_i − (1 − ε)δ_ij with
    v_{i+1} = τ·B·∇b_i + B·ε/C. With τ = 1 and ε = 0 this is the reference system; the τ and ε terms
    extend it to the temperature and label smoothing the capture records (derived from ∇b = (p − y)/τ).
    Float64 replaces the reference's mantissa/exponent division. k = lstsq(A, v), clipped at 0, then
    rounded to sum exactly B by largest remainder (fixing the reference's `inds[:num_mod]` bug).
    """

    name = "ilrg"
    paper = "Ma et al., Instance-wise Batch Label Restoration via Gradients in Federated Learning, ICLR 2023"
    summary = "label counts from a linear system on per-class feature estimates ∇W_j/∇b_j"
    requires = Requirements(needs_bias=True, needs_model=True)

    def run(self, ctx: Context) -> LabelOutput:
        C, B = ctx.num_classes, ctx.batch_size
        gw, gb = ctx.grad_weight, ctx.grad_bias
        W, b = ctx.layer.weight.double().cpu(), ctx.layer.bias.double().cpu()
        tau, eps = ctx.loss.temperature, ctx.loss.label_smoothing
        small = gb.abs() < TINY
        emb = gw / torch.where(small, torch.ones_like(gb), gb)[:, None]
        emb[small] = 0.0
        post = torch.softmax((emb @ W.T + b) / tau, dim=1)  # row j: p̂⁽ʲ⁾
        A = torch.empty(C + 1, C, dtype=torch.float64)
        A[0] = 1.0
        A[1:] = post.T - (1 - eps) * torch.eye(C, dtype=torch.float64)
        v = torch.empty(C + 1, dtype=torch.float64)
        v[0] = B
        v[1:] = tau * B * gb + B * eps / C
        k, *_ = np.linalg.lstsq(A.numpy(), v.numpy(), rcond=None)
        residual = float(np.linalg.norm(A.numpy() @ k - v.numpy()))
        counts = round_counts(np.clip(k, 0, None), B)
        warnings = []
        if ctx.loss.name != "cross_entropy":
            warnings.append(f"iLRG's system is derived for cross-entropy; the capture used {ctx.loss.name}")
        if bool(small.any()):
            warnings.append(f"{int(small.sum())} classes have a zero bias gradient; their features are unknown")
        return LabelOutput(counts, diagnostics={"raw_counts": torch.from_numpy(k), "residual": residual,
                                                "condition": float(np.linalg.cond(A.numpy()))}, warnings=warnings)
