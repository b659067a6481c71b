"""Soft-label benchmark (Wang, Liang & He, ICLR 2024, Tables 2 and 5 in small): success, L_r, time of `softlabel`.

    python bench/softlabel.py                    # 200 samples per setting, noise settings 100
    python bench/softlabel.py --samples 50 --noise-samples 20
    python bench/softlabel.py --only main        # clean settings only: bench/results/softlabel-main.md
    python bench/softlabel.py --only noise --noise-samples 20      # Table 5, the paper's protocol
    python bench/softlabel.py --relative-noise --relative-samples 50  # σ-relative noise on every tensor
    python bench/softlabel.py --relative-noise --relative-samples 25 --relative-model relu  # a harder extra

One torch thread (``--threads``, gleak's default). ``--levels``/``--dists`` restrict the σ-relative runs,
``--results DIR`` writes elsewhere and ``--code`` labels the run (a baseline of older code, run from its own
checkout, is kept as bench/results/softlabel-relative-before.json and compared on the same captures).

Samples are single real images from the shipped MNIST client split and the 20 CIFAR-10 images, each with
a fresh ε ~ U(0, 0.5) (smoothing) or a partner of another class and a ratio ~ U(0, 1) (mixup). Success:
‖ŷ − y‖₁ < 1e−3 (L_r is reported on successes). Writes bench/results/softlabel.md.

Noise (Wang, Liang & He §5.2, Table 5), as the reference's `label_recovery.setup(noise=..., std=...)` adds it:
zero-mean Gaussian or Laplace noise whose *standard deviation* is the table's level (the reference's
argument is named `std`, its Laplace scale is std/√2, and Table 5's L_s grows tenfold per decade of the
level, i.e. linearly in the noise amplitude), drawn once for the row r = argmax |row sum| of the clean
gradient only ("reference"), or for the whole last-layer weight gradient ("full": what a DP client
sends, gleak's harder setting). Success is the reference's oracle on λ = s/coe: |λ − λ*| < 1 with
λ* = nanmean(x_true / ∇W_clean[r]) — zero features give 0/0 = NaN there and drop out — which is the
reference's |s − s*| < 1 for the coefficient 1 of its ResNet-18 runs (their L_s match coefficient 1, see
docs/methods/label-recovery.md#softlabel); "strict" is gleak's own units, |s − s*| < 1 at coe = 4. L_s is the
mean |λ − λ*|.

σ-relative noise (``--relative-noise``, gleak's own protocol): every tensor of the capture gets zero-mean
Gaussian or Laplace noise of standard deviation σ·RMS(that tensor) (∇W and ∇b of the last layer among them),
the metadata unchanged; the augmentation is *not* given (``auto``). Captures: single examples of the shipped
MNIST client split and CIFAR-10 images on the untrained sigmoid LeNet-5 of the main table, with its last-layer
bias and with the same layer without bias, smoothing with ε ~ U(0, 0.5) and mixup with a partner of another
class and a ratio ~ U(0, 1) (``sample``), ``--relative-samples`` per cell (2 data sets × 2 layers × 2 kinds =
8 cells), the same captures at every level; samples and noise are drawn from ``--seed``. Success: ‖ŷ − y‖₁ ≤ 0.1
and the right augmentation named; the attack's confidence is checked against the truth (coverage: how often
the error stays within the reported 90 % bound ``l1_error_bound``; flagged: how often a failure carried the
low-confidence or uncertain-augmentation warning). Both protocols' rows are kept in
bench/results/softlabel-{noise,relative}.json, and bench/results/softlabel-noise.md is written from whichever
exist.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.attacks import build_context, get_attack, run_attack  # noqa: E402
from gleak.attacks.labels.softlabel import COEFFICIENT  # noqa: E402
from gleak.capture import capture_gradients  # noqa: E402
from gleak.data.images import Dataset, load_dataset  # noqa: E402
from gleak.losses import LossSpec  # noqa: E402
from gleak.models import LoadedModel, build_zoo_model, load_model  # noqa: E402


def model_for(name: str, shape: tuple[int, int, int]) -> LoadedModel:
    if name.endswith(".safetensors"):
        return load_model(ROOT / name)
    if name == "resnet18":  # Wang, Liang & He's Table 5 model: untrained torchvision ResNet-18 (kaiming init), C = 10
        from gleak.models import build_arch

        torch.manual_seed(0)
        module = build_arch("torchvision:resnet18", {"num_classes": 10})
        module.fc = torch.nn.Linear(512, 10, bias=False)  # the reference's model.py ResNet: bias-free last layer
        return LoadedModel(module.eval(), "bench", "torchvision:resnet18", {}, shape, "", {})
    act, init = {"sigmoid": ("sigmoid", "uniform"), "relu": ("relu", "default")}[name]
    torch.manual_seed(0)
    module = build_zoo_model("lenet", activation=act, init=init, in_channels=shape[0], image_size=shape[1]).eval()
    return LoadedModel(module, "bench", "lenet", {}, shape, "", {})


def sample(data: Dataset, kind: str, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    i = int(rng.integers(len(data)))
    x, y = data.batch([i])
    C = 10
    if kind == "smoothing":
        eps = float(rng.uniform(0, 0.5))
        return x, (1 - eps) * torch.nn.functional.one_hot(y, C).double() + eps / C
    while True:
        j = int(rng.integers(len(data)))
        if data.labels[j] != data.labels[i]:
            break
    x2, y2 = data.batch([j])
    r = float(rng.uniform(0, 1))
    target = r * torch.nn.functional.one_hot(y, C).double() + (1 - r) * torch.nn.functional.one_hot(y2, C).double()
    return r * x + (1 - r) * x2, target


def without_bias(model: LoadedModel) -> LoadedModel:
    """The same model with its last linear layer's bias removed (weights kept): the bias-free setting."""
    import copy

    module = copy.deepcopy(model.module)
    parent, name = module, ""
    for key, child in module.named_modules():
        if isinstance(child, torch.nn.Linear):
            name = key
    *path, leaf = name.split(".")
    for part in path:
        parent = getattr(parent, part)
    old = getattr(parent, leaf)
    new = torch.nn.Linear(old.in_features, old.out_features, bias=False)
    new.weight.data = old.weight.data.clone()
    setattr(parent, leaf, new)
    return LoadedModel(module.eval(), model.source, model.arch, {}, model.input_shape, "", {})


