"""gleak in Flower (the ``flower`` extra, ``pip install -e '.[flower]'`` from a clone; flwr ≥ 1.21, the
Message / ArrayRecord API).

* :class:`GleakCaptureMod` — a client mod, ``ClientApp(mods=[GleakCaptureMod("captures")])``: after each
  ``train`` message it writes the client's update (local − global, keyed by state_dict names) as a capture
  with the round, node, learning rate, local steps, batch size, optimizer and ``num-examples`` Flower gave.
  It reads the message and the reply and changes neither; a failure to write is logged, never raised.
* ``GleakCaptureMod(..., defense=[dp])`` behind a defense mod such as Flower's ``LocalDpMod``: Flower wraps the
  app in its mods with the first one outermost (``ClientApp`` mods before a function's own), so the capture mod
  goes *before* the defense — ``ClientApp(mods=[GleakCaptureMod(..., defense=[dp])])`` with
  ``@app.train(mods=[dp])`` — and sees the reply after the defense changed it; ``defense`` stamps what the defense
  does into every capture's ``gleak.defense`` (:func:`defense_record`; docs/defenses.md, "Inside FL frameworks").
  (flwr 1.42's
  ``flwr.clientapp.mod.LocalDpMod`` does not check the message type: among the ``ClientApp``'s own mods it turns
  an evaluate reply without arrays into an error; a ``train`` function's mods only see training.)
* :func:`record_batch` — the documented hook for ground truth: a client app that calls it with each batch it
  trains on gets a ``.truth.safetensors`` beside its capture (for scoring, e.g. in tests and red-team runs).
* :class:`GleakGuardMod` — a client mod, first in ``ClientApp(mods=[GleakGuardMod(), ...])``: it checks each
  received global model for the structures a malicious server plants (``gleak check-model``) and refuses the round
  in one logged line, or only warns.
* :class:`GleakAuditStrategy` — wraps any server strategy (``GleakAuditStrategy(FedAvg(...), model=...)``):
  each round it runs gleak's label attacks on every reply with that round's global weights, appends one JSON
  line per client to a log file and logs a summary line, then lets the wrapped strategy aggregate.
* :class:`LoraApp` — for FlowerTune-style apps, whose clients fine-tune a LoRA adapter (peft) on a frozen causal
  language model and exchange only the adapter's arrays (``get_peft_model_state_dict``):
  ``GleakCaptureMod("captures", lora=LoraApp("base-model-folder", lora_config))`` writes LoRA captures (the adapter
  update, bound to the base model's hash, with the ``gleak.peft.*`` keys), the round's global adapter as a peft
  adapter folder (under ``models/`` and as ``client-<id>.adapter/`` beside each capture, where the ``lora-tokens``
  attack looks for it), and token batches recorded with :func:`record_batch` as a text truth;
  ``GleakAuditStrategy(FedAvg(), lora=..., log_path=...)`` runs the token attacks on every reply.

Where the metadata comes from: the mod's own arguments first (what you know about your client code), then the
reply's metric and config records, then the ``train`` message's config records, then the run config. Keys
looked up are in :data:`METADATA_KEYS` (Flower apps use ``lr``, ``local-epochs``, ``batch-size``…).
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import json
import logging
import math
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from torch import nn

from gleak.capture import Capture, TextTruth, Truth, capture_lora_update
from gleak.errors import GleakError, shorten
from gleak.integrations.recorder import (
    MODELS_DIR,
    CaptureRecorder,
    ClientRecord,
    LockedPickle,
    defense_entry,
    local_steps_from_epochs,
)
from gleak.losses import LossSpec
from gleak.models import LoadedModel
from gleak.report.model import TokenResult

log = logging.getLogger("flwr.gleak")  # through Flower's own log handler

METADATA_KEYS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr", "learning-rate", "learning_rate"),
    "local_steps": ("local-steps", "local_steps", "num-steps"),
    "local_epochs": ("local-epochs", "local_epochs", "epochs"),
    "batch_size": ("batch-size", "batch_size"),
    "optimizer": ("optimizer",),
    "momentum": ("momentum",),
    "weight_decay": ("weight-decay", "weight_decay"),
    "num_examples": ("num-examples", "num_examples"),
}
OPTIMIZER_NAMES = {"sgd": "sgd", "sgdm": "sgdm", "nag": "nag", "nesterov": "nag", "adam": "adam"}
TIMINGS_FILE = "gleak-mod.jsonl"
BATCH_KEY = "gleak.batch."  # context.state keys written by record_batch, one per local step


_LOCAL_DP_OPTIONS = ("clipping_norm", "sensitivity", "epsilon", "delta")  # LocalDpMod's options, in its order


def defense_record(defense: Any) -> dict[str, Any]:
    """One ``gleak.defense`` entry for what a client applies to its reply before it leaves.

    A Flower ``LocalDpMod`` (``flwr.clientapp.mod``, or the legacy ``flwr.client.mod`` one for ``client_fn`` apps;
    both do the same maths) becomes ``{"name": "flwr.LocalDpMod", "clipping_norm", "sensitivity", "epsilon",
    "delta", "noise_std", "gleak_equivalent"}``: it clips the update (reply − received arrays, all arrays together)
    to L2 norm ``clipping_norm``, then adds N(0, σ²) to every entry of every array with σ = ``noise_std`` =
    sensitivity · √(2 ln(1.25/δ)) / ε — gleak's ``clip:norm=C`` then ``gaussian:sigma=σ`` (``gleak_equivalent``,
    the specs ``gleak defend --defense`` takes; exact for models without buffers, which Flower clips and noises
    too and gleak leaves alone). A mapping with a string ``name`` (and JSON values) is recorded as given, its
    ``gleak_equivalent`` (if any) checked to parse (:func:`~gleak.integrations.recorder.defense_entry`)."""
    if isinstance(defense, Mapping):
        return defense_entry(defense)
    if type(defense).__name__ == "LocalDpMod" and all(hasattr(defense, k) for k in _LOCAL_DP_OPTIONS):
        c, s, eps, delta = (float(getattr(defense, k)) for k in _LOCAL_DP_OPTIONS)
        sigma = s * math.sqrt(2 * math.log(1.25 / delta)) / eps if eps > 0 and 0 < delta < 1.25 else None
        return defense_entry({
            "name": "flwr.LocalDpMod", "clipping_norm": c, "sensitivity": s, "epsilon": eps, "delta": delta,
            "noise_std": sigma,
            "gleak_equivalent": [f"clip:norm={c!r}", f"gaussian:sigma={sigma!r}"] if sigma is not None else None})
    raise GleakError(f"defense {shorten(repr(defense), 80)}: expected Flower's LocalDpMod or a mapping with a "
                     "'name' (e.g. {'name': 'my-clip', 'norm': 1.0})")


def record_batch(context: Context, inputs: torch.Tensor | Mapping[str, Any], labels: torch.Tensor | None = None, *,
                 attention_mask: torch.Tensor | None = None) -> None:
    """Call from a client app with each batch it trains on; :class:`GleakCaptureMod` then writes them as the
    capture's ground truth and clears them. Kept in ``context.state``, which Flower keeps on the node.

    Images: ``record_batch(context, x, y)`` with the model-ready inputs and the class labels (or soft labels).
    Token batches (a :class:`LoraApp`): ``record_batch(context, input_ids, attention_mask=mask)``, or
    ``record_batch(context, batch)`` with the batch as a tokenizer or a data collator returns it (a mapping with
    ``input_ids`` and ``attention_mask``; its ``labels``, the next-token targets, are not needed). Integer ids
    [B, T] without labels or a mask are a batch without padding. A call that is neither raises GleakError."""
    if isinstance(inputs, Mapping):
        if "input_ids" not in inputs:
            raise GleakError("record_batch: a batch given as a mapping needs its input_ids (a tokenizer's or a data "
                             "collator's output)")
        ids, mask = inputs["input_ids"], inputs.get("attention_mask", attention_mask)
        labels = None
    else:
        ids, mask = inputs, attention_mask
    if labels is not None and mask is None:
        record: ArrayRecord = ArrayRecord({"inputs": Array(_numpy(ids)), "labels": Array(_numpy(labels))})
    else:
        if labels is not None:
            raise GleakError("record_batch: pass labels (images) or an attention mask (token batches), not both")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise GleakError("record_batch: token batches are integer input_ids [B, T]; an image batch needs its "
                             "labels: record_batch(context, inputs, labels)")
        mask = torch.ones_like(ids) if mask is None else mask
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
            raise GleakError(f"record_batch: the attention mask must be a tensor of the input_ids' shape "
                             f"{list(ids.shape)}")
        record = ArrayRecord({"input_ids": Array(_numpy(ids.long())), "attention_mask": Array(_numpy(mask.long()))})
    step = sum(1 for key in context.state if key.startswith(BATCH_KEY))
    context.state[f"{BATCH_KEY}{step}"] = record


def _numpy(values: torch.Tensor) -> np.ndarray:
    return values.detach().cpu().contiguous().numpy()


_BATCH_KINDS = ({"inputs", "labels"}, {"input_ids", "attention_mask"})  # images, token batches


def _pop_batches(context: Context) -> list[ArrayRecord] | None:
    """Take the batches record_batch left in ``context.state`` (references; converted later, off the round)."""
    keys = sorted((k for k in list(context.state) if k.startswith(BATCH_KEY)), key=lambda k: int(k[len(BATCH_KEY):]))
    if not keys:
        return None
    records = [context.state[k] for k in keys]
    for k in keys:
        del context.state[k]
    arrays = [r for r in records if isinstance(r, ArrayRecord) and set(r) in _BATCH_KINDS]
    if len(arrays) != len(records):
        raise GleakError("context.state holds gleak.batch.* entries that record_batch did not write")
    if len({frozenset(r) for r in arrays}) > 1:
        raise GleakError("the client app recorded both image and token batches in one round")
    return arrays


def _is_tokens(records: list[ArrayRecord] | None) -> bool:
    return records is not None and len(records) > 0 and "input_ids" in records[0]


def _batches(records: list[ArrayRecord] | None) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    if not records:
        return None
    inputs = torch.cat([_tensor(r["inputs"]) for r in records])
    labels = torch.cat([_tensor(r["labels"]) for r in records])
    return inputs, labels, len(records)


def _token_batches(records: list[ArrayRecord], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The token batches in training order as one [N, T] pair (padded to the widest with ``pad_id``, masked out,
    on the tokenizer's padding side)."""
    pairs = [(_tensor(r["input_ids"]).long(), _tensor(r["attention_mask"]).long()) for r in records]
    width = max(int(ids.shape[1]) for ids, _ in pairs)
    ids_out, mask_out = [], []
    for ids, mask in pairs:
        extra = width - int(ids.shape[1])
        pad = (extra, 0) if left else (0, extra)
        ids_out.append(torch.nn.functional.pad(ids, pad, value=pad_id))
        mask_out.append(torch.nn.functional.pad(mask, pad, value=0))
    return torch.cat(ids_out), torch.cat(mask_out)


