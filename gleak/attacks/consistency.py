"""Does the capture's recorded batch size agree with what its tensors show?

Two facts of the last layer's gradient bound the number of examples behind it, whatever the model below:

* its weight gradient ∇W = Σᵢ δᵢ hᵢᵀ is a sum of one outer product per example, so rank ∇W ≤ m·B (the
  observation iLRG rests on: Ma et al., ICLR 2023) — for plain gradients and SGD updates with or without
  momentum, which stay sums of per-example gradients;
* with cross-entropy on hard labels its bias gradient ∂L/∂b_c = Σᵢ (p_ic − y_ic) / B can only be negative for a
  class some example carries (Zhao et al., 2020; Wainakh et al., 2022), so at most m·B classes are negative.

Either bound broken means the metadata understates the batch, and every count an attack recovers would be
scaled wrong: the audit says so (a notice and an ``assumptions`` entry) rather than answer silently. The checks
stand down where their premise fails (weight decay, Adam, FedProx, a recorded defense; label smoothing or mixup for
the bias).
"""

from __future__ import annotations

import torch

from gleak.attacks.context import Context

RANK_TOLERANCE = 1e-5  # singular values below this fraction of the largest are taken as float noise
SIGN_TOLERANCE = 1e-6  # bias gradients closer to zero than this fraction of the largest are not counted


def gradient_rank(grad_weight: torch.Tensor) -> int:
    """The numerical rank of ∇W [C, d] (eigenvalues of the smaller Gram matrix, float64)."""
    g = grad_weight.double()
    gram = g @ g.T if g.shape[0] <= g.shape[1] else g.T @ g
    values = torch.linalg.eigvalsh(gram).clamp_min(0).sqrt()
    top = float(values.max()) if values.numel() else 0.0
    return int((values > top * RANK_TOLERANCE).sum()) if top > 0 else 0


def batch_size_conflicts(ctx: Context) -> list[str]:
    """One line per way the tensors contradict the recorded batch size (empty: none seen, or none checkable)."""
    total = ctx.total_examples
    if not total or ctx.grad_weight is None:
        return []
    cap = ctx.capture
    if cap.get("gleak.defense"):
        return []
    update = ctx.kind == "update"
    optimizer = str(cap.get("gleak.optimizer") or "sgd")
    decay = float(cap.value("gleak.weight_decay") or 0.0) if update else 0.0
    if update and (optimizer == "adam" or decay > 0 or cap.get("gleak.fl.scheme") == "fedprox"):
        return []
    what = f"B = {ctx.batch_size}" + (f", m = {ctx.local_steps} (m·B = {total})" if ctx.local_steps > 1 else "")
    out: list[str] = []
    if min(ctx.grad_weight.shape) > total:
        rank = gradient_rank(ctx.grad_weight)
        if rank > total:
            out.append(f"the last layer's weight gradient has rank {rank}, which needs at least {rank} examples; "
                       f"the metadata says {what}")
    hard = ctx.loss.name == "cross_entropy" and ctx.loss.label_smoothing == 0 and not cap.get("gleak.mixup")
    if hard and ctx.grad_bias is not None and ctx.num_classes > total:
        gb = ctx.grad_bias
        scale = float(gb.abs().max())
        negative = int((gb < -scale * SIGN_TOLERANCE).sum()) if scale > 0 else 0
        if negative > total:
            out.append(f"{negative} classes have a negative bias gradient, which only a class in the batch can "
                       f"have; the metadata says {what}")
    return out
