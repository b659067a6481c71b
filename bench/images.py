"""Image findings against what people see: the identification lineup vs PSNR on a graded set, the BatchNorm-CNN
leak that PSNR missed, and the expected image leakage of captures without truth.

    python bench/images.py                    # everything (≈ 10 min on one thread)
    python bench/images.py --only graded      # one part: graded | bncnn | expected | time

* graded — 16 MNIST digits of the shipped client split and versions of them whose order a person does not
  doubt: the images themselves; Gaussian pixel noise of rising σ; ig reconstructions after 10, 50, 200 and 2,000
  Adam steps (a small BatchNorm CNN, FedSGD in train mode, labels recovered); and three images that carry
  nothing of the image — pure noise, the aux set's mean image, a different digit of the same class. Each level is
  scored by PSNR, SSIM, LPIPS and identification in lineups of K + 1 = 10 (distractors of the same class from
  the aux split; mean over 5 seeded draws) with four similarities (low-passed correlation ``ncc``, low-passed
  SSIM, LPIPS, negative MSE). Spearman's ρ against the known order along each chain (noise, iterations; the
  three null images tied at the bottom), and the pairs each metric puts the wrong way round.
* bncnn — three user-written BatchNorm CNNs (classifier ``head``, ``fc``, and ``classifier`` after global
  average pooling), FedSGD in train mode on 16 digits, each capture and a noise control (its tensors replaced
  by Gaussian noise of the same spread) in one
  audit (standard budget, with truth): which get GLEAK-IMAGES.
* expected — the same captures without truth, with --aux: GLEAK-IMAGES-EXPECTED and whether its predictive
  interval holds the identification measured with truth, over 5 client batches.
* time — the standard-budget audit of one B = 16 capture, with and without truth (min / median of 3).

One torch thread throughout. Writes bench/results/images.md (and .json) and the pictures images-*.png.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.attacks import build_context, get_attack  # noqa: E402
from gleak.attacks.reconstruct.base import to_pixels  # noqa: E402
from gleak.capture import Capture, Truth, save_capture  # noqa: E402
from gleak.data.images import Dataset, load_dataset  # noqa: E402
from gleak.io import tensors_sha256  # noqa: E402
from gleak.metrics.identification import draw_distractors, identify  # noqa: E402
from gleak.metrics.images import image_scores  # noqa: E402
from gleak.metrics.perceptual import load_lpips  # noqa: E402
from gleak.models import LoadedModel  # noqa: E402
from gleak.report.images import grid, lineup_picture, png_bytes  # noqa: E402
from gleak.runs.audit.capture import audit_capture, audit_loaded  # noqa: E402
from gleak.runs.audit.setup import AuditConfig, ModelSet  # noqa: E402
from gleak.runs.reconstruct import reconstruct  # noqa: E402
from gleak.simulate.images import ClientConfig, simulate_client  # noqa: E402

OUT = ROOT / "bench" / "results"
CLIENT, AUX = ROOT / "samples/data/mnist_client.safetensors", ROOT / "samples/data/mnist_aux.safetensors"
SIMILARITY_NAMES = ("ncc", "ssim", "lpips", "mse")
SEEDS = 5
ITERATIONS = (10, 50, 200, 2000)
SIGMAS = (0.1, 0.2, 0.4, 0.8)


class HeadCNN(nn.Module):
    """A user's small CNN with BatchNorm whose classifier is called ``head``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class LeNetBN(nn.Module):
    """Another user's BatchNorm CNN: LeNet-like strided 5×5 convolutions, flattened into ``fc``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, stride in ((1, 2), (12, 2), (12, 1)):
            layers += [nn.Conv2d(c_in, 12, 5, padding=2, stride=stride), nn.BatchNorm2d(12), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(12 * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


class PooledCNN(nn.Module):
    """Another user's BatchNorm CNN: three convolutions, global average pooling, ``classifier``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for c_in, c_out in ((1, 32), (32, 64), (64, 64)):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, stride=1 if c_in == 1 else 2), nn.BatchNorm2d(c_out),
                       nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.body(x).mean((2, 3)))


