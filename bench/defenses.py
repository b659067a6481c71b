"""Defense benchmark (issue 29, item 6): the source papers' defense experiments in small, on the shipped real data,
with each paper's number beside ours.

    python bench/defenses.py                          # every part (about 10 min on 2 shared cores, 1 thread)
    python bench/defenses.py --part softlabel         # one part: softlabel | llg | rlu | grid | rgla (repeatable)
    python bench/defenses.py --trials 3               # seeds per cell (default: 5 for softlabel and rgla, 10 else)
    nice -n 10 python bench/defenses.py               # how the stored results were made

One torch thread (``--threads``). Every defense is gleak's own (:mod:`gleak.defenses`: ``parse_defense`` +
``apply_defenses`` on the capture; DP-SGD through ``simulate_client(..., ClientConfig(defenses=...))``). A part
that runs replaces its entry in bench/results/defenses.json; bench/results/defenses.md and the
bench/results/defenses-*.png plots are then redrawn from every part stored there. Each cell is mean ± std over
the trials (seeds); where a trial holds several samples (softlabel) the rate is taken per trial first.

Parts (the papers' settings and our deviations are also written into the results file):

* ``softlabel`` — Wang, Liang & He (ICLR 2024), Table 5: `softlabel` on single CIFAR-10 images with label
  smoothing ε ~ U(0, 0.5) (the paper's setting) and mixup (ours, extra), untrained torchvision ResNet-18 with a
  bias-free last layer (the paper's model: it runs on CPU in ~0.1 s per sample), noise on the last-layer weight
  gradient only (the paper's "last-layer gradients": ``tensors=fc.weight``). The paper states noise *variance*
  v ∈ {1e-4 … 1e-1}; gleak's ``gaussian`` takes σ = √v and ``laplace`` takes b = √(v/2) (variance 2b²). The
  reference code's argument is a standard deviation (bench/softlabel.py), so both readings are shown: σ runs
  over {1e-3, 1e-2, 10^-1.5, 1e-1, 10^-0.5}, which covers variance 1e-4 … 1e-1 and std 1e-3 … 1e-1. Success is the
  paper's oracle |λ − λ*| < 1 with λ* = nanmean(h / ∇W_clean[r]) (bench/softlabel.py); ‖ŷ − y‖₁ ≤ 0.1 beside it.
  The augmentation is given (the paper's Table 5); gleak's default search (not the paper's PSO-only) runs.
* ``llg`` — Wainakh et al. (LLG, Fig. 5): `llg-plus` (aux 100 per class of mnist_aux) on unbalanced MNIST batches
  (50 % one class, 25 % a second, 25 % uniform), B = 1, 4, 8, 16, FedSGD gradients, under top-k compression
  (per tensor) 0 … 99 %, Gaussian noise σ² ∈ {0.01, 0.1, 1} and DP clipping β ∈ {1, 5, 10} + noise σ² = 0.1
  (Fig. 5 a-c); on the shipped untrained LeNet-5 (ReLU) and on the paper's sigmoid CNN (zoo ``idlg-cnn``,
  U(±0.5), a fresh one per trial). Chance = the exact expected iAcc of B uniform guesses for the same batch.
* ``rlu`` — Chen & Vikalo (ICML 2024), Table 6: `rlu` on FedAvg updates (SGD, η = 0.01, Dirichlet(0.5) labels,
  m = 1 and 10) with zero-mean Gaussian noise σ ∈ {0.05, 0.1, 0.2, 0.5} on the *gradient* the paper perturbs
  (on the update: η·σ for m = 1; η·σ·√m for m = 10, i.e. independent noise on each step's gradient, the
  trajectory left clean), the same σ taken literally on the update, σ on a sum-reduced gradient (σ/B on the
  mean: our hypothesis for the paper's flat curve), DP-SGD (Opacus, C = 1) and top-k compression. Untrained
  LeNet-5 (ReLU) on MNIST, B = 32, aux 100 per class (SVHN stand-in: the paper's SVHN model is LeNet-5 at B = 32),
  and on the 20 shipped CIFAR-10 images, B = 16 (the most a 20-image pool allows; the paper: VGG-16, B = 64),
  aux = the same 20 images (no other CIFAR-10 data ships; classes 2 and 4 have none). Both gleak's default
  `rlu` and `rlu` with ``gls_max_classes=0`` (the paper's m = 1 algorithm: least squares on Δb only) are run.
* ``grid`` — the GGL / iLRG-style grid: every default label attack on FedSGD gradients of uniform MNIST batches
  (B = 8 and 32, aux 100 per class) under Gaussian noise σ ∈ {1e-4, 1e-3, 1e-2}, clipping C = 4 (and a binding
  clip to 10 % of the gradient's norm), top-k 10 … 90 % (per tensor), on the untrained LeNet-5
  (samples/models/lenet_untrained) and the trained one (samples/models/lenet_mnist98, 98.7 %). "best" is the
  highest iAcc over the attacks per trial (an oracle pick: the attacker does not know which is right).
* ``rgla`` — the RGLA paper, Tables 2 and 12: `rgla` and `fgla` with the shipped feature-to-image generator
  (samples/generators/lenet_untrained_mnist, made for samples/models/lenet_untrained) and `ig` (bounded: 500
  Adam steps) on B = 8 MNIST FedSGD gradients (uniform labels, ground-truth labels as targets) under noise
  σ = 0.01, clipping C = 4 and 99.9 % compression, and the Table 12 ratios (80 … 99.9 %) for rgla / fgla; top-k
  both per tensor and over the whole model. Scored by identification κ (a 10-image lineup per true image, 9
  same-class distractors from mnist_aux; 0 = chance, 1 = every image picked out) with PSNR (data range 1, after
  Hungarian matching) beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.softlabel import model_for, sample  # noqa: E402
from gleak.attacks import AttackResult, Context, build_context, get_attack, run_attack  # noqa: E402
from gleak.attacks.labels.softlabel import COEFFICIENT  # noqa: E402
from gleak.attacks.plan import run_label_attacks, select_attacks  # noqa: E402
from gleak.capture import Capture, capture_gradients  # noqa: E402
from gleak.data.images import Dataset, load_dataset  # noqa: E402
from gleak.defenses import Defense, apply_defenses, contribution_distortion, parse_defense  # noqa: E402
from gleak.defenses.apply import contribution_norm  # noqa: E402
from gleak.defenses.transforms import Clip  # noqa: E402
from gleak.io import tensors_sha256  # noqa: E402
from gleak.losses import LossSpec  # noqa: E402
from gleak.metrics.labels import chance_scores, truth_counts  # noqa: E402
from gleak.models import LoadedModel, build_zoo_model, load_model  # noqa: E402
from gleak.simulate.images import ClientConfig, simulate_client  # noqa: E402

PARTS = ("softlabel", "llg", "rlu", "grid", "rgla")
DEFAULT_TRIALS = {"softlabel": 5, "llg": 10, "rlu": 10, "grid": 10, "rgla": 5}
RESULTS = ROOT / "bench/results"


# ------------------------------------------------------------------------------------------------ helpers

def mean_std(values: Sequence[float]) -> tuple[float, float]:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return float("nan"), float("nan")
    return statistics.mean(vals), statistics.pstdev(vals) if len(vals) > 1 else 0.0


def pm(values: Sequence[float], digits: int = 3, scale: float = 1.0) -> str:
    m, s = mean_std(values)
    if math.isnan(m):
        return "—"
    return f"{scale * m:.{digits}f} ± {scale * s:.{digits}f}"


def parse_chain(spec: str | None) -> list[Defense] | None:
    """The defenses of ``"SPEC then SPEC …"`` (None: no defense), parsed once and applied to every trial."""
    return [parse_defense(s) for s in spec.split(" then ")] if spec else None


def defended(cap: Capture, chain: Sequence[Defense] | None, seed: int) -> Capture:
    return apply_defenses(cap, chain, seed) if chain else cap


def truth_and_chance(labels: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The batch's per-class counts (10 classes) and the chance iAcc of uniform guessing for it."""
    counts = truth_counts(labels, 10)
    return counts, chance_scores(counts)["iacc"]


def chance_mark(values: Sequence[float], chance: Sequence[float], below: str = " **≤ chance**",
                above: str = "") -> str:
    """``below`` when the mean of ``values`` is at or below the mean chance (up to rounding), else ``above``."""
    return below if mean_std(values)[0] <= statistics.mean(chance) + 1e-9 else above


def mnist_data() -> tuple[Dataset, Dataset]:
    client = load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    aux = load_dataset(ROOT / "samples/data/mnist_aux.safetensors")
    aux100 = aux.subset(torch.cat([torch.nonzero(aux.labels == c).flatten()[:100] for c in range(10)]))
    return client, aux100


def zoo(arch: str, seed: int, shape: tuple[int, int, int], **kwargs: Any) -> LoadedModel:
    torch.manual_seed(seed)
    module = build_zoo_model(arch, in_channels=shape[0], image_size=shape[1], **kwargs).eval()
    return LoadedModel(module, "bench", arch, kwargs, shape, tensors_sha256(module.state_dict()), {})


