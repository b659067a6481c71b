"""Load and save models: safetensors + arch spec, state dicts, TorchScript, torch.export, trusted pickles.

An arch ``package.module:factory`` (from ``--arch`` only, never from a file) is imported as Python would, and,
only when its top-level package is importable from nowhere else, from the current working directory (a finder
searched after every other one while it is imported and built; ``sys.path`` is never changed), so files there
never shadow installed packages. A trusted pickle (``--trust-pickle``) finds the modules of the classes it names
the same way.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import pickle
import pickletools
import sys
import types
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gleak.errors import GleakError, did_you_mean, shorten
from gleak.io import (
    ARCH_HINT,
    check_input_file,
    check_input_shape,
    describe_key_mismatch,
    is_safetensors,
    save_safetensors,
    show,
    tensors_sha256,
)
from gleak.models.export_archive import _weights_only_globals, check_archive, check_program, guard_load
from gleak.models.text import is_text_model_dir, open_text_model
from gleak.models.thread_scope import overridden, warnings_dropped
from gleak.models.zoo import ZOO, build_zoo_model, zoo_input_shape

TORCHVISION_INPUT_SHAPE = (3, 224, 224)
META_ARCH = "gleak.arch"
META_KWARGS = "gleak.arch_kwargs"
META_INPUT_SHAPE = "gleak.input_shape"
STATE_DICT_ENTRIES = ("state_dict", "model_state_dict")
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a non-zip torch.save file
MAX_PICKLE_SCAN_BYTES = 64 << 20  # how much of a refused pickle is read to say why it was refused
_STRING_OPS = frozenset({"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
                         "SHORT_BINSTRING"})
MAX_KWARGS_CHARS = 64 * 1024


@dataclass
class LoadedModel:
    """A model ready for analysis, with where it came from."""

    module: nn.Module
    source: str
    arch: str | None
    arch_kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None
    weights_sha256: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- arch specs


def parse_arch_kwargs(
    arch_kwargs: Mapping[str, Any] | str | None, what: str = "arch kwargs"
) -> dict[str, Any]:
    """Accept a mapping or a JSON object string (``--arch-kwargs '{"num_classes": 100}'``)."""
    if arch_kwargs is None:
        return {}
    if isinstance(arch_kwargs, str):
        text = arch_kwargs.strip()
        if not text:
            return {}
        if len(text) > MAX_KWARGS_CHARS:
            raise GleakError(f"{what} are {len(text):,} characters of JSON; at most {MAX_KWARGS_CHARS:,} are accepted")
        try:
            arch_kwargs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GleakError(f"{what} are not valid JSON ({exc.msg} at char {exc.pos}): "
                             f"{shorten(repr(text), 80)}") from None
        except RecursionError:
            raise GleakError(f"{what} are nested too deeply") from None
    if not isinstance(arch_kwargs, Mapping):
        raise GleakError(f'{what} must be a JSON object like {{"num_classes": 10}}, got '
                         f"{shorten(repr(arch_kwargs), 80)}")
    if not all(isinstance(k, str) for k in arch_kwargs):
        raise GleakError(f"{what} must have string keys, got {shorten(str(list(arch_kwargs)), 80)}")
    return dict(arch_kwargs)


def _is_zoo(arch: str) -> bool:
    return arch.startswith("zoo:") or arch in ZOO


def _unknown_arch(arch: str) -> GleakError:
    return GleakError(
        f"unknown arch {arch!r}; use a zoo model ({', '.join(ZOO)}), 'torchvision:NAME' "
        "or 'package.module:factory'"
    )


def build_arch(arch: str, arch_kwargs: Mapping[str, Any] | str | None = None) -> nn.Module:
    """Build an untrained model from an arch spec: zoo name, ``torchvision:NAME`` or ``module:factory``."""
    kwargs = parse_arch_kwargs(arch_kwargs)
    arch = arch.strip()
    if _is_zoo(arch):
        return build_zoo_model(arch, **kwargs)
    if arch.startswith("torchvision:"):
        return _build_torchvision(arch.removeprefix("torchvision:"), kwargs)
    if ":" in arch:
        return _build_import(arch, kwargs)
    raise _unknown_arch(arch)


def _build_torchvision(name: str, kwargs: dict[str, Any]) -> nn.Module:
    import torchvision.models

    if "weights" in kwargs or "weights_backbone" in kwargs:
        raise GleakError(
            "torchvision archs are always built with weights=None; load trained weights from a file"
        )
    available = set(torchvision.models.list_models())
    if name not in available:
        hint = did_you_mean(name, sorted(available), most=3) or "; see torchvision.models.list_models()"
        raise GleakError(f"unknown torchvision model {name!r}{hint}")
    try:
        model: nn.Module = torchvision.models.get_model(name, weights=None, **kwargs)
        return model
    except Exception as exc:  # any constructor failure is a bad kwarg from the user
        raise GleakError(f"cannot build torchvision:{name} with {kwargs}: {_why(exc)}") from None


class _WorkingDirectoryFinder(importlib.abc.MetaPathFinder):
    """Finds a *top-level* module or package (``NAME.py`` or ``NAME/``) in one directory, and nothing else: the
    submodules of a package found here are found through its ``__path__`` as usual. Put last on
    ``sys.meta_path``, it is asked only after every other finder (``sys.path`` included) found nothing."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if path is not None or "." in fullname:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.directory])


