"""Shared CLI plumbing: consoles, option types, error handling (exit 2 on bad input), model opening."""

from __future__ import annotations

import functools
import json
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import torch
import typer
from rich.console import Console

from gleak.errors import GleakError

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])

ModelOpt = Annotated[Path | None, typer.Option("--model", "-M", help="Global model: .pt2, .safetensors, state "
                                               "dict (.pt) or TorchScript archive.")]
ArchOpt = Annotated[str | None, typer.Option(help="Architecture for weight files: zoo name (lenet, idlg-cnn, "
                                             "fcn4, mlp, resnet-cifar), torchvision:NAME or package.module:factory.")]
ArchKwargsOpt = Annotated[str | None, typer.Option("--arch-kwargs", help="JSON object of architecture "
                                                   "arguments, e.g. '{\"activation\": \"sigmoid\"}'.")]
TrustPickleOpt = Annotated[bool, typer.Option("--trust-pickle", help="Allow loading a whole pickled module. "
                                              "Pickles run code: only for files you trust.")]
FcLayerOpt = Annotated[str | None, typer.Option("--fc-layer", help="Name of the last fully-connected layer "
                                                "(overrides detection).")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
SeedOpt = Annotated[int, typer.Option(help="Seed for every stochastic step.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only results and errors.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="More detail; tracebacks on internal errors.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")]


def fail(message: str) -> None:
    """Print one error line on stderr."""
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)


def handle_errors(fn: F) -> F:
    """Turn GleakError into one readable line and exit 2; anything else into exit 3 (with -v: a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        logging.getLogger("pyswarms").setLevel(logging.WARNING)
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except GleakError as e:
            fail(str(e))
            raise typer.Exit(GleakError.exit_code) from None
        except KeyboardInterrupt:
            fail("interrupted")
            raise typer.Exit(130) from None
        except MemoryError:
            fail("out of memory; try a smaller batch or --device cpu")
            raise typer.Exit(2) from None
        except Exception as e:
            if kwargs.get("verbose"):
                traceback.print_exc(file=sys.stderr)
            fail(f"internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                 "(please report it; -v shows the traceback)")
            raise typer.Exit(3) from None

    return wrapper  # type: ignore[return-value]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise GleakError(f"--device {device} requested but no CUDA device is available")
        return torch.device(device)
    raise GleakError(f"--device must be auto, cpu or cuda, got '{device}'")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
