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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import apps
import task
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod

from gleak.integrations.flower import GleakCaptureMod


def client_app(captures: Path, dp: LocalDpMod, clean: Path | None = None, background: bool = True) -> ClientApp:
    """Clients train on their shard; Flower's ``dp`` clips and noises the reply; gleak captures it after that in
    ``captures`` (and, with ``clean``, before it there: written synchronously, with the truth)."""
    inner = [GleakCaptureMod(clean, arch=task.ARCH, arch_kwargs=task.ARCH_KWARGS, background=False)] if clean else []
    # LocalDpMod on training only, the clean capture mod inside it; the ClientApp's capture mod, the outermost,
    # sees the reply last, after LocalDpMod
    return apps.client_app(captures, background, defense=[dp], train_mods=[dp, *inner])


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
    parser.add_argument("--force", action="store_true", help="overwrite an earlier run's --out")
    args = parser.parse_args(argv)

    from flwr.simulation import run_simulation

    captures = (args.out / "captures").resolve()
    clean = (args.out / "clean").resolve() if args.clean else None
    if not all(apps.check_empty(folder, args.force) for folder in (captures, clean)):
        return 2
    dp = LocalDpMod(args.clipping_norm, args.sensitivity, args.epsilon, args.delta)
    aux = task.ROOT / "samples" / "data" / "mnist_aux.safetensors"
    started = time.perf_counter()
    run_simulation(
        server_app=apps.server_app(args.rounds, args.clients, args.lr, args.local_steps, args.batch_size,
                                   (args.out / "audit.jsonl").resolve(), aux, captures),
        client_app=client_app(captures, dp, clean),
        num_supernodes=args.clients,
        backend_config=apps.backend_config())
    written = apps.captures_written(captures)
    print(f"federation done in {time.perf_counter() - started:.1f} s; {written} updates captured after LocalDpMod "
          f"in {captures}" + (f", before it in {clean}" if clean else ""))
    return 0 if written >= args.rounds * args.clients else 1


if __name__ == "__main__":
    raise SystemExit(main())
