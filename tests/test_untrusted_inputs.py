"""Untrusted inputs through the CLI, one table row per class of bad input (issue: a fuzz run of 1,162 inputs).

Every row must end the same way: exit 2, exactly one line on stderr that starts with ``error:`` and names what
was wrong, no traceback, no output file left behind, and no marker file from a payload. Inputs are made from
the shipped samples by changing one thing each.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gleak.io import read_safetensors, safetensors_bytes, save_safetensors
from gleak.models import build_zoo_model, save_model

from .conftest import FEDAVG, FEDSGD, LENET, MNIST_AUX, MNIST_CLIENT, SAMPLES

SMOOTHING = SAMPLES / "captures/smoothing_1.safetensors"
CIFAR_CAPTURE = SAMPLES / "captures/cifar10_b8.safetensors"


def assert_refused(result, *fragments: str, out: Path | None = None, marker: Path | None = None) -> None:
    """Exit 2, one ``error:`` line naming ``fragments``, no traceback, nothing written under ``out``."""
    assert result.exit_code == 2, (result.exit_code, result.stdout[-500:], result.stderr[-500:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert len(lines[0]) < 800, len(lines[0])
    assert "Traceback" not in result.stdout + result.stderr
    assert "internal error" not in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    if out is not None:
        left = sorted(p.name for p in out.rglob("*")) if out.exists() else []
        assert left == [], left
    if marker is not None:
        assert not marker.exists(), "a payload ran"


def edited(src: Path, dst: Path, meta: dict[str, str | None] | None = None,
           tensors: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None) -> Path:
    """A copy of a safetensors file with metadata keys set (None deletes) and tensors changed."""
    t, m = read_safetensors(src)
    for key, value in (meta or {}).items():
        if value is None:
            m.pop(key, None)
        else:
            m[key] = value
    if tensors is not None:
        t = tensors(t)
    dst.write_bytes(safetensors_bytes(t, m))
    return dst


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Path]:
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    return {"in": inp, "out": out, "marker": tmp_path / "MARKER"}


# ------------------------------------------------------------------------------------------------- 1. payloads

@pytest.mark.parametrize("factory", ["subprocess:run", "os:system", "builtins:exec", "gleak.io:write_text_atomic"])
def test_model_metadata_cannot_name_an_importable_factory(gleak, env, factory) -> None:
    marker = env["marker"]
    kwargs = {"subprocess:run": {"args": ["touch", str(marker)]}, "os:system": {"command": f"touch {marker}"},
              "builtins:exec": {"source": f"open({str(marker)!r}, 'w')"},
              "gleak.io:write_text_atomic": {"path": str(marker), "text": "x"}}[factory]
    model = env["in"] / "evil.safetensors"
    edited(LENET, model, {"gleak.arch": factory, "gleak.arch_kwargs": json.dumps(kwargs)})
    for command in (["inspect", FEDSGD, "--model", model], ["labels", FEDSGD, "--model", model],
                    ["simulate", "--model", model, "--data", MNIST_CLIENT, "-o", env["out"] / "c.safetensors"]):
        assert_refused(gleak(*command), "gleak.arch", "zoo model or torchvision", out=env["out"], marker=marker)


def test_arch_named_on_the_command_line_is_still_allowed(gleak, env) -> None:
    # the user, not the file, names the factory: gleak's own zoo builder reached as module:factory
    model = env["in"] / "m.safetensors"
    edited(LENET, model, {"gleak.arch": "subprocess:run"})
    r = gleak("inspect", FEDSGD, "--model", model, "--arch", "gleak.models.zoo:build_zoo_model",
              "--arch-kwargs", '{"name": "lenet"}', "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["model"]["matches_capture"] is True


# ------------------------------------------------------------------------------------------- 3. wrong weights

def test_other_weights_of_the_same_arch_are_refused_unless_overridden(gleak, env) -> None:
    torch.manual_seed(123)
    other = env["in"] / "other.safetensors"
    save_model(build_zoo_model("lenet"), other, "lenet")
    out = env["out"] / "labels.json"
    for command in ("inspect", "labels"):
        args = [command, FEDSGD, "--model", other] + (["-o", out] if command == "labels" else [])
        assert_refused(gleak(*args), "not the ones the capture was made with", "--allow-model-mismatch",
                       out=env["out"])
    r = gleak("labels", FEDSGD, "--model", other, "-a", "llg", "--allow-model-mismatch", "-o", out)
    assert r.exit_code == 0, r.stderr
    check = json.loads(out.read_text())["model_check"]
    assert check["status"] == "mismatch_allowed" and check["recorded_sha256"] != check["model_sha256"]
    ok = json.loads(gleak("labels", FEDSGD, "--model", LENET, "-a", "llg", "--format", "json").stdout)
    assert ok["model_check"]["status"] == "match"


def test_zero_model_hash_is_checked(gleak, env) -> None:
    cap = edited(FEDSGD, env["in"] / "c.safetensors", {"gleak.model.sha256": "0" * 64})
    assert_refused(gleak("labels", cap, "--model", LENET, "--no-truth"), "gleak.model.sha256 000000000000")
    bad = edited(FEDSGD, env["in"] / "d.safetensors", {"gleak.model.sha256": "xyz"})
    assert_refused(gleak("inspect", bad), "gleak.model.sha256", "64 lower-case hex digits")


def test_num_classes_is_checked_against_the_model(gleak, env) -> None:
    """A capture that says C = 100 for a 10-class model used to run silently."""
    cap = edited(FEDSGD, env["in"] / "c.safetensors", {"gleak.num_classes": "100"})
    for command in ("labels", "inspect"):
        assert_refused(gleak(command, cap, "--model", LENET), "gleak.num_classes = 100", "10 outputs")
    ok = edited(FEDSGD, env["in"] / "d.safetensors", {"gleak.num_classes": "10"})
    assert gleak("labels", ok, "--model", LENET, "-a", "llg").exit_code == 0


# ------------------------------------------------------------------ 4. values the schema reads but the code cannot use

def _aux_with_label(label: int):
    def change(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        labels = t["labels"].clone()
        labels[0] = label
        return {**t, "labels": labels}
    return change


@pytest.mark.parametrize("label, fragment", [(10, "label 10"), (100, "label 100"), (-1, "non-negative"),
                                             (2**40, "label 1099511627776")])
def test_aux_labels_out_of_range(gleak, env, label, fragment) -> None:
    aux = edited(MNIST_AUX, env["in"] / "aux.safetensors", tensors=_aux_with_label(label))
    assert_refused(gleak("labels", FEDSGD, "--model", LENET, "--aux", aux), fragment)
    assert_refused(gleak("simulate", "--model", LENET, "--data", aux, "-o", env["out"] / "c.safetensors"), fragment,
                   out=env["out"])


@pytest.mark.parametrize("labels, fragment", [
    (lambda n: torch.full((n,), 10, dtype=torch.long), "label 10 is outside"),
    (lambda n: torch.full((n,), -1, dtype=torch.long), "label -1 is outside"),
    (lambda n: torch.full((n,), 2**40, dtype=torch.long), "label 1099511627776 is outside"),
    (lambda n: torch.full((n, 5), 0.2), "5 columns"),
    (lambda n: torch.full((n, 10), 0.5), "sum to 1"),
])
def test_truth_labels_that_do_not_fit_the_model(gleak, env, labels, fragment) -> None:
    cap = env["in"] / "c.safetensors"
    cap.write_bytes(FEDSGD.read_bytes())
    truth_src = SAMPLES / "captures/fedsgd_b32.truth.safetensors"
    edited(truth_src, env["in"] / "c.truth.safetensors", tensors=lambda t: {**t, "labels": labels(32)})
    assert_refused(gleak("labels", cap, "--model", LENET, "-o", env["out"] / "l.json"), fragment, out=env["out"])


@pytest.mark.parametrize("report, fragment", [
    ({"results": [{"status": "ok", "attack": "x", "counts": ["1"] * 10}]}, "list of integers"),
    ({"results": [{"status": "ok", "attack": "x", "counts": [1] * 5}]}, "5 class counts"),
    ({"results": [{"status": "ok", "attack": "x", "counts": [2**40] + [0] * 9}]}, "sum to B = 1"),
    ({"results": [{"status": "ok", "attack": "x", "counts": [-1, 2] + [0] * 8}]}, "≥ 0"),
    ({"results": [{"status": "ok", "attack": "x", "counts": [1] + [0] * 9, "soft_label": [0.5] * 3}]}, "soft_label"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("{" + "x" * 1_000_000, "not a JSON labels report"),
])
def test_labels_report_files(gleak, env, report, fragment) -> None:
    path = env["in"] / "labels.json"
    path.write_text(report if isinstance(report, str) else json.dumps(report))
    r = gleak("reconstruct", SMOOTHING, "--model", LENET, "--labels", path, "-o", env["out"])
    assert_refused(r, fragment, out=env["out"])


@pytest.mark.parametrize("key, value, fragment", [
    ("gleak.input_shape", "[0,28,28]", "> 0"),
    ("gleak.input_shape", "[-1,28,28]", "> 0"),
    ("gleak.input_shape", "[1,100000,100000]", "values per example"),
    ("gleak.input_shape", "[3,32,32]", "cannot run on the capture's gleak.input_shape [3, 32, 32]"),
    ("gleak.batch_size", "1000000000", "≤ 65536"),
    ("gleak.batch_size", "100000000000000000000000", "≤ 65536"),
    ("gleak.batch_size", "1e23", "an integer"),
    ("gleak.local_steps", "1000000000", "≤ 100000"),
    ("gleak.data.std", "[NaN]", "gleak.data.std"),
    ("gleak.data.std", "[0]", "> 0"),
    ("gleak.data.std", "[-1]", "> 0"),
    ("gleak.temperature", "0", "> 0"),
    ("gleak.label_smoothing", "1.5", "≤ 0.999999"),
    ("gleak.mixup", "[" * 100_000 + "]" * 100_000, "gleak.mixup"),
    ("gleak.fl.history", "[0.1, 0.2]", "one history term per bias entry"),
])
def test_capture_metadata_out_of_range(gleak, env, key, value, fragment) -> None:
    cap = edited(FEDSGD, env["in"] / "c.safetensors", {key: value})
    assert_refused(gleak("labels", cap, "--model", LENET, "--no-truth", "-o", env["out"] / "l.json"), key, fragment,
                   out=env["out"])


def test_empty_data_and_oversized_batches(gleak, env) -> None:
    empty = edited(MNIST_AUX, env["in"] / "empty.safetensors",
                   tensors=lambda t: {"images": t["images"][:0], "labels": t["labels"][:0]})
    out = env["out"] / "c.safetensors"
    assert_refused(gleak("labels", FEDSGD, "--model", LENET, "--aux", empty), "no examples")
    assert_refused(gleak("simulate", "--model", LENET, "--data", empty, "-o", out), "no examples", out=env["out"])
    assert_refused(gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-b", "100000", "-o", out),
                   "--batch-size", "65536", out=env["out"])
    assert_refused(gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-b", "60000", "-o", out),
                   "the data has 3000", out=env["out"])
    assert_refused(gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-b", "3000", "-m", "1000", "-o", out),
                   "input values", out=env["out"])


def test_fc_layer_must_produce_the_logits(gleak) -> None:
    assert_refused(gleak("labels", FEDSGD, "--model", LENET, "--fc-layer", "fc1"), "fc1", "logits", "'fc3.weight'")
    assert gleak("labels", FEDSGD, "--model", LENET, "--fc-layer", "fc3", "-a", "llg").exit_code == 0


NUMERIC = [
    (["simulate"], "--lr", ["-1", "nan", "inf", "0"]),
    (["simulate"], "--momentum", ["-1", "nan", "1"]),
    (["simulate"], "--mu", ["-1", "nan"]),
    (["simulate"], "--dirichlet-alpha", ["nan", "0"]),
    (["simulate"], "--temperature", ["inf", "0"]),
    (["simulate"], "--focal-gamma", ["nan"]),
    (["simulate"], "--seed", [str(2**64), "-1"]),
    (["labels"], "--temperature", ["inf", "nan"]),
    (["labels"], "--focal-gamma", ["nan", "-1"]),
    (["labels"], "--label-smoothing", ["1", "nan"]),
    (["labels"], "--seed", [str(2**64)]),
    (["reconstruct"], "--lr", ["-1", "nan", "0"]),
    (["reconstruct"], "--tv", ["nan", "-1"]),
    (["reconstruct"], "--beta", ["nan"]),
    (["reconstruct"], "--iterations", ["0"]),
    (["reconstruct"], "--restarts", ["0"]),
]


@pytest.mark.parametrize("command, option, values", NUMERIC, ids=[f"{c[0]}{o}" for c, o, _ in NUMERIC])
def test_numeric_options_are_range_checked(gleak, env, command, option, values) -> None:
    base = {"simulate": ["simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", env["out"] / "c.safetensors"],
            "labels": ["labels", FEDSGD, "--model", LENET, "-o", env["out"] / "l.json"],
            "reconstruct": ["reconstruct", SMOOTHING, "--model", LENET, "-o", env["out"] / "r"]}[command[0]]
    for value in values:
        assert_refused(gleak(*base, option, value), option, "must be a finite number", out=env["out"])


@pytest.mark.parametrize("args, fragment", [
    (["--momentum", "0.5"], "--momentum applies to --optimizer sgdm or nag"),
    (["--mu", "0.5"], "--mu applies to --scheme fedprox"),
    (["--focal-gamma", "1"], "--focal-gamma/--focal-alpha apply to --loss focal"),
    (["--mixup-ratio", "0.3"], "--mixup-ratio applies with --mixup"),
    (["--dirichlet-alpha", "0.3"], "--dirichlet-alpha applies to --composition dirichlet"),
])
def test_simulate_options_that_do_not_apply_are_refused(gleak, env, args, fragment) -> None:
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", env["out"] / "c.safetensors", *args)
    assert_refused(r, fragment, out=env["out"])


def test_options_that_do_not_apply_are_reported_as_ignored(gleak, env) -> None:
    r = gleak("labels", FEDSGD, "--model", LENET, "-a", "llg", "--augmentation", "mixup", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["ignored_options"] == ["--augmentation: only softlabel uses it, and softlabel did not "
                                                       "run"]
    assert_refused(gleak("labels", FEDSGD, "--model", LENET, "--augmentation", "bogus"), "--augmentation", "bogus")


@pytest.mark.parametrize("where", ["--arch-kwargs", "metadata"])
def test_deeply_nested_json(gleak, env, where) -> None:
    nested = '{"a":' * 50_000 + "1" + "}" * 50_000
    if where == "--arch-kwargs":
        r = gleak("inspect", FEDSGD, "--model", LENET, "--arch", "lenet", "--arch-kwargs", nested)
        assert_refused(r, "arch kwargs")
    else:
        model = edited(LENET, env["in"] / "m.safetensors", {"gleak.arch_kwargs": nested})
        assert_refused(gleak("inspect", FEDSGD, "--model", model), "gleak.arch_kwargs")


def test_long_values_are_cut_in_messages(gleak, env) -> None:
    huge = "x" * 1_000_000
    for args in (["labels", FEDSGD, "--model", LENET, "-a", huge],
                 ["labels", FEDSGD, "--model", LENET, "--loss", huge],
                 ["inspect", FEDSGD, "--model", LENET, "--arch-kwargs", huge],
                 ["inspect", env["in"] / ("y" * 300)]):
        r = gleak(*args)
        assert r.exit_code == 2 and len(r.stderr) < 800 and r.stderr.count("\n") == 1, (len(r.stderr), r.stderr[:200])


def test_bad_output_places(gleak, env) -> None:
    blocker = env["in"] / "a_file"
    blocker.write_text("x")
    long_name = env["out"] / ("n" * 300 + ".json")
    for out, fragment in ((blocker / "labels.json", "not a folder"), (long_name, "longer than the file system allows"),
                          (Path("/proc/gleak-test/labels.json"), "cannot write")):
        assert_refused(gleak("labels", FEDSGD, "--model", LENET, "-a", "llg", "-o", out), fragment)
    assert_refused(gleak("reconstruct", SMOOTHING, "--model", LENET, "-o", blocker / "r"), "not a folder")
    assert_refused(gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", blocker / "c.safetensors"),
                   "not a folder")
    assert blocker.read_text() == "x" and not env["out"].exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")
@pytest.mark.parametrize("role", ["capture", "model", "aux", "truth", "labels"])
def test_named_pipes_are_refused_without_blocking(gleak, env, role) -> None:
    fifo = env["in"] / ("pipe.json" if role == "labels" else "pipe.safetensors")
    os.mkfifo(fifo)
    args = {"capture": ["labels", fifo, "--model", LENET],
            "model": ["labels", FEDSGD, "--model", fifo],
            "aux": ["labels", FEDSGD, "--model", LENET, "--aux", fifo],
            "truth": ["labels", FEDSGD, "--model", LENET, "--truth", fifo],
            "labels": ["reconstruct", SMOOTHING, "--model", LENET, "--labels", fifo, "-o", env["out"]]}[role]
    assert_refused(gleak(*args), "not a regular file", out=env["out"])


def test_failed_reconstruction_leaves_nothing(gleak, env, monkeypatch) -> None:
    import gleak.runs.reconstruct as run

    def broken(*_args, **_kwargs):
        raise run.GleakError("disk full (simulated)")

    monkeypatch.setattr(run, "safetensors_bytes", broken)  # fails after the PNGs were staged
    r = gleak("reconstruct", SMOOTHING, "--model", LENET, "-a", "fcn", "-o", env["out"] / "deep" / "r")
    assert r.exit_code == 2
    r = gleak("reconstruct", SMOOTHING, "--model", LENET, "-n", "2", "-o", env["out"] / "deep" / "r")
    assert_refused(r, "disk full", out=env["out"])
    assert not env["out"].exists()


def test_failed_simulation_leaves_neither_file(gleak, env, monkeypatch) -> None:
    import gleak.runs.simulate as run

    def broken(*_args, **_kwargs):
        raise run.GleakError("disk full (simulated)")

    monkeypatch.setattr(run, "save_truth", broken)  # the capture is already staged when the truth fails
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", env["out"] / "c.safetensors")
    assert_refused(r, "disk full", out=env["out"])


# ------------------------------------------------------------------------------------------ 5. one line on stderr

@pytest.mark.parametrize("args", [
    ["labels"], ["labels", FEDSGD, "--nope"], ["inspect", FEDSGD, "--format"], ["simulate", "--model", LENET],
    ["reconstruct", SMOOTHING, "--model", LENET], ["labels", FEDSGD, "--batch-size", "many"], ["nonsense"],
])
def test_usage_errors_are_one_line(gleak, args) -> None:
    r = gleak(*args)
    assert_refused(r)
    assert "--help" in r.stderr


def test_gleak_without_arguments_prints_help(gleak) -> None:
    r = gleak()
    assert r.exit_code == 0 and "Usage" in r.stdout and "inspect" in r.stdout


def test_subprocess_run_is_one_line_too(tmp_path: Path) -> None:
    """The installed entry point (not only the in-process runner) prints one line for a Click error."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "gleak", "labels", str(FEDAVG), "--no-such-option"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error:"), r.stderr


