"""Shared fixtures: the shipped samples and a CLI runner that keeps stdout and stderr apart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gleak.cli import app

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
LENET = SAMPLES / "models/lenet_untrained.safetensors"
CNN = SAMPLES / "models/idlg_cnn_cifar10.safetensors"
MNIST_CLIENT = SAMPLES / "data/mnist_client.safetensors"
MNIST_AUX = SAMPLES / "data/mnist_aux.safetensors"
CIFAR = SAMPLES / "data/cifar10.safetensors"
FEDSGD = SAMPLES / "captures/fedsgd_b32.safetensors"
FEDAVG = SAMPLES / "captures/fedavg_m10.safetensors"


class Result:
    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


@pytest.fixture
def gleak():
    """Run the CLI in-process: ``gleak("inspect", path)`` -> Result(exit_code, stdout, stderr)."""
    runner = CliRunner()

    def run(*args: object) -> Result:
        result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        return Result(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op torch thread for the test (gleak's CLI default): small forward and double-backward passes are as
    fast, and immune to a busy machine. Modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
