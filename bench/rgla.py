"""RGLA benchmark (the RGLA paper, anonymous ICLR 2024 submission, Tables 6 and 8 and its speed claim, in small).

    python bench/rgla.py                      # everything (table6, table8, speed)
    python bench/rgla.py --only table6        # one part: table6 | table8 | speed
    python bench/rgla.py --quick              # 1 batch, few settings (debugging); writes rgla-*-quick.md
    python bench/rgla.py --batches 3          # batches per setting (default: table6 5, table8 3)

* table6 — logit recovery: ``rgla``'s recovered outputs Ŷ′ and features F′ against the true logits and
  last-layer inputs (ground-truth labels as targets), per batch size B. C = 100: the zoo ``idlg-cnn`` (sigmoid,
  U(±0.5)) with 100 classes on random 32×32 crops of scikit-image's natural images (CIFAR-100-sized,
  CIFAR-100 normalisation, labels drawn uniformly from the 100 classes), and the paper's setting at C = 100
  (the 98.7 %-trained LeNet-5 backbone with a fresh 100-class last layer, MNIST digits, random labels);
  C = 10: LeNet-5 on the MNIST client
  split (random label composition), untrained and in "the paper's setting" (the 98.7 %-trained backbone with a
  freshly initialised last layer, seed 1234). Examples that share a label are interchangeable in the
  equations, so recovered rows are matched to true rows within each label (Hungarian, on the logits).
* table8 — PSNR of ``rgla``, ``fgla`` and ``ig`` at B = 8 on MNIST with k ∈ {0, 2, 4, 6, 8} examples sharing one
  label (0: all distinct), ground-truth labels as targets; the ceiling is the generator applied to the true
  features. One generator per model, trained on mnist_aux (20 epochs of pixel MSE), cached in /tmp.
* speed — seconds per batch of rgla, fgla and ig on the same B = 8 MNIST batch.

Captures come from gleak's own client simulation (float32 gradients, as real captures). Everything is seeded;
the same command on the same machine and thread count gives the same tables (times aside).
Writes bench/results/rgla-<part>.md and .json.
"""

from __future__ import annotations

import argparse
import datetime
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

from scipy.optimize import linear_sum_assignment  # noqa: E402

from gleak.attacks import RunInputs, build_context, get_attack, run_attack  # noqa: E402
from gleak.attacks.reconstruct.base import to_pixels  # noqa: E402
from gleak.attacks.reconstruct.disaggregate import OutputSystem  # noqa: E402
from gleak.capture import capture_gradients  # noqa: E402
from gleak.data.images import Dataset, load_dataset  # noqa: E402
from gleak.generator.file import GeneratorFile, load_generator, save_generator  # noqa: E402
from gleak.generator.train import TrainSettings, aux_features, train_decoder  # noqa: E402
from gleak.io import tensors_sha256  # noqa: E402
from gleak.losses import LossSpec  # noqa: E402
from gleak.metrics.images import image_scores  # noqa: E402
from gleak.models import LoadedModel, build_arch, find_last_layer, load_model  # noqa: E402
from gleak.models.forward import features_and_logits  # noqa: E402
from gleak.simulate.images import ClientConfig, simulate_client  # noqa: E402

THREADS = 1
CACHE = Path("/tmp/gleak-rgla-bench")
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
SKIMAGE = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
           "colorwheel")
PAPER_T6 = {8: 8.78e-5, 16: 2e-4, 32: 7e-4, 64: 1.3e-3}  # logit error, ImageNet / ResNet-50
PAPER_T8 = {"fgla": (18.78, 16.96, 15.18, 12.81, 10.75), "rgla": (19.24, 18.94, 18.56, 18.18, 17.84),
            "ig": (15.22, 14.31, 13.93, 12.11, 12.20)}  # PSNR dB, ImageNet, B = 8, k = 0/2/4/6/8 sharing
SHARING = (0, 2, 4, 6, 8)
GEN_SETTINGS = TrainSettings(epochs=20)


# ------------------------------------------------------------------------------------------- models and data

