"""The Flower example as a benchmark: what the capture mod adds to a client's round, and whether the label attacks
on its captures do as well as on ``gleak simulate`` captures of the same setting (untrained LeNet-5, B = 8,
m = 3 SGD steps at lr 0.05, MNIST).

    python bench/flower.py --rounds 20    # 3 clients × 20 rounds per run; results in bench/results/flower.md

The mod's cost comes from its own log (gleak-mod.jsonl: time inside the client app, time the mod added)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gleak.report.model import CaptureReport

ROOT = Path(__file__).resolve().parents[1]
GLEAK = [sys.executable, "-m", "gleak"]
AUX = ROOT / "samples" / "data" / "mnist_aux.safetensors"


def best_iacc(folder: Path, models: Path) -> tuple[list[float], list[float], list[float]]:
    out = subprocess.run([*GLEAK, "audit", str(folder), "--model", str(models), "--aux", str(AUX), "--lpips", "off",
                          "--format", "json", "--fail-on", "none"], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    best, rlu, chance = [], [], []
    for c in report["captures"]:
        scores = {a["attack"]: (a["scores"] or {}).get("iacc") for a in c["attacks"] if a["scores"]}
        top = CaptureReport.model_validate(c).best_label()  # the report's own "best label attack"
        iacc = (top.scores or {}).get("iacc") if top is not None else None
        assert iacc is not None, f"no label attack scored on {c['capture']}"
        best.append(float(iacc))
        rlu.append(scores.get("rlu") or 0.0)
        chance.append(c["chance"]["iacc"])
    return best, rlu, chance


def round_times(log: str) -> list[float]:
    """The clients' mean train-seconds per round, from FedAvg's aggregated-metrics log lines (round 1 dropped:
    it includes the workers' start-up)."""
    import re

    found = [float(m) for m in re.findall(r"'train-seconds': ([0-9.e+-]+)", log)]
    return found[1:]


def run_example(out: Path, rounds: int, *extra: str) -> list[float]:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "flower" / "run.py"), "--out", str(out),
                           "--rounds", str(rounds), "--no-audit", *extra], check=True, capture_output=True, text=True)
    return round_times(done.stdout + done.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant, interleaved")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gleak-flower-"))
    plain: list[float] = []
    sync: list[float] = []
    with_mod: list[float] = []
    rows: list[dict[str, Any]] = []
    sync_rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):  # interleaved, so that a busier minute of the machine hits every variant
        plain += run_example(work / f"plain{rep}", args.rounds, "--no-capture")
        with_mod += run_example(work / f"fl{rep}", args.rounds)
        sync += run_example(work / f"sync{rep}", args.rounds, "--sync-capture")
        rows += [json.loads(x) for x in (work / f"fl{rep}" / "captures" / "gleak-mod.jsonl").read_text().splitlines()]
        sync_rows += [json.loads(x) for x in
                      (work / f"sync{rep}" / "captures" / "gleak-mod.jsonl").read_text().splitlines()]
    ratio = [r["blocking_seconds"] / r["train_seconds"] for r in rows]
    base = statistics.median(plain)
    fl_best, fl_rlu, fl_chance = best_iacc(work / "fl0" / "captures", work / "fl0" / "captures" / "models")
    sim = work / "sim"
    sim.mkdir()
    model = ROOT / "samples" / "models" / "lenet_untrained.safetensors"
    for seed in range(min(len(rows), 18)):
        subprocess.run([*GLEAK, "simulate", "--model", str(model), "--data",
                        str(ROOT / "samples" / "data" / "mnist_client.safetensors"), "--scheme", "fedavg",
                        "--batch-size", "8", "--local-steps", "3", "--lr", "0.05", "--seed", str(seed), "-o",
                        str(sim / f"s{seed}.safetensors")], check=True, capture_output=True)
    sim_best, sim_rlu, sim_chance = best_iacc(sim, model)
    blocking = statistics.median(r["blocking_seconds"] for r in rows)
    sync_added = statistics.median(r["blocking_seconds"] + r["write_seconds"] for r in sync_rows)
    md = ["# bench/flower.py — the Flower example (3 clients, B = 8, m = 3, untrained LeNet-5, MNIST)", "",
          f"{args.repeats} runs × {args.rounds} rounds per variant, interleaved; round 1 (start-up) left out; "
          "client round time = the client app's own "
          "train-seconds (mean over the clients, median over the rounds) plus what the mod holds the round.", "",
          "| run | client round ms | mod holds the round ms | overhead vs no mod |", "|---|---|---|---|",
          f"| no mod | {1000 * base:.1f} | — | — |",
          f"| mod, writer thread (default) | {1000 * statistics.median(with_mod):.1f} | {1000 * blocking:.2f} | "
          f"{100 * ((statistics.median(with_mod) + blocking) / base - 1):+.1f} % |",
          f"| mod, synchronous write | {1000 * statistics.median(sync):.1f} | {1000 * sync_added:.2f} | "
          f"{100 * ((statistics.median(sync) + sync_added) / base - 1):+.1f} % |", "",
          f"Within the default run: the mod held each round for a median {100 * statistics.median(ratio):.2f} % "
          f"(max {100 * max(ratio):.2f} %) of the client's own time; the writer thread took a median "
          f"{1000 * statistics.median(r['write_seconds'] for r in rows):.1f} ms per capture.", "",
          "| captures | n | best-attack iAcc (mean) | rlu iAcc (mean) | chance (mean) |", "|---|---|---|---|---|",
          f"| Flower mod | {len(fl_best)} | {statistics.fmean(fl_best):.3f} | {statistics.fmean(fl_rlu):.3f} | "
          f"{statistics.fmean(fl_chance):.3f} |",
          f"| gleak simulate, same setting | {len(sim_best)} | {statistics.fmean(sim_best):.3f} | "
          f"{statistics.fmean(sim_rlu):.3f} | {statistics.fmean(sim_chance):.3f} |"]
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "flower.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
