"""Attacks: one registry (``REGISTRY``), a Context built once per capture, and the attacks themselves."""

from gleak.attacks import labels, reconstruct  # noqa: F401  (registers the attacks)
from gleak.attacks.base import REGISTRY, Attack, AttackResult, LabelOutput, Requirements, get_attack, run_attack
from gleak.attacks.context import Context, build_context

__all__ = ["REGISTRY", "Attack", "AttackResult", "Context", "LabelOutput", "Requirements", "build_context",
           "get_attack", "run_attack"]
