"""`gleak train-generator` and the generator file: training on auxiliary data, provenance, determinism, the
held-out measurement against the mean-image baseline, refusals, and the file's own checks."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

from gleak.cli import app
from gleak.data.images import load_dataset, save_dataset
from gleak.errors import GleakError
from gleak.generator.file import check_fits, load_generator
from gleak.generator.train import aux_features
from gleak.io import read_safetensors, save_safetensors, tensors_sha256
from gleak.models import find_last_layer, load_model
from gleak.report.model import SCHEMA_PATH, TrainGeneratorReport
from gleak.runs import train_generator as train_generator_run

from .conftest import CIFAR, CNN, FEDSGD, LENET, MNIST_AUX, ROOT, Result


@pytest.fixture(autouse=True)
def keep_threads():
    """The CLI sets torch's thread count: give it back after each test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run(*args: object) -> Result:
    r = CliRunner().invoke(app, ["train-generator", *(str(a) for a in args)], catch_exceptions=False)
    return Result(r.exit_code, r.stdout, r.stderr)


def aux_subset(folder: Path, indices: range, name: str = "aux.safetensors") -> Path:
    return save_dataset(load_dataset(MNIST_AUX).subset(indices), folder / name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, Result]:
    """One small generator for LeNet (200 images, 2 epochs), shared by the tests that only read it."""
    folder = tmp_path_factory.mktemp("generator")
    aux = aux_subset(folder, range(0, 2000, 10))  # the file is sorted by class
    out = folder / "lenet.safetensors"
    before = torch.get_num_threads()
    try:
        r = run("-M", LENET, "--aux", aux, "-o", out, "--epochs", 2, "--holdout", 0.2, "--device", "cpu",
                "--format", "json", "-v")
    finally:
        torch.set_num_threads(before)
    assert r.exit_code == 0, r.stderr
    return out, aux, json.loads(r.stdout), r