def _tensor(array: Array) -> torch.Tensor:
    """An Array's values as a tensor. Flower stores NumPy's .npy bytes; a C-ordered array is read in place (numpy's
    own reader parses the header with ``ast``, a third of a millisecond per tensor), anything else by Array.numpy."""
    data = array.data
    if array.stype == "numpy.ndarray" and data[:6] == b"\x93NUMPY" and len(data) > 10:
        width = 2 if data[6] == 1 else 4
        end = 8 + width + int.from_bytes(data[8:8 + width], "little")
        header = data[8 + width:end].decode("latin1", "replace")
        match = re.search(r"'descr':\s*'([<>|=]?[a-zA-Z]\d+)'", header)
        if match and "'fortran_order': False" in header:
            dtype = np.dtype(match.group(1))
            count = math.prod(array.shape)
            if dtype.kind in "biuf" and len(data) - end == count * dtype.itemsize:
                values = np.frombuffer(data, dtype=dtype, count=count, offset=end).reshape(array.shape)
                return torch.from_numpy(values.astype(dtype.newbyteorder("="), copy=True))
    return torch.from_numpy(np.array(array.numpy(), copy=True))


def _single_arrays(message: Message) -> ArrayRecord | None:
    records = list(message.content.array_records.values())
    return records[0] if len(records) == 1 else None


def _state(record: Mapping[str, Array]) -> dict[str, torch.Tensor]:
    return {k: _tensor(v) for k, v in record.items()}


def _lookup(key: str, sources: Sequence[Mapping[str, Any]]) -> Any:
    for source in sources:
        for name in METADATA_KEYS[key]:
            if name in source and source[name] is not None:
                return source[name]
    return None


def _number(value: Any, kind: type) -> Any:
    """A finite, non-negative number (a positive whole one for ``int``), else None: config values are untrusted."""
    if value is None or isinstance(value, bool | bytes):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or number < 0:
        return None
    if kind is int:
        return int(number) if number.is_integer() and number >= 1 else None
    return number


