"""The run behind ``gleak check-model``: is this global model a malicious server's trap? (METHODS-server §4.1, §5.)

Reads the model without running any of its code, tests every weighted layer (:mod:`gleak.tamper.structure`) and
returns a :class:`~gleak.report.model.CheckModelReport`. With ``--arch``, a safetensors file's keys and shapes are
first compared with the client's own architecture: an added, missing or reshaped tensor is the published form of
Robbing the Fed, trap weights and LOKI (modules inserted before the model), and the extra tensors are still tested.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gleak.data.images import load_dataset
from gleak.errors import GleakError
from gleak.io import file_sha256, header_value, is_safetensors, read_safetensors
from gleak.models import LoadedModel, load_model
from gleak.report.model import CheckModelReport, ProbeResult, ServerFinding
from gleak.runs.inputs import ModelSpec, check_model_fits_data
from gleak.tamper.probe import SUSPICIOUS_SHARE, TRAP_SHARE, exact_leaks
from gleak.tamper.structure import Hit, Tier, architecture_hits, check_views
from gleak.tamper.views import LayerView, layer_views, tensor_views


def _counted(views: Iterator[LayerView], count: list[int]) -> Iterator[LayerView]:
    for view in views:
        count[0] += 1
        yield view


def _finding(hit: Hit) -> ServerFinding:
    return ServerFinding(rule=hit.rule, tier=hit.tier, layer=hit.layer, title=hit.title, metric=hit.metric,
                         measured=hit.measured, threshold=hit.threshold, null=hit.null)


def _architecture_hits(tensors: dict[str, Any], arch: str, kwargs: Any) -> list[Hit]:
    """T0: the file's keys and shapes against the client's architecture."""
    from gleak.models.loading import build_arch, parse_arch_kwargs

    reference = build_arch(arch, parse_arch_kwargs(kwargs) if kwargs is not None else None).state_dict()
    return architecture_hits(tensors, reference, f"the architecture {arch}")


def _probe(loaded: LoadedModel, data: Path, size: int, seed: int) -> tuple[ProbeResult, list[Hit]]:
    """The leak census on ``size`` seeded examples of ``data`` (:mod:`gleak.tamper.probe`), and its finding."""
    dataset = load_dataset(data)
    check_model_fits_data(loaded, dataset)
    pick = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:size]
    inputs, labels = dataset.batch(pick)  # model-ready: normalised as the data file says
    try:
        found = exact_leaks(loaded.module, inputs, labels)
    except (RuntimeError, IndexError, ValueError) as exc:  # shapes or classes that do not fit the model
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise GleakError(f"the model cannot run on {data}'s examples: {first}") from None
    if isinstance(found, str):
        return ProbeResult(data=str(data), batch=len(pick), reason=found), []
    result = ProbeResult(data=str(data), batch=found.batch, layer=found.layer, copied=found.copied,
                         share=round(found.share, 4))
    tier: Tier | None = "trap" if found.share >= TRAP_SHARE and found.copied >= 2 else (
        "suspicious" if found.share >= SUSPICIOUS_SHARE else None)
    if tier is None:
        return result, []
    return result, [Hit("GLEAK-SERVER-EXACT-LEAK", tier, found.layer,
                        f"a server can copy {found.copied} of {found.batch} of your examples exactly from "
                        f"{found.layer}'s gradient", "share copied", found.share,
                        TRAP_SHARE if tier == "trap" else SUSPICIOUS_SHARE,
                        "0–0.02 at init, up to 0.17 after training (MLP on digits)",
                        found.copied)]


def run_check_model(spec: ModelSpec, data: Path | None = None, probe: int = 64, seed: int = 0) -> CheckModelReport:
    """Every weight test on the model ``spec`` names and, with ``data``, the leak census on ``probe`` of its
    examples (module docstring)."""
    if spec.path is None:
        raise GleakError("check-model needs a model")
    start = time.perf_counter()
    path = Path(spec.path)
    notes: list[str] = []
    hits: list[Hit] = []
    views: Iterator[LayerView]
    safetensors = path.is_file() and is_safetensors(path)
    loaded: LoadedModel | None = None
    if safetensors and (spec.arch is not None or header_value(path, "gleak.arch") is None):
        # bare tensors (or --arch given): read them as they are, so that a file that does not fit the architecture
        # is still tested; a zoo file names its architecture and loads below
        tensors, meta = read_safetensors(path, "model file")
        if meta.get("gleak.kind") not in (None, "model"):
            raise GleakError(f"{path} is a gleak {meta['gleak.kind']} file, not a model")
        if spec.arch is not None:
            hits += _architecture_hits(tensors, spec.arch, spec.arch_kwargs)
        else:
            notes.append("no architecture (--arch): keys and shapes were not compared with the client's model, and "
                         "2-D tensors were read as (out, in) matrices")
        views = tensor_views(tensors)
        source = "safetensors tensors" + (f" against {spec.arch}" if spec.arch else "")
        parameters = sum(int(t.numel()) for t in tensors.values())
    else:
        loaded = load_model(path, spec.arch, spec.arch_kwargs, spec.trust_pickle, spec.trust_remote_code)
        views = layer_views(loaded.module)
        source = loaded.source
        parameters = sum(int(p.numel()) for p in loaded.module.parameters())
        if spec.arch is None and not safetensors and path.is_file():
            notes.append("keys and shapes were not compared with the client's own architecture (pass --arch with a "
                         "safetensors file for that check)")
    count = [0]
    hits += check_views(_counted(views, count))  # one layer's view at a time
    if count[0] == 0:
        raise GleakError(f"{path} has no weight matrix to check")
    result: ProbeResult | None = None
    if data is not None and loaded is None and spec.arch is None:
        raise GleakError("--data runs the model on your examples: it needs the model's architecture (a zoo model's "
                         "file, or --arch)")
    if data is not None and any(h.rule == "GLEAK-SERVER-ARCHITECTURE" for h in hits):
        result = ProbeResult(data=str(data), batch=0, reason="the tensors do not fit --arch, so the model cannot run")
    elif data is not None:
        if loaded is None:
            loaded = load_model(path, spec.arch, spec.arch_kwargs, spec.trust_pickle, spec.trust_remote_code)
        result, found = _probe(loaded, data, probe, seed)
        hits += found
    findings = [_finding(h) for h in hits]
    verdict = ("flagged" if any(f.tier == "trap" for f in findings)
               else "suspicious" if findings else "clean")
    if data is None:
        notes.append("weight tests only: --data YOUR_EXAMPLES also counts how many of them a server could copy "
                     "exactly from this model")
    notes.append("learned traps (SEER) and imprints whose rows carry strong noise pass the weight tests; "
                 "convolutional traps (LOKI) are not measured on data")
    return CheckModelReport.build({
        "model": str(path), "sha256": file_sha256(path) if path.is_file() else "", "source": source,
        "verdict": verdict, "layers": count[0], "parameters": parameters,
        "seconds": round(time.perf_counter() - start, 3), "findings": [f.model_dump() for f in findings],
        **({"probe": result.model_dump(exclude_none=True)} if result is not None else {}), "notes": notes})
