"""Choosing attacks for a task and running them on a Context, scored when ground truth is known."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from gleak.attacks.base import Attack, AttackResult, run_attack
from gleak.attacks.context import Context
from gleak.attacks.registry import attacks_for, get_attack
from gleak.errors import GleakError
from gleak.metrics.labels import label_scores, soft_label_scores

if TYPE_CHECKING:
    from gleak.attacks.labels.confidence import CalibrationCache


def select_attacks(task: str, names: Sequence[str] | None) -> list[Attack]:
    """The named attacks (validated, in the order given) or every registered attack of ``task`` that runs by
    default (``Attack.default``)."""
    if not names:
        return [a for a in attacks_for(task) if a.default]
    return [get_attack(name, task) for name in names]


def run_label_attacks(ctx: Context, attacks: Sequence[Attack], truth_counts: torch.Tensor | None = None,
                      progress: Callable[[str], None] | None = None,
                      truth_soft: torch.Tensor | None = None, confidence: int = 0,
                      confidence_cache: CalibrationCache | None = None, combine: bool = False) -> list[AttackResult]:
    """Run each attack; with true per-class counts (and, for one example, its true soft label) score every
    successful result. With ``confidence`` = K > 0, calibrate each successful attack on K simulated batches
    (:mod:`gleak.attacks.labels.confidence`): 90 % count intervals, expected and chance iAcc per batch composition,
    informative or not, and whether the recovered counts fit the simulated compositions. With ``combine`` too, the
    same calibration also fits the stacked combination and the calibrated selector's answer
    (:class:`~gleak.attacks.labels.calibrated.Calibrated`) is appended as one more result, ``calibrated``: the
    counts of the attack (or combination) with the best worst-case margin over chance, its calibration (with the
    chosen candidate) in ``confidence``, or status ``abstained`` when none beats chance."""
    if truth_counts is not None and len(truth_counts) != ctx.num_classes:
        raise GleakError(f"ground truth has {len(truth_counts)} classes, the model {ctx.num_classes}")
    if truth_counts is not None and ctx.total_examples and int(truth_counts.sum()) != ctx.total_examples:
        raise GleakError(f"ground truth holds {int(truth_counts.sum())} labels, the capture {ctx.total_examples}")
    results = []
    for attack in attacks:
        if progress:
            progress(attack.name)
        result = run_attack(attack, ctx)
        _score(result, truth_counts, truth_soft)
        results.append(result)
    if confidence > 0:
        _attach_confidence(ctx, attacks, results, confidence, confidence_cache, combine, truth_counts, truth_soft)
    return results


def _score(result: AttackResult, truth_counts: torch.Tensor | None, truth_soft: torch.Tensor | None) -> None:
    """Score a result that has an output against the true counts (and the true soft label), when known."""
    if truth_counts is not None and result.output is not None:
        out = result.labels
        result.scores = label_scores(out.counts, truth_counts)
        if truth_soft is not None and out.soft_label is not None:
            result.scores.update(soft_label_scores(out.soft_label, truth_soft))


def _attach_confidence(ctx: Context, attacks: Sequence[Attack], results: list[AttackResult], simulations: int,
                       cache: CalibrationCache | None, combine: bool = False, truth_counts: torch.Tensor | None = None,
                       truth_soft: torch.Tensor | None = None) -> None:
    from gleak.attacks.labels.confidence import calibrate

    ran = [a for a, r in zip(attacks, results, strict=True) if r.status == "ok" and r.output is not None]
    calibrated, why = calibrate(ctx, ran, simulations=simulations, seed=ctx.seed, cache=cache, stack=combine)
    counts = {r.attack: r.labels.counts for r in results if r.status == "ok" and r.output is not None}
    candidates = [a for a in ran if a.name != "softlabel"]
    selector = _selector_result(ctx, candidates, calibrated, why, simulations, counts) if combine else None
    for result in results:
        if result.status != "ok" or result.output is None:
            continue
        conf = calibrated.get(result.attack)
        if conf is None:
            result.confidence = {"calibrated": False, "reason": why or "not calibrated: the attack did not run on "
                                 "enough of the simulated batches"}
            continue
        result.confidence = {"calibrated": True, **conf.to_json(result.labels.counts, ctx.total_examples or 0)}
        if not conf.informative:
            result.warnings.append(f"uninformative: on {conf.simulations} batches simulated like this one it does not "
                                   f"beat chance on both compositions ({conf.describe()}); its counts are not "
                                   "evidence of a leak")
        unfit = conf.fit_warning(result.labels.counts)
        if unfit:
            result.warnings.append(unfit)
    if selector is not None:
        _score(selector, truth_counts, truth_soft)  # scored as every other result
        results.append(selector)


def _selector_result(ctx: Context, candidates: list[Attack], calibrated: dict[str, Any], why: str | None,
                     simulations: int, ran: dict[str, torch.Tensor]) -> AttackResult:
    """The calibrated selector's answer from the calibration just made (no second calibration); its
    ``confidence``: the chosen candidate's calibration (``chosen``: an attack or ``stacked``), or the abstention's."""
    from gleak.attacks.labels.calibrated import Calibrated

    if why or not candidates:
        return AttackResult("calibrated", "failed", reason=why or "no label attack ran on this capture")
    result = run_attack(Calibrated.precalibrated(candidates, calibrated, simulations, ran), ctx)
    if result.status == "ok" and result.output is not None:
        chosen = str(result.labels.diagnostics.get("chosen"))
        result.confidence = {"calibrated": True, "chosen": chosen,
                             **calibrated[chosen].to_json(result.labels.counts, ctx.total_examples or 0)}
    return result
