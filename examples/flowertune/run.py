"""Run the FlowerTune-style example in Flower's simulation engine (Ray): 3 clients × 2 rounds of LoRA fine-tuning
on the shipped notes, every adapter update captured by gleak's mod, every round audited by gleak's strategy wrapper.

    python examples/flowertune/run.py --out out/flowertune
    gleak audit out/flowertune/captures --model samples/text/notes-llama
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import apps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/flowertune"), help="captures/ and audit.jsonl go here")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=12, help="tokens per note, at most")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--no-audit", action="store_true", help="no server-side audit")
    parser.add_argument("--force", action="store_true", help="overwrite an earlier run's --out")
    args = parser.parse_args(argv)

    from flwr.simulation import run_simulation

    captures = args.out / "captures"
    if not apps.check_empty(captures, args.force):
        return 2
    audit_log = None if args.no_audit else args.out / "audit.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    run_simulation(
        server_app=apps.server_app(args.rounds, args.clients, args.lr, args.local_steps, args.batch_size,
                                   args.max_length, audit_log.resolve() if audit_log else None, captures.resolve()),
        client_app=apps.client_app(captures.resolve(), args.max_length),
        num_supernodes=args.clients,
        backend_config=apps.backend_config())
    print(f"federation done in {time.perf_counter() - started:.1f} s; captures in {captures}, "
          f"server-side audit in {audit_log}")
    if (written := apps.captures_written(captures)) < args.rounds * args.clients:
        print(f"only {written} of {args.rounds * args.clients} client updates were captured", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in (captures / "gleak-mod.jsonl").read_text().splitlines()]
    print(f"gleak mod: {len(rows)} adapter updates captured; medians: it held a client's round "
          f"{1000 * statistics.median(r['blocking_seconds'] for r in rows):.2f} ms of "
          f"{1000 * statistics.median(r['train_seconds'] for r in rows):.0f} ms and wrote a capture (with its "
          f"adapter and truth) in {1000 * statistics.median(r['write_seconds'] for r in rows):.0f} ms")
    if audit_log is not None and audit_log.exists():
        for line in map(json.loads, audit_log.read_text().splitlines()):
            attack = next((a for a in line.get("attacks", []) if a["attack"] == "lora-tokens"), None)
            found = (f"{len(attack['token_ids'])} distinct input tokens" if attack and attack["status"] == "ok"
                     else (attack or {}).get("reason") or line.get("error") or line["status"])
            print(f"server-side audit, round {line['round']}, node {line['node_id']}: lora-tokens: {found}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
