"""`gleak simulate`: run a realistic FL client on data and write a capture plus its ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gleak.cli.common import (
    MAX_BATCH,
    MAX_LENGTH,
    MAX_STEPS,
    ArchKwargsOpt,
    ArchOpt,
    DeviceOpt,
    ForceOpt,
    QuietOpt,
    SeedOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    VerboseOpt,
    console,
    err_console,
    handle_errors,
    number,
    plain_progress,
)
from gleak.errors import GleakError

if TYPE_CHECKING:
    from gleak.runs.simulate import SimulateRequest, SimulateRun

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


@handle_errors
def simulate(
    model: Annotated[Path, typer.Option("--model", "-M", help="Global model file.")],
    data: Annotated[Path, typer.Option("--data", "-d", help="Dataset: .safetensors or an image folder; text for a "
                                       "language model: .txt (one example per line) or .jsonl (\"text\" fields).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Capture file to write (.safetensors).")],
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
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
    train_mode: Annotated[bool | None, typer.Option("--train-mode/--eval-mode", help="Model mode during the step "
                                                    "(BatchNorm, Dropout); default: train for images, eval for text.",
                                                    show_default=False)] = None,
    max_length: Annotated[int | None, typer.Option("--max-length", help="Text: truncate each example to this many "
                                                   "tokens, at most the model's positions (default: its positions).",
                                                   callback=number(1, MAX_LENGTH))] = None,
    peft: Annotated[str | None, typer.Option("--peft", help="Text: train a fresh LoRA adapter only (the syntax is "
                                             "above); writes the global adapter to NAME.adapter/ beside the "
                                             "capture.")] = None,
    defense: Annotated[list[str] | None, typer.Option("--defense", help="A defense the client applies, "
                                                      "NAME[:KEY=VALUE,...] (repeatable, in order; dpsgd trains with "
                                                      "DP-SGD through Opacus; gleak defenses lists them).")] = None,
    server: Annotated[str | None, typer.Option("--server", help="A malicious server's craft of the global model "
                                               "first: imprint, trap-weights or fishing[:KEY=VALUE,...]; the "
                                               "crafted model is written beside as NAME.model.safetensors.")] = None,
    no_truth: Annotated[bool, typer.Option("--no-truth", help="Do not write the ground-truth file.")] = False,
    device: DeviceOpt = "cpu",
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Simulate a client step (or steps) on real data; write a capture and its ground truth.

    A language model trains in full, or only a fresh LoRA adapter with
    --peft lora:r=R[,alpha=A,target=M1+M2,dropout=P]
    (defaults: r 8, alpha 8, dropout 0, and peft's target modules for the
    model type; several target modules are joined by +)."""
    from gleak.defenses import parse_defense
    from gleak.models.peft import parse_lora_spec
    from gleak.runs.inputs import ModelSpec
    from gleak.runs.simulate import SimulateRequest, client_config, run_simulate
    from gleak.tamper.craft import parse_craft

    defenses = tuple(parse_defense(spec) for spec in defense or [])
    crafted = None if server is None else parse_craft(server)
    config = client_config(
        batch_size=batch_size, local_steps=local_steps, scheme=scheme, learning_rate=lr, optimizer=optimizer,
        momentum=momentum, weight_decay=weight_decay, mu=mu, loss=loss, reduction=reduction, focal_gamma=focal_gamma,
        focal_alpha=focal_alpha, temperature=temperature, label_smoothing=label_smoothing, mixup=mixup,
        mixup_ratio=mixup_ratio, composition=composition, dirichlet_alpha=dirichlet_alpha,
        labels=parse_labels(labels), train_mode=train_mode is not False, seed=seed, defenses=defenses)
    request = SimulateRequest(
        model=ModelSpec(path=model, arch=arch, arch_kwargs=arch_kwargs, trust_pickle=trust_pickle,
                        trust_remote_code=trust_remote_code), data=data,
        config=config, output=output, no_truth=no_truth, device=device, force=force, max_length=max_length,
        train_mode=train_mode, peft=None if peft is None else parse_lora_spec(peft), server=crafted)
    with plain_progress(not quiet):  # a long FedAvg client: a line every 30 s when stderr is not a terminal
        run = run_simulate(request)
    for notice in run.notices:  # even with --quiet: what was done to the client's data to fit the model
        err_console.print(f"notice: {notice}", soft_wrap=True, markup=False)
    if not quiet:
        _print_summary(run, request)


def _print_summary(run: SimulateRun, request: SimulateRequest) -> None:
    """What was simulated (steps, batch, scheme, labels, defenses, DP-SGD's ε) and the files written."""
    from gleak.report.privacy import describe_capture

    capture, config = run.capture, request.config
    shown = ", ".join(f"{c}×{n}" for c, n in run.label_counts)
    console.print(f"[bold]{capture.kind}[/] of {config.local_steps} step(s) × B = {config.batch_size} "
                  f"({config.scheme}, {config.optimizer}, lr {config.learning_rate:g})")
    if capture.get("gleak.modality") == "text":  # never the text itself: it is the client's data
        console.print(f"text: {capture.get('gleak.task')}, {capture.get('gleak.num_examples')} sequence(s) of ≤ "
                      f"{capture.get('gleak.max_length')} tokens, pads on the "
                      f"{capture.get('gleak.tokenizer.padding_side')}")
    if capture.get("gleak.peft.type") == "lora":
        from gleak.cli.capture_cmd import lora_line

        console.print(lora_line(capture), markup=False)
    if shown:
        console.print(f"labels (class×count): {shown}")
    for record in capture.get("gleak.defense") or []:
        options = ", ".join(f"{k}={v}" for k, v in record.items() if k not in ("name", "seed") and v is not None)
        console.print(f"defense {record['name']}" + (f" ({options})" if options else ""))
    dp_text = describe_capture(capture.meta)
    if dp_text is not None:
        console.print(f"DP-SGD: {dp_text}", highlight=False, markup=False)
    if run.crafted is not None and request.server is not None:
        console.print(f"server: {request.server.describe()} in {run.crafted.layer}; the crafted global model in "
                      f"{request.model_path}", markup=False)
    truth_path = request.truth_path
    console.print(f"wrote {request.output}" + ("" if truth_path is None else f" and {truth_path}")
                  + ("" if request.adapter_path is None else f"; the global adapter in {request.adapter_path}/"))
