"""`gleak train-generator`: train the feature-to-image decoder of the generative attacks (fgla, rgla) on
auxiliary data, for one model, and write it as a generator file bound to that model's weights and last layer."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gleak.cli.common import (
    MAX_BATCH,
    ArchKwargsOpt,
    ArchOpt,
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
    resolve_device,
    threads_in_use,
)
from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    import torch

    from gleak.data import Dataset, load_dataset
    from gleak.generator.file import save_generator
    from gleak.generator.train import TrainResult, TrainSettings, aux_features, train_decoder
    from gleak.io import check_writable, safetensors_kind, show, tensors_sha256
    from gleak.models import find_last_layer, load_model
else:  # imported on first use: the CLI starts without torch
    safetensors_kind = deferred("gleak.io", "safetensors_kind")
    load_dataset = deferred("gleak.data", "load_dataset")
    save_generator = deferred("gleak.generator.file", "save_generator")
    TrainSettings = deferred("gleak.generator.train", "TrainSettings")
    aux_features = deferred("gleak.generator.train", "aux_features")
    train_decoder = deferred("gleak.generator.train", "train_decoder")
    check_writable = deferred("gleak.io", "check_writable")
    show = deferred("gleak.io", "show")
    tensors_sha256 = deferred("gleak.io", "tensors_sha256")
    find_last_layer = deferred("gleak.models", "find_last_layer")
    load_model = deferred("gleak.models", "load_model")

MAX_EPOCHS = 100_000
MAX_FINETUNE_EPOCHS = 10_000
LOSSES = ("mse", "rgla")
# what other gleak files are, by their gleak.kind, when one is passed as --aux
OTHER_KINDS = {"gradient": "a capture", "update": "a capture", "truth": "a ground-truth file",
               "generator": "a generator file"}


@handle_errors
def train_generator(
    model: Annotated[Path, typer.Option("--model", "-M", help="Global model file; the generator is bound to its "
                                        "weights and last layer.")],
    aux: Annotated[Path, typer.Option("--aux", help="Auxiliary images: a .safetensors data set or an image folder "
                                      "(one sub-folder per class).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Generator file to write (.safetensors).")],
    epochs: Annotated[int, typer.Option("--epochs", "-e", help="Training epochs on pixel MSE (≥ 1).",
                                        callback=number(1, MAX_EPOCHS))] = 10,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Images per training step (≥ 1).",
                                            callback=number(1, MAX_BATCH))] = 64,
    lr: Annotated[float, typer.Option("--lr", help="Adam learning rate (> 0).",
                                      callback=number(0, 10, low_open=True))] = 1e-3,
    holdout: Annotated[float, typer.Option(help="Share of the auxiliary images held out to measure the decoder, "
                                           "in [0, 1).", callback=number(0, 1, high_open=True))] = 0.1,
    width: Annotated[int, typer.Option(help="Decoder channels at its last up-sampling stage (4 … 1024).",
                                       callback=number(4, 1024))] = 32,
    res_blocks: Annotated[int, typer.Option("--res-blocks", help="Residual blocks per up-sampling stage (0 … 8).",
                                            callback=number(0, 8))] = 1,
    loss: Annotated[str, typer.Option(help="mse (FGLA: pixel MSE) or rgla (then fine-tune on −PSNR + SSIM + "
                                      "LPIPS, as RGLA does).")] = "mse",
    finetune_epochs: Annotated[int | None, typer.Option("--finetune-epochs", help="Fine-tuning epochs with --loss "
                                                        "rgla (default 3).",
                                                        callback=number(1, MAX_FINETUNE_EPOCHS))] = None,
    format: Annotated[str, typer.Option("--format", help="table or json (summary on stdout).")] = "table",
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    fc_layer: FcLayerOpt = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train the feature-to-image generator of the generative attacks on auxiliary data, for one model.

    The decoder learns to turn the model's last-layer input (an image's feature) back into the image.

    The file records the model's weights hash and last layer, the data's hash and the held-out MSE and PSNR.

    The same seed gives the same file (on the CPU, with the same thread count)."""
    from pydantic import ValidationError

    started = time.perf_counter()
    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got {shorten(format, 40)!r}")
    if loss not in LOSSES:
        raise GleakError(f"--loss must be mse or rgla, got {shorten(loss, 40)!r}")
    if finetune_epochs is not None and loss != "rgla":
        raise GleakError("--finetune-epochs applies to --loss rgla")
    try:
        settings = TrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, holdout=holdout, width=width,
                                 res_blocks=res_blocks, loss=loss, seed=seed,
                                 **({} if finetune_epochs is None else {"finetune_epochs": finetune_epochs}))
    except ValidationError as e:  # the option callbacks check the same bounds; this is a second line of defence
        raise GleakError(f"invalid training settings: {shorten(str(e).splitlines()[-1].strip(), 200)}") from None
    check_output(output, force, model, aux)  # before any work: a refused run trains nothing
    where = resolve_device(device)
    loaded = load_model(model, arch, arch_kwargs, trust_pickle)
    data = load_aux(aux)
    # a torchvision architecture's 3×224×224 is a default, not a constraint (as `gleak simulate` treats it)
    fixed = None if (loaded.arch or "").startswith("torchvision:") else loaded.input_shape
    if fixed is not None and tuple(fixed) != data.input_shape:
        raise GleakError(f"auxiliary data {show(aux)} has images of {list(data.input_shape)}, the model takes "
                         f"{list(fixed)}")
    layer = find_last_layer(loaded.module, None, input_shape=fixed or data.input_shape, override=fc_layer)
    data.check_classes(layer.num_classes)
    notes: list[str] = []
    if all(m == 0 for m in data.mean) and all(s == 1 for s in data.std):
        notes.append("the auxiliary data records no normalisation: the model saw raw pixels in [0, 1]")
    module = loaded.module.to(where).eval()
    show_bar = not quiet and err_console.is_terminal
    result = _train(module, layer, data, settings, where, show_bar, verbose and not quiet)
    notes += result.notes
    if result.heldout_examples == 0:
        notes.append("--holdout 0: no held-out images, so no held-out MSE or PSNR")
    elif (result.heldout_psnr is not None and result.baseline_psnr is not None
          and result.heldout_psnr <= result.baseline_psnr):
        notes.append(f"held-out PSNR {result.heldout_psnr:.2f} dB is not above the mean-image baseline "
                     f"({result.baseline_psnr:.2f} dB): the decoder is no better than predicting the mean image yet "
                     "(more epochs or more auxiliary images may help)")
    if where.type == "cuda":
        notes.append("trained on CUDA: GPU kernels are not bit-for-bit deterministic, so the same seed may give "
                      "slightly different weights")
    aux_sha = tensors_sha256({"images": data.images, "labels": data.labels})
    # the hash captures record as gleak.model.sha256 (computed here for a loader that does not give it)
    model_sha = loaded.weights_sha256 or tensors_sha256(loaded.module.state_dict())
    train_meta: dict[str, Any] = {"epochs": settings.epochs, "batch_size": settings.batch_size, "lr": settings.lr,
                                  "loss": settings.loss, "seed": settings.seed, "holdout": settings.holdout}
    if settings.loss == "rgla":
        train_meta["finetune_epochs"] = settings.finetune_epochs
    train_meta.update(result.summary())
    written = save_generator(output, result.decoder, model_sha256=model_sha, layer=layer.name,
                             mean=data.mean, std=data.std, aux_sha256=aux_sha, aux_examples=len(data),
                             aux_source=data.source or aux.name, train=train_meta, force=force)
    report = _report(written, model, model_sha, layer, aux, aux_sha, data, settings, result, where,
                     notes, time.perf_counter() - started)
    if format == "json":
        print_json(report)
    else:  # --quiet too: the summary is the command's result
        _render(report)