class Forwards:
    """The models' forwards of the aux data, made once per model weights and aux set and shared by every context
    of that model (as gleak sweep shares them; these models have no BatchNorm, so the forwards do not depend on
    the capture)."""

    def __init__(self) -> None:
        self.caches: dict[tuple[str, int], dict[str, Any]] = {}

    def context(self, cap: Capture, model: LoadedModel, aux: Dataset, seed: int) -> Context:
        key = (model.weights_sha256 or tensors_sha256(model.module.state_dict()), id(aux))
        return build_context(cap, model, seed=seed).with_aux(aux, self.caches.setdefault(key, {}))


def best_iacc(results: Sequence[AttackResult]) -> tuple[float, str]:
    """The highest iAcc against the truth among label attack results (scored by ``run_label_attacks``) and the
    attack that reached it (the first on a tie); (0.0, "") when none was scored: a failed attack recovers nothing."""
    scored = [r for r in results if r.scores]
    best = max(scored, key=lambda r: r.scores["iacc"], default=None)  # type: ignore[index]
    return (best.scores["iacc"], best.attack) if best is not None and best.scores else (0.0, "")


def progress(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------ 1. softlabel

SOFT_SIGMAS = (1e-3, 1e-2, 10 ** -1.5, 1e-1, 10 ** -0.5)
PAPER_T5 = {  # Wang, Liang & He, ICLR 2024, Table 5: accuracy (%) and L_s by noise variance (ResNet-18, CIFAR-10)
    ("gaussian", 1e-4): (100, 1.02e-4), ("gaussian", 1e-3): (100, 1.13e-3), ("gaussian", 1e-2): (100, 1.14e-2),
    ("gaussian", 1e-1): (45, 5.82e-1), ("laplace", 1e-4): (100, 1.61e-4), ("laplace", 1e-3): (100, 8.07e-4),
    ("laplace", 1e-2): (100, 7.95e-3), ("laplace", 1e-1): (36, 7.95e-1)}


def soft_spec(dist: str, sigma: float) -> str:
    """A defense of standard deviation ``sigma`` on the last-layer weight gradient (Laplace: b = σ/√2)."""
    if dist == "gaussian":
        return f"gaussian:sigma={sigma!r},tensors=fc.weight"
    return f"laplace:scale={sigma / math.sqrt(2)!r},tensors=fc.weight"


def part_softlabel(trials: int, samples: dict[str, int]) -> dict[str, Any]:
    cifar = load_dataset(ROOT / "samples/data/cifar10.safetensors")
    model = model_for("resnet18", (3, 32, 32))
    chains = {(dist, sigma): parse_chain(soft_spec(dist, sigma)) for dist in ("gaussian", "laplace")
              for sigma in SOFT_SIGMAS}
    rows: dict[str, dict[str, list]] = {}
    for kind in ("smoothing", "mixup"):
        attack = get_attack("softlabel")
        attack.configure({"augmentation": kind})
        for t in range(trials):
            rng = np.random.default_rng([29, t, kind == "mixup"])
            per: dict[str, dict[str, list]] = {}
            for k in range(samples[kind]):
                x, y = sample(cifar, kind, rng)
                cap = capture_gradients(model.module, x, y.float(), LossSpec())
                clean = cap.tensors["fc.weight"].double()
                h, _ = build_context(cap, model, seed=k).features_and_logits(x)
                for dist in ("gaussian", "laplace"):
                    for sigma in SOFT_SIGMAS:
                        seed = int(np.random.SeedSequence([t, k, kind == "mixup", dist == "laplace",
                                                           SOFT_SIGMAS.index(sigma)]).generate_state(1)[0] % 2**31)
                        ctx = build_context(defended(cap, chains[dist, sigma], seed), model, seed=k)
                        result = run_attack(attack, ctx)
                        cell = per.setdefault(f"{kind}|{dist}|{sigma!r}", {"oracle": [], "strict": [], "l_s": [],
                                                                              "l1": [], "l1_ok": [], "sec": []})
                        if result.status != "ok":
                            for key, v in (("oracle", 0.0), ("strict", 0.0), ("l1_ok", 0.0), ("l1", 2.0)):
                                cell[key].append(v)
                            continue
                        d = result.output.diagnostics
                        g = clean[d["row"]]
                        ratio = torch.where(g != 0, h[0].double() / g, torch.tensor(float("nan"), dtype=torch.float64))
                        err = abs(d["lambda"] - float(np.nanmean(ratio.numpy())))
                        l1 = float((result.output.soft_label.double() - y[0]).abs().sum())
                        cell["oracle"].append(float(err < 1))
                        cell["strict"].append(float(err * COEFFICIENT[d["augmentation"]] < 1))
                        cell["l_s"].append(err)
                        cell["l1"].append(l1)
                        cell["l1_ok"].append(float(l1 <= 0.1))
                        cell["sec"].append(result.seconds)
            for key, cell in per.items():  # one rate per trial (seed), then mean ± std over trials
                row = rows.setdefault(key, {"oracle": [], "strict": [], "l1_ok": [], "l_s": [], "l_s_median": [],
                                            "l1_median": [], "sec": [], "n": []})
                for m in ("oracle", "strict", "l1_ok"):
                    row[m].append(statistics.mean(cell[m]))
                row["l_s"].append(statistics.mean(cell["l_s"]) if cell["l_s"] else float("nan"))
                row["l_s_median"].append(statistics.median(cell["l_s"]) if cell["l_s"] else float("nan"))
                row["l1_median"].append(statistics.median(cell["l1"]))
                row["sec"].append(statistics.median(cell["sec"]) if cell["sec"] else float("nan"))
                row["n"].append(len(cell["oracle"]))
            progress(f"softlabel {kind} trial {t}: " + ", ".join(
                f"{k.split('|')[1][0]}{float(k.split('|')[2]):.3g} {statistics.mean(c['oracle']):.2f}"
                for k, c in per.items()))
    return {"rows": rows, "samples": samples, "trials": trials,
            "model": "untrained torchvision ResNet-18 (seed 0, kaiming init), bias-free 512→10 last layer",
            "data": "samples/data/cifar10 (20 CIFAR-10 test images, 8 classes)"}


# ------------------------------------------------------------------------------------------------ 2. llg

LLG_BATCHES = (1, 4, 8, 16)
LLG_RATIOS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99)
LLG_NOISE = (0.01, 0.1, 1.0)  # σ² (Fig. 5a)
LLG_CLIP = (1.0, 5.0, 10.0)  # β with σ² = 0.1 (Fig. 5b)


LLG_REFCODE = (0.2, 0.4, 0.8)  # Fig. 5c's ratios, with the compression of the paper's public code (emulated)


def llg_refcode_compression(cap: Capture, model: LoadedModel, ratio: float) -> Capture:
    """The compression of the LLG authors' public code (github.com/tklab-tud/LLG, Code/Dlg.py as of commit 716e8dd,
    "add gradient compression"; later Code/defenses.py), emulated here because gleak's ``topk`` is the entry-wise
    definition: rank the C class row sums |Σ_k ∇W[i, k]| of the last layer, take the int(C·ratio) smallest, and
    zero — by *position*, ``zip(magnitudes, grad)`` — the whole parameter tensor i of the model for each such
    class i (the first C tensors only). Not a gleak defense: a reproduction of what the paper's figure may show."""
    names = [n for n, _ in model.module.named_parameters()]
    weight = next(n for n in reversed(names) if n.endswith("weight"))
    magnitudes = cap.tensors[weight].double().sum(1).abs()
    zeroed = torch.argsort(magnitudes, stable=True)[: int(len(magnitudes) * ratio)].tolist()
    tensors = dict(cap.tensors)
    for i in zeroed:
        if i < len(names):
            tensors[names[i]] = torch.zeros_like(tensors[names[i]])
    return Capture(tensors=tensors, meta=dict(cap.meta), extra=dict(cap.extra))


def llg_specs() -> list[tuple[str, str, str | None]]:
    """(group, label, spec) of the LLG+ part."""
    out: list[tuple[str, str, str | None]] = [("topk", "0", None)]
    out += [("topk", f"{r:g}", f"topk:ratio={r}") for r in LLG_RATIOS if r]
    out += [("refcode", f"{r:g}", f"refcode:{r}") for r in LLG_REFCODE]
    out += [("noise", f"{v:g}", f"gaussian:sigma={math.sqrt(v)!r}") for v in LLG_NOISE]
    out += [("dp", f"{b:g}", f"clip:norm={b} then gaussian:sigma={math.sqrt(0.1)!r}") for b in LLG_CLIP]
    return out


