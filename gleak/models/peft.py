"""LoRA adapters (the ``text`` extra's peft): the ``--peft lora:…`` spec, wrapping a base model, and adapter folders.

A LoRA on a projection adds s·B·A·u to W₀u, with A = ``lora_A`` (r × d), B = ``lora_B`` (d_out × r) and
s = alpha / r (METHODS-text §3.9). The tensors of a LoRA capture are named as peft saves an adapter
(``get_peft_model_state_dict``: ``base_model.model.….q_proj.lora_A.weight``, no adapter name), which is also how
``adapter_model.safetensors`` names them and what FlowerTune apps send. An adapter folder holds
``adapter_config.json`` and ``adapter_model.safetensors`` (``adapter_model.bin``, a pickle, only when trusted).

``peft`` is imported inside the functions only, so that ``gleak --help`` never pays for it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gleak.errors import GleakError, shorten
from gleak.io import (
    check_input_file,
    check_output_location,
    make_parent,
    read_json_input,
    read_safetensors,
    safetensors_bytes,
    show,
)
from gleak.models.text import ADAPTER_CONFIG, EXTRA_HINT

if TYPE_CHECKING:
    import torch
    from torch import nn

ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"
PEFT_DEFAULT_R = 8  # peft's LoraConfig defaults: r = 8, lora_alpha = 8
PEFT_DEFAULT_ALPHA = 8.0
MAX_R = 65_536
SPEC_KEYS = ("r", "alpha", "target", "dropout")
_MODULE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
# the adapter_config.json keys that decide which tensors a LoRA has and how they combine: two adapters of one
# federated run agree on all of them, and a base model wrapped with them gives the adapter's names and shapes
SHAPE_KEYS = ("r", "lora_alpha", "target_modules", "exclude_modules", "fan_in_fan_out", "bias", "use_rslora",
              "use_dora", "modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern")


@dataclass(frozen=True, kw_only=True)
class LoraSpec:
    """What ``--peft lora:r=R,alpha=A,target=M1+M2,dropout=P`` asks for. ``alpha`` defaults to peft's
    ``lora_alpha`` default (8, whatever r is); ``target_modules`` None leaves the choice to peft (its default for
    the model type: ``q_proj`` and ``v_proj`` for LLaMA, ``c_attn`` for GPT-2)."""

    r: int = PEFT_DEFAULT_R
    alpha: float = PEFT_DEFAULT_ALPHA
    target_modules: tuple[str, ...] | None = None
    dropout: float = 0.0


def parse_lora_spec(text: str) -> LoraSpec:
    """``lora`` or ``lora:KEY=VALUE,...`` (keys r, alpha, target, dropout; several targets joined by ``+``) as a
    :class:`LoraSpec`; a bad spec is one line naming the key or value."""
    method, _, rest = text.strip().partition(":")
    if method.strip().lower() != "lora":
        raise GleakError(f"--peft {shorten(repr(text), 60)}: only LoRA is supported (lora:r=8,alpha=16,"
                         "target=q_proj+v_proj)")
    values: dict[str, str] = {}
    for part in (p.strip() for p in rest.split(",")) if rest.strip() else ():
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise GleakError(f"--peft: {shorten(repr(part), 40)} is not KEY=VALUE (keys: {', '.join(SPEC_KEYS)})")
        if key not in SPEC_KEYS:
            raise GleakError(f"--peft: unknown key {shorten(repr(key), 40)}; the keys are {', '.join(SPEC_KEYS)}")
        if key in values:
            raise GleakError(f"--peft: {key} is given twice")
        values[key] = value
    r = _spec_number(values, "r", int, PEFT_DEFAULT_R)
    if not 1 <= r <= MAX_R:
        raise GleakError(f"--peft: r must be an integer in 1 … {MAX_R}, got {r}")
    alpha = _spec_number(values, "alpha", float, PEFT_DEFAULT_ALPHA)
    if not (math.isfinite(alpha) and alpha > 0):
        raise GleakError(f"--peft: alpha must be a finite number > 0, got {values['alpha']}")
    dropout = _spec_number(values, "dropout", float, 0.0)
    if not 0 <= dropout < 1:
        raise GleakError(f"--peft: dropout must be in [0, 1), got {values['dropout']}")
    targets = None
    if "target" in values:
        targets = tuple(t.strip() for t in values["target"].split("+"))
        bad = [t for t in targets if not _MODULE_NAME.fullmatch(t)]
        if bad:
            raise GleakError(f"--peft: target {shorten(repr(bad[0]), 40)} is not a module name (letters, digits, "
                             "_ . -; join several with +)")
        if len(set(targets)) != len(targets):
            raise GleakError("--peft: a target module is named twice")
    return LoraSpec(r=r, alpha=alpha, target_modules=targets, dropout=dropout)


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter as a folder holds it: ``adapter_config.json`` as a dict and the tensors under peft's saved names
    (the global adapter a simulated client started from, which an attacker knows)."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @classmethod
    def of(cls, peft_model: Any) -> LoraAdapter:
        """The active adapter of a peft model, copied."""
        return cls(adapter_config_dict(peft_model), adapter_state(peft_model))


def _spec_number(values: Mapping[str, str], key: str, kind: type[int] | type[float], default: Any) -> Any:
    if key not in values:
        return default
    try:
        return kind(values[key])
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise GleakError(f"--peft: {key} must be {expected}, got {shorten(repr(values[key]), 40)}") from None


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise GleakError(f"LoRA adapters need the peft package: {EXTRA_HINT}") from None
    return peft


def _why(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {shorten(lines[0], 200)}" if lines else type(exc).__name__


def _alpha_value(alpha: float) -> float | int:
    """An integral alpha as an int, as peft writes it (``"lora_alpha": 16``)."""
    return int(alpha) if float(alpha).is_integer() else float(alpha)


def wrap_lora(model: nn.Module, spec: LoraSpec, *, seed: int) -> Any:
    """``model`` (a causal LM, changed in place) wrapped by ``peft.get_peft_model`` with a fresh LoRA of ``spec``:
    only the adapter trains. The adapter's random init (``lora_A``; ``lora_B`` starts at 0) is drawn from ``seed``
    without touching torch's global generator, so one seed gives one adapter."""
    import torch

    peft = _peft()
    config = peft.LoraConfig(r=spec.r, lora_alpha=_alpha_value(spec.alpha), lora_dropout=spec.dropout,
                             target_modules=list(spec.target_modules) if spec.target_modules else None,
                             task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "fan_in_fan_out is set to False but the target is Conv1D" (GPT-2)
        torch.manual_seed(seed)
        try:
            return peft.get_peft_model(model, config)
        except (ValueError, TypeError, KeyError, RuntimeError) as exc:
            raise GleakError(f"--peft: peft cannot put this LoRA on the model: {_why(exc)}") from None


def spec_of_config(config: Mapping[str, Any]) -> LoraSpec:
    """The :class:`LoraSpec` that rebuilds an adapter of ``config`` (its ``adapter_config.json``) with
    :func:`wrap_lora`; one line for what that cannot rebuild (target modules as a regex, rsLoRA)."""
    r, alpha, targets = lora_settings(config)
    if isinstance(config.get("target_modules"), str):
        raise GleakError("the adapter names its target modules by a regex; gleak rebuilds adapters from module names")
    if config.get("use_rslora"):
        raise GleakError("the adapter uses rsLoRA scaling; gleak rebuilds plain LoRA adapters")
    dropout = config.get("lora_dropout", 0.0)
    return LoraSpec(r=r, alpha=alpha, target_modules=tuple(targets),
                    dropout=float(dropout) if isinstance(dropout, int | float) else 0.0)


def load_adapter_state(peft_model: Any, tensors: Mapping[str, torch.Tensor]) -> None:
    """Set a peft model's active adapter to ``tensors`` (peft's saved names, e.g. a global adapter read with
    :func:`load_adapter`); one line unless every adapter tensor is given with its shape."""
    own = adapter_state(peft_model)
    if set(own) != set(tensors) or any(tuple(own[n].shape) != tuple(tensors[n].shape) for n in own):
        raise GleakError("the global adapter does not fit the adapter the capture's settings build (other modules, "
                         "rank or shapes)")
    _peft().set_peft_model_state_dict(peft_model, {n: t.detach().clone() for n, t in tensors.items()})


def adapter_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors as peft saves them (``get_peft_model_state_dict``), detached copies on the CPU."""
    state = _peft().get_peft_model_state_dict(peft_model)
    return {name: t.detach().cpu().clone() for name, t in state.items()}


def adapter_names(peft_model: Any, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` keyed by the model's parameter names (``….lora_A.default.weight``) renamed as peft saves the
    adapter (``….lora_A.weight``); every one must belong to the adapter."""
    renamed = _peft().get_peft_model_state_dict(peft_model, state_dict=dict(tensors), save_embedding_layers=False)
    if len(renamed) != len(tensors):
        raise GleakError(f"the model trains {len(tensors)} tensors, {len(tensors) - len(renamed)} of them outside the "
                         "LoRA adapter; a LoRA capture holds the adapter's tensors only")
    return dict(renamed)


def _plain(value: Any) -> Any:
    """A peft config value as JSON: sets sorted, enums by value, nested dicts and lists too."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(getattr(value, "value", value))


def adapter_config_dict(peft_model: Any) -> dict[str, Any]:
    """The active adapter's config as ``adapter_config.json`` holds it (``inference_mode`` true, as peft saves)."""
    config = peft_model.peft_config[getattr(peft_model, "active_adapter", "default")]
    out = _plain(config.to_dict())
    out["inference_mode"] = True
    return dict(out)


# -------------------------------------------------------------------------------------------- adapter folders


def is_adapter_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder with an ``adapter_config.json``."""
    p = Path(path)
    try:
        return p.is_dir() and (p / ADAPTER_CONFIG).is_file()
    except OSError:
        return False


def adapter_path_for(capture_path: str | os.PathLike[str]) -> Path:
    """``run.safetensors`` -> ``run.adapter`` (the folder of the global adapter beside a simulated capture)."""
    p = Path(capture_path)
    stem = p.name[: -len(".safetensors")] if p.name.endswith(".safetensors") else p.stem
    return p.with_name(stem + ".adapter")


def read_adapter_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``adapter_config.json`` of a LoRA adapter folder, checked: a JSON object, ``peft_type`` LORA, a positive
    integer r, a positive alpha, target modules named, no DoRA."""
    p = Path(folder)
    if not is_adapter_dir(p):
        raise GleakError(f"{show(p)} is not a PEFT adapter folder (no {ADAPTER_CONFIG} in it)")
    config = read_json_input(p / ADAPTER_CONFIG, "adapter config")
    if not isinstance(config, dict):
        raise GleakError(f"{show(p / ADAPTER_CONFIG)} is not a JSON object")
    kind = config.get("peft_type")
    if kind != "LORA":
        raise GleakError(f"{show(p)}: peft_type {shorten(repr(kind), 40)} is not supported; gleak reads LoRA adapters "
                         "(peft_type LORA)")
    if config.get("use_dora"):
        raise GleakError(f"{show(p)}: a DoRA adapter (use_dora true) is not supported; gleak reads plain LoRA")
    lora_settings(config, where=show(p))
    return config


def lora_settings(config: Mapping[str, Any], where: str = "adapter config") -> tuple[int, float, list[str]]:
    """(r, alpha, target modules) of a LoRA adapter config; one line when one is missing or out of range. A peft
    regex (``target_modules`` given as one string) is its only element."""
    r, alpha, targets = config.get("r"), config.get("lora_alpha", PEFT_DEFAULT_ALPHA), config.get("target_modules")
    if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= MAX_R:
        raise GleakError(f"{where}: r is {shorten(repr(r), 40)}; expected an integer in 1 … {MAX_R}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not (math.isfinite(alpha) and alpha > 0):
        raise GleakError(f"{where}: lora_alpha is {shorten(repr(alpha), 40)}; expected a number > 0")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise GleakError(f"{where}: target_modules is {shorten(repr(targets), 60)}; expected the adapted modules' "
                         "names")
    return r, float(alpha), sorted(targets)


def load_adapter(folder: str | os.PathLike[str], trust_pickle: bool = False
                 ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A LoRA adapter folder: its config (:func:`read_adapter_config`) and its tensors, keyed as in the file.
    ``adapter_model.safetensors`` is read; ``adapter_model.bin`` (a pickle) only with ``trust_pickle``."""
    import torch

    p = Path(folder)
    config = read_adapter_config(p)
    if (p / ADAPTER_SAFETENSORS).is_file():
        tensors, _ = read_safetensors(p / ADAPTER_SAFETENSORS, "adapter weights")
    elif (p / ADAPTER_PICKLE).is_file():
        if not trust_pickle:
            raise GleakError(f"{show(p)} holds only {ADAPTER_PICKLE} (a pickle: loading it runs code); convert it to "
                             f"{ADAPTER_SAFETENSORS}, or pass --trust-pickle if you trust its source")
        checked = check_input_file(p / ADAPTER_PICKLE, "adapter weights")
        try:
            loaded = torch.load(checked, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise GleakError(f"cannot read {show(checked)}: {_why(exc)}") from None
        if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                   for k, v in loaded.items()):
            raise GleakError(f"{show(checked)} is not a state dict of named tensors")
        tensors = dict(loaded)
    else:
        raise GleakError(f"{show(p)} has an {ADAPTER_CONFIG} but no weights ({ADAPTER_SAFETENSORS})")
    if not tensors:
        raise GleakError(f"{show(p)}: the adapter holds no tensors")
    odd = [n for n, t in tensors.items() if not t.is_floating_point()]
    if odd:
        raise GleakError(f"{show(p)}: adapter tensor '{shorten(odd[0], 80)}' is not floating point "
                         f"({tensors[odd[0]].dtype})")
    return config, tensors


def check_same_lora(global_config: Mapping[str, Any], client_config: Mapping[str, Any]) -> None:
    """Two adapters of one run: the same value (or both absent) for every key of :data:`SHAPE_KEYS`."""
    for key in SHAPE_KEYS:
        a, b = _normalised(key, global_config.get(key)), _normalised(key, client_config.get(key))
        if a != b:
            raise GleakError(f"the two adapters differ in {key}: global {shorten(repr(a), 60)}, client "
                             f"{shorten(repr(b), 60)}")


_SHAPE_DEFAULTS: dict[str, Any] = {"lora_alpha": PEFT_DEFAULT_ALPHA, "fan_in_fan_out": False, "bias": "none",
                                   "use_rslora": False, "use_dora": False}


def _normalised(key: str, value: Any) -> Any:
    """A config value as compared: absent is peft's default, {} is absent (peft writes {} for no rank_pattern,
    older files leave the key out), lists in sorted order, alpha as a float."""
    if value is None or (isinstance(value, dict) and not value):
        value = _SHAPE_DEFAULTS.get(key)
    if isinstance(value, list | tuple | set):
        return sorted(str(v) for v in value)
    if key == "lora_alpha" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def check_same_tensors(global_state: Mapping[str, torch.Tensor], client_state: Mapping[str, torch.Tensor]) -> None:
    """The two adapters hold the same tensor names with the same shapes."""
    missing = [n for n in global_state if n not in client_state]
    extra = [n for n in client_state if n not in global_state]
    if missing or extra:
        name, side = (missing[0], "the global adapter only") if missing else (extra[0], "the client adapter only")
        raise GleakError(f"the two adapters hold different tensors ({len(missing) + len(extra)} differ; "
                         f"'{shorten(name, 80)}' is in {side})")
    for name, t in global_state.items():
        if tuple(t.shape) != tuple(client_state[name].shape):
            raise GleakError(f"adapter tensor '{shorten(name, 80)}' has shape {list(t.shape)} in the global adapter, "
                             f"{list(client_state[name].shape)} in the client's")


def check_adapter_fits(base: nn.Module, config: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> None:
    """The adapter's names and shapes are those peft gives ``base`` (changed in place) with the adapter config's
    :data:`SHAPE_KEYS` (the values are not needed: peft's plain init is used)."""
    peft = _peft()
    known = {f.name for f in fields(peft.LoraConfig)}
    kwargs = {k: config[k] for k in SHAPE_KEYS if k in config and k in known and config[k] is not None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lora = peft.LoraConfig(**kwargs, task_type="CAUSAL_LM")
            wrapped = peft.get_peft_model(base, lora)
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise GleakError(f"the adapter does not fit the base model: {_why(exc)}") from None
    expected = {n: tuple(t.shape) for n, t in peft.get_peft_model_state_dict(wrapped).items()}
    missing = [n for n in expected if n not in state]
    extra = [n for n in state if n not in expected]
    if missing or extra:
        name = missing[0] if missing else extra[0]
        raise GleakError(f"the adapter does not fit the base model: {len(missing)} tensor(s) missing, {len(extra)} "
                         f"unknown (e.g. '{shorten(name, 80)}')")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise GleakError(f"the adapter does not fit the base model: '{shorten(name, 80)}' has shape "
                             f"{list(state[name].shape)}, the base model needs {list(shape)}")


def lora_metadata(adapter_config: Mapping[str, Any], *, base_sha256: str, adapter_sha256: str) -> dict[str, Any]:
    """The capture keys of a LoRA contribution: ``gleak.peft.*`` (type, r, alpha, target modules, the global
    adapter's tensors hash) and ``gleak.model.sha256``, the BASE model's tensors hash (the capture is bound to the
    base model; the adapter's own hash is ``gleak.peft.adapter.sha256``)."""
    r, alpha, targets = lora_settings(adapter_config)
    return {"gleak.peft.type": "lora", "gleak.peft.r": r, "gleak.peft.alpha": alpha,
            "gleak.peft.target_modules": targets, "gleak.peft.adapter.sha256": adapter_sha256,
            "gleak.model.sha256": base_sha256}


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def check_adapter_writable(folder: Path, force: bool) -> None:
    """Refuse, before any work, an adapter folder that exists (unless ``force``) or that is not one gleak may
    replace: a file, or a folder that is neither empty nor an adapter folder."""
    try:
        exists, is_dir = folder.exists(), folder.is_dir()
        foreign = is_dir and not is_adapter_dir(folder) and any(folder.iterdir())
    except OSError as exc:
        raise GleakError(f"cannot write {show(folder)}: {exc.strerror or type(exc).__name__}") from None
    if exists and not is_dir:
        raise GleakError(f"{show(folder)} exists and is not a folder")
    if foreign:
        raise GleakError(f"{show(folder)} is a folder that holds no adapter; gleak will not replace it")
    if exists and not force:
        raise GleakError(f"{show(folder)} already exists; pass --force to overwrite it")
    check_output_location(folder / ADAPTER_CONFIG)


def save_adapter(folder: str | os.PathLike[str], config: Mapping[str, Any], state: Mapping[str, torch.Tensor],
                 force: bool = False) -> Path:
    """Write an adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) that peft's
    ``PeftModel.from_pretrained`` reads: built in a hidden folder beside it and renamed into place, so that it
    appears whole or not at all; an existing one is replaced only with ``force``. Byte-identical for the same
    adapter (sorted JSON keys, gleak's deterministic safetensors writer)."""
    target = Path(folder)
    check_adapter_writable(target, force)
    make_parent(target)
    old: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=".gleak-", dir=target.parent))
    except OSError as exc:
        raise GleakError(f"cannot write {show(target)}: {exc.strerror or type(exc).__name__}") from None
    try:
        (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (staging / ADAPTER_SAFETENSORS).write_bytes(safetensors_bytes(state, {"format": "pt"}))
        mask = _umask()
        for name in (ADAPTER_CONFIG, ADAPTER_SAFETENSORS):
            os.chmod(staging / name, 0o666 & ~mask)
        os.chmod(staging, 0o777 & ~mask)
        if target.exists():
            old = staging.with_name(staging.name + ".old")
            os.replace(target, old)
        os.replace(staging, target)
    except OSError as exc:
        if old is not None and not target.exists():
            with contextlib.suppress(OSError):
                os.replace(old, target)
        raise GleakError(f"cannot write {show(target)}: {exc.strerror or type(exc).__name__}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target
