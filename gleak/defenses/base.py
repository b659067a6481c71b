"""Defenses as plug-ins: one class per defense, a one-line description, typed options, a seeded transform.

A defense transforms a contribution (a gradient or an update: the capture's tensors, every parameter tensor or the
ones named in ``tensors``) the way a client or an FL framework does before it leaves the client. Options are
declared and validated as the attacks' are (:mod:`gleak.registry`); every random draw takes a
:class:`torch.Generator` seeded by the caller, so the same seed gives the same bytes. What was applied is stamped
into the capture's ``gleak.defense`` metadata (a JSON list, in the order applied, with every option and the seed)
by :func:`gleak.defenses.apply.apply_defenses`.

A *training-time* defense (``training = True``, e.g. DP-SGD) changes how the client trains, not what it sends:
``gleak simulate --defense`` runs it, ``gleak defend`` cannot apply it to a finished contribution.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from pydantic import Field

from gleak.errors import GleakError
from gleak.registry import Configurable, Registry, TypedOptions


class DefenseOptions(TypedOptions):
    """Base of every defense's options (a training-time defense's options start here)."""


class ContributionOptions(DefenseOptions):
    """Base of the options of a defense of the contribution: which tensors it applies to."""

    tensors: str | None = Field(None, description="the tensors it applies to: names or shell patterns joined by "
                                "'+' (e.g. fc.weight+fc.bias or 'fc.*'); all parameter tensors when not given")


class Defense(Configurable):
    """One defense. Subclasses set ``name``, ``summary``, ``strength`` (the option a sweep varies), ``source`` (where
    it is defined or used) and ``Options``, and implement :meth:`transform` (or, for a training-time defense, are
    run by the simulation)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    source: ClassVar[str] = ""
    strength: ClassVar[str | None] = None
    also_sweeps: ClassVar[tuple[str, ...]] = ()  # other options a sweep may vary, named: NAME:KEY=V1,V2,...
    training: ClassVar[bool] = False
    kind: ClassVar[str] = "contribution"  # registry group: "contribution" or "training"
    Options: ClassVar[type[TypedOptions]] = DefenseOptions
    options: DefenseOptions

    def __init__(self, options: DefenseOptions | None = None) -> None:
        self.options = options if options is not None else self.Options()  # type: ignore[assignment]

    def __repr__(self) -> str:
        """Stable across processes (calibration caches key on it): the name and every option."""
        options = ",".join(f"{k}={v}" for k, v in self.options.model_dump(mode="json").items())
        return f"{self.name}({options})"

    def selected(self, names: list[str]) -> list[str]:
        """The tensor names of ``names`` this defense applies to (all without ``tensors``); a pattern that matches
        nothing is an error, so a typo never leaves a contribution undefended."""
        tensors = getattr(self.options, "tensors", None)
        if not tensors:
            return list(names)
        picked: list[str] = []
        for pattern in str(tensors).split("+"):
            pattern = pattern.strip()
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise GleakError(f"--defense {self.name}: tensors={pattern!r} matches no tensor of the contribution "
                                 f"(it has {', '.join(names[:8])}{', …' if len(names) > 8 else ''})")
            picked += [n for n in hits if n not in picked]
        return picked

    def transform(self, tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The defended tensors (those selected; float64 maths, the input dtype back). Pure: inputs unchanged."""
        raise NotImplementedError

    def per_tensor(self) -> bool:
        """Whether each tensor is transformed on its own (then one tensor at a time is held in float64); False
        for a defense over the whole contribution (a global norm or ranking)."""
        return True

    def record(self, seed: int) -> dict[str, Any]:
        """What goes into ``gleak.defense``: the name, every option (defaults included) and the seed."""
        return {"name": self.name, **self.options.model_dump(mode="json"), "seed": seed}

    @classmethod
    def describe(cls) -> dict[str, Any]:
        from gleak.registry import describe_options

        return {"name": cls.name, "summary": cls.summary, "kind": cls.kind, "strength": cls.strength,
                "also_sweeps": list(cls.also_sweeps), "source": cls.source, "options": describe_options(cls)}


DEFENSES: Registry[Defense] = Registry("defense", "kind", {"contribution": "contribution", "training": "training"})
register = DEFENSES.register


def apply_to(defense: Defense, tensors: Mapping[str, torch.Tensor], generator: torch.Generator,
             ) -> dict[str, torch.Tensor]:
    """``tensors`` with ``defense`` applied to the selected ones (the others unchanged), in their own dtypes."""
    names = defense.selected(list(tensors))
    out = dict(tensors)
    if defense.per_tensor():  # one tensor in float64 at a time: memory stays near the contribution's own size
        for n in names:
            out[n] = defense.transform({n: tensors[n].detach().to(torch.float64)}, generator)[n].to(tensors[n].dtype)
        return out
    done = defense.transform({n: tensors[n].detach().to(torch.float64) for n in names}, generator)
    for n in names:
        out[n] = done[n].to(tensors[n].dtype)
    return out
