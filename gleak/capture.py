"""Capture format v1: one client contribution (gradient or update) in a safetensors file.

Specified in docs/capture-format.md.
Tensors keep the model's ``state_dict`` names. Metadata is strings only (a safetensors rule); every known
key is parsed through one typed schema table, :data:`SCHEMA`, and unknown keys are kept verbatim.
A *truth* companion file (``<capture>.truth.safetensors``) holds the labels and inputs for scoring.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

import torch
from torch import nn

from gleak import __version__
from gleak.errors import GleakError, shorten
from gleak.io import (
    MAX_INPUT_ELEMENTS,
    MODEL_HINT,
    check_input_shape,
    describe_key_mismatch,
    file_sha256,
    quote_names,
    read_safetensors,
    save_safetensors,
    tensors_sha256,
)
from gleak.losses import LossSpec, client_loss
from gleak.model_check import ModelCheck as ModelCheck  # re-exported: check_model_hash returns it
from gleak.models.lastlayer import guess_last_layer
from gleak.reproducible import created_at

SCHEMA_VERSION = 1
KINDS = ("gradient", "update")
TRUTH_KIND = "truth"
OPTIMIZERS = ("sgd", "sgdm", "nag", "adam")  # the client optimizers a capture can record (gleak.optimizer)
TEXT_TASKS = ("causal_lm", "sequence_classification")
IGNORE_INDEX = -100  # the Hugging Face convention: a target that the loss skips (pads)
SHA256_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Field:
    """One metadata key: its type, the allowed values for enums, what it means, and how a missing key is read."""

    type: str  # str | int | float | bool | enum | int_list | float_list | str_list | json
    doc: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # numbers (or every list element) must be > 0
    default: Any = None  # the value gleak assumes when the key is absent (None: nothing is assumed)


SCHEMA: dict[str, Field] = {
    "format": Field("enum", "safetensors' framework tag", ("pt",)),
    "gleak.schema_version": Field("int", "capture format version", minimum=1, default=SCHEMA_VERSION),
    "gleak.kind": Field("enum", "gradient = dL/dθ of one step; update = θ_local − θ_global",
                        (*KINDS, TRUTH_KIND)),
    "gleak.batch_size": Field("int", "examples per local step (B); attacks that need it say so (or --batch-size)",
                              minimum=1, maximum=65_536),
    "gleak.num_examples": Field("int", "examples behind the contribution (m·B for m steps)", minimum=1,
                                maximum=2**32),
    "gleak.local_steps": Field("int", "local optimizer steps (m); 1 for FedSGD", minimum=1, maximum=100_000,
                               default=1),
    "gleak.learning_rate": Field("float", "client learning rate η (updates: needed to read Δθ as a gradient, and "
                                 "by rlu)", minimum=0),
    "gleak.optimizer": Field("enum", "client optimizer (updates only; a gradient involves none)", OPTIMIZERS,
                             default="sgd"),
    "gleak.momentum": Field("float", "momentum γ of sgdm / nag (read only for those optimizers)", minimum=0,
                            maximum=0.999999, default=0.9),
    "gleak.weight_decay": Field("float", "L2 weight decay of the optimizer (updates only)", minimum=0,
                                default=0.0),
    "gleak.loss": Field("enum", "training loss", ("cross_entropy", "focal", "bce"), default="cross_entropy"),
    "gleak.loss.reduction": Field("enum", "reduction over the batch", ("mean", "sum"), default="mean"),
    "gleak.focal.gamma": Field("float", "focal-loss focusing parameter γ", minimum=0, default=2.0),
    "gleak.focal.alpha": Field("float", "focal-loss weight α", minimum=0, default=1.0),
    "gleak.temperature": Field("float", "softmax temperature τ (logits / τ)", positive=True, default=1.0),
    "gleak.label_smoothing": Field("float", "label smoothing ε: y = (1 − ε)·onehot + ε/C", minimum=0,
                                   maximum=0.999999, default=0.0),
    "gleak.mixup": Field("json", "mixup settings, e.g. {\"ratio\": 0.3} or {\"ratio\": null} (drawn U(0,1))"),
    "gleak.fl.scheme": Field("enum", "federated scheme",
                             ("fedsgd", "fedavg", "fedprox", "scaffold", "feddyn", "feddc"), default="fedavg"),
    "gleak.fl.mu": Field("float", "FedProx proximal weight μ", minimum=0, default=0.0),
    "gleak.fl.alpha": Field("float", "FedDyn / FedDC regulariser α", minimum=0, default=0.0),
    "gleak.fl.history": Field("float_list", "Scaffold/FedDyn/FedDC history term h of the last-layer bias "
                              "(RLU Table 1)"),
    "gleak.fl.round": Field("int", "federated round", minimum=0),
    "gleak.fl.client_id": Field("str", "client identifier"),
    "gleak.num_classes": Field("int", "number of classes C (the model's output width)", minimum=1, maximum=1_000_000),
    "gleak.input_shape": Field("int_list", "input shape (C, H, W) without the batch; else the model's, when known",
                               positive=True),
    "gleak.data.mean": Field("float_list", "per-channel mean: model inputs are (pixels − mean) / std, pixels in "
                             "[0, 1]"),
    "gleak.data.std": Field("float_list", "per-channel std of that normalisation (images are shown raw without "
                            "both)", positive=True),
    "gleak.model.sha256": Field("sha256", "sha256 of the global model's tensors (docs/capture-format.md, "
                                "gleak.io.tensors_sha256)"),
    "gleak.model.train_mode": Field("bool", "model in train mode (BatchNorm/Dropout) during the step",
                                     default=True),
    "gleak.batch.composition": Field("str", "how the batch labels were drawn"),
    "gleak.defense": Field("json", "defenses applied to the contribution, in order: a JSON list of {name, options…, "
                           "seed} (gleak.defenses)"),
    "gleak.dp.epsilon": Field("float", "DP-SGD: ε spent, by the accountant gleak.dp.accountant", minimum=0),
    "gleak.dp.epsilon_rdp": Field("float", "DP-SGD: ε from Opacus's RDP accountant", minimum=0),
    "gleak.dp.epsilon_prv": Field("float", "DP-SGD: ε from Opacus's PRV accountant", minimum=0),
    "gleak.dp.delta": Field("float", "DP-SGD: δ of the (ε, δ) guarantee", minimum=0),
    "gleak.dp.noise_multiplier": Field("float", "DP-SGD: noise multiplier z (noise std z·C)", minimum=0),
    "gleak.dp.max_grad_norm": Field("float", "DP-SGD: per-example clipping bound C", minimum=0),
    "gleak.dp.sample_rate": Field("float", "DP-SGD: sample rate q the accountant used", minimum=0),
    "gleak.dp.steps": Field("int", "DP-SGD: noisy steps accounted", minimum=1),
    "gleak.dp.accountant": Field("enum", "DP-SGD: the accountant of gleak.dp.epsilon", ("rdp", "prv")),
    "gleak.dp.target_epsilon": Field("float", "DP-SGD aimed at a target ε (dpsgd:epsilon=E): E; z was picked by "
                                     "Opacus's get_noise_multiplier", minimum=0),
    "gleak.buffers": Field("str_list", "names of buffer tensors (e.g. BatchNorm statistics)"),
    "gleak.producer": Field("str", "what wrote the file"),
    "gleak.created_at": Field("str", "ISO-8601 creation time"),
    "gleak.seed": Field("int", "seed of the simulation that produced the file"),
    "gleak.capture.sha256": Field("sha256", "truth files: sha256 of the bytes of the capture file they belong to"),
    # text (token batches; docs/capture-format.md, "Captures of token batches")
    "gleak.modality": Field("enum", "what the client trained on: text (token batches); absent: images",
                            ("image", "text"), default="image"),
    "gleak.task": Field("enum", "text: the loss; causal_lm = next-token cross-entropy, mean over non-pad targets; "
                        "sequence_classification = cross-entropy of one label per sequence, mean over B",
                        TEXT_TASKS),
    "gleak.vocab_size": Field("int", "text: vocabulary size V (rows of the input embedding)", minimum=1,
                              maximum=16_777_216),
    "gleak.tokenizer.sha256": Field("sha256", "text: sha256 over the tokenizer's files (gleak.models.text."
                                    "tokenizer_sha256)"),
    "gleak.tokenizer.padding_side": Field("enum", "text: the side pads were added on", ("left", "right")),
    "gleak.max_length": Field("int", "text: the truncation length the batches were tokenised with (tokens per "
                              "sequence, at most)", minimum=1, maximum=16_777_216),
    "gleak.pad_token_id": Field("int", "text: the pad token's id (pads are masked out of the loss)", minimum=0),
    # LoRA (docs/capture-format.md, "LoRA captures"): the tensors are the adapter's, named as peft saves it
    "gleak.peft.type": Field("enum", "text: the client trained a LoRA adapter only; the tensors are the adapter's "
                             "(peft's saved names) and gleak.model.sha256 is the base model's", ("lora",)),
    "gleak.peft.r": Field("int", "LoRA rank r (lora_A is r × d, lora_B is d_out × r)", minimum=1, maximum=65_536),
    "gleak.peft.alpha": Field("float", "LoRA alpha: the adapter adds (alpha / r)·B·A·u", positive=True),
    "gleak.peft.target_modules": Field("str_list", "LoRA: the adapted modules (peft's target_modules)"),
    "gleak.peft.adapter.sha256": Field("sha256", "LoRA: sha256 of the global adapter's tensors the client started "
                                       "from (gleak.io.tensors_sha256 over peft's saved names)"),
    "gleak.peft.base_model": Field("str", "LoRA: the adapter config's base_model_name_or_path, as written there "
                                   "(recorded, never resolved)"),
}


def _parse_value(key: str, raw: str) -> Any:
    spec = SCHEMA[key]
    expected = {
        "int": "an integer", "float": "a number", "bool": "true or false", "json": "JSON",
        "int_list": "a JSON list of integers", "float_list": "a JSON list of numbers",
        "str_list": "a JSON list of strings", "str": "a string",
        "sha256": "64 lower-case hex digits", "enum": "one of " + ", ".join(spec.choices),
    }[spec.type]
    if spec.positive:
        expected += " (> 0)"
    bad = GleakError(f"metadata key '{key}' has value {shorten(repr(raw), 80)}; expected {expected}")
    if len(raw) > MAX_META_VALUE and spec.type != "str":
        raise bad
    value: Any
    try:
        if spec.type == "str":
            value = raw
        elif spec.type == "sha256":
            if len(raw) != 64 or not set(raw) <= SHA256_HEX:
                raise bad
            value = raw
        elif spec.type == "enum":
            if raw not in spec.choices:
                raise bad
            value = raw
        elif spec.type == "int":
            value = int(raw.strip())
        elif spec.type == "float":
            value = float(raw.strip())
            if not math.isfinite(value):
                raise bad
        elif spec.type == "bool":
            if raw.strip().lower() not in ("true", "false", "1", "0"):
                raise bad
            value = raw.strip().lower() in ("true", "1")
        else:
            value = json.loads(raw)
            if spec.type.endswith("_list"):
                elem_types: dict[str, type | tuple[type, ...]] = {
                    "int_list": int, "float_list": (int, float), "str_list": str}
                elem = elem_types[spec.type]
                if not isinstance(value, list) or not all(
                    isinstance(v, elem) and not isinstance(v, bool) for v in value
                ):
                    raise bad
                if spec.type == "float_list":
                    value = [float(v) for v in value]
                    if not all(math.isfinite(v) for v in value):
                        raise bad
    except (ValueError, TypeError, RecursionError):
        raise bad from None
    numbers = value if isinstance(value, list) else [value]
    for v in numbers:
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if spec.minimum is not None and v < spec.minimum:
            raise GleakError(f"metadata key '{key}' is {shorten(raw, 60)}; it must be ≥ {spec.minimum:g}")
        if spec.maximum is not None and v > spec.maximum:
            raise GleakError(f"metadata key '{key}' is {shorten(raw, 60)}; it must be ≤ {spec.maximum:g}")
        if spec.positive and not v > 0:
            raise GleakError(f"metadata key '{key}' is {shorten(raw, 60)}; every value must be > 0")
    if key == "gleak.input_shape":
        check_input_shape(value, f"metadata key '{key}'")
    return value


MAX_META_VALUE = 1 << 20  # characters of one typed metadata value


def _format_value(key: str, value: Any) -> str:
    spec = SCHEMA.get(key)
    if spec is None or spec.type in ("str", "enum", "sha256"):
        return str(value)
    if spec.type == "bool":
        return "true" if value else "false"
    if spec.type in ("int", "float"):
        return repr(value) if spec.type == "float" else str(int(value))
    return json.dumps(value, separators=(",", ":"))


def parse_metadata(raw: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Split raw string metadata into typed known values and verbatim unknown keys."""
    known: dict[str, Any] = {}
    extra: dict[str, str] = {}
    for key, value in raw.items():
        if key in SCHEMA:
            known[key] = _parse_value(key, value)
        else:
            extra[key] = value
    return known, extra


