"""Label attacks against ground truth on real MNIST batches, the shared maths, metrics, and `gleak labels`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gleak.attacks import REGISTRY, build_context, get_attack, run_attack
from gleak.attacks.labels.counts import logit_grads, round_counts, row_sums
from gleak.attacks.labels.llg import llg_extract
from gleak.capture import load_capture as load_capture_fn
from gleak.capture import save_capture, save_truth, truth_path_for
from gleak.data.images import load_dataset
from gleak.losses import LossSpec, client_loss
from gleak.metrics.labels import chance_scores, label_scores, truth_counts
from gleak.models import LoadedModel, build_zoo_model, load_model
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import CIFAR, FEDAVG, FEDSGD, LENET, MNIST_AUX, MNIST_CLIENT


@pytest.fixture(scope="module")
def mnist():
    return load_dataset(MNIST_CLIENT)


@pytest.fixture(scope="module")
def aux():
    return load_dataset(MNIST_AUX)


def loaded(activation: str = "relu", seed: int = 0, name: str = "lenet", **kw) -> LoadedModel:
    torch.manual_seed(seed)
    module = build_zoo_model(name, activation=activation, **kw).eval()
    return LoadedModel(module, "test", name, {}, (1, 28, 28), "", {})


def attack_iacc(ctx, name: str, truth) -> float:
    result = run_attack(get_attack(name), ctx)
    assert result.status == "ok", result.reason
    return label_scores(result.output.counts, truth_counts(truth.labels, ctx.num_classes))["iacc"]


# ------------------------------------------------------------------------------------------ shared maths


@settings(max_examples=300, deadline=None)
@given(real=st.lists(st.floats(-5, 60, allow_nan=False), min_size=1, max_size=30), total=st.integers(0, 200))
def test_round_counts_invariants(real: list[float], total: int) -> None:
    n = round_counts(torch.tensor(real), total)
    assert n.dtype == torch.int64 and int(n.sum()) == total and bool((n >= 0).all())


@settings(max_examples=300, deadline=None)
@given(weights=st.lists(st.floats(0, 1), min_size=2, max_size=20), total=st.integers(1, 300))
def test_round_counts_is_largest_remainder_when_sums_match(weights: list[float], total: int) -> None:
    w = np.array(weights) + 1e-9
    real = w / w.sum() * total  # non-negative, sums to total
    n = round_counts(real, total).numpy()
    assert np.all(np.abs(n - real) < 1 + 1e-9)
    assert np.all(n == np.floor(real) + (n > np.floor(real)))  # each entry is floor or floor + 1


def test_round_counts_too_large_and_too_small() -> None:
    assert round_counts(torch.tensor([10.0, 0.0, 0.0]), 4).tolist() == [4, 0, 0]
    assert round_counts(torch.tensor([3.6, 3.6, 0.4]), 5).tolist() == [3, 2, 0] or \
        round_counts(torch.tensor([3.6, 3.6, 0.4]), 5).tolist() == [2, 3, 0]
    assert round_counts(torch.tensor([0.1, 0.1, float("nan")]), 3).sum() == 3
    assert round_counts(torch.tensor([2.0, 1.0, 0.0]), 3).tolist() == [2, 1, 0]


def test_logit_grads_match_autograd_of_each_loss() -> None:
    torch.manual_seed(0)
    z, y = torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 5, (6,))
    for spec in (LossSpec(), LossSpec(name="focal", temperature=0.8), LossSpec(name="bce"),
                 LossSpec(label_smoothing=0.2)):
        zz = z.clone().requires_grad_(True)
        client_loss(zz, y, LossSpec(name=spec.name, reduction="sum", temperature=spec.temperature,
                                    label_smoothing=spec.label_smoothing)).backward()
        assert torch.allclose(logit_grads(z, y, spec), zz.grad)


# ------------------------------------------------------------------------------------------ metrics


def test_label_scores_known_values() -> None:
    s = label_scores([3, 1, 0], [2, 1, 1])
    assert s["iacc"] == pytest.approx(3 / 4) and s["cacc"] == pytest.approx(2 / 3)
    assert s["exact"] == pytest.approx(1 / 3) and s["jaccard_cls"] == pytest.approx(2 / 3)
    assert s["jaccard_ins"] == pytest.approx(3 / 5)


def test_chance_baseline_matches_monte_carlo() -> None:
    truth = torch.tensor([5, 0, 2, 1, 0, 0, 0, 0, 0, 0])
    exact = chance_scores(truth)
    rng = np.random.default_rng(0)
    guesses = rng.multinomial(8, [0.1] * 10, size=20000)
    mc = np.minimum(guesses, truth.numpy()).sum(1).mean() / 8
    assert exact["iacc"] == pytest.approx(mc, abs=0.01)
    assert chance_scores(torch.tensor([0, 1, 0, 0])) ["iacc"] == pytest.approx(0.25)


# ------------------------------------------------------------------------------------------ attacks on real data


def test_attacks_recover_real_mnist_batches(mnist, aux) -> None:
    scores = {name: [] for name in ("ilrg", "llg", "llg-star", "llg-plus", "zlg", "zlg-plus")}
    chance = []
    for seed in range(5):
        model = loaded(seed=seed)
        cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=16, seed=seed))
        ctx = build_context(cap, model, aux, seed=seed)
        for name in scores:
            scores[name].append(attack_iacc(ctx, name, truth))
        chance.append(chance_scores(truth_counts(truth.labels, 10))["iacc"])
    mean = {k: float(np.mean(v)) for k, v in scores.items()}
    assert mean["ilrg"] == 1.0
    assert mean["llg-plus"] >= 0.95 and mean["zlg-plus"] >= 0.95
    assert mean["llg-star"] >= 0.85 and mean["zlg"] >= 0.85
    assert mean["llg"] > np.mean(chance)


def test_unique_labels_ilrg_exact(mnist, aux) -> None:
    for seed in range(3):
        model = loaded(seed=seed)
        cap, _ = simulate_client(model.module, mnist, ClientConfig(batch_size=10, composition="unique", seed=seed))
        result = run_attack(get_attack("ilrg"), build_context(cap, model, aux))
        assert result.output.counts.tolist() == [1] * 10


def test_idlg_single_examples(mnist) -> None:
    model = loaded("sigmoid", init="uniform")
    for seed in range(10):
        cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=1, seed=seed))
        result = run_attack(get_attack("idlg"), build_context(cap, model))
        assert int(result.output.counts.argmax()) == int(truth.labels[0])


def test_one_step_update_is_read_with_the_sign_flipped(mnist, aux) -> None:
    model = loaded(seed=3)
    for optimizer in ("sgd", "nag"):
        cfg = ClientConfig(batch_size=12, scheme="fedavg", optimizer=optimizer, learning_rate=0.05, seed=7,
                           train_mode=False, weight_decay=0.01)
        cap, truth = simulate_client(model.module, mnist, cfg)
        ctx = build_context(cap, model, aux)
        grad_cap, _ = simulate_client(model.module, mnist, ClientConfig(batch_size=12, seed=7, train_mode=False))
        assert torch.allclose(ctx.grad_weight, grad_cap.tensors["fc3.weight"].double(), atol=1e-5)
        for name in ("ilrg", "llg-plus"):
            result = run_attack(get_attack(name), ctx)
            assert any("−Δ/" in w for w in result.warnings)
            assert label_scores(result.output.counts, truth_counts(truth.labels, 10))["iacc"] >= 0.9
    # reading the update as if it were a gradient (the common mistake) breaks iDLG: the sign flips
    cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=1, scheme="fedavg", seed=1))
    naive = int(torch.argmin(row_sums(cap.tensors["fc3.weight"])))
    assert naive != int(truth.labels[0])
    fixed = run_attack(get_attack("idlg"), build_context(cap, model))
    assert int(fixed.output.counts.argmax()) == int(truth.labels[0])


def test_adam_and_multistep_updates_not_applicable(mnist) -> None:
    model = loaded()
    cap, _ = simulate_client(model.module, mnist, ClientConfig(batch_size=4, scheme="fedavg", optimizer="adam"))
    assert "Adam" in run_attack(get_attack("ilrg"), build_context(cap, model)).reason
    cap, _ = simulate_client(model.module, mnist, ClientConfig(batch_size=4, local_steps=3, scheme="fedavg"))
    assert "3 local steps" in run_attack(get_attack("llg"), build_context(cap, model)).reason


def test_tanh_marks_llg_and_ilrg_still_works(mnist, aux) -> None:
    model = loaded("tanh", seed=1)
    cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=32, seed=2))
    ctx = build_context(cap, model, aux)
    llg = run_attack(get_attack("llg-plus"), ctx)
    assert any("non-negative" in w for w in llg.warnings)
    assert attack_iacc(ctx, "ilrg", truth) >= 0.95
    relu_ctx = build_context(*simulate_client(loaded().module, mnist, ClientConfig(batch_size=8))[:1], loaded())
    assert not any("non-negative" in w for w in run_attack(get_attack("llg"), relu_ctx).warnings)


def test_not_applicable_reasons(mnist) -> None:
    torch.manual_seed(0)
    fcn = build_zoo_model("fcn4")
    model = LoadedModel(fcn, "test", "fcn4", {}, (1, 28, 28), "", {})
    cap, _ = simulate_client(fcn, mnist, ClientConfig(batch_size=4))
    ctx = build_context(cap, model)
    assert "needs a bias" in run_attack(get_attack("ilrg"), ctx).reason
    assert "auxiliary" in run_attack(get_attack("llg-plus"), ctx).reason
    assert "B = 4" in run_attack(get_attack("idlg"), ctx).reason
    assert run_attack(get_attack("llg"), ctx).status == "ok"  # bias-free is fine for LLG
    no_model = build_context(cap, None)
    assert "--model" in run_attack(get_attack("llg-star"), no_model).reason
    # names alone would pick layers.4 (64 rows; "fc" sorts first): the recorded C = 10 picks the logits layer
    assert no_model.layer.weight_key == "fc.weight" and "gleak.num_classes = 10" in no_model.layer.reason


def test_llg_extract_algorithm_1() -> None:
    g = torch.tensor([-3.0, 0.5, -2.5, 0.2])
    # negatives 0, 2 -> G = [-2, .5, -1.5, .2]; then argmin picks 0 (-> -1), 2 (-> -0.5), 0 (-> 0)
    assert llg_extract(g, impact=-1.0, offsets=torch.zeros(4), batch_size=5).tolist() == [3, 0, 2, 0]
    # G ← G − s before the greedy step: class 1's positive gradient is explained away as offset, class 3 is not
    assert llg_extract(g, -1.0, torch.tensor([0.0, 2.0, 0.0, -3.0]), 5).tolist() == [2, 1, 2, 0]


# ------------------------------------------------------------------------------------------ CLI


def test_cli_labels_on_shipped_sample(gleak) -> None:
    r = gleak("labels", FEDSGD, "--model", LENET, "--aux", MNIST_AUX, "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert sum(data["truth_counts"]) == 32 and data["chance"]["iacc"] < 0.8
    by = {x["attack"]: x for x in data["results"]}
    assert set(by) == {name for name, cls in REGISTRY.items() if cls.task == "labels" and cls.default}
    assert by["idlg"]["status"] == "not_applicable" and "B = 32" in by["idlg"]["reason"]
    assert by["ilrg"]["scores"]["iacc"] == 1.0 and sum(by["ilrg"]["counts"]) == 32
    assert by["llg-plus"]["scores"]["iacc"] >= 0.95
    table = gleak("labels", FEDSGD, "--model", LENET, "-a", "ilrg", "-a", "llg")
    assert table.exit_code == 0 and "iAcc" in table.stdout and "chance" in table.stdout
    assert "ilrg" in table.stdout and "zlg" not in table.stdout


def test_cli_labels_without_truth_and_output_file(gleak, tmp_path: Path) -> None:
    out = tmp_path / "labels.json"
    r = gleak("labels", FEDSGD, "--model", LENET, "--no-truth", "-o", out)
    assert r.exit_code == 0 and "iAcc" not in r.stdout
    data = json.loads(out.read_text())
    assert data["truth_counts"] is None and all("scores" not in x for x in data["results"])
    again = gleak("labels", FEDSGD, "--model", LENET, "-o", out)
    assert again.exit_code == 2 and "already exists" in again.stderr


def test_cli_labels_multistep_update_says_why(gleak) -> None:
    r = gleak("labels", FEDAVG, "--model", LENET)
    assert r.exit_code == 2
    assert "10 local steps" in r.stdout and "no label attack applies" in r.stderr


def test_cli_labels_bad_inputs(gleak, tmp_path: Path) -> None:
    for args, fragment in (
        (["-a", "nope"], "unknown attack 'nope'"),
        (["--aux", CIFAR], "auxiliary data has inputs [3, 32, 32]"),
        (["--aux", tmp_path / "none.safetensors"], "no such file"),
        (["--truth", tmp_path / "none.safetensors"], "ground-truth file"),
        (["--batch-size", "0"], "must be a finite number ≥ 1"),
        (["--format", "yaml"], "--format must be table or json"),
    ):
        r = gleak("labels", FEDSGD, "--model", LENET, *args)
        assert r.exit_code == 2 and fragment in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_cli_truth_of_other_capture_is_refused(gleak, tmp_path: Path, mnist) -> None:
    model = load_model(LENET).module
    cap, truth = simulate_client(model, mnist, ClientConfig(batch_size=4, seed=1))
    path = save_capture(cap, tmp_path / "c.safetensors")
    save_truth(truth, truth_path_for(path), capture_path=FEDSGD)
    r = gleak("labels", path, "--model", LENET)
    assert r.exit_code == 2 and "different capture" in r.stderr


def test_cli_attacks_lists_registry(gleak) -> None:
    r = gleak("attacks", "--format", "json")
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert set(rows) == set(REGISTRY)
    assert "bias" in rows["ilrg"]["requires"] and "aux data" in rows["llg-plus"]["requires"]
    assert "B = 1" in rows["idlg"]["requires"]


# ------------------------------------------------------------------------------------------ issue 4: posterior, RLU


@pytest.mark.parametrize("loss", [LossSpec(), LossSpec(name="focal", focal_gamma=2.0), LossSpec(temperature=0.8),
                                  LossSpec(label_smoothing=0.25), LossSpec(name="bce")])
def test_posterior_recovers_batches_under_each_loss(mnist, aux, loss) -> None:
    for seed, activation in ((0, "sigmoid"), (1, "tanh")):
        model = loaded(activation, seed=seed)
        cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=32, loss=loss, seed=seed))
        ctx = build_context(cap, model, aux)
        assert ctx.loss == loss  # read from the capture's metadata
        assert attack_iacc(ctx, "posterior", truth) == 1.0


def test_posterior_uses_the_loss_it_is_told(mnist, aux, gleak, tmp_path: Path) -> None:
    model = load_model(LENET)
    cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=32, seed=4,
                                                                    loss=LossSpec(temperature=0.5)))
    path = save_capture(cap, tmp_path / "t.safetensors")
    save_truth(truth, truth_path_for(path), capture_path=path)
    good = json.loads(gleak("labels", path, "-M", LENET, "--aux", MNIST_AUX, "-a", "posterior",
                            "--format", "json").stdout)
    bad = json.loads(gleak("labels", path, "-M", LENET, "--aux", MNIST_AUX, "-a", "posterior", "--temperature",
                           "3.0", "--format", "json").stdout)
    assert good["loss"]["temperature"] == 0.5 and bad["loss"]["temperature"] == 3.0
    assert good["results"][0]["scores"]["iacc"] == 1.0 > bad["results"][0]["scores"]["iacc"]


def test_focal_coefficient_limits() -> None:
    from gleak.attacks.labels.posterior import focal_coefficient

    p = torch.tensor([0.1, 0.5, 1 - 1e-7])
    assert torch.allclose(focal_coefficient(p, 0.0, 1.0, 2.0), torch.full((3,), 0.5, dtype=torch.float64))
    phi = focal_coefficient(p, 2.0, 1.0, 1.0)
    assert bool(torch.isfinite(phi).all()) and phi[2] < 1e-10 and phi[0] > phi[1]


@pytest.mark.parametrize("config", [
    {"scheme": "fedavg"},
    {"scheme": "fedavg", "local_steps": 10},
    {"scheme": "fedavg", "local_steps": 10, "optimizer": "sgdm"},
    {"scheme": "fedprox", "local_steps": 10, "mu": 0.5},
    {"loss": LossSpec(reduction="sum")},  # a sum-reduced gradient: u is divided by B once, not twice
    {"scheme": "fedavg", "loss": LossSpec(reduction="sum")},
])
def test_rlu_on_updates(mnist, aux, config) -> None:
    scores = []
    for seed in range(3):
        model = loaded(seed=seed)
        cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=32, seed=seed, **config))
        scores.append(attack_iacc(build_context(cap, model, aux), "rlu", truth))
    assert np.mean(scores) >= 0.95, scores


def test_rlu_gls_refinement_helps_on_a_trained_model(mnist, aux) -> None:
    """m = 1 on the 82 %-trained LeNet-5: the GLS refinement (rlu.py item 5) beats the paper's LS counts."""
    model = load_model(LENET.parent / "lenet_mnist80.safetensors")
    refined, ls = [], []
    for seed in range(10):
        cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=32, scheme="fedavg", seed=seed))
        out = run_attack(get_attack("rlu"), build_context(cap, model, aux)).output
        counts = truth_counts(truth.labels, 10)
        refined.append(label_scores(out.counts, counts)["iacc"])
        ls.append(label_scores(out.diagnostics["ls_counts"], counts)["iacc"])
    assert np.mean(refined) > np.mean(ls) + 0.02, (np.mean(refined), np.mean(ls))