def loaded(model: nn.Module, name: str) -> LoadedModel:
    return LoadedModel(model, name, None, {}, (1, 28, 28), tensors_sha256(model.state_dict()), {})


def noise_control(capture: Capture, seed: int = 5) -> Capture:
    """The capture with every tensor replaced by Gaussian noise of its own spread (the same metadata)."""
    out = copy.deepcopy(capture)
    gen = torch.Generator().manual_seed(seed)
    out.tensors = {k: torch.randn(v.shape, generator=gen) * float(v.float().std()) for k, v in capture.tensors.items()}
    return out


# ------------------------------------------------------------------------------------------------ graded set
def spearman(order: list[float], values: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(order, values).statistic)


def graded(aux: Dataset, client: Dataset, lpips: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = HeadCNN()
    capture, truth = simulate_client(model, client, ClientConfig(batch_size=16, seed=1))
    ctx = build_context(capture, loaded(model, "head-cnn"), aux)
    true = to_pixels(ctx, truth.inputs)
    labels = truth.labels.tolist()
    gen = torch.Generator().manual_seed(0)
    levels: dict[str, torch.Tensor] = {"true images": true}
    for sigma in SIGMAS:
        levels[f"noise σ = {sigma:g}"] = (true + sigma * torch.randn(true.shape, generator=gen)).clamp(0, 1)
    for steps in reversed(ITERATIONS):
        attack = get_attack("ig", "reconstruct")
        attack.configure({"iterations": steps})
        done = reconstruct(ctx, attack, "auto", truth, lpips="off")
        assert done.images is not None
        levels[f"ig, {steps} steps"] = done.images
    levels["pure noise"] = torch.rand(true.shape, generator=gen)
    levels["aux mean image"] = aux.images.mean(0, keepdim=True).expand_as(true).clone()
    used = set(int(i) for i in torch.nonzero((client.images.flatten(1)[:, None, :] == true.flatten(1)[None]).all(-1))
               [:, 0].tolist())
    other = []
    for j, c in enumerate(labels):
        pool = [int(i) for i in torch.nonzero(client.labels == c).flatten().tolist() if int(i) not in used]
        other.append(client.images[pool[j % len(pool)]])
    levels["another digit of the class"] = torch.stack(other)
    # the order a person gives: graded along two chains; the null images tie at the bottom
    noise_chain = ["true images", *(f"noise σ = {s:g}" for s in SIGMAS)]
    iter_chain = ["true images", *(f"ig, {s} steps" for s in reversed(ITERATIONS))]
    nulls = ["pure noise", "aux mean image", "another digit of the class"]
    rows: dict[str, dict[str, float]] = {}
    for name, images in levels.items():
        scores = image_scores(images, true, lpips)
        row = {"psnr": scores["mean"]["psnr"], "ssim": scores["mean"]["ssim"],
               "lpips": scores["mean"].get("lpips", float("nan"))}
        for sim in SIMILARITY_NAMES:
            rates = [identify(images, true, draw_distractors(true, labels, aux.images, aux.labels, 9, seed), sim,
                              lpips).rate for seed in range(SEEDS)]
            row[f"id_{sim}"] = statistics.fmean(rates)
        rows[name] = row
        print(f"  {name:28s} " + " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    metrics = ["psnr", "ssim", "lpips", *(f"id_{s}" for s in SIMILARITY_NAMES)]
    sign = {"lpips": -1.0}
    rho: dict[str, dict[str, float]] = {}
    wrong: dict[str, list[str]] = {}
    for chain_name, chain in (("noise", noise_chain), ("iterations", iter_chain)):
        names = chain + nulls
        order = [float(len(chain) - i) for i in range(len(chain))] + [0.0] * len(nulls)
        for m in metrics:
            values = [sign.get(m, 1.0) * rows[n][m] for n in names]
            rho.setdefault(m, {})[chain_name] = spearman(order, values)
            for i, a in enumerate(names):
                for j, b in enumerate(names):
                    if order[i] > order[j] and values[i] < values[j]:
                        pair = f"{b} above {a}"
                        if pair not in wrong.setdefault(m, []):
                            wrong[m].append(pair)
    # pictures: a few digits at every level; the lineups of the 200-step reconstruction
    shown = [levels[n][:8] for n in levels]
    (OUT / "images-graded-levels.png").write_bytes(png_bytes(grid(shown, per_row=8)))
    recon = levels["ig, 200 steps"]
    drawn = draw_distractors(true, labels, aux.images, aux.labels, 9, 0)
    ident = identify(recon, true, drawn)
    (OUT / "images-graded-lineup.png").write_bytes(png_bytes(lineup_picture(recon, true, drawn.images, ident.matched,
                                                                            ident.scores, rows=8)))
    return {"levels": rows, "spearman": rho, "misordered": wrong, "order": {"noise": noise_chain,
                                                                          "iterations": iter_chain, "null": nulls}}


def _chart(rows: dict[str, dict[str, float]], names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, left = plt.subplots(figsize=(9, 4.2))
    x = list(range(len(names)))
    left.plot(x, [rows[n]["id_ncc"] for n in names], "o-", color="tab:green", label="identification (ncc)")
    left.axhline(0.1, color="tab:green", ls=":", lw=1, label="chance (1 / 10)")
    left.set_ylabel("identification rate")
    left.set_ylim(-0.02, 1.02)
    right = left.twinx()
    right.plot(x, [rows[n]["psnr"] for n in names], "s--", color="tab:red", label="PSNR (dB)")
    right.set_ylabel("PSNR (dB)")
    left.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
    title = "Graded set: identification follows the known order, PSNR does not"
    left.set_title(title)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles, [str(h.get_label()) for h in handles], loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "images-graded.png", dpi=110, metadata={"Title": title,
                                                               "Description": "identification rate and PSNR per level "
                                                               "of the graded set (bench/images.py)"})
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ BN CNN cases
CASES = {"head-cnn": HeadCNN, "lenet-bn": LeNetBN, "pooled-cnn": PooledCNN}


def case_captures(client: Dataset, batch_seed: int = 1) -> dict[str, tuple[nn.Module, Capture, Truth]]:
    out = {}
    for name, factory in CASES.items():
        torch.manual_seed(0)
        model = factory()
        capture, truth = simulate_client(model, client, ClientConfig(batch_size=16, seed=batch_seed))
        out[name] = (model, capture, truth)
    return out


def bncnn(aux: Dataset, client: Dataset, folder: Path) -> dict[str, Any]:
    """One audit over every case and its noise control, with truth (files on disk, as a user audits)."""
    folder.mkdir(parents=True, exist_ok=True)
    models = []
    for name, (model, capture, truth) in case_captures(client).items():
        for label, cap in ((name, capture), (f"{name}-noise-control", noise_control(capture))):
            path = folder / f"{label}.safetensors"
            save_capture(cap, path, force=True, truth=truth)
        models.append((folder / f"{name}.model", loaded(model, name)))
    config = AuditConfig(budget="standard", lpips="alex")
    out: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        if path.name.endswith(".truth.safetensors"):
            continue
        report, findings, _ = audit_capture(path, ModelSet(models), [(AUX, aux)], config, folder / "audit")
        entry = next(a for a in report.attacks if a.task == "reconstruct")
        images = [f for f in findings if f.rule == "GLEAK-IMAGES"]
        out[path.stem] = {"identification": entry.identification, "scores": entry.scores,
                          "finding": images[0].severity if images else None,
                          "title": images[0].title if images else None, "artifacts": entry.artifacts}
        print(f"  {path.stem:28s} {out[path.stem]['finding']} {entry.scores}", flush=True)
    return out


def expected(aux: Dataset, client: Dataset, batches: int = 5) -> dict[str, Any]:
    """Per case and client batch: the identification with truth vs the expectation without it."""
    from gleak.runs.audit.expected import expected_images
    from gleak.runs.scoring import identification_of

    config = AuditConfig(budget="standard", lpips="off", confidence=0)
    rows = []
    for b in range(batches):
        for name, (model, capture, truth) in case_captures(client, batch_seed=1 + b).items():
            ctx = build_context(capture, loaded(model, name), aux)
            attack = get_attack("ig", "reconstruct")
            attack.configure({"iterations": 500})
            done = reconstruct(ctx, attack, "auto", truth, lpips="off")
            assert done.images is not None and done.truth_pixels is not None
            found = identification_of(ctx, done.images, done.truth_pixels, truth, 9, 0)
            assert found is not None
            measured = found[0]
            exp, why = expected_images(ctx, config, "ig", {"iterations": 500})
            assert exp is not None, why
            lo, hi = exp["predicted"]
            rows.append({"case": name, "batch": b, "measured": measured.rate, "expected": exp["rate"],
                         "interval": exp["interval"], "predicted": exp["predicted"],
                         "covered": lo <= measured.rate <= hi})
            print(f"  {name} batch {b}: measured {measured.rate:.3f}, expected {exp['rate']:.3f} "
                  f"predicted [{lo:.2f}, {hi:.2f}]", flush=True)
    return {"rows": rows, "coverage": sum(r["covered"] for r in rows) / len(rows)}


def timing(aux: Dataset, client: Dataset, repeats: int = 3) -> dict[str, Any]:
    model, capture, truth = case_captures(client)["head-cnn"]
    config = AuditConfig(budget="standard", lpips="alex")
    out: dict[str, Any] = {}
    for label, given in (("with truth", truth), ("without truth, --aux", None)):
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            report, _, _ = audit_loaded(capture, loaded(model, "head-cnn"), [(AUX, aux)], config, given)
            times.append(time.perf_counter() - started)
        out[label] = {"min": min(times), "median": statistics.median(times), "stages": report.stage_seconds}
        print(f"  {label}: min {min(times):.1f} s, median {statistics.median(times):.1f} s", flush=True)
    return out


# ------------------------------------------------------------------------------------------------ report
def write(results: dict[str, Any]) -> None:
    lines = ["# Image findings against what people see", "",
             "`python bench/images.py` (one torch thread; " + time.strftime("%Y-%m-%d") + "). Protocol: the module "
             "docstring of bench/images.py; the metric: docs/audit.md#image-findings.", ""]
    g = results.get("graded")
    if g:
        _chart(g["levels"], list(g["levels"]))
        lines += ["## Graded set (16 MNIST digits, lineups of 10, 5 distractor draws)", "",
                  "| level | PSNR dB | SSIM | LPIPS | id ncc | id ssim | id lpips | id mse |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, row in g["levels"].items():
            lines.append(f"| {name} | {row['psnr']:.2f} | {row['ssim']:.3f} | {row['lpips']:.3f} | {row['id_ncc']:.2f}"
                         f" | {row['id_ssim']:.2f} | {row['id_lpips']:.2f} | {row['id_mse']:.2f} |")
        lines += ["", "Spearman's ρ against the known order (chain from the true images down, the three null images "
                  "tied at the bottom; LPIPS negated):", "", "| metric | noise chain | iterations chain |",
                  "|---|---|---|"]
        for m, by in g["spearman"].items():
            lines.append(f"| {m} | {by['noise']:.3f} | {by['iterations']:.3f} |")
        lines += ["", "Pairs each metric orders the wrong way round (a level that carries less of the image scored "
                  "above one that carries more):", ""]
        for m, pairs in g["misordered"].items():
            lines.append(f"- **{m}** ({len(pairs)}): " + ("; ".join(pairs) if pairs else "none"))
        lines += ["", "![Identification rate and PSNR per level](images-graded.png)", "",
                  "Eight digits per level, top to bottom in the table's order:", "",
                  "![The graded levels](images-graded-levels.png)", "",
                  "Lineups of the 200-step reconstruction (first column: the reconstruction; then the candidates "
                  "from most to least similar; green frame: the true image picked first; blue: the true image when "
                  "a distractor, framed red, beat it):", "", "![Lineups](images-graded-lineup.png)", ""]
    b = results.get("bncnn")
    if b:
        lines += ["## BatchNorm CNNs, FedSGD in train mode, B = 16 (one audit, standard budget, with truth)", "",
                  "| capture | identification | interval | PSNR dB | SSIM | LPIPS | GLEAK-IMAGES |",
                  "|---|---|---|---|---|---|---|"]
        for name, row in b.items():
            ident, s = row["identification"] or {}, row["scores"] or {}
            nan = float("nan")
            lines.append(f"| {name} | {ident.get('identified', 0):g} of {ident.get('n', 0)} "
                         f"({ident.get('rate', 0):.2f}) | {ident.get('interval')} | {s.get('psnr') or nan:.2f} | "
                         f"{s.get('ssim') or nan:.3f} | "
                         f"{s.get('lpips') or float('nan'):.3f} | {row['finding'] or 'none'} |")
        lines += ["", "![Lineups of the head-cnn capture](images-bncnn-lineup.png)", ""]
    e = results.get("expected")
    if e:
        lines += ["## Expected image leakage without truth (standard budget: 2 twin batches)", "",
                  "| case | batch | measured with truth | expected | 95 % interval | one batch predicted | covered |",
                  "|---|---|---|---|---|---|---|"]
        for r in e["rows"]:
            lines.append(f"| {r['case']} | {r['batch']} | {r['measured']:.3f} | {r['expected']:.3f} | "
                         f"{r['interval']} | "
                         f"{r['predicted']} | {'yes' if r['covered'] else 'no'} |")
        lines += ["", f"Coverage: {e['coverage']:.0%} of {len(e['rows'])} batches.", ""]
    t = results.get("time")
    if t:
        lines += ["## Time: standard-budget audit of one B = 16 capture (head-cnn, one thread)", "",
                  "| run | min s | median s | stages (last run) |", "|---|---|---|---|"]
        for label, row in t.items():
            stages = ", ".join(f"{k} {v:.1f}" for k, v in (row["stages"] or {}).items())
            lines.append(f"| {label} | {row['min']:.1f} | {row['median']:.1f} | {stages} |")
        lines.append("")
    (OUT / "images.md").write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("graded", "bncnn", "expected", "time"))
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    aux, client = load_dataset(AUX), load_dataset(CLIENT)
    lpips = load_lpips("alex")
    path = OUT / "images.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() and args.only else {}
    if args.only in (None, "graded"):
        print("graded set", flush=True)
        results["graded"] = graded(aux, client, lpips)
    if args.only in (None, "bncnn"):
        print("BatchNorm CNN cases", flush=True)
        results["bncnn"] = bncnn(aux, client, Path("/tmp/gleak-bench-images"))
        art = results["bncnn"]["head-cnn"]["artifacts"]
        lineup = next((Path("/tmp/gleak-bench-images/audit") / a for a in art if a.endswith("_lineup.png")), None)
        if lineup is not None:
            (OUT / "images-bncnn-lineup.png").write_bytes(lineup.read_bytes())
    if args.only in (None, "expected"):
        print("expected leakage without truth", flush=True)
        results["expected"] = expected(aux, client, args.batches)
    if args.only in (None, "time"):
        print("time", flush=True)
        results["time"] = timing(aux, client)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    write(results)


if __name__ == "__main__":
    main()
