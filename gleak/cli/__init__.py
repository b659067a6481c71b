"""The `gleak` command line: one Typer app, one module per command (thin: parse, call, render).

Importing this package (and every command module) must not import torch: `gleak --help`, `gleak COMMAND --help`,
`gleak --version` and usage errors run without it. Each command imports what it needs when it runs."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from gleak import __version__
from gleak.cli.attacks_cmd import attacks
from gleak.cli.audit_cmd import audit
from gleak.cli.capture_cmd import capture
from gleak.cli.check_model_cmd import check_model
from gleak.cli.common import GleakCommand, GleakGroup, ThreadsOpt, remember_threads
from gleak.cli.defend_cmd import defend, defenses
from gleak.cli.inspect_cmd import inspect
from gleak.cli.labels_cmd import labels
from gleak.cli.reconstruct_cmd import reconstruct
from gleak.cli.simulate_cmd import simulate
from gleak.cli.sweep_cmd import sweep
from gleak.cli.train_generator_cmd import train_generator
from gleak.errors import INTERRUPTED

app = typer.Typer(
    name="gleak",
    cls=GleakGroup,
    help="Audit how much private training data a federated-learning client leaks in its gradients or updates.",
    invoke_without_command=True,  # `gleak` alone prints the help (exit 0): see _root
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"gleak {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print gleak's version and exit.", is_eager=True,
                                          callback=_show_version)] = False,
    threads: ThreadsOpt = None,
) -> None:
    """Global options; the commands read --threads when they run (common.requested_threads, apply_threads)."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    remember_threads(ctx, threads)


for _command in (inspect, attacks, defenses, simulate, capture, defend, labels, reconstruct, audit, sweep):
    app.command(cls=GleakCommand)(_command)
app.command("train-generator", cls=GleakCommand)(train_generator)
app.command("check-model", cls=GleakCommand)(check_model)


def main() -> None:
    """The console script's entry point. After Ctrl-C (its one line already written) the process ends at once:
    the interpreter's orderly shutdown with torch and transformers loaded takes seconds, and nothing is left to
    write (outputs are written atomically, or not at all)."""
    try:
        app()
    except SystemExit as e:
        if e.code == INTERRUPTED:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED)
        raise