def draw_noise(shape: torch.Size, dist: str, std: float, gen: torch.Generator) -> torch.Tensor:
    """Zero-mean noise of standard deviation ``std`` (Laplace: scale std/√2, as the reference)."""
    if dist == "gaussian":
        return torch.randn(shape, generator=gen) * std
    u = torch.rand(shape, generator=gen) - 0.5
    return -(std / 2**0.5) * torch.sign(u) * torch.log1p(-2 * u.abs())


def run(label: str, model: LoadedModel, data: Dataset, kind: str, n: int,
        noise: tuple[str, float, str] | None = None, seed: int = 0) -> dict:
    """One setting; ``noise`` = (distribution, standard deviation, "reference" | "full")."""
    rng = np.random.default_rng(seed)
    attack = get_attack("softlabel")
    if noise is not None:
        # as the paper's Table 5: the augmentation is known, only λ is searched
        attack.configure({"augmentation": kind})
    ok, l1s, times, stages, oracle, strict, errors, close = 0, [], [], [], 0, 0, [], 0
    for k in range(n):
        x, y = sample(data, kind, rng)
        cap = capture_gradients(model.module, x, y.float(), LossSpec())
        name = [t for t in cap.tensors if t.endswith("weight")][-1]
        clean = cap.tensors[name].clone()
        if noise is not None:
            dist, std, where = noise
            gen = torch.Generator().manual_seed(seed * 100_000 + k)
            if where == "full":
                cap.tensors[name] = clean + draw_noise(clean.shape, dist, std, gen)
            else:  # the reference: only the row it reads x from, picked on the clean gradient
                row = int(torch.argmax(clean.double().sum(1).abs()))
                cap.tensors[name] = clean.clone()
                cap.tensors[name][row] += draw_noise(clean.shape[1:], dist, std, gen)
        ctx = build_context(cap, model, seed=k)
        result = run_attack(attack, ctx)
        if result.status != "ok":
            continue
        d = result.output.diagnostics
        l1 = float((result.output.soft_label - y[0]).abs().sum())
        times.append(result.seconds)
        stages.append(d["stage"].split(" ")[0])
        if l1 < 1e-3:
            ok += 1
            l1s.append(l1)
        close += l1 <= 0.1
        if noise is not None:  # the reference's oracle, on the clean gradient (never on the noisy one)
            h, _ = ctx.features_and_logits(x)
            g = clean[d["row"]].double()
            ratio = torch.where(g != 0, h[0].double() / g, torch.tensor(float("nan"), dtype=torch.float64))
            lam_true = float(np.nanmean(ratio.numpy()))
            error = abs(d["lambda"] - lam_true)
            errors.append(error)
            oracle += error < 1
            strict += error * COEFFICIENT[d["augmentation"]] < 1  # |s − s*| < 1 in gleak's units (s = coe·λ)
    row = {"setting": label, "n": n, "success": ok / n, "oracle": oracle / n if noise else None,
           "strict": strict / n if noise else None, "l_s": statistics.mean(errors) if errors else None,
           "l1_01": close / n,
           "l1": statistics.mean(l1s) if l1s else float("nan"), "median_s": statistics.median(times),
           "max_s": max(times), "pso": stages.count("pso") / n}
    print(f"{label:<48} success {row['success']:.3f}"
          + (f" oracle {row['oracle']:.3f} strict {row['strict']:.3f} L_s {row['l_s']:.3g}" if noise else "")
          + f"  L_r {row['l1']:.2e}  median {row['median_s']:.3f}s  max {row['max_s']:.2f}s  pso {row['pso']:.2f}",
          flush=True)
    return row


