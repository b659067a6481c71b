"""Issue 26, parts 3 and 4: abstaining is an answer (status ``abstained``, exit 0, an info finding in the audit),
and the chance iAcc beside an expected iAcc is computed for the batch composition it assumes (checked against
Monte Carlo estimates of random guessing)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import jsonschema
import pytest
import torch

from gleak.attacks import build_context
from gleak.attacks.labels.confidence import FIT_LEVEL, Confidence, calibrate, composition
from gleak.attacks.plan import select_attacks
from gleak.capture import save_capture
from gleak.data.images import load_dataset
from gleak.metrics.labels import chance_scores, truth_counts
from gleak.models import load_model
from gleak.report.model import SCHEMA_PATH, AttackEntry, CaptureReport, FileRef, LabelResult, LabelsReport, Report
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import FEDSGD, LENET, MNIST_AUX, MNIST_CLIENT, SAMPLES

TRAINED = SAMPLES / "models" / "lenet_mnist98.safetensors"


def validate(data: dict) -> None:
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))


@pytest.fixture(scope="module")
def abstaining(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 98.7 % LeNet-5, m = 5 SGD steps of B = 32 (no truth beside it): no label attack beats chance on both
    compositions of simulated batches (chance 0.87 on uniform ones), so the calibrated selection abstains."""
    model = load_model(TRAINED)
    cap, _ = simulate_client(model.module, load_dataset(MNIST_CLIENT),
                             ClientConfig(batch_size=32, scheme="fedavg", local_steps=5, seed=3))
    path = tmp_path_factory.mktemp("abstain") / "m5.safetensors"
    save_capture(cap, path)
    return path


