"""Write one capture per client per round from inside an FL framework, without ever breaking training.

The framework adapters (Flower mod, NVFlare filter, server-side strategy) turn what their framework hands them
into two state dicts and a :class:`ClientRecord`; :class:`CaptureRecorder` does the rest:

* ``ROOT/round-0001/client-<id>.safetensors`` — the update Δθ = θ_local − θ_global (capture format v1, kind
  ``update``) with the metadata the framework gave (round, client, learning rate, local steps, batch size,
  optimizer, the framework's example count), the global model's sha256 and, when the framework transformed the
  update before it was captured (a DP mod, a privacy filter), what it did (``gleak.defense``);
* ``…/client-<id>.truth.safetensors`` — the inputs and labels the client trained on, when the client app
  exposed them (Flower: :func:`gleak.integrations.flower.record_batch`);
* ``ROOT/models/round-0001-<sha12>.safetensors`` — the round's global model, once per round, with the arch
  spec when one was given, so ``gleak audit ROOT --model ROOT/models`` matches every capture to its model.

Every write is atomic; nothing is overwritten unless ``force``; any failure is logged as one line and the
framework's round goes on.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gleak import __version__
from gleak.capture import Capture, TextTruth, Truth, capture_update, save_capture
from gleak.errors import GleakError, shorten
from gleak.io import save_safetensors
from gleak.losses import LossSpec

log = logging.getLogger("gleak.integrations")

# buffer names by suffix, used when no arch is given to say which tensors are BatchNorm statistics
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")
MODELS_DIR = "models"


@dataclass(kw_only=True)
class ClientRecord:
    """What one client did in one round, as far as its framework says (None: not known)."""

    round: int | None
    client: str
    learning_rate: float | None = None
    local_steps: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    num_examples: int | None = None  # the framework's own count (e.g. Flower's "num-examples")
    extra: dict[str, str] = field(default_factory=dict)  # framework metadata kept verbatim (e.g. flower.*)
    inputs: torch.Tensor | None = None  # the examples the client trained on, model-ready (truth file)
    labels: torch.Tensor | None = None
    # token batches: ``inputs`` holds their input_ids [N, T] and this their attention mask (a text truth file)
    attention_mask: torch.Tensor | None = None
    # what transformed the update before it was captured (a framework's DP mod or privacy filter), in the order
    # applied: stamped as the capture's gleak.defense, a JSON list of {name, options…}
    defense: list[dict[str, Any]] | None = None


def defense_entry(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A ``gleak.defense`` entry (a copy of ``mapping``) checked when it is recorded, not when an audit reads it:
    a non-empty string ``name``, JSON values, and a ``gleak_equivalent`` (when given) that is a list of gleak
    defense specs :func:`gleak.defenses.parse_defense` accepts. Raises GleakError."""
    from gleak.defenses import parse_defense

    record = dict(mapping)
    name = record.get("name")
    if not isinstance(name, str) or not name:
        raise GleakError(f"defense {shorten(repr(mapping), 80)}: a mapping needs a 'name' (a string)")
    try:
        json.dumps(record, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise GleakError(f"defense {name!r}: its values must be JSON ({e})") from None
    equivalent = record.get("gleak_equivalent")
    if equivalent is not None:
        if not isinstance(equivalent, list) or not all(isinstance(s, str) for s in equivalent):
            raise GleakError(f"defense {name!r}: gleak_equivalent must be a list of gleak defense specs")
        for spec in equivalent:
            try:
                parse_defense(spec)
            except GleakError as e:
                raise GleakError(f"defense {name!r}: gleak_equivalent {spec!r}: {e}") from None
    return record


def local_steps_from_epochs(epochs: float | None, examples: int | None, batch_size: int | None) -> int | None:
    """m = epochs · ⌈examples / B⌉ (a DataLoader without drop_last), when all three are known."""
    if not epochs or not examples or not batch_size or epochs <= 0 or examples <= 0 or batch_size <= 0:
        return None
    steps = epochs * math.ceil(examples / batch_size)
    return int(steps) if float(steps).is_integer() else None


def _safe(text: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit] or "_"


class LockedPickle:
    """Pickles without its ``_lock`` and makes a fresh one when unpickled: frameworks ship mods, filters and their
    helpers to worker processes, and a lock cannot travel."""

    _lock: threading.Lock

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class CaptureRecorder(LockedPickle):
    """Turns (global state, local state, record) into capture files under ``root``; see the module docs.

    ``arch`` / ``arch_kwargs`` (a zoo name or ``package.module:factory``, as ``--arch``) go into the saved
    global models so gleak can load them; ``input_shape``, ``mean`` / ``std`` and ``loss`` describe the
    client's inputs and loss when the update alone cannot. Safe to share between threads."""

    def __init__(self, root: str | Path, *, arch: str | None = None, arch_kwargs: Mapping[str, Any] | None = None,
                 save_global: bool = True, input_shape: Sequence[int] | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 loss: LossSpec | None = None, force: bool = False, producer: str = "integrations") -> None:
        self.root, self.producer = Path(root), producer
        self.arch, self.arch_kwargs = arch, dict(arch_kwargs or {})
        self.save_global, self.force, self.loss = save_global, force, loss
        self.mean, self.std = mean, std
        self.buffers: set[str] | None = None
        self.input_shape = list(input_shape) if input_shape is not None else None
        if arch is not None:  # a wrong arch is a configuration error: say so now, not once per round
            from gleak.models.loading import arch_input_shape, build_arch

            module = build_arch(arch, self.arch_kwargs)
            self.buffers = {name for name, _ in module.named_buffers()}
            if self.input_shape is None:
                shape = arch_input_shape(arch, self.arch_kwargs)
                self.input_shape = list(shape) if shape is not None else None
        self.written = 0
        self.failures = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._saved_globals: set[str] = set()


    # ------------------------------------------------------------------------------------------ paths
    def capture_path(self, record: ClientRecord) -> Path:
        folder = f"round-{record.round:04d}" if record.round is not None else "round-unknown"
        return self.root / folder / f"client-{_safe(record.client)}.safetensors"

    def global_path(self, round: int | None, sha256: str) -> Path:
        prefix = f"round-{round:04d}" if round is not None else "round-unknown"
        return self.root / MODELS_DIR / f"{prefix}-{sha256[:12]}.safetensors"

    # ------------------------------------------------------------------------------------------ building
    def record_meta(self, record: ClientRecord) -> dict[str, Any]:
        """The capture keys every recorded client gets: its id, the producer, and the round and defense when
        known."""
        meta: dict[str, Any] = {"gleak.fl.client_id": record.client,
                                "gleak.producer": f"gleak {__version__} ({self.producer})"}
        if record.round is not None:
            meta["gleak.fl.round"] = int(record.round)
        if record.defense:
            meta["gleak.defense"] = [dict(d) for d in record.defense]
        return meta

    def build(self, global_state: Mapping[str, torch.Tensor], local_state: Mapping[str, torch.Tensor],
              record: ClientRecord) -> tuple[Capture, Truth | TextTruth | None]:
        """The capture (and truth, when the record carries one) for one client's round; raises GleakError. (A
        subclass for language models returns a :class:`~gleak.capture.TextTruth`.)"""
        buffers = sorted(self.buffers & set(global_state) if self.buffers is not None
                         else {n for n in global_state if n.rsplit(".", 1)[-1] in BUFFER_SUFFIXES})
        meta = self.record_meta(record)
        truth: Truth | None = None
        inputs = record.inputs
        if record.labels is not None and inputs is not None:
            truth = Truth(labels=record.labels.detach().cpu(), inputs=inputs.detach().cpu())
        steps = record.local_steps
        if steps is None and truth is not None and record.batch_size:
            n = int(truth.labels.shape[0])
            steps = n // record.batch_size if n % record.batch_size == 0 else None
        momentum = record.momentum if record.optimizer in ("sgdm", "nag") else None
        capture = capture_update(
            global_state, local_state, learning_rate=record.learning_rate, local_steps=steps or 1,
            batch_size=record.batch_size, buffers=buffers, metadata=meta, optimizer=record.optimizer,
            momentum=momentum, weight_decay=record.weight_decay, loss=self.loss,
            input_shape=self.input_shape or (list(inputs.shape[1:]) if inputs is not None else None),
            mean=self.mean, std=self.std)
        if steps is None:  # unknown: leave the key out rather than claim m = 1
            capture.meta.pop("gleak.local_steps", None)
            capture.meta.pop("gleak.num_examples", None)
        capture.extra.update({k: str(v) for k, v in record.extra.items()})
        if record.num_examples is not None:
            capture.extra.setdefault("fl.reported_examples", str(int(record.num_examples)))
        if truth is not None and capture.meta.get("gleak.num_examples") not in (None, truth.labels.shape[0]):
            log.warning("gleak: %s: the client recorded %d examples but trained on %s (B × m); no truth file written",
                        record.client, truth.labels.shape[0], capture.meta.get("gleak.num_examples"))
            truth = None
        return capture, truth

    # ------------------------------------------------------------------------------------------ writing
    def write(self, global_state: Mapping[str, torch.Tensor], local_state: Mapping[str, torch.Tensor],
              record: ClientRecord) -> Path | None:
        """Write the capture (and truth, and the round's global model); the path, or None after logging why not.

        Never raises: a recorder runs inside someone's training loop."""
        try:
            capture, truth = self.build(global_state, local_state, record)
        except Exception as e:  # a recorder must never take the training round down
            self._failed(self.capture_path(record), str(e) if isinstance(e, GleakError) else f"{type(e).__name__}: {e}")
            return None
        return self.write_built(capture, truth, global_state, record)

    def write_built(self, capture: Capture, truth: Truth | TextTruth | None,
                    global_state: Mapping[str, torch.Tensor] | None,
                    record: ClientRecord) -> Path | None:
        """Write a capture :meth:`build` made (the round's global model too, when given and ``save_global``);
        the path, or None after logging why not. Never raises."""
        started = time.perf_counter()
        path = self.capture_path(record)
        try:
            self.write_companions(capture, global_state, record, path)
            out = save_capture(capture, path, force=self.force, truth=truth)
            with self._lock:
                self.written += 1
            return out
        except GleakError as e:
            self._failed(path, str(e))
        except Exception as e:  # a recorder must never take the training round down
            self._failed(path, f"{type(e).__name__}: {e}")
        finally:
            with self._lock:
                self.seconds += time.perf_counter() - started
        return None

    def write_companions(self, capture: Capture, global_state: Mapping[str, torch.Tensor] | None,
                         record: ClientRecord, path: Path) -> None:
        """What is written before the capture itself: the round's global model, once, when ``save_global``."""
        if self.save_global and global_state is not None:
            self._write_global(global_state, record.round, capture.meta["gleak.model.sha256"])

    def _failed(self, path: Path, why: str) -> None:
        with self._lock:
            self.failures += 1
        log.warning("gleak: no capture written to %s: %s", path, shorten(why, 300))

    def _write_global(self, state: Mapping[str, torch.Tensor], round: int | None, sha256: str) -> None:
        target = self.global_path(round, sha256)
        with self._lock:
            if str(target) in self._saved_globals:
                return
        if not target.exists():  # every client of the round holds the same model: the first one writes it
            from gleak.models.loading import META_ARCH, META_INPUT_SHAPE, META_KWARGS  # save_model's keys

            meta = {"gleak.model.sha256": sha256}
            if round is not None:
                meta["gleak.fl.round"] = str(round)
            if self.arch is not None:
                meta[META_ARCH] = self.arch
                meta[META_KWARGS] = json.dumps(self.arch_kwargs, sort_keys=True)
            if self.input_shape is not None:
                meta[META_INPUT_SHAPE] = json.dumps(self.input_shape)
            tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}  # hashed by build()
            try:
                save_safetensors(target, tensors, meta, force=False)
            except GleakError:
                if not target.exists():  # another client of the round won the race: that file is the same model
                    raise
        with self._lock:
            self._saved_globals.add(str(target))

    def summary(self) -> str:
        return (f"gleak: {self.written} capture(s) written to {self.root}"
                + (f", {self.failures} failed (see the warnings)" if self.failures else "")
                + f"; {self.seconds:.2f} s spent writing")
