"""`gleak reconstruct`: images from a capture (gradient matching, analytic or generative inversion), scored
against the truth. Parses the options, calls :func:`gleak.runs.reconstruct.run_reconstruct` under a progress
bar, writes the files and renders the typed report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gleak.cli.common import (
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    AttackOptionsOpt,
    BatchSizeOpt,
    DeviceOpt,
    FcLayerOpt,
    ForceOpt,
    LpipsNetwork,
    LpipsOpt,
    NeededModelOpt,
    NoTruthOpt,
    QuietOpt,
    SeedOpt,
    ShowTextOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    TruthOpt,
    VerboseOpt,
    check_output_folder,
    console,
    err_console,
    handle_errors,
    number,
    plain_progress,
    print_json,
)
from gleak.errors import GleakError

if TYPE_CHECKING:
    from gleak.runs.reconstruct import ReconstructRequest, ReconstructRun


class ReconSettingsBounds:
    """The bounds of the gradient-matching options (kept in step with gleak.attacks.reconstruct.base by a test;
    the CLI must not import torch to declare its flags)."""

    iterations = 10_000_000
    restarts = 1_000


@handle_errors
def reconstruct(
    capture: Annotated[Path, typer.Argument(help="Capture file (.safetensors).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the images and metrics.json.")],
    model: NeededModelOpt = None,
    attack: Annotated[str, typer.Option("--attack", "-a", help="dlg, ig, feature, fcn, fgla, rgla, or auto (fcn "
                                        "where it applies, feature for one example, else ig); on a language "
                                        "model's capture: dager (auto) or tag.")] = "auto",
    generator: Annotated[Path | None, typer.Option("--generator", "-G", help="fgla, rgla: generator file from "
                                                   "`gleak train-generator` (without one: features only).")] = None,
    labels: Annotated[str, typer.Option(help="auto (recover them), truth (the companion file) or a JSON "
                                        "report from `gleak labels`.")] = "auto",
    aux: Annotated[Path | None, typer.Option(help="Auxiliary labelled data for the label attacks.")] = None,
    truth: TruthOpt = None,
    no_truth: NoTruthOpt = False,
    iterations: Annotated[int | None, typer.Option("--iterations", "-n", help="Optimiser iterations (default: "
                                                   "300 L-BFGS steps for dlg and feature with l2, 4800 Adam "
                                                   "steps for ig and feature with cosine).",
                                                   callback=number(1, ReconSettingsBounds.iterations))] = None,
    restarts: Annotated[int | None, typer.Option(help="Random restarts; the best by loss is kept (default 1).",
                                                 callback=number(1, ReconSettingsBounds.restarts))] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="Step size > 0 (default: L-BFGS 1, Adam 0.1).",
                                             callback=number(0, low_open=True))] = None,
    tv: Annotated[float | None, typer.Option("--tv", help="Total-variation weight ≥ 0 (default: dlg 0, else "
                                             "1e-2).", callback=number(0))] = None,
    distance: Annotated[str | None, typer.Option(help="feature: l2 (L-BFGS, default) or cosine (Adam).")] = None,
    beta: Annotated[float | None, typer.Option(help="feature: weight β ≥ 0 of the feature term (default 2).",
                                               callback=number(0))] = None,
    signed: Annotated[bool, typer.Option("--signed", help="Adam on the signed gradient (Inverting Gradients' "
                                         "variant).")] = False,
    option: AttackOptionsOpt = None,
    lpips: LpipsOpt = LpipsNetwork.alex,
    batch_size: BatchSizeOpt = None,
    format: Annotated[str, typer.Option("--format", help="table or json (metrics on stdout).")] = "table",
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    fc_layer: FcLayerOpt = None,
    allow_model_mismatch: AllowMismatchOpt = False,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    show_text: ShowTextOpt = False,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Reconstruct the client's inputs; write a PNG grid, one PNG per image and metrics.json (a language model's
    capture: the recovered sequences as token ids in metrics.json and sequences.txt, decoded only with --show-text).

    The flags --iterations … --signed set the chosen attack's options, as -O ATTACK.KEY=VALUE does (`gleak attacks`
    lists them); metrics.json records the options the attack ran with."""
    if _is_text(capture, format, show_text):
        _refuse_image_options({"--generator": generator is not None, "--labels": labels != "auto",
                               "--aux": aux is not None, "--tv": tv is not None, "--distance": distance is not None,
                               "--beta": beta is not None, "--signed": signed, "--fc-layer": fc_layer is not None,
                               "--batch-size": batch_size is not None})
        _reconstruct_text(capture, output, model, attack, option, {"iterations": iterations, "restarts": restarts,
                                                                    "lr": lr}, truth, no_truth, arch, arch_kwargs,
                          trust_pickle, trust_remote_code, allow_model_mismatch, device, seed, show_text, format,
                          force, quiet)
        return
    from gleak.attacks.registry import parse_option_assignments
    from gleak.runs.inputs import InputSpec, ModelSpec
    from gleak.runs.reconstruct import FIXED_OUTPUTS, ReconstructRequest, write_outputs

    flags = {k: v for k, v in {"iterations": iterations, "restarts": restarts, "lr": lr, "tv": tv,
                                "distance": distance, "beta": beta, "signed": True if signed else None}.items()
             if v is not None}
    request = ReconstructRequest(
        inputs=InputSpec(capture=capture,
                         model=ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                                         trust_remote_code=trust_remote_code),
                         aux=aux, truth=truth, no_truth=no_truth, fc_layer=fc_layer, device=device, seed=seed,
                         batch_size=batch_size, allow_model_mismatch=allow_model_mismatch),
        attack=attack, labels=labels, generator=generator, flags=flags,
        options=parse_option_assignments(option or []), lpips=str(lpips))
    request.check()  # every option, before any file is read or written
    check_output_folder(output, force, FIXED_OUTPUTS, ("recon_*.png", "truth_*.png"))
    run = _run_with_progress(request, quiet or format == "json")
    written = write_outputs(run, output, force)
    if format == "json":
        print_json(run.report.to_json())
    else:
        from gleak.report.formats.console import print_reconstruct

        print_reconstruct(console, run.report, written)


