"""Label-recovery benchmark on the shipped MNIST data: iAcc / cAcc / time per attack and setting.

    python bench/labels.py                 # full sweep, 20 trials per setting (a few minutes on 2 cores)
    python bench/labels.py --trials 5      # quicker
    python bench/labels.py --speed         # only the C = 1000, d = 2048 timing of the analytic attacks
    python bench/labels.py --suite updates # one suite: gradients, updates, losses, aux
    python bench/labels.py --suite trained # trained models (≈50/80/90/98 %): B 8/32/128, gradients and  (hours)
                                           # m = 1/5/10 SGD and momentum updates, uniform and Dirichlet(0.5)

Every trial draws a fresh untrained model (its own seed) and a fresh client batch from
``samples/data/mnist_client.safetensors``; auxiliary statistics come from ``samples/data/mnist_aux``.
The trained row uses ``samples/models/lenet_mnist80.safetensors`` (82 % test accuracy). Results are printed
and written as Markdown to ``bench/results/labels.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.attacks import build_context, get_attack, run_attack  # noqa: E402
from gleak.attacks.plan import select_attacks  # noqa: E402
from gleak.capture import capture_gradients  # noqa: E402
from gleak.data.images import load_dataset  # noqa: E402
from gleak.metrics.labels import chance_scores, label_scores, truth_counts  # noqa: E402
from gleak.models import LoadedModel, build_zoo_model, load_model  # noqa: E402
from gleak.simulate.images import ClientConfig, simulate_client  # noqa: E402

ATTACKS = ["idlg", "llg", "llg-star", "llg-plus", "ilrg", "zlg", "zlg-plus", "posterior", "rlu"]


@dataclass(frozen=True)
class ModelSpec:
    label: str
    arch: str
    kwargs: dict
    trained_file: str | None = None
    loaded: LoadedModel | None = None  # a model trained by this script (the trained suite)

    def build(self, seed: int) -> LoadedModel:
        if self.loaded is not None:
            return self.loaded
        if self.trained_file:
            return load_model(ROOT / self.trained_file)
        torch.manual_seed(seed)
        return LoadedModel(build_zoo_model(self.arch, **self.kwargs).eval(), "bench", self.arch, self.kwargs,
                           (1, 28, 28), "", {})


MODELS = [
    ModelSpec("LeNet-5 relu", "lenet", {"activation": "relu"}),
    ModelSpec("LeNet-5 sigmoid", "lenet", {"activation": "sigmoid"}),
    ModelSpec("LeNet-5 tanh", "lenet", {"activation": "tanh"}),
    ModelSpec("iDLG CNN sigmoid", "idlg-cnn", {}),
    ModelSpec("LeNet-5 relu, 82% trained", "lenet", {}, "samples/models/lenet_mnist80.safetensors"),
]
SETTINGS = [(1, "uniform"), (8, "uniform"), (8, "unique"), (8, "unbalanced"), (32, "uniform"),
            (32, "unbalanced"), (128, "uniform"), (128, "unbalanced")]


def accuracy(model: nn.Module, data) -> float:  # type: ignore[no-untyped-def]
    x, y = data.batch(range(len(data)))
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean())


def train_to(model: nn.Module, train, test, target: float, lr: float, seed: int = 0) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """SGD (momentum 0.9, batches of 64) on ``train`` until ``test`` accuracy reaches ``target``."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(1, 20_000):
        x, y = train.batch(torch.randint(len(train), (64,), generator=gen))
        model.train()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if accuracy(model, test) >= target:
            return accuracy(model, test), step
    return accuracy(model, test), step


def trained_models(train, aux) -> list[ModelSpec]:  # type: ignore[no-untyped-def]
    """≈50 % and ≈90 % LeNet-5s trained here on one half of the shipped client data (batches come from the other
    half), and the shipped 82 % and 98.7 % models (trained on MNIST's 50k training images); accuracy on the
    shipped aux digits (MNIST's validation split), which no model trained on."""
    specs = []
    torch.manual_seed(0)
    model = build_zoo_model("lenet", activation="relu")
    for target, lr in ((0.50, 0.003), (0.90, 0.02)):
        acc, steps = train_to(model, train, aux, target, lr)
        copy = build_zoo_model("lenet", activation="relu")
        copy.load_state_dict(model.state_dict())
        copy.eval()
        loaded = LoadedModel(copy, "bench", "lenet", {"activation": "relu"}, (1, 28, 28), "", {})
        specs.append(ModelSpec(f"LeNet-5 {100 * acc:.0f}% (here, {steps} steps)", "lenet", {}, loaded=loaded))
        print(f"trained a LeNet-5 to {acc:.3f} on the aux digits in {steps} steps", flush=True)
    for name in ("lenet_mnist80", "lenet_mnist98"):
        loaded = load_model(ROOT / f"samples/models/{name}.safetensors")
        specs.append(ModelSpec(f"LeNet-5 {100 * accuracy(loaded.module, aux):.0f}% (shipped {name})", "lenet", {},
                               loaded=loaded))
    return sorted(specs, key=lambda s: s.label)