# ------------------------------------------------------------------------------------ abstaining is an answer
@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_labels_abstention_exits_0_with_the_reason_in_the_json(gleak, abstaining: Path, tmp_path: Path) -> None:
    out = tmp_path / "labels.json"
    r = gleak("labels", abstaining, "-M", TRAINED, "--aux", MNIST_AUX, "-a", "calibrated",
              "-O", "calibrated.simulations=8", "--format", "json", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert "reasons above" not in r.stdout + r.stderr and "error" not in r.stderr
    data = json.loads(r.stdout)
    validate(data)
    assert json.loads(out.read_text()) == data  # the report file is written: an abstention is not an error
    (result,) = data["results"]
    assert result["status"] == "abstained" and "counts" not in result
    assert "worst-case margin over chance" in result["reason"] and "uniform" in result["reason"]
    conf = result["confidence"]
    assert conf["informative"] is False and conf["attack"] in conf["expected_iacc_by_attack"]
    assert conf["worst_margin"] == conf["by_composition"][conf["composition"]]["margin"]
    table = gleak("labels", abstaining, "-M", TRAINED, "--aux", MNIST_AUX, "-a", "calibrated",
                  "-O", "calibrated.simulations=8")
    assert table.exit_code == 0, table.stderr
    assert "abstained" in table.stdout and "worst-case margin" in table.stdout


def test_no_answer_at_all_is_still_exit_2_and_never_says_reasons_above_in_json(gleak) -> None:
    r = gleak("labels", FEDSGD, "-M", LENET, "-a", "idlg", "--format", "json")  # idlg needs B = 1
    assert r.exit_code == 2
    assert "reasons above" not in r.stdout + r.stderr and "in the JSON report" in r.stderr
    assert json.loads(r.stdout)["results"][0]["status"] == "not_applicable"


def test_no_counts_reason_counts_an_abstention_as_an_answer() -> None:
    from gleak.runs.labels import no_counts_reason

    def report(*statuses: str) -> LabelsReport:
        results = [LabelResult(attack=f"a{i}", status=s, seconds=0.0, warnings=[])  # type: ignore[arg-type]
                   for i, s in enumerate(statuses)]
        return LabelsReport.model_construct(results=results)

    assert no_counts_reason(report("abstained", "not_applicable")) is None
    assert no_counts_reason(report("abstained", "failed")) is None
    assert no_counts_reason(report("failed", "not_applicable")) == "no label attack gave counts for this capture"
    assert no_counts_reason(report("not_applicable")) == "no label attack applies to this capture"


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_the_audit_reports_an_abstention_as_an_info_finding(gleak, abstaining: Path, tmp_path: Path) -> None:
    cap = tmp_path / "caps" / abstaining.name
    cap.parent.mkdir()
    shutil.copy(abstaining, cap)
    out = tmp_path / "out"
    base = ("audit", cap, "-M", TRAINED, "--aux", MNIST_AUX, "--confidence", "8")
    r = gleak(*base, "--fail-on", "high", "--format", "json,sarif,junit,md,html", "-o", out)
    assert r.exit_code == 0, r.stderr  # never 2 (bad input), never a failure above info
    report = json.loads((out / "report.json").read_text())
    validate(report)
    (finding,) = report["findings"]
    assert finding["rule"] == "GLEAK-LABELS-ABSTAINED" and finding["severity"] == "info"
    assert finding["metric"] == "expected_iacc" and finding["chance"] > 0.8  # uniform batches of m·B = 160
    assert "abstains" in finding["title"] and "worst-case margin over chance" in finding["detail"]
    sarif = json.loads((out / "report.sarif").read_text())
    (result,) = [x for x in sarif["runs"][0]["results"] if x["ruleId"] == "GLEAK-LABELS-ABSTAINED"]
    assert result["level"] == "note"
    assert "GLEAK\\-LABELS\\-ABSTAINED" in (out / "report.md").read_text()  # Markdown-escaped
    assert "GLEAK-LABELS-ABSTAINED" in (out / "report.html").read_text()
    junit = (out / "junit.xml").read_text()
    assert "GLEAK-LABELS-ABSTAINED" in junit and "<failure" not in junit
    gated = gleak(*base, "--fail-on", "info", "--format", "json")
    assert gated.exit_code == 1, gated.stderr  # an info finding is at or above --fail-on info


def test_formats_render_an_abstained_attack_and_finding(tmp_path: Path) -> None:
    from gleak.report.formats import get_format
    from gleak.runs.audit.findings import abstained_finding

    weak = {"calibrated": True, "informative": False, "composition": "uniform", "expected_iacc": 0.81,
            "chance_iacc": 0.87, "worst_margin": -0.06, "level": 0.9, "half_width": 20, "simulations": 24,
            "by_composition": {"uniform": {"expected_iacc": 0.81, "chance_iacc": 0.87, "margin": -0.06},
                               "dirichlet": {"alpha": 0.5, "expected_iacc": 0.6, "chance_iacc": 0.54,
                                             "margin": 0.06}}}
    capture = CaptureReport(capture=FileRef(path="c.safetensors"), attacks=[
        AttackEntry(attack="rlu", task="labels", status="ok", counts=[16] * 10, confidence=weak),
        AttackEntry(attack="calibrated", task="labels", status="abstained", reason="no attack beats chance",
                    confidence={**weak, "attack": "rlu"})])  # as Calibrated._abstain writes it
    finding = abstained_finding(capture)
    assert finding is not None and finding.severity == "info" and finding.attack == "rlu"
    assert "uniform batches" in finding.title and "dirichlet 0.600 vs chance 0.540" in (finding.detail or "")
    report = Report(gleak_version="0.1.0", captures=[capture], findings=[finding])
    validate(json.loads(get_format("json").render(report)))
    assert not report.failed() and not report.has_errors()
    html = get_format("html").render(report, tmp_path)
    assert "st-abstained" in html and "GLEAK-LABELS-ABSTAINED" in html
    sarif = json.loads(get_format("sarif").render(report, tmp_path))
    rule = next(r for r in sarif["runs"][0]["tool"]["driver"]["rules"] if r["id"] == "GLEAK-LABELS-ABSTAINED")
    assert rule["defaultConfiguration"]["level"] == "note"
    assert 'name="labels"' in get_format("junit").render(report, tmp_path)  # the labels check, not a new one


# ----------------------------------------------------------------------------------------------- honest chance
def _monte_carlo_chance(total: int, classes: int = 10, trials: int = 4000, seed: int = 11) -> float:
    """Random guessing on batches drawn uniformly from a 10-class prior, simulated: the mean iAcc of ``total``
    uniform guesses against ``total`` uniformly drawn labels."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(classes, (trials, total), generator=gen)
    guesses = torch.randint(classes, (trials, total), generator=gen)
    n = torch.nn.functional.one_hot(labels, classes).sum(1)
    x = torch.nn.functional.one_hot(guesses, classes).sum(1)
    return float((torch.minimum(n, x).sum(1).double() / total).mean())


@pytest.mark.parametrize(("total", "reported_before"), [(32, 0.598), (80, 0.669)])
def test_uniform_chance_matches_a_monte_carlo_estimate(total: int, reported_before: float) -> None:
    mc = _monte_carlo_chance(total)
    gleak_chance = composition("uniform", total, 10, range(10), seed=0).chance_iacc
    assert abs(gleak_chance - mc) <= 0.03, (gleak_chance, mc)  # measured: 0.706 vs 0.706, 0.812 vs 0.812
    assert mc - reported_before > 0.1  # the mixture's chance understated it (issue 26)


def test_the_cli_reports_chance_for_the_composition_it_assumes(gleak) -> None:
    """B = 32 (the shipped FedSGD capture): the uniform composition's chance is random guessing on uniform batches,
    the headline numbers name their composition, and each composition states its assumption."""
    r = gleak("labels", FEDSGD, "-M", LENET, "--aux", MNIST_AUX, "-a", "rlu", "--confidence", "4", "--format", "json")
    assert r.exit_code == 0, r.stderr
    conf = json.loads(r.stdout)["results"][0]["confidence"]
    by = conf["by_composition"]
    assert abs(by["uniform"]["chance_iacc"] - _monte_carlo_chance(32)) <= 0.03, by
    assert by["dirichlet"]["chance_iacc"] < 0.6 and by["dirichlet"]["alpha"] == 0.5
    assert "uniformly" in by["uniform"]["assumes"] and "Dirichlet" in by["dirichlet"]["assumes"]
    head = by[conf["composition"]]
    assert (conf["expected_iacc"], conf["chance_iacc"]) == (head["expected_iacc"], head["chance_iacc"])
    assert conf["fit"]["fits"] is True  # exact counts of a uniform batch: nothing unusual


def test_calibration_on_updates_uses_the_chance_of_all_m_b_labels(tmp_path: Path) -> None:
    """m = 5 steps of B = 16 (m·B = 80): the calibration's uniform chance is within ±0.03 of random guessing on
    80 uniformly drawn labels, and far from the 0.669 the mixture reported."""
    model = load_model(LENET)
    cap, _ = simulate_client(model.module, load_dataset(MNIST_CLIENT),
                             ClientConfig(batch_size=16, scheme="fedavg", local_steps=5, seed=1))
    ctx = build_context(cap, model, load_dataset(MNIST_AUX))
    calibration, why = calibrate(ctx, select_attacks("labels", ["rlu"]), simulations=4)
    assert why is None
    uniform = calibration["rlu"].by_composition["uniform"]
    assert abs(uniform.chance_iacc - _monte_carlo_chance(80)) <= 0.03, uniform
    assert uniform.simulations == 2 and calibration["rlu"].compositions["uniform"].total == 80


def test_dirichlet_chance_matches_the_simulated_clients() -> None:
    """The Dirichlet composition's chance is that of the batches gleak.simulate draws (the same law)."""
    model = load_model(LENET)
    client = load_dataset(MNIST_CLIENT)
    chances = []
    for seed in range(120):
        _, truth = simulate_client(model.module, client, ClientConfig(batch_size=32, composition="dirichlet",
                                                                      seed=seed))
        chances.append(chance_scores(truth_counts(truth.labels, 10))["iacc"])
    expected = composition("dirichlet", 32, 10, range(10), seed=0).chance_iacc
    assert abs(statistics.fmean(chances) - expected) <= 0.03, (statistics.fmean(chances), expected)


def test_counts_that_do_not_fit_the_mixture_are_flagged() -> None:
    comps = {name: composition(name, 32, 10, range(9), seed=i) for i, name in enumerate(("uniform", "dirichlet"))}
    conf = Confidence(0.9, 3, 0.8, 0.7, True, 24, compositions=comps)
    even = [4, 4, 4, 4, 4, 3, 3, 3, 3, 0]
    fit = conf.fit(even)
    assert fit is not None and fit["fits"] and conf.fit_warning(even) is None
    one_class = [32] + [0] * 9  # more concentrated than nearly every uniform or Dirichlet(0.5) batch
    fit = conf.fit(one_class)
    assert fit is not None and not fit["fits"] and fit["p_value"] < FIT_LEVEL
    warning = conf.fit_warning(one_class)
    assert warning is not None and "more concentrated" in warning and "may not apply" in warning
    absent = [3] * 9 + [5]  # class 9 is not in the aux data: no simulated batch holds it
    assert "classes the aux data does not hold" in (conf.fit_warning(absent) or "")
