"""Datasets for simulation and auxiliary statistics: safetensors tensor files and image folders.

A safetensors dataset holds ``images`` (uint8 0–255, or float in [0, 1]) shaped [N, C, H, W] and
``labels`` int [N]; metadata may carry ``gleak.data.mean`` / ``gleak.data.std`` (per channel, applied as
(x − mean)/std before the model) and ``gleak.data.classes`` (JSON list of names). An image folder has one
sub-folder per class (sorted names give the class indices).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from gleak.errors import GleakError
from gleak.io import (
    MAX_INPUT_ELEMENTS,
    check_input_dir,
    check_input_file,
    probe_input,
    read_safetensors,
    save_safetensors,
    show,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


@dataclass
class Dataset:
    """Images in pixel scale [0, 1] (float32 [N, C, H, W]), int64 labels, and the normalisation to apply."""

    images: torch.Tensor
    labels: torch.Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: list[str] | None = None
    source: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.images.dim() != 4:
            raise GleakError(f"{self.source}: images must be [N, C, H, W], got {list(self.images.shape)}")
        if self.labels.dim() != 1 or self.labels.shape[0] != self.images.shape[0]:
            raise GleakError(f"{self.source}: labels {list(self.labels.shape)} do not match "
                             f"images {list(self.images.shape)}")
        if self.images.shape[0] == 0:
            raise GleakError(f"{self.source}: the data set holds no examples")
        if int(self.labels.min()) < 0:
            raise GleakError(f"{self.source}: labels must be non-negative class indices, found "
                             f"{int(self.labels.min())}")
        if self.classes is not None and int(self.labels.max()) >= len(self.classes):
            raise GleakError(f"{self.source}: label {int(self.labels.max())} has no name in gleak.data.classes "
                             f"({len(self.classes)} names)")
        if math.prod(self.images.shape[1:]) > MAX_INPUT_ELEMENTS:
            raise GleakError(f"{self.source}: images of {list(self.images.shape[1:])} are larger than gleak accepts")
        channels = self.images.shape[1]
        for name, value in (("mean", self.mean), ("std", self.std)):
            if len(value) not in (1, channels):
                raise GleakError(f"{self.source}: normalisation {name} has {len(value)} values for {channels} channels")
        if not all(math.isfinite(v) for v in (*self.mean, *self.std)):
            raise GleakError(f"{self.source}: normalisation mean and std must be finite numbers")
        if any(s <= 0 for s in self.std):
            raise GleakError(f"{self.source}: normalisation std must be > 0")

    def check_classes(self, num_classes: int) -> None:
        """Every label must be a class of the model (a label of 2^40 would otherwise size tensors by it)."""
        high = int(self.labels.max())
        if high >= num_classes:
            raise GleakError(f"{self.source}: label {high} is outside the model's classes 0 … {num_classes - 1}")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        if self.classes:
            return len(self.classes)
        return int(self.labels.max()) + 1 if len(self) else 0

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.images.shape[1:]
        return int(c), int(h), int(w)

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=pixels.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=pixels.dtype).view(1, -1, 1, 1)
        return (pixels - mean) / std

    def denormalize(self, inputs: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=inputs.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=inputs.dtype).view(1, -1, 1, 1)
        return inputs * std + mean

    def batch(self, indices: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Model-ready (normalised) inputs and labels for the given example indices."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.normalize(self.images[idx]), self.labels[idx]

    def indices_by_class(self) -> dict[int, torch.Tensor]:
        return {int(c): torch.nonzero(self.labels == c).flatten() for c in torch.unique(self.labels)}

    def subset(self, indices: Sequence[int] | torch.Tensor) -> Dataset:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return Dataset(self.images[idx], self.labels[idx], self.mean, self.std, self.classes, self.source,
                       dict(self.metadata))


def _floats(meta: dict[str, str], key: str, path: Path) -> tuple[float, ...] | None:
    if key not in meta:
        return None
    try:
        value = json.loads(meta[key])
        if isinstance(value, int | float):
            value = [value]
        return tuple(float(v) for v in value)
    except (ValueError, TypeError, RecursionError):
        raise GleakError(f"{path}: metadata key '{key}' must be a JSON list of numbers, got {meta[key]!r}") from None


def load_dataset(path: str | Path, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 image_size: int | None = None) -> Dataset:
    """Load a safetensors dataset or an image folder; ``mean``/``std`` override the file's normalisation."""
    p = Path(path)
    # probe_input, not p.is_dir(): that raises OSError for a name longer than the file system allows (exit 3)
    if probe_input(p, "data set") == "dir":
        ds = _load_image_folder(check_input_dir(p, "data folder"), image_size)
    else:
        ds = _load_tensor_file(check_input_file(p, "data set"))
    if mean is not None:
        ds.mean = tuple(mean)
    if std is not None:
        ds.std = tuple(std)
    ds.__post_init__()
    return ds


