"""The example's client behind Flower's own local differential privacy (``LocalDpMod``), captured by gleak after it.

Flower wraps a ClientApp's function in its mods with the first one outermost, the ``ClientApp``'s mods before the
function's own. gleak's capture mod is the ``ClientApp``'s mod and ``LocalDpMod`` the ``train`` function's, so the
capture mod sees the reply after ``LocalDpMod`` clipped and noised it: what the server receives. ``defense=[dp]``
stamps what it did into every capture's ``gleak.defense`` (with the equivalent gleak defenses). With ``clean``, a
second capture mod inside ``LocalDpMod`` also writes the update before the DP mod touched it (and the truth), so
one run measures what the defense buys (docs/defenses.md, "Inside FL frameworks").

    python examples/flower/dp_apps.py --out out/flower-dp --epsilon 20 --clean
    gleak audit out/flower-dp/captures --model out/flower-dp/captures/models --aux samples/data/mnist_aux.safetensors
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import apps
import task
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

from gleak.integrations.flower import GleakCaptureMod


def client_app(captures: Path, dp: LocalDpMod, clean: Path | None = None, background: bool = True) -> ClientApp:
    """Clients train on their shard; Flower's ``dp`` clips and noises the reply; gleak captures it after that in
    ``captures`` (and, with ``clean``, before it there: written synchronously, with the truth)."""
    outer = GleakCaptureMod(captures, arch=task.ARCH, arch_kwargs=task.ARCH_KWARGS, defense=[dp],
                            background=background)
    inner = [GleakCaptureMod(clean, arch=task.ARCH, arch_kwargs=task.ARCH_KWARGS, background=False)] if clean else []
    app = ClientApp(mods=[outer])  # the outermost mod: sees the reply last, after LocalDpMod

    @app.train(mods=[dp, *inner])  # LocalDpMod on training only; the clean capture mod inside it
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/flower-dp"), help="captures/ (and clean/) go here")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clipping-norm", type=float, default=0.02)
    parser.add_argument("--sensitivity", type=float, default=0.02)
    parser.add_argument("--epsilon", type=float, default=20.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clean", action="store_true", help="also capture each update before LocalDpMod")
    args = parser.parse_args(argv)

    from flwr.simulation import run_simulation

    captures = (args.out / "captures").resolve()
    clean = (args.out / "clean").resolve() if args.clean else None
    for folder in (captures, clean):
        if folder is not None and folder.exists() and any(folder.rglob("*.safetensors")):
            print(f"{folder} already holds captures; pass another --out", file=sys.stderr)
            return 2
    dp = LocalDpMod(args.clipping_norm, args.sensitivity, args.epsilon, args.delta)
    aux = task.ROOT / "samples" / "data" / "mnist_aux.safetensors"
    started = time.perf_counter()
    run_simulation(
        server_app=apps.server_app(args.rounds, args.clients, args.lr, args.local_steps, args.batch_size,
                                   (args.out / "audit.jsonl").resolve(), aux, captures),
        client_app=client_app(captures, dp, clean),
        num_supernodes=args.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": min(2, os.cpu_count() or 1), "include_dashboard": False,
                                      "object_store_memory": 100 * 1024 * 1024}})
    written = apps.captures_written(captures)
    print(f"federation done in {time.perf_counter() - started:.1f} s; {written} updates captured after LocalDpMod "
          f"in {captures}" + (f", before it in {clean}" if clean else ""))
    return 0 if written >= args.rounds * args.clients else 1


if __name__ == "__main__":
    raise SystemExit(main())
