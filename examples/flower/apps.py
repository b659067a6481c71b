"""The example's ClientApp (with gleak's capture mod) and ServerApp (FedAvg wrapped by gleak's audit)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import task
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from gleak.integrations.flower import TIMINGS_FILE, GleakAuditStrategy, GleakCaptureMod

ROUND_TIMEOUT = 24 * 3600.0  # seconds the server waits for a round's replies: never the limit (no client is dropped)
STALL_SECONDS = 120.0  # a hang guard only: stop waiting for captures when none arrived for this long


def train(msg: Message, context: Context) -> Message:
    """The client's round: ``local-steps`` SGD steps on its shard from the round's model; the model back."""
    started = time.perf_counter()
    config = msg.content["config"]
    partition, partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    model = task.new_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    inputs, labels = task.shard(partition, partitions)
    steps, batch = int(config["local-steps"]), int(config["batch-size"])
    seed = 1000 * int(config["server-round"]) + partition
    loss = task.train(model, inputs, labels, steps, batch, float(config["lr"]), seed, context)
    metrics = MetricRecord({"train-loss": loss, "num-examples": steps * batch,
                            "train-seconds": time.perf_counter() - started})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


def client_app(captures: Path | None, background: bool = True, *, defense: Sequence[Any] = (),
               train_mods: Sequence[Mod] = ()) -> ClientApp:
    """Clients :func:`train` on their shard; with ``captures``, the gleak mod writes every update there (the
    ``ClientApp``'s mod: the outermost, it sees the reply after ``train_mods``, the train function's own mods, and
    records ``defense`` in ``gleak.defense``)."""
    mods = [GleakCaptureMod(captures, arch=task.ARCH, arch_kwargs=task.ARCH_KWARGS, background=background,
                            defense=defense)] if captures else []
    app = ClientApp(mods=mods)
    app.train(mods=list(train_mods))(train)
    return app


def backend_config() -> dict[str, Any]:
    """The simulation engine's settings for the example: one CPU per client, Ray on at most 2 cores, no
    dashboard, a small object store (a new dict each call: ``run_simulation`` fills in its defaults)."""
    return {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": min(2, os.cpu_count() or 1), "include_dashboard": False,
                          "object_store_memory": 100 * 1024 * 1024}}


def check_empty(folder: Path | None, force: bool) -> bool:
    """Whether ``folder`` (None: nothing to check) may take this run's captures: it holds none of an earlier run,
    or ``force`` and it is removed first. Otherwise says so on stderr."""
    if folder is None or not folder.exists():
        return True
    if force:
        shutil.rmtree(folder)
        return True
    if any(folder.rglob("*.safetensors")):
        print(f"{folder} already holds captures; pass --force or another --out", file=sys.stderr)
        return False
    return True


def captures_written(captures: Path) -> int:
    """How many captures the mod has written: one whole line each in ``captures/gleak-mod.jsonl``, appended after
    the capture (and its truth file) is on disk."""
    timings = captures / TIMINGS_FILE
    return timings.read_bytes().count(b"\n") if timings.exists() else 0


def wait_for_captures(captures: Path, expected: int, stall: float = STALL_SECONDS) -> int:
    """Wait until ``captures_written(captures)`` reaches ``expected``; returns what it reached.

    The ServerApp must not return before: in the simulation engine the mod's writer threads live in Ray actors,
    and when the ServerApp returns flwr ends them at once (``RayBackend.terminate``: ``terminate.remote()`` to each
    actor, then ``ray.shutdown()``, which gives the raylet 1 s before killing it and its workers). What the writer
    threads still hold, the last round's captures, would be lost on a busy machine. This waits on the captures,
    not on a time: ``stall`` only ends a hang (no new capture for that long)."""
    last, progress = -1, time.monotonic()
    while (found := captures_written(captures)) < expected:
        if found != last:
            last, progress = found, time.monotonic()
        elif time.monotonic() - progress > stall:
            log(WARNING, "gleak: %d of %d captures written; none for %.0f s, not waiting longer", found, expected,
                stall)
            break
        time.sleep(0.05)
    return found


def server_app(rounds: int, clients: int, lr: float, steps: int, batch: int, audit_log: Path | None,
               aux: Path | None, captures: Path | None = None) -> ServerApp:
    """FedAvg over every client each round, each round waiting for every client's reply; with ``audit_log``,
    gleak audits each round's replies; with ``captures`` (the mod's folder, shared with the simulated clients),
    the ServerApp returns only once the mod has written every client's capture of every round."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                          min_available_nodes=clients)
        if audit_log is not None:
            strategy = GleakAuditStrategy(strategy, model=task.ARCH, arch_kwargs=task.ARCH_KWARGS, aux=aux,
                                          log_path=audit_log, force=True)
        before = captures_written(captures) if captures is not None else 0
        config = ConfigRecord({"lr": lr, "local-steps": steps, "batch-size": batch})
        strategy.start(grid=grid, initial_arrays=ArrayRecord(task.new_model().state_dict()), num_rounds=rounds,
                       timeout=ROUND_TIMEOUT, train_config=config)
        if captures is not None:
            found = wait_for_captures(captures, before + rounds * clients) - before
            log(INFO, "gleak: %d of %d client updates captured in %s", found, rounds * clients, captures)

    return app
