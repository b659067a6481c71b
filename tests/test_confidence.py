"""Calibrated confidence for label attacks (gleak.attacks.labels.confidence): the conformal rule, coverage of the
90 % intervals on real held-out MNIST batches of a trained model, and the CLI's report."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from gleak.attacks import build_context, run_attack
from gleak.attacks.labels.confidence import CalibrationCache, calibrate, conformal_half_width
from gleak.attacks.plan import select_attacks
from gleak.data.images import load_dataset
from gleak.metrics.labels import truth_counts
from gleak.models import load_model
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import FEDSGD, LENET, MNIST_AUX, SAMPLES


def test_conformal_half_width_is_the_split_conformal_quantile() -> None:
    errors = list(range(10))  # 0 … 9
    assert conformal_half_width(errors, 0.9) == 9  # ⌈11 · 0.9⌉ = 10th smallest
    assert conformal_half_width(errors, 0.5) == 5  # ⌈11 · 0.5⌉ = 6th smallest
    assert conformal_half_width([0] * 50 + [3] * 2, 0.9) == 0


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_intervals_cover_the_truth_on_real_batches_of_a_trained_model() -> None:
    """The 82 % LeNet-5, B = 32: calibrated on batches simulated from the aux digits (MNIST validation split),
    checked on 12 batches of the client digits (MNIST test split), half uniform, half Dirichlet(0.5)."""
    torch.manual_seed(0)
    model = load_model(SAMPLES / "models" / "lenet_mnist80.safetensors")
    aux, client = load_dataset(MNIST_AUX), load_dataset(SAMPLES / "data" / "mnist_client.safetensors")
    attacks = select_attacks("labels", ["zlg-plus", "rlu"])
    cache = CalibrationCache()
    covered: dict[str, list[bool]] = {a.name: [] for a in attacks}
    calibration = {}
    for i in range(12):
        cap, truth = simulate_client(model.module, client, ClientConfig(
            batch_size=32, composition="dirichlet" if i % 2 else "uniform", seed=900 + i))
        ctx = build_context(cap, model, aux)
        calibration, why = calibrate(ctx, attacks, simulations=16, cache=cache)
        assert why is None and set(calibration) == {"zlg-plus", "rlu"}
        true = truth_counts(truth.labels, 10).tolist()
        for attack in attacks:
            counts = run_attack(attack, ctx).labels.counts
            intervals = calibration[attack.name].intervals(counts, 32)
            covered[attack.name] += [lo <= n <= hi for (lo, hi), n in zip(intervals, true, strict=True)]
    assert len(cache) == 1  # one model, one setting: calibrated once
    for name, hits in covered.items():
        coverage = statistics.fmean(hits)
        assert 0.8 <= coverage <= 1.0, (name, coverage)  # nominal 0.9, ±10 points
        assert calibration[name].half_width < 32  # and the intervals say something


def test_an_untrained_model_gets_exact_intervals_and_the_cli_reports_them(gleak) -> None:
    r = gleak("labels", FEDSGD, "-M", LENET, "--aux", MNIST_AUX, "-a", "rlu", "-a", "llg", "--confidence", "8",
              "--format", "json")
    assert r.exit_code == 0, r.stderr
    results = {x["attack"]: x for x in json.loads(r.stdout)["results"]}
    rlu = results["rlu"]["confidence"]
    assert rlu["calibrated"] and rlu["informative"] and rlu["half_width"] == 0 and rlu["expected_iacc"] == 1.0
    assert [lo for lo, _ in rlu["intervals"]] == results["rlu"]["counts"]
    no_aux = gleak("labels", FEDSGD, "-M", LENET, "-a", "llg", "--confidence", "8", "--format", "json")
    conf = json.loads(no_aux.stdout)["results"][0]["confidence"]
    assert conf == {"calibrated": False, "reason": "not calibrated: needs auxiliary data (--aux) to simulate "
                    "batches like the client's"}


@pytest.mark.parametrize("value", ["-1", "x"])
def test_bad_confidence_values_are_usage_errors(gleak, value: str) -> None:
    r = gleak("labels", FEDSGD, "-M", LENET, "--confidence", value)
    assert r.exit_code == 2 and "--confidence" in r.stderr


def test_the_calibrated_selector_picks_an_informative_attack_and_recovers_the_labels(gleak) -> None:
    from gleak.attacks.plan import select_attacks

    assert "calibrated" not in [a.name for a in select_attacks("labels", None)]  # only on request: it is slow
    r = gleak("labels", FEDSGD, "-M", LENET, "--aux", MNIST_AUX, "-a", "calibrated", "-O", "calibrated.simulations=8",
              "--format", "json")
    assert r.exit_code == 0, r.stderr
    (result,) = json.loads(r.stdout)["results"]
    assert result["status"] == "ok" and result["scores"]["iacc"] == 1.0  # untrained LeNet-5, B = 32: exact
    diag = result["diagnostics"]
    assert diag["expected_iacc"] == diag["expected_iacc_by_attack"][diag["chosen"]]
    assert diag["worst_margin_over_chance"] > 0.2  # beats chance on uniform and on skewed batches


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_the_calibrated_selector_abstains_where_no_attack_beats_chance() -> None:
    """The 98.7 % LeNet-5, m = 5 SGD steps of B = 32 with uniform labels: chance iAcc is about 0.87 and rlu (the only
    attack for multi-step updates) scores about 0.40 (bench/labels.py --suite trained). No guess is returned: the
    selector abstains, with the best candidate's margin over chance on each composition."""
    from gleak.attacks import get_attack

    model = load_model(SAMPLES / "models" / "lenet_mnist98.safetensors")
    aux, client = load_dataset(MNIST_AUX), load_dataset(SAMPLES / "data" / "mnist_client.safetensors")
    cap, _ = simulate_client(model.module, client, ClientConfig(batch_size=32, scheme="fedavg", local_steps=5, seed=3))
    attack = get_attack("calibrated")
    attack.configure({"simulations": 8})
    result = run_attack(attack, build_context(cap, model, aux))
    assert result.status == "abstained" and result.output is None, (result.status, result.reason)
    assert "no label attack beats chance on both compositions" in (result.reason or ""), result.reason
    conf = result.confidence or {}
    assert conf["calibrated"] and not conf["informative"] and "worst-case margin" in (result.reason or "")
    by = conf["by_composition"]
    assert set(by) == {"uniform", "dirichlet"} and not all(m["beats_chance"] for m in by.values())
    assert conf["composition"] == min(by, key=lambda n: by[n]["margin"]) and conf["worst_margin"] < 0.05
    assert by["uniform"]["chance_iacc"] > 0.85 > 0.6 > by["dirichlet"]["chance_iacc"]  # m·B = 160: 0.87 vs 0.54
