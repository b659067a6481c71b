"""`gleak labels`: recovered labels per attack, scored against ground truth and the chance baseline.

Parses the options, calls :func:`gleak.runs.labels.run_labels`, renders the typed report (console table or
JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gleak.cli.common import (
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    AttackOptionsOpt,
    BatchSizeOpt,
    DeviceOpt,
    FcLayerOpt,
    ForceOpt,
    MaxMemoryOpt,
    ModelOpt,
    NoTruthOpt,
    QuietOpt,
    SeedOpt,
    ShowTextOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    TruthOpt,
    VerboseOpt,
    console,
    err_console,
    handle_errors,
    number,
    plain_progress,
    print_json,
)
from gleak.errors import GleakError

if TYPE_CHECKING:
    from gleak.report.model import LabelsReport, TokensReport


@handle_errors
def labels(
    capture: Annotated[Path, typer.Argument(help="Capture file (.safetensors).")],
    model: ModelOpt = None,
    attack: Annotated[list[str] | None, typer.Option("--attack", "-a", help="Attack to run (repeatable); "
                                                     "default: every applicable one.")] = None,
    aux: Annotated[Path | None, typer.Option(help="Auxiliary labelled data (.safetensors or image folder).")] = None,
    truth: TruthOpt = None,
    no_truth: NoTruthOpt = False,
    batch_size: BatchSizeOpt = None,
    loss: Annotated[str | None, typer.Option(help="Override the capture's loss: cross_entropy, focal, bce.")] = None,
    focal_gamma: Annotated[float | None, typer.Option(help="Override focal γ (≥ 0).", callback=number(0))] = None,
    focal_alpha: Annotated[float | None, typer.Option(help="Override focal α (> 0).",
                                                      callback=number(0, low_open=True))] = None,
    temperature: Annotated[float | None, typer.Option(help="Override the softmax temperature τ (> 0).",
                                                      callback=number(0, low_open=True))] = None,
    label_smoothing: Annotated[float | None, typer.Option(help="Override label smoothing ε (0 ≤ ε < 1).",
                                                          callback=number(0, 1, high_open=True))] = None,
    augmentation: Annotated[str | None, typer.Option(help="softlabel: auto (try both, the default), smoothing or "
                                                     "mixup (the option softlabel.augmentation).")] = None,
    option: AttackOptionsOpt = None,
    max_memory: MaxMemoryOpt = None,
    confidence: Annotated[int, typer.Option("--confidence", callback=number(0, 1000), help="Calibrate each attack "
                                            "on this many batches simulated from --aux with the capture's settings: "
                                            "90 % count intervals, expected vs chance iAcc (0: off).")] = 0,
    format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the JSON report here (also when "
                                                "no attack answers: it says why).")] = None,
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    show_text: ShowTextOpt = False,
    fc_layer: FcLayerOpt = None,
    allow_model_mismatch: AllowMismatchOpt = False,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Recover the labels behind a capture with every applicable attack; score them when truth is known.

    Tune an attack with -O ATTACK.KEY=VALUE (`gleak attacks` lists each attack's options); the report records
    the options every attack ran with. Exit 0 when an attack answered (counts, or the calibrated selector's
    abstention where no attack beats chance); 2 when none could (bad input)."""
    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got '{format}'")
    from gleak.attacks.registry import parse_option_assignments
    from gleak.io import check_writable, write_text_atomic
    from gleak.runs.inputs import InputSpec, ModelSpec
    from gleak.runs.labels import LabelsRequest, no_counts_reason, run_labels

    request = LabelsRequest(
        inputs=InputSpec(capture=capture,
                         model=ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                                         trust_remote_code=trust_remote_code),
                         aux=aux, truth=truth, no_truth=no_truth, fc_layer=fc_layer, device=device, seed=seed,
                         batch_size=batch_size,
                         loss_overrides={"name": loss, "focal_gamma": focal_gamma, "focal_alpha": focal_alpha,
                                         "temperature": temperature, "label_smoothing": label_smoothing},
                         allow_model_mismatch=allow_model_mismatch, max_memory=max_memory),
        attacks=attack, flags={"augmentation": augmentation} if augmentation is not None else {},
        options=parse_option_assignments(option or []), confidence=confidence, show_text=show_text)
    request.check()  # every option and attack name, before any file is read or written
    if output is not None:
        check_writable(output, force)
    progress = (lambda name: err_console.print(f"[dim]running {name}…[/]", end="\r")) if verbose else None
    with plain_progress(not quiet):  # off a terminal: a line at most every 30 s
        report = run_labels(request, progress)
    data = report.to_json()
    why = no_counts_reason(report)
    if output is not None:  # also when no attack answered: it says why; before stdout: a failed write leaves one
        write_text_atomic(output, json.dumps(data, indent=2) + "\n", force=force)  # document (the error) there
    if format == "json":
        print_json(data)
    elif not quiet or report.results:
        _print(report)
    if why is not None:
        from gleak.errors import ReportedError

        raise ReportedError(f"{why} ({_where_reasons(format, output)})")


def _where_reasons(format: str, output: Path | None) -> str:
    """Where the reasons of a run that recovered nothing are: the JSON report (stdout, the -o file) or the table."""
    if output is None:
        return "reasons in the JSON report" if format == "json" else "reasons above"
    shown = "in the JSON report, also written to" if format == "json" else "above and in the JSON report"
    return f"reasons {shown} {output}"


def _print(report: LabelsReport | TokensReport) -> None:
    """The console's table: label counts, or a language model's recovered tokens (ids and scores, never text)."""
    from gleak.report.formats.console import print_labels, print_tokens
    from gleak.report.model import TokensReport

    if isinstance(report, TokensReport):
        print_tokens(console, report)
    else:
        print_labels(console, report)
