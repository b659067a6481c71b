"""A whole FL run's audit at scale: peak memory over rounds, and local vs Ray executors.

    python bench/run_scale.py memory [--rounds 10 100 500]     # peak RSS of gleak audit vs rounds
    python bench/run_scale.py executors [--captures 20 100]    # captures/s and worker RSS, local vs Ray

* memory — R rounds × 1 client: one LeNet-5 global model per round (its own weights) and one FedSGD capture of
  8 MNIST digits made with it; ``gleak audit`` (quick budget, no aux, JSON) on the whole folder, one process,
  one torch thread; peak RSS of that process (``wait4``) and its wall time. ``--baseline DIR`` runs the same
  command with another checkout's gleak package first on the path (e.g. a worktree of the commit before the
  model store) for comparison.
* executors — C captures of one round (one model): ``--jobs 1``, ``--jobs 2`` (local processes) and ``--executor
  ray --jobs 2``, and ``--jobs auto`` (the default); wall time, captures/s and the peak RSS of the largest process
  (the driver or a worker); the break-even of a pool, fitted on the two largest runs.

Writes bench/results/run-scale.md (and .json). Run it on an otherwise idle machine; it states the CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
WORK = Path(os.environ.get("GLEAK_BENCH_DIR", "/tmp/gleak-run-scale"))


def make_run(folder: Path, rounds: int, clients: int = 1, same_model: bool = False) -> Path:
    """``rounds`` × ``clients`` captures and one model per round (or one for all with ``same_model``)."""
    import torch

    from gleak.capture import save_capture
    from gleak.data.images import load_dataset
    from gleak.models import build_zoo_model, save_model
    from gleak.simulate.images import ClientConfig, simulate_client

    if folder.exists():
        return folder
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "models").mkdir(parents=True)
    (tmp / "captures").mkdir()
    client = load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    torch.set_num_threads(1)
    model = None
    for r in range(rounds):
        if model is None or not same_model:
            torch.manual_seed(r)
            model = build_zoo_model("lenet")
            save_model(model, tmp / "models" / f"round-{r:04d}.safetensors", "lenet")
        for c in range(clients):
            capture, truth = simulate_client(model, client, ClientConfig(batch_size=8, seed=r * 1000 + c))
            capture.meta.update({"gleak.fl.round": r, "gleak.fl.client_id": f"client-{c}"})
            save_capture(capture, tmp / "captures" / f"round-{r:04d}-client-{c}.safetensors", truth=truth)
    tmp.rename(folder)
    return folder


def measure(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Wall time and peak RSS (MiB) of the command's process and its children (the largest one)."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=WORK)  # not
    # the checkout: python -m puts the working directory first on the path
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    return {"seconds": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit": code,
            "stderr": stderr[-300:] if code not in (0, 1) else ""}


def gleak_command(repo: Path, run: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "gleak", "--threads", "1", "audit", str(run / "captures"), "--model",
            str(run / "models"), "--lpips", "off", "--confidence", "0", "--format", "json", "--fail-on", "none",
            *extra]


def memory(rounds: list[int], baseline: Path | None) -> dict[str, Any]:
    rows = []
    for n in rounds:
        run = make_run(WORK / f"rounds-{n}", n)
        row: dict[str, Any] = {"rounds": n, "now": measure(gleak_command(ROOT, run, ["--jobs", "1"]))}
        if baseline is not None:  # the other checkout's package first on the path, this venv's dependencies
            row["baseline"] = measure(gleak_command(ROOT, run, ["--jobs", "1"]),
                                      env={**os.environ, "PYTHONPATH": str(baseline)})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"rows": rows, "baseline": str(baseline) if baseline else None}


def executors(captures: list[int], only: str | None = None, earlier: list[dict[str, Any]] | None = None,
              ) -> dict[str, Any]:
    """Every executor at every size; with ``only``, just the executors whose label contains it, replacing those rows
    of ``earlier``."""
    rows = [r for r in earlier or [] if only is not None and only not in r["executor"]]
    for n in captures:
        run = make_run(WORK / f"captures-{n}", n, same_model=True)
        for label, extra in (("local, --jobs 1", ["--jobs", "1"]), ("local, --jobs 2", ["--jobs", "2"]),
                             ("local, --jobs auto", ["--jobs", "auto"]),
                             ("ray, --jobs 2", ["--executor", "ray", "--jobs", "2"])):
            if only is not None and only not in label:
                continue
            result = measure(gleak_command(ROOT, run, extra))
            result.update(captures=n, executor=label,
                          per_second=round(n / result["seconds"], 2) if result["seconds"] else None)
            rows.append(result)
            print(json.dumps(result), flush=True)
    order = ["local, --jobs 1", "local, --jobs 2", "local, --jobs auto", "ray, --jobs 2"]
    rows.sort(key=lambda r: (r["captures"], order.index(r["executor"]) if r["executor"] in order else 99))
    return {"rows": rows}


def write(results: dict[str, Any]) -> None:
    lines = ["# Auditing a whole run at scale", "",
             f"`python bench/run_scale.py` ({os.cpu_count()} CPUs, one torch thread per process; quick budget, no "
             "aux data, `--lpips off --confidence 0`). Protocol: the module docstring.", ""]
    m = results.get("memory")
    if m:
        lines += ["## Peak memory over rounds (one LeNet-5 global model per round, one capture each)", "",
                  "| rounds | peak RSS MiB | wall s |" + (" before: peak RSS MiB | before: wall s |" if m["baseline"]
                                                            else ""),
                  "|---|---|---|" + ("---|---|" if m["baseline"] else "")]
        for row in m["rows"]:
            now, before = row["now"], row.get("baseline")
            lines.append(f"| {row['rounds']} | {now['peak_rss_mib']} | {now['seconds']} |" + (
                f" {before['peak_rss_mib']} | {before['seconds']} |" if before else ""))
        if m["baseline"]:
            lines += ["", "Before: the same command with the gleak of the commit before the model store (f012c18: "
                      "every model loaded before the first capture)."]
        lines.append("")
    e = results.get("executors")
    if e:
        lines += ["## Executors (one model, C captures)", "", "| captures | executor | wall s | captures/s | "
                  "peak RSS MiB (largest process) |", "|---|---|---|---|---|"]
        for row in e["rows"]:
            lines.append(f"| {row['captures']} | {row['executor']} | {row['seconds']} | {row['per_second']} | "
                         f"{row['peak_rss_mib']} |")
        lines.append("")
        lines += break_even(e["rows"])
    (OUT / "run-scale.md").write_text("\n".join(lines), encoding="utf-8")


def break_even(rows: list[dict[str, Any]]) -> list[str]:
    """The --jobs 2 break-even from the two largest runs: wall = start + captures × per-capture seconds for each
    executor; a pool pays once the sequential work left exceeds its extra start-up over the time it saves."""
    sizes = sorted({r["captures"] for r in rows})[-2:]
    if len(sizes) < 2:
        return []
    fit = {}
    for label in ("local, --jobs 1", "local, --jobs 2", "ray, --jobs 2"):
        (a, b) = [next(r for r in rows if r["captures"] == n and r["executor"] == label) for n in sizes]
        per = (b["seconds"] - a["seconds"]) / (sizes[1] - sizes[0])
        fit[label] = (a["seconds"] - per * sizes[0], per)
    (s1, t1), out = fit["local, --jobs 1"], []
    for label in ("local, --jobs 2", "ray, --jobs 2"):
        s2, t2 = fit[label]
        work = (s2 - s1) / (1 - t2 / t1)  # sequential seconds of auditing left from which the pool is faster
        out.append(f"- {label}: start-up {s2:.2f} s vs {s1:.2f} s for one process, {t2 * 1000:.1f} ms vs "
                   f"{t1 * 1000:.1f} ms per capture ({t1 / t2:.2f}× the throughput): it pays from "
                   f"{work:.1f} s of sequential work, here {work / t1:.0f} captures.")
    return ["Fit on the two largest runs (wall = start-up + captures × seconds per capture):", "", *out, "",
            "`--jobs auto` (the default) starts in one process and hands the captures left to one worker per CPU "
            "once they would take longer than 4.5 s at the pace measured so far.", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("memory", "executors"))
    parser.add_argument("--rounds", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--captures", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--baseline", type=Path, help="another checkout of gleak, for the before column")
    parser.add_argument("--only", help="executors: re-measure only those whose label contains this (e.g. auto)")
    args = parser.parse_args()
    path = OUT / "run-scale.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if args.part == "memory":
        results["memory"] = memory(args.rounds, args.baseline)
    else:
        results["executors"] = executors(args.captures, args.only, (results.get("executors") or {}).get("rows"))
    path.write_text(json.dumps(results, indent=1) + "\n")
    write(results)


if __name__ == "__main__":
    main()
