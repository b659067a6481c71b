"""What a reconstruction needs before it starts: the training targets and, for one example, its feature.

Targets are [B, C] probabilities exactly as the client's loss saw them (label smoothing from the capture's
metadata is applied to hard labels; recovered soft labels already include it). Sources:

* ``auto``: one example -> ``softlabel`` (soft label and feature; ``idlg`` if it fails); a batch -> the
  first applicable count attack in :data:`COUNT_PREFERENCE`, counts expanded to one label per dummy (the
  order is free: images are matched to truth afterwards);
* ``truth``: the ground-truth companion file;
* a JSON report written by ``gleak labels`` (``-o`` or ``--format json``): its first successful result.

The feature of one example is ∇W[i]/∇b[i] when the last layer has a bias (exact), else softlabel's λ·∇W[r].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gleak.attacks.base import AttackResult, LabelOutput, RunInputs, run_attack
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import logit_grads
from gleak.attacks.registry import get_attack
from gleak.capture import Truth
from gleak.errors import GleakError, shorten
from gleak.io import read_json_input, show
from gleak.losses import soft_targets

if TYPE_CHECKING:
    from gleak.generator.file import GeneratorFile

# best first, from bench/results/labels.md (untrained and trained LeNet-5, one step)
COUNT_PREFERENCE = ("rlu", "posterior", "ilrg", "zlg-plus", "llg-plus", "zlg", "llg-star", "llg", "idlg")


@dataclass
class ReconInputs:
    targets: torch.Tensor  # [B, C]
    source: str
    feature: torch.Tensor | None = None
    feature_source: str | None = None
    label_result: AttackResult | None = None
    evidence: dict[str, float] | None = None  # candidate attack -> score (lower explains the gradient better)

    def run_inputs(self, progress: Callable[[int, int, int, float], None] | None = None,
                   generator: GeneratorFile | None = None) -> RunInputs:
        """What one reconstruction run is handed: these targets and feature, with a progress callback and an
        image generator when the caller has them."""
        return RunInputs(targets=self.targets, feature=self.feature, progress=progress, generator=generator)


def targets_from_counts(counts: torch.Tensor, ctx: Context) -> torch.Tensor:
    """One label per example from per-class counts (summing to B), smoothed as the client's loss does."""
    counts = counts.round().long().clamp_min(0)
    if int(counts.sum()) != ctx.batch_size:
        raise GleakError(f"the label counts sum to {int(counts.sum())}, the batch has B = {ctx.batch_size}")
    labels = torch.repeat_interleave(torch.arange(len(counts)), counts)
    return soft_targets(labels, ctx.num_classes, ctx.loss.label_smoothing).double()


def targets_from_truth(truth: Truth, ctx: Context) -> torch.Tensor:
    labels = truth.labels
    if len(labels) != ctx.batch_size:
        raise GleakError(f"the ground truth has {len(labels)} labels, the capture B = {ctx.batch_size}")
    if labels.dim() == 2:  # soft labels are what the loss saw (mixup targets, or already smoothed)
        return labels.double()
    return soft_targets(labels, ctx.num_classes, ctx.loss.label_smoothing).double()


def _from_label_output(out: LabelOutput, ctx: Context) -> torch.Tensor:
    if out.soft_label is not None and ctx.batch_size == 1:
        return out.soft_label.double().view(1, -1)
    return targets_from_counts(out.counts, ctx)


def targets_from_file(path: Path, ctx: Context) -> tuple[torch.Tensor, str]:
    """Targets from a `gleak labels` JSON report: its first successful result (soft label when B = 1).

    The report is untrusted input: counts must be C non-negative integers summing to B, a soft label C
    finite numbers in [0, 1] summing to 1; anything else is refused with the reason."""
    data = read_json_input(path, "labels report")
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise GleakError(f"{show(path)}: not a `gleak labels` JSON report (no 'results' list)")
    for r in results:
        if isinstance(r, dict) and r.get("status") == "ok" and "counts" in r:
            where = f"{show(path)}: result {shorten(str(r.get('attack', '?')), 30)!r}"
            counts = _json_counts(r["counts"], ctx, where)
            soft = _json_soft_label(r.get("soft_label"), ctx, where)
            out = LabelOutput(counts, soft)
            return _from_label_output(out, ctx), f"file {path.name} ({shorten(str(r.get('attack', '?')), 30)})"
    raise GleakError(f"{show(path)}: the report has no successful label result")


