"""Applying defenses to a capture: in order, each with its own seeded generator, stamped into ``gleak.defense``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from gleak.capture import Capture
from gleak.defenses.base import Defense, apply_to
from gleak.defenses.spec import parse_defense
from gleak.errors import GleakError

SEED_STRIDE = 7919  # defense i of a list draws from seed + i·7919: independent streams, reproducible


def recorded_defenses(capture: Capture) -> list[dict[str, Any]]:
    """What ``gleak.defense`` already records, as a list (an older single object becomes a one-item list)."""
    value = capture.get("gleak.defense")
    if value is None:
        return []
    return [dict(v) if isinstance(v, dict) else {"name": str(v)} for v in (value if isinstance(value, list)
                                                                            else [value])]


def rebuild_defenses(records: Sequence[dict[str, Any]]) -> tuple[list[Defense], list[str]]:
    """The defenses a ``gleak.defense`` record describes, rebuilt from their names and options (to simulate a
    client that applies them) — another framework's defense through the ``gleak_equivalent`` specs gleak's
    integrations record beside it (Flower's LocalDpMod, NVFlare's filters) — and the entries that cannot be (no
    equivalent, unknown options)."""
    from gleak.defenses.base import DEFENSES
    from gleak.registry import resolve_options

    rebuilt: list[Defense] = []
    unknown: list[str] = []
    for record in records:
        name = str(record.get("name", "?"))
        cls = DEFENSES.get(name)
        equivalent = record.get("gleak_equivalent")
        if cls is None and isinstance(equivalent, list):  # another framework's defense, with gleak's equivalent
            try:
                rebuilt += [parse_defense(str(spec)) for spec in equivalent]
            except GleakError:
                unknown.append(name)
            continue
        if cls is None:
            unknown.append(name)
            continue
        options = {k: v for k, v in record.items() if k not in ("name", "seed")}
        try:
            rebuilt.append(cls(resolve_options(cls, options)))  # type: ignore[arg-type]
        except GleakError:
            unknown.append(name)
    return rebuilt, unknown


def apply_defenses(capture: Capture, defenses: Sequence[Defense], seed: int = 0) -> Capture:
    """A new capture: ``capture``'s parameter tensors (its buffers untouched) through ``defenses`` in order, and
    ``gleak.defense`` extended with each one's record; every other metadata key (``gleak.model.sha256`` among them)
    kept. Training-time defenses cannot apply to a finished contribution."""
    for d in defenses:
        if d.training:
            raise GleakError(f"{d.name} acts while the client trains, not on what it sends: use gleak simulate "
                             f"--defense {d.name}:...")
    buffers = set(capture.buffers)
    tensors = dict(capture.tensors)
    records = recorded_defenses(capture)
    for i, defense in enumerate(defenses):
        this_seed = seed + SEED_STRIDE * i
        generator = torch.Generator().manual_seed(this_seed)
        params = {n: t for n, t in tensors.items() if n not in buffers}
        tensors.update(apply_to(defense, params, generator))
        records.append(defense.record(this_seed))
    meta = dict(capture.meta)
    meta["gleak.defense"] = records
    return Capture(tensors=tensors, meta=meta, extra=dict(capture.extra))


def contribution_norm(capture: Capture) -> float:
    """L2 norm of the contribution's parameter tensors together (buffers skipped), in float64: what ``clip``
    measures against its bound C when it is applied to the capture."""
    buffers = set(capture.buffers)
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for n, t in capture.tensors.items()
                         if n not in buffers))


def contribution_distortion(clean: Capture, defended: Capture) -> dict[str, float]:
    """Utility of a defended contribution against the clean one, over the parameter tensors: relative L2 error
    ‖d − c‖ / ‖c‖ and cosine similarity."""
    buffers = set(clean.buffers)
    cc = dd = cd = diff = 0.0  # accumulated tensor by tensor: no concatenated copy of the contribution
    for n in (n for n in clean.tensors if n not in buffers):
        c = clean.tensors[n].detach().to(torch.float64).flatten()
        d = defended.tensors[n].detach().to(torch.float64).flatten()
        cc, dd, cd = cc + float(c @ c), dd + float(d @ d), cd + float(c @ d)
        diff += float((d - c).pow(2).sum())
    norm = math.sqrt(cc)
    rel = math.sqrt(diff) / norm if norm > 0 else float("nan")
    denom = norm * math.sqrt(dd)
    cos = cd / denom if denom > 0 else float("nan")
    return {"relative_l2_error": rel, "cosine": cos}