def format_metadata(meta: Mapping[str, Any], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Typed values back to strings; validates them through the same schema."""
    out = dict(extra or {})
    for key, value in meta.items():
        if value is None:
            continue
        text = _format_value(key, value)
        if key in SCHEMA:
            _parse_value(key, text)
        out[key] = text
    return out


@dataclass
class Capture:
    """A captured gradient or update: tensors by state-dict name, typed metadata, unknown keys kept."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    extra: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    @property
    def kind(self) -> str:
        return str(self.meta["gleak.kind"])

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    def value(self, key: str) -> Any:
        """The recorded value of a schema key, else its documented default (``SCHEMA[key].default``)."""
        if key not in SCHEMA:
            raise KeyError(f"{key!r} is not a capture metadata key")
        return self.meta.get(key, SCHEMA[key].default)

    @property
    def batch_size(self) -> int | None:
        return self.meta.get("gleak.batch_size")

    @property
    def local_steps(self) -> int:
        return int(self.value("gleak.local_steps"))

    @property
    def learning_rate(self) -> float | None:
        return self.meta.get("gleak.learning_rate")

    @property
    def num_classes(self) -> int | None:
        return self.meta.get("gleak.num_classes")

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        shape = self.meta.get("gleak.input_shape")
        return tuple(shape) if shape else None

    @property
    def buffers(self) -> list[str]:
        return list(self.meta.get("gleak.buffers", []))

    def num_parameters(self) -> int:
        buffers = set(self.buffers)
        return sum(t.numel() for n, t in self.tensors.items() if n not in buffers)

    def metadata_strings(self) -> dict[str, str]:
        return format_metadata(self.meta, self.extra)


@dataclass
class Truth:
    """Ground truth for a capture: labels (int64 [N] or soft float [N, C]) and the inputs the model saw.

    ``inputs`` are exactly the tensors fed to the model, i.e. *after* normalisation (``(x − mean) / std``);
    record that normalisation as ``gleak.data.mean`` / ``gleak.data.std`` in the capture. For a multi-step
    update, concatenate the batches of every step in order (N = local_steps · batch_size)."""

    labels: torch.Tensor
    inputs: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def soft(self) -> bool:
        return self.labels.dim() == 2

    def hard_labels(self) -> torch.Tensor:
        """Class index per example (argmax for soft labels)."""
        return self.labels.argmax(dim=1) if self.soft else self.labels

    def check(self, num_classes: int, examples: int | None, where: str = "ground truth") -> None:
        """Labels must fit the model: class indices in [0, C), soft labels [N, C] that are distributions, and
        as many labels as the capture has examples. Checked once, where the truth is read."""
        labels = self.labels
        if self.soft:
            if labels.shape[1] != num_classes:
                raise GleakError(f"{where}: soft labels have {labels.shape[1]} columns, the model has "
                                 f"{num_classes} classes")
            sums = labels.double().sum(1)
            if bool((labels < -1e-6).any()) or bool(((sums - 1).abs() > 1e-3).any()):
                raise GleakError(f"{where}: soft labels must be non-negative and sum to 1 per example")
        elif labels.numel():
            low, high = int(labels.min()), int(labels.max())
            if low < 0 or high >= num_classes:
                raise GleakError(f"{where}: label {low if low < 0 else high} is outside the model's classes "
                                 f"0 … {num_classes - 1}")
        if examples is not None and labels.shape[0] != examples:
            raise GleakError(f"{where}: holds {labels.shape[0]} labels, the capture {examples} examples")

    def counts(self, num_classes: int) -> torch.Tensor:
        """Examples per class; soft labels count their mass (Σ_n y_nc)."""
        if self.soft:
            return self.labels.sum(dim=0).double()
        return torch.bincount(self.labels, minlength=num_classes).double()


@dataclass
class TextTruth:
    """Ground truth for a text capture: the token batches the model saw.

    ``input_ids`` and ``attention_mask`` are int64 [N, T] (1 on real tokens, 0 on pads); ``labels`` int64 [N] for a
    sequence classifier (None for a causal LM, whose targets are the input ids). For an update of m steps, the m
    batches are concatenated in training order (N = m·B), all padded to the same T."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def num_examples(self) -> int:
        return int(self.input_ids.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.labels is not None:
            out["labels"] = self.labels
        return out

    def check(self, where: str = "ground truth") -> None:
        """Shapes and values as the format says (checked where a text truth is read or written)."""
        ids, mask = self.input_ids, self.attention_mask
        check_token_batch(ids, mask, where)
        if self.labels is not None and (self.labels.dim() != 1 or self.labels.shape[0] != ids.shape[0]
                                        or self.labels.dtype != torch.int64):
            raise GleakError(f"{where}: labels must be int64 [{ids.shape[0]}], got {self.labels.dtype} "
                             f"{list(self.labels.shape)}")


def check_token_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, where: str = "token batch") -> None:
    """``input_ids`` and ``attention_mask``: integer [B, T] of one shape, ids ≥ 0, the mask 0 or 1."""
    if input_ids.dim() != 2 or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise GleakError(f"{where}: input_ids must be an integer tensor [B, T], got {input_ids.dtype} "
                         f"{list(input_ids.shape)}")
    if tuple(attention_mask.shape) != tuple(input_ids.shape) or attention_mask.is_floating_point():
        raise GleakError(f"{where}: attention_mask must be an integer tensor of the shape of input_ids "
                         f"{list(input_ids.shape)}, got {attention_mask.dtype} {list(attention_mask.shape)}")
    if input_ids.numel() and int(input_ids.min()) < 0:
        raise GleakError(f"{where}: input_ids must be ≥ 0")
    if attention_mask.numel() and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise GleakError(f"{where}: attention_mask must hold only 0 and 1")


# ---------------------------------------------------------------------------------------------- reading


def check_finite(tensors: Mapping[str, torch.Tensor], what: str = "tensor") -> None:
    for name, t in tensors.items():
        if t.is_floating_point() or t.is_complex():
            finite = torch.isfinite(t)
            if not bool(finite.all()):
                bad = int((~finite).sum())
                kinds = []
                if bool(torch.isnan(t).any()):
                    kinds.append("NaN")
                if bool(torch.isinf(t).any()):
                    kinds.append("Inf")
                raise GleakError(f"{what} '{name}' contains {'/'.join(kinds)} ({bad} of {t.numel()} values)")


def load_capture(path: str | Path) -> Capture:
    """Read and validate a capture file (framing, metadata types, kind, finite values)."""
    p = Path(path)
    tensors, raw_meta = read_safetensors(p, "capture")
    known, extra = parse_metadata(raw_meta)
    kind = known.get("gleak.kind")
    if kind is None:
        raise GleakError(f"{p}: missing metadata key 'gleak.kind' (one of {', '.join(KINDS)}); not a gleak capture?")
    if kind == TRUTH_KIND:
        raise GleakError(f"{p}: this is a ground-truth file (gleak.kind=truth), not a capture")
    version = known.get("gleak.schema_version", SCHEMA["gleak.schema_version"].default)
    if version > SCHEMA_VERSION:
        raise GleakError(f"{p}: capture schema version {version} is newer than this gleak supports ({SCHEMA_VERSION})")
    if not tensors:
        raise GleakError(f"{p}: the capture holds no tensors")
    check_finite(tensors)
    return Capture(tensors=tensors, meta=known, extra=extra, path=p)


def validate_against_model(capture: Capture, model: nn.Module) -> None:
    """The capture must hold exactly the model's parameters (buffers optional), with the same shapes; a tied weight
    (one parameter under two state-dict names, as GPT-2's embedding and LM head) once, under either name."""
    state = model.state_dict()
    params = [n for n, _ in model.named_parameters()]
    missing = [n for n in params if n not in capture.tensors]
    extra = [n for n in capture.tensors if n not in state]
    shapes = [(name, tuple(t.shape), tuple(state[name].shape)) for name, t in capture.tensors.items()
              if name in state and tuple(t.shape) != tuple(state[name].shape)]
    problems = describe_key_mismatch(missing, extra, shapes, have="capture", hint=MODEL_HINT)
    if problems:
        raise GleakError("capture does not match the model: " + problems)


def check_model_hash(capture: Capture, weights_sha256: str, allow_mismatch: bool = False) -> ModelCheck:
    """Compare the capture's ``gleak.model.sha256`` with the model's tensors hash; a mismatch is refused.

    An attack on other weights than the ones the client trained from silently gives wrong answers (RLU falls
    from 1.000 to 0.250 on a re-initialised LeNet), so only an explicit override lets it run, and the reports
    record the override."""
    recorded = capture.get("gleak.model.sha256")
    if recorded is None:
        return ModelCheck(status="not_recorded", recorded_sha256=None, model_sha256=weights_sha256)
    if recorded == weights_sha256:
        return ModelCheck(status="match", recorded_sha256=recorded, model_sha256=weights_sha256)
    if not allow_mismatch:
        raise GleakError(f"the model's weights (sha256 {weights_sha256[:12]}…) are not the ones the capture was made "
                         f"with (gleak.model.sha256 {recorded[:12]}…); pass the global model of that round, or "
                         "--allow-model-mismatch to attack anyway (reports record it)")
    return ModelCheck(status="mismatch_allowed", recorded_sha256=recorded, model_sha256=weights_sha256)


# ---------------------------------------------------------------------------------------------- writing


def _save(tensors: Mapping[str, torch.Tensor], meta: dict[str, str], path: str | Path, force: bool) -> Path:
    return save_safetensors(path, tensors, meta, force=force)


def save_capture(capture: Capture, path: str | Path, force: bool = False, truth: Truth | TextTruth | None = None, *,
                 clock: bool = True) -> Path:
    """Write a capture atomically; refuses to overwrite an existing file unless ``force``.

    With ``truth``, also write the ground truth to ``NAME.truth.safetensors`` beside it (see
    :func:`truth_path_for`), bound to the capture's bytes; ``gleak labels`` / ``reconstruct`` pick it up.

    ``gleak.created_at`` is the capture's own when its metadata has one, else ``SOURCE_DATE_EPOCH``, else now;
    ``clock=False`` (a capture derived from another, as ``gleak defend`` writes) never reads the clock
    (:mod:`gleak.reproducible`)."""
    if capture.meta.get("gleak.kind") not in KINDS:
        raise GleakError(f"capture kind must be one of {', '.join(KINDS)}")
    check_finite(capture.tensors)
    if truth is not None:
        truth = _cpu_truth(truth) if isinstance(truth, Truth) else _cpu_text_truth(truth)
        held = truth.labels.shape[0] if isinstance(truth, Truth) else truth.num_examples
        examples = capture.meta.get("gleak.num_examples")
        if examples is not None and held != examples:
            what = "labels" if isinstance(truth, Truth) else "sequences"
            raise GleakError(f"the truth holds {held} {what}, the capture {examples} examples")
        if not force and truth_path_for(path).exists():
            raise GleakError(f"{truth_path_for(path)} already exists; pass force=True to overwrite it")
    meta = {"format": "pt", "gleak.schema_version": SCHEMA_VERSION, "gleak.producer": f"gleak {__version__}",
            **capture.meta}
    stamp = created_at(capture.meta.get("gleak.created_at"), clock=clock)
    if stamp is not None:
        meta["gleak.created_at"] = stamp
    out = _save(capture.tensors, format_metadata(meta, capture.extra), path, force)
    capture.path = out
    if isinstance(truth, Truth):
        save_truth(truth, truth_path_for(out), capture_path=out, force=force)
    elif truth is not None:
        save_text_truth(truth, truth_path_for(out), capture_path=out, force=force)
    return out


def _cpu_text_truth(truth: TextTruth) -> TextTruth:
    """Detached CPU int64 tensors (the file format's type), checked."""
    labels = None if truth.labels is None else truth.labels.detach().cpu().long()
    out = TextTruth(input_ids=truth.input_ids.detach().cpu().long(),
                    attention_mask=truth.attention_mask.detach().cpu().long(), labels=labels, meta=dict(truth.meta),
                    extra=dict(truth.extra))
    out.check()
    return out


def save_text_truth(truth: TextTruth, path: str | Path, capture_path: str | Path | None = None,
                    force: bool = False) -> Path:
    """Write a text capture's ground truth (``input_ids``, ``attention_mask``, and ``labels`` for a classifier);
    binds it to the capture file's sha256 when given."""
    truth = _cpu_text_truth(truth)
    return _save_truth_file(truth.tensors(), truth.meta, truth.extra, path, capture_path, force, modality="text")


def load_text_truth(path: str | Path, capture: Capture | None = None) -> TextTruth:
    """Read a text capture's ground truth; when ``capture`` has a path, check the file belongs to it."""
    p = Path(path)
    tensors, known, extra = _read_truth_file(p)
    for name in ("input_ids", "attention_mask"):
        if name not in tensors:
            raise GleakError(f"{p}: a text ground-truth file needs the '{name}' tensor")
    for name, t in tensors.items():
        if name in ("input_ids", "attention_mask", "labels") and t.dtype != torch.int64:
            raise GleakError(f"{p}: '{name}' must be int64, got {t.dtype}")
    truth = TextTruth(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"],
                      labels=tensors.get("labels"), meta=known, extra=extra)
    truth.check(str(p))
    _check_bound(p, known, capture)
    return truth


def _check_bound(p: Path, known: Mapping[str, Any], capture: Capture | None) -> None:
    expected_sha = known.get("gleak.capture.sha256")
    if capture is not None and capture.path is not None and expected_sha:
        actual = file_sha256(capture.path)
        if actual != expected_sha:
            raise GleakError(f"{p}: ground truth belongs to a different capture (sha256 {expected_sha[:12]}…, "
                             f"capture is {actual[:12]}…)")


def _read_truth_file(p: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, str]]:
    """A ground-truth file's tensors, typed metadata and unknown keys; refused unless ``gleak.kind`` is truth."""
    tensors, raw_meta = read_safetensors(p, "ground-truth file")
    known, extra = parse_metadata(raw_meta)
    if known.get("gleak.kind") != TRUTH_KIND:
        raise GleakError(f"{p}: not a ground-truth file (gleak.kind is {known.get('gleak.kind')!r}, expected 'truth')")
    return tensors, known, extra


def _save_truth_file(tensors: Mapping[str, torch.Tensor], truth_meta: Mapping[str, Any], extra: Mapping[str, str],
                     path: str | Path, capture_path: str | Path | None, force: bool,
                     modality: str | None = None) -> Path:
    """Write a ground-truth file (``gleak.kind`` truth, ``gleak.modality`` when given, then the truth's own keys);
    binds it to the capture file's sha256 when ``capture_path`` is given."""
    meta: dict[str, Any] = {"format": "pt", "gleak.schema_version": SCHEMA_VERSION, "gleak.kind": TRUTH_KIND}
    if modality is not None:
        meta["gleak.modality"] = modality
    meta.update(truth_meta)
    if capture_path is not None:
        meta["gleak.capture.sha256"] = file_sha256(capture_path)
    return _save(tensors, format_metadata(meta, extra), path, force)


def _cpu_truth(truth: Truth) -> Truth:
    """Detached CPU tensors; integer class indices as int64 (the file format's hard-label type)."""
    labels = truth.labels.detach().cpu()
    if not labels.is_floating_point():
        labels = labels.long()
    return Truth(labels=labels, inputs=truth.inputs.detach().cpu(), meta=dict(truth.meta), extra=dict(truth.extra))


def truth_path_for(capture_path: str | Path) -> Path:
    """``run.safetensors`` -> ``run.truth.safetensors``."""
    p = Path(capture_path)
    stem = p.name[: -len(".safetensors")] if p.name.endswith(".safetensors") else p.stem
    return p.with_name(stem + ".truth.safetensors")


def save_truth(truth: Truth, path: str | Path, capture_path: str | Path | None = None, force: bool = False) -> Path:
    """Write the ground-truth companion; binds it to the capture file's sha256 when given."""
    truth = _cpu_truth(truth)
    return _save_truth_file({"labels": truth.labels, "inputs": truth.inputs}, truth.meta, truth.extra, path,
                            capture_path, force)


def load_truth(path: str | Path, capture: Capture | None = None) -> Truth:
    """Read a truth file; when ``capture`` has a path, check the file belongs to it."""
    p = Path(path)
    tensors, known, extra = _read_truth_file(p)
    if known.get("gleak.modality") == "text" or "input_ids" in tensors:
        raise GleakError(f"{p}: the ground truth of a text capture (token batches: input_ids, attention_mask); "
                         "read it with gleak.capture.load_text_truth")
    for name in ("labels", "inputs"):
        if name not in tensors:
            raise GleakError(f"{p}: ground-truth file lacks the '{name}' tensor")
    labels, inputs = tensors["labels"], tensors["inputs"]
    if labels.dim() == 1 and labels.dtype != torch.int64:
        raise GleakError(f"{p}: hard labels must be int64 [N], got {labels.dtype}")
    if labels.dim() == 2 and not labels.is_floating_point():
        raise GleakError(f"{p}: soft labels must be float [N, C], got {labels.dtype}")
    if labels.dim() not in (1, 2) or labels.shape[0] != inputs.shape[0]:
        raise GleakError(f"{p}: labels {list(labels.shape)} and inputs {list(inputs.shape)} disagree")
    check_finite({"labels": labels, "inputs": inputs}, what="truth tensor")
    _check_bound(p, known, capture)
    return Truth(labels=labels, inputs=inputs, meta=known, extra=extra)


# ------------------------------------------------------------------------------- helpers for user code


def _base_meta(model_state: Mapping[str, torch.Tensor], **meta: Any) -> dict[str, Any]:
    out = {"gleak.model.sha256": tensors_sha256(model_state)}
    out.update({k: v for k, v in meta.items() if v is not None})
    return out


def _floats(values: Sequence[float] | torch.Tensor | None) -> list[float] | None:
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        return [float(v) for v in values.detach().flatten().tolist()]
    return [float(v) for v in values]


def _data_meta(mean: Sequence[float] | torch.Tensor | None, std: Sequence[float] | torch.Tensor | None,
               input_shape: Sequence[int] | None) -> dict[str, Any]:
    """``gleak.data.mean`` / ``gleak.data.std``: one value per input channel (a single value is repeated)."""
    if (mean is None) != (std is None):
        raise GleakError("pass both mean and std (the normalisation x → (x − mean) / std), or neither")
    out: dict[str, Any] = {"gleak.data.mean": _floats(mean), "gleak.data.std": _floats(std)}
    channels = int(input_shape[0]) if input_shape else None
    for key, values in out.items():
        if values is None or channels is None:
            continue
        if len(values) == 1:
            out[key] = values * channels
        elif len(values) != channels:
            raise GleakError(f"{key} has {len(values)} values; the inputs have {channels} channels")
    return out


def capture_gradients(
    model: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    loss: LossSpec | None = None,
    metadata: Mapping[str, Any] | None = None,
    include_buffers: bool = False,
    *,
    mean: Sequence[float] | torch.Tensor | None = None,
    std: Sequence[float] | torch.Tensor | None = None,
) -> Capture:
    """FedSGD capture: dL/dθ of one batch, computed with the model in its current train/eval mode.

    ``inputs`` are the normalised tensors the model takes; ``mean`` / ``std`` record that normalisation
    (per channel). ``labels`` are class indices [B] or soft labels [B, C]. Batch size, input shape, number of
    classes (from the model's output), loss and the model hash are filled in; a gradient needs no optimizer
    keys. ``metadata`` adds or overrides gleak.* keys.

    The model is left as it was: a train-mode forward updates BatchNorm's running statistics, so the buffers are
    put back afterwards, and a model saved after capturing still has the weights (and hash) the capture records.
    """
    spec = loss or LossSpec()
    params = dict(model.named_parameters())
    global_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    saved_buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    model.zero_grad(set_to_none=True)
    try:
        logits = model(inputs)
        value = client_loss(logits, labels, spec)
        grads = torch.autograd.grad(value, list(params.values()), allow_unused=True)
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(saved_buffers[name])
    tensors = {
        n: (g if g is not None else torch.zeros_like(p)).detach().cpu()
        for (n, p), g in zip(params.items(), grads, strict=True)
    }
    buffers = [n for n, _ in model.named_buffers()] if include_buffers else []
    for n in buffers:
        tensors[n] = global_state[n]
    meta = _base_meta(
        global_state, **{"gleak.kind": "gradient", "gleak.batch_size": int(inputs.shape[0]),
                         "gleak.num_examples": int(inputs.shape[0]), "gleak.local_steps": 1,
                         "gleak.fl.scheme": "fedsgd", "gleak.num_classes": int(logits.shape[-1]),
                         "gleak.input_shape": list(inputs.shape[1:]),
                         "gleak.model.train_mode": model.training, **spec.metadata(),
                         **_data_meta(mean, std, inputs.shape[1:])},
    )
    if buffers:
        meta["gleak.buffers"] = buffers
    meta.update(metadata or {})
    return Capture(tensors=tensors, meta=meta)


def _infer_num_classes(tensors: Mapping[str, torch.Tensor]) -> int | None:
    """Classes C from the update's last layer (the last 2-D weight with a matching bias), when one is found."""
    try:
        return guess_last_layer(tensors).num_classes
    except GleakError:
        return None


def capture_update(
    global_state: Mapping[str, torch.Tensor],
    local_state: Mapping[str, torch.Tensor],
    learning_rate: float | None = None,
    local_steps: int = 1,
    batch_size: int | None = None,
    buffers: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    *,
    optimizer: str | None = None,
    momentum: float | None = None,
    weight_decay: float | None = None,
    loss: LossSpec | None = None,
    inputs: torch.Tensor | None = None,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    mean: Sequence[float] | torch.Tensor | None = None,
    std: Sequence[float] | torch.Tensor | None = None,
    scheme: str | None = None,
) -> Capture:
    """FedAvg-style capture: Δθ = θ_local − θ_global for every tensor of the two state dicts.

    Record how the client trained: ``optimizer`` (sgd, sgdm, nag, adam), ``momentum`` (sgdm / nag only),
    ``weight_decay``, ``loss``, ``scheme`` (default fedavg). ``input_shape`` is taken from ``inputs`` (one
    batch the client trained on) when not given, ``num_classes`` from the last layer of the state dict, and
    ``batch_size`` from ``inputs``. ``mean`` / ``std`` record the input normalisation. ``metadata`` adds or
    overrides gleak.* keys.
    """
    if set(global_state) != set(local_state):
        diff = sorted(set(global_state) ^ set(local_state))
        raise GleakError(f"the two state dicts have different tensors: {quote_names(diff)}")
    if momentum is not None and optimizer not in ("sgdm", "nag"):
        raise GleakError("momentum applies to optimizer 'sgdm' or 'nag'")
    tensors = {}
    for name, g in global_state.items():
        loc = local_state[name]
        if tuple(loc.shape) != tuple(g.shape):
            raise GleakError(f"shape mismatch for '{name}': global {list(g.shape)}, local {list(loc.shape)}")
        tensors[name] = (loc.detach().cpu() - g.detach().cpu())
    buffer_list = list(buffers)
    if inputs is not None:
        input_shape = input_shape or list(inputs.shape[1:])
        batch_size = batch_size or int(inputs.shape[0])
    shape = [int(v) for v in input_shape] if input_shape is not None else None
    if num_classes is None:
        num_classes = _infer_num_classes({k: v for k, v in tensors.items() if k not in set(buffer_list)})
    meta = _base_meta(global_state, **{
        "gleak.kind": "update", "gleak.local_steps": local_steps, "gleak.learning_rate": learning_rate,
        "gleak.batch_size": batch_size,
        "gleak.num_examples": batch_size * local_steps if batch_size else None,
        "gleak.optimizer": optimizer, "gleak.momentum": momentum, "gleak.weight_decay": weight_decay,
        "gleak.fl.scheme": scheme, "gleak.num_classes": num_classes, "gleak.input_shape": shape,
        **(loss.metadata() if loss is not None else {}), **_data_meta(mean, std, shape),
    })
    if buffer_list:
        meta["gleak.buffers"] = buffer_list
    meta.update(metadata or {})
    return Capture(tensors=tensors, meta=meta)


# ------------------------------------------------------------------------------- token batches (text)


def lm_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Next-token targets in the Hugging Face convention: the input ids with pads set to -100 (the shift is made
    by the loss)."""
    return input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)


def model_logits(output: Any) -> torch.Tensor:
    """The logits of a model's output: a tensor, an object with ``.logits`` (transformers), or a tuple's first."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise GleakError(f"the model's output ({type(output).__name__}) holds no logits")


def token_loss(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               labels: torch.Tensor | None = None, task: str = "causal_lm") -> torch.Tensor:
    """The client's loss on a token batch. ``causal_lm``: next-token cross-entropy, mean over the non-pad targets
    (logits [B, T, V]; position t predicts token t + 1), as transformers computes it with ``labels = input_ids`` and
    pads set to -100, except that a pad never predicts either: with left padding, the last pad's prediction of the
    first real token is skipped too (METHODS-text §1.1: only real positions 0 … T_i − 2 are scored; with right
    padding this is exactly the transformers loss). ``sequence_classification``: cross-entropy of ``labels`` [B] on
    logits [B, C], mean over B."""
    if task == "sequence_classification":
        if labels is None:
            raise GleakError("a sequence classifier's loss needs labels (one class per sequence)")
        return torch.nn.functional.cross_entropy(logits.float(), labels.to(logits.device).long())
    if task != "causal_lm":
        raise GleakError(f"unknown text task {task!r}; one of {', '.join(TEXT_TASKS)}")
    targets = lm_labels(input_ids, attention_mask)[:, 1:].masked_fill(attention_mask[:, :-1] == 0, IGNORE_INDEX)
    targets = targets.to(logits.device)
    if not bool((targets != IGNORE_INDEX).any()):
        raise GleakError("the batch has no next-token target: every sequence has fewer than two real tokens")
    shifted = logits[:, :-1, :].float()
    return torch.nn.functional.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1),
                                             ignore_index=IGNORE_INDEX)


