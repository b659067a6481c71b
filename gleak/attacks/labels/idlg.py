"""iDLG (Zhao et al., arXiv 2020): the label of a single example is the row of ∇W whose sum is negative.

Notes: docs/methods/label-recovery.md#idlg.
"""

from __future__ import annotations

from typing import Any

import torch

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import row_sums
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements

ZERO = 1e-30


@register
class IDLG(Attack):
    """label = argmin_i Σ_k ∇W[i, k] (the reference code's rule; equal to the sign test when h ≥ 0).

    Corner cases (Wang, Liang & He, ICLR 2024, App. B.3): an all-zero gradient means the model already outputs
    the label with probability 1, so we return the model's prediction (on the auxiliary data when given: its
    most frequent prediction; otherwise on a blank input) and flag it; exactly two non-zero rows with
    g_i = −g_j (a confidently wrong one-hot prediction) cannot be told apart — reported as ambiguous, not
    silently guessed.
    """

    name = "idlg"
    paper = "Zhao et al., iDLG: Improved Deep Leakage from Gradients, 2020"
    summary = "single-sample label from the sign of the last-layer gradient row sums"
    requires = Requirements(single_sample=True, needs_nonneg_features=True)

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        g = row_sums(ctx.require_grad_weight())
        counts = torch.zeros(ctx.num_classes, dtype=torch.long)
        diagnostics: dict[str, Any] = {"row_sums": g}
        warnings: list[str] = []
        scale = float(g.abs().max())
        if scale <= ZERO:
            label = ctx.predicted_class()
            diagnostics["case"] = "zero gradient"
            if label is None:
                warnings.append("zero gradient and no model to ask: the label cannot be recovered")
                label = 0
            else:
                warnings.append("zero gradient: the model already predicts this example with probability 1; "
                                "returned the model's prediction")
        else:
            label = int(torch.argmin(g))
            nonzero = (g.abs() > 1e-6 * scale).nonzero().flatten()
            if len(nonzero) == 2 and abs(float(g[nonzero[0]] + g[nonzero[1]])) <= 1e-6 * scale:
                diagnostics["case"] = "ambiguous"
                diagnostics["candidates"] = nonzero.tolist()
                warnings.append(f"ambiguous: only classes {nonzero.tolist()} have non-zero gradients, with opposite "
                                "equal sums (a confidently wrong one-hot prediction); either may be the label")
        counts[label] = 1
        return LabelOutput(counts, diagnostics=diagnostics, warnings=warnings)
