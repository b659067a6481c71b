"""BatchNorm models: attacks run the model in the mode the client trained in (gleak.model.train_mode)."""

from __future__ import annotations

import copy

import pytest
import torch

from gleak.attacks import build_context, get_attack, run_attack
from gleak.attacks.reconstruct.inputs import targets_from_truth
from gleak.attacks.reconstruct.objective import GradientMatcher
from gleak.capture import Truth, capture_gradients
from gleak.data.images import load_dataset
from gleak.losses import LossSpec
from gleak.metrics.labels import truth_counts
from gleak.models import LoadedModel, build_zoo_model, load_model
from gleak.models.modes import batch_statistics
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import CIFAR, LENET, MNIST_AUX, MNIST_CLIENT


def _bn_model(in_channels: int = 3, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_zoo_model("resnet-cifar", depth=8, in_channels=in_channels)


def _loaded(module: torch.nn.Module, shape: tuple[int, ...]) -> LoadedModel:
    return LoadedModel(module, "test", "resnet-cifar", {}, shape, "", {})


@pytest.mark.parametrize("train", [True, False])
def test_objective_is_zero_at_the_true_images_in_the_recorded_mode(train: bool) -> None:
    data = load_dataset(CIFAR)
    model = _bn_model()
    inputs, labels = data.batch(range(4))
    client = copy.deepcopy(model).train(train)  # the client's copy: a train-mode step moves its running stats
    cap = capture_gradients(client, inputs, labels)
    assert cap.get("gleak.model.train_mode") is train
    ctx = build_context(cap, _loaded(model, (3, 32, 32)))
    assert ctx.batch_stats is train and ("train mode" if train else "eval mode") in ctx.mode_note
    targets = targets_from_truth(Truth(labels, inputs), ctx)
    matcher = GradientMatcher(ctx, targets, "cosine")
    with torch.no_grad():
        before = {k: v.clone() for k, v in model.state_dict().items()}
    value = float(matcher(inputs.clone().requires_grad_(True)).detach())
    assert value < 1e-5, value  # was 0.93-like with the model always in eval mode
    # the attack leaves the global model's running statistics alone
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_batch_statistics_switches_only_normalisation_and_restores() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Dropout(0.5)).eval()
    x = torch.randn(4, 1, 6, 6)
    with batch_statistics(model):
        y1, y2 = model(x), model(x)
        assert model[1].training and not model[2].training
    assert torch.equal(y1, y2)  # dropout stayed off: deterministic
    assert not model[1].training and model[1].track_running_stats
    assert int(model[1].num_batches_tracked) == 0 and torch.equal(model[1].running_mean, torch.zeros(2))
    normalised = (y1 - y1.mean((0, 2, 3), keepdim=True))
    assert float(normalised.abs().max()) < 10 and float(y1.mean((0, 2, 3)).abs().max()) < 1e-5


def test_label_attacks_on_a_train_mode_bn_model_use_batches_of_b() -> None:
    """Small BN ResNet on MNIST, B = 32, train mode: aux statistics come from batches like the client's
    (with running averages llg-plus and zlg-plus scored about 0.5; bench/batchnorm.py measures more)."""
    client, aux = load_dataset(MNIST_CLIENT), load_dataset(MNIST_AUX)
    aux = aux.subset(range(0, len(aux), 4))  # 50 per class keeps the test fast
    model = _bn_model(in_channels=1)
    cap, truth = simulate_client(model, client, ClientConfig(batch_size=32, seed=0, train_mode=True))
    ctx = build_context(cap, _loaded(model, (1, 28, 28)), aux)
    assert ctx.batch_stats
    counts = truth_counts(truth.labels, 10)
    for name in ("llg-plus", "zlg-plus", "posterior"):
        out = run_attack(get_attack(name), ctx)
        assert out.status == "ok", out.reason
        iacc = float(torch.minimum(out.output.counts, counts).sum() / counts.sum())
        assert iacc >= 0.9, (name, iacc)


def test_missing_train_mode_is_read_as_train_and_said() -> None:
    data = load_dataset(CIFAR)
    model = _bn_model()
    inputs, labels = data.batch(range(4))
    cap = capture_gradients(copy.deepcopy(model).train(), inputs, labels, LossSpec())
    del cap.meta["gleak.model.train_mode"]
    ctx = build_context(cap, _loaded(model, (3, 32, 32)))
    assert ctx.batch_stats and "not recorded" in ctx.mode_note


def test_label_choice_follows_the_evidence_of_the_bias_gradient() -> None:
    """`reconstruct --labels auto`: the true counts explain the captured ∇b far better than counts with a few labels
    moved, and a candidate replaces the preferred attack's only with such a clear margin."""
    from gleak.attacks.reconstruct import inputs as recon_inputs

    client, aux = load_dataset(MNIST_CLIENT), load_dataset(MNIST_AUX)
    loaded = load_model(LENET)
    cap, truth = simulate_client(loaded.module, client, ClientConfig(batch_size=32, seed=1))
    ctx = build_context(cap, loaded, aux.subset(range(0, len(aux), 4)))
    counts = truth_counts(truth.labels, 10)
    moved = counts.clone()
    donor, taker = int(counts.argmax()), int(counts.argmin())
    moved[donor] -= 3
    moved[taker] += 3
    true_fit = recon_inputs.bias_gradient_misfit(ctx, counts)
    assert recon_inputs.bias_gradient_misfit(ctx, moved) > true_fit + recon_inputs.EVIDENCE_MARGIN
    chosen, _, scores = recon_inputs.best_supported_counts(ctx)
    assert chosen is not None and set(scores) >= {"rlu", "posterior"}
    first = next(iter(scores))
    assert chosen.attack == first or scores[chosen.attack] < scores[first] - recon_inputs.EVIDENCE_MARGIN


def test_a_users_resnet18_in_train_mode_through_inspect_labels_and_reconstruct(tmp_path, gleak) -> None:
    """torchvision's ResNet-18 (BatchNorm), a train-mode capture of 4 CIFAR images made with the public helpers:
    every command says which mode it ran the model in, and the reconstruction objective starts from the
    client's mode (before the fix the model always ran in eval mode)."""
    import json

    import torchvision

    from gleak.capture import save_capture, save_truth, truth_path_for
    from gleak.models import save_model

    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10)
    weights = save_model(net, tmp_path / "resnet18.safetensors", "torchvision:resnet18", {"num_classes": 10})
    data = load_dataset(CIFAR)
    inputs, labels = data.batch(range(4))
    cap = capture_gradients(copy.deepcopy(net).train(), inputs, labels, mean=data.mean, std=data.std)
    path = save_capture(cap, tmp_path / "r18.safetensors")
    save_truth(Truth(labels, inputs), truth_path_for(path))

    r = gleak("inspect", path, "-M", weights, "--format", "json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["model"]["mode"]["batch_statistics"] is True and "train mode" in info["model"]["mode"]["note"]
    assert info["last_layer"]["name"] == "fc" and info["model"]["matches_capture"] is True

    r = gleak("labels", path, "-M", weights, "-a", "llg", "--format", "json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["model_mode"]["batch_statistics"] is True
    assert report["results"][0]["scores"]["iacc"] == 1.0  # 4 distinct labels from ∇b alone

    out = tmp_path / "rec"
    r = gleak("reconstruct", path, "-M", weights, "-o", out, "-a", "ig", "--iterations", "2", "--labels", "truth",
              "--lpips", "off")
    assert r.exit_code == 0, r.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model_mode"]["batch_statistics"] is True and "train mode" in r.stdout
