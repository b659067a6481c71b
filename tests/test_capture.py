"""Capture format v1: round trips, validation messages, the truth companion, user-side helpers."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from gleak.capture import (
    SCHEMA,
    Capture,
    Truth,
    capture_gradients,
    capture_update,
    format_metadata,
    load_capture,
    load_truth,
    parse_metadata,
    save_capture,
    save_truth,
    truth_path_for,
    validate_against_model,
)
from gleak.errors import GleakError
from gleak.losses import LossSpec, client_loss
from gleak.models import build_zoo_model


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_zoo_model("mlp", input_shape=(1, 4, 4), hidden=(8, 6), num_classes=3)


def make_capture(**meta) -> Capture:
    model = small_model()
    x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 2, 2, 1])
    return capture_gradients(model, x, y, metadata=meta)


def test_round_trip_keeps_tensors_typed_metadata_and_unknown_keys(tmp_path: Path) -> None:
    cap = make_capture(**{"gleak.learning_rate": 0.05, "gleak.fl.round": 3})
    cap.extra["gleak.custom.note"] = "kept"
    path = save_capture(cap, tmp_path / "c.safetensors")
    back = load_capture(path)
    assert back.kind == "gradient"
    assert back.batch_size == 4 and back.local_steps == 1
    assert back.learning_rate == 0.05 and back.get("gleak.fl.round") == 3
    assert back.input_shape == (1, 4, 4) and back.num_classes == 3
    assert back.extra["gleak.custom.note"] == "kept"
    assert back.get("gleak.schema_version") == 1 and back.get("gleak.model.sha256") == cap.get("gleak.model.sha256")
    assert set(back.tensors) == set(cap.tensors)
    for name, t in cap.tensors.items():
        assert torch.equal(back.tensors[name], t)


def test_gradients_match_autograd_of_cross_entropy() -> None:
    model = small_model()
    x, y = torch.randn(5, 1, 4, 4), torch.tensor([0, 1, 2, 2, 0])
    cap = capture_gradients(model, x, y)
    F.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(cap.tensors[name], p.grad)


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    cap = make_capture()
    path = save_capture(cap, tmp_path / "c.safetensors")
    before = path.read_bytes()
    with pytest.raises(GleakError, match="already exists"):
        save_capture(make_capture(), path)
    assert path.read_bytes() == before
    save_capture(cap, path, force=True)
    assert not list(tmp_path.glob(".*tmp"))  # no temporary files left behind


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a safetensors file"),
        (b"hello world, this is text", "implausible|truncated header"),
        (struct.pack("<Q", 1000) + b"{}", "truncated header"),
        (struct.pack("<Q", 4) + b"nope", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ],
)
def test_framing_errors_are_precise(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(GleakError, match=message):
        load_capture(path)


def test_truncated_tensor_data(tmp_path: Path) -> None:
    path = save_capture(make_capture(), tmp_path / "c.safetensors")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(GleakError, match="truncated file"):
        load_capture(path)


def _write(tmp_path: Path, meta: dict[str, str], tensors: dict | None = None) -> Path:
    path = tmp_path / "m.safetensors"
    save_file(tensors or {"fc.weight": torch.zeros(2, 3)}, str(path), metadata=meta)
    return path


def test_unknown_kind_and_missing_kind(tmp_path: Path) -> None:
    with pytest.raises(GleakError, match=r"'gleak.kind'.*one of gradient, update"):
        load_capture(_write(tmp_path, {"gleak.kind": "weights"}))
    with pytest.raises(GleakError, match="missing metadata key 'gleak.kind'"):
        load_capture(_write(tmp_path, {"format": "pt"}))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("gleak.batch_size", "thirty-two", "an integer"),
        ("gleak.learning_rate", "fast", "a number"),
        ("gleak.learning_rate", "nan", "a number"),
        ("gleak.input_shape", "[1, 28, \"x\"]", "list of integers"),
        ("gleak.data.mean", "{\"a\": 1}", "list of numbers"),
        ("gleak.model.train_mode", "maybe", "true or false"),
        ("gleak.optimizer", "rmsprop", "one of sgd, sgdm, nag, adam"),
    ],
)
def test_unparsable_metadata_names_key_and_type(tmp_path: Path, key: str, value: str, expected: str) -> None:
    with pytest.raises(GleakError, match=f"'{key}'.*expected.*{expected}"):
        load_capture(_write(tmp_path, {"gleak.kind": "gradient", key: value}))


def test_negative_batch_size_rejected(tmp_path: Path) -> None:
    with pytest.raises(GleakError, match="'gleak.batch_size' is -3; it must be ≥ 1"):
        load_capture(_write(tmp_path, {"gleak.kind": "gradient", "gleak.batch_size": "-3"}))


@pytest.mark.parametrize(("value", "word"), [(float("nan"), "NaN"), (float("inf"), "Inf")])
def test_nan_and_inf_tensors_are_named(tmp_path: Path, value: float, word: str) -> None:
    bad = torch.zeros(2, 3)
    bad[1, 2] = value
    path = _write(tmp_path, {"gleak.kind": "gradient"}, {"ok.weight": torch.zeros(3), "fc.weight": bad})
    with pytest.raises(GleakError, match=f"'fc.weight' contains {word} \\(1 of 6 values\\)"):
        load_capture(path)


def test_validate_against_model_missing_extra_and_shape() -> None:
    model = small_model()
    cap = make_capture()
    validate_against_model(cap, model)  # exact match passes
    name = next(iter(cap.tensors))
    missing = Capture({k: v for k, v in cap.tensors.items() if k != name}, cap.meta)
    with pytest.raises(GleakError, match=f"missing 1 model tensor.*'{name}'"):
        validate_against_model(missing, model)
    extra = Capture({**cap.tensors, "head.weight": torch.zeros(1)}, cap.meta)
    with pytest.raises(GleakError, match="not in the model: 'head.weight'"):
        validate_against_model(extra, model)
    wrong = Capture({**cap.tensors, name: torch.zeros(7, 7)}, cap.meta)
    shape = list(cap.tensors[name].shape)
    msg = f"shape mismatch for '{name}': capture has [7, 7], model has {shape}"
    with pytest.raises(GleakError, match=re.escape(msg)):
        validate_against_model(wrong, model)


def test_metadata_schema_round_trip_every_key() -> None:
    samples = {"str": "x", "enum": None, "int": 3, "float": 0.25, "bool": True, "int_list": [1, 28, 28],
               "float_list": [0.5, 0.25], "str_list": ["bn.running_mean"], "json": {"ratio": 0.3},
               "sha256": "ab" * 32}
    typed = {}
    for key, field in SCHEMA.items():
        typed[key] = field.choices[0] if field.type == "enum" else samples[field.type]
    known, extra = parse_metadata(format_metadata(typed))
    assert known == typed and extra == {}


def test_truth_companion_bound_to_capture(tmp_path: Path) -> None:
    cap_path = save_capture(make_capture(), tmp_path / "run.safetensors")
    truth_path = truth_path_for(cap_path)
    assert truth_path.name == "run.truth.safetensors"
    truth = Truth(torch.tensor([0, 2, 2, 1]), torch.randn(4, 1, 4, 4))
    save_truth(truth, truth_path, capture_path=cap_path)
    back = load_truth(truth_path, load_capture(cap_path))
    assert torch.equal(back.labels, truth.labels) and not back.soft
    assert back.counts(3).tolist() == [1, 1, 2]
    other = save_capture(make_capture(**{"gleak.fl.round": 9}), tmp_path / "other.safetensors")
    with pytest.raises(GleakError, match="belongs to a different capture"):
        load_truth(truth_path, load_capture(other))
    with pytest.raises(GleakError, match="ground-truth file"):
        load_capture(truth_path)
    with pytest.raises(GleakError, match="not a ground-truth file"):
        load_truth(cap_path)


def test_soft_truth_counts_mass(tmp_path: Path) -> None:
    labels = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.5, 0.5]])
    path = save_truth(Truth(labels, torch.zeros(2, 1, 4, 4)), tmp_path / "t.safetensors")
    back = load_truth(path)
    assert back.soft and back.hard_labels().tolist() == [0, 1]
    assert torch.allclose(back.counts(3), torch.tensor([0.7, 0.8, 0.5], dtype=torch.float64))


def test_capture_update_is_local_minus_global() -> None:
    g = {"w": torch.ones(2, 2), "b": torch.zeros(2)}
    loc = {"w": torch.full((2, 2), 0.5), "b": torch.ones(2)}
    cap = capture_update(g, loc, learning_rate=0.1, local_steps=3, batch_size=4)
    assert cap.kind == "update" and cap.get("gleak.num_examples") == 12
    assert torch.equal(cap.tensors["w"], torch.full((2, 2), -0.5))
    with pytest.raises(GleakError, match="shape mismatch for 'b'"):
        capture_update(g, {"w": loc["w"], "b": torch.ones(3)})
    with pytest.raises(GleakError, match="different tensors"):
        capture_update(g, {"w": loc["w"]})


def test_losses_match_pytorch_definitions() -> None:
    torch.manual_seed(0)
    z, y = torch.randn(6, 5), torch.randint(0, 5, (6,))
    assert torch.allclose(client_loss(z, y, LossSpec(label_smoothing=0.2)), F.cross_entropy(z, y, label_smoothing=0.2))
    assert torch.allclose(client_loss(z, y, LossSpec(temperature=2.0, reduction="sum")),
                          F.cross_entropy(z / 2, y, reduction="sum"))
    p = F.softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    focal = (-(0.25 * (1 - p) ** 2 * p.log())).mean()
    assert torch.allclose(client_loss(z, y, LossSpec("focal", focal_gamma=2, focal_alpha=0.25)), focal)
    bce = F.binary_cross_entropy_with_logits(z, F.one_hot(y, 5).float(), reduction="sum") / 6
    assert torch.allclose(client_loss(z, y, LossSpec("bce")), bce)


def test_metadata_json_is_compact() -> None:
    out = format_metadata({"gleak.input_shape": [1, 28, 28], "gleak.mixup": {"ratio": None}})
    assert out["gleak.input_shape"] == "[1,28,28]"
    assert json.loads(out["gleak.mixup"]) == {"ratio": None}


def test_documented_model_hash_reference_matches_tensors_sha256() -> None:
    """docs/capture-format.md gives other producers a numpy-only reference of gleak.model.sha256; keep it true."""
    from gleak.io import tensors_sha256
    from gleak.models import build_zoo_model

    doc = (Path(__file__).resolve().parent.parent / "docs/capture-format.md").read_text()
    code = doc.split("```python")[1].split("```")[0]
    namespace: dict = {}
    exec(code, namespace)  # the documentation's own snippet
    state = build_zoo_model("resnet-cifar", depth=8).state_dict()  # float32 weights and int64 scalar buffers
    assert namespace["model_sha256"]({k: v.numpy() for k, v in state.items()}) == tensors_sha256(state)
