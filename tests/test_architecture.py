"""The shape of gleak's import graph: no import cycles, and no module imports a module of a higher layer.

The graph is read from the source with :mod:`ast` (nothing is imported) and counts every import: at module level,
inside functions, under ``if TYPE_CHECKING:``, relative ones, and the string imports gleak makes on purpose
(``deferred("gleak.x", ...)`` in the CLI, ``importlib.import_module("gleak.x")``). ``from gleak.x import y`` is an
import of ``gleak.x.y`` when that is a module, else of ``gleak.x``; importing a package is an import of its
``__init__.py``. A package's ``__init__`` importing its own submodules (to re-export them) is not a cycle.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gleak"

# Top to bottom. A module may import modules of its own layer or of a lower one, never of a higher one. A name
# stands for that module or package and everything under it; the root package ``gleak`` (its __version__) only
# for itself.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("gleak.__main__", "gleak.cli"),  # the command line
    ("gleak.integrations",),  # Flower / NVFlare hooks: record captures, and run audits on the server
    ("gleak.runs",),  # one run of a command: inputs -> attacks -> scores -> report
    ("gleak.attacks", "gleak.report"),
    ("gleak.generator", "gleak.simulate", "gleak.defenses", "gleak.tamper"),  # the simulated clients (images, text)
    # apply the defenses; tamper: a malicious server's crafts and the weight tests that find them
    # capture reads the last layer (models) and records the loss (losses); model_check: the model-hash check it makes
    # and the reports record (no torch, so that gleak.report.model imports without it)
    ("gleak.capture", "gleak.model_check", "gleak.metrics"),
    ("gleak.models", "gleak.data", "gleak.losses"),
    ("gleak.io", "gleak.errors", "gleak.lru", "gleak.registry", "gleak.reproducible", "gleak.settings", "gleak.timebox",
     "gleak"),
    # foundations: files, errors, bounded caches (lru), typed plug-in options, time stamps, the settings (each declared
    # once) and their config files, deadlines and progress (timebox)
)
# Modules kept outside the layers for a deprecation period (their imports are not checked against the layers; cycles
# through them are). None today: gleak.audit, the re-export of gleak.runs.audit, is gone (CHANGELOG, issue 36).
LEGACY: tuple[str, ...] = ()

STRING_IMPORTERS = frozenset({"deferred", "import_module", "__import__"})


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def find_modules(root: Path, package: str) -> dict[str, Module]:
    """Every module of ``package`` (a folder under ``root``) by dotted name; a package is its ``__init__.py``."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _existing(name: str, modules: Mapping[str, Module]) -> str | None:
    """``name`` if it is a module, else its nearest ancestor that is (an import of a missing module still
    depends on the packages above it)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: Module, modules: Mapping[str, Module], package: str) -> Iterable[tuple[str, int]]:
    """(imported module, line) for every import of a ``package`` module anywhere in ``module``'s source."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    here = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _within(alias.name, package) and (target := _existing(alias.name, modules)):
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if not _within(source, package):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in modules else _existing(source, modules)
                if target:
                    yield target, node.lineno
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = node.args[0]
            if (called in STRING_IMPORTERS and isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and _within(first.value, package) and (target := _existing(first.value, modules))):
                yield target, node.lineno


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line that imports it}, between modules of ``package`` only."""
    modules = find_modules(root, package)
    graph: dict[str, dict[str, int]] = {}
    for name, module in modules.items():
        edges: dict[str, int] = {}
        for target, line in _imports(module, modules, package):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


@functools.cache
def gleak_graph() -> dict[str, dict[str, int]]:
    return import_graph(ROOT, PACKAGE)


def _reexport(source: str, target: str, graph: Mapping[str, Mapping[str, int]]) -> bool:
    """A package ``__init__`` importing a module inside it (a package is a module with modules under it)."""
    return target.startswith(source + ".") and any(name.startswith(source + ".") for name in graph)


def find_cycles(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Readable cycles ``a -> b -> a``: the shortest one through each module that is on any, without repeats."""
    edges = {m: sorted(t for t in targets if t in graph and not _reexport(m, t, graph))
             for m, targets in graph.items()}
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    cycles: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for component in sorted(components):
        members = set(component)
        for start in component:
            path = _shortest_cycle(start, edges, members)
            key = tuple(sorted(path))
            if key not in seen:
                seen.add(key)
                smallest = path.index(min(path))
                ring = path[smallest:] + path[:smallest]
                cycles.append(" -> ".join([*ring, ring[0]]))
    return cycles


def _shortest_cycle(start: str, edges: Mapping[str, Sequence[str]], members: set[str]) -> list[str]:
    """Breadth-first from ``start`` back to itself inside one strongly connected component."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in edges[node]:
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            if child in members and child not in parent:
                parent[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is on no cycle")  # cannot happen inside a component


def layer_of(module: str, layers: Sequence[Sequence[str]], package: str) -> int | None:
    """Index of ``module``'s layer (0 is the top): its longest declared prefix; None when it has none."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for number, names in enumerate(layers):
        for name in names:
            matches = module == name if name == package else _within(module, name)
            if matches and (best is None or len(name) > best[0]):
                best = (len(name), number)
    return None if best is None else best[1]


