"""`gleak reconstruct`: images from a capture (gradient matching or analytic inversion), scored vs truth."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
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
from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from gleak.attacks.base import get_attack, jsonable, run_attack
    from gleak.attacks.context import Context
    from gleak.attacks.reconstruct.base import ReconstructionAttack
    from gleak.attacks.reconstruct.inputs import describe_targets, prepare
    from gleak.io import OutputSet, check_output_location, safetensors_bytes
    from gleak.pipeline import open_inputs
    from gleak.report.images import grid, png_bytes
else:  # torch, the attacks, metrics and image writers load when the command runs, not when the CLI starts
    get_attack = deferred("gleak.attacks", "get_attack")  # the package: importing it registers every attack
    run_attack = deferred("gleak.attacks", "run_attack")
    jsonable = deferred("gleak.attacks.base", "jsonable")
    describe_targets = deferred("gleak.attacks.reconstruct.inputs", "describe_targets")
    prepare = deferred("gleak.attacks.reconstruct.inputs", "prepare")
    open_inputs = deferred("gleak.pipeline", "open_inputs")
    OutputSet = deferred("gleak.io", "OutputSet")
    check_output_location = deferred("gleak.io", "check_output_location")
    safetensors_bytes = deferred("gleak.io", "safetensors_bytes")
    grid = deferred("gleak.report.images", "grid")
    png_bytes = deferred("gleak.report.images", "png_bytes")


FIXED_OUTPUTS = ("grid.png", "metrics.json", "images.safetensors", "recovered.safetensors")
MAX_ITERATIONS = 10_000_000
MAX_RESTARTS = 1_000


def choose_attack(ctx: Context, name: str) -> ReconstructionAttack:
    """The named attack, or for ``auto``: fcn where it applies, feature for one example, else ig."""
    if name != "auto":
        try:  # only reconstruction attacks are listed or suggested: a label attack is never the fix here
            return get_attack(name, task="reconstruct")  # type: ignore[return-value]
        except GleakError as e:
            raise GleakError(f"{e}, or auto") from None
    fcn = get_attack("fcn")
    if fcn.not_applicable(ctx) is None:
        return fcn  # type: ignore[return-value]
    return get_attack("feature" if ctx.batch_size == 1 else "ig")  # type: ignore[return-value]


def check_output_dir(folder: Path, force: bool) -> None:
    check_output_location(folder / "grid.png")
    if folder.exists() and not folder.is_dir():
        raise GleakError(f"{folder} exists and is not a directory")
    if folder.exists() and not force:
        taken = [p.name for p in folder.iterdir() if p.name in FIXED_OUTPUTS or
                 (p.name.startswith(("recon_", "truth_")) and p.suffix == ".png")]
        if taken:
            raise GleakError(f"{folder} already holds {', '.join(sorted(taken)[:3])}"
                             f"{' …' if len(taken) > 3 else ''}; pass --force to overwrite")


@handle_errors
def reconstruct(
    capture: Annotated[Path, typer.Argument(help="Capture file (.safetensors).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the images and metrics.json.")],
    model: Annotated[Path | None, typer.Option("--model", "-M", help="Global model file (required).")] = None,
    attack: Annotated[str, typer.Option("--attack", "-a", help="dlg, ig, feature, fcn, fgla, rgla, or auto (fcn "
                                        "where it applies, feature for one example, else ig).")] = "auto",
    generator: Annotated[Path | None, typer.Option("--generator", "-G", help="fgla, rgla: generator file from "
                                                   "`gleak train-generator` (without one: features only).")] = None,
    labels: Annotated[str, typer.Option(help="auto (recover them), truth (the companion file) or a JSON "
                                        "report from `gleak labels`.")] = "auto",
    aux: Annotated[Path | None, typer.Option(help="Auxiliary labelled data for the label attacks.")] = None,
    truth: Annotated[Path | None, typer.Option(help="Ground-truth file; default: NAME.truth.safetensors "
                                               "next to the capture, when present.")] = None,
    no_truth: Annotated[bool, typer.Option("--no-truth", help="Ignore any ground truth.")] = False,
    iterations: Annotated[int | None, typer.Option("--iterations", "-n", help="Optimiser iterations (default: "
                                                   "300 L-BFGS steps for dlg and feature with l2, 4800 Adam "
                                                   "steps for ig and feature with cosine).",
                                                   callback=number(1, MAX_ITERATIONS))] = None,
    restarts: Annotated[int | None, typer.Option(help="Random restarts; the best by loss is kept (default 1).",
                                                 callback=number(1, MAX_RESTARTS))] = None,
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
    lpips: Annotated[str, typer.Option(help="LPIPS network: alex, vgg or off.")] = "alex",
    batch_size: Annotated[int | None, typer.Option("--batch-size", "-b", help="Override the capture's B.",
                                                   callback=number(1, MAX_BATCH))] = None,
    format: Annotated[str, typer.Option("--format", help="table or json (metrics on stdout).")] = "table",
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
    """Reconstruct the client's inputs; write a PNG grid, one PNG per image and metrics.json.

    The flags --iterations … --signed set the chosen attack's options, as -O ATTACK.KEY=VALUE does (`gleak attacks`
    lists them); metrics.json records the options the attack ran with."""
    import torch

    from gleak.attacks.base import ImageOutput
    from gleak.attacks.options import parse_option_assignments, resolve_assignments
    from gleak.attacks.reconstruct.objective import DISTANCES

    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got '{format}'")
    if lpips not in ("alex", "vgg", "off"):
        raise GleakError(f"--lpips must be alex, vgg or off, got '{lpips}'")
    if distance is not None and distance not in DISTANCES:
        raise GleakError(f"--distance must be one of {', '.join(DISTANCES)}, got {shorten(distance, 40)!r}")
    assignments = parse_option_assignments(option or [])
    flags = {k: v for k, v in {"iterations": iterations, "restarts": restarts, "lr": lr, "tv": tv,
                                "distance": distance, "beta": beta, "signed": True if signed else None}.items()
             if v is not None}
    for name, values in assignments.items():
        for key in values.keys() & flags.keys():
            raise GleakError(f"--{key} and -O {name}.{key} set the same option; give one")
    resolve_assignments(assignments, task="reconstruct")  # every -O checked before any work
    if model is None:
        raise GleakError("reconstruction needs the global model (--model)")
    check_output_dir(output, force)
    inputs = open_inputs(capture, model, arch, arch_kwargs, trust_pickle, aux, truth, no_truth, fc_layer, device,
                         seed, batch_size, allow_model_mismatch=allow_model_mismatch)
    ctx = inputs.ctx
    chosen = choose_attack(ctx, attack)
    gen_file = None
    if generator is not None:
        from gleak.attacks.reconstruct.generative import GenerativeAttack
        from gleak.generator.file import load_generator

        if not isinstance(chosen, GenerativeAttack):
            raise GleakError(f"--generator is for the generative attacks (fgla, rgla); {chosen.name} does not use it")
        gen_file = load_generator(generator, ctx.device)
        chosen.options.generator = gen_file
    reason = chosen.not_applicable(ctx)
    if reason:
        raise GleakError(f"{chosen.name} does not apply: {reason}")
    typed = chosen.configure({**{k: v for k, v in flags.items() if k in chosen.Options.model_fields},
                              **assignments.get(chosen.name, {})}, {k: f"--{k}" for k in flags})
    ignored = ignored_options(chosen.name, typed.model_dump(), flags, assignments)
    started = time.perf_counter()
    prepared = prepare(ctx, labels, inputs.truth, want_feature=chosen.name in ("feature", "fcn"))
    chosen.options.targets, chosen.options.feature = prepared.targets, prepared.feature
    result = _run_with_progress(chosen, ctx, quiet or format == "json")
    if result.status != "ok" or not isinstance(result.output, ImageOutput):
        raise GleakError(f"{chosen.name} failed: {result.reason}")
    images = result.output.images
    if images is not None and not bool(torch.isfinite(images).all()):
        raise GleakError(f"{chosen.name} diverged (non-finite pixels); try a smaller --lr")
    data: dict[str, Any] = {
        "capture": str(capture), "model": str(model), "attack": chosen.name, "paper": chosen.paper,
        "options": result.options,
        "batch_size": ctx.batch_size, "labels": {"source": prepared.source,
                                                  "targets": describe_targets(prepared.targets)},
        "feature_source": prepared.feature_source, "seed": seed, "device": str(ctx.device),
        "seconds": round(result.seconds, 3), "total_seconds": None,
        "diagnostics": jsonable(result.output.diagnostics), "warnings": result.warnings, "metrics": None,
        "model_check": ctx.model_check.to_json() if ctx.model_check is not None else None,
        "model_mode": ctx.model_mode(),
        "ignored_options": ignored, "threads": torch.get_num_threads(), "baseline": None,
        "generator": gen_file.describe() if gen_file is not None else None, "output_scores": None,
        "images_written": images is not None,
    }
    data["labels"]["classes"] = prepared.targets.argmax(1).tolist()  # top class per reconstruction, in order
    if prepared.label_result is not None:
        data["labels"]["attack_seconds"] = round(prepared.label_result.seconds, 3)
    # iterations are Adam steps or L-BFGS outer steps; an L-BFGS step runs many objective evaluations
    for work, key in (("iterations_run", "iterations_per_second"), ("evaluations_run", "evaluations_per_second")):
        done = result.output.diagnostics.get(work)
        if done and result.seconds > 0:
            data[key] = round(done / result.seconds, 2)
    truth_pixels = None
    recovered = result.output.recovered
    if inputs.truth is not None and recovered:
        from gleak.pipeline import score_outputs

        data["output_scores"] = jsonable(score_outputs(ctx, inputs.truth, recovered, data["labels"]["classes"]))
    if inputs.truth is not None and images is not None:
        from gleak.pipeline import score_reconstruction
        from gleak.report.images import BASELINE_MARGIN

        scored = score_reconstruction(ctx, images, inputs.truth, lpips)
        images, truth_pixels = scored.images, scored.truth  # recon_k now pairs with truth image k
        data["metrics"] = jsonable(scored.metrics)
        floor, kind, beats = scored.baseline_psnr, scored.baseline_kind, scored.baseline_beaten
        data["baseline"] = {"psnr": round(floor, 2), "kind": kind, "margin_db": BASELINE_MARGIN, "beaten": beats,
                            "statement": None if beats else
                            f"no better than a blank/mean-image baseline ({floor:.2f} dB, {kind}): mean PSNR "
                            f"{scored.metrics['mean']['psnr']:.2f} dB is not {BASELINE_MARGIN:g} dB above it"}
    data["total_seconds"] = round(time.perf_counter() - started, 3)
    from gleak.report.model import ReconstructReport

    data = ReconstructReport.build(data).to_json()  # typed: a missing or mistyped key fails here
    written = _write(output, images, truth_pixels, data, force, recovered)
    if format == "json":
        print_json(data)
    else:
        _render(data, written)


def _run_with_progress(attack: ReconstructionAttack, ctx: Context, quiet: bool) -> Any:
    """Run the attack under a progress bar: steps over all restarts, best loss, time elapsed and left."""
    from rich.progress import TimeRemainingColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn())
    # a bar only on a terminal: logs (CI) get no redraw residue, and a failed run prints just its error line
    with Progress(*columns, console=err_console, disable=quiet or not err_console.is_terminal,
                  transient=True) as bar:
        task = bar.add_task(f"{attack.name} (restart 1)", total=None, loss="—")

        restarts = int(getattr(attack.used_options(), "restarts", 1))

        def progress(restart: int, it: int, total: int, loss: float) -> None:
            # the bar spans every restart, so that the time left covers the whole run
            bar.update(task, total=total * restarts, completed=restart * total + it, loss=f"{loss:.3e}",
                       description=f"{attack.name} (restart {restart + 1}/{restarts})")

        attack.options.progress = progress
        return run_attack(attack, ctx)


def _write(folder: Path, images: Any, truth: Any, data: dict[str, Any], force: bool,
           recovered: dict[str, Any] | None = None) -> list[Path]:
    """Every output file appears together, or (on any failure) none does.

    The grid and the per-image PNGs are enlarged alike; each grid cell is captioned with the label the
    attack used and, with ground truth, its PSNR and SSIM. What a generative attack recovers on the way
    (logits, features) goes to recovered.safetensors; without images only it and metrics.json are written."""
    from gleak.report.images import enlarge

    extra = {"gleak.kind": "recovered", "gleak.attack": data["attack"]}
    if images is None:
        with OutputSet(folder, force) as out:
            out.write_bytes("recovered.safetensors", safetensors_bytes(
                {k: v.contiguous() for k, v in (recovered or {}).items()}, extra))
            out.write_bytes("metrics.json", (json.dumps(data, indent=2) + "\n").encode())
            return out.commit()
    rows = [truth, images] if truth is not None else [images]
    m = data["metrics"]
    order = m["matching"] if m is not None else list(range(len(images)))
    classes = data["labels"].get("classes") or []
    captions = []
    for k, source in enumerate(order):
        lines = [f"label {classes[source]}" if source < len(classes) else "label ?"]
        if m is not None:
            p, q = m["psnr"][k], m["ssim"][k]  # None: not finite (identical images give +inf dB)
            lines += ["exact" if p is None else f"{p:.1f} dB", f"SSIM {_num(q, 2)}"]
        captions.append(lines)
    shown = enlarge(images.float())
    with OutputSet(folder, force) as out:
        out.write_bytes("grid.png", png_bytes(grid(rows, captions=captions)))
        for i, image in enumerate(shown):
            out.write_bytes(f"recon_{i:03d}.png", png_bytes(image))
        out.write_bytes("images.safetensors", safetensors_bytes(
            {"images": images.contiguous()}, {"gleak.kind": "reconstruction", "gleak.attack": data["attack"]}))
        if recovered:
            out.write_bytes("recovered.safetensors", safetensors_bytes(
                {k: v.contiguous() for k, v in recovered.items()}, extra))
        out.write_bytes("metrics.json", (json.dumps(data, indent=2) + "\n").encode())
        return out.commit()


def ignored_options(attack: str, used: Mapping[str, Any], flags: Mapping[str, Any],
                    assignments: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The options the user set that the chosen attack does not use (reported, never silently dropped): flags
    it does not declare, -O for other attacks, and signed for feature unless its distance is cosine."""
    idle = {"signed"} if attack == "feature" and used.get("distance") != "cosine" else set()
    notes = [f"--{key}: {attack} does not use it" for key in flags if key not in used or key in idle]
    for name, values in assignments.items():
        for key in values:
            if name != attack:
                notes.append(f"-O {name}.{key}: {attack} ran, not {name}")
            elif key in idle:
                notes.append(f"-O {name}.{key}: {attack} uses it only with distance cosine")
    return notes


