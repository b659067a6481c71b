"""Reconstruction benchmark (Wang, Liang & He, ICLR 2024, Tables 3, 4 and 6 in small, plus Inverting Gradients'
default budget; protocol: docs/methods/reconstruction.md#benchmark).

    python bench/reconstruct.py                 # everything (≈ 30–40 min on 2 idle cores)
    python bench/reconstruct.py --only fcn      # one part: table3 | table4 | fcn | ig | speed
    python bench/reconstruct.py --images 2      # fewer images per setting

Single real images from the shipped CIFAR-10 (20 images) and MNIST client split, one per trial, each with a
fresh label-smoothing ε ~ U(0, 0.5) or a mixup partner of another class with ratio ~ U(0, 1) (Wang, Liang &
He §4.3, §5.1). Models: their "LeNet" is DLG's sigmoid CNN with U(−0.5, 0.5) weights (our ``idlg-cnn``, the shipped
``idlg_cnn_cifar10``); LeNet-5 (relu; untrained and the shipped 98.7 %-trained MNIST model) for contrast.

* table3 — labels recovered by ``softlabel`` vs the true soft labels vs a random one-hot label; L2 (dlg,
  L-BFGS) and cosine (ig, Adam); TV 1e-2 for both as in Wang, Liang & He's code.
* table4 — the feature term: ``feature`` with β ∈ {0, 1, 2} (mixup and smoothing, L2, recovered labels).
* fcn — the analytic inversion on bias-free ReLU FCNs sized for 28×28 and 3×32×32 inputs.
* ig, dlg — ``ig`` / ``dlg`` with their default budgets on single CIFAR-10 images (bars: ig ≥ 22 dB, dlg ≥ 35 dB),
  with time, iterations and objective evaluations.
* speed — iterations and objective evaluations per second of each gradient-matching attack.

Budgets are smaller than the paper's (300 L-BFGS / 4,800 Adam steps) so the whole run fits a CPU; each
table says what it used. Writes bench/results/reconstruct.md (and .json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from softlabel import sample  # noqa: E402  (bench/softlabel.py: Wang, Liang & He §4.3 single-image targets)

from gleak.attacks import build_context, get_attack, run_attack  # noqa: E402
from gleak.attacks.reconstruct.base import to_pixels  # noqa: E402
from gleak.attacks.reconstruct.inputs import prepare  # noqa: E402
from gleak.capture import Truth, capture_gradients  # noqa: E402
from gleak.data.images import Dataset, load_dataset  # noqa: E402
from gleak.losses import LossSpec  # noqa: E402
from gleak.metrics.images import image_scores  # noqa: E402
from gleak.metrics.perceptual import load_lpips  # noqa: E402
from gleak.models import LoadedModel, build_zoo_model, load_model  # noqa: E402

C = 10
LPIPS = load_lpips("alex")


def zoo(name: str, shape: tuple[int, int, int], seed: int = 0, **kwargs: Any) -> LoadedModel:
    torch.manual_seed(seed)
    if name == "fcn4":
        module = build_zoo_model("fcn4", input_shape=list(shape), **kwargs)
    else:
        module = build_zoo_model(name, in_channels=shape[0], image_size=shape[1], **kwargs)
    return LoadedModel(module.eval(), "bench", name, kwargs, shape)


def trial(model: LoadedModel, data: Dataset, kind: str, seed: int):
    """(context, truth) of one single-image gradient."""
    rng = np.random.default_rng(seed)
    x, y = sample(data, kind, rng)
    meta = {"gleak.data.mean": list(data.mean), "gleak.data.std": list(data.std),
            "gleak.input_shape": list(data.input_shape)}
    cap = capture_gradients(model.module, x, y.float(), LossSpec(), meta)
    return build_context(cap, model, seed=seed), Truth(labels=y.float(), inputs=x)


def reconstruct(ctx, truth: Truth, attack_name: str, labels: str, seed: int, **options: Any) -> dict[str, float]:
    if labels == "random":
        g = torch.Generator().manual_seed(seed)
        inputs = prepare(ctx, "truth", truth, want_feature=attack_name == "feature")
        inputs.targets = torch.nn.functional.one_hot(torch.randint(C, (1,), generator=g), C).double()
    else:
        inputs = prepare(ctx, "auto" if labels == "recovered" else "truth", truth,
                         want_feature=attack_name in ("feature", "fcn"))
    attack = get_attack(attack_name)
    attack.configure(options)
    result = run_attack(attack, ctx, inputs.run_inputs())
    if result.status != "ok":
        raise RuntimeError(f"{attack_name}: {result.reason}")
    scores = image_scores(result.output.images, to_pixels(ctx, truth.inputs), LPIPS)
    iters = result.output.diagnostics.get("iterations_run") or 0
    evals = result.output.diagnostics.get("evaluations_run") or 0
    return {"psnr": min(scores["mean"]["psnr"], 150.0), "ssim": scores["mean"]["ssim"],
            "lpips": scores["mean"].get("lpips", float("nan")), "seconds": result.seconds,
            "it_per_s": iters / result.seconds if iters else float("nan"),
            "evals_per_s": evals / result.seconds if evals else float("nan"), "iterations": iters,
            "evaluations": evals,
            "label_l1": float((inputs.targets - truth.labels.double()).abs().sum())}


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] == r[key]]
        out[key] = statistics.mean(values) if values else float("nan")
        out[key + "_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return out


def fmt(s: dict[str, float], key: str, digits: int = 2) -> str:
    return f"{s[key]:.{digits}f} ± {s[key + '_sd']:.{digits}f}"


SETUPS = {
    "table3": [("idlg-cnn (DLG 'LeNet', sigmoid, U(±0.5)) CIFAR-10", "cifar", "idlg_cnn_cifar10"),
               ("idlg-cnn MNIST", "mnist", "idlg-mnist")],
}


def models_and_data() -> dict[str, Any]:
    cifar, mnist = load_dataset(ROOT / "samples/data/cifar10.safetensors"), \
        load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    return {
        "cifar": cifar, "mnist": mnist,
        "idlg_cnn_cifar10": load_model(ROOT / "samples/models/idlg_cnn_cifar10.safetensors"),
        "idlg-mnist": zoo("idlg-cnn", (1, 28, 28)),
        "lenet-relu-mnist": load_model(ROOT / "samples/models/lenet_untrained.safetensors"),
        "lenet-98-mnist": load_model(ROOT / "samples/models/lenet_mnist98.safetensors"),
    }


def table3(env: dict[str, Any], n: int, l2_iters: int, cos_iters: int, match: str = "") -> tuple[str, list[dict]]:
    lines = [f"## Table 3 in small: recovered vs true vs random labels ({n} images per row; L2 = dlg with "
             f"{l2_iters} L-BFGS steps, cosine = ig with {cos_iters} Adam steps; TV 1e-2)", "",
             "| model / data | augmentation | distance | labels | PSNR dB | SSIM | LPIPS | label L1 |",
             "|---|---|---|---|---|---|---|---|"]
    out = []
    for title, data_key, model_key in [*SETUPS["table3"], ("LeNet-5 relu untrained MNIST", "mnist",
                                                           "lenet-relu-mnist")]:
        for kind in ("mixup", "smoothing"):
            for dist, attack, iters in (("L2", "dlg", l2_iters), ("cosine", "ig", cos_iters)):
                if model_key == "lenet-relu-mnist" and dist == "cosine":
                    continue
                if not all(word in f"{title} {kind} {dist}" for word in match.split()):
                    continue
                paired: list[float] = []
                for labels in ("recovered", "true", "random"):
                    rows = []
                    for k in range(n):
                        ctx, truth = trial(env[model_key], env[data_key], kind, seed=1000 + k)
                        rows.append(reconstruct(ctx, truth, attack, labels, k, iterations=iters, tv=1e-2))
                    s = summarise(rows)
                    out.append({"model": title, "kind": kind, "distance": dist, "labels": labels, **s,
                                "per_image_psnr": [r["psnr"] for r in rows]})
                    if labels == "recovered":
                        paired = [r["psnr"] for r in rows]
                    diff = ""
                    if labels == "true":
                        d = [a - b for a, b in zip(paired, (r["psnr"] for r in rows), strict=True)]
                        se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else 0.0
                        diff = f" (recovered − true: {statistics.mean(d):+.2f} ± {se:.2f} dB)"
                    line = (f"| {title} | {kind} | {dist} | {labels}{diff} | {fmt(s, 'psnr')} | "
                            f"{fmt(s, 'ssim', 3)} | {fmt(s, 'lpips', 3)} | {s['label_l1']:.1e} |")
                    print(line, flush=True)
                    lines.append(line)
    return "\n".join(lines), out


def table4(env: dict[str, Any], n: int, iters: int) -> tuple[str, list[dict]]:
    lines = [f"## Table 4 in small: feature term β (feature attack, L2, {iters} L-BFGS steps, TV 1e-2, recovered "
             f"labels and feature; {n} images per row)", "",
             "| model / data | augmentation | β | PSNR dB | SSIM | LPIPS |", "|---|---|---|---|---|---|"]
    out = []
    for title, data_key, model_key in [*SETUPS["table3"], ("LeNet-5 relu untrained MNIST", "mnist",
                                                           "lenet-relu-mnist")]:
        for kind in ("mixup", "smoothing"):
            for beta in (0.0, 1.0, 2.0):
                rows = []
                for k in range(n):
                    ctx, truth = trial(env[model_key], env[data_key], kind, seed=2000 + k)
                    rows.append(reconstruct(ctx, truth, "feature", "recovered", k, iterations=iters, beta=beta,
                                            distance="l2", tv=1e-2))
                s = summarise(rows)
                out.append({"model": title, "kind": kind, "beta": beta, **s})
                line = (f"| {title} | {kind} | {beta:g} | {fmt(s, 'psnr')} | {fmt(s, 'ssim', 3)} | "
                        f"{fmt(s, 'lpips', 3)} |")
                print(line, flush=True)
                lines.append(line)
    return "\n".join(lines), out


def fcn(env: dict[str, Any], n: int) -> tuple[str, list[dict]]:
    lines = [f"## Analytic FCN inversion (Wang, Liang & He, ICLR 2024, §4.2, Table 6 in small; {n} images per row, "
             "recovered soft label and feature)", "",
             "| network | augmentation | PSNR dB (min) | SSIM | LPIPS | time ms |", "|---|---|---|---|---|---|"]
    out = []
    for title, data_key, shape in (("FCN-4 bias-free 784-1024-256-64-10, MNIST", "mnist", (1, 28, 28)),
                                   ("FCN-4 bias-free 3072-1024-256-64-10, CIFAR-10", "cifar", (3, 32, 32))):
        model = zoo("fcn4", shape)
        for kind in ("smoothing", "mixup"):
            rows = []
            for k in range(n):
                ctx, truth = trial(model, env[data_key], kind, seed=3000 + k)
                rows.append(reconstruct(ctx, truth, "fcn", "recovered", k))
            s = summarise(rows)
            worst = min(r["psnr"] for r in rows)
            out.append({"model": title, "kind": kind, "min_psnr": worst, **s})
            line = (f"| {title} | {kind} | {fmt(s, 'psnr')} ({worst:.1f}) | {fmt(s, 'ssim', 4)} | "
                    f"{fmt(s, 'lpips', 4)} | {s['seconds'] * 1e3:.1f} |")
            print(line, flush=True)
            lines.append(line)
    return "\n".join(lines), out


def default_budget(env: dict[str, Any], n: int, attack: str = "ig") -> tuple[str, list[dict]]:
    """``attack`` with its default budget on single CIFAR-10 images (bars: dlg ≥ 35 dB, ig ≥ 22 dB)."""
    lines = [f"## {attack} with its default budget on single CIFAR-10 images (untrained idlg-cnn, one-hot true "
             f"labels, {n} images)", "", "| image | PSNR dB | SSIM | LPIPS | seconds | iterations | evaluations |",
             "|---|---|---|---|---|---|---|"]
    out = []
    model, data = env["idlg_cnn_cifar10"], env["cifar"]
    for k in range(n):
        x, y = data.batch([k])
        meta = {"gleak.data.mean": list(data.mean), "gleak.data.std": list(data.std),
                "gleak.input_shape": list(data.input_shape)}
        ctx = build_context(capture_gradients(model.module, x, y, LossSpec(), meta), model, seed=k)
        truth = Truth(labels=torch.nn.functional.one_hot(y, C).float(), inputs=x)
        r = reconstruct(ctx, truth, attack, "true", k)
        out.append({"image": k, **r})
        line = (f"| {k} | {r['psnr']:.2f} | {r['ssim']:.3f} | {r['lpips']:.3f} | {r['seconds']:.1f} | "
                f"{r['iterations']} | {r['evaluations']} |")
        print(line, flush=True)
        lines.append(line)
    s = summarise([{k: v for k, v in r.items() if k != "image"} for r in out])
    lines.append(f"| mean | {fmt(s, 'psnr')} | {fmt(s, 'ssim', 3)} | {fmt(s, 'lpips', 3)} | {s['seconds']:.1f} | | |")
    return "\n".join(lines), out


def speed(env: dict[str, Any]) -> tuple[str, list[dict]]:
    lines = ["## Speed: iterations and objective evaluations per second (B = 1; an L-BFGS iteration runs up to "
             "25 evaluations, an Adam iteration one)", "",
             "| attack | model / data | iterations/s | evaluations/s |", "|---|---|---|---|"]
    out = []
    for attack, iters in (("dlg", 20), ("feature", 20), ("ig", 200)):
        for title, data_key, model_key in [*SETUPS["table3"], ("LeNet-5 relu MNIST", "mnist", "lenet-relu-mnist")]:
            ctx, truth = trial(env[model_key], env[data_key], "smoothing", seed=4000)
            r = reconstruct(ctx, truth, attack, "true", 0, iterations=iters)
            out.append({"attack": attack, "model": title, "it_per_s": r["it_per_s"], "evals_per_s": r["evals_per_s"]})
            line = f"| {attack} | {title} | {r['it_per_s']:.1f} | {r['evals_per_s']:.1f} |"
            print(line, flush=True)
            lines.append(line)
    return "\n".join(lines), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["table3", "table4", "fcn", "ig", "dlg", "speed"], default=None)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--l2-iterations", type=int, default=60)
    parser.add_argument("--cos-iterations", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--match", default="", help="table3: only rows whose 'model augmentation distance' "
                        "contains every word, e.g. 'CIFAR mixup cosine'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    env = models_and_data()
    sections, raw = [], {}
    started = time.time()
    parts = [args.only] if args.only else ["fcn", "speed", "ig", "table3", "table4"]
    for part in parts:
        if part == "table3":
            text, rows = table3(env, args.images, args.l2_iterations, args.cos_iterations, args.match)
        elif part == "table4":
            text, rows = table4(env, args.images, args.l2_iterations)
        elif part == "fcn":
            text, rows = fcn(env, max(args.images, 10))
        elif part in ("ig", "dlg"):
            text, rows = default_budget(env, args.images, part)
        else:
            text, rows = speed(env)
        sections.append(text)
        raw[part] = rows
    header = (f"# Reconstruction benchmark\n\n`python bench/reconstruct.py {' '.join(sys.argv[1:])}`, "
              f"{time.time() - started:.0f} s, torch threads {args.threads}; LPIPS: "
              f"{LPIPS.source if LPIPS.available else LPIPS.reason}\n")
    name = "reconstruct" + (f"-{args.only}" if args.only else "") + ("-" + "-".join(args.match.split())
                                                                     if args.match else "")
    out = ROOT / "bench/results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.md").write_text(header + "\n" + "\n\n".join(sections) + "\n")
    (out / f"{name}.json").write_text(json.dumps(raw, indent=1, default=float) + "\n")
    print(f"wrote {out / name}.md")


if __name__ == "__main__":
    main()
