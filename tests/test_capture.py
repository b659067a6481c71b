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
    hint = re.escape("is this the model the capture was made with? pass it with --model (and --arch for weight "
                     "files)") + "$"
    with pytest.raises(GleakError, match=f"missing 1 model tensor.*'{name}'.*; {hint}"):
        validate_against_model(missing, model)
    extra = Capture({**cap.tensors, "head.weight": torch.zeros(1)}, cap.meta)
    with pytest.raises(GleakError, match="not in the model: 'head.weight'; " + hint):
        validate_against_model(extra, model)
    wrong = Capture({**cap.tensors, name: torch.zeros(7, 7)}, cap.meta)
    shape = list(cap.tensors[name].shape)
    msg = f"shape mismatch for '{name}': capture has [7, 7], model has {shape}"
    with pytest.raises(GleakError, match=re.escape(msg) + "; " + hint):
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
    assert torch.allclose(client_loss(z, y, LossSpec(name="focal", focal_gamma=2, focal_alpha=0.25)), focal)
    bce = F.binary_cross_entropy_with_logits(z, F.one_hot(y, 5).float(), reduction="sum") / 6
    assert torch.allclose(client_loss(z, y, LossSpec(name="bce")), bce)


def test_metadata_json_is_compact() -> None:
    out = format_metadata({"gleak.input_shape": [1, 28, 28], "gleak.mixup": {"ratio": None}})
    assert out["gleak.input_shape"] == "[1,28,28]"
    assert json.loads(out["gleak.mixup"]) == {"ratio": None}


def test_documented_model_hash_reference_matches_tensors_sha256() -> None:
    """docs/capture-format.md gives other producers a numpy-only reference of gleak.model.sha256; keep it true."""
    from gleak.io import tensors_sha256
    from gleak.models import build_zoo_model

    doc = (Path(__file__).resolve().parent.parent / "docs/capture-format.md").read_text()
    code = next(block.split("```")[0] for block in doc.split("```python")[1:] if "def model_sha256" in block)
    namespace: dict = {}
    exec(code, namespace)  # the documentation's own snippet
    state = build_zoo_model("resnet-cifar", depth=8).state_dict()  # float32 weights and int64 scalar buffers
    assert namespace["model_sha256"]({k: v.numpy() for k, v in state.items()}) == tensors_sha256(state)


ROOT = Path(__file__).resolve().parent.parent


def test_capture_gradients_records_normalisation() -> None:
    model = small_model()
    x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 2, 2, 1])
    cap = capture_gradients(model, x, y, mean=[0.5], std=torch.tensor([0.25]))
    assert cap.get("gleak.data.mean") == [0.5] and cap.get("gleak.data.std") == [0.25]
    assert cap.num_classes == 3 and cap.input_shape == (1, 4, 4)
    assert "gleak.optimizer" not in cap.meta  # a gradient is taken before any optimizer step
    with pytest.raises(GleakError, match="both mean and std"):
        capture_gradients(model, x, y, mean=[0.5])
    with pytest.raises(GleakError, match="gleak.data.std has 2 values; the inputs have 1 channels"):
        capture_gradients(model, x, y, mean=[0.5], std=[0.2, 0.3])


def test_capture_update_records_how_the_client_trained(tmp_path: Path) -> None:
    model = small_model()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    local_state = {k: v + 0.01 for k, v in global_state.items()}
    inputs = torch.randn(4, 1, 4, 4)
    cap = capture_update(global_state, local_state, learning_rate=0.1, local_steps=2, optimizer="nag",
                         momentum=0.5, weight_decay=1e-4, loss=LossSpec(label_smoothing=0.1), inputs=inputs,
                         mean=[0.1307], std=[0.3081])
    back = load_capture(save_capture(cap, tmp_path / "u.safetensors"))
    assert back.batch_size == 4 and back.get("gleak.num_examples") == 8
    assert back.input_shape == (1, 4, 4) and back.num_classes == 3  # from the inputs and the last layer
    assert back.value("gleak.optimizer") == "nag" and back.value("gleak.momentum") == 0.5
    assert back.value("gleak.weight_decay") == 1e-4 and back.value("gleak.label_smoothing") == 0.1
    assert back.get("gleak.data.mean") == [0.1307] and back.get("gleak.data.std") == [0.3081]
    with pytest.raises(GleakError, match="momentum applies to optimizer"):
        capture_update(global_state, local_state, optimizer="sgd", momentum=0.9)


def test_save_capture_writes_the_truth_beside_it(tmp_path: Path) -> None:
    x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 2, 2, 1], dtype=torch.int32)
    cap = capture_gradients(small_model(), x, y.long())
    path = save_capture(cap, tmp_path / "c.safetensors", truth=Truth(labels=y, inputs=x))
    truth = load_truth(truth_path_for(path), load_capture(path))  # bound to this capture's bytes
    assert truth.labels.dtype == torch.int64 and truth.labels.tolist() == [0, 2, 2, 1]
    assert torch.equal(truth.inputs, x)
    (tmp_path / "d.truth.safetensors").write_bytes(b"")
    with pytest.raises(GleakError, match="already exists"):
        save_capture(cap, tmp_path / "d.safetensors", truth=Truth(labels=y, inputs=x))
    assert not (tmp_path / "d.safetensors").exists()
    with pytest.raises(GleakError, match="the truth holds 2 labels, the capture 4 examples"):
        save_capture(cap, tmp_path / "e.safetensors", truth=Truth(labels=y[:2], inputs=x[:2]))
    assert not (tmp_path / "e.safetensors").exists()


