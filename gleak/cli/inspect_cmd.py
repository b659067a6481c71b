"""`gleak inspect`: what a capture holds, and which last layer the attacks will use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from gleak.cli.common import (
    AllowMismatchOpt,
    ArchKwargsOpt,
    ArchOpt,
    FcLayerOpt,
    ModelOpt,
    QuietOpt,
    TrustPickleOpt,
    VerboseOpt,
    console,
    deferred,
    handle_errors,
    print_json,
)
from gleak.errors import GleakError

if TYPE_CHECKING:
    from gleak.capture import check_model_hash, load_capture, truth_path_for, validate_against_model
    from gleak.models import find_last_layer, guess_last_layer, load_model
else:  # imported on first use: the CLI starts without torch
    check_model_hash = deferred("gleak.capture", "check_model_hash")
    load_capture = deferred("gleak.capture", "load_capture")
    truth_path_for = deferred("gleak.capture", "truth_path_for")
    validate_against_model = deferred("gleak.capture", "validate_against_model")
    find_last_layer = deferred("gleak.models", "find_last_layer")
    guess_last_layer = deferred("gleak.models", "guess_last_layer")
    load_model = deferred("gleak.models", "load_model")


def applicable_attacks(capture: Any, loaded: Any, fc_layer: str | None, allow_model_mismatch: bool = False
                       ) -> tuple[dict[str, str | None], dict[str, Any] | None]:
    """Each registered attack -> None when it can run here, else the reason (auxiliary data assumed given);
    and the mode the attacks run the model in."""
    from gleak.attacks import REGISTRY, build_context
    from gleak.data import Dataset

    ctx = build_context(capture, loaded, fc_layer=fc_layer, allow_model_mismatch=allow_model_mismatch)
    if ctx.input_shape is not None:  # assume the user will pass --aux: a placeholder with the right shape
        import torch

        ctx.aux = Dataset(torch.zeros(1, *ctx.input_shape), torch.zeros(1, dtype=torch.long), (0.0,), (1.0,))
    return {name: cls().not_applicable(ctx) for name, cls in REGISTRY.items()}, ctx.model_mode()


def describe(capture_path: Path, model_path: Path | None, arch: str | None, arch_kwargs: str | None,
             trust_pickle: bool, fc_layer: str | None, allow_model_mismatch: bool = False) -> dict[str, Any]:
    """Everything `inspect` shows, as plain data (the JSON output, an :class:`InspectReport`)."""
    capture = load_capture(capture_path)
    truth = truth_path_for(capture_path)
    info: dict[str, Any] = {
        "file": str(capture_path),
        "kind": capture.kind,
        "capture_schema_version": capture.get("gleak.schema_version"),  # schema_version: the report's own
        "num_tensors": len(capture.tensors),
        "num_parameters": capture.num_parameters(),
        "batch_size": capture.batch_size,
        "local_steps": capture.local_steps,
        "truth_file": str(truth) if truth.exists() else None,
        "metadata": {k: capture.meta[k] for k in sorted(capture.meta)},
        "unknown_metadata": dict(sorted(capture.extra.items())),
        "tensors": [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                    for n, t in capture.tensors.items()],
        "model": None,
    }
    if model_path is None:
        layer = guess_last_layer(capture.tensors, override=fc_layer, num_classes=capture.num_classes)
    else:
        loaded = load_model(model_path, arch, arch_kwargs, trust_pickle)
        validate_against_model(capture, loaded.module)
        check = check_model_hash(capture, loaded.weights_sha256, allow_model_mismatch)
        info["model"] = {"file": str(model_path), "source": loaded.source, "arch": loaded.arch,
                         "weights_sha256": loaded.weights_sha256, "model_check": check.to_json(),
                         "matches_capture": None if check.recorded is None else check.status == "match"}
        shape = capture.input_shape or loaded.input_shape
        layer = find_last_layer(loaded.module, capture.tensors, input_shape=shape, override=fc_layer)
        info["attacks"], info["model"]["mode"] = applicable_attacks(capture, loaded, fc_layer, allow_model_mismatch)
    info["last_layer"] = {
        "name": layer.name, "weight_key": layer.weight_key, "bias_key": layer.bias_key,
        "weight_shape": [layer.num_classes, layer.feature_dim], "has_bias": layer.bias_key is not None,
        "num_classes": layer.num_classes, "feature_dim": layer.feature_dim, "reason": layer.reason,
    }
    from gleak.report.model import InspectReport

    return InspectReport.build(info).to_json()  # typed: a missing or mistyped key fails here


def _render(info: dict[str, Any], verbose: bool) -> None:
    from gleak.capture import SCHEMA

    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("kind", info["kind"])
    summary.add_row("tensors", f"{info['num_tensors']} ({info['num_parameters']:,} parameter values)")
    summary.add_row("batch size", str(info["batch_size"] if info["batch_size"] is not None else "unknown"))
    summary.add_row("local steps", str(info["local_steps"]))
    summary.add_row("ground truth", info["truth_file"] or "none found")
    model = info["model"]
    if model:
        match = {None: "[yellow]the capture records no model hash[/]",
                 True: "[green]weights match the capture's model[/]",
                 False: "[red]weights differ from the model the capture was made with "
                        "(--allow-model-mismatch)[/]"}[model["matches_capture"]]
        summary.add_row("model", f"{model['file']} ({model['source']})")
        summary.add_row("", match)
        if model.get("mode"):
            summary.add_row("", escape(model["mode"]["note"]))
    console.print(Panel(summary, title=f"gleak inspect — {info['file']}", expand=False))

    layer = info["last_layer"]
    table = Table(title="Last fully-connected layer", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("layer", layer["name"])
    table.add_row("weight", f"{layer['weight_key']}  {layer['weight_shape']}  (C = {layer['num_classes']}, "
                  f"d = {layer['feature_dim']})")
    table.add_row("bias", layer["bias_key"] or "none")
    table.add_row("why", layer["reason"])
    console.print(table)

    meta = Table(title="Metadata", title_justify="left")
    meta.add_column("key", style="cyan")
    meta.add_column("value")
    if verbose:
        meta.add_column("meaning", style="dim")
    for key, value in info["metadata"].items():
        meta.add_row(key, _short(value), *([SCHEMA[key].doc] if verbose else []))
    for key, value in info["unknown_metadata"].items():
        meta.add_row(key, _short(value), *(["[yellow]unknown key, kept as is[/]"] if verbose else []))
    if info["unknown_metadata"] and not verbose:
        meta.caption = f"{len(info['unknown_metadata'])} unknown key(s) kept as is (last rows); -v explains each key"
    console.print(meta)

    if info.get("attacks"):
        attacks = Table(title="Attacks (with --aux where needed)", title_justify="left", show_header=False)
        attacks.add_column(style="bold")
        attacks.add_column()
        for name, reason in info["attacks"].items():
            attacks.add_row(name, "[green]applies[/]" if reason is None else f"[dim]not applicable: {reason}[/]")
        console.print(attacks)

    if verbose:
        tensors = Table(title="Tensors", title_justify="left")
        tensors.add_column("name")
        tensors.add_column("shape")
        tensors.add_column("dtype")
        for t in info["tensors"]:
            tensors.add_row(t["name"], str(t["shape"]), t["dtype"])
        console.print(tensors)


def _short(value: Any, limit: int = 70) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@handle_errors
def inspect(
    capture: Annotated[Path, typer.Argument(help="Capture file (.safetensors).")],
    model: ModelOpt = None,
    arch: ArchOpt = None,
    arch_kwargs: ArchKwargsOpt = None,
    trust_pickle: TrustPickleOpt = False,
    fc_layer: FcLayerOpt = None,
    allow_model_mismatch: AllowMismatchOpt = False,
    format: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show a capture's tensors, metadata, the detected last layer and its batch size."""
    if format not in ("table", "json"):
        raise GleakError(f"--format must be table or json, got '{format}'")
    info = describe(capture, model, arch, arch_kwargs, trust_pickle, fc_layer, allow_model_mismatch)
    if format == "json":
        print_json(info)
    else:
        _render(info, verbose)