RELATIVE_LEVELS = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)
FLAGS = ("low confidence", "uncertain augmentation")
PAPER_TABLE5 = {  # Wang, Liang & He, ICLR 2024, Table 5: accuracy (%) and L_s, untrained ResNet-18, CIFAR-10
    ("gaussian", 1e-4): (100, 1.02e-4), ("gaussian", 1e-3): (100, 1.13e-3), ("gaussian", 1e-2): (100, 1.14e-2),
    ("gaussian", 1e-1): (45, 5.82e-1), ("laplace", 1e-4): (100, 1.61e-4), ("laplace", 1e-3): (100, 8.07e-4),
    ("laplace", 1e-2): (100, 7.95e-3), ("laplace", 1e-1): (36, 7.95e-1)}


def relative_cells(mnist: Dataset, cifar: Dataset, activation: str = "sigmoid"
                   ) -> list[tuple[str, LoadedModel, Dataset]]:
    cells = []
    for title, data, shape in (("MNIST", mnist, (1, 28, 28)), ("CIFAR-10", cifar, (3, 32, 32))):
        model = model_for(activation, shape)
        cells += [(f"{title}, bias", model, data), (f"{title}, no bias", without_bias(model), data)]
    return cells


def run_relative(mnist: Dataset, cifar: Dataset, n: int, seed: int, levels: tuple[float, ...] = RELATIVE_LEVELS,
                 dists: tuple[str, ...] = ("gaussian", "laplace"), activation: str = "sigmoid") -> list[dict]:
    """σ-relative noise on every tensor of single-example captures (see the module docstring); one row per trial."""
    attack = get_attack("softlabel")
    trials = []
    for c, (title, model, data) in enumerate(relative_cells(mnist, cifar, activation)):
        for kind in ("smoothing", "mixup"):
            rng = np.random.default_rng([seed, c, kind == "mixup"])
            for k in range(n):
                x, y = sample(data, kind, rng)
                cap = capture_gradients(model.module, x, y.float(), LossSpec())
                clean = {name: t.clone() for name, t in cap.tensors.items()}
                for d, dist in enumerate(("gaussian", "laplace")):
                    for level in levels:
                        if dist not in dists or (level == 0 and dist != dists[0]):
                            continue
                        gen = torch.Generator().manual_seed(
                            int(np.random.SeedSequence([seed, c, kind == "mixup", k, d]).generate_state(1)[0]))
                        cap.tensors = {name: t + draw_noise(t.shape, dist, level * float(t.double().pow(2).mean()
                                                                                        .sqrt()), gen).to(t.dtype)
                                       for name, t in clean.items()}
                        result = run_attack(attack, build_context(cap, model, seed=k))
                        if result.status != "ok":
                            trials.append({"cell": f"{title}, {kind}", "k": k, "kind": kind, "dist": dist,
                                           "level": level, "l1": 2.0, "augmentation": None, "confidence": None,
                                           "bound": None, "flagged": False, "seconds": result.seconds})
                            continue
                        diag = result.output.diagnostics
                        trials.append({
                            "cell": f"{title}, {kind}", "k": k, "kind": kind, "dist": dist, "level": level,
                            "l1": float((result.output.soft_label - y[0]).abs().sum()),
                            "augmentation": diag["augmentation"], "confidence": diag.get("confidence"),
                            "bound": diag.get("l1_error_bound"), "seconds": result.seconds,
                            "flagged": any(f in w for w in result.output.warnings for f in FLAGS)})
        done = [t for t in trials if t["cell"].startswith(title)]
        print(f"{title}: {len(done)} trials, L1 ≤ 0.1 in {sum(t['l1'] <= 0.1 for t in done)}", flush=True)
    return trials