class TokenizerKeys(TypedDict, total=False):
    """What a text capture records of its tokenizer, when given (``gleak simulate`` records it from the model
    folder): keyword arguments of :func:`capture_token_gradients` and :func:`capture_token_update`, passed on to
    :func:`text_metadata`."""

    tokenizer_sha256: str | None
    padding_side: str | None
    max_length: int | None
    pad_token_id: int | None


def text_metadata(*, task: str, vocab_size: int | None, tokenizer_sha256: str | None = None,
                  padding_side: str | None = None, max_length: int | None = None,
                  pad_token_id: int | None = None, num_classes: int | None = None) -> dict[str, Any]:
    """The ``gleak.*`` keys that describe a text capture (None values are left out)."""
    if task not in TEXT_TASKS:
        raise GleakError(f"unknown text task {task!r}; one of {', '.join(TEXT_TASKS)}")
    meta: dict[str, Any] = {
        "gleak.modality": "text", "gleak.task": task, "gleak.vocab_size": vocab_size,
        "gleak.tokenizer.sha256": tokenizer_sha256, "gleak.tokenizer.padding_side": padding_side,
        "gleak.max_length": max_length, "gleak.pad_token_id": pad_token_id,
        "gleak.num_classes": num_classes if task == "sequence_classification" else None,
        "gleak.loss": "cross_entropy", "gleak.loss.reduction": "mean",
    }
    return {k: v for k, v in meta.items() if v is not None}


