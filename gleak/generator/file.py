"""The generator file: a safetensors file of the decoder's weights with metadata that binds it to one model.

Metadata (all strings; nothing in it is ever executed or imported):

* ``gleak.kind`` = ``generator``, ``gleak.generator.version`` = 1, ``gleak.producer``;
* ``gleak.generator.spec``: the decoder's shape (JSON of :class:`~gleak.generator.network.DecoderSpec`);
* ``gleak.model.sha256`` (the global model's tensors, as captures record it), ``gleak.layer`` (the last layer
  whose input is the feature), ``gleak.feature_dim``, ``gleak.input_shape``;
* ``gleak.data.mean`` / ``gleak.data.std``: the normalisation the model's inputs use;
* ``gleak.aux.sha256`` / ``gleak.aux.examples`` / ``gleak.aux.source``: the auxiliary data it was trained on;
* ``gleak.train.*``: epochs, loss, seed, final training and held-out losses, held-out PSNR.

Loading checks the framing, the metadata types and ranges, the exact tensor names and shapes the spec implies,
and that every value is finite. :func:`check_fits` refuses a generator made for another model or layer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from gleak import __version__
from gleak.errors import GleakError, shorten
from gleak.generator.network import DecoderSpec, FeatureDecoder
from gleak.io import save_safetensors, show

KIND = "generator"
VERSION = "1"
SHA = "0123456789abcdef"


@dataclass
class GeneratorFile:
    """A loaded generator: the decoder (eval mode) and what its file records."""

    decoder: FeatureDecoder
    path: Path | None
    model_sha256: str
    layer: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> DecoderSpec:
        return self.decoder.spec

    def describe(self) -> dict[str, Any]:
        """What reports record about the generator used."""
        m = self.meta
        return {"file": str(self.path) if self.path else None, "layer": self.layer,
                "feature_dim": self.spec.feature_dim, "image_shape": list(self.spec.image_shape),
                "aux_sha256": m.get("gleak.aux.sha256"), "epochs": _int_or_none(m.get("gleak.train.epochs")),
                "heldout_psnr": _float_or_none(m.get("gleak.train.heldout_psnr"))}


def save_generator(path: str | Path, decoder: FeatureDecoder, *, model_sha256: str, layer: str,
                   mean: tuple[float, ...], std: tuple[float, ...], aux_sha256: str, aux_examples: int,
                   aux_source: str, train: Mapping[str, Any], force: bool = False) -> Path:
    """Write ``decoder`` and its provenance atomically (refusing to overwrite without ``force``)."""
    meta = {
        "format": "pt", "gleak.kind": KIND, "gleak.generator.version": VERSION,
        "gleak.producer": f"gleak {__version__}",
        "gleak.generator.spec": decoder.spec.model_dump_json(),
        "gleak.model.sha256": model_sha256, "gleak.layer": layer,
        "gleak.feature_dim": str(decoder.spec.feature_dim),
        "gleak.input_shape": json.dumps(list(decoder.spec.image_shape)),
        "gleak.data.mean": json.dumps(list(mean)), "gleak.data.std": json.dumps(list(std)),
        "gleak.aux.sha256": aux_sha256, "gleak.aux.examples": str(aux_examples), "gleak.aux.source": aux_source,
    }
    for key, value in train.items():
        meta[f"gleak.train.{key}"] = value if isinstance(value, str) else json.dumps(value)
    state = {k: v.detach().cpu().contiguous() for k, v in decoder.state_dict().items()}
    return save_safetensors(path, state, meta, force=force)


def load_generator(path: str | Path, device: torch.device | str = "cpu") -> GeneratorFile:
    """Read and validate a generator file (one-line GleakError for anything wrong with it)."""
    from gleak.io import read_safetensors

    p = Path(path)
    tensors, meta = read_safetensors(p, "generator")
    where = f"generator {show(p)}"
    kind = meta.get("gleak.kind")
    if kind != KIND:
        hint = " (that is a capture; pass the file `gleak train-generator` wrote)" if kind in ("gradient", "update") \
            else ""
        raise GleakError(f"{where}: not a gleak generator (gleak.kind is {shorten(repr(kind), 40)}){hint}")
    if meta.get("gleak.generator.version") != VERSION:
        raise GleakError(f"{where}: generator version {shorten(repr(meta.get('gleak.generator.version')), 20)} is not "
                         f"supported (this gleak reads version {VERSION})")
    try:
        spec = DecoderSpec.model_validate_json(meta.get("gleak.generator.spec", ""))
    except (ValidationError, ValueError) as e:
        first = str(e).splitlines()
        raise GleakError(f"{where}: invalid gleak.generator.spec ({shorten(' '.join(first[:3]), 160)})") from None
    for key, value in (("gleak.feature_dim", spec.feature_dim), ("gleak.input_shape", list(spec.image_shape))):
        _agrees(meta, key, value, where)
    sha = meta.get("gleak.model.sha256", "")
    if len(sha) != 64 or any(ch not in SHA for ch in sha):
        raise GleakError(f"{where}: gleak.model.sha256 must be 64 lower-case hex digits")
    layer = meta.get("gleak.layer", "")
    if not layer or len(layer) > 500:
        raise GleakError(f"{where}: gleak.layer must name the model's last layer")
    mean = _floats(meta, "gleak.data.mean", where, spec.image_shape[0])
    std = _floats(meta, "gleak.data.std", where, spec.image_shape[0])
    if any(s <= 0 for s in std):
        raise GleakError(f"{where}: gleak.data.std must be > 0")
    decoder = FeatureDecoder(spec)
    expected = {k: tuple(v.shape) for k, v in decoder.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got.keys() != expected.keys():
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        raise GleakError(f"{where}: tensors do not match its spec (missing {missing[:3]}, unexpected {extra[:3]})")
    for k, shape in expected.items():
        if got[k] != shape:
            raise GleakError(f"{where}: tensor '{k}' has shape {list(got[k])}, its spec needs {list(shape)}")
        t = tensors[k]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise GleakError(f"{where}: tensor '{k}' holds NaN or Inf")
    state = {k: t.to(decoder.state_dict()[k].dtype) for k, t in tensors.items()}
    decoder.load_state_dict(state)
    decoder.eval().to(device)
    return GeneratorFile(decoder, p, sha, layer, mean, std, dict(meta))


def check_fits(gen: GeneratorFile, *, model_sha256: str | None, layer: str, feature_dim: int,
               input_shape: tuple[int, ...] | None, mean: tuple[float, ...] | None = None,
               std: tuple[float, ...] | None = None) -> list[str]:
    """Refuse (GleakError) a generator made for another model, layer, feature size or image shape; return
    warnings for softer mismatches (a different normalisation)."""
    name = show(gen.path) if gen.path else "the generator"
    if model_sha256 is not None and model_sha256 != gen.model_sha256:
        raise GleakError(f"generator {name} was trained for another model (sha256 {gen.model_sha256[:12]}…, this "
                         f"model's weights are {model_sha256[:12]}…); train one for this model with "
                         "`gleak train-generator`")
    if layer != gen.layer:
        raise GleakError(f"generator {name} decodes the input of layer '{shorten(gen.layer, 60)}', the attacked last "
                         f"layer is '{layer}'")
    if feature_dim != gen.spec.feature_dim:
        raise GleakError(f"generator {name} takes {gen.spec.feature_dim}-value features, layer '{layer}' has "
                         f"{feature_dim}")
    if input_shape is not None and tuple(input_shape) != tuple(gen.spec.image_shape):
        raise GleakError(f"generator {name} makes images of {list(gen.spec.image_shape)}, the model takes "
                         f"{list(input_shape)}")
    warnings = []
    if mean is not None and std is not None and (not _close(mean, gen.mean) or not _close(std, gen.std)):
        warnings.append(f"the capture's normalisation (mean {list(mean)}, std {list(std)}) differs from the "
                        f"generator's training data (mean {list(gen.mean)}, std {list(gen.std)})")
    return warnings


def _close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    if len(a) == 1 and len(b) > 1:
        a = a * len(b)
    if len(b) == 1 and len(a) > 1:
        b = b * len(a)
    return len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def _agrees(meta: Mapping[str, str], key: str, expected: Any, where: str) -> None:
    """A key that repeats part of the spec (for people and tools reading the header) must agree with it."""
    if key not in meta:
        return
    try:
        value = json.loads(meta[key])
    except (json.JSONDecodeError, RecursionError):
        value = None
    if value != expected or isinstance(value, bool):
        raise GleakError(f"{where}: {key} {shorten(meta[key], 40)} disagrees with its gleak.generator.spec "
                         f"({json.dumps(expected)})")


def _floats(meta: Mapping[str, str], key: str, where: str, channels: int) -> tuple[float, ...]:
    try:
        value = json.loads(meta.get(key, ""))
    except (json.JSONDecodeError, RecursionError):
        value = None
    if (not isinstance(value, list) or len(value) not in (1, channels)
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        raise GleakError(f"{where}: {key} must be a JSON list of 1 or {channels} finite numbers")
    return tuple(float(v) for v in value)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float_or_none(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
