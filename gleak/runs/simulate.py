"""The run behind ``gleak simulate``: a realistic FL client (:mod:`gleak.simulate`) on real data, written as a
capture and its ground truth — both files or neither."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gleak.capture import Capture, Truth, save_capture, save_truth, truth_path_for
from gleak.data import load_dataset
from gleak.defenses import Defense
from gleak.errors import GleakError
from gleak.io import OutputSet, check_writable
from gleak.losses import LossSpec
from gleak.metrics.labels import truth_counts
from gleak.models import load_model
from gleak.runs.inputs import ModelSpec, check_model_fits_data, resolve_device
from gleak.simulate import ClientConfig, simulate_client


def client_config(*, batch_size: int, local_steps: int, scheme: str | None, learning_rate: float, optimizer: str,
                  momentum: float | None, weight_decay: float, mu: float | None, loss: str, reduction: str,
                  focal_gamma: float | None, focal_alpha: float | None, temperature: float, label_smoothing: float,
                  mixup: bool, mixup_ratio: float | None, composition: str, dirichlet_alpha: float | None,
                  labels: tuple[int, ...] | None, train_mode: bool, seed: int,
                  defenses: tuple[Defense, ...] = ()) -> ClientConfig:
    """The client ``gleak simulate`` runs, from its options (None: the default). The scheme defaults to fedsgd for
    one step and fedavg for more; explicit labels make a uniform composition explicit; an option the client would
    not use is an error, never silently dropped."""
    scheme = scheme or ("fedsgd" if local_steps == 1 else "fedavg")
    refuse_unused(optimizer=optimizer, momentum=momentum, scheme=scheme, mu=mu, loss=loss, focal_gamma=focal_gamma,
                  focal_alpha=focal_alpha, mixup=mixup, mixup_ratio=mixup_ratio, composition=composition,
                  dirichlet_alpha=dirichlet_alpha)
    return ClientConfig(
        batch_size=batch_size, local_steps=local_steps, scheme=scheme,
        learning_rate=learning_rate, optimizer=optimizer, momentum=0.9 if momentum is None else momentum,
        weight_decay=weight_decay, mu=mu or 0.0,
        loss=LossSpec(name=loss, reduction=reduction, temperature=temperature, label_smoothing=label_smoothing,
                      focal_gamma=2.0 if focal_gamma is None else focal_gamma,
                      focal_alpha=1.0 if focal_alpha is None else focal_alpha),
        mixup=mixup, mixup_ratio=mixup_ratio,
        composition="explicit" if labels and composition == "uniform" else composition,
        labels=labels, dirichlet_alpha=0.5 if dirichlet_alpha is None else dirichlet_alpha,
        train_mode=train_mode, seed=seed, defenses=defenses,
    )


def refuse_unused(*, optimizer: str, momentum: float | None, scheme: str, mu: float | None, loss: str,
                  focal_gamma: float | None, focal_alpha: float | None, mixup: bool, mixup_ratio: float | None,
                  composition: str, dirichlet_alpha: float | None) -> None:
    """An option that the configured client would not use is an error, never silently dropped."""
    unused = [
        (momentum is not None and optimizer not in ("sgdm", "nag"), "--momentum applies to --optimizer sgdm or nag"),
        (mu is not None and scheme != "fedprox", "--mu applies to --scheme fedprox"),
        ((focal_gamma is not None or focal_alpha is not None) and loss != "focal",
         "--focal-gamma/--focal-alpha apply to --loss focal"),
        (mixup_ratio is not None and not mixup, "--mixup-ratio applies with --mixup"),
        (dirichlet_alpha is not None and composition != "dirichlet",
         "--dirichlet-alpha applies to --composition dirichlet"),
    ]
    for bad, message in unused:
        if bad:
            raise GleakError(message)


@dataclass(kw_only=True, frozen=True)
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

    @property
    def label_counts(self) -> list[tuple[int, int]]:
        """(class, count) of the true labels, for every class present, in class order."""
        counts = truth_counts(self.truth.labels, self.capture.num_classes or 0)
        return [(c, int(n)) for c, n in enumerate(counts.tolist()) if n]


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
