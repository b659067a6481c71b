"""`gleak simulate`: run a realistic FL client on data and write a capture plus its ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gleak.cli.common import (
    MAX_BATCH,
    MAX_STEPS,
    ArchKwargsOpt,
    ArchOpt,
    DeviceOpt,
    ForceOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    VerboseOpt,
    console,
    deferred,
    handle_errors,
    number,
)
from gleak.errors import GleakError

if TYPE_CHECKING:
    from gleak.capture import truth_path_for
    from gleak.losses import LossSpec
    from gleak.metrics.labels import truth_counts
    from gleak.simulate import ClientConfig
else:  # imported on first use: the CLI starts without torch
    truth_path_for = deferred("gleak.capture", "truth_path_for")
    LossSpec = deferred("gleak.losses", "LossSpec")
    truth_counts = deferred("gleak.metrics.labels", "truth_counts")
    ClientConfig = deferred("gleak.simulate", "ClientConfig")


def parse_labels(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        labels = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise GleakError(f"--labels must be comma-separated class indices, got '{text}'") from None
    if any(c < 0 for c in labels):
        raise GleakError("--labels must be non-negative class indices")
    return labels


def _refuse_unused(*, optimizer: str, momentum: float | None, scheme: str, mu: float | None, loss: str,
                   focal_gamma: float | None, focal_alpha: float | None, mixup: bool, mixup_ratio: float | None,
                   composition: str, dirichlet_alpha: float | None) -> None:
    """An option that the configured client would not use is an error, never silently dropped."""
    unused = [
        (momentum is not None and optimizer not in ("sgdm", "nag"), "--momentum applies to --optimizer sgdm or nag"),
        (mu is not None and scheme != "fedprox", "--mu applies to --scheme fedprox"),
        ((focal_gamma is not None or focal_alpha is not None) and loss != "focal",
         "--focal-gamma/--focal-alpha apply to --loss focal"),
        (mixup_ratio is not None and not mixup, "--mixup-ratio applies with --mixup"),
        (dirichlet_alpha is not None and composition != "dirichlet",
         "--dirichlet-alpha applies to --composition dirichlet"),
    ]
    for bad, message in unused:
        if bad:
            raise GleakError(message)


@handle_errors
def simulate(
    model: Annotated[Path, typer.Option("--model", "-M", help="Global model file.")],
    data: Annotated[Path, typer.Option("--data", "-d", help="Dataset: .safetensors or an image folder.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Capture file to write (.safetensors).")],
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Examples per local step (B).",
                                            callback=number(1, MAX_BATCH))] = 8,
    local_steps: Annotated[int, typer.Option("--local-steps", "-m", help="Local steps, each on a fresh batch.",
                                             callback=number(1, MAX_STEPS))] = 1,
    scheme: Annotated[str | None, typer.Option(help="fedsgd (one gradient), fedavg or fedprox (an update). "
                                               "Default: fedsgd for one step, fedavg for more.")] = None,
    lr: Annotated[float, typer.Option("--lr", help="Client learning rate (> 0).",
                                      callback=number(0, low_open=True))] = 0.01,
    optimizer: Annotated[str, typer.Option(help="sgd, sgdm (momentum), nag (Nesterov) or adam.")] = "sgd",
    momentum: Annotated[float | None, typer.Option(help="Momentum for sgdm / nag, in [0, 1) (default 0.9).",
                                                   callback=number(0, 1, high_open=True))] = None,
    weight_decay: Annotated[float, typer.Option(help="L2 weight decay (≥ 0).", callback=number(0))] = 0.0,
    mu: Annotated[float | None, typer.Option(help="FedProx proximal weight μ > 0 (with --scheme fedprox).",
                                             callback=number(0, low_open=True))] = None,
    loss: Annotated[str, typer.Option(help="cross_entropy, focal or bce.")] = "cross_entropy",
    reduction: Annotated[str, typer.Option(help="Loss reduction over the batch: mean or sum.")] = "mean",
    focal_gamma: Annotated[float | None, typer.Option(help="Focal loss γ ≥ 0 (default 2).",
                                                      callback=number(0))] = None,
    focal_alpha: Annotated[float | None, typer.Option(help="Focal loss α > 0 (default 1).",
                                                      callback=number(0, low_open=True))] = None,
    temperature: Annotated[float, typer.Option(help="Softmax temperature τ > 0.",
                                               callback=number(0, low_open=True))] = 1.0,
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing ε in [0, 1).",
                                                   callback=number(0, 1, high_open=True))] = 0.0,
    mixup: Annotated[bool, typer.Option("--mixup", help="Mix each example with one of another class.")] = False,
    mixup_ratio: Annotated[float | None, typer.Option(help="Fixed mixup ratio r in [0, 1] (with --mixup); default "
                                                      "U(0, 1) per pair.", callback=number(0, 1))] = None,
    composition: Annotated[str, typer.Option(help="uniform, unique, unbalanced, dirichlet or explicit.")] = "uniform",
    dirichlet_alpha: Annotated[float | None, typer.Option(help="Concentration α > 0 for --composition dirichlet "
                                                          "(default 0.5).", callback=number(0, low_open=True))] = None,
    labels: Annotated[str | None, typer.Option(help="Explicit labels, e.g. '3,3,7' (B or m·B of them).")] = None,
    train_mode: Annotated[bool, typer.Option("--train-mode/--eval-mode",
                                             help="Model mode during the step (BatchNorm, Dropout).")] = True,
    defense: Annotated[list[str] | None, typer.Option("--defense", help="A defense the client applies, "
                                                      "NAME[:KEY=VALUE,...] (repeatable, in order; dpsgd trains with "
                                                      "DP-SGD through Opacus; gleak defenses lists them).")] = None,
    no_truth: Annotated[bool, typer.Option("--no-truth", help="Do not write the ground-truth file.")] = False,
    device: DeviceOpt = "cpu",
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Simulate a client step (or steps) on real data; write a capture and its ground truth."""
    from gleak.defenses import parse_defense

    defenses = tuple(parse_defense(spec) for spec in defense or [])
    label_list = parse_labels(labels)
    scheme = scheme or ("fedsgd" if local_steps == 1 else "fedavg")
    _refuse_unused(optimizer=optimizer, momentum=momentum, scheme=scheme, mu=mu, loss=loss, focal_gamma=focal_gamma,
                   focal_alpha=focal_alpha, mixup=mixup, mixup_ratio=mixup_ratio, composition=composition,
                   dirichlet_alpha=dirichlet_alpha)
    config = ClientConfig(
        batch_size=batch_size, local_steps=local_steps, scheme=scheme,
        learning_rate=lr, optimizer=optimizer, momentum=0.9 if momentum is None else momentum,
        weight_decay=weight_decay, mu=mu or 0.0,
        loss=LossSpec(loss, reduction, temperature, label_smoothing, 2.0 if focal_gamma is None else focal_gamma,
                      1.0 if focal_alpha is None else focal_alpha),
        mixup=mixup, mixup_ratio=mixup_ratio,
        composition="explicit" if label_list and composition == "uniform" else composition,
        labels=label_list, dirichlet_alpha=0.5 if dirichlet_alpha is None else dirichlet_alpha,
        train_mode=train_mode, seed=seed, defenses=defenses,
    )
    from gleak.runs.inputs import ModelSpec
    from gleak.runs.simulate import SimulateRequest, run_simulate

    run = run_simulate(SimulateRequest(ModelSpec(model, arch, arch_kwargs, trust_pickle), data, config, output,
                                       no_truth, device, force))
    capture, truth, truth_path = run.capture, run.truth, truth_path_for(output)
    if not quiet:
        counts = truth_counts(truth.labels, capture.num_classes or 0)
        shown = ", ".join(f"{c}×{int(n)}" for c, n in enumerate(counts.tolist()) if n)
        console.print(f"[bold]{capture.kind}[/] of {config.local_steps} step(s) × B = {config.batch_size} "
                      f"({config.scheme}, {config.optimizer}, lr {config.learning_rate:g})")
        console.print(f"labels (class×count): {shown}")
        for record in capture.get("gleak.defense") or []:
            options = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("name", "seed") and v is not None)
            console.print(f"defense {record['name']}" + (f" ({options})" if options else ""))
        from gleak.report.privacy import describe_capture

        dp_text = describe_capture(capture.meta)
        if dp_text is not None:
            console.print(f"DP-SGD: {dp_text}", highlight=False, markup=False)
        console.print(f"wrote {output}" + ("" if no_truth else f" and {truth_path}"))
