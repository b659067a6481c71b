"""`gleak attacks`: the registry — what each attack needs and where it comes from."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from gleak.cli.common import console, handle_errors, print_json
from gleak.errors import GleakError


@handle_errors
def attacks(format: Annotated[str, typer.Option("--format", help="table or json.")] = "table") -> None:
    """List every attack: task, requirements, paper."""
    from gleak.attacks import REGISTRY

    rows: list[dict[str, Any]] = [
        {"name": cls.name, "task": cls.task, "summary": cls.summary, "requires": cls.requires.describe(),
         "paper": cls.paper} for cls in REGISTRY.values()]
    if format == "json":
        print_json(rows)
        return
    if format != "table":
        raise GleakError(f"--format must be table or json, got '{format}'")
    table = Table(title="gleak attacks", title_justify="left")
    for col in ("attack", "task", "needs", "what it does / paper"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(f"[bold]{r['name']}[/]", r["task"], ", ".join(r["requires"]),
                      f"{r['summary']}\n[dim]{r['paper']}[/]")
    console.print(table)
