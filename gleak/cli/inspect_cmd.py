"""`gleak inspect`: what a capture holds, and which last layer the attacks will use (parses the options, calls
:func:`gleak.runs.inspect.run_inspect`, renders the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gleak.cli.common import (
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    FcLayerOpt,
    ModelOpt,
    QuietOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    VerboseOpt,
    console,
    handle_errors,
    print_json,
)
from gleak.errors import GleakError


@handle_errors
def inspect(
    capture: Annotated[Path, typer.Argument(help="Capture file (.safetensors).")],
    model: ModelOpt = None,
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    fc_layer: FcLayerOpt = None,
    allow_model_mismatch: AllowMismatchOpt = False,
    format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show a capture's tensors, metadata, the detected last layer and its batch size."""
    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got '{format}'")
    from gleak.runs.inputs import ModelSpec
    from gleak.runs.inspect import run_inspect

    info = run_inspect(capture, ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                                          trust_remote_code=trust_remote_code),
                       fc_layer, allow_model_mismatch)
    if format == "json":
        print_json(info.to_json())
    else:
        from gleak.capture import SCHEMA
        from gleak.report.formats.console import print_inspect

        print_inspect(console, info, verbose, {key: spec.doc for key, spec in SCHEMA.items()})
