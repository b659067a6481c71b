"""Language models from a local Hugging Face folder (the ``text`` extra: transformers, tokenizers, peft).

A folder is recognised by its ``config.json`` beside the weights: ``model.safetensors``, or shards
``model-*.safetensors`` with ``model.safetensors.index.json``; the tokenizer's files sit beside them. It is loaded
offline (``local_files_only``; nothing is downloaded) and from safetensors only: a folder with only
``pytorch_model.bin`` (a pickle) is refused unless ``trust_pickle``. A config that needs code from the folder
(``auto_map``, or a ``model_type`` that transformers does not know) is refused unless ``trust_remote_code``.

Causal language models (``*ForCausalLM``, ``*LMHeadModel``: GPT-2, LLaMA, Mistral, Qwen, …) and sequence
classifiers (``*ForSequenceClassification``) are supported, chosen by the config's ``architectures``.

``transformers`` is imported inside the functions only, so that ``gleak --help`` never pays for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gleak.errors import GleakError, shorten
from gleak.io import check_input_file, read_json_input, show

if TYPE_CHECKING:
    from torch import nn

EXTRA_HINT = ("install the text extra from the gleak clone (gleak is on no package index): pip install '.[text]' "
              "into gleak's environment, or uv tool install '.[text]' for the command")
CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
ADAPTER_CONFIG = "adapter_config.json"
# the files a tokenizer is read from (tokenizer_sha256 hashes those present, by sorted name)
TOKENIZER_FILES = frozenset({"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                             "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                             "sentencepiece.bpe.model"})
TASKS = ("causal_lm", "sequence_classification")
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_CLASSIFIER_SUFFIX = "ForSequenceClassification"


@dataclass(frozen=True)
class TextModelInfo:
    """What a text model is, as the capture metadata and ``gleak inspect`` describe it."""

    task: str  # causal_lm | sequence_classification
    model_type: str
    architecture: str
    vocab_size: int
    tie_word_embeddings: bool
    max_positions: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | None
    padding_side: str
    tokenizer_sha256: str | None
    num_labels: int | None

    def metadata(self) -> dict[str, str]:
        """String metadata for :class:`~gleak.models.loading.LoadedModel` (``gleak.*`` keys, as in captures)."""
        values: dict[str, Any] = {
            "gleak.modality": "text", "gleak.task": self.task, "gleak.model_type": self.model_type,
            "gleak.hf.architecture": self.architecture, "gleak.vocab_size": self.vocab_size,
            "gleak.tie_word_embeddings": self.tie_word_embeddings, "gleak.max_positions": self.max_positions,
            "gleak.pad_token_id": self.pad_token_id, "gleak.bos_token_id": self.bos_token_id,
            "gleak.eos_token_id": self.eos_token_id, "gleak.tokenizer.padding_side": self.padding_side,
            "gleak.tokenizer.sha256": self.tokenizer_sha256, "gleak.num_labels": self.num_labels,
        }
        return {k: (json.dumps(v) if isinstance(v, bool) else str(v)) for k, v in values.items() if v is not None}


def is_text_model_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder that looks like a Hugging Face model (a ``config.json`` or an adapter's
    ``adapter_config.json`` in it)."""
    p = Path(path)
    try:
        return p.is_dir() and ((p / CONFIG_FILE).is_file() or (p / ADAPTER_CONFIG).is_file())
    except OSError:  # a name the file system cannot hold: not a folder; the file checks say why in one line
        return False


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise GleakError(f"language models need the transformers package: {EXTRA_HINT}") from None
    return transformers