@contextlib.contextmanager
def _cwd_last_on_path() -> Iterator[None]:
    """For the duration, a module found nowhere else is looked up in the working directory (installed packages
    and ``sys.path`` win): a :class:`_WorkingDirectoryFinder` at the *end* of ``sys.meta_path``. ``sys.path``
    itself is never changed; a module found there stays in ``sys.modules`` under its name (so pickles that name
    it resolve), as any import would."""
    finder = _WorkingDirectoryFinder(os.getcwd())
    importlib.invalidate_caches()  # files written since the directory was last listed
    sys.meta_path.append(finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def _import_arch_module(module_name: str) -> tuple[types.ModuleType, bool]:
    """Import ``module_name`` as usual; only when its top-level package is not importable at all, look for it in
    the working directory too (as ``python -m`` would), without letting files there shadow installed ones.
    Returns the module and whether the working directory was needed.

    The lookup, in order: (1) ``importlib.import_module`` with ``sys.path`` as it is; (2) only if that finds no
    top-level package, ``NAME.py`` or the package ``NAME/`` in the current working directory, found by a finder
    asked after all others (:func:`_cwd_last_on_path`) and registered in ``sys.modules`` under its name.
    ``sys.path`` is not modified."""
    try:
        return importlib.import_module(module_name), False
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        if exc.name != top:
            raise
    with _cwd_last_on_path():
        return importlib.import_module(module_name), True


def _build_import(spec: str, kwargs: dict[str, Any]) -> nn.Module:
    """``package.module:factory`` (dotted attributes allowed): import, call with ``kwargs``, expect a Module.

    The module is looked up on ``sys.path`` first, then in the current directory (see
    :func:`_import_arch_module`); the directory stays searched last while the factory runs, for its own imports."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise _unknown_arch(spec)
    try:
        obj: Any
        obj, from_cwd = _import_arch_module(module_name)
    except Exception as exc:
        raise GleakError(f"cannot import {module_name!r} for arch {spec!r}: {_why(exc)}") from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise GleakError(f"arch {spec!r}: {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise GleakError(f"arch {spec!r}: {attr_path!r} is not callable")
    try:
        with _cwd_last_on_path() if from_cwd else contextlib.nullcontext():
            module = obj(**kwargs)
    except Exception as exc:
        raise GleakError(f"arch {spec!r} failed with {kwargs}: {_why(exc)}") from None
    if not isinstance(module, nn.Module):
        raise GleakError(f"arch {spec!r} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def arch_input_shape(
    arch: str | None, arch_kwargs: Mapping[str, Any] | None = None
) -> tuple[int, ...] | None:
    """Default (C, H, W) input of an arch spec, when it is known."""
    if arch is None:
        return None
    if _is_zoo(arch):
        return zoo_input_shape(arch, **dict(arch_kwargs or {}))
    if arch.startswith("torchvision:"):
        return TORCHVISION_INPUT_SHAPE
    return None


def _parse_shape(text: str | None, what: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise GleakError(f"{what} is not a JSON list of integers: {shorten(repr(text), 80)}") from None
    if value is None:
        return None
    if not isinstance(value, list):
        raise GleakError(f"{what} is not a JSON list of positive integers: {shorten(repr(text), 80)}")
    return check_input_shape(value, what)


# --------------------------------------------------------------------------- state dicts


def _strip_prefix(state: dict[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Drop a ``module.`` prefix left by DataParallel/DDP when the model itself has none."""
    prefix = "module."
    if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in expected):
        return {k[len(prefix) :]: v for k, v in state.items()}
    return state


