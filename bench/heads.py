"""Label attacks on large heads: time and peak memory of every label attack at ImageNet-sized C.

    python bench/heads.py                       # both heads, every attack, one process each, then all together
    python bench/heads.py --heads c1000 --attacks rlu llg-plus

Heads (random weights, synthetic inputs: nothing is downloaded; untrained, so recovery should be exact; the
client's step in train mode, as a client trains — BatchNorm on batch statistics; an untrained ResNet in eval mode
puts most of its mass on one class for every input, which is no model anyone trains with):

* ``c1000`` — torchvision ResNet-50 with C = 1000 classes (d = 2048, the RGLA paper's default model), B = 256
  FedSGD gradient on 3×32×32 inputs (the head is what the label attacks read; small inputs keep the model's
  forward passes affordable on a CPU), auxiliary data 4 images per class;
* ``c10000`` — torchvision ResNet-18 with C = 10,000 classes (d = 512), B = 512, auxiliary data 1 per class.

Each attack runs as ``gleak labels CAPTURE --aux AUX -a NAME --format json`` in its own process on one thread;
the peak RSS is that process's high-water mark (``ru_maxrss`` of the child), the time its wall clock. Then the
whole ``gleak labels`` run (every default attack) the same way. Writes bench/results/heads.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.capture import Truth, capture_gradients, save_capture  # noqa: E402
from gleak.data.images import Dataset, save_dataset  # noqa: E402
from gleak.models import build_arch, save_model  # noqa: E402

HEADS = {
    "c1000": {"arch": "resnet50", "classes": 1000, "batch": 256, "aux_per_class": 4, "size": 32},
    "c10000": {"arch": "resnet18", "classes": 10000, "batch": 512, "aux_per_class": 1, "size": 32},
}
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def make_head(name: str, folder: Path) -> tuple[Path, Path, Path]:
    """The model file, a FedSGD capture of B uniform-label synthetic images (with its truth) and the aux data."""
    spec = HEADS[name]
    model_path, cap_path, aux_path = folder / f"{name}.model.safetensors", folder / f"{name}.safetensors", \
        folder / f"{name}.aux.safetensors"
    if model_path.exists() and cap_path.exists() and aux_path.exists():
        return model_path, cap_path, aux_path
    torch.manual_seed(0)
    kwargs = {"num_classes": spec["classes"]}
    model = build_arch(f"torchvision:{spec['arch']}", kwargs).train()  # a client trains in train mode
    save_model(model, model_path, arch=f"torchvision:{spec['arch']}", arch_kwargs=kwargs, force=True)
    g = torch.Generator().manual_seed(1)
    C, B, s = spec["classes"], spec["batch"], spec["size"]
    pixels = torch.rand(B, 3, s, s, generator=g)
    inputs = (pixels - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    labels = torch.randint(C, (B,), generator=g)
    cap = capture_gradients(model, inputs, labels, mean=list(MEAN), std=list(STD))
    save_capture(cap, cap_path, truth=Truth(labels=labels, inputs=inputs), force=True)
    n = spec["aux_per_class"] * C
    aux = Dataset(torch.rand(n, 3, s, s, generator=g), torch.arange(C).repeat(spec["aux_per_class"]), MEAN, STD)
    save_dataset(aux, aux_path, force=True)
    return model_path, cap_path, aux_path


def run_one(cap: Path, model: Path, aux: Path, attacks: list[str], extra: list[str]) -> dict[str, object]:
    """One `gleak labels` process: its wall time, peak RSS (MB), exit code and the attacks' status and iAcc."""
    cmd = [sys.executable, "-m", "gleak", "--threads", "1", "labels", str(cap), "--model", str(model), "--aux",
           str(aux), "--format", "json", *[a for name in attacks for a in ("-a", name)], *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, the largest child so far
    out: dict[str, object] = {"seconds": round(seconds, 1), "exit": proc.returncode,
                              "peak_rss_mb": round(peak / 1024) if peak > before else None}  # MiB
    try:
        report = json.loads(proc.stdout)
        out["results"] = {r["attack"]: {"status": r["status"], "iacc": (r.get("scores") or {}).get("iacc"),
                                        "seconds": r["seconds"], "reason": r.get("reason")}
                          for r in report.get("results", [])}
    except json.JSONDecodeError:
        out["stderr"] = proc.stderr.strip().splitlines()[-1:] if proc.stderr else []
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", nargs="*", default=list(HEADS))
    parser.add_argument("--attacks", nargs="*", default=["idlg", "llg", "llg-star", "llg-plus", "ilrg", "zlg",
                                                            "zlg-plus", "posterior", "rlu", "softlabel"])
    parser.add_argument("--folder", type=Path, default=ROOT / "out" / "bench-heads")
    parser.add_argument("--extra", nargs="*", default=[], help="more `gleak labels` arguments, e.g. --max-memory 1")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "heads")
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.heads:
        model, cap, aux = make_head(name, args.folder)
        for attack in args.attacks:
            # a fresh process per attack, so that ru_maxrss is that attack's run alone
            result = run_isolated(cap, model, aux, [attack], args.extra)
            rows.append({"head": name, "attack": attack, **result})
            print(json.dumps(rows[-1]), flush=True)
        result = run_isolated(cap, model, aux, [], args.extra)
        rows.append({"head": name, "attack": "(all default attacks)", **result})
        print(json.dumps(rows[-1]), flush=True)
    if str(args.out):
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(render(rows))


def run_isolated(cap: Path, model: Path, aux: Path, attacks: list[str], extra: list[str]) -> dict[str, object]:
    """run_one in a fresh interpreter, so that the children's high-water mark is this run's alone."""
    call = f"run_one(Path({str(cap)!r}), Path({str(model)!r}), Path({str(aux)!r}), {attacks!r}, {extra!r})"
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from bench.heads import run_one; "
            f"from pathlib import Path; print(json.dumps({call}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"exit": proc.returncode, "stderr": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(rows: list[dict[str, object]]) -> str:
    lines = ["# Label attacks on large heads", "",
             "`python bench/heads.py` (one torch thread; each row one `gleak labels` process; peak RSS is its "
             "high-water mark). Heads: " + "; ".join(
                 f"`{k}` {v['arch']} C = {v['classes']}, B = {v['batch']}, aux {v['aux_per_class']}/class, "
                 f"{v['size']}×{v['size']} inputs" for k, v in HEADS.items()), "",
             "", "Attack s includes the forward of the auxiliary data when the attack is the first to need it (about "
             "8 s for 4,000 or 10,000 images); process s is the whole `gleak labels` run, torch's import included. "
             "Peak RSS in MiB (about 1.1 GiB of it is torch, the model and the capture, the idlg row).", "",
             "| head | attack | status | iAcc | attack s | process s | peak RSS MiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        results = r.get("results") or {}
        assert isinstance(results, dict)
        if r["attack"] == "(all default attacks)":
            ok = sum(1 for v in results.values() if v["status"] == "ok")
            status = f"{ok}/{len(results)} ok"
            iacc, secs = "", ""
        else:
            v = results.get(r["attack"], {})
            status = v.get("status", f"exit {r.get('exit')}") if v else f"exit {r.get('exit')}: {r.get('stderr')}"
            if v.get("reason"):
                status += f" ({v['reason'][:80]})"
            iacc = "" if v.get("iacc") is None else f"{v['iacc']:.3f}"
            secs = "" if v.get("seconds") is None else f"{v['seconds']:.1f}"
        lines.append(f"| {r['head']} | {r['attack']} | {status} | {iacc} | {secs} | {r.get('seconds', '')} | "
                     f"{r.get('peak_rss_mb', '')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