def check_output(output: Path, force: bool, model: Path, aux: Path) -> None:
    """Refuse an existing output without --force, an unwritable place, and (even with --force) the model or the
    auxiliary data itself."""
    for path, what in ((model, "the model"), (aux, "the auxiliary data")):
        try:
            same = output.exists() and path.exists() and os.path.samefile(output, path)
        except OSError:
            same = False
        if same:
            raise GleakError(f"--output {show(output)} is {what}; write the generator to another file")
    check_writable(output, force)


def load_aux(path: Path) -> Dataset:
    """The auxiliary data set; another gleak file (a capture, a ground truth, a generator) is named as such."""
    try:
        return load_dataset(path)
    except GleakError:
        kind = safetensors_kind(path)
        if kind in OTHER_KINDS:
            raise GleakError(f"--aux {show(path)} is {OTHER_KINDS[kind]} (gleak.kind={kind}), not auxiliary "
                             "data: pass images and labels (a .safetensors data set with 'images' and 'labels', or "
                             "an image folder)") from None
        raise


def _train(module: Any, layer: Any, data: Dataset, settings: TrainSettings, device: torch.device, show_bar: bool,
           verbose: bool) -> TrainResult:
    """Features of the auxiliary images, then the decoder's training under a progress bar (on a terminal) or,
    with -v, one plain line per epoch on stderr."""
    from rich.progress import TimeRemainingColumn

    total = settings.epochs + (settings.finetune_epochs if settings.loss == "rgla" else 0)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("loss {task.fields[loss]}"),
               TextColumn("held-out MSE {task.fields[held]}"), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn())
    with Progress(*columns, console=err_console, disable=not show_bar, transient=True) as bar:
        task = bar.add_task(f"features of {len(data)} images", total=None, loss="—", held="—")
        features = aux_features(module, layer, data, device)
        bar.update(task, total=total, completed=0, description=f"epoch 0/{settings.epochs}")
        done = 0

        def on_epoch(phase: str, epoch: int, epochs: int, loss: float, held: float | None) -> None:
            nonlocal done
            done += 1
            what = f"epoch {epoch}/{epochs}" if phase == "mse" else f"{phase} fine-tune {epoch}/{epochs}"
            shown = "—" if held is None else f"{held:.3e}"
            bar.update(task, completed=done, description=what, loss=f"{loss:.3e}", held=shown)
            if verbose:
                err_console.print(f"{what}: train loss {loss:.4e}, held-out MSE {shown}", markup=False,
                                  highlight=False, soft_wrap=True)

        return train_decoder(features, data.images, settings, device, on_epoch)