def test_metadata_defaults_are_one_value_everywhere() -> None:
    """A missing key means the same to every reader: the schema's default (gleak.momentum: 0.9)."""
    from types import SimpleNamespace

    from gleak.attacks.context import gradient_transform
    from gleak.attacks.labels.rlu import rho_and_history

    gamma = SCHEMA["gleak.momentum"].default
    assert gamma == 0.9
    update = Capture({"fc.weight": torch.zeros(3, 2)}, {"gleak.kind": "update", "gleak.learning_rate": 0.1,
                                                        "gleak.optimizer": "nag"})
    assert update.value("gleak.momentum") == gamma and update.value("gleak.local_steps") == 1
    transform, _ = gradient_transform(update, 4, LossSpec())
    assert transform is not None and transform.update_scale == pytest.approx(0.1 * (1 + gamma))
    update.meta.update({"gleak.optimizer": "sgdm", "gleak.local_steps": 3})
    ctx = SimpleNamespace(capture=update, local_steps=3, kind="update")
    rho, _, _ = rho_and_history(ctx, torch.zeros(3))  # type: ignore[arg-type]
    tau = torch.arange(1, 4, dtype=torch.float64)
    assert rho.tolist() == pytest.approx(((1 - gamma ** (3 + 1 - tau)) / (1 - gamma)).tolist())
    spec = LossSpec.from_metadata({})
    assert (spec.name, spec.reduction, spec.temperature, spec.label_smoothing, spec.focal_gamma,
            spec.focal_alpha) == tuple(SCHEMA[k].default for k in (
                "gleak.loss", "gleak.loss.reduction", "gleak.temperature", "gleak.label_smoothing",
                "gleak.focal.gamma", "gleak.focal.alpha"))
    with pytest.raises(KeyError):
        update.value("gleak.no_such_key")


def test_documented_metadata_table_lists_every_schema_key() -> None:
    from gleak.capture import metadata_table

    doc = (ROOT / "docs/capture-format.md").read_text()
    table = doc.split("<!-- metadata-table:start -->\n")[1].split("<!-- metadata-table:end -->")[0]
    listed = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    assert listed == list(SCHEMA)
    assert table == metadata_table(), "docs/capture-format.md is out of date: regenerate the metadata table"


def _readme_blocks() -> tuple[str, str, str]:
    """The documented own-training-code example: mynet.py, client.py and the gleak command, verbatim."""
    doc = (ROOT / "docs/capture-format.md").read_text()
    section = doc.split("## Write captures from your own training code")[1].split("\n## ")[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    mynet = next(code for lang, code in blocks if lang == "python" and code.startswith("# mynet.py"))
    client = next(code for lang, code in blocks if lang == "python" and code.startswith("# client.py"))
    command = next(code for lang, code in blocks if lang == "bash" and code.startswith("gleak labels"))
    return mynet, client, command.strip()


def test_documented_own_training_code_example_recovers_the_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              gleak) -> None:
    """Run the README example as written: own model + batch -> capture + truth -> `gleak labels`; no metadata
    is missing (no warning, no last-layer guess) and the labels come back."""
    import shlex
    import sys

    mynet, client, command = _readme_blocks()
    (tmp_path / "mynet.py").write_text(mynet)
    (tmp_path / "client.py").write_text(client)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mynet", raising=False)
    sys.path.insert(0, str(tmp_path))  # what `python client.py` does for the script's directory
    try:
        exec(compile(client, str(tmp_path / "client.py"), "exec"), {"__name__": "__main__"})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mynet", None)  # the CLI must find mynet.py on its own (working directory)
    args = shlex.split(command)
    assert args[0] == "gleak"
    result = gleak(*args[1:], "--format", "json")
    assert result.exit_code == 0, result.stderr
    sys.modules.pop("mynet", None)
    report = json.loads(result.stdout)
    cap = load_capture(tmp_path / args[2])
    for key in ("gleak.data.mean", "gleak.data.std", "gleak.input_shape", "gleak.num_classes", "gleak.loss",
                "gleak.model.sha256", "gleak.batch_size"):
        assert key in cap.meta, key
    assert report["model_check"]["status"] == "match" and report["truth_file"]
    assert report["gradient_note"] is None and report["truth_counts"] == [1, 1, 1, 2, 0, 0, 0, 3, 0, 0]
    text = (result.stdout + result.stderr).lower()
    assert "guess" not in text and "not recorded" not in text and "no gleak." not in text
    ok = [r for r in report["results"] if r["status"] == "ok"]
    assert {r["attack"] for r in ok} >= {"ilrg", "zlg"}
    assert all(r["warnings"] == [] for r in ok), [r["warnings"] for r in ok]
    for r in ok:
        if r["attack"] in ("ilrg", "zlg", "llg-star"):
            assert r["scores"]["iacc"] == 1.0 and r["counts"] == report["truth_counts"], r
