"""`reconstruct --labels auto` for a batch: the candidate count vectors chosen by evidence vs the fixed order.

For each setting and trial, every applicable count attack runs; the evidence rule keeps the counts with the
best likelihood of the captured bias gradient (gleak.attacks.reconstruct.inputs.bias_gradient_misfit), the old
rule the first attack of COUNT_PREFERENCE that succeeds. Reports the iAcc of each rule's choice and of the
best candidate (an oracle).

    python bench/label_choice.py [--trials N]     # writes bench/results/label_choice.md
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
import torchvision

from gleak.attacks import build_context
from gleak.attacks.reconstruct.inputs import best_supported_counts
from gleak.data.images import load_dataset
from gleak.metrics.labels import label_scores, truth_counts
from gleak.models import LoadedModel, build_zoo_model, load_model
from gleak.simulate.images import ClientConfig, simulate_client

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "samples/data"


def settings() -> list[tuple[str, torch.nn.Module, tuple[int, ...], str, str, int]]:
    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(num_classes=10)
    torch.manual_seed(0)
    small = build_zoo_model("resnet-cifar", depth=8, in_channels=1)
    lenet80 = load_model(ROOT / "samples/models/lenet_mnist80.safetensors").module
    lenet = load_model(ROOT / "samples/models/lenet_untrained.safetensors").module
    return [("torchvision ResNet-18 (BN, train), CIFAR-10, B = 8", r18, (3, 32, 32), "cifar10", "cifar10", 8),
            ("BN ResNet-8 (train), MNIST, B = 32", small, (1, 28, 28), "mnist_client", "mnist_aux", 32),
            ("LeNet-5 untrained, MNIST, B = 32", lenet, (1, 28, 28), "mnist_client", "mnist_aux", 32),
            ("LeNet-5 82 % trained, MNIST, B = 32", lenet80, (1, 28, 28), "mnist_client", "mnist_aux", 32)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = ["# Label choice for `reconstruct --labels auto` (batches)", "",
             f"iAcc of the chosen counts, mean of {args.trials} batches, 1 thread.", "",
             "| setting | evidence rule | fixed order (rlu first) | best candidate | chosen by evidence |",
             "|---|---|---|---|---|"]
    for title, model, shape, client, aux, batch in settings():
        client_data, aux_data = load_dataset(DATA / f"{client}.safetensors"), load_dataset(DATA / f"{aux}.safetensors")
        ev, fixed, best, picks = [], [], [], []
        for seed in range(args.trials):
            cap, truth = simulate_client(model, client_data, ClientConfig(batch_size=batch, seed=seed))
            ctx = build_context(cap, LoadedModel(copy.deepcopy(model), "bench", None, {}, shape, "", {}), aux_data,
                                seed=seed)
            counts = truth_counts(truth.labels, ctx.num_classes)
            chosen, _, scores = best_supported_counts(ctx)
            candidates = {}
            from gleak.attacks import get_attack, run_attack
            for name in scores:
                candidates[name] = label_scores(run_attack(get_attack(name), ctx).output.counts, counts)["iacc"]
            ev.append(candidates[chosen.attack])
            fixed.append(next(iter(candidates.values())))
            best.append(max(candidates.values()))
            picks.append(chosen.attack)
        row = (f"| {title} | {sum(ev) / len(ev):.3f} | {sum(fixed) / len(fixed):.3f} | {sum(best) / len(best):.3f} "
               f"| {', '.join(sorted(set(picks)))} |")
        lines.append(row)
        print(row, flush=True)
    out = ROOT / "bench/results/label_choice.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
