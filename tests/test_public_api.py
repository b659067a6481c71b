"""gleak works in the environment users get: it imports no dependency's private modules (where torch's internals are
unavoidable, each use says why), and the installed dependencies lie within the ranges pyproject.toml declares."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "gleak").rglob("*.py"))
# private modules of dependencies: Typer's vendored Click (gone or reshaped from one minor release to the next),
# Click itself (not a dependency of gleak: Typer ≥ 0.26 does not install it), Rich's and pydantic's internals
FORBIDDEN = re.compile(r"^(typer\._|click(\.|$)|rich\._|pydantic\._)")
TORCH_INTERNAL = re.compile(r"torch\._|\b_package\b|_weights_only_unpickler|utils\._sympy|_guards_code")


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_private_module_of_typer_click_or_rich_is_imported() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in SOURCES for line, name in imports(p)
           if FORBIDDEN.match(name)]
    assert bad == []


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` outside docstrings and other string constants."""
    text = path.read_text(encoding="utf-8")
    strings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.end_lineno != node.lineno:
            strings.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return [(i, line) for i, line in enumerate(text.splitlines(), 1) if i not in strings]


def test_every_use_of_torch_internals_says_why() -> None:
    """A torch internal is used only where torch has no public way (vetting what its own loader does), and the
    line, or a comment on one of the two lines above it, says "torch internal" and why."""
    unexplained, used = [], 0
    for path in SOURCES:
        lines = code_lines(path)
        by_number = dict(lines)
        for number, line in lines:
            code = line.split("#", 1)[0]
            if not TORCH_INTERNAL.search(code) or code.lstrip().startswith(("'", '"')):
                continue
            used += 1
            context = [by_number.get(n, "") for n in (number - 2, number - 1, number)]
            if not any("torch internal" in c for c in context):
                unexplained.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert unexplained == []
    assert used > 0  # the pattern does find them (export_archive vets torch.export.load)


def test_the_torch_internals_gleak_guards_exist_in_the_installed_torch() -> None:
    """The load guard replaces these while it vets a .pt2 (gleak.models.export_archive); a torch that renamed them
    would leave a way around the guard, so their absence fails here rather than passing silently."""
    import torch

    assert callable(torch._C._pickle_load_obj)  # torch internal: TorchScript object unpickler
    assert callable(torch._C.PyTorchFileReader)  # torch internal: torch's zip reader
    from torch import _weights_only_unpickler as wo  # torch internal: weights-only allow-list

    assert "torch._utils._rebuild_tensor_v2" in {str(k) for k in wo._get_allowed_globals()}


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    return requirements


@pytest.mark.parametrize("requirement", declared(), ids=str)
def test_installed_dependency_is_within_the_declared_range(requirement: Requirement) -> None:
    """Catches an environment that drifted from pyproject.toml (a stale venv, a lock not refreshed): the tests
    would otherwise pass on versions users can never get."""
    try:
        version = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{requirement.name} is declared but not installed")
    assert requirement.specifier.contains(version, prereleases=True), f"{requirement.name} {version}"


def test_typer_range_is_declared_with_its_reasons() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith('"typer'))
    assert ">=0.20" in lines[at] and "<0.30" in lines[at]
    reasons = " ".join(lines[at - 4:at])
    assert "# typer >= 0.20" in reasons and "< 0.30" in reasons
