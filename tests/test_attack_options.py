"""Per-attack typed options: defaults, -O ATTACK.KEY=VALUE through the CLI, validation, and the reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from gleak.attacks import REGISTRY, get_attack
from gleak.attacks.base import RunInputs
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import parse_option_assignments, resolve_assignments
from gleak.errors import GleakError
from gleak.registry import describe_options, resolve_options

from .conftest import FEDSGD, LENET, MNIST_AUX, ROOT

SMOOTHING = ROOT / "samples/captures/smoothing_1.safetensors"

# the module constants the options replaced, with their values before options existed
OLD_DEFAULTS = {
    # issue 44: min_gap (10) no longer decides by default (None: the widest ρ gap always does); first_block is new;
    # relative 0: any non-zero row (1e-6 missed an input seen once at a confident position)
    "token-bag": {"method": "auto", "relative": 0.0, "exclude": None, "min_gap": None, "rho_threshold": None,
                  "first_block": True},
    "next-tokens": {"exclude": None, "min_gap": None},
    "seq-length": {"relative": 0.0},
    "lora-tokens": {"min_gap": 100.0},
    "sparse-tokens": {"max_atoms": None, "cliff": 0.1},
    "dager": {"min_gap": 100.0, "span_gap": 10.0, "max_combinations": 20_000},
    "tag": {"iterations": 500, "lr": 0.1, "restarts": 1, "tag_factor": 0.01, "distance": "l1l2",
            "bag_restricted": True, "lengths": "max", "temperature": 0.1},
    "calibrated": {"simulations": 24, "stack": True},
    "rlu": {"mc_samples": 2000, "search_iterations": 5, "max_simulated_steps": 100, "gls_max_classes": 20,
            "gls_ridge": 0.1, "candidates": None},
    "llg-star": {"repeats": 10},
    "llg-plus": {"repeats": 10},
    "zlg": {"dummy_samples": 256},
    "softlabel": {"augmentation": "auto", "lbfgs_steps": 100, "pso_particles": 500, "pso_iterations": 40,
                  "noise_particles": 200, "noise_iterations": 30},
    "dlg": {"iterations": 300, "restarts": 1, "lr": 1.0, "tv": 0.0},
    "ig": {"iterations": 4800, "restarts": 1, "lr": 0.1, "tv": 0.01, "signed": False},
    "feature": {"iterations": 300, "restarts": 1, "lr": 1.0, "tv": 0.01, "distance": "l2", "beta": 2.0,
                "signed": False},
    # the paper's Adam settings (iterations, lr, alphas) and gleak's LM solver (docs/methods/generative.md#rgla)
    "rgla": {"solver": "lm", "restarts": 2, "all_starts": False, "evaluations": 500, "loss_weight": 1.0,
             "iterations": 20000, "lr": 1e-3, "alpha_w": 1e4, "alpha_b": 1.0, "alpha_loss": 100.0},
}


@pytest.fixture(autouse=True)
def keep_threads():
    """The CLI sets torch's thread count: give it back after each test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def assert_refused(result, *fragments: str) -> None:
    """Exit 2 with exactly one ``error:`` line that names every fragment."""
    assert result.exit_code == 2, (result.exit_code, result.stdout[-500:], result.stderr[-500:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# ------------------------------------------------------------------------------------------------ defaults
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_defaults_equal_the_old_constants(name: str) -> None:
    attack = get_attack(name)
    assert attack.used_options().model_dump() == OLD_DEFAULTS.get(name, {})
    assert issubclass(attack.Options, AttackOptions)


def test_module_constants_are_the_defaults() -> None:
    from gleak.attacks.labels import llg, rlu, softlabel, zlg

    o = rlu.RLUOptions()
    assert (o.mc_samples, o.search_iterations, o.max_simulated_steps, o.gls_max_classes, o.gls_ridge) == (
        rlu.MC_SAMPLES, rlu.SEARCH_ITERATIONS, rlu.MAX_SIMULATED_STEPS, rlu.GLS_MAX_CLASSES, rlu.GLS_RIDGE)
    assert llg.LLGEstimateOptions().repeats == llg.REPEATS and zlg.ZLGOptions().dummy_samples == zlg.DUMMY_SAMPLES
    s = softlabel.SoftLabelOptions()
    assert (s.lbfgs_steps, s.pso_particles, s.pso_iterations, s.noise_particles, s.noise_iterations) == (
        softlabel.STEPS_PER_SIDE, softlabel.PSO_PARTICLES, softlabel.PSO_ITERS, softlabel.NOISE_PARTICLES,
        softlabel.NOISE_ITERS)


def test_feature_iterations_and_lr_follow_the_distance() -> None:
    attack = get_attack("feature")
    attack.configure({"distance": "cosine"})
    used = attack.used_options().model_dump()
    assert (used["iterations"], used["lr"]) == (4800, 0.1)
    attack.configure({"distance": "cosine", "iterations": "7", "lr": "0.5"})
    assert attack.used_options().model_dump()["iterations"] == 7 and attack.used_options().model_dump()["lr"] == 0.5


# ------------------------------------------------------------------------------------------------ the API
def test_options_are_frozen_and_strings_are_converted() -> None:
    attack = get_attack("rlu")
    opts = attack.configure({"mc_samples": "50", "gls_ridge": "1e-2"})
    assert opts.model_dump()["mc_samples"] == 50 and attack.options.gls_ridge == 0.01
    with pytest.raises(ValidationError):
        attack.options.mc_samples = 7
    assert get_attack("rlu").options.mc_samples == 2000  # a fresh instance has the defaults


def test_parse_option_assignments() -> None:
    assert parse_option_assignments(["rlu.mc-samples=50", "ig.lr = 0.5", "llg-star.repeats=3", "x.y=a=b"]) == {
        "rlu": {"mc_samples": "50"}, "ig": {"lr": "0.5"}, "llg-star": {"repeats": "3"}, "x": {"y": "a=b"}}
    assert parse_option_assignments(["rlu.mc_samples=5", "rlu.mc_samples=5"]) == {"rlu": {"mc_samples": "5"}}
    for bad in ("rlu", "rlu=5", ".k=1", "rlu.=1", "rlu.k"):
        with pytest.raises(GleakError, match="ATTACK.KEY=VALUE"):
            parse_option_assignments([bad])
    with pytest.raises(GleakError, match="twice"):
        parse_option_assignments(["rlu.mc_samples=5", "rlu.mc_samples=6"])


@pytest.mark.parametrize(("assignments", "task", "fragments"), [
    ({"rlux": {"mc_samples": "5"}}, "labels", ["unknown attack 'rlux'", "did you mean 'rlu'"]),
    ({"ig": {"iterations": "3"}}, "labels", ["'ig' is a reconstruction attack"]),
    ({"rlu": {"mc": "5"}}, None, ["-O rlu.mc:", "mc_samples, search_iterations"]),
    ({"rlu": {"mc_sample": "5"}}, None, ["did you mean 'mc_samples'"]),
    ({"idlg": {"x": "1"}}, None, ["it takes no options"]),
    ({"rlu": {"mc_samples": "5"}}, None, ["-O rlu.mc_samples:", "greater than or equal to 10", "'5'"]),
    ({"rlu": {"mc_samples": "abc"}}, None, ["valid integer", "'abc'"]),
    ({"ig": {"lr": "0"}}, None, ["-O ig.lr:", "greater than 0"]),
    ({"ig": {"lr": "nan"}}, None, ["finite"]),
    ({"ig": {"signed": "maybe"}}, None, ["boolean"]),
    ({"softlabel": {"augmentation": "bogus"}}, None, ["'auto', 'smoothing' or 'mixup'", "'bogus'"]),
    ({"rlu": {"mc_samples": "9" * 5000}}, None, ["-O rlu.mc_samples:"]),
])
def test_resolve_errors_are_one_line(assignments, task, fragments) -> None:
    with pytest.raises(GleakError) as e:
        resolve_assignments(assignments, task)
    message = str(e.value)
    assert "\n" not in message and len(message) < 400, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_sources_name_the_flag() -> None:
    with pytest.raises(GleakError, match="^--lr: Input should be greater than 0"):
        resolve_options(REGISTRY["dlg"], {"lr": 0}, {"lr": "--lr"})


def test_describe_options() -> None:
    rows = {o["name"]: o for o in describe_options(REGISTRY["rlu"])}
    assert rows["mc_samples"]["type"] == "int" and rows["mc_samples"]["default"] == 2000
    assert "Monte Carlo" in rows["mc_samples"]["help"] and rows["mc_samples"]["range"] == "≥ 10, ≤ 1000000"
    soft = {o["name"]: o for o in describe_options(REGISTRY["softlabel"])}
    assert soft["augmentation"]["type"] == "auto|smoothing|mixup"
    assert describe_options(REGISTRY["idlg"]) == []


def test_one_options_path_for_every_attack() -> None:
    """Options are frozen and change only through configure (flags, -O, the audit's budgets); run inputs are an
    argument of the run, never options."""
    for name in REGISTRY:
        attack = get_attack(name)
        assert isinstance(attack.options, AttackOptions) and attack.options.model_config.get("frozen")
        assert not {"targets", "feature", "progress", "generator"} & set(type(attack.options).model_fields), name
    attack = get_attack("ig")
    assert attack.used_options().model_dump()["iterations"] == 4800
    with pytest.raises(ValidationError):
        attack.options.iterations = 3  # type: ignore[misc]  # frozen: only configure sets options
    attack.configure({"iterations": 3})
    assert attack.used_options().model_dump() == {**OLD_DEFAULTS["ig"], "iterations": 3}
    with pytest.raises(GleakError, match="ig has no option 'distance'"):
        attack.configure({"distance": "l2"})  # not an option of ig: refused, not silently unused
    with pytest.raises(GleakError, match="greater than 0"):
        attack.configure({"lr": 0})  # used to mean "the default" silently
    with pytest.raises(GleakError):
        attack.configure({"iterations": 0})
    attack.configure({"lr": "0.5"})
    assert attack.used_options().model_dump()["lr"] == 0.5
    inputs = RunInputs(targets=torch.zeros(1, 10))
    assert inputs.targets is not None and attack.used_options() == attack.configure({"lr": "0.5"}).model_copy(
        update={"iterations": 4800})
    soft = get_attack("softlabel")
    soft.configure({"pso_particles": 20, "augmentation": "mixup"})
    assert soft.options.augmentation == "mixup" and soft.options.pso_particles == 20  # type: ignore[attr-defined]
    with pytest.raises(GleakError):
        soft.configure({"augmentation": "bogus"})


# ------------------------------------------------------------------------------------------------ the CLI
def test_labels_option_reaches_the_attack_and_the_report(gleak, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = gleak("labels", FEDSGD, "-M", LENET, "--aux", MNIST_AUX, "-a", "rlu", "-a", "llg-star",
              "-O", "rlu.mc_samples=50", "-O", "llg-star.repeats=2", "-O", "zlg.dummy_samples=8",
              "--format", "json", "-o", out)
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert json.loads(out.read_text())["results"] == data["results"]
    by = {x["attack"]: x for x in data["results"]}
    assert by["rlu"]["status"] == "ok" and by["rlu"]["options"] == {**OLD_DEFAULTS["rlu"], "mc_samples": 50}
    assert by["rlu"]["diagnostics"]["mc_samples"] == 50
    assert by["llg-star"]["options"] == {"repeats": 2} and by["llg-star"]["diagnostics"]["repeats"] == 2
    assert data["ignored_options"] == ["-O zlg.dummy_samples: zlg did not run"]


def test_labels_records_default_options(gleak) -> None:
    r = gleak("labels", FEDSGD, "-M", LENET, "-a", "llg", "-a", "zlg", "--format", "json")
    assert r.exit_code == 0, r.stderr
    by = {x["attack"]: x for x in json.loads(r.stdout)["results"]}
    assert by["llg"]["options"] == {} and by["zlg"]["options"] == {"dummy_samples": 256}


@pytest.mark.extended
def test_reconstruct_option_runs_that_many_iterations(gleak, tmp_path: Path) -> None:
    r = gleak("reconstruct", SMOOTHING, "-M", LENET, "-o", tmp_path / "out", "-a", "ig", "-O", "ig.iterations=3",
              "-O", "ig.lr=0.05", "--tv", "0.001", "--lpips", "off", "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["diagnostics"]["iterations_run"] == 3 and data["diagnostics"]["tv"] == 0.001
    assert data["options"] == {"iterations": 3, "restarts": 1, "lr": 0.05, "tv": 0.001, "signed": False}
    assert json.loads((tmp_path / "out/metrics.json").read_text())["options"] == data["options"]


def test_reconstruct_flags_map_onto_the_options(gleak, tmp_path: Path) -> None:
    r = gleak("reconstruct", SMOOTHING, "-M", LENET, "-o", tmp_path / "out", "-a", "dlg", "-n", "2",
              "--signed", "-O", "ig.lr=0.5", "--lpips", "off", "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["options"] == {**OLD_DEFAULTS["dlg"], "iterations": 2}
    assert data["ignored_options"] == ["--signed: dlg does not use it", "-O ig.lr: dlg ran, not ig"]


@pytest.mark.parametrize(("args", "fragments"), [
    (["-O", "rlux.mc_samples=5"], ["unknown attack 'rlux'", "did you mean 'rlu'"]),
    (["-O", "rlu.bogus=5"], ["rlu has no option 'bogus'", "mc_samples"]),
    (["-O", "rlu.mc_samples=lots"], ["-O rlu.mc_samples", "'lots'"]),
    (["-O", "rlu.mc_samples=1"], ["-O rlu.mc_samples", "greater than or equal to 10"]),
    (["-O", "ig.iterations=3"], ["'ig' is a reconstruction attack"]),
    (["-O", "rlu"], ["ATTACK.KEY=VALUE"]),
    (["--augmentation", "bogus"], ["--augmentation", "bogus"]),
    (["--augmentation", "mixup", "-O", "softlabel.augmentation=auto"], ["--augmentation", "give one"]),
])
def test_labels_bad_options_are_refused(gleak, args, fragments) -> None:
    assert_refused(gleak("labels", FEDSGD, "-M", LENET, *args), *fragments)


@pytest.mark.parametrize(("args", "fragments"), [
    (["-O", "ig.lr=0"], ["-O ig.lr", "greater than 0"]),
    (["-O", "ig.lr=inf"], ["-O ig.lr", "finite"]),
    (["-O", "ig.distance=l2"], ["ig has no option 'distance'"]),
    (["-O", "feature.distance=cos"], ["-O feature.distance", "'l2' or 'cosine'"]),
    (["-O", "rlu.mc_samples=50"], ["'rlu' is a label attack"]),
    (["-O", "dgl.iterations=3"], ["unknown attack 'dgl'", "did you mean 'dlg'"]),
    (["--iterations", "5", "-O", "ig.iterations=3"], ["--iterations and -O ig.iterations", "give one"]),
    (["--lr", "0"], ["--lr"]),
])
def test_reconstruct_bad_options_are_refused(gleak, tmp_path: Path, args, fragments) -> None:
    out = tmp_path / "out"
    assert_refused(gleak("reconstruct", SMOOTHING, "-M", LENET, "-o", out, *args), *fragments)
    assert not out.exists()


def test_attacks_lists_options(gleak) -> None:
    r = gleak("attacks", "--format", "json")
    assert r.exit_code == 0, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert set(rows) == set(REGISTRY)
    for name, row in rows.items():
        assert {o["name"]: o["default"] for o in row["options"]} == {
            k: (None if name == "feature" and k in ("iterations", "lr") else v)
            for k, v in OLD_DEFAULTS.get(name, {}).items()}
        assert all(o["help"] and o["type"] for o in row["options"])
    table = gleak("attacks")
    assert table.exit_code == 0 and "mc_samples=2000" in table.stdout and "augmentation=auto" in table.stdout
