"""The API reference covers what the docs teach: every ``from gleak... import ...`` in a code example of README.md or
docs/**/*.md names a module (and names) that a mkdocstrings ``::: module`` directive on a docs/api page renders."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import ROOT

FENCE = re.compile(r"^\s*(```|~~~)")
IMPORT = re.compile(r"^\s*from\s+(gleak(?:\.\w+)*)\s+import\s+(.+)$")
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$")


def example_imports(text: str) -> list[tuple[str, list[str]]]:
    """(module, names) of each ``from gleak... import a, b`` inside a fenced code block (``(a,\\n b)`` too)."""
    found: list[tuple[str, list[str]]] = []
    in_code = False
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if FENCE.match(line):
            in_code = not in_code
            continue
        match = IMPORT.match(line) if in_code else None
        if match is None:
            continue
        names = match.group(2).split("#")[0]
        if names.strip().startswith("(") and ")" not in names:
            while i < len(lines) and ")" not in names:
                names += " " + lines[i].split("#")[0]
                i += 1
        found.append((match.group(1), [n.split(" as ")[0].strip() for n in names.strip("() \t").split(",")
                                       if n.strip(" ()")]))
    return found


def directives(text: str) -> dict[str, list[str] | None]:
    """Each ``::: module`` of an API page -> the members its options list (None: every public member)."""
    out: dict[str, list[str] | None] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = DIRECTIVE.match(line)
        if match is None:
            continue
        members: list[str] | None = None
        j = i + 1
        while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
            if lines[j].strip() == "members:":
                members = []
            elif members is not None and lines[j].strip().startswith("- "):
                members.append(lines[j].strip()[2:].strip())
            elif members is not None and lines[j].strip():
                break
            j += 1
        out[match.group(1)] = members
    return out


def documented(module: str, name: str, api: dict[str, list[str] | None]) -> bool:
    """Whether ``module.name`` is rendered: a directive for the name itself, for its module (listing it, or
    listing no members), or for a parent package whose members list the path to it."""
    if f"{module}.{name}" in api:
        return True
    if module in api:
        members = api[module]
        return members is None or name in members
    for parent, members in api.items():
        if module.startswith(parent + ".") and members is not None:
            rest = module.removeprefix(parent + ".")
            if rest in members or f"{rest}.{name}" in members:
                return True
    return False


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def api_directives() -> dict[str, list[str] | None]:
    api: dict[str, list[str] | None] = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        api.update(directives(page.read_text(encoding="utf-8")))
    return api


def test_every_name_the_docs_import_is_in_the_api_reference() -> None:
    api = api_directives()
    imports = [(path, module, name) for path in doc_files()
               for module, names in example_imports(path.read_text(encoding="utf-8")) for name in names]
    # found at all
    assert {module for _, module, _ in imports} >= {"gleak.capture", "gleak.data.images", "gleak.models"}
    missing = [f"{path.relative_to(ROOT)}: from {module} import {name}" for path, module, name in imports
               if not documented(module, name, api)]
    assert not missing, "not in docs/api (add a ::: directive): " + "; ".join(missing)


def test_gleak_data_is_documented() -> None:
    api = api_directives()
    for name in ("load_dataset", "Dataset", "save_dataset"):
        assert documented("gleak.data.images", name, api), name


def test_the_checker_finds_what_is_missing() -> None:
    text = "```python\nfrom gleak.nowhere import thing\nfrom gleak.capture import (\n    Truth,\n    nope,\n)\n```\n"
    assert example_imports(text) == [("gleak.nowhere", ["thing"]), ("gleak.capture", ["Truth", "nope"])]
    assert example_imports("from gleak.capture import Truth\n") == []  # prose, not a code example
    api = directives("::: gleak.capture\n    options:\n      members:\n        - Truth\n\n"
                     "::: gleak.models.save_model\n")
    assert api == {"gleak.capture": ["Truth"], "gleak.models.save_model": None}
    assert documented("gleak.capture", "Truth", api) and not documented("gleak.capture", "nope", api)
    assert documented("gleak.models", "save_model", api) and not documented("gleak.nowhere", "thing", api)