def lenet(paper: bool) -> LoadedModel:
    """LeNet-5 untrained, or the paper's setting: the trained backbone with a fresh fc3 (seed 1234)."""
    if not paper:
        return load_model(ROOT / "samples/models/lenet_untrained.safetensors")
    m = load_model(ROOT / "samples/models/lenet_mnist98.safetensors")
    torch.manual_seed(1234)
    m.module.fc3.reset_parameters()
    return LoadedModel(m.module.eval(), "bench: lenet_mnist98 + fresh fc3 (seed 1234)", m.arch, m.arch_kwargs,
                       m.input_shape)  # weights_sha256 left empty: recomputed from the changed weights


def lenet100_paper() -> LoadedModel:
    """The paper's setting at C = 100: the 98.7 %-trained LeNet-5 backbone with a fresh 100-class last layer."""
    m = load_model(ROOT / "samples/models/lenet_mnist98.safetensors")
    torch.manual_seed(1234)
    m.module.fc3 = torch.nn.Linear(84, 100)
    return LoadedModel(m.module.eval(), "bench: lenet_mnist98 + fresh 100-class fc3 (seed 1234)", m.arch,
                       {**m.arch_kwargs, "num_classes": 100}, m.input_shape)


def mnist100_capture(model: LoadedModel, data: Dataset, B: int, seed: int):
    """(context, inputs, labels) of B MNIST digits given uniform random labels from 100 classes."""
    g = torch.Generator().manual_seed(20_000 + seed)
    x, _ = data.batch(torch.randperm(len(data), generator=g)[:B].tolist())
    y = torch.randint(100, (B,), generator=g)
    cap = capture_gradients(model.module, x, y, LossSpec(), mean=data.mean, std=data.std)
    return build_context(cap, model, seed=seed), x, y


def idlg100() -> LoadedModel:
    torch.manual_seed(0)
    module = build_arch("idlg-cnn", {"num_classes": 100, "in_channels": 3, "image_size": 32})
    return LoadedModel(module.eval(), "bench: idlg-cnn C=100 (seed 0)", "idlg-cnn",
                       {"num_classes": 100, "in_channels": 3, "image_size": 32}, (3, 32, 32))


def natural_crops(n: int, seed: int) -> torch.Tensor:
    """``n`` random 32×32 RGB crops (pixels in [0, 1]) of scikit-image's natural images, each image first
    resized so that its short side is 128 pixels (a crop then covers about 1/4 of the side, like a CIFAR
    object)."""
    import skimage.data
    from skimage.transform import resize

    images = []
    for name in SKIMAGE:
        im = getattr(skimage.data, name)()[..., :3].astype(np.float64) / 255.0
        scale = 128 / min(im.shape[:2])
        im = resize(im, (round(im.shape[0] * scale), round(im.shape[1] * scale)), anti_aliasing=True)
        images.append(torch.from_numpy(im).permute(2, 0, 1).float())
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        im = images[int(torch.randint(len(images), (1,), generator=g))]
        top = int(torch.randint(im.shape[1] - 32 + 1, (1,), generator=g))
        left = int(torch.randint(im.shape[2] - 32 + 1, (1,), generator=g))
        out.append(im[:, top:top + 32, left:left + 32])
    return torch.stack(out).clamp(0, 1)


def natural_capture(model: LoadedModel, B: int, seed: int):
    """(context, normalised inputs, labels) of one C = 100 batch: natural crops with uniform random labels."""
    pixels = natural_crops(B, seed)
    mean, std = torch.tensor(CIFAR100_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR100_STD).view(1, 3, 1, 1)
    x = (pixels - mean) / std
    y = torch.randint(100, (B,), generator=torch.Generator().manual_seed(10_000 + seed))
    cap = capture_gradients(model.module, x, y, LossSpec(), mean=CIFAR100_MEAN, std=CIFAR100_STD)
    return build_context(cap, model, seed=seed), x, y


def mnist_capture(model: LoadedModel, data: Dataset, B: int, seed: int, labels: list[int] | None = None):
    """(context, normalised inputs, labels) of one simulated FedSGD client batch (uniform labels, or given)."""
    cfg = ClientConfig(batch_size=B, seed=seed) if labels is None else \
        ClientConfig(batch_size=B, seed=seed, composition="explicit", labels=tuple(labels))
    cap, truth = simulate_client(model.module, data, cfg)
    return build_context(cap, model, seed=seed), truth.inputs, truth.labels


