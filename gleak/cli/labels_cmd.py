"""`gleak labels`: recovered labels per attack, scored against ground truth and the chance baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gleak.cli.common import (
    MAX_BATCH,
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    AttackOptionsOpt,
    DeviceOpt,
    FcLayerOpt,
    ForceOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    VerboseOpt,
    console,
    deferred,
    err_console,
    handle_errors,
    number,
    print_json,
)
from gleak.errors import GleakError

if TYPE_CHECKING:
    import torch

    from gleak.attacks import get_attack
    from gleak.attacks.base import AttackResult
    from gleak.attacks.plan import run_label_attacks, select_attacks
    from gleak.io import check_writable, write_text_atomic
    from gleak.metrics.labels import truth_counts
    from gleak.pipeline import labels_report, open_inputs
else:  # torch and the attacks load when the command runs, not when the CLI starts
    get_attack = deferred("gleak.attacks", "get_attack")  # the package: importing it registers every attack
    run_label_attacks = deferred("gleak.attacks.plan", "run_label_attacks")
    select_attacks = deferred("gleak.attacks.plan", "select_attacks")
    open_inputs = deferred("gleak.pipeline", "open_inputs")
    labels_report = deferred("gleak.pipeline", "labels_report")
    check_writable = deferred("gleak.io", "check_writable")
    write_text_atomic = deferred("gleak.io", "write_text_atomic")
    truth_counts = deferred("gleak.metrics.labels", "truth_counts")

SHOWN = 12


def compact(counts: torch.Tensor | list[int], limit: int = SHOWN) -> str:
    """'3×2 7×1' (class×count), the largest counts first past ``limit`` entries."""
    import torch

    pairs = [(c, int(n)) for c, n in enumerate(torch.as_tensor(counts).tolist()) if n]
    if len(pairs) > limit:
        top = sorted(pairs, key=lambda p: -p[1])[:limit]
        return " ".join(f"{c}×{n}" for c, n in sorted(top)) + f" … (+{len(pairs) - limit} classes)"
    return " ".join(f"{c}×{n}" for c, n in pairs) or "—"


def render(data: dict[str, Any], results: list[AttackResult]) -> None:
    head = (f"[bold]{data['capture']}[/]: {data['kind']}, B = {data['batch_size']}"
            + (f", m = {data['local_steps']} steps" if data["local_steps"] > 1 else "")
            + f", C = {data['num_classes']}, last layer '{data['last_layer']}'")
    console.print(head)
    if data.get("model_mode"):
        console.print(f"[dim]model: {escape(data['model_mode']['note'])}[/]", soft_wrap=True)
    if data["truth_counts"] is not None:
        console.print(f"truth: {compact(data['truth_counts'])}   [dim]chance (random guessing): iAcc "
                      f"{data['chance']['iacc']:.3f}, cAcc {data['chance']['cacc']:.3f}[/]")
    scored = data["truth_counts"] is not None
    table = Table(show_lines=False)
    table.add_column("attack", style="bold")
    table.add_column("recovered (class×count)", overflow="fold")
    table.add_column("time", justify="right")
    calibrated = any(r.confidence for r in results)
    if calibrated:
        table.add_column("90 % ±", justify="right")
        table.add_column("expected/chance", justify="right")
    if scored:
        for col in ("iAcc", "cAcc", "exact", "chance"):
            table.add_column(col, justify="right")
    reasons: dict[str, list[str]] = {}
    for r in results:
        if r.status != "ok":
            label = {"not_applicable": "[yellow]not applicable[/]", "error": "[red]error[/]"}.get(
                r.status, "[red]failed[/]")
            reasons.setdefault(f"{label}: {r.reason}", []).append(r.attack)
            table.add_row(f"[dim]{r.attack}[/]", label, "", *([""] * 2 if calibrated else []),
                          *([""] * 4 if scored else []))
            continue
        cells = [r.attack + (" [yellow]⚠[/]" if r.warnings else ""), compact(r.labels.counts), _time(r.seconds)]
        if calibrated:
            c = r.confidence or {}
            if c.get("calibrated"):
                style = "" if c["informative"] else "[red]"
                cells += [f"{c['half_width']}", f"{style}{c['expected_iacc']:.2f}/{c['chance_iacc']:.2f}"
                          + ("[/]" if style else "")]
            else:
                cells += ["—", "[dim]not calibrated[/]"]
        if scored and r.scores:
            s = r.scores
            colour = "green" if s["iacc"] >= 0.999 else ("yellow" if s["iacc"] > s["chance_iacc"] else "red")
            cells += [f"[{colour}]{s['iacc']:.3f}[/]", f"{s['cacc']:.3f}", f"{s['exact']:.3f}",
                      f"{s['chance_iacc']:.3f}"]
        table.add_row(*cells)
    console.print(table)
    soft_rows = [r for r in results if r.output is not None and r.labels.soft_label is not None]
    if soft_rows:
        render_soft_labels(data, soft_rows)
    for reason, names in reasons.items():
        console.print(f"{', '.join(names)} — {reason}", soft_wrap=True)
    for r in results:
        for w in r.warnings:
            console.print(f"[yellow]⚠ {r.attack}:[/] {w}", soft_wrap=True)


def render_soft_labels(data: dict[str, Any], rows: list[AttackResult]) -> None:
    """Soft labels of one example, one row per class (classes with mass, at most 20), truth first."""
    import torch

    truth = data.get("truth_soft_label")
    vectors = [torch.as_tensor(truth)] if truth is not None else []
    vectors += [v for r in rows if (v := r.labels.soft_label) is not None]
    mass = torch.stack([v.double().abs() for v in vectors]).max(0).values
    shown = [c for c in torch.argsort(mass, descending=True).tolist() if mass[c] > 1e-4][:20]
    table = Table(title="soft label of the example", title_justify="left")
    table.add_column("class", justify="right")
    if truth is not None:
        table.add_column("truth", justify="right")
    for r in rows:
        table.add_column(r.attack, justify="right")
    for c in sorted(shown):
        table.add_row(str(c), *[f"{float(v[c]):.5f}" for v in vectors])
    console.print(table)
    for r in rows:
        d = r.labels.diagnostics
        if d.get("augmentation") == "smoothing":
            what = f"label smoothing, class {d['class']}, ε = {d['epsilon']:.5f}"
        elif d.get("augmentation") == "mixup":
            what = f"mixup of classes {d['classes'][0]} and {d['classes'][1]}, ratio {d['ratio']:.5f}"
        else:
            what = d.get("case", "")
        line = f"{r.attack}: {what}; search: {d.get('stage', '—')}, loss {d.get('loss', float('nan')):.2e}"
        if r.scores and "soft_l1" in r.scores:
            ok = "[green]recovered[/]" if r.scores["soft_success"] else "[red]not recovered[/]"
            line += f"; L1 to truth {r.scores['soft_l1']:.2e} ({ok})"
        console.print(line, soft_wrap=True)


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


@handle_errors
def labels(
    capture: Annotated[Path, typer.Argument(help="Capture file (.safetensors).")],
    model: Annotated[Path | None, typer.Option("--model", "-M", help="Global model file.")] = None,
    attack: Annotated[list[str] | None, typer.Option("--attack", "-a", help="Attack to run (repeatable); "
                                                     "default: every applicable one.")] = None,
    aux: Annotated[Path | None, typer.Option(help="Auxiliary labelled data (.safetensors or image folder).")] = None,
    truth: Annotated[Path | None, typer.Option(help="Ground-truth file; default: NAME.truth.safetensors "
                                               "next to the capture, when present.")] = None,
    no_truth: Annotated[bool, typer.Option("--no-truth", help="Ignore any ground truth.")] = False,
    batch_size: Annotated[int | None, typer.Option("--batch-size", "-b", help="Override the capture's B.",
                                                   callback=number(1, MAX_BATCH))] = None,
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
    confidence: Annotated[int, typer.Option("--confidence", callback=number(0, 1000), help="Calibrate each attack "
                                            "on this many batches simulated from --aux with the capture's settings: "
                                            "90 % count intervals, expected vs chance iAcc (0: off).")] = 0,
    format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the JSON report here.")] = None,
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
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
    the options every attack ran with."""
    import torch

    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got '{format}'")
    from gleak.attacks.options import lookup_attack, parse_option_assignments, resolve_assignments, resolve_options

    assignments = parse_option_assignments(option or [])
    flags = {"augmentation": augmentation} if augmentation is not None else {}
    sources = {"augmentation": "--augmentation"}
    for key in flags:
        if key in assignments.get("softlabel", {}):
            raise GleakError(f"{sources[key]} and -O softlabel.{key} set the same option; give one")
    resolve_options(lookup_attack("softlabel"), flags, sources)
    resolve_assignments(assignments, task="labels")  # every -O checked before any work
    chosen = select_attacks("labels", attack)
    if output is not None:
        check_writable(output, force)
    overrides = {"name": loss, "focal_gamma": focal_gamma, "focal_alpha": focal_alpha, "temperature": temperature,
                 "label_smoothing": label_smoothing}
    inputs = open_inputs(capture, model, arch, arch_kwargs, trust_pickle, aux, truth, no_truth, fc_layer, device,
                         seed, batch_size, overrides, allow_model_mismatch)
    counts = truth_counts(inputs.truth.labels, inputs.ctx.num_classes) if inputs.truth is not None else None
    progress = (lambda name: err_console.print(f"[dim]running {name}…[/]", end="\r")) if verbose else None
    truth_soft = None
    if inputs.truth is not None and inputs.ctx.total_examples == 1:
        labels_ = inputs.truth.labels
        truth_soft = labels_[0].double() if labels_.dim() == 2 else torch.nn.functional.one_hot(
            labels_[0], inputs.ctx.num_classes).double()
    for a in chosen:
        a.configure({**(flags if a.name == "softlabel" else {}), **assignments.get(a.name, {})}, sources)
    results = run_label_attacks(inputs.ctx, chosen, counts, progress, truth_soft, confidence)
    data = labels_report(inputs, results, counts)
    data["truth_soft_label"] = truth_soft.tolist() if truth_soft is not None else None
    ran = {r.attack for r in results if r.status != "not_applicable"}  # a failed attack still used its options
    data["ignored_options"] = ([] if augmentation is None or "softlabel" in ran else
                               ["--augmentation: only softlabel uses it, and softlabel did not run"])
    data["ignored_options"] += [f"-O {name}.{key}: {name} did not run" for name, values in assignments.items()
                                if name not in ran for key in values]
    from gleak.report.model import LabelsReport

    data = LabelsReport.build(data).to_json()  # typed: a missing or mistyped key fails here
    if format == "json":
        print_json(data)
    elif not quiet or results:
        render(data, results)
        for note in data["ignored_options"]:
            console.print(f"[yellow]ignored[/] {note}", soft_wrap=True)
    if all(r.status != "ok" for r in results):
        from gleak.errors import ReportedError

        raise ReportedError("no label attack applies to this capture (reasons above / in the JSON)" if not ran else
                            "no label attack gave counts for this capture (reasons above / in the JSON)")
    if output is not None:
        write_text_atomic(output, json.dumps(data, indent=2) + "\n", force=force)
