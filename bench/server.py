"""Malicious-server crafts and `gleak check-model` (issue 46): detection rate per attack and strength, false
positives on honest models, seconds per model, and what a trapped update gives away at B = 16, 64 and 256.

    python bench/server.py                 # about 5 min on 2 cores; writes bench/results/server.md (+ PNG grids)
    python bench/server.py --seeds 3 --quick

Positives: each craft of gleak.tamper.craft at its default and stealthier settings, written into a zoo MLP's first
layer (the parameter form) and into a block inserted before LeNet-5 and the CIFAR ResNet (the published form).
Negatives: every zoo model at init over seeds, torchvision models at init, zoo models after ordinary SGD on the
shipped digits, every round's global model of a small FedAvg run, and Hugging Face decoders (GPT-2-style,
LLaMA-style; GPT-2 small at d = 768). Detection counts trap-tier findings only (exit 1); Wilson 95 % intervals.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.data.images import load_dataset  # noqa: E402
from gleak.models.zoo import build_zoo_model  # noqa: E402
from gleak.tamper import craft  # noqa: E402
from gleak.tamper import imprint as inversion  # noqa: E402
from gleak.tamper.structure import check_views  # noqa: E402
from gleak.tamper.views import layer_views  # noqa: E402

MNIST = ROOT / "samples" / "data" / "mnist_client.safetensors"
OUT = ROOT / "bench" / "results"


def flagged(model: nn.Module) -> bool:
    return any(h.tier == "trap" for h in check_views(list(layer_views(model))))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_dataset(MNIST)
    return ds.normalize(ds.images), ds.labels


def sgd(model: nn.Module, steps: int, seed: int, lr: float = 0.05) -> nn.Module:
    x, y = digits()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for _ in range(steps):
        pick = torch.randint(len(x), (64,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[pick]), y[pick]).backward()
        opt.step()
    return model.eval()


def base(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_zoo_model(name)


def inserted(name: str, seed: int, rows: int) -> nn.Module:
    model, _, _ = craft.insert_block(base(name, seed), name, {}, rows)
    return model


POSITIVES: dict[str, Callable[[nn.Module, int], craft.Crafted]] = {
    "imprint (default: 64 bins, cosine)": lambda m, s: craft.imprint(m, seed=s),
    "imprint, 8 bins": lambda m, s: craft.imprint(m, bins=8, seed=s),
    "imprint, 256 bins": lambda m, s: craft.imprint(m, bins=256, seed=s),
    "imprint, random measurement": lambda m, s: craft.imprint(m, linfunc="randn", seed=s),
    "imprint, mean measurement": lambda m, s: craft.imprint(m, linfunc="avg", seed=s),
    "imprint, rows shuffled": lambda m, s: craft.imprint(m, shuffle=True, seed=s),
    "imprint, gain 1e-3": lambda m, s: craft.imprint(m, gain=1e-3, seed=s),
    "imprint, noise 0.001": lambda m, s: craft.imprint(m, noise=1e-3, shuffle=True, seed=s),
    "imprint, noise 0.01": lambda m, s: craft.imprint(m, noise=1e-2, shuffle=True, seed=s),
    "imprint, noise 0.05": lambda m, s: craft.imprint(m, noise=5e-2, shuffle=True, seed=s),
    "imprint, noise 0.1": lambda m, s: craft.imprint(m, noise=0.1, shuffle=True, seed=s),
    "imprint, noise 0.3": lambda m, s: craft.imprint(m, noise=0.3, shuffle=True, seed=s),
    "trap weights (default: s = 0.95, σ = 0.5)": lambda m, s: craft.trap_weights(m, seed=s),
    "trap weights, s = 0.999, σ = 1/√n": lambda m, s: craft.trap_weights(m, 0.999, 1 / 28, seed=s),
    "class fishing (default: 0.5, bias 1000)": lambda m, s: craft.class_fishing(m, target=s % 10),
    "class fishing, bias 100": lambda m, s: craft.class_fishing(m, target=s % 10, bias_multiplier=100),
    "class fishing, bias 16": lambda m, s: craft.class_fishing(m, target=s % 10, bias_multiplier=16),
}
HOSTS: dict[str, Callable[[int, str], nn.Module]] = {  # imprint and trap weights: a block inserted before LeNet-5
    # and the CIFAR ResNet (their first layers are convolutions); fishing: the models' own last layer
    "MLP": lambda s, _: base("mlp", s),
    "LeNet-5": lambda s, kind: inserted("lenet", s, 256) if kind != "fishing" else base("lenet", s),
    "CIFAR ResNet": lambda s, kind: (inserted("resnet-cifar", s, 256) if kind != "fishing"
                                                      else base("resnet-cifar", s)),
}


def positives(seeds: int) -> list[dict[str, Any]]:
    rows = []
    for label, make in POSITIVES.items():
        kind = "fishing" if label.startswith("class fishing") else "other"
        for host, build in HOSTS.items():
            hits = sum(flagged(make(build(s, kind), s).model) for s in range(seeds))
            rows.append({"attack": label, "host": host, "flagged": hits, "n": seeds})
            print(f"{label:45s} {host:30s} {hits}/{seeds}", flush=True)
    return rows


def fedavg_rounds(rounds: int, clients: int, seed: int) -> list[nn.Module]:
    """Every round's global LeNet of a small honest FedAvg run on the digits (IID shards, 10 SGD steps each)."""
    x, y = digits()
    torch.manual_seed(seed)
    global_model = build_zoo_model("lenet")
    out = []
    shards = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).chunk(clients)
    for r in range(rounds):
        states = []
        for c, shard in enumerate(shards):
            local = build_zoo_model("lenet")
            local.load_state_dict(global_model.state_dict())
            opt = torch.optim.SGD(local.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(seed * 1000 + r * 10 + c)
            for _ in range(10):
                pick = shard[torch.randint(len(shard), (8,), generator=gen)]
                opt.zero_grad()
                nn.functional.cross_entropy(local(x[pick]), y[pick]).backward()
                opt.step()
            states.append(local.state_dict())
        global_model.load_state_dict({k: torch.stack([s[k].float() for s in states]).mean(0).to(states[0][k].dtype)
                                      for k in states[0]})
        out.append(build_zoo_model("lenet"))
        out[-1].load_state_dict(global_model.state_dict())
    return out


def negatives(seeds: int, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(family: str, models: list[nn.Module]) -> None:
        fp = sum(flagged(m) for m in models)
        rows.append({"family": family, "flagged": fp, "n": len(models)})
        print(f"{family:60s} {fp}/{len(models)}", flush=True)

    for name in ("lenet", "idlg-cnn", "fcn4", "mlp", "resnet-cifar"):
        add(f"zoo {name} at init", [base(name, s) for s in range(4 * seeds)])
    for name in ("lenet", "mlp"):
        add(f"zoo {name} after 300 SGD steps", [sgd(base(name, s), 300, s) for s in range(seeds)])
    add("LeNet FedAvg: every round's global model (2 runs × 10 rounds × 5 clients)",
        [m for s in range(2) for m in fedavg_rounds(10, 5, s)])
    import torchvision

    names = ["resnet18", "mobilenet_v3_small", "efficientnet_b0"] + ([] if quick else
                                                                     ["vgg11_bn", "convnext_tiny", "vit_b_16"])
    models = []
    for name in names:
        for s in range(2):
            torch.manual_seed(s)
            models.append(getattr(torchvision.models, name)())
    add(f"torchvision at init ({', '.join(names)}; 2 seeds)", models)
    torch.manual_seed(0)
    zero_res = torchvision.models.resnet18(zero_init_residual=True)
    add("torchvision resnet18 zero_init_residual", [zero_res])
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    decoders = []
    for s in range(2):
        torch.manual_seed(s)
        decoders.append(GPT2LMHeadModel(GPT2Config(n_layer=2 if quick else 12)))
        decoders.append(LlamaForCausalLM(LlamaConfig(vocab_size=8000, hidden_size=768, intermediate_size=2048,
                                                     num_hidden_layers=2, num_attention_heads=12)))
    add("Hugging Face decoders at init (GPT-2 small d = 768, LLaMA-style d = 768; 2 seeds)", decoders)
    return rows


def timing() -> list[dict[str, Any]]:
    import torchvision
    from transformers import GPT2Config, GPT2LMHeadModel

    rows = []
    for label, model in (("ResNet-18 (11.7 M)", torchvision.models.resnet18()),
                         ("GPT-2 small, d = 768 (124 M)", GPT2LMHeadModel(GPT2Config())),
                         ("VGG-11 BN (133 M)", torchvision.models.vgg11_bn())):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            check_views(list(layer_views(model)))
            times.append(time.perf_counter() - start)
        rows.append({"model": label, "min": min(times), "median": sorted(times)[1]})
        print(label, [round(t, 2) for t in times], flush=True)
    return rows


def recovered(batches: tuple[int, ...], bins: tuple[int, ...], seeds: int) -> list[dict[str, Any]]:
    """Exact copies (≥ 40 dB) from an imprinted LeNet's FedSGD gradient, against E = B(1 − 1/K)^(B−1)."""
    x, y = digits()
    span = float(x.max() - x.min())
    rows = []
    for k in bins:
        for b in batches:
            got = []
            for s in range(seeds):
                crafted = craft.imprint(inserted("lenet", s, k), bins=k, seed=s)
                pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(s))[:b]
                layer = dict(crafted.model.named_modules())[crafted.layer]
                assert isinstance(layer, nn.Linear)
                loss = nn.functional.cross_entropy(crafted.model(x[pick]), y[pick])
                gw, gb = torch.autograd.grad(loss, [layer.weight, layer.bias])
                out = inversion.invert(layer.weight, layer.bias, gw, gb, inversion.imprint_rows(layer.weight), b)
                flat = x[pick].flatten(1)
                mse = ((out.inputs.float()[:, None] - flat[None]) ** 2).mean(-1).min(1).values
                good = (10 * torch.log10(span ** 2 / mse.clamp_min(1e-20)) >= 40)
                got.append(int(good.sum()))
                if s == 0:
                    grid(out.inputs.float()[good], b, k)
            rows.append({"bins": k, "B": b, "exact": got, "expected": b * (1 - 1 / k) ** (b - 1)})
            print(f"K = {k} B = {b}: {got} (expected {rows[-1]['expected']:.1f})", flush=True)
    return rows


def data_shares(seeds: int) -> list[dict[str, Any]]:
    """check-model --data's leakable share (examples copied exactly from the first layer) on a 64-digit probe."""
    from gleak.tamper.probe import exact_leaks

    x, y = digits()
    cases: dict[str, Callable[[int], nn.Module]] = {
        "honest MLP at init": lambda s: base("mlp", s),
        "honest MLP after 300 SGD steps": lambda s: sgd(base("mlp", s), 300, s),
        "honest MLP after 1,000 SGD steps": lambda s: sgd(base("mlp", s), 1000, s),
        "imprint in the MLP, 64 bins": lambda s: craft.imprint(base("mlp", s), seed=s).model,
        "imprint in the MLP, 128 bins": lambda s: craft.imprint(base("mlp", s), bins=128, seed=s).model,
        "imprint block before LeNet-5, 256 bins": lambda s: craft.imprint(inserted("lenet", s, 256), bins=256,
                                                                          seed=s).model,
        "trap weights in the MLP": lambda s: craft.trap_weights(base("mlp", s), seed=s).model,
        "imprint in the MLP, noise 0.01": lambda s: craft.imprint(base("mlp", s), noise=0.01, seed=s).model,
    }
    rows = []
    for label, make in cases.items():
        shares = []
        for s in range(seeds):
            pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(100 + s))[:64]
            found = exact_leaks(make(s), x[pick], y[pick])
            shares.append(found.share if not isinstance(found, str) else float("nan"))
        rows.append({"model": label, "shares": shares})
        print(label, [round(v, 3) for v in shares], flush=True)
    return rows