def _render(data: dict[str, Any], written: list[Path]) -> None:
    console.print(f"[bold]{data['capture']}[/]: {data['attack']} ({data['paper']}), B = {data['batch_size']}, "
                  f"labels {data['labels']['source']}"
                  + (f", feature from {data['feature_source']}" if data["feature_source"] else ""), soft_wrap=True)
    if data.get("model_mode"):
        console.print(f"[dim]model: {escape(data['model_mode']['note'])}[/]", soft_wrap=True)
    d = data["diagnostics"]
    work = ""
    if d.get("iterations_run"):
        work = f", {d['iterations_run']:,} iterations"
        if d.get("evaluations_run"):
            work += f" ({d['evaluations_run']:,} objective evaluations)"
    speeds = [f"{data[key]:.1f} {unit}/s" for key, unit in (("iterations_per_second", "iterations"),
                                                            ("evaluations_per_second", "evaluations"))
              if data.get(key)]
    speed = f": {', '.join(speeds)}" if speeds else ""
    threads = f"{data['threads']} thread{'s' if data['threads'] != 1 else ''}"
    console.print(f"time {data['seconds']:.1f} s on {threads}{work}{speed}"
                  + (f", final loss {d['loss']:.3e}" if "loss" in d else ""), soft_wrap=True)
    o = data.get("output_scores")
    if o:
        parts = []
        if o.get("logit_mse") is not None:
            parts.append(f"logit MSE {o['logit_mse']:.2e}")
        if o.get("feature_cosine_mean") is not None:
            parts.append(f"feature cosine mean {o['feature_cosine_mean']:.4f} (min {o['feature_cosine_min']:.4f})")
        console.print("recovered vs true model outputs: " + ", ".join(parts), soft_wrap=True)
    if data.get("generator"):
        g = data["generator"]
        ceiling = f", held-out PSNR {g['heldout_psnr']:.2f} dB" if g.get("heldout_psnr") is not None else ""
        console.print(f"[dim]generator {escape(str(g['file']))} (layer {g['layer']}{ceiling})[/]", soft_wrap=True)
    m = data["metrics"]
    if not data.get("images_written", True):
        console.print("[yellow]no images written[/] (no generator): the recovered features are in "
                      "recovered.safetensors", soft_wrap=True)
    elif m is not None:
        table = Table(title="reconstruction vs truth (matched one-to-one)", title_justify="left")
        for col in ("image", "PSNR dB", "SSIM", "LPIPS"):
            table.add_column(col, justify="right")
        lp = m["lpips"] or [None] * len(m["psnr"])
        for i, (p, s, v) in enumerate(zip(m["psnr"], m["ssim"], lp, strict=True)):
            table.add_row(str(i), _num(p, 2), _num(s, 4), _num(v, 4))
        mean = m["mean"]
        table.add_row("[bold]mean[/]", _num(mean["psnr"], 2), _num(mean["ssim"], 4), _num(mean.get("lpips"), 4))
        console.print(table)
        if m["lpips"] is None:
            console.print(f"[yellow]LPIPS not computed:[/] {m['lpips_info'].get('unavailable')}", soft_wrap=True)
        base = data.get("baseline")
        if base is not None and base["statement"]:
            console.print(f"[bold red]{base['statement']}[/]", soft_wrap=True)
        elif base is not None:
            console.print(f"baseline ({base['kind']}): {base['psnr']:.2f} dB", soft_wrap=True)
    else:
        console.print("[dim]no ground truth: images are written unscored[/]")
    for w in data["warnings"]:
        console.print(f"[yellow]⚠[/] {w}", soft_wrap=True)
    for note in data["ignored_options"]:
        console.print(f"[yellow]ignored[/] {note}", soft_wrap=True)
    console.print(f"wrote {written[0]} and {len(written) - 1} more files in {written[0].parent}/")


def _num(value: float | None, digits: int) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}"
