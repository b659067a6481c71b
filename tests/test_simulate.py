"""`simulate`: determinism, batch compositions, schemes and optimizers, soft labels, ground-truth consistency."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gleak.data.images import load_dataset
from gleak.errors import GleakError
from gleak.losses import LossSpec
from gleak.models import build_zoo_model, load_model
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import LENET, MNIST_CLIENT


@pytest.fixture(scope="module")
def lenet() -> torch.nn.Module:
    return load_model(LENET).module


@pytest.fixture(scope="module")
def mnist():
    return load_dataset(MNIST_CLIENT)


def test_same_seed_same_capture_other_seed_differs(lenet, mnist) -> None:
    cfg = ClientConfig(batch_size=8, local_steps=3, scheme="fedavg", optimizer="sgdm", seed=11)
    a, ta = simulate_client(lenet, mnist, cfg)
    b, tb = simulate_client(lenet, mnist, cfg)
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert torch.equal(ta.labels, tb.labels) and torch.equal(ta.inputs, tb.inputs)
    c, tc = simulate_client(lenet, mnist, ClientConfig(batch_size=8, local_steps=3, scheme="fedavg",
                                                       optimizer="sgdm", seed=12))
    assert not torch.equal(ta.inputs, tc.inputs) and not torch.equal(a.tensors["fc3.weight"], c.tensors["fc3.weight"])


def test_fedsgd_gradient_is_the_batch_gradient_of_the_truth(lenet, mnist) -> None:
    cap, truth = simulate_client(lenet, mnist, ClientConfig(batch_size=16, seed=3))
    assert cap.kind == "gradient" and truth.labels.shape == (16,)
    model = load_model(LENET).module
    F.cross_entropy(model(truth.inputs), truth.labels).backward()
    assert torch.allclose(cap.tensors["fc3.bias"], model.fc3.bias.grad, atol=1e-7)
    # the inputs are real normalised MNIST digits, not noise
    pixels = load_dataset(MNIST_CLIENT).denormalize(truth.inputs)
    assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6 and (pixels == 0).float().mean() > 0.5


def test_one_sgd_step_update_is_minus_lr_times_gradient(lenet, mnist) -> None:
    grad, _ = simulate_client(lenet, mnist, ClientConfig(batch_size=8, seed=5, train_mode=False))
    upd, _ = simulate_client(lenet, mnist, ClientConfig(batch_size=8, seed=5, scheme="fedavg", learning_rate=0.1,
                                                        train_mode=False))
    assert upd.kind == "update" and upd.learning_rate == 0.1
    for name in grad.tensors:
        assert torch.allclose(upd.tensors[name], -0.1 * grad.tensors[name], atol=1e-6)


def test_compositions(lenet, mnist) -> None:
    cap, truth = simulate_client(lenet, mnist, ClientConfig(batch_size=10, composition="unique", seed=1))
    assert sorted(truth.labels.tolist()) == list(range(10))
    _, truth = simulate_client(lenet, mnist, ClientConfig(batch_size=16, composition="unbalanced", seed=2))
    counts = torch.bincount(truth.labels, minlength=10).sort(descending=True).values
    assert counts[0] >= 8 and counts[0] + counts[1] >= 12
    labels = (3, 3, 3, 7, 1, 1)
    _, truth = simulate_client(lenet, mnist, ClientConfig(batch_size=6, composition="explicit", labels=labels))
    assert truth.labels.tolist() == list(labels)
    assert cap.get("gleak.batch.composition") == "unique"
    cap, truth = simulate_client(lenet, mnist, ClientConfig(batch_size=64, composition="dirichlet",
                                                            dirichlet_alpha=0.1, seed=3))
    share = torch.bincount(truth.labels, minlength=10).sort(descending=True).values[:2].sum() / 64
    assert share >= 0.7 and cap.get("gleak.batch.composition") == "dirichlet(0.1)"  # α = 0.1: few classes


def test_label_smoothing_truth_and_bias_gradient(lenet, mnist) -> None:
    cfg = ClientConfig(batch_size=1, loss=LossSpec(label_smoothing=0.3), seed=9)
    cap, truth = simulate_client(lenet, mnist, cfg)
    assert truth.soft and cap.get("gleak.label_smoothing") == 0.3
    y = truth.labels[0]
    assert torch.isclose(y.max(), torch.tensor(0.7 + 0.03)) and torch.isclose(y.sum(), torch.tensor(1.0))
    with torch.no_grad():
        p = F.softmax(lenet(truth.inputs), dim=1)[0]
    # ∂ℓ/∂b = p − y (Wang, Liang & He, ICLR 2024, Eq. 2)
    assert torch.allclose(cap.tensors["fc3.bias"], p - y, atol=1e-6)


def test_mixup_pairs_two_different_classes(lenet, mnist) -> None:
    cap, truth = simulate_client(lenet, mnist, ClientConfig(batch_size=4, mixup=True, mixup_ratio=0.3, seed=2))
    assert truth.labels.shape == (4, 10)
    for row in truth.labels:
        nz = row[row > 0]
        assert len(nz) == 2 and sorted(nz.tolist()) == pytest.approx([0.3, 0.7])
    assert cap.get("gleak.mixup") == {"ratio": 0.3}


def test_schemes_and_optimizers_differ_and_record_metadata(lenet, mnist) -> None:
    base = dict(batch_size=8, local_steps=4, seed=4, learning_rate=0.05)
    updates = {}
    for name, cfg in {
        "sgd": ClientConfig(scheme="fedavg", **base),
        "sgdm": ClientConfig(scheme="fedavg", optimizer="sgdm", momentum=0.9, **base),
        "nag": ClientConfig(scheme="fedavg", optimizer="nag", momentum=0.9, **base),
        "adam": ClientConfig(scheme="fedavg", optimizer="adam", **base),
        "prox": ClientConfig(scheme="fedprox", mu=5.0, **base),
        "wd": ClientConfig(scheme="fedavg", weight_decay=0.1, **base),
    }.items():
        cap, truth = simulate_client(lenet, mnist, cfg)
        assert cap.local_steps == 4 and cap.get("gleak.num_examples") == 32 and truth.labels.shape == (32,)
        updates[name] = cap
    names = list(updates)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(updates[a].tensors["fc3.weight"], updates[b].tensors["fc3.weight"]), (a, b)
    assert updates["sgdm"].get("gleak.momentum") == 0.9 and updates["nag"].get("gleak.optimizer") == "nag"
    assert updates["prox"].get("gleak.fl.mu") == 5.0 and updates["wd"].get("gleak.weight_decay") == 0.1
    # the proximal term pulls the local model back towards the global one
    assert updates["prox"].tensors["fc3.weight"].norm() < updates["sgd"].tensors["fc3.weight"].norm()


def test_focal_temperature_and_sum_reduction_recorded(lenet, mnist) -> None:
    loss = LossSpec(name="focal", reduction="sum", temperature=0.8, focal_gamma=2.0, focal_alpha=0.5)
    cap, _ = simulate_client(lenet, mnist, ClientConfig(batch_size=4, loss=loss, seed=1))
    assert cap.get("gleak.loss") == "focal" and cap.get("gleak.focal.gamma") == 2.0
    assert cap.get("gleak.temperature") == 0.8 and cap.get("gleak.loss.reduction") == "sum"


def test_batchnorm_train_and_eval_mode() -> None:
    torch.manual_seed(0)
    model = build_zoo_model("resnet-cifar", depth=8, in_channels=1, image_size=28)
    data = load_dataset(MNIST_CLIENT).subset(range(64))
    train_cap, _ = simulate_client(model, data, ClientConfig(batch_size=4, local_steps=2, scheme="fedavg", seed=1))
    eval_cap, _ = simulate_client(model, data, ClientConfig(batch_size=4, local_steps=2, scheme="fedavg", seed=1,
                                                            train_mode=False))
    assert train_cap.get("gleak.model.train_mode") is True and eval_cap.get("gleak.model.train_mode") is False
    bn = [n for n in train_cap.buffers if n.endswith("running_mean")]
    assert bn and train_cap.tensors[bn[0]].abs().sum() > 0 and eval_cap.tensors[bn[0]].abs().sum() == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheme": "fedsgd", "local_steps": 3}, "FedSGD shares one gradient"),
        ({"scheme": "fedprox"}, "needs a proximal weight"),
        ({"optimizer": "rmsprop"}, "unknown optimizer"),
        ({"composition": "explicit"}, "needs --labels"),
        ({"composition": "explicit", "labels": (1, 2)}, "gives 2 labels"),
        ({"mixup": True, "mixup_ratio": 1.5}, "mixup ratio must be in"),
    ],
)
def test_bad_configs(kwargs, message) -> None:
    with pytest.raises(GleakError, match=message):
        ClientConfig(**kwargs)


def test_unique_batch_larger_than_classes(lenet, mnist) -> None:
    with pytest.raises(GleakError, match="needs that many classes"):
        simulate_client(lenet, mnist, ClientConfig(batch_size=11, composition="unique"))
