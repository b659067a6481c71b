"""Label-recovery metrics (docs/methods/label-recovery.md#metrics) and the chance baseline.

* iAcc (LLG ASR, iLRG IRec, RLU iAcc) = Σ_c min(n̂_c, n_c) / B — multiset overlap.
* cAcc (iLRG LeAcc, RLU cAcc) = fraction of the C classes whose presence is predicted right.
* exact (iLRG LnAcc) = fraction of the C classes whose count is exactly right.
* Jaccard ClsAcc = |Ĉ ∩ C| / |Ĉ ∪ C| on present classes; InsAcc = Σ min / Σ max (Zhang, Guo & Li, ICLR 2024
  PML workshop, report these; the paper gives no formula, this is our reading of "realised through Jaccard
  similarity").
* chance = the expected iAcc (and cAcc) of guessing B labels independently and uniformly at random, for the
  same true batch: E[Σ_c min(X_c, n_c)]/B with X_c ~ Binomial(B, 1/C), computed exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def label_scores(predicted: torch.Tensor | list[int], truth: torch.Tensor | list[int]) -> dict[str, float]:
    """All label metrics for predicted and true per-class counts (same length C)."""
    n_hat = torch.as_tensor(predicted, dtype=torch.float64)
    n = torch.as_tensor(truth, dtype=torch.float64)
    total = float(n.sum())
    both = torch.minimum(n_hat, n).sum().item()
    union = torch.maximum(n_hat, n).sum().item()
    pred_set, true_set = n_hat > 0, n > 0
    inter = int((pred_set & true_set).sum())
    uni = int((pred_set | true_set).sum())
    chance = chance_scores(n.long())
    return {
        "iacc": both / total if total else 0.0,
        "cacc": float((pred_set == true_set).double().mean()),
        "exact": float((n_hat == n).double().mean()),
        "jaccard_cls": inter / uni if uni else 1.0,
        "jaccard_ins": both / union if union else 1.0,
        "chance_iacc": chance["iacc"],
        "chance_cacc": chance["cacc"],
    }


SOFT_SUCCESS_L1 = 1e-3


def soft_label_scores(predicted: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """L_r = Σ_i |ŷ_i − y_i| of Wang, Liang & He (ICLR 2024) and success when it is below 1e−3."""
    l1 = float((predicted.double() - truth.double()).abs().sum())
    return {"soft_l1": l1, "soft_success": float(l1 < SOFT_SUCCESS_L1)}


def binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(X = k) for k = 0..n, X ~ Binomial(n, p), 0 < p < 1, computed in log space (no overflow for large n).

    Written out rather than taken from scipy.stats, whose import alone costs about 0.6 s of every CLI run."""
    k = np.arange(n + 1)
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
    pmf: np.ndarray = np.exp(log_choose + k * math.log(p) + (n - k) * math.log1p(-p))
    return pmf


def chance_scores(truth_counts: torch.Tensor) -> dict[str, float]:
    """Expected iAcc and cAcc of B uniform random guesses over C classes for this true batch."""
    n = np.asarray(truth_counts, dtype=np.int64)
    total, classes = int(n.sum()), len(n)
    if total == 0:
        return {"iacc": 0.0, "cacc": 0.0}
    k = np.arange(total + 1)
    pmf = binomial_pmf(total, 1.0 / classes)  # X_c ~ Binomial(B, 1/C)
    expected_min = np.array([(np.minimum(k, nc) * pmf).sum() for nc in n])
    p_absent = pmf[0]
    cacc = np.where(n > 0, 1 - p_absent, p_absent).mean()
    return {"iacc": float(expected_min.sum() / total), "cacc": float(cacc)}


def hard_labels(labels: torch.Tensor) -> torch.Tensor:
    """Class indices [N]: the labels themselves, or for soft labels [N, C] their argmax (the dominant class)."""
    return labels.argmax(dim=1) if labels.dim() == 2 else labels


def truth_counts(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per-class counts of true labels; soft labels [N, C] count by their argmax (the dominant class)."""
    return torch.bincount(hard_labels(labels).long(), minlength=num_classes)