def load_state_dict_strict(module: nn.Module, state: Mapping[str, torch.Tensor], where: str,
                           hint: str | None = None) -> None:
    """Load ``state`` into ``module``; every missing/unexpected key or shape mismatch is a GleakError (ending with
    ``hint``, what to pass instead, when given)."""
    expected = module.state_dict()
    state = _strip_prefix(dict(state), set(expected))
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in expected]
    shapes = [(k, tuple(state[k].shape), tuple(expected[k].shape))
              for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    problems = describe_key_mismatch(missing, unexpected, shapes, have="file", hint=hint)
    if problems:
        raise GleakError(f"{where} does not match the architecture: " + problems)
    try:
        module.load_state_dict(state, strict=False)
    except Exception as exc:
        raise GleakError(f"{where}: cannot load the weights: {_why(exc)}") from None


def _as_state_dict(obj: Any) -> dict[str, torch.Tensor] | None:
    """Return ``obj`` (or its state_dict entry) if it is a flat mapping of names to tensors."""
    if not isinstance(obj, Mapping):
        return None
    if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        return dict(obj)
    for entry in STATE_DICT_ENTRIES:
        if entry in obj:
            return _as_state_dict(obj[entry])
    return None


# --------------------------------------------------------------------------- format detection


def _sniff(path: Path) -> str | None:
    """Guess the format from the content: safetensors, torchscript, export, torch or None."""
    with open(path, "rb") as f:  # an unreadable file raises here (load_model turns OSError into one line)
        head = f.read(1)
    if is_safetensors(path):
        return "safetensors"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError):
            return None
        parts = [n.split("/") for n in names]
        # Entries sit under one top-level folder: "<name>/archive_format", "<name>/code/__torch__.py".
        if any(
            len(p) <= 2 and p[-1] in ("archive_format", "serialized_exported_program.json") for p in parts
        ):
            return "export"
        if any((len(p) >= 3 and p[1] == "code") or (len(p) == 2 and p[1] == "constants.pkl") for p in parts):
            return "torchscript"
        return "torch"
    if head[:1] == b"\x80":  # legacy (non-zip) torch.save pickle
        return "torch"
    return None


# --------------------------------------------------------------------------- loading