class _Metadata:
    """What the user told gleak about the client, merged with what the messages say."""

    def __init__(self, learning_rate: float | None, local_steps: int | None, local_epochs: float | None,
                 batch_size: int | None, optimizer: str | None, momentum: float | None,
                 weight_decay: float | None) -> None:
        self.given = {"learning_rate": learning_rate, "local_steps": local_steps, "local_epochs": local_epochs,
                      "batch_size": batch_size, "optimizer": optimizer, "momentum": momentum,
                      "weight_decay": weight_decay}
        self._warned: set[str] = set()

    def record(self, round: int | None, client: str, sources: Sequence[Mapping[str, Any]],
               extra: dict[str, str], batch_count: int | None = None) -> ClientRecord:
        """``batch_count``: how many batches the client app recorded (record_batch: one per local step)."""
        given = {k: v for k, v in self.given.items() if v is not None}
        merged = [given, *sources]
        lr = _number(_lookup("learning_rate", merged), float)
        batch = _number(_lookup("batch_size", merged), int)
        examples = _number(_lookup("num_examples", sources), int)  # the reply's count, never the user's
        steps = _number(_lookup("local_steps", merged), int)
        if steps is None and batch_count:
            steps = batch_count
        if steps is None:
            steps = local_steps_from_epochs(_number(_lookup("local_epochs", merged), float), examples, batch)
        momentum = _number(_lookup("momentum", merged), float)
        name = _lookup("optimizer", merged)
        optimizer = OPTIMIZER_NAMES.get(str(name).lower()) if name is not None else None
        if name is not None and optimizer is None:
            self._warn_once("optimizer", f"gleak: optimizer {shorten(repr(name), 40)} is not one gleak models "
                            f"({', '.join(sorted(set(OPTIMIZER_NAMES.values())))}); left out of the captures")
        if optimizer == "sgd" and momentum:
            optimizer = "sgdm"
        for key, value in (("learning rate", lr), ("local steps", steps), ("batch size", batch)):
            if value is None:
                self._warn_once(key, f"gleak: the client's {key} is not known (pass it to GleakCaptureMod or send "
                                f"it in the train config); the captures leave it out")
        return ClientRecord(round=round, client=client, learning_rate=lr, local_steps=steps, batch_size=batch,
                            optimizer=optimizer, momentum=momentum, weight_decay=_number(
                                _lookup("weight_decay", merged), float), num_examples=examples, extra=extra)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def _round(config: Mapping[str, Any]) -> int | None:
    value = config.get("server-round", config.get("server_round"))
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _records(message: Message, kinds: tuple[type, ...] = (ConfigRecord, MetricRecord)) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    if ConfigRecord in kinds:
        out += list(message.content.config_records.values())
    if MetricRecord in kinds:
        out += list(message.content.metric_records.values())
    return out


class _BackgroundWriter:
    """One writer thread per mod and process: the client's round returns while its capture is written. The queue
    is bounded (a slow disk slows the clients down instead of filling memory) and drained at interpreter exit.
    A process that is killed does not exit: flwr's simulation engine ends its Ray actors as soon as the ServerApp
    returns (``terminate.remote()``, then ``ray.shutdown()`` kills the raylet and its workers after 1 s), so what
    the writer threads still hold is lost unless the ServerApp waits for it (``examples/flower/apps.py``)."""

    def __init__(self, depth: int = 4) -> None:
        self.depth = depth
        self._queue: queue.Queue[Callable[[], None] | None] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._queue = queue.Queue(maxsize=self.depth)
                self._thread = threading.Thread(target=self._run, args=(self._queue,), name="gleak-capture-writer",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.flush)
            q = self._queue
        assert q is not None
        q.put(job)

    @staticmethod
    def _run(q: queue.Queue[Callable[[], None] | None]) -> None:
        while (job := q.get()) is not None:
            try:
                job()
            except Exception as e:  # a job logs its own failures; this is the last line of defence
                log.warning("gleak: capture skipped: %s", shorten(f"{type(e).__name__}: {e}", 300))
            finally:
                q.task_done()
        q.task_done()

    def flush(self) -> None:
        """Wait until every submitted capture is written."""
        with self._lock:
            q, thread = self._queue, self._thread
        if q is not None and thread is not None and thread.is_alive():
            q.join()


@dataclass(frozen=True)
class BaseModelInfo:
    """What a LoRA capture records of the base model (``LoraApp.describe``): its tensors' hash (as ``gleak audit
    --model DIR`` computes it), its vocabulary, pad token and its tokenizer's hash and padding side."""

    sha256: str
    vocab_size: int | None
    pad_token_id: int | None
    tokenizer_sha256: str | None
    padding_side: str | None


def _plain(value: Any) -> Any:
    """A peft config value as JSON: enums by value, sets sorted, nested containers too."""
    if isinstance(value, enum.Enum):  # peft's PeftType and TaskType: their values
        return _plain(value.value)
    if isinstance(value, str):
        return str(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | str) and not isinstance(value, bool) and str(value).isdigit() else None


