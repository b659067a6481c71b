"""A real Flower run, end to end: federate, capture, audit the whole run (local and Ray), leakage over rounds.

    python bench/fl_run.py [--rounds 20 --clients 5] [--work DIR] [--local-steps 10 --batch-size 8 --lr 0.1]

Protocol:

1. Federation — ``examples/flower/run.py --rounds R --clients N --no-audit --force --out WORK/run`` in a subprocess:
   LeNet-5 (ReLU) trained from scratch (``samples/models/lenet_untrained.safetensors``) by FedAvg over every client
   each round, each client on its shard of ``samples/data/mnist_client.safetensors`` (every N-th digit), in Flower's
   simulation engine (Ray). gleak's ``GleakCaptureMod`` writes every client update as a capture with its ground-truth
   file (the client calls ``record_batch`` on each batch) and each round's global model under
   ``captures/models``. The example's own defaults (3 local steps of 8 digits, lr 0.05) leave the model at 37 % test
   accuracy after 20 rounds (an in-process replica of the same FedAvg); this bench's defaults (10 steps of 8, lr 0.1)
   let it learn (about 90 %), so that the label leakage can be followed as the model learns.
2. Test accuracy — every ``captures/models/round-*.safetensors`` (the global model the clients received in that
   round) on the 2,000 held-out digits of ``samples/data/mnist_aux.safetensors``; plus the final model after round R,
   rebuilt as FedAvg does it (round R's global model + the mean of round R's updates weighted by
   ``gleak.num_examples``), which no file holds.
3. Audit — ``gleak audit WORK/run/captures --model WORK/run/captures/models --aux samples/data/mnist_aux.safetensors
   --lpips off --fail-on none --format json,html,md -o WORK/audit-local --force --executor local`` and the same with
   ``--executor ray --jobs 2`` into ``WORK/audit-ray``; the two reports' ``findings`` must be identical (timings,
   ``executor`` and ``jobs`` differ by design).
4. Leakage per round, from the local report: per capture the best label iAcc (the max of ``scores.iacc`` over its
   ``labels`` attacks) and the chance iAcc; per round the max and median best iAcc over the clients and the median
   chance. Label leakage has dropped to chance from the first round r after which every round's max best iAcc is
   less than the median chance + 0.05 (the audit's low margin).

Each subprocess is measured for wall time and peak memory: this process makes itself the child subreaper (Linux),
so that processes its child orphans (Ray's raylet and workers outlive or lose their parents) are reparented here
and reaped with ``wait4``; ``largest`` is the largest ``ru_maxrss`` of any process in the tree, ``tree`` the peak of
the summed RSS of all of them, sampled every 0.2 s (shared pages, e.g. Ray's object store, count once per process).

Writes bench/results/fl-run.md (and .json) and docs/images/fl-run-label-iacc.png (the audit's own
``run-label_iacc.png`` when it writes one, else drawn here). WORK defaults to /tmp/gleak-fl-run (GLEAK_BENCH_DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
PLOT = ROOT / "docs" / "images" / "fl-run-label-iacc.png"
AUX = ROOT / "samples" / "data" / "mnist_aux.safetensors"
WORK = Path(os.environ.get("GLEAK_BENCH_DIR", "/tmp/gleak-fl-run"))
LOW_MARGIN = 0.05  # the audit's low margin over chance (iAcc)
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants (Ray's processes) are reparented to this process, so their rusage is reaped here."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def tree_rss() -> int:
    """Summed RSS (bytes) of every live descendant of this process."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += child.memory_info().rss
    return total


