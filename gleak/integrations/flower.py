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
* :class:`GleakAuditStrategy` — wraps any server strategy (``GleakAuditStrategy(FedAvg(...), model=...)``):
  each round it runs gleak's label attacks on every reply with that round's global weights, appends one JSON
  line per client to a log file and logs a summary line, then lets the wrapped strategy aggregate.

Where the metadata comes from: the mod's own arguments first (what you know about your client code), then the
reply's metric and config records, then the ``train`` message's config records, then the run config. Keys
looked up are in :data:`METADATA_KEYS` (Flower apps use ``lr``, ``local-epochs``, ``batch-size``…).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from torch import nn

from gleak.errors import GleakError, shorten
from gleak.integrations.recorder import CaptureRecorder, ClientRecord, defense_entry, local_steps_from_epochs
from gleak.losses import LossSpec

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


def record_batch(context: Context, inputs: torch.Tensor, labels: torch.Tensor) -> None:
    """Call from a client app with each batch it trains on (model-ready inputs, class labels or soft labels);
    :class:`GleakCaptureMod` then writes them as the capture's ground truth and clears them. Kept in
    ``context.state``, which Flower keeps on the node."""
    step = sum(1 for key in context.state if key.startswith(BATCH_KEY))
    context.state[f"{BATCH_KEY}{step}"] = ArrayRecord({
        "inputs": Array(inputs.detach().cpu().contiguous().numpy()),
        "labels": Array(labels.detach().cpu().contiguous().numpy())})


def _pop_batches(context: Context) -> list[ArrayRecord] | None:
    """Take the batches record_batch left in ``context.state`` (references; converted later, off the round)."""
    keys = sorted((k for k in list(context.state) if k.startswith(BATCH_KEY)), key=lambda k: int(k[len(BATCH_KEY):]))
    if not keys:
        return None
    records = [context.state[k] for k in keys]
    for k in keys:
        del context.state[k]
    arrays = [r for r in records if isinstance(r, ArrayRecord) and {"inputs", "labels"} <= set(r)]
    if len(arrays) != len(records):
        raise GleakError("context.state holds gleak.batch.* entries that record_batch did not write")
    return arrays


def _batches(records: list[ArrayRecord] | None) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    if not records:
        return None
    inputs = torch.cat([_tensor(r["inputs"]) for r in records])
    labels = torch.cat([_tensor(r["labels"]) for r in records])
    return inputs, labels, len(records)


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


class GleakCaptureMod:
    """A Flower client mod that writes one capture per client per round (see the module docs).

    ``out_dir``: where the captures go (``round-NNNN/client-<node id>.safetensors``, global models under
    ``models/``). ``arch`` / ``arch_kwargs``: the model's gleak arch spec, stored with the global models so
    ``gleak audit`` can load them. ``background`` (default): the capture is written by a writer thread while
    the client's reply goes back (the round waits only for a reference to the two ArrayRecords); call
    :meth:`flush` to wait for it. ``defense``: what the mods between this one and the client app do to the reply,
    in the order applied (Flower's ``LocalDpMod`` objects, or mappings with a ``name``; :func:`defense_record`),
    stamped as every capture's ``gleak.defense``; this mod must be outside them in the chain to capture what they
    send (the module docs). The rest describe the client's training when its messages do not."""

    def __init__(self, out_dir: str | Path, *, arch: str | None = None, arch_kwargs: Mapping[str, Any] | None = None,
                 learning_rate: float | None = None, local_steps: int | None = None,
                 local_epochs: float | None = None, batch_size: int | None = None, optimizer: str | None = None,
                 momentum: float | None = None, weight_decay: float | None = None, loss: LossSpec | None = None,
                 input_shape: Sequence[int] | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, save_global: bool = True, force: bool = False,
                 background: bool = True, defense: Sequence[Any] | None = None) -> None:
        self.defense = [defense_record(d) for d in defense or ()]  # a configuration error raises here, not per round
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
        sources = [dict(r) for r in (*_records(reply), *configs, context.run_config)]
        record = self.metadata.record(round, str(context.node_id), sources, extra, len(batches) if batches else None)
        record.defense = self.defense or None  # the recorder copies them into the capture

        def job() -> Path | None:
            truth = _batches(batches)
            if truth is not None:
                record.inputs, record.labels = truth[0], truth[1]
            return self.recorder.write(_state(sent_arrays), _state(returned_arrays), record)

        return job


