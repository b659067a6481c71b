"""``gleak sweep --utility accuracy``: what a defense costs in test accuracy.

At every point (the undefended baseline and each defense at each strength) the global model is trained, FedAvg-style,
for R rounds: each round the client runs m local SGD steps from the current model on its training data
(:func:`gleak.simulate.images.simulate_client`, the same code that simulates the attacked clients), the defense acts
as it does in the sweep — DP-SGD while the client trains (Opacus), every other defense on the round's update Δθ — and
the defended update is added to the model. Round r draws its batches with seed ``seed + TRAIN_SEED_OFFSET + r`` at
every point (paired: the curves differ by the defense only). The model is then scored on held-out data:
``--eval-data`` or a seeded split of ``--data`` (:data:`EVAL_FRACTION` of it) that no round trains on.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gleak.data.images import Dataset, load_dataset
from gleak.defenses import Defense
from gleak.errors import GleakError
from gleak.models import LoadedModel
from gleak.runs.inputs import check_model_fits_data
from gleak.simulate.images import ClientConfig, simulate_client

UTILITIES = ("cosine", "accuracy")
DEFAULT_ROUNDS = 20
DEFAULT_TRAIN_STEPS = 10
DEFAULT_TRAIN_LR = 0.1
EVAL_FRACTION = 0.2  # of --data held out for testing when --eval-data is not given
TRAIN_SEED_OFFSET = 500_009  # round r draws its batches with seed + TRAIN_SEED_OFFSET + r (apart from the trials')
EVAL_BATCH = 512


@dataclass(frozen=True)
class Split:
    """The data the utility training uses: ``train`` (what the rounds draw batches from) and ``test`` (what accuracy
    is measured on); ``held_out`` the indices of ``--data`` kept for testing (None: ``--eval-data`` given)."""

    train: Dataset
    test: Dataset
    held_out: torch.Tensor | None


def split_data(data: Dataset, seed: int, fraction: float = EVAL_FRACTION) -> Split:
    """A seeded split of ``data``: ⌈fraction·N⌉ examples (at least 1) held out for testing, the rest for training,
    disjoint (a permutation of the indices drawn with ``seed``)."""
    n = len(data)
    test = max(1, math.ceil(fraction * n))
    if n - test < 1:
        raise GleakError(f"--utility accuracy holds out {test} of the {n} examples of --data for testing and needs "
                         "some left to train on: give more data or --eval-data")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    held, kept = order[:test].sort().values, order[test:].sort().values
    return Split(data.subset(kept), data.subset(held), held)


def load_eval(path: Path, loaded: LoadedModel, data: Dataset) -> Dataset:
    """``--eval-data`` (the formats of ``--data``), refused in one line when it is empty, does not fit the model
    (input shape, classes); it is normalised with its own mean and std, as --data is."""
    try:
        test = load_dataset(path)
        check_model_fits_data(loaded, test)
    except GleakError as e:
        raise GleakError(f"--eval-data: {e}") from None
    if test.input_shape != data.input_shape:
        raise GleakError(f"--eval-data: its inputs are {list(test.input_shape)}, the training data's "
                         f"{list(data.input_shape)}")
    classes = _classes(loaded.module, test)
    high = int(test.labels.max())
    if high >= classes:
        raise GleakError(f"--eval-data: label {high} is outside the model's classes 0 … {classes - 1}")
    return test


def _classes(model: nn.Module, data: Dataset) -> int:
    try:
        with torch.no_grad():
            out = copy.deepcopy(model).eval()(data.batch([0])[0])
    except Exception as exc:
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise GleakError(f"--eval-data: the model cannot run on its inputs {list(data.input_shape)}: "
                         f"{why[:160]}") from None
    if out.dim() != 2:
        raise GleakError(f"--eval-data: the model's output has shape {list(out.shape)}; expected [N, classes]")
    return int(out.shape[1])


def accuracy(model: nn.Module, data: Dataset, device: torch.device) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on every example of ``data``."""
    model.eval()
    right = 0
    with torch.no_grad():
        for start in range(0, len(data), EVAL_BATCH):
            inputs, labels = data.batch(range(start, min(start + EVAL_BATCH, len(data))))
            right += int((model(inputs.to(device)).argmax(1).cpu() == labels).sum())
    return right / len(data)


@dataclass(kw_only=True, frozen=True)
class Training:
    """How the utility model trains: R rounds of m local steps of B examples at learning rate ``lr``."""

    rounds: int
    steps: int
    batch_size: int
    lr: float
    seed: int

    def client(self, r: int, defense: Defense | None) -> ClientConfig:
        """Round ``r``'s client: the same batches at every point, the defense applied as the sweep applies it."""
        return ClientConfig(batch_size=self.batch_size, local_steps=self.steps, scheme="fedavg",
                            learning_rate=self.lr, seed=self.seed + TRAIN_SEED_OFFSET + r,
                            defenses=(defense,) if defense is not None else ())


def train(model: nn.Module, split: Split, training: Training, defense: Defense | None,
          device: torch.device) -> float:
    """Train a copy of ``model`` for the rounds under ``defense`` (None: undefended) and return its test accuracy."""
    current = copy.deepcopy(model).to(device)
    for r in range(training.rounds):
        update, _ = simulate_client(current, split.train, training.client(r, defense), device)
        state = current.state_dict()
        with torch.no_grad():
            for name, delta in update.tensors.items():  # θ ← θ + Δθ (defended)
                state[name] += delta.to(device=state[name].device, dtype=state[name].dtype)
        if not all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point()):
            return 0.0  # weights no longer finite (e.g. σ far above the update's scale): it predicts nothing
    return accuracy(current, split.test, device)


def train_points(model: nn.Module, split: Split, training: Training, points: list[tuple[str, Defense | None]],
                 device: torch.device, tick: Callable[[str], None] | None = None) -> tuple[list[float], float]:
    """Each point's test accuracy (``points``: (what, defense or None) in order) and the seconds all took."""
    started = time.perf_counter()
    out: list[float] = []
    for what, defense in points:
        out.append(round(train(model, split, training, defense, device), 6))
        if tick:
            tick(what)
    return out, time.perf_counter() - started
