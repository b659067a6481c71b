"""The federated task of the example: LeNet-5 on the shipped MNIST client data, one shard per client.

Plain PyTorch; the only gleak call is :func:`gleak.integrations.flower.record_batch`, the optional hook that
lets the capture mod write each client's ground truth (what it trained on) beside its update.
"""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import Context

from gleak.data.images import load_dataset
from gleak.integrations.flower import record_batch
from gleak.models import load_model

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "samples" / "data" / "mnist_client.safetensors"
MODEL = ROOT / "samples" / "models" / "lenet_untrained.safetensors"  # the initial global model
ARCH, ARCH_KWARGS = "lenet", {"activation": "relu"}  # its gleak arch spec (stored with the global models)


def new_model() -> torch.nn.Module:
    return load_model(MODEL).module


def shard(partition: int, partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition``'s examples (every ``partitions``-th image), normalised as the model expects."""
    data = load_dataset(DATA)
    index = torch.arange(partition, len(data), partitions)
    return data.batch(index)


def train(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, steps: int, batch_size: int,
          lr: float, seed: int, context: Context | None = None) -> float:
    """``steps`` SGD steps on random batches of the shard; each batch is recorded for the truth file."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        pick = torch.randperm(len(labels), generator=generator)[:batch_size]
        x, y = inputs[pick], labels[pick]
        if context is not None:
            record_batch(context, x, y)  # the documented hook: ground truth for the audit (tests, red teams)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    return float(loss.detach())
