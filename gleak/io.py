"""File helpers: atomic writes that never overwrite without ``force``, hashing, bounds on inputs, safetensors reading
and writing with readable errors, and the wording of tensor-name mismatches."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal

import torch
from safetensors import safe_open

from gleak.errors import GleakError, shorten

GIB = 1 << 30
MAX_INPUT_BYTES = 16 * GIB  # a sanity bound on any one input file (models, captures, data sets, reports)
MAX_JSON_BYTES = 64 << 20  # JSON inputs (label reports) are small
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the JSON header of a safetensors file
MAX_INPUT_ELEMENTS = 1 << 24  # values in one example (C·H·W); ImageNet at 3×224×224 is 150,528


def show(path: str | os.PathLike[str]) -> str:
    """A path for an error message, cut when it is absurdly long."""
    return shorten(str(path), 160)


def _os_error(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def probe_input(path: str | os.PathLike[str], what: str) -> Literal["dir", "file"] | None:
    """What is at an input path (symlinks followed): ``"dir"`` for a folder, ``"file"`` for anything else
    (:func:`check_input_file` then says whether gleak may read it), None for nothing.

    Use it instead of ``Path.exists()`` / ``is_dir()`` on a path the user named: those raise OSError for a name
    longer than the file system allows (ENAMETOOLONG) or one that may not be looked up (EACCES); here any such
    error is a one-line GleakError naming the (shortened) path, and a symlink loop (ELOOP) is one too, not
    "no such file"."""
    try:
        info = Path(path).stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GleakError(f"cannot read {what} {show(path)}: {_os_error(exc)}") from None
    return "dir" if stat.S_ISDIR(info.st_mode) else "file"


def companion_exists(path: str | os.PathLike[str]) -> bool:
    """Whether an optional companion file is there (e.g. ``NAME.truth.safetensors`` beside a capture): a name
    the file system cannot hold (a capture name near the length limit plus ``.truth``) or cannot look up counts
    as absent, where ``Path.exists()`` would raise OSError."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def check_input_file(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_INPUT_BYTES) -> Path:
    """``path`` must be an existing regular file (symlinks followed) of at most ``max_bytes``.

    Named pipes, sockets and devices are refused before anything opens them (reading a FIFO blocks forever),
    and the size is checked before anything reads the file."""
    p = Path(path)
    try:
        info = p.stat()
    except FileNotFoundError:
        raise GleakError(f"{what} {show(p)}: no such file") from None
    except OSError as exc:
        raise GleakError(f"cannot read {what} {show(p)}: {_os_error(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise GleakError(f"{what} {show(p)} is a directory, expected a file")
    if not stat.S_ISREG(info.st_mode):
        raise GleakError(f"{what} {show(p)} is not a regular file (a pipe, socket or device); gleak reads only "
                         "regular files")
    if info.st_size > max_bytes:
        raise GleakError(f"{what} {show(p)} is {info.st_size / GIB:.1f} GiB, more than the "
                         f"{max_bytes / GIB:.3g} GiB gleak accepts")
    return p


def read_json_input(path: str | os.PathLike[str], what: str) -> Any:
    """The parsed JSON of an untrusted input file (at most :data:`MAX_JSON_BYTES`): a file that is missing, too
    large, unreadable or not JSON is refused in one line, ``PATH: not a JSON WHAT (why)``."""
    file = check_input_file(path, what, MAX_JSON_BYTES)
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else shorten(" ".join(str(e).split()), 100)
        raise GleakError(f"{show(path)}: not a JSON {what} ({reason})") from None


def check_input_dir(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    try:
        info = p.stat()
    except OSError as exc:
        raise GleakError(f"cannot read {what} {show(p)}: {_os_error(exc)}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise GleakError(f"{what} {show(p)} is not a folder")
    return p


def check_input_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    """A (C, H, W)-like shape of positive sizes with at most :data:`MAX_INPUT_ELEMENTS` values per example."""
    if not shape or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
        raise GleakError(f"{what} must be a non-empty list of positive sizes, got {shorten(str(list(shape)), 60)}")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise GleakError(f"{what} {shorten(str(list(shape)), 60)} has {math.prod(shape):,} values per example, "
                         f"more than the {MAX_INPUT_ELEMENTS:,} gleak accepts")
    return tuple(shape)


# ------------------------------------------------------------------------ tensors that do not match a model

MODEL_HINT = "is this the model the capture was made with? pass it with --model (and --arch for weight files)"
FC_LAYER_HINT = MODEL_HINT + ", or name the capture's last layer with --fc-layer"
ARCH_HINT = "are --arch and --arch-kwargs the architecture these weights were saved from?"


def quote_names(names: Sequence[str], limit: int = 5) -> str:
    """``'a', 'b', 'c' and 4 more``: tensor names for an error message."""
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def describe_key_mismatch(
    missing: Sequence[str],
    extra: Sequence[str],
    shapes: Sequence[tuple[str, Sequence[int], Sequence[int]]] = (),
    *,
    have: str = "file",
    hint: str | None = None,
) -> str:
    """How named tensors (a capture, a weights file: ``have``) differ from a model's, in one line; empty when they
    do not. ``shapes`` holds ``(name, shape in have, shape in the model)``. ``hint`` (what to pass instead) ends it.

    e.g. ``missing 1 model tensor(s): 'fc.bias'; 1 tensor(s) not in the model: 'head.weight'; shape mismatch for
    'fc.weight': file has [10, 84], model has [4, 84]; <hint>``"""
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} model tensor(s): {quote_names(missing)}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) not in the model: {quote_names(extra)}")
    for name, got, want in shapes[:4]:
        problems.append(f"shape mismatch for '{name}': {have} has {list(got)}, model has {list(want)}")
    if len(shapes) > 4:
        problems.append(f"{len(shapes) - 4} more shape mismatch(es)")
    if problems and hint:
        problems.append(hint)
    return "; ".join(problems)


def check_output_location(path: Path) -> None:
    """Fail early (before any work) when ``path`` cannot be created: its nearest existing ancestor must be a
    writable folder, and the name must be one the file system accepts."""
    try:
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise GleakError(f"cannot write {show(path)}: {show(ancestor)} is a file, not a folder")
        if not os.access(ancestor, os.W_OK):
            raise GleakError(f"cannot write {show(path)}: {show(ancestor)} is not writable")
        limit = os.pathconf(ancestor, "PC_NAME_MAX")
    except OSError as exc:
        raise GleakError(f"cannot write {show(path)}: {_os_error(exc)}") from None
    long = next((part for part in path.parts if len(os.fsencode(part)) > limit), None)
    if long is not None:
        raise GleakError(f"cannot write {show(path)}: the name {shorten(long, 40)!r} is longer than the file "
                         f"system allows ({limit} bytes)")


def make_parent(path: Path) -> None:
    """Create ``path``'s folder, turning OS failures (a file in the way, a read-only place) into one line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GleakError(f"cannot write {show(path)}: cannot create its folder ({_os_error(exc)})") from None
    if not path.parent.is_dir():
        raise GleakError(f"cannot write {show(path)}: {show(path.parent)} is not a folder")


def check_writable(path: Path, force: bool) -> None:
    """Refuse to overwrite ``path`` unless ``force``, and fail early when it cannot be created (nothing is
    created here: a run that fails later leaves no empty folder behind)."""
    try:
        exists = path.exists()
        is_dir = path.is_dir()
    except OSError as exc:  # a file name longer than the system allows
        raise GleakError(f"cannot write {show(path)}: {_os_error(exc)}") from None
    if exists and is_dir:
        raise GleakError(f"{show(path)} is a directory, expected a file path")
    if exists and not force:
        raise GleakError(f"{show(path)} already exists; pass --force to overwrite it")
    check_output_location(path)


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object], force: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    A crash or an exception leaves either the old file or nothing, never a half-written file.
    """
    target = Path(path)
    check_writable(target, force)
    make_parent(target)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=".gleak-", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise GleakError(f"cannot write {show(target)}: {_os_error(exc)}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        raise GleakError(f"cannot write {show(target)}: {_os_error(exc)}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


class OutputSet:
    """Several output files that appear together or not at all (e.g. a reconstruction's images + metrics).

    Files are staged in a hidden folder beside their destination and renamed into place only by
    :meth:`commit`; an exception inside the ``with`` block removes the staging folder, and a destination
    folder that this run created is removed again, so a failed run leaves nothing behind."""

    def __init__(self, folder: str | os.PathLike[str], force: bool = False) -> None:
        self.folder = Path(folder)
        self.force = force
        self.created: Path | None = None
        self.staging: Path | None = None
        self.names: list[str] = []

    def __enter__(self) -> OutputSet:
        try:
            if self.folder.exists() and not self.folder.is_dir():
                raise GleakError(f"{show(self.folder)} exists and is not a folder")
            if not self.folder.exists():
                top = self.folder
                while not top.parent.exists() and top.parent != top:
                    top = top.parent
                self.folder.mkdir(parents=True)
                self.created = top
            self.staging = Path(tempfile.mkdtemp(prefix=".gleak-", dir=self.folder))
        except OSError as exc:
            self._cleanup()
            raise GleakError(f"cannot write into {show(self.folder)}: {_os_error(exc)}") from None
        return self

    def path(self, name: str) -> Path:
        """Where to write ``name`` now (inside the staging folder)."""
        assert self.staging is not None
        target = self.folder / name
        if target.exists() and not self.force:
            raise GleakError(f"{show(target)} already exists; pass --force to overwrite it")
        self.names.append(name)
        return self.staging / name

    def path_of(self, name: str) -> Path:
        """The staged file of ``name`` (already written through :meth:`path`)."""
        assert self.staging is not None
        return self.staging / name

    def write_bytes(self, name: str, data: bytes) -> Path:
        self.path(name).write_bytes(data)
        return self.folder / name

    def commit(self) -> list[Path]:
        """Move every staged file into place; returns the final paths."""
        assert self.staging is not None
        done = []
        try:
            for name in self.names:
                os.chmod(self.staging / name, 0o666 & ~_umask())
                os.replace(self.staging / name, self.folder / name)
                done.append(self.folder / name)
        except OSError as exc:
            for p in done:
                with contextlib.suppress(OSError):
                    p.unlink()
            raise GleakError(f"cannot write into {show(self.folder)}: {_os_error(exc)}") from None
        self.created = None  # success: keep the folder
        return done

    def _cleanup(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self._cleanup()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, force: bool = False) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), force=force)