def upward_imports(graph: Mapping[str, Mapping[str, int]], layers: Sequence[Sequence[str]], package: str,
                   legacy: Sequence[str] = ()) -> list[str]:
    """Every import of a module of a higher layer than the importer's, as a readable line."""
    found = []
    for source in sorted(graph):
        source_layer = layer_of(source, layers, package)
        if source_layer is None or any(_within(source, name) for name in legacy):
            continue
        for target, line in sorted(graph[source].items()):
            target_layer = layer_of(target, layers, package)
            if any(_within(target, name) for name in legacy) or target_layer is None:
                continue
            if target_layer < source_layer:
                found.append(f"{source} (line {line}, layer {source_layer}: {', '.join(layers[source_layer])}) "
                             f"imports {target} (layer {target_layer}: {', '.join(layers[target_layer])})")
    return found


# ----------------------------------------------------------------------------------------------- gleak itself


def test_gleak_has_no_import_cycles() -> None:
    cycles = find_cycles(gleak_graph())
    assert not cycles, "import cycles (break each by moving what both need one layer down):\n" + "\n".join(cycles)


def test_no_module_imports_a_higher_layer() -> None:
    found = upward_imports(gleak_graph(), LAYERS, PACKAGE, LEGACY)
    assert not found, "imports of a higher layer:\n" + "\n".join(found)


def test_every_module_has_a_layer() -> None:
    graph = gleak_graph()
    assert "gleak.capture" in graph and "gleak.models.loading" in graph  # the walk found the package
    missing = [m for m in graph if layer_of(m, LAYERS, PACKAGE) is None and not any(_within(m, n) for n in LEGACY)]
    assert not missing, f"modules in no layer (add them to LAYERS in {Path(__file__).name}): {missing}"


def test_models_data_losses_and_io_never_import_capture() -> None:
    """The arrow this test was written for: gleak.models read shapes and files through gleak.io, not capture."""
    graph = gleak_graph()
    for source in (m for m in graph if _within(m, "gleak.models") or m in ("gleak.io", "gleak.data", "gleak.losses")):
        assert "gleak.capture" not in graph[source], source


# --------------------------------------------------------------------------------------- the checker itself


SYNTHETIC = {
    "__init__.py": "from pkg import a\n",
    "a.py": "from pkg.b import thing\n",
    "b.py": "thing = 1\n\n\ndef later():\n    from pkg import a\n    return a\n",
    "c.py": "from typing import TYPE_CHECKING\n\nfrom . import b\n\nif TYPE_CHECKING:\n    import pkg.sub.d\n",
    "sub/__init__.py": "from .d import D\n",
    "sub/d.py": ("import json\n\nimport pkg\nfrom pkg.nowhere.deeper import x\n\nD = deferred('pkg.b', 'thing')\n\n\n"
                 "def late():\n    from ..c import b\n    return b\n"),
}


def _synthetic(tmp_path: Path) -> dict[str, dict[str, int]]:
    for name, text in SYNTHETIC.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path, "pkg")


def test_graph_counts_every_kind_of_import(tmp_path: Path) -> None:
    graph = _synthetic(tmp_path)
    assert {m: sorted(t) for m, t in graph.items()} == {
        "pkg": ["pkg.a"],
        "pkg.a": ["pkg.b"],
        "pkg.b": ["pkg.a"],  # inside a function; `from pkg import a` names the submodule
        "pkg.c": ["pkg.b", "pkg.sub.d"],  # relative, and under TYPE_CHECKING
        "pkg.sub": ["pkg.sub.d"],
        "pkg.sub.d": ["pkg", "pkg.b", "pkg.c"],  # the root, a missing module's package, a string import, `..c`
    }
    assert graph["pkg.sub.d"]["pkg.c"] == 10 and graph["pkg.c"]["pkg.sub.d"] == 6


def test_checker_reports_cycles_and_upward_imports(tmp_path: Path) -> None:
    graph = _synthetic(tmp_path)
    # pkg -> pkg.a -> pkg.b and pkg.sub -> pkg.sub.d -> pkg are re-exports, not cycles.
    assert find_cycles(graph) == ["pkg.a -> pkg.b -> pkg.a", "pkg.c -> pkg.sub.d -> pkg.c"]
    layers = (("pkg.c",), ("pkg.a", "pkg.b", "pkg.sub"), ("pkg",))
    found = upward_imports(graph, layers, "pkg")
    assert [line.split(" (")[0] for line in found] == ["pkg", "pkg.sub.d"]  # a root importing anything is one too
    assert found[1].startswith("pkg.sub.d (line 10, layer 1: pkg.a, pkg.b, pkg.sub) imports pkg.c (layer 0: pkg.c)")
    assert upward_imports(graph, layers, "pkg", legacy=("pkg.sub", "pkg.a")) == []
    assert layer_of("pkg.nothing", layers, "pkg") is None and layer_of("pkg", layers, "pkg") == 2
    assert find_cycles({"x": {"y": 1}, "y": {}}) == []


def test_the_docs_draw_the_same_layers() -> None:
    """docs/architecture.md's diagram lists the same packages, in the same layers, top to bottom, as LAYERS."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    diagram = text.split("## Layers", 1)[1].split("```", 2)[1]
    drawn = [tuple(sorted(n.strip() for n in line.split("(")[0].replace("└─", "").split("·") if n.strip()))
             for line in diagram.strip().splitlines()]
    layers = [tuple(sorted({n.removeprefix("gleak.") for n in layer if n not in ("gleak", "gleak.__main__")}))
              for layer in LAYERS]
    assert drawn == layers, (drawn, layers)