def _json_counts(value: Any, ctx: Context, where: str) -> torch.Tensor:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise GleakError(f"{where}: 'counts' must be a list of integers, got {shorten(repr(value), 60)}")
    if len(value) != ctx.num_classes:
        raise GleakError(f"{where}: {len(value)} class counts, the model has {ctx.num_classes} classes")
    if any(v < 0 for v in value) or sum(value) != ctx.batch_size:
        raise GleakError(f"{where}: counts must be ≥ 0 and sum to B = {ctx.batch_size}, they sum to {sum(value)}")
    return torch.tensor(value, dtype=torch.float64)


def _json_soft_label(value: Any, ctx: Context, where: str) -> torch.Tensor | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != ctx.num_classes
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
                       for v in value) or abs(sum(value) - 1) > 1e-3):
        raise GleakError(f"{where}: 'soft_label' must be {ctx.num_classes} numbers in [0, 1] summing to 1")
    return torch.tensor(value, dtype=torch.float64)


EVIDENCE_RULE = "the Gaussian likelihood of the captured bias gradient"
# Another attack's counts replace the preferred one's only when they explain the bias gradient clearly better:
# a gap of 10 in −2·log-likelihood (a likelihood ratio of e⁵ ≈ 150). On a train-mode ResNet-18 the wrong
# candidates trail by 30–700; on an 82 %-trained LeNet all plausible candidates lie within about 5 of each other
# (bench/label_choice.py), where the likelihood cannot tell them apart and the preference order is better.
EVIDENCE_MARGIN = 10.0


def bias_gradient_misfit(ctx: Context, counts: torch.Tensor) -> float:
    """−2·log-likelihood (up to a constant) of the captured ∇b under per-class counts ``counts``.

    For a mean-reduced loss ∇b = (1/B)·Σ_n ∂ℓ_n/∂z_n. Given the counts, its mean is (1/B)·Σ_j c_j·ḡ_j and its
    variance (1/B²)·Σ_j c_j·Var_j, where ḡ_j and Var_j are the mean and variance of one example's logit gradient
    over the auxiliary examples of class j, computed with the model in the client's mode (batch statistics for
    a train-mode BatchNorm model). Lower means the counts explain the captured gradient better."""
    if ctx.grad_bias is None:
        raise GleakError("the bias-gradient evidence needs the last layer's bias gradient")
    _, logits, labels = ctx.aux_forward()
    g = logit_grads(logits, labels, ctx.loss)  # [N, C]
    C, B = ctx.num_classes, float(ctx.batch_size or 1)
    overall_mean, overall_var = g.mean(0), g.var(0, unbiased=False)
    mean = torch.stack([g[labels == j].mean(0) if bool((labels == j).any()) else overall_mean for j in range(C)])
    var = torch.stack([g[labels == j].var(0, unbiased=False) if int((labels == j).sum()) > 1 else overall_var
                       for j in range(C)])
    c = counts.double()
    expected = (c @ mean) / B
    variance = (c @ var) / B**2 + 1e-12 + 1e-6 * float(ctx.grad_bias.double().pow(2).mean())
    residual = ctx.grad_bias.double().cpu() - expected
    return float((residual**2 / variance + variance.log()).sum())


