"""Thin commands (issue 36): the CLI parses, calls one run and renders; no function in gleak/cli/ has a body of more
than MAX_BODY lines (from the first statement after the docstring to the function's last line; the signature
aside). Read with :mod:`ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parent.parent / "gleak" / "cli"
MAX_BODY = 40


def body_lengths(path: Path) -> dict[str, int]:
    """Every function of ``path`` (nested ones included), by qualified line, with the length of its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lengths = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # the docstring
        if body:
            assert node.end_lineno is not None
            lengths[f"{path.name}:{node.lineno} {node.name}"] = node.end_lineno - body[0].lineno + 1
    return lengths


def test_the_counter_counts_from_the_first_statement_after_the_docstring(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('def f(\n    x: int,\n) -> int:\n    """Doc\n    more."""\n    y = x\n\n    return y\n')
    assert body_lengths(source) == {"m.py:1 f": 3}


def test_no_function_in_the_cli_has_a_body_longer_than_40_lines() -> None:
    files = sorted(CLI.glob("*.py"))
    assert files
    long = {name: n for path in files for name, n in body_lengths(path).items() if n > MAX_BODY}
    assert not long, f"functions in gleak/cli/ longer than {MAX_BODY} lines (move the work into gleak.runs or " \
                     f"gleak.report): {long}"
