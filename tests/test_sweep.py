"""`gleak sweep`: leakage against defense strength on simulated LeNet-5 / MNIST clients (B = 8, 2 trials), its
sweep.json (schema, determinism), plots with accessible names, the spec rule, bad input in one line, atomic
output, and `gleak audit --sweep`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

from gleak.cli import app
from gleak.errors import GleakError
from gleak.report.model import SCHEMA_PATH, SweepReport
from gleak.runs.sweep import split_named, split_sweep

from .conftest import CIFAR, FEDSGD, LENET, MNIST_AUX, MNIST_CLIENT

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ("sweep", "-M", LENET, "-d", MNIST_CLIENT, "-b", "8", "--trials", "2", "--jobs", "1")
MAIN = (*BASE, "--defense", "gaussian=1e-3,1", "--aux", MNIST_AUX, "--confidence", "4")
DEFAULT_LABEL_ATTACKS = ("idlg", "ilrg", "llg", "llg-star", "llg-plus", "posterior", "rlu", "softlabel", "zlg",
                         "zlg-plus")


def run(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One sweep shared by the tests that only read it: gaussian at two σ; the default label attacks and the
    calibrated selector (calibrated once per point, with the point's defense)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sweep") / "out"
    code, _, err = run(*MAIN, "-o", out, "-q")
    torch.set_num_threads(before)
    assert code == 0, err
    yield out


def rows_of(folder: Path) -> list[dict]:
    return json.loads((folder / "sweep.json").read_text())["rows"]


def test_rows_for_every_defense_strength_and_attack_with_the_baseline(swept: Path) -> None:
    report = SweepReport.model_validate_json((swept / "sweep.json").read_text())
    attacks = [*DEFAULT_LABEL_ATTACKS, "calibrated"]
    assert report.settings.attacks == attacks
    assert report.notices == ["idlg gave no answer at any point (not_applicable: single-sample attack, this batch "
                              "has B = 8)", "softlabel gave no answer at any point (not_applicable: single-sample "
                              "attack, this batch has B = 8)"]
    points = [("none", "none"), ("gaussian", 1e-3), ("gaussian", 1.0)]
    assert [(r.defense, r.strength, r.attack) for r in report.rows] == [(d, s, a) for d, s in points for a in attacks]
    for r in report.rows:
        assert r.metric == "iacc" and r.trials + r.failed == 2 and r.epsilon is None
        assert r.chance is not None and 0 < r.chance < 1
        assert (r.mean is None) == (r.trials == 0) and (r.reason is None) == (r.failed == 0)
    idlg = next(r for r in report.rows if r.attack == "idlg")
    assert idlg.trials == 0 and "single-sample" in (idlg.reason or "")  # B = 8: not applicable, said why
    base = next(r for r in report.rows if r.defense == "none")
    assert base.utility.cosine == 1.0 and base.utility.relative_l2_error == 0.0
    assert [(d.name, d.strength, d.values) for d in report.defenses] == [("gaussian", "sigma", [1e-3, 1.0])]
    calibrated = next(r for r in report.rows if r.defense == "none" and r.attack == "calibrated")
    assert calibrated.trials == 2 and calibrated.mean == 1.0


def test_large_gaussian_noise_leaks_less_than_the_baseline(swept: Path) -> None:
    rows = rows_of(swept)
    at = {(r["defense"], r["strength"], r["attack"]): r for r in rows}
    compared = 0
    for attack in DEFAULT_LABEL_ATTACKS:
        base, small, large = (at[("none", "none", attack)], at[("gaussian", 1e-3, attack)],
                              at[("gaussian", 1.0, attack)])
        if base["mean"] is None:
            continue
        assert large["mean"] is not None and large["mean"] < base["mean"] - 0.2, attack
        assert small["mean"] is not None and small["mean"] >= large["mean"], attack
        compared += 1
    assert compared >= 6
    best = max(r["mean"] for r in rows if r["defense"] == "gaussian" and r["strength"] == 1.0 and r["mean"] is not None)
    assert best < 0.6  # σ = 1 drowns the signal: no attack gets near the baseline's 1.0
    utility = {r["strength"]: r["utility"]["cosine"] for r in rows if r["defense"] == "gaussian"}
    assert utility[1e-3] > 0.5 and abs(utility[1.0]) < 0.1


def test_sweep_json_validates_against_the_shipped_schema(swept: Path) -> None:
    data = json.loads((swept / "sweep.json").read_text())
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validate(data, schema)
    assert data["report"] == "sweep" and data["schema_version"] == "2" and data["tool"] == "gleak"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "report": "labels"}, schema)
    bad = json.loads(json.dumps(data))
    bad["rows"][0]["mean"] = "high"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_plots_and_markdown_with_accessible_names(swept: Path) -> None:
    assert sorted(p.name for p in swept.iterdir()) == ["gaussian.png", "gaussian.svg", "privacy-utility.png",
                                                       "privacy-utility.svg", "sweep.json", "sweep.md"]
    assert (swept / "gaussian.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    svg = (swept / "gaussian.svg").read_text()
    head = svg[svg.index("<svg"):svg.index(">", svg.index("<svg")) + 1]
    title = "gaussian: label iAcc of 11 attack(s) against its sigma"
    assert 'role="img"' in head and f'aria-label="{title}' in head and f"<title>{title}" in svg
    md = (swept / "sweep.md").read_text()
    assert f"![{title}" in md and "](gaussian.png)" in md and "| none (undefended) |" in md
    from gleak.report.sweep_plots import svg_document

    report = SweepReport.model_validate_json((swept / "sweep.json").read_text())
    assert svg_document(report, "gaussian") == svg  # deterministic: the same report draws the same SVG


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_dpsgd_and_sign_and_the_same_seed_gives_the_same_rows(tmp_path: Path) -> None:
    args = (*BASE, "--defense", "dpsgd=0.5,4", "--defense", "sign", "-a", "llg", "-a", "rlu", "--seed", "5", "-q")
    assert run(*args, "-o", tmp_path / "a")[0] == 0
    assert run(*args, "-o", tmp_path / "b")[0] == 0
    rows = rows_of(tmp_path / "a")
    assert rows == rows_of(tmp_path / "b")
    eps = {r["strength"]: r["epsilon"] for r in rows if r["defense"] == "dpsgd"}
    assert eps[0.5] > eps[4.0] > 0  # more noise, less ε (Opacus's accountant)
    assert all(r["epsilon"] is None for r in rows if r["defense"] != "dpsgd")
    assert [r["strength"] for r in rows if r["defense"] == "sign"] == [None, None]  # sign: no strength, one point
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["dpsgd.png", "dpsgd.svg", "privacy-utility.png", "privacy-utility.svg", "sign.png", "sign.svg",
                     "sweep.json", "sweep.md"]
    md = (tmp_path / "a" / "sweep.md").read_text()
    assert "| ε at δ = 1e-5 (RDP; q = " in md and ", 1 step × 1 round) |" in md  # ε with its terms
    terms = [r["epsilon_terms"] for r in rows if r["defense"] == "dpsgd"]
    assert {t["noise_multiplier"] for t in terms} == {0.5, 4.0} and {t["target_epsilon"] for t in terms} == {None}
    assert all(r["epsilon_terms"] is None for r in rows if r["defense"] != "dpsgd")


def test_dpsgd_swept_over_a_target_epsilon_has_an_epsilon_axis(tmp_path: Path) -> None:
    """dpsgd:epsilon=0.5,2: each point aims at its ε (z from Opacus's get_noise_multiplier, recorded ε ≤ target and
    within 5 %); the plot's x axis is the target ε (log), with z on the top axis, and every ε states its terms."""
    from gleak.report.sweep_plots import figure

    out = tmp_path / "eps"
    code, stdout, err = run(*BASE, "--trials", "1", "--defense", "dpsgd:epsilon=0.5,2", "-a", "llg", "-o", out)
    assert code == 0, err
    report = SweepReport.model_validate_json((out / "sweep.json").read_text())
    assert [(d.strength, d.values, d.fixed) for d in report.defenses] == [("epsilon", [0.5, 2.0], {})]
    dp = [r for r in report.rows if r.defense == "dpsgd"]
    assert [r.strength for r in dp] == [0.5, 2.0]
    for r in dp:
        assert r.epsilon is not None and r.epsilon_terms is not None and isinstance(r.strength, float)
        assert 0.95 * r.strength <= r.epsilon <= r.strength
        t = r.epsilon_terms
        assert (t.target_epsilon, t.delta, t.accountant, t.steps, t.rounds) == (r.strength, 1e-5, "rdp", 1, 1)
    assert dp[0].epsilon_terms.noise_multiplier > dp[1].epsilon_terms.noise_multiplier  # less ε, more noise
    fig = figure(report, "dpsgd")
    labels = [a.get_xlabel() for ax in fig.axes for a in (ax, *ax.child_axes)]  # child: the top (secondary) axis
    assert any(lab.startswith("target ε (dpsgd, log scale") and "δ = 1e-5 (RDP; q = " in lab and
               "1 step × 1 round" in lab for lab in labels), labels
    assert "log" in {ax.get_xscale() for ax in fig.axes}
    assert any("noise multiplier z" in lab for lab in labels), labels
    md = (out / "sweep.md").read_text()
    assert "| target ε |" in md and "| noise_multiplier z | ε at δ = 1e-5 (RDP; q = " in md
    assert "ε of dpsgd: at δ = 1e-5 (RDP; q = " in stdout


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_jobs_run_trials_in_workers_with_the_same_rows(tmp_path: Path) -> None:
    args = ("sweep", "-M", LENET, "-d", MNIST_CLIENT, "--trials", "2", "--defense", "clip=0.01,1", "-a", "ilrg",
            "-q")
    assert run(*args, "--jobs", "1", "-o", tmp_path / "one")[0] == 0
    code, _, err = run(*args, "--jobs", "2", "-o", tmp_path / "two")
    assert code == 0, err
    two = json.loads((tmp_path / "two" / "sweep.json").read_text())
    assert two["settings"]["workers"] == 2 and two["settings"]["jobs"] == 2
    assert two["rows"] == rows_of(tmp_path / "one")


