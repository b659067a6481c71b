"""The run behind ``gleak attacks``: the attack registry described — task, requirements, paper, typed options."""

from __future__ import annotations

from gleak.attacks import REGISTRY
from gleak.registry import describe_options
from gleak.report.model import AttackInfo


def describe_attacks() -> list[AttackInfo]:
    """One entry per registered attack, in registration order: name, task, summary, requirements, paper and its
    options (name, type, default, range, help)."""
    return [AttackInfo.model_validate({"name": cls.name, "task": cls.task, "summary": cls.summary,
                                       "requires": cls.requires.describe(), "paper": cls.paper,
                                       "options": describe_options(cls)}) for cls in REGISTRY.values()]