class LoraApp(LockedPickle):
    """A FlowerTune-style app: its clients fine-tune a LoRA adapter (peft) on a frozen causal language model and
    send only the adapter's arrays, named as peft's ``get_peft_model_state_dict`` names them
    (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``). Give it to :class:`GleakCaptureMod` and
    :class:`GleakAuditStrategy` as ``lora=``.

    ``base_model``: the Hugging Face folder the clients fine-tune (config.json, safetensors weights, tokenizer),
    loaded offline and only to hash its tensors (once per process; ``trust_remote_code`` as for ``gleak audit``).
    ``peft_config``: the adapter's settings, a ``peft.LoraConfig``, the ``adapter_config.json`` contents as a
    mapping, or an adapter folder; ``target_modules`` and ``r`` left out are read from the arrays, ``lora_alpha``
    defaults to peft's 8. ``max_length``: the truncation length the clients tokenise with (recorded as
    ``gleak.max_length``; without it, the widest recorded batch). ``base_sha256``: the base model's hash when
    known (``LoraApp(...).describe().sha256``, once, e.g. on the server), so that no client process loads the base
    model to hash it. Raises GleakError for a folder or a config gleak cannot use."""

    def __init__(self, base_model: str | os.PathLike[str], peft_config: Any, *, max_length: int | None = None,
                 base_sha256: str | None = None, trust_remote_code: bool = False) -> None:
        from gleak.models.peft import is_adapter_dir, lora_settings, read_adapter_config
        from gleak.models.text import CONFIG_FILE

        self.base_model = Path(base_model)
        if not (self.base_model / CONFIG_FILE).is_file():
            raise GleakError(f"LoraApp: {self.base_model} is not a Hugging Face model folder (no {CONFIG_FILE}); "
                             "pass the base model the clients fine-tune")
        if isinstance(peft_config, str | os.PathLike):
            if not is_adapter_dir(peft_config):
                raise GleakError(f"LoraApp: {peft_config} is not a peft adapter folder (no adapter_config.json)")
            config = dict(read_adapter_config(peft_config))
        elif isinstance(peft_config, Mapping):
            config = _plain(peft_config)
        elif callable(getattr(peft_config, "to_dict", None)):
            config = _plain(peft_config.to_dict())
        else:
            raise GleakError(f"LoraApp: peft_config is a {type(peft_config).__name__}; expected a peft LoraConfig, "
                             "the adapter_config.json contents as a dict, or an adapter folder")
        config.setdefault("peft_type", "LORA")
        if config["peft_type"] != "LORA" or config.get("use_dora"):
            raise GleakError(f"LoraApp: a {'DoRA' if config.get('use_dora') else config['peft_type']} adapter is not "
                             "supported; gleak reads plain LoRA (peft_type LORA)")
        config["inference_mode"] = True  # as peft saves an adapter
        lora_settings({"r": 8, "target_modules": ["any"], **{k: v for k, v in config.items() if v is not None}},
                      where="LoraApp's peft_config")  # r and alpha, when given, are valid
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise GleakError(f"LoraApp: max_length must be a positive integer, got {max_length!r}")
        if base_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", base_sha256):
            raise GleakError("LoraApp: base_sha256 must be 64 lower-case hex digits (LoraApp(...).describe().sha256)")
        self.config: dict[str, Any] = config
        self.max_length, self.trust_remote_code = max_length, trust_remote_code
        self._given_sha256 = base_sha256
        self._info: BaseModelInfo | None = None
        self._lock = threading.Lock()

    def adapter_config(self, arrays: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The ``adapter_config.json`` of an adapter with these arrays: the given config, its ``target_modules`` and
        ``r`` read from the arrays when it leaves them out. Raises GleakError when the arrays are not a LoRA
        adapter's or disagree with the config."""
        from gleak.attacks.tokens.adapters import LORA_NAME
        from gleak.models.peft import lora_settings

        matches = {name: LORA_NAME.match(name) for name in arrays}
        odd = [name for name, m in matches.items() if m is None]
        if odd or not arrays:
            raise GleakError("the arrays are not a LoRA adapter's" + (f": '{shorten(odd[0], 80)}' is not a lora_A / "
                             "lora_B weight" if odd else " (none)") + " (a FlowerTune client sends "
                             "get_peft_model_state_dict(model); modules_to_save are not supported)")
        config = dict(self.config)
        if not config.get("target_modules"):
            config["target_modules"] = sorted({m["module"].rsplit(".", 1)[-1] for m in matches.values() if m})
        ranks = {int(arrays[n].shape[0]) for n, m in matches.items()
                 if m and m["factor"] == "lora_A" and arrays[n].dim() == 2}
        if config.get("r") is None and len(ranks) == 1:
            config["r"] = ranks.pop()
        elif not config.get("rank_pattern") and ranks and ranks != {config.get("r", 8)}:
            raise GleakError(f"the adapter's lora_A arrays have rank {', '.join(map(str, sorted(ranks)))}; the LoRA "
                             f"config says r = {config.get('r', 8)}")
        lora_settings(config, where="LoraApp's peft_config")
        return config

    def describe(self) -> BaseModelInfo:
        """The base model's hash and text keys: computed once (the model is loaded to hash it, then let go, unless
        ``base_sha256`` was given)."""
        with self._lock:
            if self._info is None:
                self._info = self._describe()
            return self._info

    def load(self) -> LoadedModel:
        """The base model, loaded as ``gleak audit --model DIR`` loads it (what the server-side audit attacks with)."""
        from gleak.models.loading import load_text_model

        loaded = load_text_model(self.base_model, trust_remote_code=self.trust_remote_code)
        with self._lock:
            self._info = self._info or self._from_loaded(loaded)
        return loaded

    def _describe(self) -> BaseModelInfo:
        from gleak.io import read_json_input
        from gleak.models.text import read_config, task_of, tokenizer_sha256

        if self._given_sha256 is None:
            from gleak.models.loading import load_text_model

            return self._from_loaded(load_text_model(self.base_model, trust_remote_code=self.trust_remote_code))
        config = read_config(self.base_model)
        task, _ = task_of(config, str(self.base_model))
        if task != "causal_lm":
            raise GleakError(f"{self.base_model}: LoRA captures support causal language models for now")
        tok_config = self.base_model / "tokenizer_config.json"
        tok = read_json_input(tok_config, "tokenizer config") if tok_config.is_file() else {}
        side = tok.get("padding_side") if isinstance(tok, dict) else None
        return BaseModelInfo(sha256=self._given_sha256, vocab_size=_int(config.get("vocab_size")),
                             pad_token_id=_int(config.get("pad_token_id")),
                             tokenizer_sha256=tokenizer_sha256(self.base_model),
                             padding_side=side if side in ("left", "right") else "right")

    def _from_loaded(self, loaded: LoadedModel) -> BaseModelInfo:
        meta = loaded.metadata
        if meta.get("gleak.task") != "causal_lm":
            raise GleakError(f"{self.base_model}: LoRA captures support causal language models for now")
        if self._given_sha256 is not None and self._given_sha256 != loaded.weights_sha256:
            raise GleakError(f"LoraApp: base_sha256 {self._given_sha256[:12]}… is not the hash of {self.base_model} "
                             f"({loaded.weights_sha256[:12]}…)")
        return BaseModelInfo(sha256=loaded.weights_sha256, vocab_size=_int(meta.get("gleak.vocab_size")),
                             pad_token_id=_int(meta.get("gleak.pad_token_id")),
                             tokenizer_sha256=meta.get("gleak.tokenizer.sha256"),
                             padding_side=meta.get("gleak.tokenizer.padding_side"))


class _LoraRecorder(CaptureRecorder):
    """The recorder of a :class:`LoraApp`: the capture of an adapter update (``capture_lora_update``), a text truth,
    and the round's global adapter as a peft adapter folder, under ``models/`` once per round and beside each
    capture (``client-<id>.adapter/``, where the ``lora-tokens`` attack reads it)."""

    def __init__(self, root: str | Path, lora: LoraApp, *, save_global: bool, force: bool, producer: str) -> None:
        super().__init__(root, save_global=save_global, force=force, producer=producer)
        self.lora = lora

    def global_adapter_path(self, round: int | None, sha256: str) -> Path:
        prefix = f"round-{round:04d}" if round is not None else "round-unknown"
        return self.root / MODELS_DIR / f"{prefix}-{sha256[:12]}.adapter"

    def build(self, global_state: Mapping[str, torch.Tensor], local_state: Mapping[str, torch.Tensor],
              record: ClientRecord) -> tuple[Capture, Truth | TextTruth | None]:
        from gleak.models.peft import check_same_tensors

        config = self.lora.adapter_config(global_state)
        check_same_tensors(global_state, local_state)
        base = self.lora.describe()
        truth = None
        if record.inputs is not None and record.attention_mask is not None:
            truth = TextTruth(input_ids=record.inputs.detach().cpu().long(),
                              attention_mask=record.attention_mask.detach().cpu().long())
        steps, batch = record.local_steps, record.batch_size
        if steps is None and truth is not None and batch and truth.num_examples % batch == 0:
            steps = truth.num_examples // batch
        meta = self.record_meta(record)
        if isinstance(config.get("base_model_name_or_path"), str) and config["base_model_name_or_path"]:
            meta["gleak.peft.base_model"] = config["base_model_name_or_path"]
        width = int(truth.input_ids.shape[1]) if truth is not None else None
        capture = capture_lora_update(
            global_state, local_state, adapter_config=config, base_sha256=base.sha256, vocab_size=base.vocab_size,
            learning_rate=record.learning_rate, local_steps=steps, batch_size=batch, optimizer=record.optimizer,
            momentum=record.momentum if record.optimizer in ("sgdm", "nag") else None,
            weight_decay=record.weight_decay, tokenizer_sha256=base.tokenizer_sha256, padding_side=base.padding_side,
            max_length=self.lora.max_length or width, pad_token_id=base.pad_token_id, metadata=meta)
        capture.extra.update({k: str(v) for k, v in record.extra.items()})
        if record.num_examples is not None:
            capture.extra.setdefault("fl.reported_examples", str(int(record.num_examples)))
        if truth is not None:
            examples = capture.meta.get("gleak.num_examples")
            if examples not in (None, truth.num_examples):
                log.warning("gleak: %s: the client recorded %d sequences but trained on %s (B × m); no truth file "
                            "written", record.client, truth.num_examples, examples)
                truth = None
            else:
                truth.meta = {k: v for k, v in (("gleak.batch_size", batch), ("gleak.local_steps", steps))
                              if v is not None}
        return capture, truth

    def write_companions(self, capture: Capture, global_state: Mapping[str, torch.Tensor] | None,
                         record: ClientRecord, path: Path) -> None:
        """The round's global adapter: under ``models/`` when ``save_global``, and beside the capture always (the
        LoRA attacks read a fresh adapter's span through it)."""
        from gleak.models.peft import adapter_path_for, save_adapter

        if global_state is None:
            return
        config = self.lora.adapter_config(global_state)
        tensors = {k: v.detach().cpu().contiguous() for k, v in global_state.items()}
        if self.save_global:
            self._write_round_adapter(config, tensors, record.round, str(capture.meta["gleak.peft.adapter.sha256"]))
        save_adapter(adapter_path_for(path), config, tensors, force=self.force)

    def _write_round_adapter(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], round: int | None,
                             sha256: str) -> None:
        from gleak.models.peft import is_adapter_dir, save_adapter

        target = self.global_adapter_path(round, sha256)
        with self._lock:
            if str(target) in self._saved_globals:
                return
        if not is_adapter_dir(target):  # every client of the round holds the same adapter: the first one writes it
            try:
                save_adapter(target, config, tensors)
            except GleakError:
                if not is_adapter_dir(target):  # another client of the round won the race: that folder is the same
                    raise
        with self._lock:
            self._saved_globals.add(str(target))


