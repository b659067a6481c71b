"""Run the example federation in Flower's simulation engine (Ray): 3 clients × 2 rounds on the shipped MNIST data,
every update captured by gleak's mod, every round audited by gleak's strategy wrapper.

    python examples/flower/run.py --out out/flower
    gleak audit out/flower/captures --model out/flower/captures/models --aux samples/data/mnist_aux.safetensors
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import apps
import task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/flower"), help="captures/ and audit.jsonl go here")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--no-capture", action="store_true", help="run without gleak (to time its overhead)")
    parser.add_argument("--no-audit", action="store_true", help="no server-side audit")
    parser.add_argument("--sync-capture", action="store_true", help="write captures before the reply goes back")
    parser.add_argument("--force", action="store_true", help="overwrite an earlier run's --out")
    args = parser.parse_args(argv)

    from flwr.simulation import run_simulation

    captures = None if args.no_capture else args.out / "captures"
    if not apps.check_empty(captures, args.force):
        return 2
    audit_log = None if args.no_audit else args.out / "audit.jsonl"
    aux = task.ROOT / "samples" / "data" / "mnist_aux.safetensors"
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run_simulation(
        server_app=apps.server_app(args.rounds, args.clients, args.lr, args.local_steps, args.batch_size,
                                   audit_log.resolve() if audit_log else None, aux,
                                   captures.resolve() if captures else None),
        client_app=apps.client_app(captures.resolve() if captures else None, background=not args.sync_capture),
        num_supernodes=args.clients,
        backend_config=apps.backend_config())
    print(f"federation done in {time.perf_counter() - started:.1f} s; captures in {captures}, "
          f"server-side audit in {audit_log}")
    if captures is not None and (written := apps.captures_written(captures)) < args.rounds * args.clients:
        print(f"only {written} of {args.rounds * args.clients} client updates were captured", file=sys.stderr)
        return 1
    timings = captures / "gleak-mod.jsonl" if captures is not None else None
    if timings is not None and timings.exists():
        import json
        import statistics

        rows = [json.loads(line) for line in timings.read_text().splitlines()]
        train = statistics.median(r["train_seconds"] for r in rows)
        held = statistics.median(r["blocking_seconds"] for r in rows)
        share = statistics.median(r["blocking_seconds"] / r["train_seconds"] for r in rows)
        written = statistics.median(r["write_seconds"] for r in rows)
        print(f"gleak mod: {len(rows)} updates captured; medians: it held a client's round {1000 * held:.2f} ms "
              f"({100 * share:.1f} % of the client's own {1000 * train:.0f} ms) and wrote a capture in "
              f"{1000 * written:.1f} ms in its writer thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
