"""`gleak check-model`: is this global model a trap? (parses the options, calls
:func:`gleak.runs.check_model.run_check_model`, renders the report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gleak.cli.common import (
    ArchKwargsOpt,
    ArchOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    VerboseOpt,
    console,
    handle_errors,
    print_json,
)
from gleak.errors import GleakError

FORMATS = ("table", "json", "sarif")
FILES = {"json": "check-model.json", "sarif": "check-model.sarif"}


@handle_errors
def check_model(
    model: Annotated[Path, typer.Argument(help="The global model: safetensors (with --arch, or a zoo model's file), "
                                               ".pt2, TorchScript, or a Hugging Face folder.")],
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    format: Annotated[str, typer.Option("--format", help="Comma-separated: table, json, sarif. One machine "
                                        "format alone goes to stdout; with --out, each to its file.")] = "table",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for check-model.json / .sarif.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files in --out.")] = False,
    data: Annotated[Path | None, typer.Option("--data", "-d", help="Your own examples (.safetensors or an image "
                                              "folder): count how many a server could copy exactly from this "
                                              "model's first layer. Nothing leaves the machine.")] = None,
    probe: Annotated[int, typer.Option("--probe", help="Examples of --data in the probe batch.", min=2,
                                       max=4096)] = 64,
    seed: SeedOpt = 0,
    fail_on_suspicious: Annotated[bool, typer.Option("--fail-on-suspicious",
                                                     help="Exit 1 on suspicious findings too.")] = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check a global model for the structures a malicious server plants (imprint rows, trap weights, class
    fishing, input-passing layers). Exit 0 clean, 1 flagged, 2 bad input."""
    formats = [f.strip() for f in format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise GleakError(f"--format takes {', '.join(FORMATS)} (comma-separated), got '{format}'")
    machine = [f for f in formats if f != "table"]
    if out is None and (len(machine) > 1 or (machine and "table" in formats)):
        raise GleakError("several formats need --out DIR (one machine format alone goes to stdout)")
    from gleak.runs.check_model import run_check_model
    from gleak.runs.inputs import ModelSpec

    report = run_check_model(ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                                       trust_remote_code=trust_remote_code), data, probe, seed)
    from gleak.report.formats.sarif import build_check

    texts = {"json": json.dumps(report.to_json(), indent=1) + "\n",
             "sarif": json.dumps(build_check(report), indent=1, allow_nan=False) + "\n"}
    if out is not None:
        from gleak.io import write_text_atomic

        for f in machine:
            write_text_atomic(out / FILES[f], texts[f], force=force)
    if "table" in formats:
        if not quiet:
            from gleak.report.formats.console import print_check_model

            print_check_model(console, report)
    elif out is None and machine:
        if machine[0] == "json":
            print_json(report.to_json())
        else:
            typer.echo(texts["sarif"], nl=False)
    flagged = report.verdict == "flagged" or (fail_on_suspicious and report.verdict == "suspicious")
    raise typer.Exit(1 if flagged else 0)