def shared_labels(k: int, seed: int, C: int = 10, B: int = 8) -> list[int]:
    """B labels of which k share one class (k = 0: all distinct), the rest distinct other classes, shuffled."""
    rng = np.random.default_rng(50_000 + 97 * k + seed)
    order = rng.permutation(C).tolist()
    labels = order[:B] if k == 0 else [order[0]] * k + order[1:1 + B - k]
    return [int(v) for v in rng.permutation(labels)]


def one_hot(y: torch.Tensor, C: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(y.long(), C).double()


# ------------------------------------------------------------------------------------------- measurement

def match_within_labels(rec: torch.Tensor, true: torch.Tensor, labels: torch.Tensor) -> list[int]:
    """For each true row, the recovered row paired with it: identity across labels, Hungarian on the squared
    error within a group of examples sharing a label (the equations cannot tell those apart)."""
    order = list(range(len(labels)))
    for c in labels.unique().tolist():
        idx = torch.nonzero(labels == c).flatten().tolist()
        if len(idx) < 2:
            continue
        cost = ((true[idx][:, None, :] - rec[idx][None, :, :]) ** 2).sum(-1)
        rows, cols = linear_sum_assignment(cost.numpy())
        for r, col in zip(rows.tolist(), cols.tolist(), strict=True):
            order[idx[r]] = idx[col]
    return order


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1)


def run(name: str, ctx, targets: torch.Tensor, generator: GeneratorFile | None = None, **options: Any):
    attack = get_attack(name)
    attack.configure(options)
    result = run_attack(attack, ctx, RunInputs(targets=targets, generator=generator))
    if result.status != "ok":
        raise RuntimeError(f"{name}: {result.status}: {result.reason}")
    return result