def _vocab_size(model: nn.Module, logits: torch.Tensor | None, task: str) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    if isinstance(embeddings, nn.Embedding):
        return int(embeddings.num_embeddings)
    return int(logits.shape[-1]) if logits is not None and task == "causal_lm" else None


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters the client trains, by name; a tied weight appears once (named_parameters drops repeats)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def capture_token_gradients(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    *,
    task: str | None = None,
    train_mode: bool = False,
    metadata: Mapping[str, Any] | None = None,
    **tokenizer: Unpack[TokenizerKeys],
) -> Capture:
    """FedSGD capture of a token batch: dL/dθ of one batch of B sequences.

    ``input_ids`` and ``attention_mask`` are integer [B, T] (the mask defaults to all ones). ``task`` is
    ``causal_lm`` (next-token cross-entropy, mean over the non-pad targets; :func:`token_loss`) or
    ``sequence_classification`` (``labels`` [B]); by default, the latter when ``labels`` are given. The model runs in
    eval mode unless ``train_mode`` (dropout makes a client's inputs differ from what an attacker recomputes), and is
    put back in its mode afterwards. Tensors are named by ``named_parameters()``: a tied weight (GPT-2's embedding
    and LM head) appears once; frozen parameters are left out. The tokenizer's hash, padding side, truncation
    length and pad id are recorded when given (``gleak simulate`` records them from the model folder)."""
    task = task or ("sequence_classification" if labels is not None else "causal_lm")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    check_token_batch(input_ids, mask)
    params = _trainable(model)
    if not params:
        raise GleakError("the model has no trainable parameters")
    global_hash = tensors_sha256(model.state_dict())
    was_training = model.training
    model.train(train_mode)
    model.zero_grad(set_to_none=True)
    try:
        logits = model_logits(model(input_ids=input_ids, attention_mask=mask))
        value = token_loss(logits, input_ids, mask, labels, task)
        grads = torch.autograd.grad(value, list(params.values()), allow_unused=True)
    finally:
        model.train(was_training)
    tensors = {n: (g if g is not None else torch.zeros_like(p)).detach().cpu()
               for (n, p), g in zip(params.items(), grads, strict=True)}
    b = int(input_ids.shape[0])
    tokenizer["max_length"] = tokenizer.get("max_length") or int(input_ids.shape[1])
    meta: dict[str, Any] = {
        "gleak.model.sha256": global_hash, "gleak.kind": "gradient", "gleak.batch_size": b, "gleak.num_examples": b,
        "gleak.local_steps": 1, "gleak.fl.scheme": "fedsgd", "gleak.model.train_mode": train_mode,
        **text_metadata(task=task, vocab_size=_vocab_size(model, logits, task),
                        num_classes=int(logits.shape[-1]) if logits.dim() == 2 else None, **tokenizer),
    }
    meta.update(metadata or {})
    return Capture(tensors=tensors, meta=meta)