def summarise_relative(trials: list[dict]) -> list[dict]:
    rows = []
    for dist in ("gaussian", "laplace"):
        for level in RELATIVE_LEVELS:
            ts = [t for t in trials if t["level"] == level and (t["dist"] == dist or level == 0)]
            if not ts or (level == 0 and dist == "laplace"):
                continue
            ok = [t["l1"] <= 0.1 for t in ts]
            aug = [t["augmentation"] == t["kind"] for t in ts]
            failures = [t for t, a, b in zip(ts, ok, aug, strict=True) if not (a and b)]
            rows.append({
                "dist": dist if level else "none", "level": level, "n": len(ts), "l1_ok": sum(ok),
                "aug_ok": sum(aug), "both": sum(a and b for a, b in zip(ok, aug, strict=True)),
                "median_l1": statistics.median(t["l1"] for t in ts),
                "p90_l1": float(np.quantile([t["l1"] for t in ts], 0.9)),
                "median_confidence": statistics.median(t["confidence"] or 0.0 for t in ts)
                if any(t["confidence"] is not None for t in ts) else None,
                "covered": sum(t["bound"] is not None and t["l1"] <= t["bound"] for t in ts),
                "failures": len(failures), "flagged_failures": sum(t["flagged"] for t in failures),
                "flagged": sum(t["flagged"] for t in ts),
                "median_s": statistics.median(t["seconds"] for t in ts), "max_s": max(t["seconds"] for t in ts)})
    return rows


def pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.1f} %)" if n else "—"


