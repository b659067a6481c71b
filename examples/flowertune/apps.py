"""The example's ClientApp (LoRA fine-tuning, with gleak's capture mod) and ServerApp (FedAvg over the adapters,
wrapped by gleak's audit)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import task
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from gleak.integrations.flower import TIMINGS_FILE, GleakAuditStrategy, GleakCaptureMod

ROUND_TIMEOUT = 24 * 3600.0  # seconds the server waits for a round's replies: never the limit (no client is dropped)
STALL_SECONDS = 120.0  # a hang guard only: stop waiting for captures when none arrived for this long
log = logging.getLogger("flwr")  # Flower's own logger: its handler prints these lines with the federation's


def train(msg: Message, context: Context) -> Message:
    """The client's round, as in FlowerTune: the global adapter set on the base model, ``local-steps`` steps on
    the client's notes, the adapter's arrays (``get_peft_model_state_dict``) back."""
    started = time.perf_counter()
    config = msg.content["config"]
    partition, partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    model = task.new_model()
    task.set_adapter(model, msg.content["arrays"].to_torch_state_dict())
    steps, batch = int(config["local-steps"]), int(config["batch-size"])
    seed = 1000 * int(config["server-round"]) + partition
    loss = task.train(model, task.shard(partition, partitions), steps, batch, float(config["lr"]),
                      int(config["max-length"]), seed, context)
    metrics = MetricRecord({"train-loss": loss, "num-examples": steps * batch,
                            "train-seconds": time.perf_counter() - started})
    return Message(RecordDict({"arrays": ArrayRecord(task.adapter_arrays(model)), "metrics": metrics}), reply_to=msg)


def client_app(captures: Path | None, max_length: int) -> ClientApp:
    """Clients :func:`train` their adapter; with ``captures``, gleak's mod writes every adapter update there as a
    LoRA capture (with the round's global adapter beside it, and the recorded batches as its truth)."""
    mods = [GleakCaptureMod(captures, lora=task.lora_app(max_length), optimizer="sgd")] if captures else []
    app = ClientApp(mods=mods)
    app.train()(train)
    return app


def backend_config() -> dict[str, Any]:
    """The simulation engine's settings: one CPU per client, Ray on at most 2 cores, no dashboard, a small object
    store (a new dict each call: ``run_simulation`` fills in its defaults)."""
    return {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": min(2, os.cpu_count() or 1), "include_dashboard": False,
                          "object_store_memory": 100 * 1024 * 1024}}


def check_empty(folder: Path | None, force: bool) -> bool:
    """Whether ``folder`` may take this run's captures (removed first with ``force``); says why not on stderr."""
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
    """How many captures the mod has written: one line each in ``captures/gleak-mod.jsonl``."""
    timings = captures / TIMINGS_FILE
    return timings.read_bytes().count(b"\n") if timings.exists() else 0


def wait_for_captures(captures: Path, expected: int, stall: float = STALL_SECONDS) -> int:
    """Wait until the mod has written ``expected`` captures (the simulation engine ends the clients' Ray actors,
    and the mod's writer threads in them, as soon as the ServerApp returns: examples/flower/apps.py says more)."""
    last, progress = -1, time.monotonic()
    while (found := captures_written(captures)) < expected:
        if found != last:
            last, progress = found, time.monotonic()
        elif time.monotonic() - progress > stall:
            log.warning("gleak: %d of %d captures written; none for %.0f s, not waiting longer", found, expected,
                        stall)
            break
        time.sleep(0.05)
    return found


def server_app(rounds: int, clients: int, lr: float, steps: int, batch: int, max_length: int,
               audit_log: Path | None, captures: Path | None = None) -> ServerApp:
    """FedAvg of the clients' adapters, every client every round; with ``audit_log``, gleak runs its token attacks
    on each reply; with ``captures``, the ServerApp returns once the mod has written every client's capture."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                          min_available_nodes=clients)
        if audit_log is not None:
            strategy = GleakAuditStrategy(strategy, lora=task.lora_app(max_length), log_path=audit_log, force=True)
        before = captures_written(captures) if captures is not None else 0
        config = ConfigRecord({"lr": lr, "local-steps": steps, "batch-size": batch, "max-length": max_length})
        strategy.start(grid=grid, initial_arrays=ArrayRecord(task.adapter_arrays(task.new_model())),
                       num_rounds=rounds, timeout=ROUND_TIMEOUT, train_config=config)
        if captures is not None:
            found = wait_for_captures(captures, before + rounds * clients) - before
            log.info("gleak: %d of %d client updates captured in %s", found, rounds * clients, captures)

    return app