def _why(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = shorten(lines[0], 200) if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a JSON object (size-checked, one-line errors)."""
    config = read_json_input(folder / CONFIG_FILE, "model config")
    if not isinstance(config, dict):
        raise GleakError(f"{show(folder / CONFIG_FILE)} is not a JSON object")
    return config


def task_of(config: dict[str, Any], where: str) -> tuple[str, str]:
    """(task, architecture) from the config's ``architectures``."""
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise GleakError(f"{where}: config.json names no architectures (e.g. 'architectures': "
                         "['GPT2LMHeadModel']); gleak loads causal LMs (*ForCausalLM, *LMHeadModel) and "
                         "*ForSequenceClassification")
    for name in names:
        if name.endswith(_CAUSAL_SUFFIXES):
            return "causal_lm", name
        if name.endswith(_CLASSIFIER_SUFFIX):
            return "sequence_classification", name
    raise GleakError(f"{where}: architectures {shorten(', '.join(names), 80)} are neither a causal LM (*ForCausalLM, "
                     "*LMHeadModel) nor a sequence classifier (*ForSequenceClassification)")


def _check_remote_code(config: dict[str, Any], where: str, trust_remote_code: bool, transformers: Any) -> None:
    if trust_remote_code:
        return
    if "auto_map" in config:
        raise GleakError(f"{where}: config.json needs code from the model folder (auto_map); running it could do "
                         "anything: pass --trust-remote-code if you trust its source")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
        raise GleakError(f"{where}: model_type {shorten(repr(model_type), 40)} is not one transformers "
                         f"{transformers.__version__} knows, so it would need code from the folder: pass "
                         "--trust-remote-code if you trust its source, or upgrade transformers")


def _weights_format(folder: Path, trust_pickle: bool) -> bool:
    """True for safetensors weights; False for a trusted pickle; else a one-line refusal."""
    if (folder / SAFETENSORS_FILE).is_file():
        check_input_file(folder / SAFETENSORS_FILE, "model weights")
        return True
    if (folder / SAFETENSORS_INDEX).is_file():
        index = read_json_input(folder / SAFETENSORS_INDEX, "safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise GleakError(f"{show(folder / SAFETENSORS_INDEX)} has no weight_map")
        for shard in sorted({str(v) for v in weight_map.values()}):
            if Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise GleakError(f"{show(folder / SAFETENSORS_INDEX)} names {shorten(repr(shard), 60)}; shards must "
                                 "be .safetensors files beside it")
            check_input_file(folder / shard, "model weights shard")
        return True
    if (folder / PICKLE_FILE).is_file() or (folder / PICKLE_INDEX).is_file():
        if trust_pickle:
            return False
        raise GleakError(f"{show(folder)} holds only {PICKLE_FILE} (a pickle: loading it runs code); convert it to "
                         "model.safetensors, or pass --trust-pickle if you trust its source")
    raise GleakError(f"{show(folder)} has a config.json but no weights ({SAFETENSORS_FILE}, or shards with "
                     f"{SAFETENSORS_INDEX})")


def tokenizer_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The tokenizer's files in ``folder`` (those of :data:`TOKENIZER_FILES` present), sorted by name."""
    p = Path(folder)
    return [p / name for name in sorted(TOKENIZER_FILES) if (p / name).is_file()]


def tokenizer_sha256(folder: str | os.PathLike[str]) -> str | None:
    """SHA-256 over the tokenizer's files (:func:`tokenizer_files`): for each, in sorted name order, the name
    (UTF-8), a NUL byte, the size as 8 little-endian bytes, then the bytes. None when there are none."""
    files = tokenizer_files(folder)
    if not files:
        return None
    h = hashlib.sha256()
    for file in files:
        checked = check_input_file(file, "tokenizer file")
        data = checked.read_bytes()
        h.update(file.name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def load_tokenizer(folder: str | os.PathLike[str], trust_remote_code: bool = False) -> Any:
    """The folder's tokenizer (``AutoTokenizer``, local files only). A tokenizer that needs code from the folder
    (``auto_map`` in tokenizer_config.json) is refused unless ``trust_remote_code``."""
    transformers = _transformers()
    p = Path(folder)
    if not tokenizer_files(p):
        raise GleakError(f"{show(p)} has no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.json, …)")
    tok_config = p / "tokenizer_config.json"
    if tok_config.is_file() and not trust_remote_code:
        data = read_json_input(tok_config, "tokenizer config")
        if isinstance(data, dict) and "auto_map" in data:
            raise GleakError(f"{show(tok_config)} needs code from the model folder (auto_map): pass "
                             "--trust-remote-code if you trust its source")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(p), local_files_only=True,
                                                          trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise GleakError(f"cannot load the tokenizer in {show(p)}: {_why(exc)}") from None


@contextlib.contextmanager
def _quiet_loading(transformers: Any) -> Iterator[None]:
    """transformers' weight-loading progress bar only where someone watches: off when stderr is not a terminal
    (CI logs, pipes), then put back as it was (the switch is process-wide)."""
    bars = transformers.utils.logging
    if sys.stderr.isatty() or not bars.is_progress_bar_enabled():
        yield
        return
    bars.disable_progress_bar()
    try:
        yield
    finally:
        bars.enable_progress_bar()


def open_text_model(path: str | os.PathLike[str], trust_pickle: bool = False,
                    trust_remote_code: bool = False) -> tuple[nn.Module, TextModelInfo, str]:
    """Load a Hugging Face folder (see the module's docstring) in eval mode: the module, what it is, and a
    description of the source (:func:`gleak.models.loading.load_model` wraps them in a ``LoadedModel``)."""
    folder = Path(path)
    if not (folder / CONFIG_FILE).is_file() and (folder / ADAPTER_CONFIG).is_file():
        raise GleakError(f"{show(folder)} is a PEFT adapter (adapter_config.json); pass the base model's folder")
    config_dict = read_config(folder)
    where = show(folder)
    task, architecture = task_of(config_dict, where)
    transformers = _transformers()
    _check_remote_code(config_dict, where, trust_remote_code, transformers)
    safetensors = _weights_format(folder, trust_pickle)
    auto = transformers.AutoModelForCausalLM if task == "causal_lm" else transformers.AutoModelForSequenceClassification
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
        with _quiet_loading(transformers):
            module = auto.from_pretrained(str(folder), config=config, local_files_only=True,
                                          use_safetensors=safetensors, trust_remote_code=trust_remote_code,
                                          **{dtype_key: "auto"})
    except Exception as exc:
        raise GleakError(f"cannot load the model in {where}: {_why(exc)}") from None
    module.eval()
    info = describe(module, task, architecture, folder)
    return module, info, f"Hugging Face folder ({architecture}, {'safetensors' if safetensors else 'trusted pickle'})"


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, list):  # eos_token_id may be a list (LLaMA 3): the first
        value = value[0] if value else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")  # config.json's longest sequence, first found


def text_limits(module: Any) -> tuple[int | None, int | None]:
    """(positions, vocabulary) of a transformers model: the longest sequence its config allows (``n_positions``,
    ``max_position_embeddings`` or ``n_ctx``; None when it names none) and the rows of its input embedding (the
    token ids it can look up; None without one). The text inputs are checked against both before any forward pass
    (:func:`gleak.data.text.tokenize`)."""
    config = getattr(module, "config", None)
    positions = None
    for key in POSITION_KEYS:
        value = _int_or_none(getattr(config, key, None))
        if value is not None and value > 0:
            positions = value
            break
    get = getattr(module, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    rows = getattr(embeddings, "num_embeddings", None)
    return positions, int(rows) if isinstance(rows, int) else None


def describe(module: Any, task: str, architecture: str, folder: Path | None) -> TextModelInfo:
    """The :class:`TextModelInfo` of a loaded transformers model (and its folder's tokenizer, when given)."""
    config = module.config
    padding_side = "right"
    pad = _int_or_none(getattr(config, "pad_token_id", None))
    if folder is not None and tokenizer_files(folder):
        tok_config = folder / "tokenizer_config.json"
        data = read_json_input(tok_config, "tokenizer config") if tok_config.is_file() else {}
        if isinstance(data, dict) and data.get("padding_side") in ("left", "right"):
            padding_side = str(data["padding_side"])
    max_positions, vocab_size = text_limits(module)
    return TextModelInfo(
        task=task, model_type=str(config.model_type), architecture=architecture,
        vocab_size=vocab_size if vocab_size is not None else int(config.vocab_size),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_positions=max_positions, pad_token_id=pad,
        bos_token_id=_int_or_none(getattr(config, "bos_token_id", None)),
        eos_token_id=_int_or_none(getattr(config, "eos_token_id", None)),
        padding_side=padding_side, tokenizer_sha256=tokenizer_sha256(folder) if folder is not None else None,
        num_labels=int(config.num_labels) if task == "sequence_classification" else None,
    )


def head_key(tensors: dict[str, Any], task: str, vocab_size: int | None) -> str | None:
    """The name of the output layer's weight among a text capture's tensors: the LM head (``lm_head.weight``, or the
    tied input embedding it shares, [V, d]) or the classifier (``score`` / ``classifier``). None if not found."""
    two_d = [k for k, v in tensors.items() if k.endswith("weight") and getattr(v, "dim", lambda: 0)() == 2]
    if task == "causal_lm":
        heads = [k for k in two_d if k.split(".")[-2:-1] == ["lm_head"]]
        tied = [k for k in two_d if vocab_size is not None and tensors[k].shape[0] == vocab_size]
        found = heads or tied
        return found[-1] if found else None
    heads = [k for k in two_d if any(p in ("score", "classifier", "out_proj") for p in k.split(".")[:-1])]
    return heads[-1] if heads else None