def relative_lines(trials: list[dict], meta: dict) -> list[str]:
    rows = summarise_relative(trials)
    model = {"sigmoid": "untrained LeNet-5 sigmoid", "relu": "untrained LeNet-5 relu"}[meta.get("model", "sigmoid")]
    lines = [f"## σ-relative noise on every tensor (gleak's protocol), {model}", "",
             f"{meta['per_cell']} captures per cell × 8 cells (MNIST / CIFAR-10 × last layer with / without bias × "
             f"smoothing / mixup), the same captures at every level; seed {meta['seed']}; "
             f"`{meta['command']}`; {meta['seconds']:.0f} s, {meta['threads']} torch thread(s). Noise std = "
             "σ·RMS of each tensor; the augmentation is not given. Success = ‖ŷ − y‖₁ ≤ 0.1 and the right "
             "augmentation named. Covered = L1 within the attack's 90 % bound `l1_error_bound`; flagged failures = "
             "failures that carried a low-confidence or uncertain-augmentation warning (flagged = all warned trials).",
             "", "| noise | σ | L1 ≤ 0.1 | right augmentation | both | median L1 | 90 % L1 | median confidence "
             "| covered by the bound | flagged failures | flagged | median time (s) | max time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dist']} | {r['level']:g} | {pct(r['l1_ok'], r['n'])} | {pct(r['aug_ok'], r['n'])} "
                     f"| {pct(r['both'], r['n'])} | {r['median_l1']:.2g} | {r['p90_l1']:.2g} "
                     f"| {'—' if r['median_confidence'] is None else format(r['median_confidence'], '.4f')} "
                     f"| {pct(r['covered'], r['n'])} "
                     f"| {r['flagged_failures']}/{r['failures']} | {r['flagged']}/{r['n']} | {r['median_s']:.3f} "
                     f"| {r['max_s']:.2f} |")
    cells = sorted({t["cell"] for t in trials}, key=lambda c: ([t["cell"] for t in trials].index(c)))
    levels = sorted({t["level"] for t in trials if t["level"]})
    lines += ["", "Per cell (L1 ≤ 0.1 / right augmentation, out of "
              f"{meta['per_cell']}), Gaussian | Laplace:", "",
              "| cell | " + " | ".join(f"G {lv:g}" for lv in levels) + " | "
              + " | ".join(f"L {lv:g}" for lv in levels) + " |", "|---|" + "---|" * (2 * len(levels))]
    for cell in cells:
        parts = []
        for dist in ("gaussian", "laplace"):
            for lv in levels:
                ts = [t for t in trials if t["cell"] == cell and t["dist"] == dist and t["level"] == lv]
                parts.append(f"{sum(t['l1'] <= 0.1 for t in ts)} / {sum(t['augmentation'] == t['kind'] for t in ts)}")
        lines.append(f"| {cell} | " + " | ".join(parts) + " |")
    return lines


def side_by_side(noise_rows: list[dict], trials: list[dict]) -> list[str]:
    """Table 5's levels with the paper's numbers, gleak under the paper's protocol, gleak under σ-relative noise."""
    rel = {(r["dist"], r["level"]): r for r in summarise_relative(trials)} if trials else {}
    lines = ["## Table 5 side by side", "",
             "Paper: Wang, Liang & He (ICLR 2024) Table 5 (untrained ResNet-18, CIFAR-10, 100 images, smoothing "
             "known, success |λ − λ*| < 1). Paper's protocol here: the same model and success, noise std = the level "
             "on the whole ∇W (`full`) or on row r only (`reference`, the reference code). σ-relative: LeNet-5, 8 "
             "cells, noise std = level × RMS of every tensor, augmentation not given, success ‖ŷ − y‖₁ ≤ 0.1 (and "
             "the right augmentation).", "",
             "| noise | level | paper: acc., L_s | paper's protocol, full: acc., L_s | paper's protocol, reference: "
             "acc., L_s | σ-relative: L1 ≤ 0.1 | σ-relative: right augmentation |", "|---|---|---|---|---|---|---|"]
    for dist in ("gaussian", "laplace"):
        for level in (1e-4, 1e-3, 1e-2, 1e-1):
            acc, ls = PAPER_TABLE5[(dist, level)]
            cols = []
            for where in ("full", "reference"):
                row = next((r for r in noise_rows if r["setting"].startswith("CIFAR-10 ResNet-18")
                            and f", {where}, {dist} {level:g}" in r["setting"]), None)
                cols.append(f"{100 * row['oracle']:.0f} % (n = {row['n']}), {row['l_s']:.3g}" if row else "—")
            r = rel.get((dist, level))
            cols += [pct(r["l1_ok"], r["n"]), pct(r["aug_ok"], r["n"])] if r else ["—", "—"]
            lines.append(f"| {dist} | {level:g} | {acc} %, {ls:.3g} | " + " | ".join(cols) + " |")
    return lines


