"""Audits at scale: label-only audits of B = 32 LeNet-5 FedSGD captures (real MNIST batches, with truth files).

Measures captures per second on the local executor with 1 and 2 worker processes and on Ray with 2 CPUs,
the steady-state rate once the models are loaded (first result to last), peak memory (driver and the largest
worker, resident set) for 100 and for 1,000 captures, the per-capture cost split (load, context, label attacks,
report rendering), and projects what a 100-client × 1,000-round deployment costs on N Ray workers.

    python bench/scale.py                      # 1,000 captures, every executor (about 10 minutes on 2 cores)
    python bench/scale.py --captures 200 --quick

Each measurement runs in its own process with one torch thread per worker. Results:
bench/results/scale.md and scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "samples" / "models" / "lenet_untrained.safetensors"
DATA = ROOT / "samples" / "data" / "mnist_client.safetensors"
AUX = ROOT / "samples" / "data" / "mnist_aux.safetensors"
RESULTS = ROOT / "bench" / "results"
DEPLOYMENT = (100, 1000)  # clients × rounds


def make_captures(folder: Path, count: int, batch: int = 32, seed: int = 0) -> None:
    """``count`` FedSGD captures of B = ``batch`` uniform random MNIST batches through the untrained LeNet-5."""
    import torch

    from gleak.capture import Truth, capture_gradients, save_capture
    from gleak.data.images import load_dataset
    from gleak.models import load_model

    torch.manual_seed(seed)
    model = load_model(MODEL).module
    data = load_dataset(DATA)
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        pick = torch.randperm(len(data), generator=generator)[:batch]
        x, y = data.batch(pick)
        capture = capture_gradients(model, x, y, mean=data.mean, std=data.std,
                                    metadata={"gleak.fl.round": i // 100, "gleak.fl.client_id": str(i % 100)})
        save_capture(capture, folder / f"round-{i // 100:04d}" / f"client-{i % 100:03d}.safetensors",
                     truth=Truth(labels=y, inputs=x))


def measure(folder: Path, executor: str, jobs: int, limit: int) -> dict[str, object]:
    """One audit run in this process (called in a fresh subprocess by main)."""
    import torch

    torch.set_num_threads(1)
    from gleak.report.formats import get_format
    from gleak.runs.audit import AuditConfig, find_captures, run_audit

    files = find_captures([folder])[:limit]
    stamps: list[float] = []
    started = time.perf_counter()
    report = run_audit(files, [MODEL], [AUX], AuditConfig(lpips="off", device="cpu"), None,
                       lambda i, n, p: stamps.append(time.perf_counter()), jobs=jobs, executor=executor)
    wall = time.perf_counter() - started
    render = time.perf_counter()
    get_format("json").render(report)
    render = time.perf_counter() - render
    stages: dict[str, list[float]] = {}
    for c in report.captures:
        for k, v in (c.stage_seconds or {}).items():
            stages.setdefault(k, []).append(v)
    scored = [max((a.scores or {}).get("iacc") or 0.0 for a in c.attacks if a.task == "labels" and a.scores)
              for c in report.captures if c.status == "ok" and any(a.scores for a in c.attacks)]
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "executor": executor, "jobs": jobs, "captures": len(files), "wall_s": round(wall, 3),
        "per_s": round(len(files) / wall, 3),
        "steady_per_s": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 3) if len(stamps) > 2 else None,
        "first_result_s": round(stamps[0] - started, 3) if stamps else None,
        "errors": sum(c.status == "error" for c in report.captures),
        "best_iacc_mean": round(statistics.fmean(scored), 4) if scored else None,
        "stage_ms": {k: round(1000 * statistics.fmean(v), 3) for k, v in stages.items()},
        "render_ms_per_capture": round(1000 * render / max(1, len(files)), 4),
        "peak_rss_mib_driver": round(own, 1), "peak_rss_mib_largest_child": round(children, 1),
    }


def run_one(folder: Path, executor: str, jobs: int, limit: int) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--measure", str(folder), "--executor", executor,
                          "--jobs", str(jobs), "--limit", str(limit)], capture_output=True, text=True, env=env,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"{executor} -j {jobs} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def projection(rows: list[dict[str, object]]) -> list[str]:
    one = next(r for r in rows if r["executor"] == "local" and r["jobs"] == 1 and r["captures"] == max(
        int(x["captures"]) for x in rows))  # type: ignore[call-overload]
    ray2 = next((r for r in rows if r["executor"] == "ray"), None)
    rate = float(one["steady_per_s"] or one["per_s"])  # type: ignore[arg-type]
    scaling = (float(ray2["steady_per_s"] or ray2["per_s"]) / rate / 2) if ray2 else 1.0  # type: ignore[arg-type]
    total = DEPLOYMENT[0] * DEPLOYMENT[1]
    lines = [f"Projection: {DEPLOYMENT[0]} clients × {DEPLOYMENT[1]:,} rounds = {total:,} captures, at the measured "
             f"{rate:.1f} captures/s per worker and the measured Ray efficiency per worker ({scaling:.2f} of linear "
             f"at 2 workers), plus 10 s of Ray start-up and model loading:", "",
             "| Ray workers | hours | captures/s |", "|---|---|---|"]
    for n in (1, 2, 8, 32, 128):
        eff = rate * n * (scaling if n > 1 else 1.0)
        lines.append(f"| {n} | {(total / eff + 10) / 3600:.2f} | {eff:.0f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=int, default=1000)
    parser.add_argument("--small", type=int, default=100, help="the smaller run for the memory comparison")
    parser.add_argument("--work", type=Path, default=None, help="folder for the captures (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="skip the Ray run")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--executor", default="local", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.executor, args.jobs, args.limit)))
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="gleak-scale-"))
    folder = work / "captures"
    existing = len(list(folder.rglob("client-*[0-9].safetensors"))) if folder.exists() else 0
    if existing < args.captures:
        started = time.perf_counter()
        make_captures(folder, args.captures)
        print(f"made {args.captures} captures in {time.perf_counter() - started:.1f} s ({folder})", flush=True)
    plan = [("local", 1, args.small), ("local", 1, args.captures), ("local", 2, args.captures)]
    if not args.quick:
        plan.append(("ray", 2, args.captures))
    rows = []
    for executor, jobs, limit in plan:
        row = run_one(folder, executor, jobs, limit)
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = next(r for r in rows if r["executor"] == "local" and r["jobs"] == 1 and r["captures"] == args.captures)
    small = rows[0]
    md = [f"# bench/scale.py — {args.captures} label-only audits, B = 32 LeNet-5 FedSGD captures, MNIST",
          "", f"{os.cpu_count()} cores, one torch thread per worker; the steady rate counts from the first result "
          "to the last (models loaded).", "",
          "| executor | workers | captures | wall s | captures/s | steady captures/s | vs 1 worker | "
          "peak RSS driver / worker MiB | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = float(r["steady_per_s"] or r["per_s"]) / float(base["steady_per_s"] or base["per_s"])  # type: ignore[arg-type]
        md.append(f"| {r['executor']} | {r['jobs']} | {r['captures']} | {r['wall_s']} | {r['per_s']} | "
                  f"{r['steady_per_s']} | {speedup:.2f}× | {r['peak_rss_mib_driver']} / "
                  f"{r['peak_rss_mib_largest_child']} | {r['errors']} |")
    stage = base["stage_ms"]
    md += ["", "Per-capture cost, 1 worker (ms): " + ", ".join(f"{k} {v}" for k, v in stage.items())  # type: ignore[union-attr]
           + f", report rendering {base['render_ms_per_capture']}", "",
           f"Peak driver memory, {small['captures']} vs {base['captures']} captures (1 worker): "
           f"{small['peak_rss_mib_driver']} vs {base['peak_rss_mib_driver']} MiB "
           f"({100 * (float(base['peak_rss_mib_driver']) / float(small['peak_rss_mib_driver']) - 1):+.1f} %)."  # type: ignore[arg-type]
           , "", f"Mean best-attack iAcc over the captures: {base['best_iacc_mean']}.", "", *projection(rows)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale.md").write_text("\n".join(md) + "\n")
    (RESULTS / "scale.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
