"""`gleak sweep`: leakage against defense strength, over simulated clients; sweep.json, sweep.md and plots in -o DIR.

Parses the options, calls :func:`gleak.runs.sweep.run_sweep`, writes its report with
:func:`gleak.report.sweep_io.write_sweep` and prints a summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gleak.cli.common import (
    MAX_BATCH,
    MAX_STEPS,
    ArchKwargsOpt,
    ArchOpt,
    AttackOptionsOpt,
    DeviceOpt,
    ForceOpt,
    JobsOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    VerboseOpt,
    check_output_folder,
    console,
    err_console,
    flag_origin,
    handle_errors,
    number,
    parse_jobs,
)

if TYPE_CHECKING:
    from gleak.report.model import SweepReport
    from gleak.runs.sweep import SweepRequest

SWEEP_DEFENSE_HELP = ("A defense, the options it keeps fixed and the values of its strength option: the syntax "
                      "and examples are above. Repeatable, one per defense.")


@handle_errors
def sweep(
    ctx: typer.Context,
    model: Annotated[Path, typer.Option("--model", "-M", help="Global model file.")],
    data: Annotated[Path, typer.Option("--data", "-d", help="The clients' data: .safetensors or an image folder.")],
    defense: Annotated[list[str], typer.Option("--defense", help=SWEEP_DEFENSE_HELP)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for sweep.json, sweep.md, one plot per "
                                         "defense (<defense>.png, .svg) and privacy-utility.png / .svg; new or "
                                         "empty unless --force.")],
    attack: Annotated[list[str] | None, typer.Option("--attack", "-a", help="Attack to run (repeatable): label "
                                                     "attacks, calibrated (needs --aux), reconstruction (dlg, ig, "
                                                     "feature, fcn; fgla / rgla with --generator). Default: the "
                                                     "default label attacks, and calibrated with --aux.")] = None,
    aux: Annotated[Path | None, typer.Option(help="Auxiliary labelled data: calibrates the calibrated selector and "
                                             "draws the distractors of the reconstructions' identification "
                                             "lineups (without it reconstructions are scored by PSNR).")] = None,
    generator: Annotated[Path | None, typer.Option(help="Image generator file for fgla / rgla (gleak "
                                                   "train-generator).")] = None,
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Examples per local step (B).",
                                            callback=number(1, MAX_BATCH))] = 8,
    local_steps: Annotated[int, typer.Option("--local-steps", "-m", help="Local steps (1: a FedSGD gradient; more: "
                                             "a FedAvg update).", callback=number(1, MAX_STEPS))] = 1,
    trials: Annotated[int, typer.Option("--trials", "-n", help="Simulated client batches per point: the same ones "
                                        "at every defense and strength.", callback=number(1, 10_000))] = 5,
    iterations: Annotated[int | None, typer.Option("--iterations", help="Iteration bound of the reconstruction "
                                                   "attacks that have one (a sweep runs them at every point of "
                                                   "every trial; default 200).", callback=number(1, 100_000))] = None,
    confidence: Annotated[int, typer.Option("--confidence", help="Batches simulated from --aux to calibrate the "
                                            "calibrated selector.", callback=number(4, 1000))] = 24,
    utility: Annotated[str, typer.Option("--utility", help="What a defense costs: cosine (the defended contribution "
                                         "against the clean one: cosine and relative L2 error, cheap) or accuracy "
                                         "(also train the model under each point's defense, --train-rounds × "
                                         "--train-steps, and measure its test accuracy: a few seconds per point).",
                                         case_sensitive=False)] = "cosine",
    train_rounds: Annotated[int, typer.Option("--train-rounds", help="--utility accuracy: FedAvg rounds R; each "
                                              "adds the client's (defended) update to the model.",
                                              callback=number(1, 100_000))] = 20,
    train_steps: Annotated[int, typer.Option("--train-steps", help="--utility accuracy: local SGD steps m per round "
                                             "(of --batch-size examples).", callback=number(1, MAX_STEPS))] = 10,
    train_lr: Annotated[float, typer.Option("--train-lr", help="--utility accuracy: the client's SGD learning "
                                            "rate.")] = 0.1,
    eval_data: Annotated[Path | None, typer.Option("--eval-data", help="--utility accuracy: the test set (the "
                                                   "formats of --data); default: a seeded 20 % of --data, held "
                                                   "out of training.")] = None,
    option: AttackOptionsOpt = None,
    jobs: JobsOpt = "auto",
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Measure leakage against defense strength: simulate clients on real data, apply each defense at each strength
    (and none), attack, score against the truth; a table, plots and sweep.json.

    --defense NAME[:KEY=VALUE,...]=V1,V2,... names a defense, the options it
    keeps fixed and the values of its strength option (gleak defenses marks
    it). The values are the text after the last '=' when it is a list of
    numbers and what precedes it is a whole NAME[:KEY=VALUE,...]; without
    values, one point (sign has no strength). For example:
      --defense gaussian=1e-3,1e-2,1e-1
      --defense topk:scope=global=0.9,0.99
      --defense dpsgd:epsilon=0.5,1,2            (target ε)
      --defense dpsgd:max_grad_norm=1=0.5,1,2    (noise multiplier)"""
    from gleak.attacks.registry import parse_option_assignments
    from gleak.report.sweep_io import MARKDOWN_FILE, REPORT_FILE, write_sweep
    from gleak.runs.inputs import ModelSpec
    from gleak.runs.sweep import SweepRequest

    request = SweepRequest(
        model=ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                        trust_remote_code=trust_remote_code), data=data,
        defenses=tuple(defense),
        attacks=tuple(attack or ()), aux=aux, generator=generator, options=parse_option_assignments(option or []),
        batch_size=batch_size, local_steps=local_steps, trials=trials, seed=seed, iterations=iterations,
        confidence=confidence, jobs=parse_jobs(jobs, flag_origin(ctx, "jobs", "--jobs")), device=device,
        utility=utility.lower(),
        train_rounds=train_rounds, train_steps=train_steps, train_lr=train_lr, eval_data=eval_data)
    request.check()  # every spec, attack and option, before any file is read
    check_output_folder(output, force, [REPORT_FILE, MARKDOWN_FILE], ["*"])  # a new or empty folder, or --force
    report = _run(request, show=not quiet)
    written = write_sweep(report, output, force)
    if not quiet:
        from gleak.report.sweep_plots import print_summary

        print_summary(console, report)
        console.print(f"wrote {len(written)} files in {escape(str(output))}: {REPORT_FILE}, {MARKDOWN_FILE}, "
                      f"{len(report.defenses)} defense plot(s) and the privacy–utility plot (PNG, SVG)",
                      soft_wrap=True)
    elif report.notices:
        for notice in report.notices:
            err_console.print(f"notice: {escape(notice)}", soft_wrap=True)


def _run(request: SweepRequest, show: bool) -> SweepReport:
    """run_sweep under a Rich progress bar on a terminal; nothing on a pipe."""
    from gleak.runs.sweep import run_sweep

    if not show or not err_console.is_terminal:
        return run_sweep(request)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, total=total, completed=done, description=escape(what))

        return run_sweep(request, update)