TRAINED_KINDS = [("gradient", {}), ("m=1 SGD", {"scheme": "fedavg"}),
                 ("m=5 SGD", {"scheme": "fedavg", "local_steps": 5}),
                 ("m=10 SGD", {"scheme": "fedavg", "local_steps": 10}),
                 ("m=1 momentum", {"scheme": "fedavg", "optimizer": "sgdm"}),
                 ("m=5 momentum", {"scheme": "fedavg", "local_steps": 5, "optimizer": "sgdm"}),
                 ("m=10 momentum", {"scheme": "fedavg", "local_steps": 10, "optimizer": "sgdm"})]


def run_setting(label: str, spec: ModelSpec, config: dict, trials: int, client, aux, attacks,
                simulations: int = 0) -> dict:
    """``trials`` fresh (model, batch) draws of one setting; mean ± std of iAcc, cAcc and time per attack.

    With ``simulations`` (the trained suite's --calibrate), each attack is also calibrated once for the setting
    (gleak.attacks.labels.confidence, seed 0) and every trial records whether its 90 % intervals hold the true
    counts, and what the calibrated selector (``-a calibrated``) would return: the informative attack with the best
    worst-case margin, or a refusal."""
    from gleak.attacks.labels.confidence import best_informative, calibrate

    scores: dict[str, list[dict]] = {a.name: [] for a in attacks}
    chance = []
    cache: dict = {}
    covered: dict[str, list[bool]] = {a.name: [] for a in attacks}
    covered["stacked"] = []
    picks: list[float | None] = []
    stacked: list[float] = []
    for t in range(trials):
        model = spec.build(seed=t)
        cap, truth = simulate_client(model.module, client, ClientConfig(**config, seed=10_000 + t))
        ctx = build_context(cap, model, aux, seed=t)
        counts = truth_counts(truth.labels, ctx.num_classes)
        chance.append(chance_scores(counts)["iacc"])
        found: dict[str, torch.Tensor] = {}
        for attack in attacks:
            result = run_attack(attack, ctx)
            if result.status != "ok":
                continue
            found[attack.name] = result.output.counts
            s = label_scores(result.output.counts, counts)
            s["seconds"] = result.seconds
            s["warned"] = bool(result.warnings)
            scores[attack.name].append(s)
        if simulations:
            conf, _ = calibrate(ctx, [a for a in attacks if a.not_applicable(ctx) is None], simulations=simulations,
                                seed=0, cache=cache, stack=True)
            if "stacked" in conf and conf["stacked"].stack is not None:
                found["stacked"] = conf["stacked"].stack.counts_for(ctx, found)
                stacked.append(label_scores(found["stacked"], counts)["iacc"])
            for name, c in conf.items():
                if name in found:
                    intervals = c.intervals(found[name], ctx.total_examples or 0)
                    covered[name] += [lo <= n <= hi for (lo, hi), n in zip(intervals, counts.tolist(), strict=True)]
            choice = best_informative({n: c.to_json() for n, c in conf.items() if n in found})
            picks.append(label_scores(found[choice], counts)["iacc"] if choice is not None else None)
    row = {"model": spec.label, "setting": label, "chance": statistics.mean(chance)}
    if simulations:
        kept = [p for p in picks if p is not None]
        row["calibrated"] = {"iacc": statistics.mean(kept) if kept else None, "refused": len(picks) - len(kept),
                             "trials": len(picks)}
        row["coverage"] = {n: statistics.mean(v) for n, v in covered.items() if v}
        row["stacked"] = statistics.mean(stacked) if stacked else None
    for name, values in scores.items():
        if values:
            row[name] = {k: (statistics.mean(v[k] for v in values), statistics.pstdev(v[k] for v in values))
                         for k in ("iacc", "cacc", "seconds")}
            row[name]["warned"] = any(v["warned"] for v in values)
        else:
            row[name] = None
    print(format_row(row), flush=True)
    return row


