"""The run behind ``gleak simulate``: a realistic FL client (:mod:`gleak.simulate`) on real data, written as a
capture and its ground truth — both files or neither."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from gleak.capture import Capture, TextTruth, Truth, save_capture, save_text_truth, save_truth, truth_path_for
from gleak.data.images import load_dataset
from gleak.data.text import is_text_data, load_text_data
from gleak.defenses import Defense
from gleak.errors import GleakError
from gleak.io import OutputSet, check_writable
from gleak.losses import LossSpec
from gleak.metrics.labels import truth_counts
from gleak.models import LoadedModel, load_model, load_tokenizer
from gleak.models.loading import save_model
from gleak.models.peft import LoraAdapter, LoraSpec, adapter_path_for, check_adapter_writable, save_adapter
from gleak.runs.inputs import ModelSpec, check_model_fits_data, resolve_device
from gleak.simulate.images import ClientConfig, simulate_client
from gleak.simulate.text import TextClientOptions, simulate_lora_client, simulate_text_client
from gleak.tamper.craft import Craft, Crafted, input_linear, insert_block


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
    max_length: int | None = None  # text: truncate each example to this many tokens
    train_mode: bool | None = None  # None: train mode for images, eval mode for text (ClientConfig.train_mode unused)
    peft: LoraSpec | None = None  # text: train a fresh LoRA adapter only; its global adapter is written beside
    server: Craft | None = None  # a malicious server's craft of the global model (written beside as NAME.model)

    @property
    def truth_path(self) -> Path | None:
        return None if self.no_truth else truth_path_for(self.output)

    @property
    def model_path(self) -> Path | None:
        """``NAME.model.safetensors``: the global model the server crafted (with ``server`` only)."""
        if self.server is None:
            return None
        name = self.output.name
        stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else self.output.stem
        return self.output.with_name(stem + ".model.safetensors")

    @property
    def adapter_path(self) -> Path | None:
        """``NAME.adapter/``: the global adapter a LoRA client started from (with ``peft`` only)."""
        return None if self.peft is None else adapter_path_for(self.output)


@dataclass
class SimulateRun:
    """What was simulated and written (a text client's truth is a :class:`~gleak.capture.TextTruth`)."""

    capture: Capture
    truth: Truth | TextTruth
    written: list[Path]
    adapter: LoraAdapter | None = None  # with --peft: the global adapter, written to SimulateRequest.adapter_path
    crafted: Crafted | None = None  # with --server: the crafted global model, written to SimulateRequest.model_path
    notices: list[str] = field(default_factory=list)  # text: what fitting the model took (truncation, the pad used)

    @property
    def label_counts(self) -> list[tuple[int, int]]:
        """(class, count) of the true labels, for every class present, in class order (none for a causal LM)."""
        labels = self.truth.labels
        if labels is None:
            return []
        counts = truth_counts(labels, self.capture.num_classes or 0)
        return [(c, int(n)) for c, n in enumerate(counts.tolist()) if n]

    @property
    def text(self) -> bool:
        return isinstance(self.truth, TextTruth)


def run_simulate(request: SimulateRequest) -> SimulateRun:
    """Check the outputs can be written, load the model and data, simulate the client, write both files."""
    check_writable(request.output, request.force)
    truth_path = request.truth_path
    if truth_path is not None:
        check_writable(truth_path, request.force)
    if request.adapter_path is not None:
        check_adapter_writable(request.adapter_path, request.force)
    if request.model_path is not None:
        check_writable(request.model_path, request.force)
    m = request.model
    if m.path is None:
        raise GleakError("simulate needs the global model (--model)")
    loaded = load_model(m.path, m.arch, m.arch_kwargs, m.trust_pickle, m.trust_remote_code)
    capture: Capture
    truth: Truth | TextTruth
    adapter: LoraAdapter | None = None
    notices: list[str] = []
    crafted = _craft(request, loaded)
    if crafted is not None:
        loaded = replace(loaded, module=crafted.model)
    if loaded.metadata.get("gleak.modality") == "text" or is_text_data(request.data):
        capture, truth, adapter = _simulate_text(request, loaded, notices)
    else:
        if request.max_length is not None or request.peft is not None:
            flag = "--max-length" if request.max_length is not None else "--peft"
            raise GleakError(f"{flag} applies to text data (.txt, .jsonl) and a language model folder")
        dataset = load_dataset(request.data)
        check_model_fits_data(loaded, dataset)
        config = request.config
        if request.train_mode is not None and request.train_mode != config.train_mode:
            config = replace(config, train_mode=request.train_mode)
        capture, truth = simulate_client(loaded.module, dataset, config, resolve_device(request.device))
    output = request.output
    with OutputSet(output.parent, request.force) as out:
        save_capture(capture, out.path(output.name), force=request.force)
        if truth_path is not None:
            bound = out.path_of(output.name)
            if isinstance(truth, TextTruth):
                save_text_truth(truth, out.path(truth_path.name), capture_path=bound, force=request.force)
            else:
                save_truth(truth, out.path(truth_path.name), capture_path=bound, force=request.force)
        if crafted is not None and request.model_path is not None:
            save_model(crafted.model, out.path(request.model_path.name), crafted.arch, crafted.arch_kwargs,
                       force=request.force)
        if adapter is not None and request.adapter_path is not None:  # a folder: written whole, before the files
            save_adapter(request.adapter_path, adapter.config, adapter.tensors, force=request.force)
        written = out.commit()
    if request.adapter_path is not None:
        written.append(request.adapter_path)
    return SimulateRun(capture, truth, written, adapter, notices=notices, crafted=crafted)


def _craft(request: SimulateRequest, loaded: LoadedModel) -> Crafted | None:
    """The server's craft of the global model (``--server``), or None; refused in one line for models it cannot
    write back (no architecture) or read (language models)."""
    if request.server is None:
        return None
    if loaded.metadata.get("gleak.modality") == "text" or is_text_data(request.data):
        raise GleakError("--server crafts image models (imprint, trap weights, fishing); this is a language model")
    if loaded.arch is None:
        raise GleakError("--server writes the crafted global model as safetensors with its architecture: give a "
                         "zoo model file, or safetensors weights with --arch")
    craft, module, arch, kwargs = request.server, loaded.module, loaded.arch, dict(loaded.arch_kwargs)
    if craft.input_layer and input_linear(module) is None:
        module, arch, kwargs = insert_block(module, arch, kwargs, craft.rows())
    crafted = craft.apply(module, request.config.seed)
    return replace(crafted, arch=arch, arch_kwargs=kwargs)


def _simulate_text(request: SimulateRequest, loaded: LoadedModel, notices: list[str]
                   ) -> tuple[Capture, TextTruth, LoraAdapter | None]:
    """A language model's client on text data: both must be text (one line otherwise). A ``--max-length`` beyond
    the model's positions is refused; longer lines without it are truncated to the positions (a notice says so);
    the tokens are checked against the model before any forward pass (:func:`gleak.data.text.tokenize`)."""
    if loaded.metadata.get("gleak.modality") != "text":
        raise GleakError(f"text data ({request.data.suffix}) needs a language model: pass a Hugging Face model folder "
                         "(config.json, model.safetensors and the tokenizer's files) as --model")
    if not is_text_data(request.data):
        raise GleakError(f"a language model trains on text: pass --data FILE.txt (one example per line) or "
                         f"FILE.jsonl (objects with a \"text\" field), not {request.data.name}")
    assert request.model.path is not None
    meta = loaded.metadata
    positions = int(meta["gleak.max_positions"]) if "gleak.max_positions" in meta else None
    if request.max_length is not None and positions is not None and request.max_length > positions:
        raise GleakError(f"--max-length {request.max_length:,} is more than the model's {positions:,} positions "
                         f"(config.json); give at most {positions:,}")
    tokenizer = load_tokenizer(request.model.path, request.model.trust_remote_code)
    data = load_text_data(request.data)
    options = TextClientOptions(
        task=meta.get("gleak.task", "causal_lm"), max_length=request.max_length,
        train_mode=bool(request.train_mode), tokenizer_sha256=meta.get("gleak.tokenizer.sha256"),
        num_labels=int(meta["gleak.num_labels"]) if "gleak.num_labels" in meta else None)
    device = resolve_device(request.device)
    if request.peft is not None:
        return simulate_lora_client(loaded.module, tokenizer, data, request.config, options, request.peft, device,
                                    notices=notices)
    capture, truth = simulate_text_client(loaded.module, tokenizer, data, request.config, options, device, notices)
    return capture, truth, None