def measure(command: list[str], log: Path, cwd: Path, linger: float = 30.0) -> dict[str, Any]:
    """Wall time, the largest ru_maxrss of any process of the command's tree, and the peak summed RSS of the tree.

    Output goes to ``log`` (a pipe could fill and block the command). After the command exits, descendants it left
    behind are waited for ``linger`` seconds, then ended (SIGKILL, by pid) and reaped."""
    peak_tree, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak_tree[0] = max(peak_tree[0], tree_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    sampler.start()
    largest, reaped, status = 0, 0, 0
    while True:  # the command itself, and whatever orphans exit before it
        pid, st, usage = os.wait4(-1, 0)
        largest, reaped = max(largest, usage.ru_maxrss), reaped + 1
        if pid == proc.pid:
            status = st
            break
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    deadline, killed = time.monotonic() + linger, 0
    while True:  # orphans still running (reparented here)
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            largest, reaped = max(largest, usage.ru_maxrss), reaped + 1
            continue
        if time.monotonic() > deadline and not killed:
            import psutil

            for child in psutil.Process().children():
                try:
                    os.kill(child.pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    stop.set()
    sampler.join()
    code = proc.returncode
    tail = log.read_text(errors="replace").strip().splitlines()
    error = next((line for line in reversed(tail) if line.strip()), "") if code not in (0, 1) else ""
    return {"seconds": round(wall, 2), "largest_rss_mib": round(largest / 1024, 1),
            "tree_rss_mib": round(peak_tree[0] / 2**20, 1), "processes_reaped": reaped,
            "left_behind_killed": killed, "exit": code, "error": error[-300:], "log": str(log)}


def round_of(path: str) -> int | None:
    found = re.search(r"round-(\d+)", path)
    return int(found.group(1)) if found else None


def accuracies(models: Path, captures: Path) -> dict[str, Any]:
    """Test accuracy on the aux digits of each round's global model, and of the final model (after round R)."""
    import torch

    from gleak.capture import load_capture
    from gleak.data.images import load_dataset
    from gleak.models import load_model

    torch.set_num_threads(1)
    data = load_dataset(AUX)
    inputs, labels = data.batch(torch.arange(len(data)))

    def accuracy(module: torch.nn.Module) -> float:
        module.eval()
        with torch.no_grad():
            return round(float((module(inputs).argmax(1) == labels).float().mean()), 4)

    by_round: dict[int, float] = {}
    files = {r: p for p in sorted(models.glob("round-*.safetensors")) if (r := round_of(p.name)) is not None}
    for r, path in files.items():
        by_round[r] = accuracy(load_model(path).module)
    final = None
    if files:
        last = max(files)
        model = load_model(files[last]).module
        updates = [load_capture(p) for p in sorted((captures / f"round-{last:04d}").glob("client-*.safetensors"))
                   if not p.name.endswith(".truth.safetensors")]
        updates = [u for u in updates if u.kind == "update"]
        if updates:
            weights = [float(u.get("gleak.num_examples") or 1) for u in updates]
            state = model.state_dict()
            for name in state:
                if all(name in u.tensors for u in updates):
                    delta = sum(w * u.tensors[name].to(state[name].dtype)
                                for w, u in zip(weights, updates, strict=True))
                    state[name] = state[name] + delta / sum(weights)
            model.load_state_dict(state)
            final = {"after_round": last, "accuracy": accuracy(model), "updates": len(updates)}
    return {"by_round": {str(r): a for r, a in sorted(by_round.items())}, "final": final, "test_examples": len(data)}


def audit_command(run: Path, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "gleak", "audit", str(run / "captures"), "--model", str(run / "captures" / "models"),
            "--aux", str(AUX), "--lpips", "off", "--fail-on", "none", "--format", "json,html,md", "-o", str(out),
            "--force", *extra]


def leakage(report: dict[str, Any]) -> dict[str, Any]:
    """Per round: max and median over clients of the best label iAcc, median chance iAcc."""
    rounds: dict[int, dict[str, list[float]]] = {}
    skipped = 0
    round_field = False
    for capture in report["captures"]:
        if capture.get("round") is not None:
            r, round_field = int(capture["round"]), True
        else:
            r = round_of(capture["capture"]["path"])
        scores = [a["scores"]["iacc"] for a in capture.get("attacks", [])
                  if a.get("task") == "labels" and a.get("scores") and a["scores"].get("iacc") is not None]
        chance = (capture.get("chance") or {}).get("iacc")
        if r is None or not scores or chance is None:
            skipped += 1
            continue
        row = rounds.setdefault(r, {"best": [], "chance": []})
        row["best"].append(max(scores))
        row["chance"].append(chance)
    table = {r: {"clients": len(v["best"]), "max_best": round(max(v["best"]), 4),
                 "median_best": round(statistics.median(v["best"]), 4),
                 "median_chance": round(statistics.median(v["chance"]), 4)} for r, v in sorted(rounds.items())}
    drop = None
    for r in sorted(table, reverse=True):  # the first round from which every later round is below the margin
        if table[r]["max_best"] - table[r]["median_chance"] < LOW_MARGIN:
            drop = r
        else:
            break
    return {"rounds": {str(r): v for r, v in table.items()}, "drop_to_chance_round": drop,
            "captures_without_scores": skipped, "round_from": "captures[].round" if round_field else "capture path"}


def compare_findings(local: dict[str, Any], ray: dict[str, Any]) -> dict[str, Any]:
    a, b = local.get("findings", []), ray.get("findings", [])
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    return {"equal": a == b, "local": len(a), "ray": len(b), "first_difference": differ[0] if differ else None}


def plot(table: dict[str, dict[str, Any]], rounds: int, clients: int, audit_plot: Path) -> str:
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    if audit_plot.exists():
        shutil.copyfile(audit_plot, PLOT)
        return f"the audit's own {audit_plot.name}"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [int(r) for r in table]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [table[str(r)]["max_best"] for r in xs], marker="o", label="max over clients")
    ax.plot(xs, [table[str(r)]["median_best"] for r in xs], marker="s", label="median over clients")
    ax.plot(xs, [table[str(r)]["median_chance"] for r in xs], linestyle="--", color="grey", label="chance (median)")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("best label iAcc")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"best label iAcc over rounds (Flower, {rounds} rounds × {clients} clients)")
    ax.legend(loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)
    plt.close(fig)
    return "drawn by bench/fl_run.py (the audit wrote no run-label_iacc.png)"