def _load_tensor_file(p: Path) -> Dataset:
    tensors, meta = read_safetensors(p, "data set")
    for name in ("images", "labels"):
        if name not in tensors:
            raise GleakError(f"{p}: a dataset file needs an '{name}' tensor (found: {', '.join(tensors) or 'none'})")
    images, labels = tensors["images"], tensors["labels"]
    if images.dtype == torch.uint8:
        images = images.float() / 255.0
    elif images.is_floating_point():
        images = images.float()
        if not bool(torch.isfinite(images).all()):
            raise GleakError(f"{p}: tensor 'images' contains NaN/Inf")
    else:
        raise GleakError(f"{p}: images must be uint8 or float, got {images.dtype}")
    if images.dim() == 3:  # [N, H, W] grayscale
        images = images.unsqueeze(1)
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise GleakError(f"{p}: labels must be integer class indices, got {labels.dtype}")
    classes = None
    if "gleak.data.classes" in meta:
        try:
            classes = [str(c) for c in json.loads(meta["gleak.data.classes"])]
        except (ValueError, TypeError, RecursionError):
            raise GleakError(f"{p}: metadata 'gleak.data.classes' must be a JSON list of names") from None
    channels = images.shape[1] if images.dim() == 4 else 1
    mean = _floats(meta, "gleak.data.mean", p) or (0.0,) * channels
    std = _floats(meta, "gleak.data.std", p) or (1.0,) * channels
    return Dataset(images.contiguous(), labels.long(), mean, std, classes, str(p), meta)


def _list_folder(folder: Path, folders: bool = False) -> list[Path]:
    """The entries of a folder of the data set (only its sub-folders with ``folders``; hidden ones left out then),
    sorted; a folder that may not be read is a GleakError, not an OSError."""
    try:
        entries = sorted(folder.iterdir())
        return [d for d in entries if not d.name.startswith(".") and d.is_dir()] if folders else entries
    except OSError as exc:
        raise GleakError(f"cannot read data folder {show(folder)}: {exc.strerror or type(exc).__name__}") from None


def _load_image_folder(root: Path, image_size: int | None) -> Dataset:
    class_dirs = _list_folder(root, folders=True)
    if not class_dirs:
        raise GleakError(f"{root}: an image folder needs one sub-folder per class; none found")
    pictures: list[Image.Image] = []
    labels: list[int] = []
    for index, d in enumerate(class_dirs):
        for f in _list_folder(d):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            check_input_file(f, "image")
            try:
                with Image.open(f) as im:
                    im.load()
                    pictures.append(im.copy())
            except (UnidentifiedImageError, OSError, Image.DecompressionBombError, ValueError) as e:
                raise GleakError(f"{f}: cannot read image ({e})") from None
            labels.append(index)
    if not pictures:
        raise GleakError(f"{root}: no images found in the class folders")
    mode = "L" if all(im.mode in ("L", "1", "I;16", "I") for im in pictures) else "RGB"
    size = (image_size, image_size) if image_size else pictures[0].size
    arrays = []
    for picture in pictures:
        converted = picture.convert(mode)
        if converted.size != size:
            if image_size is None:
                raise GleakError(f"{root}: images differ in size ({pictures[0].size} vs {converted.size}); "
                                 "pass --image-size to resize them")
            converted = converted.resize(size, Image.Resampling.BILINEAR)
        arr = np.asarray(converted, dtype=np.uint8)
        arrays.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
    images = torch.from_numpy(np.stack(arrays)).float() / 255.0
    channels = images.shape[1]
    return Dataset(images, torch.tensor(labels), (0.0,) * channels, (1.0,) * channels,
                   [d.name for d in class_dirs], str(root))


def save_dataset(ds: Dataset, path: str | Path, force: bool = False, metadata: dict[str, str] | None = None) -> Path:
    """Store a dataset as uint8 images + int64 labels with its normalisation in the metadata."""
    images = (ds.images * 255).round().clamp(0, 255).to(torch.uint8).contiguous()
    meta = {"format": "pt", "gleak.data.mean": json.dumps(list(ds.mean)), "gleak.data.std": json.dumps(list(ds.std))}
    if ds.classes:
        meta["gleak.data.classes"] = json.dumps(ds.classes)
    meta.update(metadata or {})
    tensors = {"images": images, "labels": ds.labels.long().contiguous()}
    return save_safetensors(path, tensors, meta, force=force)
