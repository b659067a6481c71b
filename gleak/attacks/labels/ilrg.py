"""iLRG (Ma et al., ICLR 2023): instance-wise batch label restoration from the last layer's gradients.

Notes: docs/methods/label-recovery.md#ilrg.
"""

from __future__ import annotations

import torch

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import candidate_classes, candidate_count, round_counts
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements

TINY = 1e-300


@register
class ILRG(Attack):
    """Solve A k = v for the class counts k (docs/methods/label-recovery.md#ilrg).

    ê_j = ∇W[j]/∇b[j] is the gradient-weighted mean feature of class j; p̂⁽ʲ⁾ = softmax(fc(ê_j)/τ) its
    posterior. Row 0 of A is all ones (Σk = B); row i+1 holds p̂⁽ʲ⁾_i − (1 − ε)δ_ij with
    v_{i+1} = τ·B·∇b_i + B·ε/C. With τ = 1 and ε = 0 this is the reference system; the τ and ε terms
    extend it to the temperature and label smoothing the capture records (derived from ∇b = (p − y)/τ).
    Float64 replaces the reference's mantissa/exponent division. The reference takes pinv(A)·v; the rows
    of A are linearly dependent, so we solve the equivalent well-posed square system instead (see the code),
    falling back to least squares when it is singular. k is clipped at 0 and rounded to sum exactly B by
    largest remainder (fixing the reference's `inds[:num_mod]` bug).
    """

    name = "ilrg"
    paper = "Ma et al., Instance-wise Batch Label Restoration via Gradients in Federated Learning, ICLR 2023"
    summary = "label counts from a linear system on per-class feature estimates ∇W_j/∇b_j"
    requires = Requirements(needs_bias=True, needs_model=True)

    memory_hint = "the number of classes (large C solves for 4·B candidate classes)"

    def memory_bytes(self, ctx: Context) -> int:
        C, K = ctx.num_classes, candidate_count(ctx.num_classes, ctx.batch_size or 1)
        return 8 * (5 * K * C + K * K) + 4 * K * C  # projections, posteriors, the system and its solve

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        C, B = ctx.num_classes, ctx.require_batch_size()
        gw, gb = ctx.require_grad_weight(), ctx.require_grad_bias()
        W, b = ctx.layer.weight.cpu(), ctx.require_bias().double().cpu()
        tau, eps = ctx.loss.temperature, ctx.loss.label_smoothing
        small = gb.abs() < TINY
        cand = candidate_classes(-gb.double(), B)  # a class in the batch pulls its bias gradient down
        K = len(cand)
        # W·ê_j = (W·∇W_jᵀ)/∇b_j: one float32 matmul (the cost at C = 1000, d = 2048), the rest in float64
        proj = (gw[cand].float() @ W.float().T).double() / torch.where(small, torch.ones_like(gb), gb)[cand, None]
        proj[small[cand]] = 0.0
        post = torch.softmax((proj + b) / tau, dim=1)  # row j: p̂⁽ʲ⁾, for the unknowns j
        M = post.T  # [C, K]: rows 1..C of A, M[i, j] = p̂⁽ʲ⁾_i − (1 − ε)·δ_ij
        M[cand, torch.arange(K)] -= 1 - eps
        r = tau * B * gb + B * eps / C
        if K == C:
            # Σ_i M[i, :] = ε·1ᵀ exactly (each p̂⁽ʲ⁾ sums to 1), so the sum of rows 1..C repeats ε × row 0: the
            # (C+1)×C system has C independent rows. Project r onto the consistent set (spread the gap evenly,
            # it is only noise), drop the redundant last row and solve the square system exactly (LU).
            r = r - (r.sum() - eps * B) / C
            A = torch.cat([torch.ones(1, C, dtype=torch.float64), M[:-1]])
            v = torch.cat([torch.tensor([float(B)], dtype=torch.float64), r[:-1]])
            try:
                k = torch.linalg.solve(A, v)
            except RuntimeError:  # singular: fall back to least squares on the full system, as the reference
                A_full = torch.cat([torch.ones(1, C, dtype=torch.float64), M])
                v_full = torch.cat([torch.tensor([float(B)], dtype=torch.float64), r])
                k = torch.linalg.lstsq(A_full, v_full[:, None], driver="gelsd").solution[:, 0]
        else:  # large C: the K candidate unknowns, every equation, least squares ([C + 1, K], not [C, C])
            A_full = torch.cat([torch.ones(1, K, dtype=torch.float64), M])
            v_full = torch.cat([torch.tensor([float(B)], dtype=torch.float64), r])
            k = torch.zeros(C, dtype=torch.float64)
            k[cand] = torch.linalg.lstsq(A_full, v_full[:, None], driver="gelsy").solution[:, 0]
        residual = float(torch.linalg.norm(M @ k[cand] - r))
        counts = round_counts(k.clamp_min(0), B)
        warnings = []
        if ctx.loss.name != "cross_entropy":
            warnings.append(f"iLRG's system is derived for cross-entropy; the capture used {ctx.loss.name}")
        if bool(small.any()):
            warnings.append(f"{int(small.sum())} classes have a zero bias gradient; their features are unknown")
        if K < C:
            warnings.append(f"C = {C}: solved for the {K} classes with the most negative bias gradients; the others "
                            "are taken as absent")
        return LabelOutput(counts, diagnostics={"raw_counts": k, "residual": residual, "candidates": K},
                           warnings=warnings)
