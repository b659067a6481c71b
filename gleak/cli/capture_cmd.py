"""`gleak capture`: a pair of LoRA adapter folders (global, client) as a capture of the client's update (parses the
options, calls :func:`gleak.runs.adapters.run_adapter_capture`, prints what it wrote)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gleak.cli.common import (
    MAX_BATCH,
    MAX_STEPS,
    ForceOpt,
    QuietOpt,
    TrustPickleOpt,
    TrustRemoteCodeOpt,
    VerboseOpt,
    console,
    handle_errors,
    number,
)

if TYPE_CHECKING:
    from gleak.capture import Capture


@handle_errors
def capture(
    global_adapter: Annotated[Path, typer.Argument(help="The global LoRA adapter folder the client started from "
                                                   "(adapter_config.json, adapter_model.safetensors).")],
    client_adapter: Annotated[Path, typer.Argument(help="The client's adapter folder after local training.")],
    model: Annotated[Path, typer.Option("--model", "-M", help="The base model's Hugging Face folder (its weights' "
                                        "hash binds the capture; its tokenizer's hash is recorded).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Capture file to write (.safetensors).")],
    learning_rate: Annotated[float | None, typer.Option("--learning-rate", "--lr", help="The client's learning rate "
                                                        "(> 0), when known.", callback=number(0, low_open=True))
                             ] = None,
    local_steps: Annotated[int | None, typer.Option("--local-steps", "-m", help="Local steps the client took, when "
                                                    "known.", callback=number(1, MAX_STEPS))] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", "-b", help="Examples per local step, when known.",
                                                   callback=number(1, MAX_BATCH))] = None,
    optimizer: Annotated[str | None, typer.Option(help="The client's optimizer, when known: sgd, sgdm, nag or "
                                                  "adam.")] = None,
    round: Annotated[int | None, typer.Option("--round", help="Federated round (≥ 0).",
                                              callback=number(0))] = None,
    client_id: Annotated[str | None, typer.Option("--client-id", help="Client identifier.")] = None,
    trust_pickle: TrustPickleOpt = False,
    trust_remote_code: TrustRemoteCodeOpt = False,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Turn a global LoRA adapter and a client's adapter into a capture of the client's update (client − global)."""
    from gleak.runs.adapters import AdapterCaptureRequest, run_adapter_capture
    from gleak.runs.inputs import ModelSpec

    request = AdapterCaptureRequest(
        global_adapter=global_adapter, client_adapter=client_adapter, output=output,
        model=ModelSpec(path=model, trust_pickle=trust_pickle, trust_remote_code=trust_remote_code),
        learning_rate=learning_rate, local_steps=local_steps, batch_size=batch_size, optimizer=optimizer,
        round=round, client_id=client_id, force=force)
    run = run_adapter_capture(request)
    if not quiet:
        console.print(lora_line(run.capture), markup=False)
        console.print(f"wrote {run.written}", markup=False)


def lora_line(capture: Capture) -> str:
    """``LoRA r=8, targets q_proj+v_proj, 4 adapter tensors (2,048 parameters)``: a LoRA capture in one line."""
    targets = "+".join(capture.get("gleak.peft.target_modules") or [])
    alpha = capture.get("gleak.peft.alpha")
    return (f"LoRA r={capture.get('gleak.peft.r')}, alpha {alpha:g}, targets {targets}, {len(capture.tensors)} "
            f"adapter tensors ({capture.num_parameters():,} parameters)")
