"""`gleak attacks`: the registry — what each attack needs, where it comes from, and its options."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gleak.cli.common import console, handle_errors, print_json
from gleak.errors import GleakError


@handle_errors
def attacks(format: Annotated[str, typer.Option("--format", help="table or json.")] = "table") -> None:
    """List every attack: task, requirements, paper, and the options -O ATTACK.KEY=VALUE sets (with defaults)."""
    from gleak.attacks import REGISTRY
    from gleak.registry import describe_options, format_default

    rows: list[dict[str, Any]] = [
        {"name": cls.name, "task": cls.task, "summary": cls.summary, "requires": cls.requires.describe(),
         "paper": cls.paper, "options": describe_options(cls)} for cls in REGISTRY.values()]
    if format == "json":
        print_json(rows)
        return
    if format != "table":
        raise GleakError(f"--format must be table or json, got '{format}'")
    table = Table(title="gleak attacks", title_justify="left")
    for col in ("attack", "task", "needs", "what it does / paper"):
        table.add_column(col, overflow="fold")
    for r in rows:
        options = "".join(f"\n[cyan]{escape(o['name'])}={escape(format_default(o['default']))}[/]  "
                          f"{escape(o['help'])}" for o in r["options"])
        table.add_row(f"[bold]{r['name']}[/]", r["task"], ", ".join(r["requires"]),
                      f"{escape(r['summary'])}\n[dim]{escape(r['paper'])}[/]{options}")
    console.print(table)
    console.print("[dim]set an option with -O ATTACK.KEY=VALUE (gleak labels, gleak reconstruct)[/]")
