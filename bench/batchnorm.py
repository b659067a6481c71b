"""Label attacks on BatchNorm models, client in train or eval mode: statistics in the client's mode vs eval mode.

Measures iAcc of the forward-based label attacks on real data with ResNet-style BatchNorm models (a small BN
ResNet-8 and torchvision's ResNet-18 on MNIST, B = 8 and 32; ResNet-18 on CIFAR-10, B = 8: the shipped CIFAR
sample has 20 images). For train-mode clients, once with gleak's handling (BatchNorm on batch statistics in
batches of B, as the capture records train mode) and once forcing eval-mode statistics, the way gleak ran
before; eval-mode clients use the running averages either way. The quality bar: the best attack ≥ 0.95.

    python bench/batchnorm.py [--trials N]      # writes bench/results/batchnorm.md
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
import torchvision

import gleak.attacks.context as context
from gleak.attacks import build_context, get_attack, run_attack
from gleak.data.images import load_dataset
from gleak.metrics.labels import label_scores, truth_counts
from gleak.models import LoadedModel, build_zoo_model
from gleak.simulate.images import ClientConfig, simulate_client

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = ("ilrg", "llg-plus", "zlg-plus", "posterior", "rlu")


def run(model: torch.nn.Module, shape: tuple[int, ...], client_path: Path, aux_path: Path, batch: int,
        trials: int, eval_stats: bool, train_mode: bool = True) -> dict[str, float]:
    client, aux = load_dataset(client_path), load_dataset(aux_path)
    original = context._client_mode
    if eval_stats:
        context._client_mode = lambda capture, module: (False, "forced eval-mode statistics")
    try:
        scores: dict[str, list[float]] = {a: [] for a in ATTACKS}
        for seed in range(trials):
            cap, truth = simulate_client(model, client, ClientConfig(batch_size=batch, seed=seed,
                                                                             train_mode=train_mode))
            ctx = build_context(cap, LoadedModel(copy.deepcopy(model), "bench", None, {}, shape, "", {}), aux,
                                seed=seed)
            counts = truth_counts(truth.labels, ctx.num_classes)
            for name in ATTACKS:
                result = run_attack(get_attack(name), ctx)
                iacc = label_scores(result.labels.counts, counts)["iacc"] if result.output else float("nan")
                scores[name].append(iacc)
    finally:
        context._client_mode = original
    return {k: sum(v) / len(v) for k, v in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    small = build_zoo_model("resnet-cifar", depth=8, in_channels=1)
    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(num_classes=10)
    torch.manual_seed(0)
    r18_gray = torchvision.models.resnet18(num_classes=10)
    r18_gray.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)  # one input channel for MNIST
    settings = [("BN ResNet-8, MNIST, B = 8", small, (1, 28, 28), "mnist_client", "mnist_aux", 8),
                ("BN ResNet-8, MNIST, B = 32", small, (1, 28, 28), "mnist_client", "mnist_aux", 32),
                ("torchvision ResNet-18, MNIST, B = 8", r18_gray, (1, 28, 28), "mnist_client", "mnist_aux", 8),
                ("torchvision ResNet-18, MNIST, B = 32", r18_gray, (1, 28, 28), "mnist_client", "mnist_aux", 32),
                ("torchvision ResNet-18, CIFAR-10, B = 8", r18, (3, 32, 32), "cifar10", "cifar10", 8)]
    lines = ["# Label attacks on BatchNorm models (client in train or eval mode)", "",
             f"iAcc, mean of {args.trials} batches; 1 thread. 'batch stats' = gleak's handling of a train-mode "
             "client (BatchNorm on batch statistics in batches of B), 'eval stats (before)' = running averages "
             "for a train-mode client (gleak before), 'eval mode' = an eval-mode client (running averages, "
             "correctly). CIFAR-10: the 20 shipped images serve as client and auxiliary data.", "",
             "| setting | client mode / statistics | " + " | ".join(ATTACKS) + " | best |",
             "|---|---|" + "---|" * (len(ATTACKS) + 1)]
    for title, model, shape, client, aux, batch in settings:
        for label, train_mode, eval_stats in (("train / batch stats", True, False),
                                              ("train / eval stats (before)", True, True),
                                              ("eval mode", False, False)):
            res = run(model, shape, ROOT / f"samples/data/{client}.safetensors",
                      ROOT / f"samples/data/{aux}.safetensors", batch, args.trials, eval_stats, train_mode)
            best = max(res.values())
            lines.append(f"| {title} | {label} | " + " | ".join(f"{res[a]:.3f}" for a in ATTACKS)
                         + f" | {best:.3f} |")
            print(lines[-1], flush=True)
    out = ROOT / "bench/results/batchnorm.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
