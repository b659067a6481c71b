"""Start-up benchmark: wall time of `gleak --help` and of `gleak labels` on the shipped FedSGD sample.

    python bench/startup.py              # median of 5 runs each, written to bench/results/startup.md
    python bench/startup.py --runs 9     # more runs
    python bench/startup.py --threads    # also: reconstruction it/s with 1 vs torch's default threads,
                                         # idle and beside one CPU-bound busy loop (about 2 minutes)

Every command runs in a fresh process (the installed `gleak` console script of this interpreter), so the
times include Python's start-up and every import. Quality bars: `--help` < 1 s, `labels` < 4.5 s on two idle
cores. The machine's load average is recorded with the numbers: on a shared machine they are upper bounds.
"""

from __future__ import annotations

import argparse
import json
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
LABELS = ["labels", str(SAMPLES / "captures/fedsgd_b32.safetensors"), "--model",
          str(SAMPLES / "models/lenet_untrained.safetensors"), "--aux", str(SAMPLES / "data/mnist_aux.safetensors")]
BARS = {"gleak --help": 1.0, "gleak labels (FedSGD sample)": 4.5}


TORCH_ONLY = "python -c 'import torch' (reference)"


def wall(args: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds one `gleak ARGS` process takes, start to exit (it must succeed); ``["import torch"]`` times a bare
    interpreter importing torch, the floor under any command that runs an attack."""
    command = [sys.executable, "-c", "import torch"] if args == ["import torch"] else [GLEAK, *args]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                   env=env)
    return time.perf_counter() - start


def time_startup(runs: int) -> dict[str, list[float]]:
    """The wall times of each measured command, ``runs`` of each, interleaved."""
    commands = {"gleak --help": ["--help"], "gleak labels (FedSGD sample)": LABELS, TORCH_ONLY: ["import torch"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for args in commands.values():
        wall(args)  # warm the file cache
    for _ in range(runs):
        for name, args in commands.items():
            times[name].append(wall(args))
    return times


def reconstruction_speed(threads: str | None, busy: bool, iterations: int) -> float:
    """Iterations per second of `gleak reconstruct` (ig on the CIFAR sample) with GLEAK_THREADS=``threads``
    (None: torch's default), optionally beside one CPU-bound busy loop."""
    env = dict(os.environ)
    env.pop("GLEAK_THREADS", None)
    if threads is not None:
        env["GLEAK_THREADS"] = threads
    loop = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [GLEAK, "reconstruct", str(SAMPLES / "captures/cifar10_b8.safetensors"), "--model",
                 str(SAMPLES / "models/idlg_cnn_cifar10.safetensors"), "-a", "ig", "-n", str(iterations),
                 "--lpips", "off", "-o", tmp, "--force", "--format", "json"],
                check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
    return float(json.loads(out.stdout)["iterations_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", action="store_true", help="also measure reconstruction threads")
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()

    load = os.getloadavg()
    times = time_startup(args.runs)
    lines = ["# Start-up time", "",
             f"`python bench/startup.py --runs {args.runs}`: each command in a fresh process, {args.runs} runs; "
             f"{os.cpu_count()} CPU cores, load average before the runs {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
             "(1 / 5 / 15 min). Times in seconds, wall clock.", "",
             "| command | min | median | max | bar | met |", "|---|---:|---:|---:|---:|:---:|"]
    for name, values in times.items():
        med = statistics.median(values)
        if name not in BARS:
            lines.append(f"| {name} | {min(values):.2f} | {med:.2f} | {max(values):.2f} | | |")
            continue
        lines.append(f"| {name} | {min(values):.2f} | {med:.2f} | {max(values):.2f} | < {BARS[name]:g} | "
                     f"{'yes' if med < BARS[name] else 'no'} |")
    if args.threads:
        lines += ["", "## Reconstruction threads", "",
                  f"`gleak reconstruct` (ig, CIFAR sample, {args.iterations} iterations), iterations per second; "
                  "'busy' runs beside one `python -c 'while 1: pass'`.", "",
                  "| threads | idle it/s | busy it/s |", "|---|---:|---:|"]
        default = str(os.cpu_count() or 1)
        for threads in ("1", default):
            idle = reconstruction_speed(threads, False, args.iterations)
            busy = reconstruction_speed(threads, True, args.iterations)
            lines.append(f"| {threads} | {idle:.1f} | {busy:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench/results/startup.md"
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
