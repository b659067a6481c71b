"""`softlabel` on noisy gradients (issue 26, part 2): the augmentation choice, the noise-aware fit, the confidence.

Noise is σ-relative: every tensor of the capture gets zero-mean Gaussian noise of std σ·RMS(that tensor), the
metadata unchanged (bench/softlabel.py --relative-noise measures the same at scale)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gleak.attacks import build_context, get_attack, run_attack
from gleak.attacks.base import AttackResult
from gleak.capture import Capture, capture_gradients, load_capture, load_truth, truth_path_for
from gleak.data.images import load_dataset
from gleak.losses import LossSpec
from gleak.models import LoadedModel, build_zoo_model, load_model

from .conftest import LENET, MNIST_CLIENT

SMOOTHING = Path(__file__).resolve().parent.parent / "samples/captures/smoothing_1.safetensors"  # ε = 0.3
MIXUP = SMOOTHING.with_name("mixup_1.safetensors")


def add_noise(cap: Capture, sigma: float, seed: int) -> Capture:
    gen = torch.Generator().manual_seed(seed)
    cap.tensors = {k: v + sigma * float(v.double().pow(2).mean().sqrt()) * torch.randn(v.shape, generator=gen,
                                                                                       dtype=v.dtype)
                   for k, v in cap.tensors.items()}
    return cap


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lenet() -> LoadedModel:
    return load_model(LENET)


def attack_shipped(model: LoadedModel, path: Path, sigma: float, seed: int) -> tuple[AttackResult, torch.Tensor]:
    cap = add_noise(load_capture(path), sigma, seed)
    result = run_attack(get_attack("softlabel"), build_context(cap, model, seed=seed))
    assert result.status == "ok", result.reason
    return result, load_truth(truth_path_for(path)).labels[0].double()


def l1(result: AttackResult, truth: torch.Tensor) -> float:
    assert result.output is not None and result.output.soft_label is not None
    return float((result.output.soft_label - truth).abs().sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_smoothing_with_one_percent_noise_is_reported_as_smoothing(lenet: LoadedModel, seed: int) -> None:
    """The issue: the choice always preferred the richer mixup model ("mixup classes [0, 2], ratio 0.889")."""
    result, truth = attack_shipped(lenet, SMOOTHING, 0.01, seed)
    d = result.output.diagnostics
    assert d["augmentation"] == "smoothing" and d["family"] == "smoothing", d["choice"]
    assert "classes" not in d and d["epsilon"] == pytest.approx(0.3, abs=0.05)
    assert l1(result, truth) <= 0.1
    assert not d["exact"] and d["noise"]["detected"] and d["noise"]["relative"] == pytest.approx(0.01, rel=0.2)
    assert any("noisy gradient" in w for w in result.output.warnings)


@pytest.mark.parametrize(("sigma", "seed"), [(0.01, 0), (0.01, 1), (0.1, 0)])
def test_mixup_with_noise_is_still_mixup(lenet: LoadedModel, sigma: float, seed: int) -> None:
    result, truth = attack_shipped(lenet, MIXUP, sigma, seed)
    d = result.output.diagnostics
    assert d["augmentation"] == "mixup", d["choice"]
    assert sorted(d["classes"]) == sorted(torch.topk(truth, 2).indices.tolist())
    assert d["ratio"] == pytest.approx(float(truth.max()), abs=0.05)
    assert l1(result, truth) <= 0.1


def test_confidence_is_lower_under_noise(lenet: LoadedModel) -> None:
    for path in (SMOOTHING, MIXUP):
        clean, truth = attack_shipped(lenet, path, 0.0, 0)
        noisy, _ = attack_shipped(lenet, path, 0.1, 0)
        c, n = clean.output.diagnostics, noisy.output.diagnostics
        assert c["exact"] and not n["exact"]
        assert 0.999 <= c["confidence"] <= 1.0 and 0.0 <= n["confidence"] < c["confidence"]
        assert n["l1_error_bound"] > c["l1_error_bound"] and c["confidence"] == 1 - c["l1_error_bound"] / 2
        assert l1(clean, truth) <= c["l1_error_bound"] * 10 + 1e-6  # the clean bound is of the right size
    worse, _ = attack_shipped(lenet, SMOOTHING, 1.0, 0)  # noise as large as the gradient: flagged
    assert worse.output.diagnostics["confidence"] < 0.95
    assert any(w.startswith("low confidence") for w in worse.output.warnings)


def test_same_seed_same_result(lenet: LoadedModel) -> None:
    first, _ = attack_shipped(lenet, SMOOTHING, 0.1, 3)
    second, _ = attack_shipped(lenet, SMOOTHING, 0.1, 3)
    assert torch.equal(first.output.soft_label, second.output.soft_label)
    for key in ("confidence", "l1_error_bound", "augmentation_confidence", "lambda", "choice"):
        assert first.output.diagnostics[key] == second.output.diagnostics[key], key


@pytest.mark.parametrize("bias", [True, False])
def test_bias_free_layer_and_the_bias_channel(bias: bool) -> None:
    """A last layer with and without bias (the bias gradient is a second, independent look at p − y)."""
    torch.manual_seed(0)
    module = build_zoo_model("lenet", activation="sigmoid", init="uniform").eval()
    if not bias:
        fc = torch.nn.Linear(84, 10, bias=False)
        fc.weight.data = module.fc3.weight.data.clone()
        module.fc3 = fc
    model = LoadedModel(module, "test", "lenet", {}, (1, 28, 28), "", {})
    x, y = load_dataset(MNIST_CLIENT).batch([3])
    target = 0.8 * torch.nn.functional.one_hot(y, 10).double() + 0.02  # smoothing, ε = 0.2
    cap = add_noise(capture_gradients(module, x, target.float(), LossSpec()), 0.01, 7)
    result = run_attack(get_attack("softlabel"), build_context(cap, model, seed=0))
    assert result.output is not None and result.output.diagnostics["family"] == "smoothing"
    assert result.output.diagnostics["epsilon"] == pytest.approx(0.2, abs=0.03)
    assert l1(result, target[0]) <= 0.1