def part_llg(trials: int) -> dict[str, Any]:
    client, aux = mnist_data()
    attack = get_attack("llg-plus")
    forwards = Forwards()
    lenet = load_model(ROOT / "samples/models/lenet_untrained.safetensors")
    models: dict[str, Callable[[int], LoadedModel]] = {
        "LeNet-5 ReLU (lenet_untrained)": lambda t: lenet,
        "LLG CNN sigmoid (idlg-cnn, U(±0.5))": lambda t: zoo("idlg-cnn", 1000 + t, (1, 28, 28)),
    }
    specs = [(group, label, spec, None if spec is not None and spec.startswith("refcode:") else parse_chain(spec))
             for group, label, spec in llg_specs()]
    rows: dict[str, dict[str, list]] = {}
    for title, make in models.items():
        trial_models = [make(t) for t in range(trials)]  # simulate_client seeds torch itself: the order is free
        for B in LLG_BATCHES:
            for t, model in enumerate(trial_models):
                cap, truth = simulate_client(model.module, client, ClientConfig(batch_size=B, composition="unbalanced",
                                                                                seed=5000 + 31 * B + t))
                counts, chance = truth_and_chance(truth.labels)
                norm = contribution_norm(cap)
                for group, label, spec, chain in specs:
                    if spec is not None and spec.startswith("refcode:"):
                        d = llg_refcode_compression(cap, model, float(spec.split(":")[1]))
                    else:
                        d = defended(cap, chain, seed=7 * t + 1)
                    iacc, _ = best_iacc(run_label_attacks(forwards.context(d, model, aux, t), [attack], counts))
                    row = rows.setdefault(f"{title}|{B}|{group}|{label}", {"iacc": [], "chance": [], "norm": []})
                    row["iacc"].append(iacc)
                    row["chance"].append(chance)
                    row["norm"].append(norm)
            progress(f"llg {title} B={B}: " + ", ".join(
                f"{k.split('|')[2]}:{k.split('|')[3]} {statistics.mean(r['iacc']):.2f}" for k, r in rows.items()
                if k.startswith(f"{title}|{B}|")))
    return {"rows": rows, "trials": trials}


# ------------------------------------------------------------------------------------------------ 3. rlu

RLU_SIGMAS = (0.05, 0.1, 0.2, 0.5)
PAPER_T6 = {  # Chen & Vikalo, ICML 2024, Table 6: RLU iAcc under DP noise of standard deviation σ (untrained)
    ("SVHN", 1): (0.968, 0.942, 0.905, 0.812), ("SVHN", 10): (0.844, 0.727, 0.606, 0.484),
    ("CIFAR10", 1): (0.909, 0.908, 0.902, 0.830), ("CIFAR10", 10): (0.906, 0.877, 0.792, 0.622)}
LR = 0.01


def rlu_conditions(B: int, m: int) -> list[tuple[str, str, str | None, str | None]]:
    """(group, label, contribution spec, training-time spec) for updates of m steps at batch size B."""
    out: list[tuple[str, str, str | None, str | None]] = [("none", "clean", None, None)]
    for s in RLU_SIGMAS:
        out.append(("grad", f"{s:g}", f"gaussian:sigma={LR * s * math.sqrt(m)!r}", None))
    if m == 1:
        out.append(("update", "0.05", "gaussian:sigma=0.05", None))
        for s in RLU_SIGMAS:
            out.append(("sum", f"{s:g}", f"gaussian:sigma={LR * s / B!r}", None))
        for z in (0.5, 1.0):
            out.append(("dpsgd", f"{z:g}", None, f"dpsgd:noise_multiplier={z},max_grad_norm=1"))
        for r in (0.5, 0.9, 0.99):
            out.append(("topk", f"{r:g}", f"topk:ratio={r}", None))
        for r in (0.9, 0.99, 0.999):
            out.append(("topk-global", f"{r:g}", f"topk:ratio={r},scope=global", None))
    return out


def part_rlu(trials: int) -> dict[str, Any]:
    client, aux = mnist_data()
    cifar = load_dataset(ROOT / "samples/data/cifar10.safetensors")
    default = get_attack("rlu")
    ls_only = get_attack("rlu")
    ls_only.configure({"gls_max_classes": 0})
    forwards = Forwards()
    settings = [("MNIST", client, aux, (1, 28, 28), 32), ("CIFAR-10", cifar, cifar, (3, 32, 32), 16)]
    rows: dict[str, dict[str, list]] = {}
    for title, data, aux_data, shape, B in settings:
        for m in (1, 10):
            conditions = [(group, label, parse_chain(spec), parse_chain(training))
                          for group, label, spec, training in rlu_conditions(B, m)]
            for t in range(trials):
                model = zoo("lenet", 2000 + t, shape, activation="relu")
                base = ClientConfig(batch_size=B, scheme="fedavg", local_steps=m, learning_rate=LR,
                                    composition="dirichlet", seed=6000 + 37 * m + t)
                clean, truth = simulate_client(model.module, data, base)
                counts, chance = truth_and_chance(truth.labels)
                for group, label, chain, training in conditions:
                    cap = clean
                    eps = None
                    if training:
                        cfg = dataclasses.replace(base, defenses=tuple(training))
                        cap, dp_truth = simulate_client(model.module, data, cfg)
                        assert torch.equal(dp_truth.labels, truth.labels)
                        eps = cap.meta.get("gleak.dp.epsilon")
                    cap = defended(cap, chain, seed=11 * t + 3)
                    ctx = forwards.context(cap, model, aux_data, t)
                    row = rows.setdefault(f"{title}|{m}|{group}|{label}",
                                          {"rlu": [], "rlu_ls": [], "chance": [], "epsilon": [], "cosine": []})
                    for key, attack in (("rlu", default), ("rlu_ls", ls_only)):
                        if key == "rlu_ls" and m > 1:
                            continue  # the GLS refinement is m = 1 only: both are the same attack
                        row[key].append(best_iacc(run_label_attacks(ctx, [attack], counts))[0])
                    row["chance"].append(chance)
                    row["cosine"].append(contribution_distortion(clean, cap)["cosine"])
                    if eps is not None:
                        row["epsilon"].append(eps)
            progress(f"rlu {title} m={m}: " + ", ".join(
                f"{k.split('|')[2]}:{k.split('|')[3]} {statistics.mean(r['rlu']):.2f}"
                + (f"/{statistics.mean(r['rlu_ls']):.2f}" if r["rlu_ls"] else "")
                for k, r in rows.items() if k.startswith(f"{title}|{m}|")))
    return {"rows": rows, "trials": trials, "batch": {s[0]: s[4] for s in settings}}


# ------------------------------------------------------------------------------------------------ 4. grid

GRID_MODELS = {"untrained LeNet-5 (lenet_untrained)": "samples/models/lenet_untrained.safetensors",
               "trained LeNet-5, 98.7 % (lenet_mnist98)": "samples/models/lenet_mnist98.safetensors"}
GRID_SHOWN = ("ilrg", "rlu", "posterior", "llg-plus", "zlg-plus")


def grid_specs() -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [("none", None)]
    out += [(f"gaussian σ={s:g}", f"gaussian:sigma={s}") for s in (1e-4, 1e-3, 1e-2)]
    out += [("clip C=4", "clip:norm=4"), ("clip C=0.1·‖g‖", "clip-relative")]
    out += [(f"topk {int(100 * r)} %", f"topk:ratio={r}") for r in (0.1, 0.3, 0.5, 0.7, 0.9)]
    return out


def part_grid(trials: int) -> dict[str, Any]:
    client, aux = mnist_data()
    attacks = select_attacks("labels", None)
    forwards = Forwards()
    specs = [(label, spec, None if spec == "clip-relative" else parse_chain(spec)) for label, spec in grid_specs()]
    rows: dict[str, dict[str, Any]] = {}
    for title, path in GRID_MODELS.items():
        model = load_model(ROOT / path)
        for B in (8, 32):
            for t in range(trials):
                cap, truth = simulate_client(model.module, client, ClientConfig(batch_size=B, seed=7000 + 13 * B + t))
                counts, chance = truth_and_chance(truth.labels)
                norm = contribution_norm(cap)
                for label, spec, chain in specs:
                    if spec == "clip-relative":  # 10 % of this gradient's norm
                        chain = parse_chain(f"clip:norm={0.1 * norm!r}")
                    d = defended(cap, chain, seed=13 * t + 5)
                    ctx = forwards.context(d, model, aux, t)
                    row = rows.setdefault(f"{title}|{B}|{label}", {"best": [], "best_attack": [], "chance": [],
                                                                   "cosine": [], "norm": [], "clipped": []})
                    results = run_label_attacks(ctx, attacks, counts)
                    for result in results:
                        if result.scores:
                            row.setdefault(result.attack, []).append(result.scores["iacc"])
                    best, winner = best_iacc(results)
                    row["best"].append(best)
                    row["best_attack"].append(winner)
                    row["chance"].append(chance)
                    row["cosine"].append(contribution_distortion(cap, d)["cosine"])
                    row["norm"].append(norm)
                    clip = chain[0] if chain else None
                    row["clipped"].append(float(isinstance(clip, Clip) and norm > clip.options.norm))
            progress(f"grid {title} B={B}: " + ", ".join(
                f"{k.split('|')[2]} {statistics.mean(r['best']):.2f}" for k, r in rows.items()
                if k.startswith(f"{title}|{B}|")))
    return {"rows": rows, "trials": trials, "attacks": [a.name for a in attacks]}


# ------------------------------------------------------------------------------------------------ 5. rgla

PAPER_T2 = {  # the RGLA paper, Table 2: PSNR (ImageNet 224², pretrained ResNet-50, B = 8)
    "noise σ=0.01": {"rgla": 18.9056, "fgla": 18.84118, "ig": 14.2599},
    "clip C=4": {"rgla": 16.13298, "fgla": 17.43373, "ig": 12.55480},
    "topk 99.9 %": {"rgla": 16.28875, "fgla": 10.45432, "ig": 12.45969}}
