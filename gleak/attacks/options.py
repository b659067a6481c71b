"""Per-attack options: each attack declares a small frozen pydantic model (its ``Options``, a subclass of
:class:`AttackOptions`), and ``-O ATTACK.KEY=VALUE`` sets its fields through :meth:`Attack.configure
<gleak.attacks.base.Attack.configure>` — the one path by which options change (flags, ``-O``, the audit's
budgets, config files). The mechanism (validation, messages, listings) is :mod:`gleak.registry`'s."""

from __future__ import annotations

from gleak.registry import TypedOptions


class AttackOptions(TypedOptions):
    """Base of every attack's options: frozen, unknown keys refused, defaults validated, floats finite.

    Declare each option with a default and ``Field(description=...)``, the help line `gleak attacks` shows."""
