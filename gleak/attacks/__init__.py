"""Attacks: one registry (``REGISTRY``), a Context built once per capture, and the attacks themselves."""

from gleak.attacks import labels, reconstruct  # noqa: F401  (registers the attacks)
from gleak.attacks.base import Attack, AttackResult, LabelOutput, RunInputs, run_attack
from gleak.attacks.context import Context, build_context
from gleak.attacks.registry import REGISTRY, get_attack
from gleak.attacks.requirements import Requirements
from gleak.attacks.text import attacks as text_attacks  # noqa: F401  (registers dager)
from gleak.attacks.tokens import attacks as token_attacks  # noqa: F401  (registers the token attacks)
from gleak.attacks.tokens import beyond as sparse_attacks  # noqa: F401  (registers sparse-tokens)
from gleak.attacks.tokens import lora as lora_attacks  # noqa: F401  (registers lora-tokens)

__all__ = ["REGISTRY", "Attack", "AttackResult", "Context", "LabelOutput", "Requirements", "RunInputs",
           "build_context", "get_attack", "run_attack"]