def test_rlu_scaffold_needs_and_uses_history(mnist, aux) -> None:
    model = loaded(seed=2)
    cap, truth = simulate_client(model.module, mnist, ClientConfig(batch_size=32, scheme="fedavg", seed=9))
    plain = run_attack(get_attack("rlu"), build_context(cap, model, aux)).output.counts
    h = torch.linspace(-0.02, 0.02, 10, dtype=torch.float64)
    cap.tensors["fc3.bias"] = cap.tensors["fc3.bias"] - h.float()  # Δb = (what SGD did) − h  (Eq. 16)
    cap.meta["gleak.fl.scheme"] = "scaffold"
    assert "gleak.fl.history" in run_attack(get_attack("rlu"), build_context(cap, model, aux)).reason
    cap.meta["gleak.fl.history"] = h.tolist()
    result = run_attack(get_attack("rlu"), build_context(cap, model, aux))
    assert result.status == "ok" and torch.equal(result.output.counts, plain)
    assert label_scores(plain, truth_counts(truth.labels, 10))["iacc"] >= 0.95


def test_rlu_is_seeded_and_needs_aux(mnist, aux) -> None:
    model = loaded(seed=5)
    cap, _ = simulate_client(model.module, mnist, ClientConfig(batch_size=16, local_steps=3, scheme="fedavg"))
    a = run_attack(get_attack("rlu"), build_context(cap, model, aux, seed=1)).output
    b = run_attack(get_attack("rlu"), build_context(cap, model, aux, seed=1)).output
    assert torch.equal(a.counts, b.counts) and torch.equal(a.diagnostics["z"], b.diagnostics["z"])
    assert int(a.counts.sum()) == 48
    assert "auxiliary" in run_attack(get_attack("rlu"), build_context(cap, model)).reason


