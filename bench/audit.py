"""`gleak audit` timings: the quick audit of the shipped FedSGD sample, and label-only audits of many captures.

    python bench/audit.py                    # both parts, writes bench/results/audit.md
    python bench/audit.py --only quick       # one part, writes bench/results/audit-quick.md (or -many)
    python bench/audit.py --runs 5 --captures 200

* quick — `gleak audit samples/captures/fedsgd_b32.safetensors -M samples/models --aux … --budget quick`, end to
  end in a fresh process (start-up included), ``--runs`` times: min / median (bar: < 20 s on 2 idle cores).
* many — ``--captures`` FedSGD captures (LeNet-5, B = 32, real MNIST, each with its truth) made with
  `gleak.simulate`, audited with ``--jobs 1`` and ``--jobs 2``: wall time, throughput and the peak resident
  memory of the audit and its workers (bar: jobs 2 ≥ 1.6× jobs 1; peak memory independent of the number of
  captures, checked by auditing a quarter of them too).

Times are wall clock on this machine with its load average recorded; every process uses one torch thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLEAK = str(Path(sys.executable).parent / "gleak")
SAMPLES = ROOT / "samples"


def run(args: list[str]) -> tuple[float, int, float]:
    """(seconds, exit code, peak RSS in MiB of the process and its children) of one `gleak ARGS`."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter(); rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL).returncode\n"
            "print(time.perf_counter() - t, rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    out = subprocess.run([sys.executable, "-c", code, GLEAK, *args], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "GLEAK_THREADS": "1"})
    seconds, rc, rss = out.stdout.split()
    return float(seconds), int(rc), float(rss)


def quick(runs: int) -> list[str]:
    args = ["audit", str(SAMPLES / "captures/fedsgd_b32.safetensors"), "-M", str(SAMPLES / "models"), "--aux",
            str(SAMPLES / "data/mnist_aux.safetensors"), "--budget", "quick", "-q"]
    run(args)  # warm the file cache
    times = [run(args)[0] for _ in range(runs)]
    med = statistics.median(times)
    return ["## Quick audit of the shipped FedSGD B = 32 sample (end to end, start-up included)", "",
            f"{runs} runs: min {min(times):.2f} s, median {med:.2f} s, max {max(times):.2f} s "
            f"(bar < 20 s: {'met' if med < 20 else 'not met'}).", ""]


def make_captures(folder: Path, n: int) -> None:
    import torch

    from gleak.capture import save_capture, save_truth, truth_path_for
    from gleak.data.images import load_dataset
    from gleak.models import load_model
    from gleak.simulate.images import ClientConfig, simulate_client

    torch.set_num_threads(1)
    model = load_model(SAMPLES / "models/lenet_untrained.safetensors")
    data = load_dataset(SAMPLES / "data/mnist_client.safetensors")
    for i in range(n):
        cap, truth = simulate_client(model.module, data, ClientConfig(batch_size=32, seed=1000 + i))
        path = save_capture(cap, folder / f"client_{i:04d}.safetensors")
        save_truth(truth, truth_path_for(path))


def many(n: int) -> list[str]:
    lines = [f"## Label-only audit of {n} FedSGD captures (LeNet-5, B = 32, real MNIST, truth beside each)", "",
             "| captures | jobs | seconds | captures/s | speed-up | peak RSS MiB | exit |",
             "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "caps"
        folder.mkdir()
        made = time.perf_counter()
        make_captures(folder, n)
        print(f"made {n} captures in {time.perf_counter() - made:.0f} s", flush=True)
        quarter = Path(tmp) / "quarter"
        quarter.mkdir()
        for p in sorted(folder.iterdir())[: 2 * (n // 4)]:
            os.link(p, quarter / p.name)
        base = ["audit", "-M", str(SAMPLES / "models/lenet_untrained.safetensors"), "--aux",
                str(SAMPLES / "data/mnist_aux.safetensors"), "--budget", "quick", "--format", "json", "-o"]
        single = None
        for label, src, count in ((n, folder, n), (n // 4, quarter, n // 4)):
            for jobs in (1, 2):
                out = Path(tmp) / f"out-{label}-{jobs}"
                seconds, rc, rss = run([*base, str(out), "--jobs", str(jobs), str(src), "-q"])
                if count == n and jobs == 1:
                    single = seconds
                speed = f"{single / seconds:.2f}×" if count == n and single else ""
                lines.append(f"| {count} | {jobs} | {seconds:.1f} | {count / seconds:.2f} | {speed} | {rss:.0f} "
                             f"| {rc} |")
                print(lines[-1], flush=True)
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--captures", type=int, default=200)
    parser.add_argument("--only", choices=["quick", "many"])
    args = parser.parse_args()
    load = os.getloadavg()
    lines = ["# gleak audit timings", "",
             f"`python bench/audit.py {' '.join(sys.argv[1:])}`; {os.cpu_count()} CPU cores, one torch thread per "
             f"process; load average before the runs {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.", ""]
    if args.only in (None, "quick"):
        lines += quick(args.runs)
    if args.only in (None, "many"):
        lines += many(args.captures)
    out = ROOT / f"bench/results/audit{'-' + args.only if args.only else ''}.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
