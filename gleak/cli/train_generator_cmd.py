"""`gleak train-generator`: train the feature-to-image decoder of the generative attacks (fgla, rgla) on
auxiliary data, for one model, and write it as a generator file bound to that model's weights and last layer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
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
    TrustRemoteCodeOpt,
    VerboseOpt,
    check_output_folder,
    console,
    deferred,
    err_console,
    handle_errors,
    number,
    print_json,
)
from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from gleak.generator.train import TrainSettings
    from gleak.report.model import TrainGeneratorReport
    from gleak.runs.train_generator import TrainGeneratorRequest
else:  # imported on first use: the CLI starts without torch
    TrainSettings = deferred("gleak.generator.train", "TrainSettings")

MAX_EPOCHS = 100_000
MAX_FINETUNE_EPOCHS = 10_000
# what other gleak files are, by their gleak.kind, when one is passed as --aux

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
    trust_remote_code: TrustRemoteCodeOpt = False,
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

    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got {shorten(format, 40)!r}")
    from gleak.errors import choose
    from gleak.generator.train import LOSSES

    decoder_loss = choose(loss, LOSSES, "--loss")
    if finetune_epochs is not None and loss != "rgla":
        raise GleakError("--finetune-epochs applies to --loss rgla")
    try:
        settings = TrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, holdout=holdout, width=width,
                                 res_blocks=res_blocks, loss=decoder_loss, seed=seed,
                                 **({} if finetune_epochs is None else {"finetune_epochs": finetune_epochs}))
    except ValidationError as e:  # the option callbacks check the same bounds; this is a second line of defence
        raise GleakError(f"invalid training settings: {shorten(str(e).splitlines()[-1].strip(), 200)}") from None
    # before any work: a refused run trains nothing (and never overwrites its own inputs)
    check_output_folder(output.parent, force, [output.name], inputs={"the model": model, "the auxiliary data": aux})
    from gleak.runs.inputs import ModelSpec
    from gleak.runs.train_generator import TrainGeneratorRequest

    request = TrainGeneratorRequest(
        model=ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                        trust_remote_code=trust_remote_code), aux=aux,
        output=output, settings=settings, fc_layer=fc_layer, device=device, force=force)
    report = _run_with_progress(request, not quiet and err_console.is_terminal, verbose and not quiet)
    if format == "json":
        print_json(report.to_json())
    else:  # --quiet too: the summary is the command's result
        from gleak.report.formats.console import print_train_generator

        print_train_generator(console, report)


class _NoBar:
    """Stands in for a Rich Progress when no bar is shown (its updates do nothing)."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: Any, **kwargs: Any) -> Any:
        return 0

    def update(self, *args: Any, **kwargs: Any) -> None:
        return None


def _run_with_progress(request: TrainGeneratorRequest, show_bar: bool, verbose: bool) -> TrainGeneratorReport:
    """run_train_generator under a progress bar (on a terminal) or, with -v, one plain line per epoch on stderr."""
    from rich.progress import TimeRemainingColumn

    from gleak.runs.train_generator import run_train_generator

    settings = request.settings
    total = settings.epochs + (settings.finetune_epochs if settings.loss == "rgla" else 0)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("loss {task.fields[loss]}"),
               TextColumn("held-out MSE {task.fields[held]}"), TimeElapsedColumn(), TextColumn("eta"),
               TimeRemainingColumn())
    # no Progress without a bar: Rich before 14.3 prints an empty line when a disabled bar stops
    with (Progress(*columns, console=err_console, transient=True) if show_bar else _NoBar()) as bar:
        task = bar.add_task("features", total=None, loss="—", held="—")
        done = 0

        def on_features(count: int) -> None:
            bar.update(task, description=f"features of {count} images")

        def on_epoch(phase: str, epoch: int, epochs: int, loss: float, held: float | None) -> None:
            nonlocal done
            done += 1
            what = f"epoch {epoch}/{epochs}" if phase == "mse" else f"{phase} fine-tune {epoch}/{epochs}"
            shown = "—" if held is None else f"{held:.3e}"
            bar.update(task, total=total, completed=done, description=what, loss=f"{loss:.3e}", held=shown)
            if verbose:
                err_console.print(f"{what}: train loss {loss:.4e}, held-out MSE {shown}", markup=False,
                                  highlight=False, soft_wrap=True)

        return run_train_generator(request, on_features, on_epoch)
