"""Issue 36: the specs, requests and configs callers assemble are built by keyword only — a positional argument
(``InputSpec(capture, model, aux, truth, …)``, twelve of them in a row) is a TypeError, not a silent mix-up."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import gleak
from gleak.attacks.base import RunInputs
from gleak.attacks.context import Context
from gleak.attacks.requirements import Requirements
from gleak.integrations.recorder import ClientRecord
from gleak.losses import LossSpec
from gleak.runs.audit.executors import WorkerSetup
from gleak.runs.inputs import InputSpec, ModelSpec
from gleak.runs.labels import LabelsRequest
from gleak.runs.reconstruct import ReconstructRequest
from gleak.runs.simulate import SimulateRequest
from gleak.runs.sweep import AttackPlan, DefenseSweep, SweepRequest
from gleak.runs.sweep_accuracy import Training
from gleak.runs.train_generator import TrainGeneratorRequest
from gleak.simulate.images import ClientConfig

SPECS: tuple[type, ...] = (
    ModelSpec, InputSpec, LabelsRequest, ReconstructRequest, SimulateRequest, TrainGeneratorRequest, SweepRequest,
    DefenseSweep, AttackPlan, Training, ClientConfig, LossSpec, WorkerSetup, RunInputs, Context, Requirements,
    ClientRecord,
)
# a dataclass in gleak/ with one of these names is something callers assemble: it must be keyword-only too (the
# pydantic models, AuditConfig and the attacks' and defenses' options, are keyword-only as such)
SPEC_NAME = re.compile(r"(Spec|Request|Config|Options)$")


def positional_parameters(cls: type) -> list[str]:
    """The parameters of ``cls``'s constructor a caller can pass by position (``self`` aside)."""
    params = inspect.signature(cls).parameters.values()  # the constructor's, without self
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]


def spec_dataclasses() -> list[str]:
    """``module.Class`` of every ``@dataclass`` in gleak/ named like a spec (found in the source, so a module with an
    optional dependency is not skipped)."""
    root = Path(gleak.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("gleak", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ClassDef) and SPEC_NAME.search(node.name) and not node.name.startswith("_")
                    and any("dataclass" in ast.unparse(d) for d in node.decorator_list)):
                found.append(f"{module}.{node.name}")
    return found


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
def test_the_spec_takes_keywords_only(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    assert positional_parameters(cls) == [], f"{cls.__name__} accepts positional arguments"


def test_every_dataclass_named_like_a_spec_takes_keywords_only() -> None:
    names = spec_dataclasses()
    # the scan finds them
    assert "gleak.runs.inputs.InputSpec" in names and "gleak.simulate.images.ClientConfig" in names
    loose = []
    for name in names:
        module, _, attr = name.rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
        if positional_parameters(cls):
            loose.append(name)
    assert loose == [], f"keyword-only constructors wanted (@dataclass(kw_only=True)): {loose}"


def test_a_positional_argument_is_refused() -> None:
    with pytest.raises(TypeError):
        InputSpec(Path("c.safetensors"))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        LossSpec("focal")  # type: ignore[call-arg]
    spec = InputSpec(capture=Path("c.safetensors"), model=ModelSpec(path=Path("m.safetensors"), arch="lenet"))
    assert spec.model.arch == "lenet" and spec.seed == 0  # keywords and defaults as before
