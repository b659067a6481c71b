"""Choosing attacks for a task and running them on a Context, scored when ground truth is known."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gleak.attacks.base import Attack, AttackResult, attacks_for, get_attack, run_attack
from gleak.attacks.context import Context
from gleak.errors import GleakError
from gleak.metrics.labels import label_scores, soft_label_scores


def select_attacks(task: str, names: Sequence[str] | None) -> list[Attack]:
    """The named attacks (validated, in the order given) or every registered attack of ``task``."""
    if not names:
        return attacks_for(task)
    return [get_attack(name, task) for name in names]


def run_label_attacks(ctx: Context, attacks: Sequence[Attack], truth_counts: torch.Tensor | None = None,
                      progress: Callable[[str], None] | None = None,
                      truth_soft: torch.Tensor | None = None) -> list[AttackResult]:
    """Run each attack; with true per-class counts (and, for one example, its true soft label) score every
    successful result."""
    if truth_counts is not None and len(truth_counts) != ctx.num_classes:
        raise GleakError(f"ground truth has {len(truth_counts)} classes, the model {ctx.num_classes}")
    if truth_counts is not None and ctx.total_examples and int(truth_counts.sum()) != ctx.total_examples:
        raise GleakError(f"ground truth holds {int(truth_counts.sum())} labels, the capture {ctx.total_examples}")
    results = []
    for attack in attacks:
        if progress:
            progress(attack.name)
        result = run_attack(attack, ctx)
        if truth_counts is not None and result.output is not None:
            out = result.labels
            result.scores = label_scores(out.counts, truth_counts)
            if truth_soft is not None and out.soft_label is not None:
                result.scores.update(soft_label_scores(out.soft_label, truth_soft))
        results.append(result)
    return results