def before_after(before: dict, trials: list[dict]) -> list[str]:
    """The stored run of the code before the noise-aware fit next to this run, on the same captures and noise."""
    old = before["trials"]
    keys = {(t["cell"], t["k"], t["dist"], t["level"]) for t in old}
    new = [t for t in trials if (t["cell"], t["k"], t["dist"], t["level"]) in keys]
    lines = ["## Before and after, same captures and noise", "",
             f"Before: {before['meta']['code']} (`{before['meta']['command']}`, {before['meta']['seconds']:.0f} s); "
             f"after: this run restricted to the same {before['meta']['per_cell']} captures per cell.", "",
             "| noise | σ | L1 ≤ 0.1 before | after | right augmentation before | after | median time (s) before "
             "| after |", "|---|---|---|---|---|---|---|---|"]
    b, a = ({(r["dist"], r["level"]): r for r in summarise_relative(ts)} for ts in (old, new))
    for key, rb in b.items():
        ra = a.get(key)
        if ra is None:
            continue
        lines.append(f"| {key[0]} | {key[1]:g} | {pct(rb['l1_ok'], rb['n'])} | {pct(ra['l1_ok'], ra['n'])} "
                     f"| {pct(rb['aug_ok'], rb['n'])} | {pct(ra['aug_ok'], ra['n'])} | {rb['median_s']:.3f} "
                     f"| {ra['median_s']:.3f} |")
    return lines


def noise_lines(noise_rows: list[dict], meta: dict) -> list[str]:
    return ["## Noise on the last-layer gradient (Table 5, the paper's protocol)", "",
            f"{meta['samples']} samples per setting; `{meta['command']}`; {meta['seconds']:.0f} s, "
            f"{meta['threads']} torch thread(s). Level = noise standard deviation (the reference's `std`); "
            "reference = noise on row r only, full = on the whole ∇W; the augmentation (smoothing) is given, "
            "as in the paper.", "",
            "| setting | oracle |λ − λ*| < 1 | strict |s − s*| < 1 | L_s = mean |λ − λ*| | ‖ŷ − y‖₁ < 1e−3 "
            "| ‖ŷ − y‖₁ ≤ 0.1 | median time (s) |", "|---|---|---|---|---|---|---|"] + [
        f"| {r['setting']} | {r['oracle']:.3f} | {r['strict']:.3f} | {r['l_s']:.3g} | {r['success']:.3f} "
        f"| {r.get('l1_01', float('nan')):.3f} | {r['median_s']:.3f} |" for r in noise_rows]