def _report(written: Path, model: Path, model_sha: str, layer: Any, aux: Path, aux_sha: str, data: Dataset,
            settings: TrainSettings, result: TrainResult, device: torch.device, notes: list[str],
            total_seconds: float) -> dict[str, Any]:
    """The run's summary (the JSON printed with --format json; the table renders the same)."""
    from gleak import __version__

    def num(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)

    beaten = None
    if result.heldout_psnr is not None and result.baseline_psnr is not None:
        beaten = result.heldout_psnr > result.baseline_psnr
    return {
        "schema_version": "1", "tool": "gleak", "gleak_version": __version__, "report": "train-generator",
        "file": str(written), "model": str(model), "model_sha256": model_sha, "layer": layer.name,
        "feature_dim": int(layer.feature_dim), "num_classes": int(layer.num_classes),
        "aux": str(aux), "aux_sha256": aux_sha, "image_shape": list(data.input_shape),
        "mean": list(data.mean), "std": list(data.std),
        "examples": {"total": len(data), "train": result.train_examples, "heldout": result.heldout_examples},
        "settings": settings.model_dump(exclude=set() if settings.loss == "rgla" else {"finetune_epochs",
                                                                                       "finetune_lr"}),
        "train_loss": num(result.train_loss, 8), "train_mse": num(result.train_mse, 8),
        "heldout_mse": num(result.heldout_mse, 8), "heldout_psnr": num(result.heldout_psnr, 4),
        "baseline_psnr": num(result.baseline_psnr, 4), "baseline_beaten": beaten,
        "seconds": round(result.seconds, 3), "total_seconds": round(total_seconds, 3),
        "threads": threads_in_use(), "device": str(device),
        "history": [{**h, "loss": num(h["loss"], 8), "heldout_mse": num(h["heldout_mse"], 8)}
                    for h in result.history],
        "notes": notes,
    }


def _render(r: dict[str, Any]) -> None:
    s = r["settings"]
    ex = r["examples"]
    train = f"{s['epochs']} epoch{'s' if s['epochs'] != 1 else ''} on pixel MSE"
    if s["loss"] == "rgla":
        train += f" + {s['finetune_epochs']} rgla fine-tune"
    train += f" (batch {s['batch_size']}, lr {s['lr']:g}, seed {s['seed']}): final train loss {r['train_loss']:.4e}"
    if r["heldout_psnr"] is not None:
        held = f"MSE {r['heldout_mse']:.4e}, PSNR {r['heldout_psnr']:.2f} dB"
        if r["baseline_psnr"] is not None:
            held += f" (mean-image baseline {r['baseline_psnr']:.2f} dB)"
    else:
        held = "—"
    threads = f"{r['threads']} thread{'s' if r['threads'] != 1 else ''}"
    rows = [
        ("wrote", r["file"]),
        ("model", f"{r['model']} (weights sha256 {r['model_sha256'][:12]}…)"),
        ("layer", f"{r['layer']}: {r['feature_dim']} features → {r['num_classes']} classes"),
        ("images", f"{r['image_shape']} from {r['aux']}: {ex['train']} train, {ex['heldout']} held out"),
        ("training", train),
        ("held-out", held),
        ("time", f"{r['seconds']:.1f} s training ({r['total_seconds']:.1f} s in all) on {r['device']}, {threads}"),
    ]
    for key, value in rows:
        console.print(f"[bold]{key:<9}[/] {escape(value)}", soft_wrap=True)
    for note in r["notes"]:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
