"""The example's ClientApp (with gleak's capture mod) and ServerApp (FedAvg wrapped by gleak's audit)."""

from __future__ import annotations

import time
from pathlib import Path

import task
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from gleak.integrations.flower import GleakAuditStrategy, GleakCaptureMod


def client_app(captures: Path | None, background: bool = True) -> ClientApp:
    """Clients train on their shard; with ``captures``, the gleak mod writes every update there."""
    mods = [GleakCaptureMod(captures, arch=task.ARCH, arch_kwargs=task.ARCH_KWARGS, background=background)] \
        if captures else []
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
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

    return app


def server_app(rounds: int, clients: int, lr: float, steps: int, batch: int, audit_log: Path | None,
               aux: Path | None) -> ServerApp:
    """FedAvg over every client each round; with ``audit_log``, gleak audits each round's replies."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                          min_available_nodes=clients)
        if audit_log is not None:
            strategy = GleakAuditStrategy(strategy, model=task.ARCH, arch_kwargs=task.ARCH_KWARGS, aux=aux,
                                          log_path=audit_log, force=True)
        config = ConfigRecord({"lr": lr, "local-steps": steps, "batch-size": batch})
        strategy.start(grid=grid, initial_arrays=ArrayRecord(task.new_model().state_dict()), num_rounds=rounds,
                       train_config=config)

    return app
