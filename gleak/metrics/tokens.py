"""Token-bag metrics (METHODS-text §5.5; docs/methods/tokens.md#metrics) and their chance baseline.

* precision, recall, F1 over **distinct** token ids: |B̂ ∩ B| / |B̂|, |B̂ ∩ B| / |B|, their harmonic mean;
* count accuracy (multiset overlap, iAcc at C = V): Σ_v min(n̂_v, n_v) / Σ_v n_v;
* chance: the same numbers for a guesser that knows nothing about the batch, in expectation, exactly.

**What chance means here.** The guesser draws as many distinct ids as the attack returned, k = |B̂|, uniformly
without replacement from the V ids (for the counts: N = Σ n_v ids uniformly with replacement). Uniform, not the
unigram distribution, because the unigram distribution of the client's domain is exactly what an auditor does not
have (a generic corpus's unigram would be a different baseline for every corpus), and because it has a closed form.
With n = |B| true distinct ids, TP is hypergeometric(V, n, k): E[TP] = k·n/V, so chance precision = n/V, recall =
k/V and F1 = 2·E[TP]/(k + n) = 2kn/(V(k + n)) (exact: the denominator is fixed). Chance count accuracy is
E[Σ_v min(X_v, n_v)]/N with X_v ~ Binomial(N, 1/V) (:func:`gleak.metrics.labels.binomial_pmf`), exact.

Which tokens count as the truth depends on what the attack recovers: :func:`truth_bags` returns the input bag
(tokens at loss-relevant input positions), the target bag (next tokens) and every real token of the batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import torch

from gleak.metrics.labels import binomial_pmf


def truth_bags(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               causal_lm: bool = True) -> dict[str, Counter[int]]:
    """``inputs``, ``targets`` and ``all`` token multisets of a batch [B, T] (pads, mask 0, left out; either
    padding side). Under next-token loss the inputs are each sequence's real tokens but the last (the last token
    is scored by nobody) and the targets all but the first; for classification both are every real token."""
    ids = input_ids.long()
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask.long()
    bags: dict[str, Counter[int]] = {"inputs": Counter(), "targets": Counter(), "all": Counter()}
    for row, keep in zip(ids.tolist(), mask.tolist(), strict=True):
        real = [t for t, m in zip(row, keep, strict=True) if m]
        bags["all"].update(real)
        bags["inputs"].update(real[:-1] if causal_lm else real)
        bags["targets"].update(real[1:] if causal_lm else real)
    return bags


def bag_scores(predicted: Mapping[int, int], truth: Mapping[int, int], vocab_size: int) -> dict[str, float]:
    """Precision, recall, F1 over distinct ids, count accuracy, and their chance values (see the module notes).

    ``predicted`` and ``truth`` map token id -> count (counts ≤ 0 are dropped)."""
    pred = {int(t): int(c) for t, c in predicted.items() if c > 0}
    true = {int(t): int(c) for t, c in truth.items() if c > 0}
    tp = len(pred.keys() & true.keys())
    k, n = len(pred), len(true)
    precision = tp / k if k else (1.0 if not n else 0.0)
    recall = tp / n if n else 1.0
    f1 = 2 * tp / (k + n) if k + n else 1.0
    total = sum(true.values())
    overlap = sum(min(c, true.get(t, 0)) for t, c in pred.items())
    chance = chance_bag_scores(k, true, vocab_size)
    return {"precision": precision, "recall": recall, "f1": f1,
            "count_accuracy": overlap / total if total else 1.0,
            **{f"chance_{key}": value for key, value in chance.items()}}


def chance_bag_scores(guessed: int, truth: Mapping[int, int], vocab_size: int) -> dict[str, float]:
    """Expected precision, recall, F1 of ``guessed`` distinct ids drawn uniformly without replacement from V, and
    expected count accuracy of N = Σ n_v ids drawn uniformly with replacement, against ``truth`` (exact)."""
    v = vocab_size
    counts = [int(c) for c in truth.values() if c > 0]
    n, k = len(counts), min(guessed, v)
    if v < 1:
        raise ValueError("vocab_size must be ≥ 1")
    precision = n / v if k else (1.0 if not n else 0.0)
    recall = k / v if n else 1.0
    f1 = 2 * k * n / (v * (k + n)) if k + n else 1.0
    total = sum(counts)
    if not total:
        return {"precision": precision, "recall": recall, "f1": f1, "count_accuracy": 1.0}
    pmf = binomial_pmf(total, 1.0 / v) if v > 1 else np.eye(total + 1)[-1]
    tail = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]])  # tail[j] = P(X ≥ j)
    partial = np.cumsum(np.arange(total + 1) * pmf)  # partial[j] = Σ_{i ≤ j} i·P(X = i)
    expected = 0.0
    for c, times in Counter(counts).items():  # E[min(X, c)] = Σ_{i<c} i·P(X=i) + c·P(X ≥ c)
        expected += times * (float(partial[c - 1]) + c * float(tail[c]))
    return {"precision": precision, "recall": recall, "f1": f1, "count_accuracy": expected / total}