class GleakAuditStrategy(Strategy):
    """Wrap a server strategy: audit every training reply's labels with the round's global weights.

    ``model``: the global model's architecture, an arch spec (``lenet``, ``torchvision:resnet18``…) or a module
    of that architecture. ``aux``: auxiliary data (a path or :class:`gleak.data.Dataset`) for the attacks that
    need it. ``log_path``: the JSON lines file (one line per client per round: counts per attack, findings,
    seconds). ``capture_dir``: also write each reply as a capture there. ``confidence``: batches simulated per
    round to calibrate the attacks (GLEAK-LABELS-EXPECTED findings; 0: off). Metadata arguments as for
    :class:`GleakCaptureMod`. The wrapped strategy sees the replies unchanged."""

    def __init__(self, strategy: Strategy, *, model: nn.Module | str, log_path: str | Path,
                 arch_kwargs: Mapping[str, Any] | None = None, aux: Any = None, capture_dir: str | Path | None = None,
                 learning_rate: float | None = None, local_steps: int | None = None,
                 local_epochs: float | None = None, batch_size: int | None = None, optimizer: str | None = None,
                 momentum: float | None = None, weight_decay: float | None = None, loss: LossSpec | None = None,
                 input_shape: Sequence[int] | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, seed: int = 0, force: bool = False,
                 confidence: int = 24) -> None:
        from gleak.data import Dataset, load_dataset
        from gleak.runs.audit import AuditConfig

        super().__init__()
        self.strategy = strategy
        self.model, self.arch_kwargs = model, dict(arch_kwargs or {})
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
        log.info("gleak: label attacks on every training reply; findings in %s", self.log_path)

    # ------------------------------------------------------------------------------------------ auditing
    def _audit(self, server_round: int, replies: list[Message]) -> None:
        from gleak.attacks.labels.confidence import CalibrationCache
        from gleak.models.loading import model_from_state
        from gleak.runs.audit import audit_loaded

        if server_round not in self._round:
            log.warning("gleak: round %s: no global weights recorded (configure_train was not called)", server_round)
            return
        arrays, config = self._round[server_round]
        global_state = _state(arrays)
        loaded = model_from_state(self.model, global_state, self.arch_kwargs,
                                  tuple(self.recorder.input_shape) if self.recorder.input_shape else None,
                                  f"Flower global model, round {server_round}")
        auxes = [(self.aux_path or Path("aux"), self.aux)] if self.aux is not None else []
        cache: dict[tuple[Any, ...], dict[str, Any]] = {}  # the round's model: its aux forwards, shared by replies
        calibrations = CalibrationCache()  # the round's model: calibrated once for all replies
        lines: list[dict[str, Any]] = []
        for reply in replies:
            node = str(reply.metadata.src_node_id)
            line: dict[str, Any] = {"round": server_round, "node_id": node}
            started = time.perf_counter()
            returned = _single_arrays(reply) if not reply.has_error() and reply.has_content() else None
            if returned is None:
                line.update(status="skipped", reason="the reply holds an error or no single ArrayRecord")
            else:
                record = self.metadata.record(server_round, node, [*_records(reply), config], {})
                capture, _ = self.recorder.build(global_state, _state(returned), record)
                if self.write_captures:
                    self.recorder.write_built(capture, None, global_state, record)
                report, findings, _ = audit_loaded(capture, loaded, auxes, self.config, cache=cache,
                                                   calibration_cache=calibrations, name=f"flower://round-{server_round}/node-{node}")
                line.update(status=report.status, error=report.error, batch_size=report.batch_size,
                            local_steps=report.local_steps,
                            attacks=[{"attack": a.attack, "status": a.status, "counts": a.counts,
                                      "reason": a.reason} for a in report.attacks if a.task == "labels"],
                            findings=[f.model_dump(exclude_none=True) for f in findings])
            line["seconds"] = round(time.perf_counter() - started, 4)
            lines.append(line)
        with self.log_path.open("a", encoding="utf-8") as out:
            for line in lines:
                out.write(json.dumps(line, sort_keys=True) + "\n")
        self.rounds[server_round] = lines
        ran = sorted({a["attack"] for line in lines for a in line.get("attacks", []) if a["status"] == "ok"})
        recovered = sum(any(a["status"] == "ok" for a in line.get("attacks", [])) for line in lines)
        agreeing = sum(any(f.get("rule") == "GLEAK-LABELS-AGREE" for f in line.get("findings", [])) for line in lines)
        expected = [f for line in lines for f in line.get("findings", []) if f.get("rule") == "GLEAK-LABELS-EXPECTED"]
        estimate = (f"; expected iAcc {max(f['measured'] for f in expected):.2f} (chance "
                    f"{min(f['chance'] for f in expected):.2f}) on simulated batches" if expected else "")
        log.info("gleak: round %s: %d replies audited; label counts recovered from %d (%s), independent attacks "
                 "agree on %d%s; details in %s", server_round, len(lines), recovered, ", ".join(ran) or "no attack "
                 "applied", agreeing, estimate, self.log_path)
