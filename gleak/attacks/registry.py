"""The one attack registry (:data:`REGISTRY`, a :class:`gleak.registry.Registry`) and its lookups: by name and
task with a "did you mean", fresh instances, and ``-O`` assignments validated against each attack's options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, overload

from gleak.attacks.base import Attack
from gleak.attacks.options import AttackOptions
from gleak.registry import Registry, parse_assignments, resolve_options

if TYPE_CHECKING:
    from gleak.attacks.reconstruct.base import ReconstructionAttack

TASK_NOUNS = {"labels": "label", "reconstruct": "reconstruction", "tokens": "token", "text": "text"}
REGISTRY: Registry[Attack] = Registry("attack", "task", TASK_NOUNS)
register = REGISTRY.register

def attack_class(name: str, task: str | None = None, where: str = "") -> type[Attack]:
    """The registered attack class ``name``; with ``task``, only attacks of that task count. Unknown names: see
    :meth:`gleak.registry.Registry.lookup`."""
    return REGISTRY.lookup(name, task, where=where)


@overload
def get_attack(name: str, task: Literal["reconstruct"]) -> ReconstructionAttack: ...


@overload
def get_attack(name: str, task: str | None = None) -> Attack: ...


def get_attack(name: str, task: str | None = None) -> Attack:
    """A fresh instance of the attack called ``name`` (see :func:`attack_class`); a reconstruction attack when
    ``task`` is ``"reconstruct"`` (and typed so)."""
    attack = attack_class(name, task)()
    if task == "reconstruct":
        from gleak.attacks.reconstruct.base import ReconstructionAttack

        assert isinstance(attack, ReconstructionAttack)
    return attack


def attacks_for(task: str) -> list[Attack]:
    """A fresh instance of every attack of ``task``, in registration order."""
    return [cls() for cls in REGISTRY.in_group(task)]


def parse_option_assignments(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``-O ATTACK.KEY=VALUE`` items by attack (see :func:`gleak.registry.parse_assignments`)."""
    return parse_assignments(items, "-O", "ATTACK", "rlu.mc_samples=500")


def resolve_assignments(assignments: Mapping[str, Mapping[str, str]],
                        task: str | None = None) -> dict[str, AttackOptions]:
    """Every attack named by ``-O`` checked (known, of ``task``) and its values validated, in one pass."""
    out: dict[str, AttackOptions] = {}
    for name, values in assignments.items():
        typed = resolve_options(attack_class(name, task, where="-O: "), values)
        assert isinstance(typed, AttackOptions)
        out[name] = typed
    return out