def _refuse_image_options(**options: Any) -> None:
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise GleakError(f"{', '.join(given)}: image-model options; with lora= the model is the LoraApp's base model "
                         "and the loss is next-token cross-entropy")


class GleakCaptureMod:
    """A Flower client mod that writes one capture per client per round (see the module docs).

    ``out_dir``: where the captures go (``round-NNNN/client-<node id>.safetensors``, global models under
    ``models/``). ``arch`` / ``arch_kwargs``: the model's gleak arch spec, stored with the global models so
    ``gleak audit`` can load them. ``background`` (default): the capture is written by a writer thread while
    the client's reply goes back (the round waits only for a reference to the two ArrayRecords); call
    :meth:`flush` to wait for it. ``defense``: what the mods between this one and the client app do to the reply,
    in the order applied (Flower's ``LocalDpMod`` objects, or mappings with a ``name``; :func:`defense_record`),
    stamped as every capture's ``gleak.defense``; this mod must be outside them in the chain to capture what they
    send (the module docs). ``lora``: the app fine-tunes a LoRA adapter on a language model and exchanges only its
    arrays (:class:`LoraApp`, FlowerTune): every capture is then a LoRA capture (docs/capture-format.md, "LoRA
    captures"), the round's global adapter is written as a peft adapter folder (``models/round-NNNN-<sha12>.adapter``
    when ``save_global``, and ``client-<id>.adapter/`` beside each capture), and the image options (``arch``,
    ``loss``, ``input_shape``, ``mean``, ``std``) do not apply. The rest describe the client's training when its
    messages do not."""

    def __init__(self, out_dir: str | Path, *, arch: str | None = None, arch_kwargs: Mapping[str, Any] | None = None,
                 learning_rate: float | None = None, local_steps: int | None = None,
                 local_epochs: float | None = None, batch_size: int | None = None, optimizer: str | None = None,
                 momentum: float | None = None, weight_decay: float | None = None, loss: LossSpec | None = None,
                 input_shape: Sequence[int] | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, save_global: bool = True, force: bool = False,
                 background: bool = True, defense: Sequence[Any] | None = None, lora: LoraApp | None = None) -> None:
        self.defense = [defense_record(d) for d in defense or ()]  # a configuration error raises here, not per round
        self.lora = lora
        self.recorder: CaptureRecorder
        if lora is not None:
            _refuse_image_options(arch=arch, arch_kwargs=arch_kwargs, loss=loss, input_shape=input_shape, mean=mean,
                                  std=std)
            self.recorder = _LoraRecorder(out_dir, lora, save_global=save_global, force=force, producer="flower mod")
        else:
            self.recorder = CaptureRecorder(out_dir, arch=arch, arch_kwargs=arch_kwargs, save_global=save_global,
                                            input_shape=input_shape, mean=mean, std=std, loss=loss, force=force,
                                            producer="flower mod")
        self.metadata = _Metadata(learning_rate, local_steps, local_epochs, batch_size, optimizer, momentum,
                                  weight_decay)
        self.background = background
        self._writer = _BackgroundWriter()

    def __getstate__(self) -> dict[str, Any]:  # shipped to simulation workers: a fresh writer there
        state = dict(self.__dict__)
        state["_writer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._writer = _BackgroundWriter()

    def flush(self) -> None:
        """Wait until every capture submitted so far is written."""
        self._writer.flush()

    def __call__(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        with contextlib.suppress(Exception):  # a previous round's leftovers must not become this round's truth
            _pop_batches(context)
        started = time.perf_counter()
        reply = call_next(msg, context)
        trained = time.perf_counter()
        job = None
        try:
            job = self._prepare(msg, context, reply)
        except Exception as e:  # the mod must never break training
            log.warning("gleak: capture skipped: %s", shorten(f"{type(e).__name__}: {e}", 300))
        if job is not None:
            node, message_id, train = str(context.node_id), msg.metadata.message_id, trained - started

            def write() -> None:
                begun = time.perf_counter()
                path = job()
                self._log_timing(node, message_id, path, train, blocking, time.perf_counter() - begun)

            blocking = time.perf_counter() - trained
            if self.background:
                self._writer.submit(write)
            else:
                write()
        return reply

    def _log_timing(self, node: str, message_id: str, path: Path | None, train: float, blocking: float,
                    write: float) -> None:
        """One JSON line per train message in ROOT/gleak-mod.jsonl: the client app's time, what the mod added to
        the round (blocking) and the time spent writing (in the writer thread when ``background``)."""
        line = {"node_id": node, "message_id": message_id, "capture": str(path) if path else None,
                "train_seconds": round(train, 6), "blocking_seconds": round(blocking, 6),
                "write_seconds": round(write, 6), "background": self.background}
        with contextlib.suppress(OSError):
            self.recorder.root.mkdir(parents=True, exist_ok=True)
            with (self.recorder.root / TIMINGS_FILE).open("a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")  # one short append: whole lines even with parallel clients

    def _prepare(self, msg: Message, context: Context, reply: Message) -> Callable[[], Path | None] | None:
        """Read what the capture needs from the messages (references, no copies); the writing is returned."""
        batches = _pop_batches(context)
        if reply.has_error() or not reply.has_content():
            return None
        sent, returned = _single_arrays(msg), _single_arrays(reply)
        if sent is None or returned is None:
            log.warning("gleak: capture skipped: the train message and its reply must each hold one ArrayRecord")
            return None
        sent_arrays, returned_arrays = dict(sent.items()), dict(returned.items())
        configs = _records(msg, (ConfigRecord,))
        round = next((r for r in (_round(c) for c in configs) if r is not None), None)
        extra = {"flower.node_id": str(context.node_id), "flower.run_id": str(context.run_id)}
        for key in ("partition-id", "num-partitions"):
            if key in context.node_config:
                extra[f"flower.{key}"] = str(context.node_config[key])
        if batches and _is_tokens(batches) != (self.lora is not None):
            log.warning("gleak: the client app recorded %s batches, but the mod %s; no truth file written",
                        "token" if _is_tokens(batches) else "image",
                        "captures LoRA updates of a language model" if self.lora is not None
                        else "has no LoraApp (lora=) for a language model")
            batches = None
        sources = [dict(r) for r in (*_records(reply), *configs, context.run_config)]
        if self.lora is not None and batches and len(sizes := {int(r["input_ids"].shape[0]) for r in batches}) == 1:
            sources.append({"batch_size": sizes.pop()})  # last resort: every recorded batch had this many sequences
        record = self.metadata.record(round, str(context.node_id), sources, extra, len(batches) if batches else None)
        record.defense = self.defense or None  # the recorder copies them into the capture
        lora = self.lora

        def job() -> Path | None:
            if lora is not None and batches:
                try:
                    info = lora.describe()
                    ids, mask = _token_batches(batches, info.pad_token_id or 0, info.padding_side == "left")
                    record.inputs, record.attention_mask = ids, mask
                except Exception as e:  # the capture is still worth writing
                    log.warning("gleak: no truth file for %s: %s", record.client,
                                shorten(f"{type(e).__name__}: {e}", 300))
            elif (truth := _batches(batches)) is not None:
                record.inputs, record.labels = truth[0], truth[1]
            return self.recorder.write(_state(sent_arrays), _state(returned_arrays), record)

        return job


GUARD_ERROR_CODE = 46  # the Error code of a round the guard refused (issue 46)
GUARD_MODE_KEY = "gleak-guard-mode"  # run config key overriding the mod's mode: refuse, warn or off


class GleakGuardMod:
    """A Flower client mod that checks the received global model before local training (``gleak check-model``'s
    weight tests; docs/methods/server.md): ``ClientApp(mods=[GleakGuardMod(), ...])``, first in the list so that
    it runs before anything trains on or sends from the model.

    On a ``train`` message whose model carries a trap structure it refuses the round: the reply is an error with
    one short line (``gleak: model refused: GLEAK-SERVER-IMPRINT layer fc1 (...)``), logged too, and the training
    function is never called. ``mode="warn"`` logs the line and trains; ``"off"`` checks nothing; the run config's
    ``gleak-guard-mode`` overrides ``mode``. ``model``: the client's own model (the received arrays are loaded into
    a copy, keys and shapes checked first); without it the arrays are read as bare matrices. An internal error of
    the guard is logged and the round trains, unless ``fail_closed``. Evaluate messages are never refused."""

    def __init__(self, mode: str = "refuse", *, model: torch.nn.Module | None = None, refuse_suspicious: bool = False,
                 fail_closed: bool = False) -> None:
        from gleak.integrations.guard import MODES

        if mode not in MODES:
            raise GleakError(f"GleakGuardMod mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.model = mode, model
        self.refuse_suspicious, self.fail_closed = refuse_suspicious, fail_closed

    def __call__(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        from gleak.integrations.guard import MODES, guard

        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        mode = str(context.run_config.get(GUARD_MODE_KEY, self.mode))
        if mode not in MODES:
            log.warning("gleak: %s = %r is not one of %s; using %s", GUARD_MODE_KEY, mode, ", ".join(MODES), self.mode)
            mode = self.mode
        try:
            sent = _single_arrays(msg)
            if sent is None:
                raise GleakError("the train message does not hold one ArrayRecord")
            verdict = guard(_state(dict(sent.items())), mode, self.model,
                            self.refuse_suspicious)
        except Exception as e:  # the guard must not break training unless told to fail closed
            line = f"gleak: model check failed: {shorten(f'{type(e).__name__}: {e}', 200)}"
            log.warning(line)
            if self.fail_closed:
                return _error_reply(msg, line + " (fail_closed)")
            return call_next(msg, context)
        if verdict.refused:
            log.warning(verdict.line())
            return _error_reply(msg, verdict.line())
        if verdict.hits:
            log.warning(verdict.line())
        return call_next(msg, context)


def _error_reply(msg: Message, reason: str) -> Message:
    """An error reply to ``msg`` (Message(Error, reply_to=...) where flwr has it, else create_error_reply)."""
    from flwr.app import Error

    error = Error(code=GUARD_ERROR_CODE, reason=reason)
    try:
        return Message(error, reply_to=msg)
    except TypeError:  # older flwr: the reply is made from the message
        return msg.create_error_reply(error)


class GleakAuditStrategy(Strategy):
    """Wrap a server strategy: audit every training reply's labels with the round's global weights.

    ``model``: the global model's architecture, an arch spec (``lenet``, ``torchvision:resnet18``…) or a module
    of that architecture. ``aux``: auxiliary data (a path or :class:`gleak.data.images.Dataset`) for the attacks that
    need it. ``log_path``: the JSON lines file (one line per client per round: counts per attack, findings,
    seconds). ``capture_dir``: also write each reply as a capture there. ``confidence``: batches simulated per
    round to calibrate the attacks (GLEAK-LABELS-EXPECTED findings; 0: off). Metadata arguments as for
    :class:`GleakCaptureMod`. The wrapped strategy sees the replies unchanged.

    ``lora`` instead of ``model``: the clients fine-tune a LoRA adapter on a language model (:class:`LoraApp`,
    FlowerTune). Each reply is then the client's adapter: gleak's token attacks (``lora-tokens`` and, beyond the
    rank, ``sparse-tokens`` read the bag of input tokens from the first block's adapters) run on its update against
    the base model, loaded once here, with the round's global adapter; each JSON line holds the token ids and counts
    each attack recovered (never decoded text), or why it did not run."""

    def __init__(self, strategy: Strategy, *, model: nn.Module | str | None = None, log_path: str | Path,
                 arch_kwargs: Mapping[str, Any] | None = None, aux: Any = None, capture_dir: str | Path | None = None,
                 learning_rate: float | None = None, local_steps: int | None = None,
                 local_epochs: float | None = None, batch_size: int | None = None, optimizer: str | None = None,
                 momentum: float | None = None, weight_decay: float | None = None, loss: LossSpec | None = None,
                 input_shape: Sequence[int] | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, seed: int = 0, force: bool = False,
                 confidence: int = 24, lora: LoraApp | None = None) -> None:
        from gleak.data.images import Dataset, load_dataset
        from gleak.runs.audit import AuditConfig

        super().__init__()
        if (model is None) == (lora is None):
            raise GleakError("GleakAuditStrategy: pass model= (the global model's architecture) or lora= (a LoraApp: "
                             "clients that fine-tune a LoRA adapter), one of the two")
        if lora is not None:
            _refuse_image_options(arch_kwargs=arch_kwargs, aux=aux, loss=loss, input_shape=input_shape, mean=mean,
                                  std=std)
        self.strategy = strategy
        self.model, self.arch_kwargs = model, dict(arch_kwargs or {})
        self.lora = lora
        self.base: LoadedModel | None = lora.load() if lora is not None else None  # a wrong folder raises here
        self.log_path = Path(log_path)
        if self.log_path.exists() and not force:
            raise GleakError(f"{self.log_path} already exists; pass force=True to overwrite it")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        if isinstance(aux, Dataset) or aux is None:
            self.aux = aux
            self.aux_path = Path(aux.source) if isinstance(aux, Dataset) else None
        else:
            self.aux, self.aux_path = load_dataset(aux), Path(aux)
        arch = model if isinstance(model, str) else None
        shape = list(input_shape) if input_shape is not None else None
        if shape is None and self.aux is not None:
            shape = list(self.aux.input_shape)
        self.recorder: CaptureRecorder
        if lora is not None:
            self.recorder = _LoraRecorder(capture_dir or self.log_path.parent, lora, save_global=True, force=force,
                                          producer="flower strategy")
        else:
            self.recorder = CaptureRecorder(capture_dir or self.log_path.parent, arch=arch, arch_kwargs=arch_kwargs,
                                            input_shape=shape, mean=mean, std=std, loss=loss, force=force,
                                            producer="flower strategy")
        self.write_captures = capture_dir is not None
        self.metadata = _Metadata(learning_rate, local_steps, local_epochs, batch_size, optimizer, momentum,
                                  weight_decay)
        self.config = AuditConfig(seed=seed, device="cpu", lpips="off", allow_model_mismatch=False,
                                  confidence=confidence).resolved()  # --max-memory's default: once, here
        self._round: dict[int, tuple[ArrayRecord, ConfigRecord]] = {}
        self.rounds: dict[int, list[dict[str, Any]]] = {}  # what was logged, per round (also in the file)

    # ------------------------------------------------------------------------------------------ delegation
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._round = {server_round: (arrays, config)}  # only the round at hand is kept
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        try:
            self._audit(server_round, replies)
        except Exception as e:  # auditing must never stop the federation
            log.warning("gleak: round %s not audited: %s", server_round, shorten(f"{type(e).__name__}: {e}", 300))
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()
        log.info("gleak: %s attacks on every training reply; findings in %s",
                 "token" if self.lora is not None else "label", self.log_path)

    # ------------------------------------------------------------------------------------------ auditing
    def _audit_replies(self, server_round: int, replies: list[Message], global_state: dict[str, torch.Tensor],
                       config: ConfigRecord, audit: Callable[[Capture, str], dict[str, Any]]
                       ) -> list[dict[str, Any]]:
        """One JSON line per reply: its capture built (and written when asked) and audited by ``audit`` (capture,
        node id -> the line's fields), timed; a reply that fails gets its one-line error. The lines are appended to
        the log and kept under the round."""
        lines: list[dict[str, Any]] = []
        for reply in replies:
            node = str(reply.metadata.src_node_id)
            line: dict[str, Any] = {"round": server_round, "node_id": node}
            started = time.perf_counter()
            returned = _single_arrays(reply) if not reply.has_error() and reply.has_content() else None
            if returned is None:
                line.update(status="skipped", reason="the reply holds an error or no single ArrayRecord")
            else:
                try:
                    record = self.metadata.record(server_round, node, [*_records(reply), config], {})
                    capture, _ = self.recorder.build(global_state, _state(returned), record)
                    if self.write_captures:
                        self.recorder.write_built(capture, None, global_state, record)
                    line.update(audit(capture, node))
                except GleakError as e:
                    line.update(status="error", error=str(e))
            line["seconds"] = round(time.perf_counter() - started, 4)
            lines.append(line)
        with self.log_path.open("a", encoding="utf-8") as out:
            for line in lines:
                out.write(json.dumps(line, sort_keys=True) + "\n")
        self.rounds[server_round] = lines
        return lines

    def _audit(self, server_round: int, replies: list[Message]) -> None:
        from gleak.attacks.labels.confidence import CalibrationCache
        from gleak.models.loading import model_from_state
        from gleak.runs.audit import audit_loaded
        from gleak.runs.audit.server import ModelChecks

        if server_round not in self._round:
            log.warning("gleak: round %s: no global weights recorded (configure_train was not called)", server_round)
            return
        arrays, config = self._round[server_round]
        if self.lora is not None:
            self._audit_lora(server_round, replies, arrays, config)
            return
        global_state = _state(arrays)
        assert self.model is not None  # the constructor takes model= or lora=
        loaded = model_from_state(self.model, global_state, self.arch_kwargs,
                                  tuple(self.recorder.input_shape) if self.recorder.input_shape else None,
                                  f"Flower global model, round {server_round}")
        auxes = [(self.aux_path or Path("aux"), self.aux)] if self.aux is not None else []
        cache: dict[tuple[Any, ...], dict[str, Any]] = {}  # the round's model: its aux forwards, shared by replies
        calibrations = CalibrationCache()  # the round's model: calibrated once for all replies
        checks = ModelChecks()  # the round's model: checked once for a server's structures
        def audit_labels(capture: Capture, node: str) -> dict[str, Any]:
            report, findings, _ = audit_loaded(capture, loaded, auxes, self.config, cache=cache,
                                               calibration_cache=calibrations, model_checks=checks,
                                               name=f"flower://round-{server_round}/node-{node}")
            return dict(status=report.status, error=report.error, batch_size=report.batch_size,
                        local_steps=report.local_steps,
                        attacks=[{"attack": a.attack, "status": a.status, "counts": a.counts, "reason": a.reason}
                                 for a in report.attacks if a.task == "labels"],
                        findings=[f.model_dump(exclude_none=True) for f in findings])

        lines = self._audit_replies(server_round, replies, global_state, config, audit_labels)
        ran = sorted({a["attack"] for line in lines for a in line.get("attacks", []) if a["status"] == "ok"})
        recovered = sum(any(a["status"] == "ok" for a in line.get("attacks", [])) for line in lines)
        agreeing = sum(any(f.get("rule") == "GLEAK-LABELS-AGREE" for f in line.get("findings", [])) for line in lines)
        expected = [f for line in lines for f in line.get("findings", []) if f.get("rule") == "GLEAK-LABELS-EXPECTED"]
        estimate = (f"; expected iAcc {max(f['measured'] for f in expected):.2f} (chance "
                    f"{min(f['chance'] for f in expected):.2f}) on simulated batches" if expected else "")
        log.info("gleak: round %s: %d replies audited; label counts recovered from %d (%s), independent attacks "
                 "agree on %d%s; details in %s", server_round, len(lines), recovered, ", ".join(ran) or "no attack "
                 "applied", agreeing, estimate, self.log_path)

    def _audit_lora(self, server_round: int, replies: list[Message], arrays: ArrayRecord, config: ConfigRecord) -> None:
        """The token attacks on each reply's adapter update (see the class docs); one JSON line per client."""
        from gleak.models.peft import adapter_path_for, is_adapter_dir, save_adapter
        from gleak.runs.audit import audit_loaded

        assert self.lora is not None and self.base is not None
        global_state = _state(arrays)
        with tempfile.TemporaryDirectory(prefix="gleak-round-") as scratch:
            # lora-tokens reads the global adapter beside the capture (NAME.adapter/): a capture not written to disk
            # stands at a path in a scratch folder that holds the round's adapter
            stand_in = Path(scratch) / f"round-{server_round:04d}.safetensors"

            def audit_tokens(capture: Capture, node: str) -> dict[str, Any]:
                assert self.lora is not None and self.base is not None
                if capture.path is None or not is_adapter_dir(adapter_path_for(capture.path)):
                    if not is_adapter_dir(adapter_path_for(stand_in)):
                        save_adapter(adapter_path_for(stand_in), self.lora.adapter_config(global_state), global_state)
                    capture.path = stand_in
                report, _, _ = audit_loaded(capture, self.base, [], self.config,
                                            name=f"flower://round-{server_round}/node-{node}",
                                            model_folder=self.lora.base_model)
                return dict(status=report.status, error=report.error, batch_size=report.batch_size,
                            local_steps=report.local_steps, attacks=[_token_line(t) for t in report.tokens or []])

            lines = self._audit_replies(server_round, replies, global_state, config, audit_tokens)
        recovered = [line for line in lines if any(a["status"] == "ok" and a["token_ids"]
                                                   for a in line.get("attacks", []) if a["attack"] != "union")]
        tokens = sorted(len(a["token_ids"]) for line in recovered for a in line["attacks"] if a["attack"] == "union")
        # why the adapter's tokens were not read, on replies where neither the span test nor the sparse fit was
        reasons = sorted({a["reason"] for line in lines if line not in recovered for a in line.get("attacks", [])
                          if a["attack"] in ("lora-tokens", "sparse-tokens") and a["status"] != "ok" and a["reason"]})
        log.info("gleak: round %s: %d replies audited; input tokens recovered from %d%s%s; details in %s", server_round,
                 len(lines), len(recovered), f" (median {tokens[len(tokens) // 2]} distinct tokens)" if tokens else "",
                 f"; not read from the others: {shorten(reasons[0], 160)}" if reasons else "",
                 self.log_path)


def _token_line(result: TokenResult) -> dict[str, Any]:
    """One token attack's result in the strategy's JSON line: ids and counts, never decoded text."""
    tokens = result.tokens or []
    line = {"attack": result.attack, "status": result.status, "reason": result.reason,
            "token_ids": [t.id for t in tokens], "counts": [t.count for t in tokens]}
    if result.diagnostics and "case" in result.diagnostics:
        line["read"] = result.diagnostics["case"]  # lora-tokens: the factor it read (lora_A, or lora_B through A)
    return line