def write_text_atomic(path: str | os.PathLike[str], text: str, force: bool = False) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), force=force)


def file_sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """Hash of named tensors, independent of file layout: sorted names, dtypes, shapes and raw bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def safetensors_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise to the safetensors layout with a deterministic header (keys in order, metadata sorted).

    The Rust writer orders its metadata map at random, so two identical captures would differ in bytes;
    this writer keeps tensors in the given (model) order and is byte-for-byte reproducible.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(metadata[k]) for k in sorted(metadata)}
    blobs: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype not in _ST_DTYPES:
            raise GleakError(f"tensor '{name}' has dtype {t.dtype}, which safetensors cannot store")
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset,
                                                                                              offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def save_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor],
                     metadata: Mapping[str, str] | None = None, force: bool = False) -> Path:
    """Atomic, reproducible safetensors write; refuses to overwrite without ``force``."""
    data = safetensors_bytes(tensors, metadata)
    return write_bytes_atomic(path, data, force=force)


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    """Validate the safetensors framing ourselves so that errors are precise; return the header."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise GleakError(f"{path}: not a safetensors file (only {len(head)} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER_BYTES:
                raise GleakError(f"{path}: not a safetensors file (header length {n} is implausible)")
            if n > size - 8:
                raise GleakError(
                    f"{path}: truncated header (it declares {n} bytes, the file has {size - 8} after the length)"
                )
            raw = f.read(n)
    except OSError as e:
        raise GleakError(f"{path}: cannot read file ({e.strerror or e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise GleakError(f"{path}: not a safetensors file (header is not valid JSON)") from None
    if not isinstance(header, dict):
        raise GleakError(f"{path}: not a safetensors file (header is not a JSON object)")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise GleakError(f"{path}: safetensors metadata must map strings to strings")
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise GleakError(f"{path}: tensor '{name}' has a malformed header entry")
        if offsets[1] > data_len:
            raise GleakError(
                f"{path}: truncated file (tensor '{name}' needs bytes up to {offsets[1]}, "
                f"only {data_len} present)"
            )
    return header, n


def is_safetensors(path: Path) -> bool:
    """Whether ``path`` is framed as a safetensors file (a plausible header length, then a JSON object), from its
    first 9 bytes: the cheap test before choosing a reader (:func:`read_safetensors` checks the rest)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < 9:
        return False
    (header_len,) = struct.unpack("<Q", head[:8])
    return 0 < header_len <= size - 8 and head[8:9] == b"{"


def safetensors_kind(path: Path) -> str | None:
    """``gleak.kind`` from a safetensors header, reading neither the tensors nor checking them (None when the
    file is not a readable safetensors file or records no kind): for telling gleak files apart cheaply."""
    return header_value(path, "gleak.kind")


def header_value(path: Path, key: str) -> str | None:
    """One metadata value of a safetensors header (``gleak.kind``, ``gleak.modality``), reading no tensor (None when
    the file is not a regular, readable safetensors file or does not record it: a pipe or a device is never opened,
    so this never blocks)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except (OSError, ValueError):
        return None
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (size,) = struct.unpack("<Q", raw)
            if size > MAX_HEADER_BYTES:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


def read_safetensors(path: str | Path, what: str = "file") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read every tensor and the raw metadata of a safetensors file, with readable errors."""
    p = check_input_file(path, what)
    header, _ = _read_header(p)
    try:
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(p), framework="pt") as f:
            meta = dict(f.metadata() or {})
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = f.get_tensor(name)
    except GleakError:
        raise
    except Exception as e:  # the Rust reader reports dtype/shape/offset problems as generic errors
        raise GleakError(f"{p}: not a valid safetensors file ({str(e).splitlines()[0][:200]})") from None
    order = [k for k in header if k != "__metadata__"]
    ordered = {k: tensors[k] for k in sorted(order, key=lambda k: header[k]["data_offsets"][0])}
    return ordered, meta


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays (inside dicts, lists, tuples) and nothing else: any other global is refused."""

    ALLOWED: frozenset[tuple[str, str]] = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype")})

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only numpy arrays are allowed")
        return super().find_class(module, name)


def load_numpy_pickle(file: BinaryIO, encoding: str = "ASCII") -> object:
    """Read a pickle that holds only numpy arrays in plain containers, without running any code in it."""
    return _NumpyOnlyUnpickler(file, encoding=encoding).load()