def test_cli_labels_rlu_on_shipped_fedavg_sample(gleak) -> None:
    r = gleak("labels", FEDAVG, "--model", LENET, "--aux", MNIST_AUX, "--format", "json")
    assert r.exit_code == 0, r.stderr
    by = {x["attack"]: x for x in json.loads(r.stdout)["results"]}
    assert by["rlu"]["status"] == "ok" and sum(by["rlu"]["counts"]) == 320
    assert by["rlu"]["scores"]["iacc"] >= 0.95
    assert "10 local steps" in by["ilrg"]["reason"]


# ------------------------------------------------------------------------------------------ issue 5: soft labels

SMOOTHING = FEDSGD.parent / "smoothing_1.safetensors"
MIXUP = FEDSGD.parent / "mixup_1.safetensors"


def test_softlabel_on_shipped_samples(gleak, tmp_path: Path, monkeypatch) -> None:
    import logging

    monkeypatch.chdir(tmp_path)
    root_handlers = list(logging.getLogger().handlers)
    for path, augmentation in ((SMOOTHING, "smoothing"), (MIXUP, "mixup")):
        r = gleak("labels", path, "--model", LENET, "-a", "softlabel", "--format", "json")
        assert r.exit_code == 0, r.stderr
        data = json.loads(r.stdout)
        result = data["results"][0]
        assert result["diagnostics"]["augmentation"] == augmentation
        assert result["scores"]["soft_success"] == 1.0 and result["scores"]["soft_l1"] < 1e-4
        truth = torch.tensor(data["truth_soft_label"])
        assert torch.allclose(torch.tensor(result["soft_label"]), truth, atol=1e-4)
    assert result["diagnostics"]["ratio"] == pytest.approx(float(truth.max()), abs=1e-4)
    table = gleak("labels", SMOOTHING, "--model", LENET, "-a", "softlabel")
    assert "ε = 0.30000" in table.stdout and "recovered" in table.stdout
    assert not (tmp_path / "report.log").exists()  # pyswarms kept from writing its log file
    assert logging.getLogger().handlers == root_handlers