def test_valid_inputs_still_work(gleak, env) -> None:
    out = env["out"] / "c.safetensors"
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-b", "4", "--optimizer", "sgdm", "--momentum",
              "0.5", "-m", "2", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in env["out"].iterdir()) == ["c.safetensors", "c.truth.safetensors"]
    r = gleak("labels", out, "--model", LENET, "--aux", MNIST_AUX, "-a", "rlu", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["scores"]["iacc"] == 1.0
    assert gleak("inspect", CIFAR_CAPTURE).exit_code == 0
    save_safetensors(env["in"] / "x.safetensors", {"a": torch.zeros(1)})  # keeps the writer import honest


def test_files_in_the_wrong_place(gleak) -> None:
    """Common mix-ups: a capture, truth or data file given as the model, a model or truth file as the capture."""
    truth = SAMPLES / "captures/fedsgd_b32.truth.safetensors"
    assert_refused(gleak("labels", FEDSGD, "--model", FEDSGD), "gleak gradient file", "not a model")
    assert_refused(gleak("labels", FEDSGD, "--model", truth), "gleak truth file", "not a model")
    assert_refused(gleak("labels", FEDSGD, "--model", MNIST_AUX), "data set", "not a model")
    assert_refused(gleak("labels", truth, "--model", LENET), "ground-truth file", "not a capture")
    assert_refused(gleak("labels", LENET, "--model", LENET), "gleak.kind", "not a gleak capture")


def test_long_local_runs_stay_bounded(gleak, env) -> None:
    """gleak.local_steps at the schema's bound (100,000) used to make rlu's posterior search simulate every step
    (hours); it now simulates at most 100 macro-steps."""
    cap = edited(FEDAVG, env["in"] / "long.safetensors", {"gleak.local_steps": "100000", "gleak.num_examples": None})
    r = gleak("labels", cap, "--model", LENET, "--aux", MNIST_AUX, "-a", "rlu", "--no-truth", "--format", "json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)["results"][0]
    assert result["status"] == "ok" and result["diagnostics"]["simulated_steps"] == 100
    assert sum(result["counts"]) == 100_000 * 32


def test_divergent_optimizer_settings_are_not_applicable(gleak, env) -> None:
    """Found by fuzzing every metadata key: gleak.weight_decay = 1e308 overflowed inside rlu (exit 3)."""
    cap = edited(FEDAVG, env["in"] / "wd.safetensors", {"gleak.weight_decay": "1e308"})
    r = gleak("labels", cap, "--model", LENET, "--aux", MNIST_AUX, "-a", "rlu", "--no-truth", "--format", "json")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "≥ 1" in json.loads(r.stdout)["results"][0]["reason"]


# ------------------------------------------------------------------------- 6. paths the OS refuses (issue 28)

FEDSGD_B8 = SAMPLES / "captures/fedsgd_b8.safetensors"
ROLES = ["capture", "model", "aux"]
COMMANDS = ["audit", "labels", "inspect", "reconstruct"]


def _args(command: str, role: str, bad: Path, out: Path) -> list[object]:
    """``command`` with ``bad`` as its capture, --model or --aux (every other input a shipped sample)."""
    capture = bad if role == "capture" else FEDSGD_B8
    model = bad if role == "model" else LENET
    args: list[object] = [command, capture, "--model", model]
    if role == "aux":
        args += ["--aux", bad]
    if command == "reconstruct":
        args += ["-o", out / "r"]
    return args


CASES = [(c, r) for c in COMMANDS for r in ROLES if r != "aux" or c in ("audit", "labels")]


@pytest.mark.parametrize("command, role", CASES, ids=[f"{c}-{r}" for c, r in CASES])
def test_file_names_longer_than_the_system_allows(gleak, env, command, role) -> None:
    """A 300-character file name: stat() fails with ENAMETOOLONG (Path.exists() and is_dir() raise it too), which
    used to end in exit 3 ("internal error: OSError File name too long") for audit and for --aux."""
    bad = env["in"] / ("x" * 300 + ".safetensors")
    r = gleak(*_args(command, role, bad, env["out"]))
    assert_refused(r, "cannot read", "characters)", out=env["out"])  # the path named, shortened


@pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32", reason="needs POSIX symbolic links")
@pytest.mark.parametrize("command, role", [("audit", "capture"), ("audit", "model"), ("audit", "aux"),
                                           ("labels", "aux"), ("labels", "model")])
def test_symlink_loops_are_named(gleak, env, command, role) -> None:
    """ELOOP: a link to itself is reported as unreadable (not "no such file", not exit 3)."""
    loop = env["in"] / "loop.safetensors"
    loop.symlink_to(loop)
    assert_refused(gleak(*_args(command, role, loop, env["out"])), "cannot read", str(loop), out=env["out"])


@pytest.mark.parametrize("command", ["inspect", "labels", "audit"])
def test_capture_named_near_the_length_limit(gleak, env, command) -> None:
    """A capture whose own name fits but whose truth companion (NAME.truth.safetensors) would not: the companion
    is simply absent (looking it up raised ENAMETOOLONG: exit 3)."""
    capture = env["in"] / ("c" * 240 + ".safetensors")
    capture.write_bytes(FEDSGD_B8.read_bytes())
    args = [command, capture, "--model", LENET] + (["--fail-on", "none"] if command == "audit" else [])
    r = gleak(*args)
    assert r.exit_code == 0, r.stderr


def _whole_module(path: Path, how: str) -> Path:
    module = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    if how == "torch.save":
        torch.save(module, path)
    elif how == "torch.save-protocol-4":
        torch.save(module, path, pickle_protocol=4)
    elif how == "torch.save-legacy":
        torch.save(module, path, _use_new_zipfile_serialization=False)
    else:  # a plain pickle: torch's safe unpickler cannot read protocol 4+, and warned about it
        import pickle

        with path.open("wb") as f:
            pickle.dump(module, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


PICKLES = ["torch.save", "torch.save-protocol-4", "torch.save-legacy", "pickle.dump"]


@pytest.mark.parametrize("how", PICKLES)
@pytest.mark.parametrize("command", ["labels", "audit"])
def test_whole_module_pickles_are_refused_in_one_line(gleak, env, how, command) -> None:
    """Without --trust-pickle a pickled nn.Module is refused in one line, with no torch warning printed (a
    pickle.dump used to print torch's UserWarning and its multi-line UnpicklingError)."""
    import warnings

    model = _whole_module(env["in"] / "m.pt", how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = gleak(command, FEDSGD_B8, "--model", model)
    assert_refused(r, "m.pt", "pickled model", "--trust-pickle", "torch.nn.modules.container.Sequential")
    assert "Warning" not in r.stderr + r.stdout
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []


def test_pickled_state_dicts_torch_cannot_read_safely(gleak, env) -> None:
    """A state dict saved with pickle protocol 4 names no code, but torch's safe loader cannot read it: one line
    that says so (not "pickled model"), and a damaged pickle is called damaged."""
    state = torch.nn.Linear(784, 10).state_dict()
    torch.save(state, env["in"] / "sd.pt", pickle_protocol=4)
    assert_refused(gleak("labels", FEDSGD_B8, "--model", env["in"] / "sd.pt"), "protocol 4", "--trust-pickle")
    (env["in"] / "junk.pt").write_bytes(b"\x80\x02" + bytes(range(1, 200)))
    assert_refused(gleak("labels", FEDSGD_B8, "--model", env["in"] / "junk.pt"), "not a readable PyTorch file")


@pytest.mark.parametrize("how", PICKLES)
def test_trusted_whole_module_pickles_load(env, how) -> None:
    """--trust-pickle, which the refusal suggests, loads each of them (a plain pickle with pickle.load: torch.load
    would run it and then reject it for lacking torch's magic number)."""
    from gleak.models import load_model

    loaded = load_model(_whole_module(env["in"] / "m.pt", how), trust_pickle=True)
    assert isinstance(loaded.module, torch.nn.Sequential) and "pickled" in loaded.source