def truth_of(ctx, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """True last-layer inputs and logits (float64) of the batch."""
    h, z = features_and_logits(ctx.model, ctx.layer, x)
    return h.double(), z.double()


def logit_trial(ctx, x: torch.Tensor, y: torch.Tensor, solver: str = "lm", **options: Any) -> dict[str, Any]:
    C = ctx.num_classes
    feats, logits = truth_of(ctx, x)
    targets = one_hot(y, C)
    true_residual = OutputSystem(ctx.grad_weight, ctx.grad_bias, ctx.layer.weight.double(),
                                 ctx.layer.bias.double(), targets, None).exact_residual(logits)
    res = run("rgla", ctx, targets, **({"solver": solver} if solver != "lm" else {}), **options)
    rec_logits = res.output.recovered["logits"].double()
    rec_feats = res.output.recovered["features"].double()
    order = match_within_labels(rec_logits, logits, y)
    rec_logits, rec_feats = rec_logits[order], rec_feats[order]
    sq = (rec_logits - logits).pow(2)
    cos = cosines(rec_feats, feats)
    d = res.output.diagnostics
    return {"mse": float(sq.mean()), "per_example_sse": float(sq.sum(1).mean()),
            "rel_err": float(sq.sum() / logits.pow(2).sum()), "true_residual": true_residual,
            "cos_mean": float(cos.mean()),
            "cos_min": float(cos.min()), "exact": bool(d["exact"]), "seconds": res.seconds,
            "chosen_start": d["chosen_start"], "residual": d["residual"], "loss_gap": d["loss_gap"],
            "loss_estimate": d["loss_estimate"], "evaluations": d["evaluations_run"],
            "candidates": d["candidates"], "labels": y.tolist(), "shared": d["examples_sharing_a_label"],
            "logit_std": float(logits.std())}


def fmt_e(v: float) -> str:
    return f"{v:.2e}"


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ------------------------------------------------------------------------------------------- table 6

C100_BATCHES = {8: None, 16: None, 32: 1, 64: 1}  # lm at C = 100 (idlg-cnn): ~3 s, ~20-50 s, ~2.5 min a batch
C100_EVALUATIONS = {16: 150, 32: 150, 64: 150}  # lm at C = 100: residual evaluations per stage (default 500)
C100_PAPER_BATCHES = 2  # the C = 100 paper setting (B = 8 and 16, ~10 s and ~30 s a batch)
C100_NO_RESTARTS = 16  # lm at C = 100 from this B on: the FGLA start only (restarts=0), for time
ADAM_BATCHES = 1  # the paper's Adam solver (20,000 steps, ~20 s a batch) at C = 100
ACCURATE = 1e-6  # rel. error below which a recovery counts as accurate (the float32 floor is ~1e-13)


def table6(n: int, quick: bool, c100_all: bool) -> tuple[str, dict]:
    mnist = load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    c100 = "C = 100, idlg-cnn (sigmoid, U(±0.5)) untrained, 3×32×32 natural crops"
    settings: list[tuple[str, str, str, list[int]]] = [
        (c100, "c100", "lm", [8] if quick else [8, 16, 32, 64]),
        (c100, "c100", "adam", [8] if quick else [8, 16, 32, 64]),
        ("C = 100, LeNet-5 98.7 % backbone + fresh 100-class fc3 (paper's setting), MNIST digits with random "
         "labels", "c100-paper", "lm", [8] if quick else [8, 16]),
        ("C = 10, LeNet-5 untrained, MNIST", "lenet", "lm", [2, 8] if quick else [2, 4, 8, 10, 11]),
        ("C = 10, LeNet-5 98.7 % backbone + fresh fc3 (paper's setting), MNIST", "lenet-paper", "lm",
         [8] if quick else [2, 4, 8, 10, 11]),
    ]
    models = {"c100": idlg100(), "c100-paper": lenet100_paper(), "lenet": lenet(False), "lenet-paper": lenet(True)}
    capped = ", ".join(f"{v} evaluations per stage at B = {b}" for b, v in C100_EVALUATIONS.items())
    caps = "" if c100_all or quick else (
        f" (C = 100: lm on {', '.join(f'{v or n} at B = {b}' for b, v in C100_BATCHES.items())} batches, the "
        f"paper's Adam on {min(ADAM_BATCHES, n)} per B; lm from the FGLA start only (restarts=0) at "
        f"B ≥ {C100_NO_RESTARTS}, with {capped}; the C = 100 paper setting on "
        f"{min(n, C100_PAPER_BATCHES)} batches; for time)")
    lines = [f"## Table 6 in small: logit and feature recovery of rgla ({n} batch{'es' if n > 1 else ''} per row"
             f"{caps}; ground-truth labels; recovered rows matched to true rows within each shared label)", "",
             "solver: lm = gleak's default (Levenberg–Marquardt, FGLA start + 2 random restarts, each fit ending 20 "
             "evaluations after its residual is below 1e-10); adam = the "
             "paper's solver (20,000 Adam steps on Eq. 7 from a random start, α = 10⁴, 1, 100). "
             "logit MSE = mean over the B×C entries of (ŷ′ − ŷ)²; per-example SSE = its sum over the C classes, "
             "averaged over the B examples; rel. = ‖Ŷ′ − Ŷ‖²/‖Ŷ‖²; cos = cosine of F′ and the true last-layer "
             "input (mean over all examples of all batches, and the minimum); exact = batches where rgla reports "
             "an exact solution (diagnostics['exact']: squared normalised residual of Prop. 1 and Eq. 3 < 1e-10); "
             f"accurate = batches with rel. < {ACCURATE:g}; residual = rgla's chosen residual vs the residual of "
             "the true logits in the same (float32-gradient) equations (medians); shared = examples sharing a label "
             "(median).", "",
             "| setting | solver | B | logit MSE median | max | per-example SSE median | rel. median | cos mean | "
             "cos min | exact | accurate | residual found / true | shared | s/batch median | logit std | "
             "paper (ImageNet, ResNet-50) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    raw: dict[str, Any] = {}
    for title, key, solver, sizes in settings:
        model = models[key]
        for B in sizes:
            count = n
            if key == "c100" and not c100_all and not quick:
                count = min(n, ADAM_BATCHES) if solver == "adam" else min(n, C100_BATCHES[B] or n)
            if key == "c100-paper" and not c100_all:
                count = min(n, C100_PAPER_BATCHES)
            trials = []
            for s in range(count):
                if key == "c100":
                    ctx, x, y = natural_capture(model, B, seed=s)
                elif key == "c100-paper":
                    ctx, x, y = mnist100_capture(model, mnist, B, seed=s)
                else:
                    ctx, x, y = mnist_capture(model, mnist, B, seed=100 + s)
                extra: dict[str, Any] = {}
                if key == "c100" and solver == "lm" and B >= C100_NO_RESTARTS:
                    extra["restarts"] = 0
                if key == "c100" and solver == "lm" and B in C100_EVALUATIONS:
                    extra["evaluations"] = C100_EVALUATIONS[B]
                trials.append(logit_trial(ctx, x, y, solver=solver, **extra))
                print(f"  {key} {solver} B={B} batch {s}: mse {trials[-1]['mse']:.2e}, "
                      f"{trials[-1]['seconds']:.1f} s", flush=True)
            raw[f"{key} {solver} B={B}"] = trials
            mses = [t["mse"] for t in trials]
            cos_all = [t["cos_mean"] for t in trials]
            paper = fmt_e(PAPER_T6[B]) if key.startswith("c100") and B in PAPER_T6 else "—"
            line = (f"| {title} | {solver} | {B} | {fmt_e(med(mses))} | {fmt_e(max(mses))} | "
                    f"{fmt_e(med([t['per_example_sse'] for t in trials]))} | "
                    f"{fmt_e(med([t['rel_err'] for t in trials]))} | {statistics.mean(cos_all):.6f} | "
                    f"{min(t['cos_min'] for t in trials):.4f} | {sum(t['exact'] for t in trials)}/{len(trials)} | "
                    f"{sum(t['rel_err'] < ACCURATE for t in trials)}/{len(trials)} | "
                    f"{med([t['residual'] for t in trials]):.0e} / {med([t['true_residual'] for t in trials]):.0e} | "
                    f"{med([t['shared'] for t in trials]):g} | "
                    f"{med([t['seconds'] for t in trials]):.2f} | {med([t['logit_std'] for t in trials]):.2f} | "
                    f"{paper} |")
            print(line, flush=True)
            lines.append(line)
    return "\n".join(lines), raw


# ------------------------------------------------------------------------------------------- generator

def generator_for(model: LoadedModel, aux: Dataset) -> tuple[GeneratorFile, dict[str, Any]]:
    """The generator of ``model`` trained on ``aux`` (cached in /tmp by the model's hash and the settings)."""
    sha = tensors_sha256(model.module.state_dict())
    layer = find_last_layer(model.module, None, input_shape=aux.input_shape)
    aux_sha = tensors_sha256({"images": aux.images, "labels": aux.labels})
    key = f"{sha[:16]}-{aux_sha[:12]}-e{GEN_SETTINGS.epochs}-s{GEN_SETTINGS.seed}-w{GEN_SETTINGS.width}-t{THREADS}"
    path = CACHE / f"gen-{key}.safetensors"
    info: dict[str, Any] = {"path": str(path), "cached": path.exists()}
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        feats = aux_features(model.module.eval(), layer, aux, torch.device("cpu"))
        result = train_decoder(feats, aux.images, GEN_SETTINGS, "cpu")
        meta = {"epochs": GEN_SETTINGS.epochs, "seed": GEN_SETTINGS.seed, "loss": GEN_SETTINGS.loss,
                **result.summary()}
        save_generator(path, result.decoder, model_sha256=sha, layer=layer.name, mean=aux.mean, std=aux.std,
                       aux_sha256=aux_sha, aux_examples=len(aux), aux_source="samples/data/mnist_aux.safetensors",
                       train=meta, force=True)
        info["train_seconds"] = time.perf_counter() - started
    gen = load_generator(path)
    info["heldout_psnr"] = gen.describe()["heldout_psnr"]
    info["baseline_psnr"] = float(gen.meta.get("gleak.train.heldout_baseline_psnr", "nan"))
    return gen, info


# ------------------------------------------------------------------------------------------- table 8

def psnr_of(images: torch.Tensor, truth: torch.Tensor) -> float:
    return min(float(image_scores(images, truth)["mean"]["psnr"]), 150.0)


def table8(n: int, quick: bool, ig_batches: int, ig_iterations: int | None) -> tuple[str, dict]:
    mnist, aux = load_dataset(ROOT / "samples/data/mnist_client.safetensors"), \
        load_dataset(ROOT / "samples/data/mnist_aux.safetensors")
    settings = [("LeNet-5 untrained", lenet(False)), ("LeNet-5 98.7 % backbone + fresh fc3 (paper's setting)",
                                                     lenet(True))]
    ks = (0, 8) if quick else SHARING
    ig_note = (f"ig ({ig_iterations or 4800} Adam steps, the attack's defaults otherwise) on the first "
               f"{min(ig_batches, n)} of the {n} batches of each cell")
    lines = [f"## Table 8 in small: PSNR (dB) at B = 8 with k of 8 examples sharing one label (MNIST client split, "
             f"{n} batch{'es' if n > 1 else ''} per cell, ground-truth labels as targets; {ig_note})", "",
             f"Generators: one per model, {GEN_SETTINGS.epochs} epochs of pixel MSE on mnist_aux (2,000 images; "
             "10 % held out). ceiling = the generator applied to the true features. cos = mean cosine of the "
             "attack's features and the true ones. PSNR after Hungarian matching of the batch (scikit-image, data "
             "range 1).", ""]
    raw: dict[str, Any] = {}
    for title, model in settings:
        gen, info = generator_for(model, aux)
        raw[f"{title} generator"] = info
        lines += [f"### {title}", "",
                  f"generator: held-out PSNR {info['heldout_psnr']:.2f} dB (mean-image baseline "
                  f"{info['baseline_psnr']:.2f} dB)" + (f", trained in {info['train_seconds']:.0f} s"
                                                        if "train_seconds" in info else " (cached)"), "",
                  "| k sharing | ceiling | rgla | fgla | ig | rgla cos | fgla cos | rgla exact | "
                  "paper RGLA | paper FGLA | paper IG |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for k in ks:
            cells: dict[str, list[float]] = {m: [] for m in ("ceiling", "rgla", "fgla", "ig", "rgla_cos",
                                                               "fgla_cos", "rgla_exact")}
            trials = []
            for s in range(n):
                labels = shared_labels(k, s)
                ctx, x, y = mnist_capture(model, mnist, 8, seed=200 + s, labels=labels)
                truth = to_pixels(ctx, x)
                feats, _ = truth_of(ctx, x)
                targets = one_hot(y, 10)
                row: dict[str, Any] = {"labels": y.tolist()}
                with torch.no_grad():
                    row["ceiling"] = psnr_of(gen.decoder.generate(feats.float()).clamp(0, 1), truth)
                for name in ("rgla", "fgla"):
                    res = run(name, ctx, targets, gen)
                    row[name] = psnr_of(res.output.images, truth)
                    f = res.output.recovered["features"].double()
                    if name == "rgla":
                        order = match_within_labels(res.output.recovered["logits"].double(), truth_of(ctx, x)[1], y)
                        f = f[order]
                        row["rgla_exact"] = float(res.output.diagnostics["exact"])
                    row[f"{name}_cos"] = float(cosines(f, feats).mean())
                    row[f"{name}_seconds"] = res.seconds
                if s < ig_batches:
                    opts = {"iterations": ig_iterations} if ig_iterations else {}
                    res = run("ig", ctx, targets, **opts)
                    row["ig"] = psnr_of(res.output.images, truth)
                    row["ig_seconds"] = res.seconds
                for key in cells:
                    if key in row:
                        cells[key].append(row[key])
                trials.append(row)
                print(f"  {title} k={k} batch {s}: " + ", ".join(f"{a}={v:.2f}" for a, v in row.items()
                                                                     if isinstance(v, float)), flush=True)
            raw[f"{title} k={k}"] = trials
            i = SHARING.index(k)

            def mean(key: str, digits: int = 2, cells: dict[str, list[float]] = cells) -> str:
                return f"{statistics.mean(cells[key]):.{digits}f}" if cells[key] else "—"

            line = (f"| {k} | {mean('ceiling')} | {mean('rgla')} | {mean('fgla')} | {mean('ig')} | "
                    f"{mean('rgla_cos', 4)} | {mean('fgla_cos', 4)} | {sum(cells['rgla_exact']):.0f}/"
                    f"{len(cells['rgla_exact'])} | {PAPER_T8['rgla'][i]} | {PAPER_T8['fgla'][i]} | "
                    f"{PAPER_T8['ig'][i]} |")
            print(line, flush=True)
            lines.append(line)
        lines.append("")
    return "\n".join(lines), raw


# ------------------------------------------------------------------------------------------- speed

def speed(quick: bool, ig_iterations: int | None) -> tuple[str, dict]:
    mnist, aux = load_dataset(ROOT / "samples/data/mnist_client.safetensors"), \
        load_dataset(ROOT / "samples/data/mnist_aux.safetensors")
    lines = ["## Speed: seconds per B = 8 MNIST batch (same batch for every attack; rgla and fgla include "
             f"decoding by the generator; ig {ig_iterations or 4800} Adam steps)", "",
             "| model | attack | runs | min s | median s | median ig / median attack |", "|---|---|---|---|---|---|"]
    raw: dict[str, Any] = {}
    settings = [("LeNet-5 untrained", lenet(False))] if quick else \
        [("LeNet-5 untrained", lenet(False)), ("LeNet-5 98.7 % + fresh fc3", lenet(True))]
    for title, model in settings:
        gen, _ = generator_for(model, aux)
        ctx, _, y = mnist_capture(model, mnist, 8, seed=300)
        targets = one_hot(y, 10)
        times: dict[str, list[float]] = {}
        for name, reps in (("rgla", 3), ("fgla", 3), ("ig", 1 if quick else 2)):
            opts = {"iterations": ig_iterations} if name == "ig" and ig_iterations else {}
            times[name] = [run(name, ctx, targets, gen if name != "ig" else None, **opts).seconds
                           for _ in range(reps)]
        raw[title] = {"labels": y.tolist(), **times}
        ig = med(times["ig"])
        for name, values in times.items():
            ratio = f"{ig / med(values):,.0f}×" if name != "ig" else "—"
            line = f"| {title} | {name} | {len(values)} | {min(values):.4f} | {med(values):.4f} | {ratio} |"
            print(line, flush=True)
            lines.append(line)
    lines += ["", "The paper: optimisation attacks take ≥ 200× longer than RGLA (ImageNet, ResNet-50, GPU)."]
    return "\n".join(lines), raw


# ------------------------------------------------------------------------------------------- main

def library_hashes() -> dict[str, str]:
    """Which version of the attack code produced the numbers (the files are under active development)."""
    import hashlib

    files = ("attacks/reconstruct/rgla.py", "attacks/reconstruct/disaggregate.py", "attacks/reconstruct/fgla.py",
             "generator/train.py", "generator/network.py")
    return {Path(f).name: hashlib.sha256((ROOT / "gleak" / f).read_bytes()).hexdigest()[:12] for f in files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["table6", "table8", "speed"], default=None)
    parser.add_argument("--batches", type=int, default=None, help="batches per setting (table6: 5, table8: 3)")
    parser.add_argument("--ig-batches", type=int, default=None,
                        help="table8: run ig on the first N batches of each cell (default 2: ~50 s a run)")
    parser.add_argument("--ig-iterations", type=int, default=None, help="ig Adam steps (default: 4,800)")
    parser.add_argument("--quick", action="store_true", help="1 batch, few settings (debugging)")
    parser.add_argument("--c100-all", action="store_true",
                        help="table6: run every C = 100 row on all batches (lm takes ~20 min a batch at B = 32)")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    parts = [args.only] if args.only else ["table6", "table8", "speed"]
    out = ROOT / "bench/results"
    out.mkdir(exist_ok=True)
    for part in parts:
        started = time.time()
        if part == "table6":
            n = 1 if args.quick else (args.batches or 5)
            text, raw = table6(n, args.quick, args.c100_all)
        elif part == "table8":
            n = 1 if args.quick else (args.batches or 3)
            text, raw = table8(n, args.quick, args.ig_batches if args.ig_batches is not None else min(n, 2),
                               args.ig_iterations)
        else:
            text, raw = speed(args.quick, args.ig_iterations)
        seconds = time.time() - started
        header = (f"# RGLA benchmark: {part}\n\n`python bench/rgla.py {' '.join(sys.argv[1:])}`; this part "
                  f"{seconds:.0f} s; torch threads {torch.get_num_threads()} (2 shared CPU cores), torch "
                  f"{torch.__version__}; {datetime.date.today().isoformat()}; library files (sha256[:12]): "
                  f"{', '.join(f'{k} {v}' for k, v in library_hashes().items())}\n")
        name = f"rgla-{part}" + ("-quick" if args.quick else "")
        (out / f"{name}.md").write_text(header + "\n" + text + "\n")
        (out / f"{name}.json").write_text(json.dumps({"command": sys.argv, "threads": torch.get_num_threads(),
                                                      "seconds": seconds, "date": datetime.date.today().isoformat(),
                                                      "library": library_hashes(),
                                                      "results": raw}, indent=1, default=float) + "\n")
        print(f"wrote {out / name}.md ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
