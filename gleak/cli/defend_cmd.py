"""`gleak defend` (a capture through defenses) and `gleak defenses` (the registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gleak.cli.common import ForceOpt, QuietOpt, SeedOpt, console, handle_errors, print_json
from gleak.errors import GleakError

DefenseSpecOpt = Annotated[list[str], typer.Option("--defense", help="NAME[:KEY=VALUE,...], repeatable, applied in "
                                                   "order (e.g. --defense clip:norm=4 --defense gaussian:sigma=0.01; "
                                                   "gleak defenses lists them).")]


@handle_errors
def defend(
    capture: Annotated[Path, typer.Argument(help="The capture to defend.", show_default=False)],
    defense: DefenseSpecOpt,
    output: Annotated[Path, typer.Option("--output", "-o", help="The defended capture to write (.safetensors); a "
                                         "truth file beside the input gets one beside it, bound to the new file.")],
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Apply defenses (noise, clipping, compression, quantization, sign) to a captured contribution; gleak.defense
    records them, gleak.model.sha256 is kept."""
    from gleak.defenses import parse_defense
    from gleak.runs.defend import run_defend

    defenses = [parse_defense(spec) for spec in defense]
    run = run_defend(capture, defenses, output, seed, force)
    if not quiet:
        for record in run.capture.get("gleak.defense") or []:
            options = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("name",) and v is not None)
            console.print(f"defense {record['name']} ({options})")
        d = run.distortion
        console.print(f"relative L2 change {d['relative_l2_error']:.3g}, cosine to the original {d['cosine']:.4f}")
        console.print("wrote " + " and ".join(str(p) for p in run.written))


@handle_errors
def defenses(format: Annotated[str, typer.Option("--format", help="table or json.")] = "table") -> None:
    """List every defense: what it does, where it comes from, its options (with defaults) and the one a sweep
    varies."""
    from gleak.runs.defend import describe_defenses

    rows = describe_defenses()
    if format == "json":
        print_json([row.to_json() for row in rows])
        return
    if format != "table":
        raise GleakError(f"--format must be table or json, got '{format}'")
    from gleak.report.formats.console import print_defenses

    print_defenses(console, rows)