def _is_text(capture: Path, format: str, show_text: bool) -> bool:
    """Whether the capture is a language model's (its header says so); --format and --show-text checked."""
    from gleak.io import header_value

    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got '{format}'")
    text = header_value(capture, "gleak.modality") == "text"
    if show_text and not text:
        raise GleakError("--show-text applies to a language model's capture; this one holds images")
    return text


def _refuse_image_options(given: dict[str, bool]) -> None:
    """Image-only options on a language model's capture: one line naming them."""
    flags = [flag for flag, on in given.items() if on]
    if flags:
        raise GleakError(f"{', '.join(flags)} appl{'ies' if len(flags) == 1 else 'y'} to images; a language model's "
                         "capture takes --attack, -O, --show-text and the model options")


def _reconstruct_text(capture: Path, output: Path, model: Path | None, attack: str, option: list[str] | None,
                      flags: dict[str, float | int | None], truth: Path | None, no_truth: bool, arch: str | None,
                      arch_kwargs: str | None, trust_pickle: bool, trust_remote_code: bool,
                      allow_model_mismatch: bool, device: str, seed: int, show_text: bool, format: str, force: bool,
                      quiet: bool) -> None:
    """A language model's capture: sentences (DAGER by default), metrics.json and sequences.txt."""
    from gleak.attacks.registry import parse_option_assignments
    from gleak.runs.inputs import InputSpec, ModelSpec
    from gleak.runs.text import TEXT_OUTPUTS, TextRequest, run_text, write_text_outputs

    options = {k: dict(v) for k, v in parse_option_assignments(option or []).items()}
    given = {k: v for k, v in flags.items() if v is not None}
    name = "dager" if attack == "auto" else attack
    if given and name != "tag":
        raise GleakError(f"{', '.join('--' + k for k in given)}: only the optimisation baseline (--attack tag) "
                         "takes them; DAGER is analytic")
    if given:
        options.setdefault("tag", {}).update({k: str(v) for k, v in given.items()})
    request = TextRequest(
        inputs=InputSpec(capture=capture,
                         model=ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                                         trust_remote_code=trust_remote_code),
                         truth=truth, no_truth=no_truth, device=device, seed=seed,
                         allow_model_mismatch=allow_model_mismatch),
        attack=attack, options=options, show_text=show_text)
    request.check()
    check_output_folder(output, force, TEXT_OUTPUTS)
    note = None
    if not quiet and format != "json" and err_console.is_terminal:
        def note(line: str) -> None:
            err_console.print(f"[dim]{line}[/]", end="\r")
    with plain_progress(not quiet):  # off a terminal: a line at most every 30 s
        report = run_text(request, note)
    # a run that recovered nothing writes nothing (it exits 2): no empty metrics.json left to mistake for a result
    written = write_text_outputs(report, output, force) if report.status == "ok" else []
    if format == "json":
        print_json(report.to_json())
    else:
        from gleak.report.formats.console import print_text

        print_text(console, report, written)
    if report.status != "ok":
        from gleak.errors import ReportedError

        raise ReportedError(f"{report.attack} recovered no sequence ("
                            + ("reason in the JSON report)" if format == "json" else "reason above)"))


def _run_with_progress(request: ReconstructRequest, quiet: bool) -> ReconstructRun:
    """run_reconstruct under a progress bar: steps over all restarts, best loss, time elapsed and left."""
    from rich.progress import TimeRemainingColumn

    from gleak.runs.reconstruct import ReconProgress, run_reconstruct

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn())
    # a bar only on a terminal: logs (CI) get no redraw residue, and a failed run prints just its error line (no
    # Progress at all otherwise: Rich before 14.3 prints an empty line when a disabled bar stops)
    if quiet or not err_console.is_terminal:
        with plain_progress(not quiet):  # off a terminal: a line at most every 30 s
            return run_reconstruct(request)
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("reconstruct", total=None, loss="—")

        def progress(p: ReconProgress) -> None:
            # the bar spans every restart, so that the time left covers the whole run
            bar.update(task, total=p.steps * p.restarts, completed=p.restart * p.steps + p.step,
                       loss=f"{p.loss:.3e}", description=f"{p.attack} (restart {p.restart + 1}/{p.restarts})")

        return run_reconstruct(request, progress)