def best_supported_counts(ctx: Context) -> tuple[AttackResult | None, list[str], dict[str, float]]:
    """For a batch: run every applicable count attack; keep the first in :data:`COUNT_PREFERENCE` unless another's
    counts explain the captured bias gradient better by :data:`EVIDENCE_MARGIN` (:func:`bias_gradient_misfit`),
    then the best of those. Without auxiliary data or a bias: the first that succeeds. Returns the chosen result,
    why others did not run, and each candidate's score."""
    if ctx.aux is None or ctx.grad_bias is None or ctx.no_forward_reason:
        first, why = _run_labels(ctx, COUNT_PREFERENCE)
        return first, why, {}
    results: list[AttackResult] = []
    skipped: list[str] = []
    for name in COUNT_PREFERENCE:
        result = run_attack(get_attack(name), ctx)
        if result.status == "ok" and result.output is not None:
            results.append(result)
        else:
            skipped.append(f"{name}: {result.reason}")
    if not results:
        return None, skipped, {}
    scores = {r.attack: bias_gradient_misfit(ctx, r.labels.counts) for r in results}
    preferred = results[0]
    best = min(results, key=lambda r: scores[r.attack])  # ties keep the preference order (min is stable)
    if scores[best.attack] > scores[preferred.attack] - EVIDENCE_MARGIN:
        best = preferred  # no clear evidence against the attack that is usually most accurate
    return best, skipped, scores


def _run_labels(ctx: Context, names: tuple[str, ...]) -> tuple[AttackResult | None, list[str]]:
    """The first of ``names`` that applies and succeeds, and why each earlier one did not."""
    skipped: list[str] = []
    for name in names:
        result = run_attack(get_attack(name), ctx)
        if result.status == "ok" and result.output is not None:
            return result, skipped
        skipped.append(f"{name}: {result.reason}")
    return None, skipped


def feature_of_example(ctx: Context, softlabel: AttackResult | None) -> tuple[torch.Tensor | None, str | None]:
    """The single example's last-layer input: ∇W[i]/∇b[i] with a bias, else softlabel's x* = λ·∇W[r]."""
    if ctx.batch_size != 1 or ctx.grad_weight is None:
        return None, None
    if ctx.grad_bias is not None:
        i = int(ctx.grad_bias.abs().argmax())
        if float(ctx.grad_bias[i]) != 0.0:
            return (ctx.grad_weight[i] / ctx.grad_bias[i]).float(), f"bias: ∇W[{i}]/∇b[{i}]"
    if softlabel is None:
        softlabel = run_attack(get_attack("softlabel"), ctx)
    if softlabel.status == "ok" and softlabel.output is not None:
        feature = softlabel.output.diagnostics.get("feature")
        if isinstance(feature, torch.Tensor):
            return feature.float(), "softlabel: λ·∇W[r]"
    return None, None


def prepare(ctx: Context, labels: str, truth: Truth | None, want_feature: bool) -> ReconInputs:
    """Targets (and the feature when ``want_feature``) for ``--labels auto|truth|FILE``."""
    label_result = None
    evidence: dict[str, float] = {}
    if labels == "truth":
        if truth is None:
            raise GleakError("--labels truth needs the ground truth: no NAME.truth.safetensors beside the capture "
                             "and no --truth FILE")
        targets, source = targets_from_truth(truth, ctx), "truth"
    elif labels == "auto":
        if ctx.batch_size == 1:
            label_result, skipped = _run_labels(ctx, ("softlabel", "idlg"))
        else:
            label_result, skipped, evidence = best_supported_counts(ctx)
        if label_result is None:
            raise GleakError("no label attack could recover labels for this capture ("
                             + "; ".join(skipped) + "); pass --labels truth or a labels file")
        targets = _from_label_output(label_result.labels, ctx)
        source = f"recovered by {label_result.attack}"
        if ctx.batch_size != 1 and evidence:
            source += f" (chosen among {len(evidence)} candidates by {EVIDENCE_RULE})"
    else:
        targets, source = targets_from_file(Path(labels), ctx)
    feature, feature_source = None, None
    if want_feature and ctx.batch_size == 1:
        soft = label_result if label_result is not None and label_result.attack == "softlabel" else None
        feature, feature_source = feature_of_example(ctx, soft)
    return ReconInputs(targets, source, feature, feature_source, label_result,
                       evidence or None)


def describe_targets(targets: torch.Tensor) -> list[dict[str, Any]]:
    """Per example: its top classes and their mass (for reports)."""
    out = []
    for row in targets:
        top = torch.argsort(row, descending=True)[:2].tolist()
        out.append({str(c): round(float(row[c]), 5) for c in top if row[c] > 1e-6})
    return out