def grid(images: torch.Tensor, batch: int, bins: int) -> None:
    """The exact copies of the first seed as a PNG grid (bench/results/server-imprint-K{bins}-B{batch}.png)."""
    from torchvision.utils import save_image

    if len(images) == 0:
        return
    ds = load_dataset(MNIST)
    pixels = ds.denormalize(images.view(-1, 1, 28, 28)).clamp(0, 1)
    save_image(pixels, OUT / f"server-imprint-K{bins}-B{batch}.png", nrow=16, padding=1)


def write(pos: list[dict[str, Any]], neg: list[dict[str, Any]], times: list[dict[str, Any]],
          rec: list[dict[str, Any]], shares: list[dict[str, Any]], args: argparse.Namespace) -> None:
    lines = ["# Malicious-server crafts and `gleak check-model` (issue 46)", "",
             f"`python bench/server.py --seeds {args.seeds}{' --quick' if args.quick else ''}`, "
             f"{torch.get_num_threads()} torch thread(s). Detection = a trap-tier finding (exit 1). "
             "Wilson 95 % intervals.", "", "## Detection", "",
             "Imprint and trap weights: in the MLP's first layer (the parameter form); in a block of 256 neurons "
             "inserted before LeNet-5 and the CIFAR ResNet, whose first layers are convolutions (the published "
             "form). Class fishing: each model's own last layer.", "",
             "| attack | host | flagged | 95 % interval |", "|---|---|---|---|"]
    for r in pos:
        lo, hi = wilson(r["flagged"], r["n"])
        lines.append(f"| {r['attack']} | {r['host']} | {r['flagged']}/{r['n']} | [{lo:.2f}, {hi:.2f}] |")
    lines += ["", "## False positives (honest models)", "", "| models | flagged | 95 % interval |", "|---|---|---|"]
    for r in neg:
        lo, hi = wilson(r["flagged"], r["n"])
        lines.append(f"| {r['family']} | {r['flagged']}/{r['n']} | [{lo:.2f}, {hi:.2f}] |")
    lines += ["", "## Seconds per model (weight tests; 3 runs)", "", "| model | min s | median s |", "|---|---|---|"]
    lines += [f"| {r['model']} | {r['min']:.2f} | {r['median']:.2f} |" for r in times]
    lines += ["", "## What a trapped update gives away (imprint block before LeNet-5, FedSGD, shipped digits)", "",
              "Exact copies (PSNR ≥ 40 dB) per batch over seeds, beside E = B(1 − 1/K)^(B−1) for K equal-mass bins "
              "and independent examples. Grids of the first seed's copies: `server-imprint-K{K}-B{B}.png`.", "",
              "| bins K | B | exact per seed | mean | expected |", "|---|---|---|---|---|"]
    for r in rec:
        lines.append(f"| {r['bins']} | {r['B']} | {', '.join(map(str, r['exact']))} | "
                     f"{sum(r['exact']) / len(r['exact']):.1f} | {r['expected']:.1f} |")
    lines += ["", "## The data test: share of a 64-digit probe a server copies exactly (`check-model --data`)", "",
              "Suspicious from 0.1, a trap from 0.5. Row ratios and imprint-row differences of the first layer's "
              "gradient, matched to the probe within a relative error of 1e-3.", "",
              "| model | share per seed | max |", "|---|---|---|"]
    for r in shares:
        lines.append(f"| {r['model']} | {', '.join(f'{v:.2f}' for v in r['shares'])} | {max(r['shares']):.2f} |")
    (OUT / "server.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT / 'server.md'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="fewer and smaller honest models")
    args = p.parse_args()
    torch.set_num_threads(2)
    pos = positives(args.seeds)
    neg = negatives(args.seeds, args.quick)
    times = timing()
    rec = recovered((16, 64, 256), (64, 256), args.seeds)
    shares = data_shares(args.seeds)
    write(pos, neg, times, rec, shares, args)


if __name__ == "__main__":
    main()