def capture_token_update(
    global_model: nn.Module,
    local_model: nn.Module,
    *,
    learning_rate: float,
    local_steps: int,
    batch_size: int,
    task: str = "causal_lm",
    optimizer: str = "sgd",
    momentum: float | None = None,
    weight_decay: float | None = None,
    scheme: str = "fedavg",
    train_mode: bool = False,
    metadata: Mapping[str, Any] | None = None,
    **tokenizer: Unpack[TokenizerKeys],
) -> Capture:
    """FedAvg-style capture of a language model: Δθ = θ_local − θ_global of every trainable parameter (by
    ``named_parameters()``, a tied weight once), with how the client trained and the text keys of
    :func:`capture_token_gradients`. ``gleak.model.sha256`` is the hash of the global model's full state dict."""
    names = list(_trainable(global_model))
    local = dict(local_model.named_parameters())
    missing = [n for n in names if n not in local]
    if missing:
        raise GleakError(f"the local model lacks parameters of the global one: {quote_names(missing)}")
    global_params = dict(global_model.named_parameters())
    capture = capture_update({n: global_params[n] for n in names}, {n: local[n] for n in names}, learning_rate,
                             local_steps, batch_size, optimizer=optimizer, momentum=momentum, weight_decay=weight_decay,
                             scheme=scheme, num_classes=0 if task == "causal_lm" else None)
    capture.meta.pop("gleak.num_classes", None)
    logits_width = None
    if task == "sequence_classification":
        head = [t for n, t in capture.tensors.items() if n.endswith("weight") and t.dim() == 2]
        logits_width = int(head[-1].shape[0]) if head else None
    capture.meta.update({
        "gleak.model.sha256": tensors_sha256(global_model.state_dict()), "gleak.model.train_mode": train_mode,
        **text_metadata(task=task, vocab_size=_vocab_size(global_model, None, task), num_classes=logits_width,
                        **tokenizer),
    })
    capture.meta.update(metadata or {})
    return capture