def write_noise_report(results: Path) -> Path:
    """softlabel-noise.md in ``results`` from the stored rows of both protocols (whichever exist)."""
    stored = {}
    for name in ("noise", "relative"):
        path = results / f"softlabel-{name}.json"
        stored[name] = json.loads(path.read_text()) if path.exists() else None
    lines = ["# Soft-label benchmark under noise (`softlabel`; Wang, Liang & He, ICLR 2024)", ""]
    noise_rows = stored["noise"]["rows"] if stored["noise"] else []
    trials = stored["relative"]["trials"] if stored["relative"] else []
    lines += side_by_side(noise_rows, trials)
    before = results / "softlabel-relative-before.json"
    if trials and before.exists():
        lines += ["", *before_after(json.loads(before.read_text()), trials)]
    if trials:
        lines += ["", *relative_lines(trials, stored["relative"]["meta"])]
    relu = results / "softlabel-relative-relu.json"
    if relu.exists():
        stored_relu = json.loads(relu.read_text())
        lines += ["", *relative_lines(stored_relu["trials"], stored_relu["meta"])]
    if noise_rows:
        lines += ["", *noise_lines(noise_rows, stored["noise"]["meta"])]
    out = results / "softlabel-noise.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="gleak soft-label benchmark")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--noise-samples", type=int, default=100)
    parser.add_argument("--only", choices=["main", "noise", "relative"], default=None)
    parser.add_argument("--relative-noise", action="store_true", help="σ-relative noise only (= --only relative)")
    parser.add_argument("--relative-samples", type=int, default=25, help="captures per cell (8 cells)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the σ-relative captures and noise")
    parser.add_argument("--levels", default=",".join(f"{lv:g}" for lv in RELATIVE_LEVELS),
                        help="σ of the σ-relative runs, comma-separated")
    parser.add_argument("--dists", default="gaussian,laplace", help="noise distributions of the σ-relative runs")
    parser.add_argument("--relative-model", choices=["sigmoid", "relu"], default="sigmoid",
                        help="the LeNet-5 of the σ-relative runs (relu: stored apart, a harder extra setting)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, default=ROOT / "bench/results", help="where the results go")
    parser.add_argument("--code", default="this tree", help="what code ran (recorded with the σ-relative rows)")
    args = parser.parse_args()
    if args.relative_noise:
        args.only = "relative"
    torch.set_num_threads(args.threads)
    command = "python bench/softlabel.py " + " ".join(sys.argv[1:])
    mnist = load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    cifar = load_dataset(ROOT / "samples/data/cifar10.safetensors")
    start = time.time()
    rows, noise_rows = [], []
    if args.only in (None, "main"):
        for model_name, title in (("sigmoid", "untrained LeNet-5 sigmoid"), ("relu", "untrained LeNet-5 relu"),
                                  ("samples/models/lenet_mnist80.safetensors", "trained LeNet-5 relu (82%)"),
                                  ("samples/models/lenet_mnist98.safetensors", "trained LeNet-5 relu (98.7%)")):
            model = model_for(model_name, (1, 28, 28))
            for kind in ("smoothing", "mixup"):
                rows.append(run(f"MNIST, {title}, {kind}", model, mnist, kind, args.samples))
        for model_name in ("sigmoid", "relu"):
            model = model_for(model_name, (3, 32, 32))
            for kind in ("smoothing", "mixup"):
                rows.append(run(f"CIFAR-10, untrained LeNet-5 {model_name}, {kind}", model, cifar, kind, args.samples))
        lines = ["# Soft-label benchmark (`softlabel`; Wang, Liang & He, ICLR 2024)", "",
                 f"{args.samples} samples per setting; success = ‖ŷ − y‖₁ < 1e−3; L_r = mean ‖ŷ − y‖₁ over "
                 f"successes; time per sample, {args.threads} torch thread(s) on 2 shared CPU cores; `{command}`, "
                 f"{time.time() - start:.0f} s.", "",
                 "| setting | success | mean L_r | median time (s) | max time (s) | PSO used |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['setting']} | {r['success']:.3f} | {r['l1']:.2e} | {r['median_s']:.3f} | {r['max_s']:.2f} "
                  f"| {r['pso']:.2f} |" for r in rows]
        out = args.results / "softlabel-main.md"
        out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    if args.only in (None, "noise"):
        t0 = time.time()
        for model_name, data, shape, title in (("resnet18", cifar, (3, 32, 32), "CIFAR-10 ResNet-18"),
                                               ("sigmoid", mnist, (1, 28, 28), "MNIST LeNet-5 sigmoid")):
            model = model_for(model_name, shape)
            for where in ("reference", "full"):
                for dist in ("gaussian", "laplace"):
                    for level in (1e-4, 1e-3, 1e-2, 1e-1):
                        noise_rows.append(run(f"{title}, smoothing, {where}, {dist} {level:g}", model, data,
                                              "smoothing", args.noise_samples, (dist, level, where)))
        meta = {"samples": args.noise_samples, "command": command, "seconds": time.time() - t0,
                "threads": args.threads}
        (args.results / "softlabel-noise.json").write_text(json.dumps({"meta": meta, "rows": noise_rows},
                                                                            indent=1) + "\n")
    if args.only in (None, "relative"):
        t0 = time.time()
        trials = run_relative(mnist, cifar, args.relative_samples, args.seed,
                              tuple(float(v) for v in args.levels.split(",")), tuple(args.dists.split(",")),
                              args.relative_model)
        meta = {"per_cell": args.relative_samples, "seed": args.seed, "command": command,
                "seconds": time.time() - t0, "threads": args.threads, "code": args.code, "model": args.relative_model}
        name = "softlabel-relative" + ("" if args.relative_model == "sigmoid" else "-" + args.relative_model)
        (args.results / f"{name}.json").write_text(json.dumps({"meta": meta, "trials": trials})
                                                                    + "\n")
        print("\n".join(relative_lines(trials, meta)))
    if args.only in (None, "noise", "relative"):
        out = write_noise_report(args.results)
        print(f"wrote {out}")
    print(f"done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