PAPER_T12 = {"rgla": {0.0: 18.79353, 0.8: 18.79237, 0.9: 18.79329, 0.99: 18.79325, 0.999: 17.00678},
             "fgla": {0.0: 18.77932, 0.8: 18.77535, 0.9: 18.77598, 0.99: 18.77587, 0.999: 10.43223}}
T12_RATIOS = (0.8, 0.9, 0.99, 0.999)
IG_STEPS = 500


def rgla_conditions() -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(label, spec, attacks)."""
    out: list[tuple[str, str | None, tuple[str, ...]]] = [
        ("none", None, ("rgla", "fgla", "ig")), ("noise σ=0.01", "gaussian:sigma=0.01", ("rgla", "fgla", "ig")),
        ("clip C=4", "clip:norm=4", ("rgla", "fgla", "ig")),
        ("topk 99.9 %", "topk:ratio=0.999,scope=global", ("rgla", "fgla", "ig"))]
    for r in T12_RATIOS:
        out.append((f"topk-global {r:g}", f"topk:ratio={r},scope=global", ("rgla", "fgla")))
        out.append((f"topk-tensor {r:g}", f"topk:ratio={r}", ("rgla", "fgla")))
    return out


def part_rgla(trials: int) -> dict[str, Any]:
    from gleak.generator.file import load_generator
    from gleak.runs.reconstruct import reconstruct
    from gleak.runs.scoring import identification_of

    client = load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    aux = load_dataset(ROOT / "samples/data/mnist_aux.safetensors")
    model = load_model(ROOT / "samples/models/lenet_untrained.safetensors")
    generator = load_generator(ROOT / "samples/generators/lenet_untrained_mnist.safetensors")
    forwards = Forwards()
    conditions = [(label, parse_chain(spec), names) for label, spec, names in rgla_conditions()]
    rows: dict[str, dict[str, list]] = {}
    for t in range(trials):
        cap, truth = simulate_client(model.module, client, ClientConfig(batch_size=8, seed=8000 + t))
        fc_rms = float(cap.tensors["fc3.weight"].double().pow(2).mean().sqrt())
        for label, chain, names in conditions:
            d = defended(cap, chain, seed=17 * t + 7)
            ctx = forwards.context(d, model, aux, t)
            for name in names:
                attack = get_attack(name)
                if name == "ig":
                    attack.configure({"iterations": IG_STEPS})
                out = reconstruct(ctx, attack, "truth", truth, generator=None if name == "ig" else generator,
                                  lpips="off")
                row = rows.setdefault(f"{label}|{name}", {"psnr": [], "kappa": [], "rate": [], "baseline": [],
                                                          "sec": [], "fc_rms": [], "failed": []})
                row["fc_rms"].append(fc_rms)
                row["sec"].append(out.result.seconds)
                if out.scored is None or out.images is None:
                    row["failed"].append(1.0)
                    continue
                row["failed"].append(0.0)
                found = identification_of(ctx, out.images, out.truth_pixels, truth, 9, seed=t)
                row["psnr"].append(min(float(out.scored.metrics["mean"]["psnr"]), 150.0))
                row["baseline"].append(out.scored.baseline_psnr)
                if found is not None:
                    row["kappa"].append(found[0].kappa)
                    row["rate"].append(found[0].rate)
        progress(f"rgla trial {t}: " + ", ".join(f"{k} {r['kappa'][-1]:.2f}/{r['psnr'][-1]:.1f}dB"
                                                 for k, r in rows.items() if len(r["kappa"]) == t + 1))
    return {"rows": rows, "trials": trials, "ig_steps": IG_STEPS,
            "generator": generator.describe()}


# ------------------------------------------------------------------------------------------------ report

def header(meta: dict[str, Any]) -> list[str]:
    return ["# Defense benchmark: the papers' defense experiments in small (issue 29, item 6)", "",
            f"{meta['threads']} torch thread(s) on {meta['cpus']} shared CPU cores (other jobs running), under "
            f"`nice -n 10`; torch {meta['torch']}. Parts stored (command, trials, time):", "",
            *[f"- {p}: `{meta['parts'][p]['command']}`, {meta['parts'][p]['trials']} trials, "
              f"{meta['parts'][p]['seconds']:.0f} s ({meta['parts'][p]['date']})" for p in PARTS if p in meta["parts"]],
            "", f"Total: {sum(meta['parts'][p]['seconds'] for p in meta['parts']):.0f} s.", "",
            "Every defense is gleak's own (`gleak.defenses`: `parse_defense` + `apply_defenses`; DP-SGD through "
            "`simulate_client`). Cells are mean ± std over the trials (seeds). Each section states the paper's "
            "setting, ours, and where they differ. Raw numbers: `bench/results/defenses.json`.", ""]


def section_softlabel(res: dict[str, Any]) -> list[str]:
    rows = res["rows"]
    n = res["samples"]

    def cell(kind: str, dist: str, sigma: float, key: str, digits: int = 2, scale: float = 100) -> str:
        r = rows.get(f"{kind}|{dist}|{sigma!r}")
        return pm(r[key], digits if scale == 1 else 0, scale) + (" %" if scale == 100 else "") if r else "—"

    lines = ["## 1. Soft labels under noise (Wang, Liang & He, ICLR 2024, Table 5)", "",
             f"Ours: `softlabel` on single CIFAR-10 images, {res['model']}; {res['trials']} trials (seeds) × "
             f"{n['smoothing']} smoothing samples (ε ~ U(0, 0.5)) and × {n['mixup']} mixup samples (a partner of "
             "another class, ratio ~ U(0, 1)); noise on the last-layer weight gradient only (`tensors=fc.weight`, "
             "as the paper's \"last-layer gradients\"), the augmentation given (as in Table 5). Paper: the same "
             "model, 100 CIFAR-10 validation images with smoothing, PSO only. Data: the 20 shipped CIFAR-10 images "
             "(8 classes) — samples repeat with fresh ε.", "",
             "**Noise level.** The paper's Table 5 gives the noise *variance* v; gleak's `gaussian` takes the "
             "standard deviation σ = √v and `laplace` the scale b = √(v/2) (Laplace variance 2b²). Under that "
             "reading σ = 0.316 at v = 0.1. The reference code's noise argument is a standard deviation "
             "(bench/softlabel.py), under which the paper's level 0.1 means σ = 0.1 (our variance-1e-2 row). "
             "Both readings are in the table.", "",
             "Success = the paper's oracle |λ − λ*| < 1 (λ* from the clean gradient and the true feature); "
             "‖ŷ − y‖₁ ≤ 0.1 beside it; L_s = mean |λ − λ*| (median in brackets: a few far-off minima dominate "
             "the mean).", "",
             "| noise | paper level | σ read as variance → σ | paper: success, L_s | ours (variance reading): "
             "success | ‖ŷ − y‖₁ ≤ 0.1 | L_s (median) | ours (std reading, σ = level): success | ‖ŷ − y‖₁ ≤ 0.1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for dist in ("gaussian", "laplace"):
        for v in (1e-4, 1e-3, 1e-2, 1e-1):
            sv = min(SOFT_SIGMAS, key=lambda s: abs(math.log(s) - 0.5 * math.log(v)))
            acc, ls = PAPER_T5[(dist, v)]
            r = rows.get(f"smoothing|{dist}|{sv!r}")
            ls_text = (f"{mean_std(r['l_s'])[0]:.3g} ({statistics.mean(r['l_s_median']):.3g})" if r else "—")
            std_sigma = next((s for s in SOFT_SIGMAS if abs(math.log(s) - math.log(v)) < 1e-6), None)
            std_cells = (f"{cell('smoothing', dist, std_sigma, 'oracle')} | "
                         f"{cell('smoothing', dist, std_sigma, 'l1_ok')}" if std_sigma is not None
                         else "— (σ = 1e-4: not run; 100 % at σ = 1e-3) | —")
            lines.append(f"| {dist} | {v:g} | {sv:.3g} | {acc} %, {ls:.3g} | {cell('smoothing', dist, sv, 'oracle')} "
                         f"| {cell('smoothing', dist, sv, 'l1_ok')} | {ls_text} | {std_cells} |")
    lines += ["", "Mixup (not in the paper's Table 5; ours, same noise):", "",
              "| noise | σ | success |λ − λ*| < 1 | ‖ŷ − y‖₁ ≤ 0.1 | median ‖ŷ − y‖₁ |", "|---|---|---|---|---|"]
    for dist in ("gaussian", "laplace"):
        for sigma in SOFT_SIGMAS:
            r = rows.get(f"mixup|{dist}|{sigma!r}")
            if r:
                lines.append(f"| {dist} | {sigma:.3g} | {cell('mixup', dist, sigma, 'oracle')} | "
                             f"{cell('mixup', dist, sigma, 'l1_ok')} | {statistics.mean(r['l1_median']):.3g} |")
    lines += ["", "Reading: under either reading of the level, ours is at or above the paper at every level; the "
              "difference at variance 0.1 (ours ≈ 70 % vs 45 % / 36 %) is plausibly gleak's noise-aware search (it "
              "fits λ on the rank-1 projection of ∇W, pooling every row, where the paper runs PSO on one noisy row), "
              "not the smaller data set. Under the reference code's std reading (σ = 0.1) ours is 100 % / 99 %, as "
              "bench/results/softlabel-noise.md found. The mean L_s at σ = 0.316 is dominated by a few searches "
              "that end on a far-off minimum (|λ| near the search bound); the median is the number to hold against "
              "the paper's L_s. The paper's oracle is loose: at σ = 0.1 it counts 100 % while only about half of "
              "the recovered labels are within ‖ŷ − y‖₁ ≤ 0.1.", "",
              "![softlabel under noise](defenses-softlabel.png)", ""]
    return lines


def section_llg(res: dict[str, Any]) -> list[str]:
    rows = res["rows"]
    titles = sorted({k.split("|")[0] for k in rows}, key=lambda s: not s.startswith("LeNet"))
    lines = ["## 2. LLG+ under compression (Wainakh et al., LLG, Fig. 5)", "",
             f"Ours: `llg-plus` (aux 100 per class of mnist_aux), FedSGD gradients of unbalanced MNIST batches (50 % "
             f"one class, 25 % a second, 25 % uniform; the paper's Fig. 5 batch), {res['trials']} trials (fresh batch; "
             "fresh CNN for the sigmoid CNN) per cell; top-k per tensor (each layer keeps its largest (1 − ratio) "
             "entries, as a per-layer threshold of DGC, Lin et al.). Paper: \"when the compression ratio is 80 %, "
             "LLG+ becomes completely ineffective for B ≥ 4, dropping beyond the random guess\"; ≤ 20 % has only "
             "a slight effect. Chance = the exact expected iAcc of B uniform guesses for the same batch (the "
             "paper's random-guess baseline); iAcc = the paper's ASR (multiset overlap).", ""]
    for title in titles:
        lines += [f"### {title}", "", "| compression | " + " | ".join(f"B = {b}" for b in LLG_BATCHES) + " |",
                  "|---|" + "---|" * len(LLG_BATCHES)]
        for r in LLG_RATIOS:
            label = "0" if r == 0 else f"{r:g}"
            cells = []
            for B in LLG_BATCHES:
                row = rows.get(f"{title}|{B}|topk|{label}")
                if not row:
                    cells.append("—")
                    continue
                cells.append(f"{pm(row['iacc'], 2)}{chance_mark(row['iacc'], row['chance'])}")
            lines.append(f"| {round(100 * r)} % | " + " | ".join(cells) + " |")
        chance = [statistics.mean(rows[f"{title}|{B}|topk|0"]["chance"]) if f"{title}|{B}|topk|0" in rows else None
                  for B in LLG_BATCHES]
        lines.append("| chance | " + " | ".join("—" if c is None else f"{c:.2f}" for c in chance) + " |")
        lines += ["", "Fig. 5 (a) noise, (b) clipping + noise (σ² = 0.1) and (c) compression as the paper's public "
                  "code does it (see below), same batches:", "",
                  "| defense | " + " | ".join(f"B = {b}" for b in LLG_BATCHES) + " |",
                  "|---|" + "---|" * len(LLG_BATCHES)]
        for group, label, _ in llg_specs():
            if group == "topk":
                continue
            name = {"noise": f"noise σ² = {label}", "dp": f"clip β = {label} + noise σ² = 0.1",
                    "refcode": f"the paper's code's compression, {round(100 * float(label))} % (emulated)"}[group]
            cells = []
            for B in LLG_BATCHES:
                row = rows.get(f"{title}|{B}|{group}|{label}")
                if row:
                    cells.append(pm(row["iacc"], 2) + chance_mark(row["iacc"], row["chance"]))
                else:
                    cells.append("—")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        norms = [statistics.median(rows[f"{title}|{B}|topk|0"]["norm"]) for B in LLG_BATCHES
                 if f"{title}|{B}|topk|0" in rows]
        lines += ["", f"Median gradient L2 norm per B: {', '.join(f'{v:.3g}' for v in norms)} (clipping to β binds "
                  "only when the norm exceeds β).", ""]
    lines += ["**Why the paper's 80 % threshold may not be entry-wise pruning.** The compression in the LLG authors' "
              "public code (github.com/tklab-tud/LLG: `Code/Dlg.py` from commit 716e8dd \"add gradient compression\", "
              "Feb 2021; later `Code/defenses.py`) ranks the C class row sums of the last-layer weight gradient and "
              "then pairs those C magnitudes *by position* with the list of the model's parameter gradients "
              "(`zip(magnitudes, grad)`), zeroing the whole parameter tensor i for each of the int(C·ratio) classes "
              "i with the smallest |row sum|. The last layer's weight gradient (tensor 6 of the sigmoid CNN, 8 of "
              "LeNet-5) is therefore wiped out whenever the class with that index is among the small ones — at "
              "80 % unless it is one of the 2 classes with the largest |row sum| — and LLG+ is left with nothing. "
              "The \"paper's code's compression\" rows emulate that (in this bench, not as a gleak defense); "
              "gleak's `topk` is the entry-wise magnitude pruning the paper's text describes (Lin et al.'s "
              "threshold). In that code the attacker's own LLG+ estimation batches (`Predictor.v2_prediction` calls "
              "the same `victim_side`) also go through the compression and noise, which gleak's `llg-plus` does "
              "not do and this bench does not emulate. We cannot tell which variant produced the published "
              "figure.", "",
              "![LLG+ under compression](defenses-llg.png)", ""]
    return lines


def section_rlu(res: dict[str, Any]) -> list[str]:
    rows = res["rows"]
    B = res["batch"]
    lines = ["## 3. RLU under DP noise and compression (Chen & Vikalo, ICML 2024, Table 6)", "",
             f"Ours: `rlu` on FedAvg updates of an untrained LeNet-5 (ReLU, a fresh one per trial; SGD, η = 0.01, "
             f"Dirichlet(0.5) labels), {res['trials']} trials per cell. MNIST: B = {B['MNIST']}, aux 100 per class "
             "of mnist_aux (our stand-in for the paper's SVHN / LeNet-5 / B = 32). CIFAR-10: the 20 shipped images, "
             f"B = {B['CIFAR-10']} (the paper: VGG-16, B = 64 — a 20-image pool cannot hold a batch of 64 and VGG-16 "
             "is too slow here), aux = the same 20 images (about 2 per class, none for classes 2 and 4; the paper "
             "uses 100 per class). `rlu` = gleak's default (least squares on Δb, then a GLS refinement that also "
             "reads ΔW; m = 1 only); `rlu LS` = `gls_max_classes=0`, the paper's m = 1 algorithm.", "",
             "Noise placement: the paper adds N(0, σ²) to the *gradients*; on an update of m SGD steps that is "
             "η·σ (m = 1) and η·σ·√m for independent noise on each of the m steps' gradients (m = 10; the "
             "trajectory itself is left clean). \"σ on the update\" takes σ = 0.05 literally on Δθ (= 5 on the "
             "gradient at η = 0.01). \"σ on the summed gradient\" adds σ/B to the batch-mean gradient — what a "
             "DP-SGD-style noise on the sum of per-example gradients gives — our hypothesis for the paper's flat "
             "curve.", "",
             "| data | m | defense | paper iAcc | ours `rlu` | ours `rlu LS` | chance | update cosine |",
             "|---|---|---|---|---|---|---|---|"]
    paper_key = {"MNIST": "SVHN", "CIFAR-10": "CIFAR10"}
    names = {"none": "none", "grad": "σ = {} on the gradient", "update": "σ = {} on the update (literal)",
             "sum": "σ = {} on the summed gradient (σ/B on the mean)", "dpsgd": "DP-SGD (Opacus) z = {}, C = 1",
             "topk": "top-k {} per tensor", "topk-global": "top-k {} global"}
    for title in ("MNIST", "CIFAR-10"):
        for m in (1, 10):
            for key in [k for k in rows if k.startswith(f"{title}|{m}|")]:
                _, _, group, label = key.split("|")
                r = rows[key]
                paper = "—"
                if group == "grad":
                    paper = f"{PAPER_T6[(paper_key[title], m)][RLU_SIGMAS.index(float(label))]:.3f} " \
                            f"({paper_key[title]})"
                elif group == "none":
                    paper = f"1.000 ({paper_key[title]}, Table 2)" if title == "MNIST" else "—"
                name = names[group].format(label)
                if group == "dpsgd" and r["epsilon"]:
                    name += f" (ε = {statistics.mean(r['epsilon']):.2g}, δ = 1e-5)"
                lines.append(f"| {title} | {m} | {name} | {paper} | {pm(r['rlu'])} | "
                             f"{pm(r['rlu_ls']) if r['rlu_ls'] else '= rlu'} | {statistics.mean(r['chance']):.3f} | "
                             f"{statistics.mean(r['cosine']):.3f} |")
    lines += ["", "Reading:", "",
              "- **gleak's `rlu` skips its GLS refinement on defended captures.** The m = 1 refinement (gleak's "
              "addition, not the paper's) trusts the last-layer weight equations, whose signal is far smaller than "
              "Δb's. Measured by this bench before the change: with noise on every tensor it dragged the "
              "least-squares estimate to below chance on CIFAR-10 already at σ = 0.05 (0.16 vs 0.87 for LS only), "
              "and global top-k cost it up to 0.27. `rlu` now skips the refinement, with a warning, when the capture "
              "records a defense in `gleak.defense` (every capture here does), so `rlu` and `rlu LS` agree above; an "
              "undeclared defense still reaches it.",
              "- **The paper's curve is much flatter than per-entry noise allows.** With N(0, σ²) on every entry "
              "of the batch-mean gradient, `rlu LS` falls to 0.40 (MNIST) / 0.33 (CIFAR-10) at σ = 0.5, where the "
              "paper keeps 0.81 / 0.83; the same σ on the *summed* gradient (σ/B on the mean) keeps 0.97 / 0.92 "
              "(and 1.00 at σ = 0.05, above the paper's 0.968 / 0.909: the two readings bracket the paper). "
              "We read this as the paper's σ not being per entry of the mean gradient (their noise code is not "
              "public in what we read), not as a weaker attack here; at σ = 0.05 the per-entry reading is within "
              "0.04–0.08 of the paper.",
              "- **σ = 0.05 literally on the update** (5 on the gradient at η = 0.01) leaves nothing (≤ chance).",
              "- **m = 10**: ours degrades *less* than the paper's (e.g. CIFAR-10 0.94 / 0.63 at σ = 0.05 / 0.5 vs "
              "0.906 / 0.622): with independent noise on each of the m steps' gradients the update's noise grows "
              "as √m while the label signal grows as m; the paper saw m = 10 hurt more, which fits noise on the "
              "averaged gradient and its posterior search's reliance on ΔW.",
              "- **Compression**: per-tensor top-k keeps 1 of the 10 bias entries at ≥ 90 %, and RLU reads Δb, so "
              "it drops to 0.65–0.69 (LS); global top-k keeps the (large) bias entries and costs `rlu LS` nothing "
              "up to 99.9 %.", "",
              "![RLU under noise](defenses-rlu.png)", ""]
    return lines


def section_grid(res: dict[str, Any]) -> list[str]:
    rows = res["rows"]
    lines = ["## 4. The GGL / iLRG-style grid: every default label attack, untrained vs trained", "",
             f"Ours: the default label attacks ({', '.join(res['attacks'])}; softlabel and idlg need B = 1 and do "
             f"not run) on FedSGD gradients of uniform MNIST batches, aux 100 per class, {res['trials']} trials "
             "(batches) per cell. best = the highest iAcc over the attacks in each trial (an oracle pick, an upper "
             "bound on what an attacker who must choose gets); its most frequent winner in brackets. Gaussian σ is "
             "the standard deviation on every tensor. cosine = cosine of the defended and the clean gradient "
             "(utility).", ""]
    for title in GRID_MODELS:
        for B in (8, 32):
            keys = [k for k in rows if k.startswith(f"{title}|{B}|")]
            if not keys:
                continue
            norm = statistics.median(rows[keys[0]]["norm"])
            lines += [f"### {title}, B = {B} (median gradient norm {norm:.3g})", "",
                      "| defense | best iAcc | " + " | ".join(GRID_SHOWN) + " | chance | cosine |",
                      "|---|---|" + "---|" * len(GRID_SHOWN) + "---|---|"]
            for key in keys:
                r = rows[key]
                label = key.split("|")[2]
                winner = max(r["best_attack"], key=r["best_attack"].count)  # ties: the first to win
                c = statistics.mean(r["chance"])
                mark = chance_mark(r["best"], r["chance"])
                if label.startswith("clip"):
                    label += f" (binds in {sum(r['clipped']):.0f}/{len(r['clipped'])})"
                lines.append(f"| {label} | {pm(r['best'], 2)} ({winner}){mark} | "
                             + " | ".join(pm(r.get(a, []), 2) for a in GRID_SHOWN)
                             + f" | {c:.2f} | {statistics.mean(r['cosine']):.3f} |")
            lines.append("")
    lines += ["Reading: training changes which defense matters. On the untrained LeNet-5 nothing in the grid but a "
              "binding clip brings the best attack below 0.90: noise up to σ = 1e-2 (which leaves a gradient cosine "
              "of 0.15–0.29, i.e. most of the utility gone) costs at most 0.01, top-k 90 % 0.03–0.10, and the "
              "strongest lever is a binding clip — a pure rescaling of the gradient, which misleads every count "
              "attack that reads absolute magnitudes (iLRG, RLU, posterior, LLG+, ZLG+ fall to 0.60–0.64 at B = 8, "
              "best 0.82 at B = 32) while `llg` (sign-based extraction) keeps 0.96 at B = 8. On the 98.7 % model "
              "the attacks start near chance (B = 8: 0.69 vs 0.41; B = 32: 0.80 vs 0.70, carried by zlg-plus) and σ "
              "= 1e-2 is the only defense that moves the best attack by more than 0.03 (0.69 → 0.60 at B = 8), "
              "while the analytic attacks that win on untrained models (iLRG, RLU) are already at or below chance "
              "without any defense. Clipping at C = 4 binds in 1 of the 20 trained-model batches and never on the "
              "untrained model: the gradients' norms are below 4.", "",
              "![label attacks under defenses](defenses-grid.png)", ""]
    return lines


def section_rgla(res: dict[str, Any]) -> list[str]:
    rows = res["rows"]
    gen = res["generator"]
    fc = statistics.median(rows["none|rgla"]["fc_rms"]) if "none|rgla" in rows else float("nan")
    base = statistics.mean(rows["none|rgla"]["baseline"]) if "none|rgla" in rows else float("nan")

    def c(label: str, name: str) -> tuple[str, str]:
        r = rows.get(f"{label}|{name}")
        if not r:
            return "—", "—"
        fail = f" ({sum(r['failed']):.0f} failed)" if sum(r["failed"]) else ""
        return pm(r["kappa"], 2) + fail, pm(r["psnr"], 2, 1.0)

    lines = ["## 5. RGLA Table 2 and Table 12 (gradient inversion under noise, clipping, compression)", "",
             "Ours: `rgla` and `fgla` with the shipped generator `samples/generators/lenet_untrained_mnist` "
             f"(held-out PSNR {gen.get('heldout_psnr', float('nan')):.2f} dB; trained for "
             "samples/models/lenet_untrained, so the untrained LeNet-5 is the only model they run on here) and "
             f"`ig` bounded to {res['ig_steps']} Adam steps (its default is 4,800), on B = 8 MNIST FedSGD gradients "
             f"(uniform labels; ground-truth labels as targets), {res['trials']} trials (batches) per cell. "
             "κ = identification over chance in a 10-image lineup (9 same-class mnist_aux distractors; 0 = chance, "
             "1 = all identified); PSNR (dB, data range 1) beside it; the no-attack guess scores "
             f"{base:.2f} dB. Paper: ImageNet 224², pretrained ResNet-50 (no pooling), B = 8, PSNR only; σ = 0.01, "
             "C = 4, 99.9 % compression.", "",
             f"Scale: the median RMS of the last-layer weight gradient here is {fc:.2g}, so σ = 0.01 is "
             f"{0.01 / fc:.1f}× the signal in every entry; the paper's ResNet-50 last layer reads 100,352 "
             "non-pooled features, whose gradient is far larger. An untrained LeNet-5's B = 8 gradient has L2 norm "
             "below 1 (section 4 gives medians), so clipping at C = 4 never binds here (and FGLA's ratio ∇W/∇b "
             "cancels any clipping factor, as the paper notes). "
             "\"99.9 %\" is global top-k (over all 61,706 parameters: 62 entries survive); per-tensor "
             "top-k is in the Table 12 rows.", "",
             "| defense | attack | paper PSNR | ours κ | ours PSNR |", "|---|---|---|---|---|"]
    for label in ("none", "noise σ=0.01", "clip C=4", "topk 99.9 %"):
        for name in ("rgla", "fgla", "ig"):
            kappa, psnr = c(label, name)
            paper = PAPER_T2.get(label, {}).get(name)
            if label == "none":
                paper = {"rgla": 19.24153, "fgla": 18.77932, "ig": 15.22}.get(name)  # RGLA Table 8 (0 duplicates)
            lines.append(f"| {label} | {name} | {'—' if paper is None else f'{paper:.2f}'} | {kappa} | {psnr} |")
    lines += ["", "(The clean row's paper values are RGLA's Table 8 with no duplicate labels; Table 2 has no clean "
              "row.)", "", "Table 12 (compression ratio; paper: PSNR over 100 ImageNet batches):", "",
              "| ratio | paper RGLA | paper FGLA | rgla κ (global) | rgla PSNR (global) | fgla κ (global) | "
              "fgla PSNR (global) | rgla κ (per tensor) | fgla κ (per tensor) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in (0.0, *T12_RATIOS):
        if r == 0.0:
            g_r, g_f, t_r, t_f = c("none", "rgla"), c("none", "fgla"), c("none", "rgla"), c("none", "fgla")
        else:
            g_r, g_f = c(f"topk-global {r:g}", "rgla"), c(f"topk-global {r:g}", "fgla")
            t_r, t_f = c(f"topk-tensor {r:g}", "rgla"), c(f"topk-tensor {r:g}", "fgla")
        lines.append(f"| {100 * r:g} % | {PAPER_T12['rgla'][r]:.2f} | {PAPER_T12['fgla'][r]:.2f} | {g_r[0]} | "
                     f"{g_r[1]} | {g_f[0]} | {g_f[1]} | {t_r[0]} | {t_f[0]} |")
    lines += ["",
              "Reading: on this model the paper's \"strict\" defenses are strict indeed. σ = 0.01 is larger than the "
              "last-layer gradient's own entries, so rgla and fgla drop to chance (κ ≈ 0, PSNR below the no-attack "
              "guess) where the paper's ResNet-50 keeps 18.9 dB; `ig` keeps some identification (κ ≈ 0.4) because "
              "it matches every layer's gradient, not only the noisy last one, although its PSNR falls. Clipping at "
              "C = 4 does not bind. 99.9 % compression leaves 62 of the LeNet's 61,706 entries and defeats all "
              "three, while the paper's RGLA keeps 16–17 dB there: its last layer holds about 100 M of the 124 M "
              "parameters of its ResNet-50, so global top-k still leaves ~120,000 entries, plausibly most of them "
              "in that layer. The Table 12 ordering differs too: fgla degrades more gently than rgla under global "
              "top-k here (κ 0.53 → 0.42 at 90 % vs 0.69 → 0.19), and per-tensor top-k already defeats both at 80 % "
              "(it keeps 2 of the 10 last-layer bias entries, which fgla divides by and rgla fits). The paper's "
              "clean PSNR (19.2 dB) is above ours (14.7 dB) because our generator is small and MNIST-trained (its "
              "own ceiling is 15.8 dB held-out).", "",
              "![RGLA / FGLA under compression](defenses-rgla.png)", ""]
    return lines


SECTIONS = {"softlabel": section_softlabel, "llg": section_llg, "rlu": section_rlu, "grid": section_grid,
            "rgla": section_rgla}


# ------------------------------------------------------------------------------------------------ plots

def _save(fig: Any, name: str, written: list[Path]) -> None:
    """Lay the figure out, write it to bench/results/``name`` (added to ``written``) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    written.append(RESULTS / name)
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)