# ------------------------------------------------------------------------------------------ LoRA (text)


def capture_lora_gradients(
    peft_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    *,
    base_sha256: str,
    task: str | None = None,
    train_mode: bool = False,
    metadata: Mapping[str, Any] | None = None,
    **tokenizer: Unpack[TokenizerKeys],
) -> Capture:
    """FedSGD capture of a LoRA client: :func:`capture_token_gradients` of a peft model whose adapter alone trains,
    with the tensors renamed as peft saves the adapter (``….q_proj.lora_A.weight``) and the ``gleak.peft.*`` keys
    (docs/capture-format.md, "LoRA captures"). ``base_sha256`` is the base model's tensors hash, taken before peft
    wrapped it (``LoadedModel.weights_sha256``); it becomes ``gleak.model.sha256``. At peft's standard init
    ``lora_B`` = 0, so the ``lora_A`` gradients are exactly zero (METHODS-text §3.9)."""
    from gleak.models.peft import adapter_config_dict, adapter_names, adapter_state, lora_metadata

    adapter_sha256 = tensors_sha256(adapter_state(peft_model))
    capture = capture_token_gradients(peft_model, input_ids, attention_mask, labels, task=task,
                                      train_mode=train_mode, metadata=metadata, **tokenizer)
    capture.tensors = adapter_names(peft_model, capture.tensors)
    capture.meta.update(lora_metadata(adapter_config_dict(peft_model), base_sha256=base_sha256,
                                      adapter_sha256=adapter_sha256))
    return capture