def write(results: dict[str, Any]) -> None:
    s, m = results["settings"], results["measures"]
    lines = ["# A real Flower run, end to end", "",
             f"`{results['command']}` ({results['cpus']} CPUs). Protocol: the module docstring of bench/fl_run.py.", "",
             f"Settings: {s['rounds']} rounds × {s['clients']} clients, LeNet-5 (ReLU) from scratch, FedAvg, "
             f"{s['local_steps']} local SGD steps of {s['batch_size']} MNIST digits at lr {s['lr']} per client round; "
             f"gleak's capture mod (writer thread, truth files); audit: quick budget, `--aux mnist_aux --lpips off`.",
             "", "| step | wall s | largest process RSS MiB | process tree RSS MiB (peak sum) | exit |",
             "|---|---|---|---|---|"]
    for label, key in (("federation (run.py, Ray)", "federation"),
                       ("audit, --executor local (--jobs auto)", "audit_local"),
                       ("audit, --executor ray --jobs 2", "audit_ray")):
        r = m.get(key)
        if r:
            lines.append(f"| {label} | {r['seconds']} | {r['largest_rss_mib']} | {r['tree_rss_mib']} | {r['exit']} |")
    lines += ["", "Largest process: the largest `ru_maxrss` of any process of the step (wait4, orphans reaped here as "
              "child subreaper). Tree: the peak of the summed RSS of all its processes, sampled every 0.2 s (it can "
              "miss a short peak; shared pages count once per process)."]
    for key in ("federation", "audit_local", "audit_ray"):
        if (r := m.get(key)) and r["error"]:
            lines.append(f"\n{key} failed: `{r['error']}`")
    f = results["findings"]
    lines += ["", f"Findings of the local and the Ray audit identical: **{'yes' if f['equal'] else 'no'}** "
              f"({f['local']} vs {f['ray']} findings)." if f else "Findings not compared (an audit failed).", ""]
    acc, leak = results["accuracy"], results["leakage"]
    lines += [f"Test accuracy: the global model the clients received in that round, on the {acc['test_examples']} "
              "held-out aux digits. iAcc: per capture the best label attack's, then max / median over the round's "
              f"clients (round from {leak['round_from']}).", "",
              "| round | test accuracy | max best iAcc | median best iAcc | median chance iAcc |",
              "|---|---|---|---|---|"]
    for r in sorted({*map(int, acc["by_round"]), *map(int, leak["rounds"])}):
        a, row = acc["by_round"].get(str(r)), leak["rounds"].get(str(r))
        cells = [f"{row['max_best']:.3f}", f"{row['median_best']:.3f}", f"{row['median_chance']:.3f}"] if row \
            else ["—"] * 3
        lines.append(f"| {r} | {a:.3f} |" if a is not None else f"| {r} | — |")
        lines[-1] += " " + " | ".join(cells) + " |"
    if acc["final"]:
        lines.append(f"| after {acc['final']['after_round']} (final) | {acc['final']['accuracy']:.3f} | | | |")
    drop = leak["drop_to_chance_round"]
    lines += ["", "Label leakage drops to chance (max best iAcc < median chance + 0.05 in that round and every later "
              f"one): **{f'round {drop}' if drop is not None else 'never within ' + str(s['rounds']) + ' rounds'}**.",
              ""]
    below = [r for r, row in leak["rounds"].items() if row["median_best"] < row["median_chance"]]
    if below:
        lines += [f"The median best iAcc is below chance (the attack does worse than guessing) in rounds "
                  f"{', '.join(below)}.", ""]
    lines += [f"Plot: docs/images/fl-run-label-iacc.png ({results['plot']}).", ""]
    if leak["captures_without_scores"]:
        lines.insert(-1, f"{leak['captures_without_scores']} captures had no label iAcc (left out of the table).\n")
    (OUT / "fl-run.md").write_text("\n".join(lines), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--work", type=Path, default=WORK, help="the run and the audits go here")
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    run = work / "run"
    subreaper = become_subreaper()
    settings = {"rounds": args.rounds, "clients": args.clients, "local_steps": args.local_steps,
                "batch_size": args.batch_size, "lr": args.lr, "work": str(work), "subreaper": subreaper}
    command = " ".join(["python bench/fl_run.py", *sys.argv[1:]])
    print(f"federation: {args.rounds} rounds × {args.clients} clients", flush=True)
    federation = measure([sys.executable, str(ROOT / "examples" / "flower" / "run.py"), "--rounds", str(args.rounds),
                          "--clients", str(args.clients), "--local-steps", str(args.local_steps), "--batch-size",
                          str(args.batch_size), "--lr", str(args.lr), "--no-audit", "--force", "--out", str(run)],
                         work / "federation.log", work)
    print(json.dumps(federation), flush=True)
    if federation["exit"] != 0:
        print(f"the federation failed; see {federation['log']}", file=sys.stderr)
        return 1
    captures = run / "captures"
    acc = accuracies(captures / "models", captures)
    print(json.dumps(acc), flush=True)
    measures = {"federation": federation}
    reports: dict[str, dict[str, Any]] = {}
    for key, folder, extra in (("audit_local", "audit-local", ["--executor", "local"]),
                               ("audit_ray", "audit-ray", ["--executor", "ray", "--jobs", "2"])):
        print(f"{key}", flush=True)
        measures[key] = measure(audit_command(run, work / folder, extra), work / f"{folder}.log", work)
        print(json.dumps(measures[key]), flush=True)
        report = work / folder / "report.json"
        if measures[key]["exit"] in (0, 1) and report.exists():
            reports[key] = json.loads(report.read_text())
    if "audit_local" not in reports:
        print("the local audit failed", file=sys.stderr)
        return 1
    findings = compare_findings(reports["audit_local"], reports["audit_ray"]) if "audit_ray" in reports else None
    leak = leakage(reports["audit_local"])
    results = {"command": command, "cpus": os.cpu_count(), "settings": settings, "measures": measures,
               "findings": findings, "accuracy": acc, "leakage": leak,
               "plot": plot(leak["rounds"], args.rounds, args.clients, work / "audit-local" / "run-label_iacc.png")}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fl-run.json").write_text(json.dumps(results, indent=1) + "\n")
    write(results)
    print((OUT / "fl-run.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
