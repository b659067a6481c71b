"""File helpers shared by every writer: atomic writes that never overwrite without ``force``, hashing."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import torch

from gleak.errors import GleakError


def check_writable(path: Path, force: bool) -> None:
    """Refuse to overwrite ``path`` unless ``force``; make sure its folder exists."""
    if path.exists() and not force:
        raise GleakError(f"{path} already exists; pass --force (force=True) to overwrite it")
    if path.exists() and path.is_dir():
        raise GleakError(f"{path} is a directory, expected a file path")
    path.parent.mkdir(parents=True, exist_ok=True)


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], None], force: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    A crash or an exception leaves either the old file or nothing, never a half-written file.
    """
    target = Path(path)
    check_writable(target, force)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


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
