"""Label attacks on BatchNorm models, client in train mode: statistics in the client's mode vs eval mode.

Measures iAcc of the forward-based label attacks on real MNIST (a small BN ResNet, B = 32) and CIFAR-10
(a torchvision ResNet-18, B = 8), once with gleak's handling (BatchNorm on batch statistics in batches of B,
as the capture records train mode) and once forcing eval-mode statistics, the way gleak ran before.

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
from gleak.data import load_dataset
from gleak.metrics.labels import label_scores, truth_counts
from gleak.models import LoadedModel, build_zoo_model
from gleak.simulate import ClientConfig, simulate_client

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = ("ilrg", "llg-plus", "zlg-plus", "posterior", "rlu")


def run(model: torch.nn.Module, shape: tuple[int, ...], client_path: Path, aux_path: Path, batch: int,
        trials: int, eval_stats: bool) -> dict[str, float]:
    client, aux = load_dataset(client_path), load_dataset(aux_path)
    original = context._client_mode
    if eval_stats:
        context._client_mode = lambda capture, module: (False, "forced eval-mode statistics")
    try:
        scores: dict[str, list[float]] = {a: [] for a in ATTACKS}
        for seed in range(trials):
            cap, truth = simulate_client(model, client, ClientConfig(batch_size=batch, seed=seed, train_mode=True))
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
    settings = [("BN ResNet-8, MNIST, B = 32", small, (1, 28, 28), "mnist_client", "mnist_aux", 32),
                ("torchvision ResNet-18, CIFAR-10, B = 8", r18, (3, 32, 32), "cifar10", "cifar10", 8)]
    lines = ["# Label attacks on BatchNorm models (client in train mode)", "",
             f"iAcc, mean of {args.trials} batches; 1 thread. 'batch stats' = gleak's handling (BatchNorm on batch "
             "statistics in batches of B), 'eval stats' = running averages (gleak before).", "",
             "| setting | statistics | " + " | ".join(ATTACKS) + " |", "|---|---|" + "---|" * len(ATTACKS)]
    for title, model, shape, client, aux, batch in settings:
        for eval_stats in (False, True):
            res = run(model, shape, ROOT / f"samples/data/{client}.safetensors",
                      ROOT / f"samples/data/{aux}.safetensors", batch, args.trials, eval_stats)
            label = "eval stats" if eval_stats else "batch stats"
            lines.append(f"| {title} | {label} | " + " | ".join(f"{res[a]:.3f}" for a in ATTACKS) + " |")
            print(lines[-1], flush=True)
    out = ROOT / "bench/results/batchnorm.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