def plot_all(stored: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    parts = stored["parts"]
    if "softlabel" in parts:
        rows = parts["softlabel"]["rows"]
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for dist, color in (("gaussian", "C0"), ("laplace", "C1")):
            xs = [s for s in SOFT_SIGMAS if f"smoothing|{dist}|{s!r}" in rows]
            ms = [100 * mean_std(rows[f"smoothing|{dist}|{s!r}"]["oracle"])[0] for s in xs]
            ss = [100 * mean_std(rows[f"smoothing|{dist}|{s!r}"]["oracle"])[1] for s in xs]
            ax.errorbar(xs, ms, yerr=ss, marker="o", color=color, label=f"ours, {dist} (smoothing)")
            mx = [s for s in SOFT_SIGMAS if f"mixup|{dist}|{s!r}" in rows]
            ax.plot(mx, [100 * mean_std(rows[f"mixup|{dist}|{s!r}"]["oracle"])[0] for s in mx], ls=":",
                    marker=".", color=color, label=f"ours, {dist} (mixup)")
            pv = [(math.sqrt(v), PAPER_T5[(dist, v)][0]) for v in (1e-4, 1e-3, 1e-2, 1e-1)]
            ax.plot([p[0] for p in pv], [p[1] for p in pv], ls="--", marker="x", color=color,
                    label=f"paper Table 5, {dist} (level as variance)")
        ax.set_xscale("log")
        ax.set_xlabel("noise standard deviation σ on ∇W of the last layer")
        ax.set_ylabel("success |λ − λ*| < 1 (%)")
        ax.set_ylim(-5, 105)
        ax.set_title("softlabel, untrained ResNet-18, CIFAR-10")
        ax.legend(fontsize=7)
        _save(fig, "defenses-softlabel.png", written)
    if "llg" in parts:
        rows = parts["llg"]["rows"]
        titles = sorted({k.split("|")[0] for k in rows}, key=lambda s: not s.startswith("LeNet"))
        fig, axes = plt.subplots(1, len(titles), figsize=(5.2 * len(titles), 4), squeeze=False)
        for ax, title in zip(axes[0], titles, strict=True):
            for i, B in enumerate(LLG_BATCHES):
                xs = [r for r in LLG_RATIOS if f"{title}|{B}|topk|{'0' if r == 0 else f'{r:g}'}" in rows]
                data = [rows[f"{title}|{B}|topk|{'0' if r == 0 else f'{r:g}'}"] for r in xs]
                ax.errorbar([100 * x for x in xs], [mean_std(d["iacc"])[0] for d in data],
                            yerr=[mean_std(d["iacc"])[1] for d in data], marker="o", color=f"C{i}", label=f"B = {B}")
                ax.plot([100 * x for x in xs], [statistics.mean(d["chance"]) for d in data], ls="--", color=f"C{i}",
                        lw=1)
                ref = [r for r in LLG_REFCODE if f"{title}|{B}|refcode|{r:g}" in rows]
                ax.plot([100 * r for r in ref], [mean_std(rows[f"{title}|{B}|refcode|{r:g}"]["iacc"])[0] for r in ref],
                        ls="none", marker="x", ms=8, color=f"C{i}",
                        label="the paper's code's compression (emulated)" if i == len(LLG_BATCHES) - 1 else None)
            ax.axvline(80, color="grey", lw=0.8, ls=":")
            ax.set_title(f"LLG+: {title}", fontsize=9)
            ax.set_xlabel("top-k compression (% of entries zeroed, per tensor)")
            ax.set_ylabel("iAcc (dashed: chance)")
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=7)
        _save(fig, "defenses-llg.png", written)
    if "rlu" in parts:
        rows = parts["rlu"]["rows"]
        fig, axes = plt.subplots(1, 2, figsize=(10.4, 4))
        for ax, (title, paper) in zip(axes, (("MNIST", "SVHN"), ("CIFAR-10", "CIFAR10")), strict=True):
            for m, style in ((1, "-"), (10, "-.")):
                xs = [s for s in RLU_SIGMAS if f"{title}|{m}|grad|{s:g}" in rows]
                if not xs:
                    continue
                clean = rows[f"{title}|{m}|none|clean"]
                for key, color, name in (("rlu", "C0", "rlu"), ("rlu_ls", "C1", "rlu LS")):
                    if not clean[key]:
                        continue
                    ys = [mean_std(clean[key])[0]] + [mean_std(rows[f"{title}|{m}|grad|{s:g}"][key])[0] for s in xs]
                    ax.plot([0.01, *xs], ys, ls=style, marker="o", color=color, label=f"ours {name}, m = {m}")
                ax.plot(RLU_SIGMAS, PAPER_T6[(paper, m)], ls=style, marker="x", color="k",
                        label=f"paper {paper}, m = {m}")
                ax.plot([0.01, *xs], [statistics.mean(clean["chance"])] * (len(xs) + 1), ls=style, color="grey",
                        lw=1, label=f"chance, m = {m}")
                if m == 1:
                    sx = [s for s in RLU_SIGMAS if f"{title}|1|sum|{s:g}" in rows]
                    ax.plot(sx, [mean_std(rows[f"{title}|1|sum|{s:g}"]["rlu_ls"])[0] for s in sx], ls=":",
                            marker="s", color="C2", label="ours rlu LS, σ on the summed gradient")
            ax.set_xscale("log")
            ax.set_xlabel("σ (gradient noise std; the leftmost point is clean)")
            ax.set_ylabel("iAcc")
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"RLU, {title} (paper: {paper})", fontsize=9)
            ax.legend(fontsize=6)
        _save(fig, "defenses-rlu.png", written)
    if "grid" in parts:
        rows = parts["grid"]["rows"]
        labels = [label for label, _ in grid_specs()]
        fig, ax = plt.subplots(figsize=(10, 4.2))
        width = 0.2
        i = 0
        for title in GRID_MODELS:
            for B in (8, 32):
                keys = [f"{title}|{B}|{label}" for label in labels]
                if not all(k in rows for k in keys):
                    continue
                xs = np.arange(len(labels)) + (i - 1.5) * width
                short = "untrained" if title.startswith("untrained") else "trained 98.7 %"
                ax.bar(xs, [mean_std(rows[k]["best"])[0] for k in keys], width,
                       yerr=[mean_std(rows[k]["best"])[1] for k in keys], color=f"C{i}", label=f"{short}, B = {B}")
                ax.scatter(xs, [statistics.mean(rows[k]["chance"]) for k in keys], marker="_", s=120, color="k",
                           zorder=3, label="chance" if i == 0 else None)
                i += 1
        ax.set_xticks(np.arange(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("best iAcc over the label attacks")
        ax.set_ylim(0, 1.22)
        ax.set_yticks(np.arange(0, 1.01, 0.2))
        ax.set_title("label attacks under defenses, LeNet-5 on MNIST (black ticks: chance)", fontsize=9)
        ax.legend(fontsize=7, ncol=5, loc="upper center")
        _save(fig, "defenses-grid.png", written)
    if "rgla" in parts:
        rows = parts["rgla"]["rows"]
        fig, axes = plt.subplots(1, 2, figsize=(10.4, 4))
        ratios = (0.0, *T12_RATIOS)
        xs = list(range(len(ratios)))  # evenly spaced: 0, 80, 90, 99, 99.9 %
        for name, color in (("rgla", "C0"), ("fgla", "C1")):
            for scope, style in (("global", "-"), ("tensor", ":")):
                keys = ["none" if r == 0 else f"topk-{scope} {r:g}" for r in ratios]
                k = [rows.get(f"{key}|{name}") for key in keys]
                axes[0].plot(xs, [mean_std(v["kappa"])[0] if v else np.nan for v in k], ls=style, marker="o",
                             color=color, label=f"ours {name} ({scope})")
                axes[1].plot(xs, [mean_std(v["psnr"])[0] if v else np.nan for v in k], ls=style, marker="o",
                             color=color, label=f"ours {name} ({scope})")
            axes[1].plot(xs, [PAPER_T12[name][r] for r in ratios], ls="--", marker="x", color=color,
                         label=f"paper {name} (ImageNet)")
        axes[0].axhline(0, color="grey", lw=1, label="chance (κ = 0)")
        if "none|rgla" in rows:
            axes[1].axhline(statistics.mean(rows["none|rgla"]["baseline"]), color="grey", lw=1,
                            label="no-attack guess")
        for ax, ylabel in ((axes[0], "identification κ"), (axes[1], "PSNR (dB)")):
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{100 * r:g}" for r in ratios])
            ax.set_xlabel("top-k compression (%)")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
        axes[0].set_title("RGLA Table 12 in small: untrained LeNet-5, MNIST, B = 8", fontsize=9)
        _save(fig, "defenses-rgla.png", written)
    return written


# ------------------------------------------------------------------------------------------------ main

def findings(stored: dict[str, Any]) -> list[str]:
    """The short summary at the top, read off the stored numbers."""
    parts = stored["parts"]
    out = ["## Summary", ""]
    if "softlabel" in parts:
        rows = parts["softlabel"]["rows"]
        g = rows.get(f"smoothing|gaussian|{10 ** -0.5!r}")
        lap = rows.get(f"smoothing|laplace|{10 ** -0.5!r}")
        g2 = rows.get(f"smoothing|gaussian|{0.1!r}")
        if g and lap and g2:
            out.append(f"- **softlabel / Table 5**: at variance 0.1 (σ = 0.316) ours {pm(g['oracle'], 0, 100)} % "
                       f"(Gaussian) and {pm(lap['oracle'], 0, 100)} % (Laplace) vs the paper's 45 % / 36 %; at "
                       f"variance ≤ 1e-2 (σ ≤ 0.1) ours {pm(g2['oracle'], 0, 100)} % (Gaussian, σ = 0.1) vs the "
                       "paper's 100 %.")
    if "llg" in parts:
        rows = parts["llg"]["rows"]
        bits = []
        for title in sorted({k.split("|")[0] for k in rows}, key=lambda s: not s.startswith("LeNet")):
            def at(group: str, label: str, title: str = title) -> str:
                cells = []
                for B in LLG_BATCHES[1:]:
                    r = rows.get(f"{title}|{B}|{group}|{label}")
                    if r:
                        m, c = mean_std(r["iacc"])[0], statistics.mean(r["chance"])
                        cells.append(f"{m:.2f}{chance_mark(r['iacc'], r['chance'], ' ≤', ' >')} {c:.2f}")
                return ", ".join(cells)
            short = "LeNet-5" if title.startswith("LeNet") else "sigmoid CNN"
            bits.append(f"{short}, B = 4/8/16 (iAcc vs chance): entry-wise top-k 80 % {at('topk', '0.8')}; 99 % "
                        f"{at('topk', '0.99')}; the authors' code's compression at 80 % {at('refcode', '0.8')}")
        out.append("- **LLG+ / Fig. 5** (paper: ≥ 80 % compression puts LLG+ below chance for B ≥ 4): not reproduced "
                   "with entry-wise top-k — " + "; ".join(bits) + ".")
    if "rlu" in parts:
        rows = parts["rlu"]["rows"]
        bits = []
        for title, paper in (("MNIST", "SVHN 0.968"), ("CIFAR-10", "CIFAR-10 0.909")):
            r = rows.get(f"{title}|1|grad|0.05")
            u = rows.get(f"{title}|1|update|0.05")
            h = rows.get(f"{title}|1|sum|0.5")
            if r:
                bits.append(f"{title}: rlu {pm(r['rlu'])}, rlu LS {pm(r['rlu_ls'])} (paper {paper}); σ = 0.05 "
                            f"literally on the update: {pm(u['rlu_ls']) if u else '—'}; σ = 0.5 on the summed "
                            f"gradient: rlu LS {pm(h['rlu_ls']) if h else '—'}")
        out.append("- **RLU / Table 6** (σ = 0.05 on the gradient, m = 1): " + "; ".join(bits)
                   + ". On these defended captures gleak's `rlu` skips its GLS refinement, so it equals the paper's "
                   "LS on Δb (before that change: 0.847 MNIST, 0.163 CIFAR-10).")
    if "grid" in parts:
        rows = parts["grid"]["rows"]
        bits = []
        for title in GRID_MODELS:
            n = rows.get(f"{title}|8|none")
            s = rows.get(f"{title}|8|gaussian σ=0.01")
            k = rows.get(f"{title}|8|topk 90 %")
            if n and s and k:
                short = "untrained" if title.startswith("untrained") else "trained"
                bits.append(f"{short}: clean {pm(n['best'], 2)}, σ = 1e-2 {pm(s['best'], 2)}, top-k 90 % "
                            f"{pm(k['best'], 2)} (chance {statistics.mean(n['chance']):.2f})")
        out.append("- **Grid** (best label attack, B = 8): " + "; ".join(bits) + ".")
    if "rgla" in parts:
        rows = parts["rgla"]["rows"]
        bits = []
        for label in ("none", "noise σ=0.01", "clip C=4", "topk 99.9 %"):
            r, f = rows.get(f"{label}|rgla"), rows.get(f"{label}|fgla")
            if r and f:
                bits.append(f"{label}: rgla κ {pm(r['kappa'], 2)} / {pm(r['psnr'], 1, 1.0)} dB, fgla κ "
                            f"{pm(f['kappa'], 2)}")
        out.append("- **RGLA / Table 2** (untrained LeNet-5, MNIST, B = 8): " + "; ".join(bits) + ". rgla / fgla "
                   "ran only on the untrained LeNet-5 (the only model with a shipped generator); `ig` ran with 500 "
                   "of its 4,800 steps.")
    return [*out, ""]


def write_report(stored: dict[str, Any]) -> Path:
    lines = header(stored["meta"]) + findings(stored)
    for part in PARTS:
        if part in stored["parts"]:
            lines += SECTIONS[part](stored["parts"][part])
    out = RESULTS / "defenses.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="gleak defense benchmark (the papers' defense experiments)")
    parser.add_argument("--part", action="append", choices=PARTS, help="run only this part (repeatable)")
    parser.add_argument("--trials", type=int, default=None, help="trials (seeds) per cell, every part")
    parser.add_argument("--soft-samples", type=int, default=20, help="softlabel: smoothing samples per trial")
    parser.add_argument("--soft-mixup-samples", type=int, default=10, help="softlabel: mixup samples per trial")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-only", action="store_true", help="redraw defenses.md and the plots from the json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = RESULTS / "defenses.json"
    stored = json.loads(path.read_text()) if path.exists() else {"meta": {"parts": {}}, "parts": {}}
    command = "python bench/defenses.py" + ("" if len(sys.argv) == 1 else " " + " ".join(sys.argv[1:]))
    started = time.time()
    if not args.report_only:
        for part in args.part or PARTS:
            t0 = time.time()
            trials = args.trials or DEFAULT_TRIALS[part]
            if part == "softlabel":
                res = part_softlabel(trials, {"smoothing": args.soft_samples, "mixup": args.soft_mixup_samples})
            elif part == "llg":
                res = part_llg(trials)
            elif part == "rlu":
                res = part_rlu(trials)
            elif part == "grid":
                res = part_grid(trials)
            else:
                res = part_rgla(trials)
            stored["parts"][part] = res
            stored["meta"]["parts"][part] = {"seconds": time.time() - t0, "command": command,
                                             "date": time.strftime("%Y-%m-%d"), "trials": trials}
            progress(f"== {part}: {time.time() - t0:.0f} s")
        stored["meta"].update({"command": command, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                               "torch": torch.__version__, "total_seconds": time.time() - started})
        path.write_text(json.dumps(stored, indent=1, default=float) + "\n")
    out = write_report(stored)
    for png in plot_all(stored):
        progress(f"wrote {png.relative_to(ROOT)}")
    progress(f"wrote {out.relative_to(ROOT)} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