@pytest.mark.extended  # spawns worker processes; make test runs it
def test_jobs_auto_hands_the_trials_left_to_workers_once_they_pay(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: trials here until the ones left would take longer than starting workers; the pool is replaced by an
    in-process stand-in (spawning is covered above), which checks what it is handed."""
    import gleak.runs.sweep as sweep_run

    handed: list[list[int]] = []

    def pool(request: sweep_run.SweepRequest, trials: list[int], workers: int) -> Iterator[tuple[int, dict]]:
        handed.append(list(trials))
        setup = sweep_run._Setup.open(request)
        for t in trials:
            yield t, sweep_run.run_trial(setup, t)

    monkeypatch.setattr("gleak.runs.parallel.AUTO_BREAK_EVEN_SECONDS", 0.0)
    monkeypatch.setattr("gleak.runs.parallel.available_cpus", lambda: 2)
    monkeypatch.setattr(sweep_run, "_pool", pool)
    args = ("sweep", "-M", LENET, "-d", MNIST_CLIENT, "--trials", "5", "--defense", "clip=0.01", "-a", "ilrg", "-q")
    assert run(*args, "--jobs", "auto", "-o", tmp_path / "auto")[0] == 0
    assert handed == [[2, 3, 4]]  # two trials measured here, the three left to 2 workers
    auto = json.loads((tmp_path / "auto" / "sweep.json").read_text())
    assert auto["settings"]["workers"] == 2 and auto["settings"]["jobs"] == 0
    assert run(*args, "--jobs", "1", "-o", tmp_path / "one")[0] == 0
    assert auto["rows"] == rows_of(tmp_path / "one")


@pytest.mark.parametrize(("spec", "says"), [
    ("nosuch=1,2", "unknown defense 'nosuch'"),
    ("gaussian:bogus=1=0.1,1", "gaussian has no option 'bogus'"),
    ("gaussian=-1,0.1", "greater than or equal to 0"),
    ("topk=0.9,1", "less than 1"),
    ("quantize=0,4", "greater than or equal to 1"),
    ("gaussian=a,b", "must be numbers separated by commas"),
    ("gaussian=", "must be numbers separated by commas"),
    ("sign=1,2", "sign has no strength option to sweep"),
    ("gaussian:sigma=0.1=1,2", "sigma is the strength the sweep varies"),
    ("gaussian=0.1,0.1", "given twice"),
    ("gaussian=nan,1", "finite numbers"),
    ("gaussian:relative=true,sigma=0.1,0.2", "a sweep's strengths follow the whole spec"),
    ("dpsgd:epsilon=1=0.5,1", "give epsilon (a target ε: gleak picks z) or noise_multiplier (z), not both"),
    ("dpsgd:noise_multiplier=1,epsilon=0.5,1", "not both"),
    ("dpsgd:epsilon=0.5,0.5", "given twice"),
    ("dpsgd:epsilon=0,1", "greater than 0"),
])
def test_bad_specs_are_one_line_exit_2(tmp_path: Path, spec: str, says: str) -> None:
    code, out, err = run(*BASE, "--defense", spec, "-o", tmp_path / "out")
    assert code == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and not out
    assert not (tmp_path / "out").exists()


def test_unknown_defense_lists_the_choices_and_other_bad_input(tmp_path: Path) -> None:
    code, _, err = run(*BASE, "--defense", "gausian=1,2", "-o", tmp_path / "o")
    assert code == 2 and "did you mean 'gaussian'" in err and "topk" in err and "dpsgd" in err
    cases = [(("--defense", "gaussian=1", "--defense", "gaussian:relative=true=1"), "given twice"),
             (("--defense", "gaussian=1", "-a", "calibrated"), "give --aux"),
             (("--defense", "gaussian=1", "-a", "rgla"), "--generator"),
             (("--defense", "gaussian=1", "-a", "nosuch"), "unknown attack"),
             (("--defense", "gaussian=1", "-a", "llg", "-O", "ig.lr=0.1"), "ig does not run"),
             (("--defense", "gaussian=1", "--jobs", "zero"), "--jobs must be auto")]
    for extra, says in cases:
        code, _, err = run(*BASE, *extra, "-o", tmp_path / "o")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (extra, err)
    assert not (tmp_path / "o").exists()


def test_split_rule() -> None:
    assert split_sweep("gaussian=1e-3,1e-2") == ("gaussian", ["1e-3", "1e-2"])
    assert split_sweep("topk:scope=global=0.9,0.99") == ("topk:scope=global", ["0.9", "0.99"])
    assert split_sweep("dpsgd:max_grad_norm=1=0.5,1,2") == ("dpsgd:max_grad_norm=1", ["0.5", "1", "2"])
    assert split_sweep("gaussian:sigma=0.1") == ("gaussian:sigma=0.1", None)  # one point, not sigma at 0.1
    assert split_sweep("gaussian:relative=true,sigma=0.1") == ("gaussian:relative=true,sigma=0.1", None)
    assert split_sweep("sign") == ("sign", None)
    assert split_named("dpsgd:epsilon=0.5,1,2", ("epsilon",)) == ("dpsgd", "epsilon", ["0.5", "1", "2"])
    assert split_named("dpsgd:max_grad_norm=2,epsilon=1,4", ("epsilon",)) == ("dpsgd:max_grad_norm=2", "epsilon",
                                                                               ["1", "4"])
    assert split_named("dpsgd:epsilon=2,delta=1e-6", ("epsilon",)) is None  # one point, aimed at ε = 2
    assert split_named("gaussian:sigma=0.1,0.2", ()) is None  # only a defense's also_sweeps are named


def test_existing_non_empty_folder_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = (*BASE, "--trials", "1", "--defense", "gaussian=0.5", "-a", "ilrg", "-q", "-o", out)
    code, _, err = run(*args)
    assert code == 2 and "pass --force" in err and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert run(*args, "--force")[0] == 0
    assert (out / "sweep.json").is_file() and (out / "notes.txt").read_text() == "mine"


def test_failed_sweep_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "new" / "out"
    code, _, err = run("sweep", "-M", LENET, "-d", CIFAR, "--defense", "gaussian=0.1", "-a", "ilrg", "-o", out)
    assert code == 2 and "expects inputs [1, 28, 28]" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()

    def broken(*args: object) -> bytes:
        raise GleakError("the plot could not be drawn")

    monkeypatch.setattr("gleak.report.sweep_plots.figure", broken)  # fails after sweep.json is staged
    code, _, err = run(*BASE, "--trials", "1", "--defense", "gaussian=0.5", "-a", "ilrg", "-o", out)
    assert code == 2 and "could not be drawn" in err
    assert not (tmp_path / "new").exists()


def test_without_aux_calibrated_is_skipped_with_a_notice(tmp_path: Path) -> None:
    code, _, err = run(*BASE, "--trials", "1", "--defense", "clip=1", "-q", "-o", tmp_path / "o")
    assert code == 0, err
    data = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert data["notices"][0] == ("calibrated skipped: it calibrates the label attacks on batches simulated from "
                                  "auxiliary data; give --aux to run it")
    assert "llg-plus gave no answer at any point (not_applicable: needs auxiliary labelled data (--aux))" in data[
        "notices"]
    assert "calibrated" not in data["settings"]["attacks"] and data["settings"]["confidence"] == 0
    assert "calibrated skipped" in err  # -q: the notice still reaches stderr, in one line
    assert "calibrated skipped" in (tmp_path / "o" / "sweep.md").read_text()


def test_reconstruction_is_scored_by_identification_with_aux_else_psnr(tmp_path: Path) -> None:
    args = (*BASE, "--trials", "1", "--defense", "gaussian=1", "-a", "ig", "--iterations", "3", "-q")
    assert run(*args, "--aux", MNIST_AUX, "-o", tmp_path / "k")[0] == 0
    kappa = rows_of(tmp_path / "k")
    assert [r["metric"] for r in kappa] == ["identification_kappa"] * 2 and {r["chance"] for r in kappa} == {0.0}
    assert all(r["mean"] is not None and -1 <= r["mean"] <= 1 for r in kappa)
    assert run(*args, "-o", tmp_path / "p")[0] == 0
    psnr = rows_of(tmp_path / "p")
    assert [r["metric"] for r in psnr] == ["psnr"] * 2 and all(r["chance"] > 0 and r["mean"] > 0 for r in psnr)
    assert "identification over chance" in (tmp_path / "k" / "gaussian.svg").read_text()


def test_audit_html_shows_the_sweep(swept: Path, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    code, _, err = run("audit", FEDSGD, "-M", LENET, "--sweep", swept, "-f", "html", "-o", out, "--fail-on", "none",
                       "-q")
    assert code == 0, err
    html = (out / "report.html").read_text()
    assert '<section id="sweep">' in html and 'class="sweep-plot"' in html
    assert 'aria-label="gaussian: label iAcc' in html and "<title>gaussian: label iAcc" in html
    assert "none (undefended)" in html and "<th>sigma</th>" in html


def test_audit_refuses_a_bad_sweep_in_one_line(swept: Path, tmp_path: Path) -> None:
    data = json.loads((swept / "sweep.json").read_text())
    tampered = json.loads(json.dumps(data))
    tampered["rows"][0]["utility"]["cosine"] = "<script>"
    stray = json.loads(json.dumps(data))
    stray["rows"][-1]["defense"] = "laplace"
    cases = {"broken.json": "{not json", "labels.json": json.dumps({**data, "report": "labels"}),
             "tampered.json": json.dumps(tampered), "stray.json": json.dumps(stray),
             "nan.json": json.dumps(data).replace('"seconds": ' + json.dumps(data["seconds"]), '"seconds": NaN')}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        out = tmp_path / f"audit-{name}"
        code, _, err = run("audit", FEDSGD, "-M", LENET, "--sweep", tmp_path / name, "-f", "html", "-o", out)
        assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1, (name, err)
        assert "Traceback" not in err and not out.exists(), name
    code, _, err = run("audit", FEDSGD, "-M", LENET, "--sweep", swept, "-f", "json")
    assert code == 2 and "add html to --format" in err


# ----------------------------------------------------------------------------------------- utility as accuracy
ACCURACY = (*BASE[:-4], "--trials", "1", "--jobs", "1", "-a", "llg", "--defense", "gaussian=1e-3,1",
            "--utility", "accuracy", "--train-rounds", "10", "--train-steps", "10", "-q")


def accuracies_of(folder: Path) -> dict[tuple[str, object], float]:
    return {(r["defense"], r["strength"]): r["utility"]["accuracy"] for r in rows_of(folder)}


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_utility_accuracy_trains_under_each_defense_paired_and_seeded(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(*ACCURACY, "-o", tmp_path / "a")
    assert code == 0, err
    got = accuracies_of(tmp_path / "a")
    assert set(got) == {("none", "none"), ("gaussian", 1e-3), ("gaussian", 1.0)}
    assert all(0.0 <= a <= 1.0 for a in got.values())
    base, weak, strong = got[("none", "none")], got[("gaussian", 1e-3)], got[("gaussian", 1.0)]
    assert base > 0.4  # 100 SGD steps of B = 8: far above chance (0.1) on the held-out MNIST digits
    assert strong < base - 0.25 and strong < 0.25  # σ = 1 on every weight of each round's update: no better than luck
    assert weak > base - 0.15  # a little noise costs little
    data = json.loads((tmp_path / "a" / "sweep.json").read_text())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    training = data["settings"]["training"]
    assert data["settings"]["utility"] == "accuracy" and training["eval_data"] is None
    assert (training["train_size"], training["eval_size"], training["eval_fraction"]) == (2400, 600, 0.2)
    assert (training["rounds"], training["local_steps"], training["batch_size"]) == (10, 10, 8)
    assert data["training_seconds"] > 0
    base_row = next(r for r in data["rows"] if r["defense"] == "none")
    assert base_row["utility"]["cosine"] == 1.0 and base_row["utility"]["relative_l2_error"] == 0.0  # kept
    md = (tmp_path / "a" / "sweep.md").read_text()
    assert "| test accuracy | cosine |" in md and "test accuracy after R = 10 FedAvg rounds" in md
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert run(*ACCURACY, "-o", tmp_path / "b")[0] == 0
    assert accuracies_of(tmp_path / "b") == got  # the same seed, the same accuracies
    assert json.loads((tmp_path / "b" / "sweep.json").read_text())["training_seconds"] == 0.0  # a timing


def test_privacy_utility_plot_has_its_accessible_name(tmp_path: Path) -> None:
    assert run(*BASE, "--trials", "1", "-a", "llg", "--defense", "gaussian=1", "--utility", "accuracy",
               "--train-rounds", "2", "--train-steps", "2", "-q", "-o", tmp_path / "o")[0] == 0
    svg = (tmp_path / "o" / "privacy-utility.svg").read_text()
    head = svg[svg.index("<svg"):svg.index(">", svg.index("<svg")) + 1]
    title = "privacy–utility: leakage (label iAcc of the best attack at each point"
    assert 'role="img"' in head and f'aria-label="{title}' in head and f"<title>{title}" in svg
    assert "against the utility kept (test accuracy)" in svg
    assert (tmp_path / "o" / "privacy-utility.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    md = (tmp_path / "o" / "sweep.md").read_text()
    assert f"![{title}" in md and "](privacy-utility.png)" in md


def test_the_held_out_split_is_disjoint_from_training_and_seeded() -> None:
    from gleak.data.images import load_dataset
    from gleak.runs.sweep_accuracy import split_data

    data = load_dataset(MNIST_CLIENT)
    split = split_data(data, seed=3)
    assert split.held_out is not None and len(split.held_out) == 600 and len(split.train) == 2400
    kept = sorted(set(range(len(data))) - set(split.held_out.tolist()))
    assert torch.equal(split.train.images, data.images[kept])  # trains on exactly the rest
    assert torch.equal(split.test.images, data.images[split.held_out])
    assert not set(kept) & set(split.held_out.tolist())
    assert torch.equal(split_data(data, seed=3).held_out, split.held_out)  # type: ignore[arg-type]
    assert not torch.equal(split_data(data, seed=4).held_out, split.held_out)  # type: ignore[arg-type]


def test_bad_eval_data_is_one_line_exit_2(tmp_path: Path) -> None:
    args = (*BASE, "--trials", "1", "-a", "llg", "--defense", "gaussian=1", "--train-rounds", "1",
            "--train-steps", "1")
    for extra, says in ((("--utility", "accuracy", "--eval-data", CIFAR), "--eval-data: "),
                        (("--eval-data", MNIST_AUX), "give --utility accuracy"),
                        (("--utility", "loss"), "--utility 'loss': choose cosine or accuracy"),
                        (("--utility", "accuracy", "--train-lr", "0"), "--train-lr must be")):
        code, out, err = run(*args, *extra, "-o", tmp_path / "o")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (extra, err)
        assert not out
    assert not (tmp_path / "o").exists()
    empty = tmp_path / "empty.safetensors"
    from safetensors.torch import save_file

    save_file({"images": torch.zeros(0, 1, 28, 28), "labels": torch.zeros(0, dtype=torch.long)}, str(empty))
    code, _, err = run(*args, "--utility", "accuracy", "--eval-data", empty, "-o", tmp_path / "o")
    assert code == 2 and "--eval-data: " in err and len(err.strip().splitlines()) == 1, err