def load_model(
    path: str | os.PathLike[str],
    arch: str | None = None,
    arch_kwargs: Mapping[str, Any] | str | None = None,
    trust_pickle: bool = False,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a model file (.safetensors, .pt/.pth/.bin state dict or TorchScript, .pt2 export) in eval mode, or a
    Hugging Face model folder (config.json + safetensors weights + tokenizer; the text extra,
    :func:`gleak.models.text.load_text_model`: a config that needs the folder's code only with
    ``trust_remote_code``)."""
    if is_text_model_dir(path):
        if arch is not None or arch_kwargs is not None:
            raise GleakError(f"{show(path)} is a Hugging Face model folder: its config.json says what it is; "
                             "drop --arch/--arch-kwargs")
        return load_text_model(path, trust_pickle=trust_pickle, trust_remote_code=trust_remote_code)
    file = check_input_file(path, "model file")
    try:
        fmt = _sniff(file)
    except OSError as exc:
        raise GleakError(f"cannot read model file {file}: {exc.strerror or exc}") from None
    if fmt is None:
        raise GleakError(
            f"{file} is not a recognised model file (not safetensors, not a zip archive from "
            "torch.save/torch.jit.save/torch.export.save, not a pickle)"
        )
    kwargs = None if arch_kwargs is None else parse_arch_kwargs(arch_kwargs)
    if fmt == "safetensors":
        loaded = _load_safetensors(file, arch, kwargs)
    elif fmt == "export":
        loaded = _load_export(file, trust_pickle)
    elif fmt == "torchscript":
        loaded = _load_torchscript(file)
    else:
        loaded = _load_torch(file, arch, kwargs, trust_pickle)
    if loaded.arch is None and arch is not None:
        # A self-contained program: the arch only documents the expected input.
        loaded.arch, loaded.arch_kwargs = arch, kwargs or {}
        if loaded.input_shape is None:
            loaded.input_shape = arch_input_shape(arch, loaded.arch_kwargs)
    _set_eval(loaded.module)
    loaded.weights_sha256 = tensors_sha256(loaded.module.state_dict())
    return loaded


def load_text_model(path: str | os.PathLike[str], trust_pickle: bool = False,
                    trust_remote_code: bool = False) -> LoadedModel:
    """A Hugging Face model folder as a :class:`LoadedModel` (:mod:`gleak.models.text`): ``arch`` is
    ``hf:MODEL_TYPE``, the metadata describe the text model (``gleak.modality = text``, task, vocabulary, special
    token ids, padding side, the tokenizer's hash) and ``weights_sha256`` is :func:`gleak.io.tensors_sha256` of the
    state dict, as for every other model."""
    module, info, source = open_text_model(path, trust_pickle=trust_pickle, trust_remote_code=trust_remote_code)
    return LoadedModel(module=module, source=source, arch=f"hf:{info.model_type}", input_shape=None,
                       weights_sha256=tensors_sha256(module.state_dict()), metadata=info.metadata())


def _set_eval(module: nn.Module) -> None:
    with contextlib.suppress(NotImplementedError, RuntimeError):
        module.eval()


def _allow_eval(module: nn.Module) -> nn.Module:
    """Let ``eval()``/``train(False)`` work on a torch.export module; ``train(True)`` still raises.

    torch replaces both methods on exported modules with ones that raise, because the captured graph cannot
    change behaviour. Marking it as evaluation-mode only relabels it, which callers may do unconditionally.
    """
    refuse_train = module.train

    def train(self: nn.Module, mode: bool = True) -> nn.Module:
        if mode:
            return refuse_train(mode)
        for sub in self.modules():
            sub.training = False
        return self

    def eval_(self: nn.Module) -> nn.Module:
        return train(self, False)

    module.train = types.MethodType(train, module)  # type: ignore[method-assign]
    module.eval = types.MethodType(eval_, module)  # type: ignore[method-assign]
    return module


def _from_state_dict(
    file: Path, state: Mapping[str, torch.Tensor], arch: str | None, kwargs: dict[str, Any], what: str
) -> nn.Module:
    if arch is None:
        raise GleakError(
            f"{file} holds only weights ({what}); it needs --arch "
            "(a zoo name, torchvision:NAME or package.module:factory)"
        )
    module = build_arch(arch, kwargs)
    load_state_dict_strict(module, state, f"{file} ({what}, arch {arch!r})", hint=ARCH_HINT)
    return module


def _load_safetensors(file: Path, arch: str | None, kwargs: dict[str, Any] | None) -> LoadedModel:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as exc:
        raise GleakError(f"{file} is not a readable safetensors file: {_why(exc)}") from None
    kind = metadata.get("gleak.kind")
    if kind is not None and kind != "model":
        raise GleakError(f"{show(file)} is a gleak {shorten(kind, 20)} file (gleak.kind), not a model; pass the global "
                         "model's weights with --model")
    if META_ARCH not in metadata and {"images", "labels"} <= set(state):
        raise GleakError(f"{show(file)} holds a data set (images and labels), not a model")
    file_arch = metadata.get(META_ARCH)
    if file_arch is not None and arch is None and not _is_file_safe_arch(file_arch):
        raise GleakError(
            f"{show(file)}: metadata {META_ARCH} names {shorten(repr(file_arch), 60)}; an architecture read from a "
            "file may only be a zoo model or torchvision:NAME (importing what a file names could run its code); "
            "pass --arch on the command line if you trust that factory")
    file_kwargs = parse_arch_kwargs(metadata.get(META_KWARGS), f"{file}: metadata {META_KWARGS}")
    same_arch = arch is None or (file_arch is not None and _same_arch(arch, file_arch))
    use_arch = arch if arch is not None else file_arch
    use_kwargs = kwargs if kwargs is not None else (file_kwargs if same_arch else {})
    module = _from_state_dict(file, state, use_arch, use_kwargs, "safetensors weights")
    assert use_arch is not None
    shape = _parse_shape(metadata.get(META_INPUT_SHAPE), f"{file}: metadata {META_INPUT_SHAPE}")
    if shape is None or not same_arch or kwargs is not None:
        shape = arch_input_shape(use_arch, use_kwargs) or shape
    return LoadedModel(
        module=module,
        source=f"safetensors weights + {_describe_arch(use_arch)}",
        arch=use_arch,
        arch_kwargs=use_kwargs,
        input_shape=shape,
        metadata=metadata,
    )


def _is_file_safe_arch(arch: str) -> bool:
    """Architectures a file's metadata may name: built-in zoo models and torchvision constructors, never an
    importable ``module:factory`` (no data file makes gleak import or call anything; README, "Untrusted files")."""
    arch = arch.strip()
    return _is_zoo(arch) or (arch.startswith("torchvision:") and arch.count(":") == 1)


def _same_arch(a: str, b: str) -> bool:
    return a.removeprefix("zoo:") == b.removeprefix("zoo:")


def _describe_arch(arch: str) -> str:
    return f"zoo:{arch.removeprefix('zoo:')}" if _is_zoo(arch) else arch


def _load_export(file: Path, trust_pickle: bool) -> LoadedModel:
    """Load a .pt2 after vetting it (export_archive): unless trusted, nothing in it is unpickled or executed."""
    if not trust_pickle:
        check_archive(file)
    with guard_load(file, trusted=trust_pickle) as guard:
        try:
            program = torch.export.load(str(file))
            if not trust_pickle:
                check_program(program, file)
            module = _allow_eval(program.module())
        except GleakError as exc:
            raise (guard.refused or exc) from None
        except Exception as exc:
            cause = guard.cause(exc)
            if isinstance(cause, GleakError):
                raise cause from None
            raise GleakError(f"{show(file)} is not a loadable torch.export program: {_why(cause)}") from None
    return LoadedModel(
        module=module, source="torch.export program", arch=None, input_shape=_export_input_shape(program)
    )


def _export_input_shape(program: Any) -> tuple[int, ...] | None:
    """(C, H, W) of the single user input of an exported program, without the batch dimension."""
    try:
        from torch.export.graph_signature import InputKind

        names = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        if len(names) != 1:
            return None
        for node in program.graph.nodes:
            if node.op == "placeholder" and node.name == names[0]:
                shape = tuple(int(d) for d in node.meta["val"].shape[1:])
                return shape or None
    except Exception:  # symbolic sizes or an unusual signature: the shape is simply unknown
        return None
    return None


def _load_torchscript(file: Path) -> LoadedModel:
    try:
        with overridden([warnings_dropped()]):  # torch.jit.load's deprecation notice is not the user's problem
            module = torch.jit.load(str(file), map_location="cpu")  # type: ignore[no-untyped-call]  # torch: no hints
    except Exception as exc:
        raise GleakError(f"{file} is not a loadable TorchScript archive: {_why(exc)}") from None
    return LoadedModel(module=module, source="TorchScript archive", arch=None)


def _is_weights_only_failure(exc: Exception) -> bool:
    """True when torch's weights-only unpickler stopped at the pickle itself: a global it does not allow (a whole
    nn.Module, any Python object) or an opcode it cannot read (pickle protocol 4 and later, or a damaged file)."""
    return isinstance(exc, pickle.UnpicklingError) and "weights only load failed" in str(exc).lower()


@dataclass
class _PickleScan:
    """What :func:`_scan_pickles` saw, without unpickling anything."""

    unsafe: str | None = None  # the first global weights-only loading refuses (module.name, or "?" if unknown)
    protocol: int | None = None
    well_formed: bool = True  # every pickle read ended with STOP
    complete: bool = True  # the whole stream was read (False: cut at MAX_PICKLE_SCAN_BYTES)


def _scan_pickles(data: bytes, count: int, complete: bool) -> _PickleScan:
    """Read ``count`` consecutive pickles of ``data`` opcode by opcode (pickletools: nothing is imported or run),
    stopping at the first global that weights-only loading refuses."""
    allowed = _weights_only_globals()
    scan = _PickleScan(complete=complete)
    stream = io.BytesIO(data)
    strings: list[str | None] = []  # what the last opcodes pushed, as far as STACK_GLOBAL needs to know
    memo: dict[Any, str | None] = {}
    try:
        for _ in range(count):
            for opcode, arg, _pos in pickletools.genops(stream):
                name = opcode.name
                if name == "PROTO" and scan.protocol is None and isinstance(arg, int):
                    scan.protocol = arg
                if name in ("FRAME", "PROTO", "STOP"):
                    continue
                if name == "GLOBAL":
                    module, _, attr = str(arg).partition(" ")
                    found: str | None = f"{module}.{attr}"
                elif name == "STACK_GLOBAL":
                    module_name, attr_name = (strings[-2:] if len(strings) >= 2 else [None, None])
                    found = f"{module_name}.{attr_name}" if module_name and attr_name else "?"
                elif name in ("INST", "OBJ", "EXT1", "EXT2", "EXT4"):
                    found = "?" if name != "INST" else str(arg).replace(" ", ".")
                else:
                    found = None
                if found is not None and found not in allowed:
                    scan.unsafe = found
                    return scan
                if name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):  # store the top of the stack
                    memo[len(memo) if name == "MEMOIZE" else arg] = strings[-1] if strings else None
                elif name in ("GET", "BINGET", "LONG_BINGET"):
                    strings.append(memo.get(arg))
                else:
                    strings.append(arg if isinstance(arg, str) and name in _STRING_OPS else None)
                del strings[:-2]
    except Exception:  # pickletools raises ValueError and friends on a malformed (or cut) stream
        scan.well_formed = False
    return scan


def _is_torch_legacy(data: bytes) -> bool:
    """Whether ``data`` starts as a non-zip ``torch.save`` file does: a pickle of torch's magic number alone."""
    try:
        values = [arg for op, arg, _ in pickletools.genops(io.BytesIO(data[:64]))
                  if op.name not in ("PROTO", "FRAME", "STOP")]
    except Exception:
        return False
    return values == [TORCH_LEGACY_MAGIC]


def _read_pickle(file: Path) -> tuple[bytes, bool, int]:
    """The pickle stream of a torch file (a zip archive's data.pkl, else the file), at most
    :data:`MAX_PICKLE_SCAN_BYTES` of it: (bytes, whether that is all of it, how many pickles lead to the object:
    a legacy torch.save file has the magic number, protocol version and system info before it)."""
    if zipfile.is_zipfile(file):
        with zipfile.ZipFile(file) as zf:
            entries = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
            if len(entries) != 1:
                return b"", False, 1
            with zf.open(entries[0]) as f:
                data = f.read(MAX_PICKLE_SCAN_BYTES + 1)
        return data[:MAX_PICKLE_SCAN_BYTES], len(data) <= MAX_PICKLE_SCAN_BYTES, 1
    with open(file, "rb") as f:
        data = f.read(MAX_PICKLE_SCAN_BYTES + 1)
    return data[:MAX_PICKLE_SCAN_BYTES], len(data) <= MAX_PICKLE_SCAN_BYTES, 4 if _is_torch_legacy(data) else 1


def _pickle_refused(file: Path) -> GleakError:
    """The one line for a torch file whose pickle weights-only loading refused (nothing in it was run)."""
    trust = "pass --trust-pickle if you trust its source"
    try:
        data, complete, count = _read_pickle(file)
    except Exception as exc:  # zipfile raises BadZipFile, NotImplementedError (compression), RuntimeError, ...
        return GleakError(f"{show(file)} is not a readable PyTorch file: {_why(exc)}")
    scan = _scan_pickles(data, count, complete)
    if scan.unsafe is not None:
        names = "" if scan.unsafe == "?" else f" (it names {shorten(scan.unsafe, 80)})"
        return GleakError(f"{show(file)}: a pickled model (whole nn.Module) or other Python object{names} is refused: "
                          f"loading it runs code; {trust}, or save a state dict (model.state_dict()) or safetensors")
    if not scan.well_formed and scan.complete:
        return GleakError(f"{show(file)} is not a readable PyTorch file: its pickle is damaged or cut short")
    protocol = f" written with protocol {scan.protocol}" if scan.protocol is not None else ""
    return GleakError(f"{show(file)}: a pickle{protocol} that torch's safe (weights-only) loading cannot read is "
                      f"refused: a full unpickle could run code; {trust}, or save it with torch.save's default "
                      "protocol or as safetensors")


def _why(exc: BaseException) -> str:
    """Short one-line description of an exception from an underlying loader."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _load_torch(
    file: Path, arch: str | None, kwargs: dict[str, Any] | None, trust_pickle: bool
) -> LoadedModel:
    trusted = False
    try:
        # torch warns about what its safe unpickler may not read (e.g. pickle protocol 4); the error says it all
        with overridden([warnings_dropped()]):
            obj = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:
        if not _is_weights_only_failure(exc):
            raise GleakError(f"{show(file)} is not a readable PyTorch file: {_why(exc)}") from None
        if not trust_pickle:
            raise _pickle_refused(file) from None
        obj = _unpickle_trusted(file)
        trusted = True
    if isinstance(obj, nn.Module):
        return LoadedModel(module=obj, source="pickled nn.Module (trusted)", arch=None)
    state = _as_state_dict(obj)
    if state is None:
        what = "a pickled object" if trusted else type(obj).__name__
        raise GleakError(f"{file} holds {what}, neither an nn.Module nor a state dict of tensors")
    use_kwargs = kwargs or {}
    module = _from_state_dict(file, state, arch, use_kwargs, "state dict")
    assert arch is not None
    return LoadedModel(
        module=module,
        source=f"state dict + {_describe_arch(arch)}",
        arch=arch,
        arch_kwargs=use_kwargs,
        input_shape=arch_input_shape(arch, use_kwargs),
    )


def _unpickle_trusted(file: Path) -> Any:
    """Unpickle ``file`` in full (``--trust-pickle``): torch.load for torch.save files, pickle.load for a plain
    pickle (``pickle.dump(model, f)``), which torch.load would run and then reject."""
    try:
        with open(file, "rb") as f:
            head = f.read(64)
        raw = not zipfile.is_zipfile(file) and not _is_torch_legacy(head)
        # The classes a pickled module names live in the user's code: found as --arch finds a factory's
        # module, on sys.path first, then in the working directory (searched last while unpickling).
        with _cwd_last_on_path(), overridden([warnings_dropped()]):
            if raw:
                with open(file, "rb") as f:
                    return pickle.load(f)  # the user vouched for this file with --trust-pickle
            return torch.load(str(file), map_location="cpu", weights_only=False)
    except Exception as exc:
        raise GleakError(f"cannot unpickle {show(file)}: {_why(exc)}") from None


# --------------------------------------------------------------------------- saving


def save_model(
    module: nn.Module,
    path: str | os.PathLike[str],
    arch: str,
    arch_kwargs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, str] | None = None,
    force: bool = False,
) -> Path:
    """Write ``module``'s weights (buffers included) to a .safetensors file with its arch spec as metadata."""

    target = Path(path)
    if target.suffix.lower() != ".safetensors":
        raise GleakError(f"save_model writes .safetensors files, got {target}")
    kwargs = parse_arch_kwargs(arch_kwargs)
    reference = build_arch(arch, kwargs)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    shapes = [(k, tuple(state[k].shape), expected[k]) for k in expected if k in state
              and tuple(state[k].shape) != expected[k]]
    problems = describe_key_mismatch(missing, extra, shapes, have="module",
                                     hint="pass the arch and arch_kwargs the module was built with")
    if problems:
        raise GleakError(f"the module does not match arch {arch!r} {kwargs}: {problems}")
    try:
        kwargs_json = json.dumps(kwargs, sort_keys=True)
    except TypeError as exc:
        raise GleakError(f"arch kwargs must be JSON-serialisable: {exc}") from None
    meta: dict[str, str] = {META_ARCH: arch, META_KWARGS: kwargs_json}
    shape = arch_input_shape(arch, kwargs)
    if shape is not None:
        meta[META_INPUT_SHAPE] = json.dumps(list(shape))
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise GleakError(f"metadata must map strings to strings, got {key!r}: {value!r}")
        if key in (META_ARCH, META_KWARGS) and value != meta[key]:
            raise GleakError(f"metadata key {key!r} is reserved; pass arch/arch_kwargs instead")
        if key == META_INPUT_SHAPE:
            _parse_shape(value, f"metadata {META_INPUT_SHAPE}")
        meta[key] = value
    return save_safetensors(target, state, meta, force=force)


def model_from_state(
    template: nn.Module | str,
    state: Mapping[str, torch.Tensor],
    arch_kwargs: Mapping[str, Any] | None = None,
    input_shape: tuple[int, ...] | None = None,
    source: str = "in-memory weights",
) -> LoadedModel:
    """A :class:`LoadedModel` from weights in memory (e.g. a round's global model on an FL server):
    ``template`` is an arch spec (as ``--arch``) or a module of the right architecture (copied, not changed)."""
    import copy

    if isinstance(template, str):
        kwargs = parse_arch_kwargs(arch_kwargs)
        module, arch = build_arch(template, kwargs), template
        input_shape = input_shape or arch_input_shape(template, kwargs)
    else:
        module, arch, kwargs = copy.deepcopy(template), None, {}
    load_state_dict_strict(module, state, source)
    _set_eval(module)
    return LoadedModel(module=module, source=source, arch=arch, arch_kwargs=kwargs, input_shape=input_shape,
                       weights_sha256=tensors_sha256(module.state_dict()))