def test_softlabel_recovers_label_and_feature_with_and_without_bias(mnist) -> None:
    torch.manual_seed(0)
    for name, kwargs in (("lenet", {"activation": "sigmoid", "init": "uniform"}), ("fcn4", {})):
        module = build_zoo_model(name, **kwargs).eval()
        model = LoadedModel(module, "test", name, {}, (1, 28, 28), "", {})
        for seed, cfg in enumerate((ClientConfig(batch_size=1, loss=LossSpec(label_smoothing=0.17), seed=1),
                                    ClientConfig(batch_size=1, mixup=True, mixup_ratio=0.35, seed=2))):
            cap, truth = simulate_client(module, mnist, cfg)
            ctx = build_context(cap, model, seed=seed)
            out = run_attack(get_attack("softlabel"), ctx).output
            assert (out.soft_label - truth.labels[0].double()).abs().sum() < 1e-4, (name, cfg)
            h, _ = ctx.features_and_logits(truth.inputs)
            assert torch.allclose(out.diagnostics["feature"], h[0].double(), rtol=1e-3, atol=1e-5)
    assert ctx.layer.bias is None  # fcn4 is bias-free


def test_softlabel_rank_one_projection_and_noise_weighted_loss(mnist) -> None:
    """A clean single-example ∇W is rank 1 (Wang, Liang & He, ICLR 2024, §3.1): the projection leaves it
    unchanged; with gradient noise (§5.2) the weighted fallback still lands within 1 of the true λ (the
    reference's Table 5 oracle)."""
    from gleak.attacks.labels.softlabel import PseudoLabel, rank_one

    torch.manual_seed(0)
    module = build_zoo_model("lenet", activation="sigmoid", init="uniform").eval()
    model = LoadedModel(module, "test", "lenet", {}, (1, 28, 28), "", {})
    attack = get_attack("softlabel")
    attack.configure({"augmentation": "smoothing"})
    hits = []
    for seed in range(2):  # bench/softlabel.py measures hundreds
        cap, truth = simulate_client(module, mnist, ClientConfig(batch_size=1, seed=seed,
                                                                 loss=LossSpec(label_smoothing=0.1 + 0.1 * seed)))
        clean = build_context(cap, model).grad_weight
        assert torch.allclose(rank_one(clean), clean, atol=1e-12 * float(clean.abs().max()))
        f = PseudoLabel(clean, model.module.fc3.weight.detach(), model.module.fc3.bias.detach(), 0, "smoothing")
        s = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64)
        assert torch.allclose(f.noise_loss(s), (s * f.r.norm()) ** 2 * f.loss(s))
        h, _ = build_context(cap, model).features_and_logits(truth.inputs)
        noisy = cap.tensors["fc3.weight"] + 1e-3 * torch.randn(cap.tensors["fc3.weight"].shape,
                                                               generator=torch.Generator().manual_seed(seed))
        cap.tensors["fc3.weight"] = noisy
        out = run_attack(attack, build_context(cap, model, seed=seed)).output
        g = clean[out.diagnostics["row"]]
        lam_true = float(torch.nanmean(torch.where(g != 0, h[0].double() / g, torch.tensor(float("nan")))))
        hits.append(abs(out.diagnostics["lambda"] - lam_true) < 1)
    assert all(hits), hits


def test_softlabel_zero_gradient_returns_model_prediction() -> None:
    model = load_model(LENET)
    cap = load_capture_fn(SMOOTHING)
    cap.tensors = {k: torch.zeros_like(v) for k, v in cap.tensors.items()}
    out = run_attack(get_attack("softlabel"), build_context(cap, model))
    assert out.status == "ok" and any("zero gradient" in w for w in out.warnings)
    assert out.output.soft_label.max() == 1.0


def test_softlabel_needs_single_sample() -> None:
    ctx = build_context(load_capture_fn(FEDSGD), load_model(LENET))
    assert "B = 32" in run_attack(get_attack("softlabel"), ctx).reason


def test_binomial_pmf_matches_scipy() -> None:
    from scipy.stats import binom

    from gleak.metrics.labels import binomial_pmf

    for n, p in ((0, 0.5), (1, 0.1), (32, 0.1), (128, 0.01), (5000, 0.001)):
        assert np.allclose(binomial_pmf(n, p), binom.pmf(np.arange(n + 1), n, p), rtol=1e-9, atol=1e-15)
