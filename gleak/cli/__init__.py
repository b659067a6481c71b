"""The `gleak` command line: one Typer app, one module per command (thin: parse, call, render)."""

from __future__ import annotations

import typer

from gleak.cli.attacks_cmd import attacks
from gleak.cli.common import GleakGroup
from gleak.cli.inspect_cmd import inspect
from gleak.cli.labels_cmd import labels
from gleak.cli.reconstruct_cmd import reconstruct
from gleak.cli.simulate_cmd import simulate

app = typer.Typer(
    name="gleak",
    cls=GleakGroup,
    help="Audit how much private training data a federated-learning client leaks in its gradients or updates.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(inspect)
app.command()(attacks)
app.command()(simulate)
app.command()(labels)
app.command()(reconstruct)


def main() -> None:
    app()
