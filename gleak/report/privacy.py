"""ε stated with its terms: the one formatter every output uses for DP-SGD's ε (console, JSON's ``epsilon_terms``,
HTML, Markdown, ``sweep.md``, the sweep's dpsgd plot, SARIF text).

An ε alone is no guarantee: it holds at a δ, by an accountant, for a sample rate q, a number of noisy steps and of
rounds. :func:`describe_epsilon` says all of them, e.g. ``ε = 1.98 at δ = 1e-5 (RDP; q = 0.016, 3 steps × 1
round)``; :func:`terms_of` reads them from a capture's ``gleak.dp.*`` metadata. A capture is one contribution of
one round, so its rounds are 1 (the ε of that contribution alone, not of the whole training). No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gleak.report.model import EpsilonTerms

ACCOUNTANTS = {"rdp": "RDP", "prv": "PRV"}


def short_number(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, exponents without padding (``1e-5``, not ``1e-05``)."""
    text = f"{value:.{digits}g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def describe_terms(terms: EpsilonTerms) -> str:
    """What an ε holds under: ``δ = 1e-5 (RDP; q = 0.016, 3 steps × 1 round)``."""
    accountant = ACCOUNTANTS.get(terms.accountant, terms.accountant.upper())
    return (f"δ = {short_number(terms.delta)} ({accountant}; q = {short_number(terms.sample_rate)}, "
            f"{_plural(terms.steps, 'step')} × {_plural(terms.rounds, 'round')})")


def describe_epsilon(epsilon: float, terms: EpsilonTerms, digits: int = 3) -> str:
    """``ε = 1.98 at δ = 1e-5 (RDP; q = 0.016, 3 steps × 1 round)``."""
    return f"ε = {short_number(epsilon, digits)} at {describe_terms(terms)}"


def describe_noise(terms: EpsilonTerms) -> str:
    """How the noise was set: ``z = 1.23 (C = 1), picked for target ε = 2 by Opacus's get_noise_multiplier`` or
    ``z = 1.23 (C = 1)``."""
    clip = f" (C = {short_number(terms.max_grad_norm)})" if terms.max_grad_norm is not None else ""
    aimed = (f", picked for target ε = {short_number(terms.target_epsilon)} by Opacus's get_noise_multiplier"
             if terms.target_epsilon is not None else "")
    return f"z = {short_number(terms.noise_multiplier)}{clip}{aimed}"


def terms_of(meta: Mapping[str, Any], rounds: int = 1) -> EpsilonTerms | None:
    """The terms a capture's ``gleak.dp.*`` metadata records for its ε; None when it records no ε (or not all of
    δ, accountant, q, steps and z)."""
    needed = ("gleak.dp.epsilon", "gleak.dp.delta", "gleak.dp.accountant", "gleak.dp.sample_rate", "gleak.dp.steps",
              "gleak.dp.noise_multiplier")
    if any(meta.get(k) is None for k in needed):
        return None
    c, target = meta.get("gleak.dp.max_grad_norm"), meta.get("gleak.dp.target_epsilon")
    return EpsilonTerms(delta=float(meta["gleak.dp.delta"]), accountant=meta["gleak.dp.accountant"],
                        sample_rate=float(meta["gleak.dp.sample_rate"]), steps=int(meta["gleak.dp.steps"]),
                        rounds=rounds, noise_multiplier=float(meta["gleak.dp.noise_multiplier"]),
                        max_grad_norm=None if c is None else float(c),
                        target_epsilon=None if target is None else float(target))


def statement(epsilon: float | None, terms: EpsilonTerms | None) -> str | None:
    """ε with its terms and how the noise was set (``ε = 1.98 at δ = 1e-5 (RDP; q = 0.016, 3 steps × 1 round);
    z = 0.647 (C = 1), picked for target ε = 2 by Opacus's get_noise_multiplier``); None without an ε."""
    if epsilon is None or terms is None:
        return None
    return f"{describe_epsilon(epsilon, terms)}; {describe_noise(terms)}"


def describe_capture(meta: Mapping[str, Any]) -> str | None:
    """A capture's ε as :func:`statement` states it, or None when it records no ε."""
    terms = terms_of(meta)
    return None if terms is None else statement(float(meta["gleak.dp.epsilon"]), terms)