def test_train_records_provenance_and_json_agrees(trained) -> None:
    out, aux, data, r = trained
    gen = load_generator(out)
    lenet = load_model(LENET)
    m = gen.meta
    assert gen.model_sha256 == lenet.weights_sha256 == data["model_sha256"]
    assert gen.layer == data["layer"] == "fc3"
    assert gen.spec.feature_dim == data["feature_dim"] == 84 and m["gleak.feature_dim"] == "84"
    assert list(gen.spec.image_shape) == json.loads(m["gleak.input_shape"]) == data["image_shape"] == [1, 28, 28]
    ds = load_dataset(aux)
    assert gen.mean == pytest.approx(ds.mean) and gen.std == pytest.approx(ds.std)
    assert (list(gen.mean), list(gen.std)) == (data["mean"], data["std"]) and ds.mean == pytest.approx((0.1307,))
    assert m["gleak.aux.sha256"] == data["aux_sha256"] == tensors_sha256({"images": ds.images, "labels": ds.labels})
    assert int(m["gleak.aux.examples"]) == data["examples"]["total"] == 200
    assert (data["examples"]["train"], data["examples"]["heldout"]) == (160, 40)
    assert int(m["gleak.train.epochs"]) == data["settings"]["epochs"] == 2 and m["gleak.train.loss"] == "mse"
    assert json.loads(m["gleak.train.seed"]) == 0 and json.loads(m["gleak.train.holdout"]) == 0.2
    psnr = gen.describe()["heldout_psnr"]
    assert psnr is not None and math.isfinite(psnr) and psnr == data["heldout_psnr"]
    for key in ("train_loss", "heldout_mse"):
        assert float(m[f"gleak.train.{key}"]) == data[key]
    assert data["report"] == "train-generator" and data["file"] == str(out) and data["device"] == "cpu"
    assert data["threads"] >= 1 and data["seconds"] > 0 and len(data["history"]) == 2
    # the JSON is the typed report's, in the shipped schema (the fine-tuning settings only with --loss rgla)
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert TrainGeneratorReport.model_validate(data).to_json() == data and "finetune_epochs" not in data["settings"]
    # -v without a terminal: one plain line per epoch on stderr, no bar
    epochs = [line for line in r.stderr.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"]
    assert "held-out MSE" in epochs[0]
    # the decoder runs: features of the model in, images in [0, 1] of the model's input shape out
    feats = aux_features(lenet.module, find_last_layer(lenet.module, None, lenet.input_shape), ds.subset(range(3)),
                         torch.device("cpu"))
    images = gen.decoder.generate(feats)
    assert images.shape == (3, 1, 28, 28) and float(images.min()) >= 0 and float(images.max()) <= 1


def test_table_summary_and_no_epoch_lines_without_verbose(tmp_path: Path) -> None:
    aux = aux_subset(tmp_path, range(0, 2000, 40))
    r = run("-M", LENET, "--aux", aux, "-o", tmp_path / "g.safetensors", "--epochs", 1, "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    assert "wrote" in r.stdout and "fc3" in r.stdout and "84 features" in r.stdout and "PSNR" in r.stdout
    assert "epoch 1/1" not in r.stderr and r.stderr.strip() == ""


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    per = (a - b).square().flatten(1).mean(1).clamp_min(1e-12)
    return float((-10 * per.log10()).mean())


@pytest.mark.extended
def test_decoder_beats_the_mean_image_on_unseen_images(tmp_path: Path) -> None:
    """Trained on 400 images (every class), the decoder reconstructs 200 images it never saw better than the
    training set's mean image does (the best output of a decoder that ignores its feature)."""
    aux = aux_subset(tmp_path, range(0, 2000, 5))
    out = tmp_path / "g.safetensors"
    r = run("-M", LENET, "--aux", aux, "-o", out, "--epochs", 6, "--batch-size", 32, "--lr", 3e-3,
            "--holdout", 0.1,
            "--device", "cpu", "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["baseline_beaten"] is True and data["heldout_psnr"] > data["baseline_psnr"]
    assert not any("mean image" in note for note in data["notes"])
    full = load_dataset(MNIST_AUX)
    unseen = full.subset(range(2, 2000, 10))  # none of them trained on
    lenet = load_model(LENET)
    layer = find_last_layer(lenet.module, None, lenet.input_shape)
    decoded = load_generator(out).decoder.generate(aux_features(lenet.module, layer, unseen, torch.device("cpu")))
    mean_image = load_dataset(aux).images.mean(0, keepdim=True)
    ours, floor = psnr(decoded, unseen.images), psnr(mean_image.expand_as(unseen.images), unseen.images)
    assert ours > floor + 1.5, (ours, floor)  # measured: 14.6 vs 11.9 dB


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    aux = aux_subset(tmp_path, range(0, 2000, 20))
    files = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        files[name] = tmp_path / f"{name}.safetensors"
        r = run("-M", LENET, "--aux", aux, "-o", files[name], "--epochs", 1, "--seed", seed, "--device", "cpu",
                "-q")
        assert r.exit_code == 0, r.stderr
    a, b, c = (files[k].read_bytes() for k in "abc")
    assert a == b
    assert a != c
    wa, wc = (read_safetensors(files[k])[0] for k in "ac")
    assert not torch.equal(wa["project.weight"], wc["project.weight"])  # the weights differ, not only the seed key


def labels_out_of_range(tmp_path: Path) -> Path:
    ds = load_dataset(MNIST_AUX).subset(range(20))
    ds.labels[3] = 12  # LeNet has 10 classes
    ds.classes = None  # (class names would refuse label 12 before the model does)
    return save_dataset(ds, tmp_path / "bad_labels.safetensors")


REFUSALS = {
    "existing-output": (lambda t: ["--aux", aux_subset(t, range(20))], "already exists; pass --force"),
    "cifar-aux-for-lenet": (lambda t: ["--aux", CIFAR], "has images of [3, 32, 32], the model takes [1, 28, 28]"),
    "capture-as-aux": (lambda t: ["--aux", FEDSGD], "is a capture (gleak.kind=gradient)"),
    "labels-out-of-range": (lambda t: ["--aux", labels_out_of_range(t)], "label 12 is outside the model's classes"),
    "holdout-1": (lambda t: ["--aux", MNIST_AUX, "--holdout", 1], "'--holdout'"),
    "epochs-0": (lambda t: ["--aux", MNIST_AUX, "--epochs", 0], "'--epochs'"),
    "lr-nan": (lambda t: ["--aux", MNIST_AUX, "--lr", "nan"], "'--lr'"),
    "loss-unknown": (lambda t: ["--aux", MNIST_AUX, "--loss", "l1"], "--loss must be one of mse, rgla"),
    "finetune-without-rgla": (lambda t: ["--aux", MNIST_AUX, "--finetune-epochs", 2], "applies to --loss rgla"),
    "missing-aux": (lambda t: ["--aux", t / "nowhere.safetensors"], "no such file"),
    "output-is-aux": (lambda t: ["--aux", aux_subset(t, range(20), "out.safetensors"), "--force"],
                      "is the auxiliary data"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_and_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    make, message = REFUSALS[case]

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a refused run must not get this far")

    # every refusal comes before any training; an output refusal before even the model is read
    for name in ("aux_features", "train_decoder", "save_generator") + (
            ("load_model",) if case in ("existing-output", "output-is-aux") else ()):
        monkeypatch.setattr(train_generator_run, name, never)
    out = tmp_path / "out.safetensors"
    if case == "existing-output":
        out.write_bytes(b"keep me")
    args = make(tmp_path)
    before = out.read_bytes() if out.exists() else None
    r = run("-M", LENET, "-o", out, "--epochs", 1, "--device", "cpu", *args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error:") and message in " ".join(r.stderr.split()), r.stderr
    assert (out.read_bytes() if out.exists() else None) == before  # untouched, or still absent
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".gleak-")) == []


def test_missing_model_is_refused(tmp_path: Path) -> None:
    r = run("-M", tmp_path / "none.safetensors", "--aux", MNIST_AUX, "-o", tmp_path / "g.safetensors")
    assert r.exit_code == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "g.safetensors").exists()


def test_check_fits_binds_the_generator_to_its_model_and_layer(trained) -> None:
    out = trained[0]
    gen = load_generator(out)
    lenet, cnn = load_model(LENET), load_model(CNN)
    assert lenet.weights_sha256 != cnn.weights_sha256
    fits = {"model_sha256": lenet.weights_sha256, "layer": "fc3", "feature_dim": 84, "input_shape": (1, 28, 28)}
    assert check_fits(gen, **fits) == []
    assert check_fits(gen, **fits, mean=(0.1307,), std=(0.3081,)) == []
    with pytest.raises(GleakError, match="trained for another model"):
        check_fits(gen, **{**fits, "model_sha256": cnn.weights_sha256})
    with pytest.raises(GleakError, match="decodes the input of layer 'fc3'.*'fc2'"):
        check_fits(gen, **{**fits, "layer": "fc2"})
    with pytest.raises(GleakError, match="takes 84-value features"):
        check_fits(gen, **{**fits, "feature_dim": 120})
    with pytest.raises(GleakError, match=r"makes images of \[1, 28, 28\]"):
        check_fits(gen, **{**fits, "input_shape": (3, 32, 32)})
    warnings = check_fits(gen, **fits, mean=(0.5,), std=(0.5,))
    assert len(warnings) == 1 and "normalisation" in warnings[0]


def tampered(src: Path, dest: Path, meta: dict[str, str] | None = None,
             tensors: dict[str, torch.Tensor] | None = None) -> Path:
    t, m = read_safetensors(src)
    return save_safetensors(dest, {**t, **(tensors or {})}, {**m, **(meta or {})})


def test_load_generator_refuses_bad_files(trained, tmp_path: Path) -> None:
    out = trained[0]
    t, m = read_safetensors(out)
    spec = json.loads(m["gleak.generator.spec"])
    nan = t["project.weight"].clone()
    nan[0, 0] = float("nan")
    cases = {
        "capture": (FEDSGD, "not a gleak generator .*capture"),
        "spec-feature-dim": (tampered(out, tmp_path / "a.safetensors", {
            "gleak.generator.spec": json.dumps({**spec, "feature_dim": 85}), "gleak.feature_dim": "85"}),
            r"tensor '.*' has shape"),
        "spec-image-shape": (tampered(out, tmp_path / "b.safetensors", {
            "gleak.generator.spec": json.dumps({**spec, "image_shape": [3, 28, 28]})}), "disagrees with its"),
        "header-feature-dim": (tampered(out, tmp_path / "c.safetensors", {"gleak.feature_dim": "12"}),
                               "gleak.feature_dim 12 disagrees"),
        "spec-not-json": (tampered(out, tmp_path / "d.safetensors", {"gleak.generator.spec": "{"}),
                          "invalid gleak.generator.spec"),
        "nan-weight": (tampered(out, tmp_path / "e.safetensors", tensors={"project.weight": nan}),
                       "'project.weight' holds NaN"),
        "short-sha": (tampered(out, tmp_path / "f.safetensors", {"gleak.model.sha256": "abc"}), "64 lower-case hex"),
        "version": (tampered(out, tmp_path / "g.safetensors", {"gleak.generator.version": "9"}),
                    "version '9' is not supported"),
        "std-zero": (tampered(out, tmp_path / "h.safetensors", {"gleak.data.std": "[0]"}), "std must be > 0"),
    }
    for name, (path, message) in cases.items():
        with pytest.raises(GleakError, match=message):
            load_generator(path)
        assert name  # each case raised GleakError (any other exception fails the test)
    missing = {k: v for k, v in t.items() if k != "out.bias"}
    path = save_safetensors(tmp_path / "i.safetensors", missing, m)
    with pytest.raises(GleakError, match="do not match its spec"):
        load_generator(path)


def test_help_and_usage_errors_do_not_import_torch() -> None:
    probe = ("import sys\nfrom gleak.cli import app\ncodes = []\n"
             "for args in (['train-generator', '--help'], ['train-generator', '-M', 'm', '--aux', 'a', '-o', 'g', "
             "'--epochs', '0']):\n"
             "    try:\n        app(args)\n    except SystemExit as e:\n        codes.append(e.code)\n"
             "print(codes, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().splitlines()[-1] == "[0, 2] False", (r.stdout[-500:], r.stderr[-500:])
    assert "--finetune-epochs" in r.stdout and "'--epochs'" in r.stderr
