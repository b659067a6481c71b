"""The CLI end to end: inspect and simulate on the shipped samples, and every bad input -> exit 2, one line."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from gleak.capture import SCHEMA, load_capture, load_truth, truth_path_for

from .conftest import CIFAR, CNN, FEDAVG, FEDSGD, LENET, MNIST_CLIENT, ROOT


def assert_clean_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_inspect_sample_with_model_json(gleak) -> None:
    r = gleak("inspect", FEDSGD, "--model", LENET, "--format", "json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["kind"] == "gradient" and info["batch_size"] == 32 and info["num_tensors"] == 10
    assert info["num_parameters"] == sum(p.numel() for p in load_capture(FEDSGD).tensors.values())
    layer = info["last_layer"]
    assert (layer["name"], layer["num_classes"], layer["feature_dim"], layer["has_bias"]) == ("fc3", 10, 84, True)
    assert "traced a forward pass" in layer["reason"]
    assert info["model"]["matches_capture"] is True
    assert info["unknown_metadata"]["gleak.sample.model"].endswith("lenet_untrained.safetensors")
    assert info["truth_file"].endswith("fedsgd_b32.truth.safetensors")
    assert info["attacks"]["ilrg"] is None and "B = 32" in info["attacks"]["idlg"]


def test_inspect_table_shows_layer_and_metadata(gleak) -> None:
    r = gleak("inspect", FEDAVG, "--model", LENET)
    assert r.exit_code == 0, r.stderr
    for text in ("update", "fc3.weight", "[10, 84]", "gleak.local_steps", "traced a forward pass", "unknown"):
        assert text in r.stdout, text
    assert "rlu" in r.stdout and "applies" in r.stdout and "not applicable" in r.stdout


def test_inspect_without_model_guesses_from_tensor_names(gleak) -> None:
    r = gleak("inspect", CNN.parent.parent / "captures/cifar10_b8.safetensors", "--format", "json")
    assert r.exit_code == 0, r.stderr
    layer = json.loads(r.stdout)["last_layer"]
    assert layer["weight_key"] == "fc.weight" and layer["weight_shape"] == [10, 768]
    assert "guess" in layer["reason"]


def test_inspect_fc_layer_override(gleak) -> None:
    r = gleak("inspect", FEDSGD, "--model", LENET, "--fc-layer", "fc3", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["last_layer"]["weight_shape"] == [10, 84]
    assert "override" in json.loads(r.stdout)["last_layer"]["reason"]
    assert_clean_error(gleak("inspect", FEDSGD, "--model", LENET, "--fc-layer", "fc2"), "fc2", "fc3.weight")
    assert_clean_error(gleak("inspect", FEDSGD, "--model", LENET, "--fc-layer", "nope"), "--fc-layer", "fc3.weight")


def test_simulate_writes_capture_and_truth_deterministically(gleak, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    outs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.safetensors"
        r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", out, "-b", "8", "-m", "3",
                  "--optimizer", "nag", "--label-smoothing", "0.1", "--seed", "42")
        assert r.exit_code == 0, r.stderr
        assert "wrote" in r.stdout
        outs.append(out)
    assert outs[0].read_bytes() == outs[1].read_bytes()
    cap = load_capture(outs[0])
    truth = load_truth(truth_path_for(outs[0]), cap)
    assert cap.kind == "update" and cap.local_steps == 3 and cap.get("gleak.optimizer") == "nag"
    assert truth.labels.shape == (24, 10) and truth.inputs.shape == (24, 1, 28, 28)
    # the truth file is bound to its capture; a different seed gives a different capture
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", outs[1], "-b", "8", "-m", "3",
              "--optimizer", "nag", "--label-smoothing", "0.1", "--seed", "43", "--force")
    assert r.exit_code == 0 and outs[0].read_bytes() != outs[1].read_bytes()


def test_simulate_cifar_explicit_labels(gleak, tmp_path: Path) -> None:
    out = tmp_path / "c.safetensors"
    r = gleak("simulate", "--model", CNN, "--data", CIFAR, "-o", out, "-b", "4", "--labels", "3,3,8,0")
    assert r.exit_code == 0, r.stderr
    assert load_truth(truth_path_for(out)).labels.tolist() == [3, 3, 8, 0]
    assert "0×1, 3×2, 8×1" in r.stdout


def test_simulate_refuses_overwrite(gleak, tmp_path: Path) -> None:
    out = tmp_path / "x.safetensors"
    out.write_bytes(b"keep me")
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", out)
    assert_clean_error(r, "already exists", "--force")
    assert out.read_bytes() == b"keep me"


def test_simulate_model_data_mismatch(gleak, tmp_path: Path) -> None:
    r = gleak("simulate", "--model", LENET, "--data", CIFAR, "-o", tmp_path / "x.safetensors")
    assert_clean_error(r, "expects inputs [1, 28, 28]", "[3, 32, 32]")


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--scheme", "fedsgd", "-m", "2"], ["FedSGD shares one gradient"]),
        (["--optimizer", "lion"], ["unknown optimizer 'lion'"]),
        (["--loss", "hinge"], ["unknown loss 'hinge'"]),
        (["--labels", "1,x"], ["--labels must be comma-separated"]),
        (["--labels", "1,2,3,4,5,6,7,11"], ["no examples in the data: [11]"]),
        (["--device", "tpu"], ["--device must be auto, cpu or cuda"]),
        (["--arch-kwargs", "[1]"], ["arch kwargs"]),
    ],
)
def test_simulate_bad_options(gleak, tmp_path: Path, args, fragments) -> None:
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", tmp_path / "x.safetensors", *args)
    assert_clean_error(r, *fragments)


def write_capture(path: Path, tensors: dict, meta: dict) -> Path:
    save_file(tensors, str(path), metadata=meta)
    return path


def lenet_tensors() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_capture(FEDSGD).tensors.items()}


def test_every_validation_error_through_the_cli(gleak, tmp_path: Path) -> None:
    meta = {"gleak.kind": "gradient"}
    cases = []
    p = tmp_path / "text.safetensors"
    p.write_text("this is not a tensor file at all")
    cases.append((p, ["not a safetensors file"]))
    p = tmp_path / "trunc.safetensors"
    p.write_bytes(struct.pack("<Q", 500) + b'{"__metadata__":')
    cases.append((p, ["truncated header"]))
    cases.append((write_capture(tmp_path / "kind.safetensors", lenet_tensors(), {"gleak.kind": "weights"}),
                  ["'gleak.kind'", "gradient, update"]))
    cases.append((write_capture(tmp_path / "meta.safetensors", lenet_tensors(), {**meta, "gleak.batch_size": "x"}),
                  ["'gleak.batch_size'", "expected an integer"]))
    nan = lenet_tensors()
    nan["fc3.weight"][0, 0] = float("nan")
    cases.append((write_capture(tmp_path / "nan.safetensors", nan, meta), ["'fc3.weight' contains NaN"]))
    missing = lenet_tensors()
    del missing["features.0.weight"]
    cases.append((write_capture(tmp_path / "missing.safetensors", missing, meta), ["missing 1", "'features.0.weight'"]))
    extra = {**lenet_tensors(), "head.weight": torch.zeros(2, 2)}
    cases.append((write_capture(tmp_path / "extra.safetensors", extra, meta), ["not in the model: 'head.weight'"]))
    shape = lenet_tensors()
    shape["fc3.weight"] = torch.zeros(10, 80)
    cases.append((write_capture(tmp_path / "shape.safetensors", shape, meta),
                  ["'fc3.weight'", "[10, 80]", "[10, 84]"]))
    cases.append((tmp_path / "absent.safetensors", ["no such file"]))
    for path, fragments in cases:
        assert_clean_error(gleak("inspect", path, "--model", LENET), *fragments)


def test_bad_model_inputs(gleak, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(64))
    assert_clean_error(gleak("inspect", FEDSGD, "--model", junk), "not a recognised model file")
    assert_clean_error(gleak("inspect", FEDSGD, "--model", LENET, "--arch", "nosuchnet"), "nosuchnet")
    assert_clean_error(gleak("inspect", FEDSGD, "--model", LENET, "--arch-kwargs", "{bad"), "not valid JSON")
    assert_clean_error(gleak("inspect", FEDSGD, "--model", tmp_path / "none.pt"), "no such file")
    assert_clean_error(gleak("inspect", FEDSGD, "--format", "xml"), "--format must be table or json")
    pickled = tmp_path / "whole.pt"
    torch.save(torch.nn.Linear(2, 2), pickled)
    assert_clean_error(gleak("inspect", FEDSGD, "--model", pickled), "--trust-pickle")


@pytest.mark.extended
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_random_bytes_never_traceback(gleak, tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(data)
    r = gleak("inspect", path)
    assert r.exit_code == 2 and "Traceback" not in r.stderr and r.stderr.startswith("error:")


_keys = st.sampled_from([*SCHEMA, "gleak.other", "note"])
_values = st.one_of(st.text(max_size=12), st.integers(-5, 64).map(str), st.floats(allow_nan=True).map(str),
                    st.sampled_from(["[1,28,28]", "[0.5]", "true", "gradient", "update", "mean", "{}", "null", "[]"]))


@pytest.mark.extended
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=st.dictionaries(_keys, _values, max_size=6))
def test_random_metadata_never_traceback(gleak, tmp_path: Path, meta: dict[str, str]) -> None:
    path = write_capture(tmp_path / "meta.safetensors", lenet_tensors(), meta)
    r = gleak("inspect", path, "--model", LENET, "--format", "json")
    assert r.exit_code in (0, 2), (meta, r.stderr)
    assert "Traceback" not in r.stderr
    if r.exit_code == 0:
        assert json.loads(r.stdout)["kind"] in ("gradient", "update")
    else:
        assert r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) <= 3


def test_python_dash_m_and_console_script() -> None:
    r = subprocess.run([sys.executable, "-m", "gleak", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "inspect" in r.stdout and "simulate" in r.stdout
    script = Path(sys.executable).parent / "gleak"
    r = subprocess.run([str(script), "inspect", str(FEDSGD), "--format", "json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["kind"] == "gradient"