def capture_lora_update(
    global_adapter: Mapping[str, torch.Tensor],
    local_adapter: Mapping[str, torch.Tensor],
    *,
    adapter_config: Mapping[str, Any],
    base_sha256: str,
    vocab_size: int | None,
    learning_rate: float | None = None,
    local_steps: int | None = None,
    batch_size: int | None = None,
    task: str = "causal_lm",
    optimizer: str | None = None,
    momentum: float | None = None,
    weight_decay: float | None = None,
    scheme: str = "fedavg",
    train_mode: bool | None = None,
    metadata: Mapping[str, Any] | None = None,
    **tokenizer: Unpack[TokenizerKeys],
) -> Capture:
    """FedAvg-style capture of a LoRA client: Δ = local − global of every adapter tensor (both keyed as peft saves
    an adapter; half-precision tensors are subtracted in float32), with the text keys, the ``gleak.peft.*`` keys of
    ``adapter_config`` (the global adapter's ``adapter_config.json``) and ``gleak.model.sha256`` = ``base_sha256``.
    A value left None is not recorded (``gleak capture`` knows only what it is told)."""
    from gleak.models.peft import lora_metadata

    def wide(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for n, t in state.items()}

    capture = capture_update(wide(global_adapter), wide(local_adapter), learning_rate, local_steps or 1, batch_size,
                             optimizer=optimizer, momentum=momentum, weight_decay=weight_decay, scheme=scheme,
                             num_classes=0)
    capture.meta.pop("gleak.num_classes", None)
    if local_steps is None:
        capture.meta.pop("gleak.local_steps", None)
        capture.meta.pop("gleak.num_examples", None)
    capture.meta.update({
        "gleak.model.train_mode": train_mode, **text_metadata(task=task, vocab_size=vocab_size, **tokenizer),
        **lora_metadata(adapter_config, base_sha256=base_sha256, adapter_sha256=tensors_sha256(global_adapter)),
    })
    capture.meta = {k: v for k, v in capture.meta.items() if v is not None}
    capture.meta.update(metadata or {})
    return capture