def suites(trials: int, which: str, only: str | None = None, simulations: int = 0) -> dict[str, list[dict]]:
    client = load_dataset(ROOT / "samples/data/mnist_client.safetensors")
    aux = load_dataset(ROOT / "samples/data/mnist_aux.safetensors")
    aux100 = aux.subset(torch.cat([torch.nonzero(aux.labels == c).flatten()[:100] for c in range(10)]))
    aux10 = aux.subset(torch.cat([torch.nonzero(aux.labels == c).flatten()[:10] for c in range(10)]))
    attacks = select_attacks("labels", ATTACKS)
    out: dict[str, list[dict]] = {}
    if which in ("all", "gradients"):
        out["gradients (FedSGD, one step)"] = [
            run_setting(f"B={b} {comp}", spec, {"batch_size": b, "composition": comp}, trials, client, aux100, attacks)
            for spec in MODELS for b, comp in SETTINGS]
    relu, trained = MODELS[0], MODELS[4]
    if which in ("all", "updates"):
        updates = [("m=1 SGD update", relu, {"scheme": "fedavg"}),
                   ("m=10 SGD", relu, {"scheme": "fedavg", "local_steps": 10}),
                   ("m=10 SGD momentum 0.9", relu, {"scheme": "fedavg", "local_steps": 10, "optimizer": "sgdm"}),
                   ("m=10 Nesterov 0.9", relu, {"scheme": "fedavg", "local_steps": 10, "optimizer": "nag"}),
                   ("m=10 FedProx μ=0.5", relu, {"scheme": "fedprox", "local_steps": 10, "mu": 0.5}),
                   ("m=1 SGD update", trained, {"scheme": "fedavg"}),
                   ("m=10 SGD", trained, {"scheme": "fedavg", "local_steps": 10})]
        out["updates (B = 32, lr 0.01)"] = [
            run_setting(label, spec, {"batch_size": 32, **cfg}, trials, client, aux100, attacks)
            for label, spec, cfg in updates]
    if which in ("all", "losses"):
        from gleak.losses import LossSpec

        losses = [("cross-entropy", LossSpec()), ("focal γ=2", LossSpec(name="focal", focal_gamma=2.0)),
                  ("τ=0.8", LossSpec(temperature=0.8)), ("τ=1.2", LossSpec(temperature=1.2)),
                  ("ε=0.1", LossSpec(label_smoothing=0.1)), ("ε=0.25", LossSpec(label_smoothing=0.25))]
        out["losses (B = 32, one step)"] = [
            run_setting(label, spec, {"batch_size": 32, "loss": loss}, trials, client, aux100, attacks)
            for spec in (MODELS[1], MODELS[2]) for label, loss in losses]
    if which == "trained":  # not part of "all": 168 settings, about 2.5 hours at 20 trials on one core
        order = torch.randperm(len(client), generator=torch.Generator().manual_seed(0))
        train, held_out = client.subset(order[: len(client) // 2]), client.subset(order[len(client) // 2:])
        for spec in trained_models(train, aux):
            if only is not None and not any(part in spec.label for part in only.split(",")):
                continue
            out[f"trained: {spec.label}"] = [
                run_setting(f"B={b} {kind} {comp}", spec, {"batch_size": b, "composition": comp, **cfg}, trials,
                            held_out, aux100, attacks, simulations)
                for b in (8, 32, 128) for kind, cfg in TRAINED_KINDS for comp in ("uniform", "dirichlet")]
    if which in ("all", "aux"):
        rows = []
        for label, cfg in (("B=32 m=1", {"batch_size": 32}),
                           ("B=32 m=10", {"batch_size": 32, "scheme": "fedavg", "local_steps": 10})):
            for name, data in (("aux 100/class", aux100), ("aux 10/class", aux10)):
                rows.append(run_setting(f"{label}, {name}", relu, cfg, trials, client, data, attacks))
        out["auxiliary data size (untrained LeNet-5 relu)"] = rows
    return out


def format_row(row: dict) -> str:
    cells = [f"{row['model']:<26} {row['setting']:<24} chance {row['chance']:.3f}"]
    for name in ATTACKS:
        v = row[name]
        cells.append(f"{name} " + ("n/a" if v is None else f"{v['iacc'][0]:.3f}"))
    return " | ".join(cells)


def markdown(results: dict[str, list[dict]], trials: int, speed: dict[str, float] | None) -> str:
    out = [f"# Label benchmark ({trials} trials per setting, shipped MNIST, mean ± std)", "",
           "Auxiliary data: 100 images per class of `samples/data/mnist_aux` unless the row says otherwise.", ""]
    for title, rows in results.items():
        for metric, name in (("iacc", "iAcc"), ("cacc", "cAcc")):
            out += [f"## {title}: {name}", "", "| model | setting | chance iAcc | " + " | ".join(ATTACKS) + " |",
                    "|---|---|---|" + "---|" * len(ATTACKS)]
            for row in rows:
                cells = []
                for attack in ATTACKS:
                    v = row[attack]
                    if v is None:
                        cells.append("n/a")
                    else:
                        mark = " ⚠" if v["warned"] else ""
                        cells.append(f"{v[metric][0]:.3f} ± {v[metric][1]:.3f}{mark}")
                out.append(f"| {row['model']} | {row['setting']} | {row['chance']:.3f} | " + " | ".join(cells) + " |")
            out.append("")
    rows = [r for rs in results.values() for r in rs]
    out += ["## mean time per attack (ms, over all settings where it ran)", "",
            "| " + " | ".join(ATTACKS) + " |", "|" + "---|" * len(ATTACKS)]
    times = []
    for name in ATTACKS:
        values = [r[name]["seconds"][0] for r in rows if r[name] is not None]
        times.append(f"{1e3 * statistics.mean(values):.2f}" if values else "n/a")
    out += ["| " + " | ".join(times) + " |", ""]
    out.append("⚠ = the attack warned on some trials (e.g. non-negative features assumed but violated by tanh; "
               "an update read as a gradient; a loss the attack's derivation does not cover).")
    calibrated = [r for r in rows if "calibrated" in r]
    if calibrated:
        out += ["", "## the calibrated selector and the 90 % intervals' coverage", "",
                "iAcc of `-a calibrated` over the trials it answered (refusals: no candidate beat chance on both the "
                "uniform and the skewed simulated batches), beside chance, the best single attack and the stacked "
                "combination on every trial; coverage: the share of (trial, class) pairs whose 90 % interval held "
                "the true count, per attack and for the combination (min / max over those calibrated in that "
                "setting).", "",
                "| model | setting | chance | best attack | stacked | calibrated | refused | coverage min | "
                "coverage max |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in calibrated:
            best = max((a for a in ATTACKS if r[a] is not None), key=lambda a: r[a]["iacc"][0], default=None)
            c = r["calibrated"]
            cov = list(r["coverage"].values())
            out.append(f"| {r['model']} | {r['setting']} | {r['chance']:.3f} | "
                       + (f"{best} {r[best]['iacc'][0]:.3f}" if best else "—") + " | "
                       + (f"{r['stacked']:.3f}" if r.get("stacked") is not None else "—") + " | "
                       + (f"{c['iacc']:.3f}" if c["iacc"] is not None else "—") + f" | {c['refused']}/{c['trials']} | "
                       + (f"{min(cov):.3f} | {max(cov):.3f}" if cov else "— | —") + " |")
    if speed:
        out += ["", "## C = 1000, d = 2048 synthetic last layer (median of 20 runs, ms)", "",
                "| " + " | ".join(speed) + " |", "|" + "---|" * len(speed),
                "| " + " | ".join(f"{v * 1e3:.2f}" for v in speed.values()) + " |"]
    return "\n".join(out) + "\n"


def speed_check(repeats: int = 20) -> dict[str, float]:
    """Median wall time of the analytic attacks on a synthetic C = 1000, d = 2048 last layer."""
    torch.manual_seed(0)
    C, d = 1000, 2048
    model = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, C)).eval()
    loaded = LoadedModel(model, "bench", None, {}, (d,), "", {})
    out = {}
    for name, batch in (("idlg", 1), ("llg", 128), ("ilrg", 128)):
        x = torch.randn(batch, d)
        y = torch.randint(0, C, (batch,))
        cap = capture_gradients(model, x, y, metadata={"gleak.input_shape": [d]})
        ctx = build_context(cap, loaded)
        attack = get_attack(name)
        run_attack(attack, ctx)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = run_attack(attack, ctx)
            times.append(time.perf_counter() - start)
        assert result.status == "ok", result.reason
        out[name] = statistics.median(times)
        print(f"{name}: {out[name] * 1e3:.2f} ms (C = {C}, d = {d}, B = {batch})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="gleak label-recovery benchmark")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--speed", action="store_true", help="only the C = 1000 timing")
    parser.add_argument("--suite", default="all",
                        choices=["all", "gradients", "updates", "losses", "aux", "trained"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--calibrate", type=int, default=0, help="trained suite: also calibrate every setting on "
                        "this many simulated contributions (90 %% interval coverage, the calibrated selector)")
    parser.add_argument("--models", default=None, help="trained suite: only models whose label contains one of "
                        "these comma-separated strings (e.g. 51%%,81%%), to split the run across processes")
    args = parser.parse_args()
    speed = speed_check() if args.speed or args.suite == "all" else None
    if args.speed:
        return
    start = time.time()
    results = suites(args.trials, args.suite, args.models, args.calibrate)
    text = markdown(results, args.trials, speed)
    out = args.out or ROOT / f"bench/results/labels{'' if args.suite == 'all' else '-' + args.suite}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"wrote {out} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
