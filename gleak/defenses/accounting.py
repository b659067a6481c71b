"""Privacy accounting over a federated run: a client's cumulative ε after each round it trained in, composed by
Opacus from what each of its captures records (``gleak.dp.noise_multiplier``, ``.sample_rate``, ``.steps``).

RDP (the default): the Rényi DP of each round's noisy steps, from Opacus's ``compute_rdp`` at the orders its
``RDPAccountant`` uses, summed over the rounds so far and turned into (ε, δ) by Opacus's ``get_privacy_spent`` —
exactly what ``RDPAccountant`` with that history returns, computed once per round instead of once per prefix (a
client of 500 rounds costs 500 RDP vectors, not 125,000). PRV: Opacus's ``PRVAccountant`` over the history of
each prefix.

A round in which a client trained without DP metadata is *unaccounted*: from it on the client's ε is unknown (null,
with that round named), never taken as 0 (no cost) or ∞. Rounds a client did not take part in cost nothing."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from gleak.errors import GleakError


@dataclass(frozen=True)
class RoundSpend:
    """One client's noisy training in one round, as its capture records it; all None when it records no DP."""

    round: int | None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    steps: int | None = None

    @property
    def accounted(self) -> bool:
        return self.noise_multiplier is not None and self.sample_rate is not None and self.steps is not None


@dataclass(frozen=True)
class Cumulative:
    """ε after a round: a number, or None with the reason (the first round that records no DP, or a bound the
    accountant cannot give, such as z = 0: no guarantee at all)."""

    round: int | None
    epsilon: float | None
    reason: str | None = None


@lru_cache(maxsize=1024)  # distinct (z, q, steps) of a run: few; bounded all the same
def _round_rdp(noise_multiplier: float, sample_rate: float, steps: int) -> tuple[float, ...]:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp

    values = rdp.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                             orders=RDPAccountant.DEFAULT_ALPHAS)
    return tuple(float(v) for v in values)


def _rdp_epsilon(total: Sequence[float], delta: float) -> float:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns when the best order is at the end of its range
        eps, _ = rdp.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=list(total), delta=delta)
    return float(eps)


def _prv_epsilon(history: list[tuple[float, float, int]], delta: float) -> float | None:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = list(history)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(accountant.get_epsilon(delta=delta))
    except Exception:  # PRV cannot bound every setting (e.g. z = 0): the caller says so
        return None


def cumulative_epsilon(spends: Sequence[RoundSpend], delta: float, accountant: str = "rdp") -> list[Cumulative]:
    """The client's ε after each of ``spends`` (in round order), composed over every round so far."""
    if not 0 < delta < 1:
        raise GleakError(f"δ must be in (0, 1) to account privacy, got {delta:g}")
    if accountant not in ("rdp", "prv"):
        raise GleakError(f"unknown accountant {accountant!r} (rdp or prv)")
    out: list[Cumulative] = []
    total: list[float] | None = None
    history: list[tuple[float, float, int]] = []
    unknown: str | None = None  # once set, every later ε is unknown for this reason
    for spend in spends:
        where = "a capture without a round" if spend.round is None else f"round {spend.round}"
        if unknown is None and not spend.accounted:
            unknown = f"{where} records no DP (gleak.dp.*): unaccounted"
        if unknown is not None:
            out.append(Cumulative(spend.round, None, unknown))
            continue
        assert spend.noise_multiplier is not None and spend.sample_rate is not None and spend.steps is not None
        step = (float(spend.noise_multiplier), float(spend.sample_rate), int(spend.steps))
        history.append(step)
        if accountant == "rdp":
            vector = _round_rdp(*step)
            total = list(vector) if total is None else [a + b for a, b in zip(total, vector, strict=True)]
            eps: float | None = _rdp_epsilon(total, delta)
        else:
            eps = _prv_epsilon(history, delta)
        if eps is None or not math.isfinite(eps):
            unknown = (f"{where}: Opacus's {accountant.upper()} accountant gives no finite ε for z = {step[0]:g}, "
                       f"q = {step[1]:g}, {step[2]} steps (no DP guarantee)")
            out.append(Cumulative(spend.round, None, unknown))
            continue
        out.append(Cumulative(spend.round, eps))
    return out
