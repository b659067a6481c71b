"""The run behind ``gleak simulate``: a realistic FL client (:mod:`gleak.simulate`) on real data, written as a
capture and its ground truth — both files or neither."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gleak.capture import Capture, Truth, save_capture, save_truth, truth_path_for
from gleak.data import load_dataset
from gleak.errors import GleakError
from gleak.io import OutputSet, check_writable
from gleak.models import load_model
from gleak.runs.inputs import ModelSpec, check_model_fits_data, resolve_device
from gleak.simulate import ClientConfig, simulate_client


@dataclass(frozen=True)
class SimulateRequest:
    """``gleak simulate``: the global model, the client's data, how it trains, and where the capture goes
    (its truth beside it as ``NAME.truth.safetensors`` unless ``no_truth``)."""

    model: ModelSpec
    data: Path
    config: ClientConfig
    output: Path
    no_truth: bool = False
    device: str = "cpu"
    force: bool = False

    @property
    def truth_path(self) -> Path | None:
        return None if self.no_truth else truth_path_for(self.output)


@dataclass
class SimulateRun:
    """What was simulated and written."""

    capture: Capture
    truth: Truth
    written: list[Path]


def run_simulate(request: SimulateRequest) -> SimulateRun:
    """Check the outputs can be written, load the model and data, simulate the client, write both files."""
    check_writable(request.output, request.force)
    truth_path = request.truth_path
    if truth_path is not None:
        check_writable(truth_path, request.force)
    m = request.model
    if m.path is None:
        raise GleakError("simulate needs the global model (--model)")
    loaded = load_model(m.path, m.arch, m.arch_kwargs, m.trust_pickle)
    dataset = load_dataset(request.data)
    check_model_fits_data(loaded, dataset)
    capture, truth = simulate_client(loaded.module, dataset, request.config, resolve_device(request.device))
    output = request.output
    with OutputSet(output.parent, request.force) as out:
        save_capture(capture, out.path(output.name), force=request.force)
        if truth_path is not None:
            save_truth(truth, out.path(truth_path.name), capture_path=out.path_of(output.name), force=request.force)
        written = out.commit()
    return SimulateRun(capture, truth, written)
