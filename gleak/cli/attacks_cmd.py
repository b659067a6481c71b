"""`gleak attacks`: the registry — what each attack needs, where it comes from, and its options."""

from __future__ import annotations

from typing import Annotated

import typer

from gleak.cli.common import console, handle_errors, print_json
from gleak.errors import GleakError


@handle_errors
def attacks(format: Annotated[str, typer.Option("--format", help="table or json.")] = "table") -> None:
    """List every attack: task, requirements, paper, and the options -O ATTACK.KEY=VALUE sets (with defaults)."""
    from gleak.runs.attacks import describe_attacks

    rows = describe_attacks()
    if format == "json":
        print_json([row.to_json() for row in rows])
        return
    if format != "table":
        raise GleakError(f"--format must be table or json, got '{format}'")
    from gleak.report.formats.console import print_attacks

    print_attacks(console, rows)