# ------------------------------------------------------------------------------------ documentation


def _num(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _bounds(key: str, spec: Field) -> str:
    parts = []
    if spec.choices:
        parts.append(" \\| ".join(f"`{c}`" for c in spec.choices))
    low, high = spec.minimum, spec.maximum
    high_text = None if high is None else "< 1" if high == 0.999999 else f"≤ {_num(high)}"
    if low is not None and high is not None and high_text and high_text.startswith("≤"):
        parts.append(f"{_num(low)} … {_num(high)}")
    elif low is not None:
        parts.append(f"≥ {_num(low)}" + (f" and {high_text}" if high_text else ""))
    elif high_text:
        parts.append(high_text)
    if spec.positive:
        parts.append("every value > 0" if spec.type.endswith("_list") else "> 0")
    if spec.type == "sha256":
        parts.append("64 lower-case hex digits")
    if key == "gleak.input_shape":
        parts.append(f"≤ {MAX_INPUT_ELEMENTS:,} values per example")
    if spec.type in ("json", "int_list", "float_list", "str_list"):
        parts.append("≤ 1 MiB of text")
    if spec.type in ("float", "float_list"):
        parts.append("finite")
    return "; ".join(parts) or "—"


def _default_text(spec: Field) -> str:
    if spec.default is None:
        return "— (not assumed)"
    if isinstance(spec.default, bool):
        return f"`{str(spec.default).lower()}`"
    return f"`{spec.default}`"


def metadata_table() -> str:
    """The Markdown table of every metadata key (docs/capture-format.md is generated from it)."""
    rows = ["| key | type | meaning | bounds | default when absent |", "|---|---|---|---|---|"]
    for key, spec in SCHEMA.items():
        doc = spec.doc.replace("|", "\\|")
        rows.append(f"| `{key}` | {spec.type} | {doc} | {_bounds(key, spec)} | {_default_text(spec)} |")
    return "\n".join(rows) + "\n"
