"""ε over an audited run (gleak.defenses.accounting, gleak.report.run_privacy): each client's cumulative ε after each
round, composed as Opacus's accountant composes it; the --max-epsilon budget; unaccounted rounds never read as 0."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant

from gleak.capture import load_capture, load_truth, save_capture, truth_path_for
from gleak.defenses.accounting import RoundSpend, cumulative_epsilon
from gleak.report.model import CaptureReport, FileRef, Report
from gleak.report.plots import plotted_series, run_plots
from gleak.report.run_privacy import account_run
from gleak.report.run_view import build_run_view

from .conftest import LENET, MNIST_CLIENT

pytestmark = pytest.mark.usefixtures("one_thread")
HISTORY = [(1.0, 0.016, 3), (1.0, 0.016, 3), (0.8, 0.02, 5), (1.2, 0.01, 2)]


def opacus_epsilon(cls: type, history: list[tuple[float, float, int]], delta: float = 1e-5) -> float:
    accountant = cls()
    accountant.history = list(history)
    return float(accountant.get_epsilon(delta=delta))


@pytest.mark.parametrize(("accountant", "cls", "tolerance"), [("rdp", RDPAccountant, 1e-9),
                                                               ("prv", PRVAccountant, 0.02)])
def test_cumulative_epsilon_is_opacus_composed_over_the_rounds_so_far(accountant: str, cls: type,
                                                                      tolerance: float) -> None:
    spends = [RoundSpend(i + 1, z, q, s) for i, (z, q, s) in enumerate(HISTORY)]
    got = [c.epsilon for c in cumulative_epsilon(spends, 1e-5, accountant)]
    want = [opacus_epsilon(cls, HISTORY[:i + 1]) for i in range(len(HISTORY))]
    assert all(g is not None for g in got)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=tolerance)
    assert all(b > a for a, b in itertools.pairwise(got))  # type: ignore[operator]


def test_a_round_without_dp_makes_epsilon_unknown_never_zero_or_infinite() -> None:
    out = cumulative_epsilon([RoundSpend(1, 1.0, 0.01, 2), RoundSpend(2), RoundSpend(3, 1.0, 0.01, 2)], 1e-5)
    assert out[0].epsilon is not None and out[1].epsilon is None and out[2].epsilon is None
    assert out[2].reason is not None and "round 2 records no DP" in out[2].reason
    no_noise = cumulative_epsilon([RoundSpend(1, 0.0, 0.01, 2)], 1e-5)[0]
    assert no_noise.epsilon is None and no_noise.reason is not None and "no DP guarantee" in no_noise.reason


def test_flower_local_dp_is_accounted_per_client_update() -> None:
    """LocalDpMod: the Gaussian mechanism on the whole clipped update once per round, z = σ / sensitivity, q = 1."""
    record = {"name": "flwr.LocalDpMod", "clipping_norm": 1.0, "sensitivity": 1.0, "epsilon": 2.0, "delta": 1e-5,
              "noise_std": 2.42}
    captures = [CaptureReport(capture=FileRef(path=f"c{r}"), round=r, client="h1", defense=[record])
                for r in (1, 2, 3)]
    privacy = account_run(captures)
    assert privacy is not None and privacy.kind.startswith("Flower's LocalDpMod") and privacy.delta == 1e-5
    got = [r.epsilon for r in privacy.clients[0].rounds]
    want = [opacus_epsilon(RDPAccountant, [(2.42, 1.0, 1)] * n) for n in (1, 2, 3)]
    assert got == pytest.approx(want, rel=1e-9)


def test_no_dp_no_privacy_section() -> None:
    assert account_run([CaptureReport(capture=FileRef(path="c"), round=1, client="a")]) is None


# ------------------------------------------------------------------------------------------ a real run


def make_run(gleak, folder: Path, clients: str = "ab", rounds: int = 3, plain: tuple[str, int] | None = None) -> Path:
    """Clients × rounds of DP-SGD captures (z = 1, C = 1, B = 8, 2 local steps), each with its round and client;
    ``plain`` (client, round) trains without DP."""
    folder.mkdir()
    for client in clients:
        for r in range(1, rounds + 1):
            tmp = folder / f"tmp-{client}{r}.safetensors"
            defense = "clip:norm=1" if plain == (client, r) else "dpsgd:noise_multiplier=1,max_grad_norm=1"
            result = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "--batch-size", 8, "--local-steps",
                           2, "--seed", 10 * r + ord(client), "--defense", defense, "-o", tmp, "-q")
            assert result.exit_code == 0, result.stderr
            capture = load_capture(tmp)
            truth = load_truth(truth_path_for(tmp), capture)
            capture.meta.update({"gleak.fl.round": r, "gleak.fl.client_id": client})
            save_capture(capture, folder / f"{client}{r}.safetensors", truth=truth)
            tmp.unlink()
            truth_path_for(tmp).unlink()
    return folder


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner

    from gleak.cli import app

    runner = CliRunner()

    def gleak(*args: object):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return make_run(gleak, tmp_path_factory.mktemp("dp") / "run", plain=("b", 3))


def audit_json(gleak, run: Path, *args: object) -> tuple[int, dict]:
    # these DP-SGD updates (2 local steps, no --aux) leave the labels unassessed: accepted, the gate is on ε here
    result = gleak("audit", run, "--model", LENET, "--format", "json", "--accept-unassessed", *args)
    return result.exit_code, json.loads(result.stdout)


def test_the_audit_composes_each_clients_epsilon_as_opacus_does(gleak, dp_run: Path) -> None:
    code, report = audit_json(gleak, dp_run)
    assert code == 0
    privacy = report["run"]["privacy"]
    assert privacy["delta"] == 1e-5 and privacy["accountant"] == "rdp" and privacy["max_epsilon"] is None
    clients = {c["client"]: c for c in privacy["clients"]}
    a = clients["a"]["rounds"]
    history = []
    for r in range(1, 4):
        meta = load_capture(dp_run / f"a{r}.safetensors").meta
        history.append((meta["gleak.dp.noise_multiplier"], meta["gleak.dp.sample_rate"], meta["gleak.dp.steps"]))
        assert a[r - 1]["round"] == r
        assert a[r - 1]["epsilon"] == pytest.approx(opacus_epsilon(RDPAccountant, history), rel=0.02)
    assert a[0]["epsilon"] < a[1]["epsilon"] < a[2]["epsilon"] == clients["a"]["epsilon"]
    b = clients["b"]  # round 3 trained without DP: unknown from there, said so, never 0
    assert b["rounds"][1]["epsilon"] > 0 and b["rounds"][2]["epsilon"] is None and b["epsilon"] is None
    assert any(n["code"] == "DP_UNACCOUNTED" and "round 3" in n["message"] for n in report["notices"])


def test_max_epsilon_below_the_final_epsilon_fails_far_above_it_passes(gleak, dp_run: Path) -> None:
    _, report = audit_json(gleak, dp_run)
    final = report["run"]["privacy"]["clients"][0]["epsilon"]
    code, report = audit_json(gleak, dp_run, "--fail-on", "high", "--max-epsilon", final / 2)
    budget = [f for f in report["findings"] if f["rule"] == "GLEAK-DP-BUDGET"]
    assert code == 1 and budget and all(f["severity"] == "high" for f in budget)
    assert {f["capture"].rsplit("/", 1)[1] for f in budget} >= {"a3.safetensors"}  # at the client's last round
    code, report = audit_json(gleak, dp_run, "--fail-on", "high", "--max-epsilon", final * 100)
    assert code == 0 and not [f for f in report["findings"] if f["rule"] == "GLEAK-DP-BUDGET"]


def test_max_epsilon_comes_from_the_config_and_the_environment_too(gleak, dp_run: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gleak.toml").write_text("[audit]\nmax-epsilon = 0.01\n")
    code, report = audit_json(gleak, dp_run, "--fail-on", "high")
    assert code == 1 and report["run"]["privacy"]["max_epsilon"] == 0.01
    monkeypatch.setenv("GLEAK_MAX_EPSILON", "1000")
    code, report = audit_json(gleak, dp_run, "--fail-on", "high")
    assert code == 0 and report["run"]["privacy"]["max_epsilon"] == 1000
    (tmp_path / "gleak.toml").write_text("[audit]\nmax-epsilon = -1\n")
    monkeypatch.delenv("GLEAK_MAX_EPSILON")
    result = gleak("audit", dp_run, "--model", LENET)
    assert result.exit_code == 2 and "gleak.toml" in result.stderr and result.stderr.count("\n") == 1


def test_a_budget_without_dp_says_it_checked_nothing(gleak) -> None:
    from .conftest import FEDSGD

    _code, report = audit_json(gleak, FEDSGD, "--fail-on", "none", "--max-epsilon", 1)
    assert report["run"] is None
    assert [n["code"] for n in report["notices"]].count("MAX_EPSILON_UNUSED") == 1


def test_epsilon_is_beside_the_leakage_in_every_format_and_plot(gleak, dp_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = gleak("audit", dp_run, "--model", LENET, "--max-epsilon", 0.01, "--fail-on", "none", "-o", out,
                   "--format", "table,html,md")
    assert result.exit_code == 0, result.stderr
    shown = result.stdout
    assert "largest ε = " in shown and "ε of client a: ε = " in shown and "2 steps × 3 rounds" in shown
    html = (out / "report.html").read_text()
    assert 'id="privacy"' in html and "at δ = 1e-5 (RDP; q = " in html and "2 steps × 3 rounds" in html
    md = (out / "report.md").read_text()
    assert "**Privacy spent**" in md and "GLEAK\\-DP\\-BUDGET" in md
    assert (out / "run-epsilon.png").is_file()  # no leakage series here (FedAvg, no aux): ε alone


def test_leakage_plots_carry_epsilon_on_a_second_axis() -> None:
    captures = [CaptureReport(capture=FileRef(path=f"c{r}"), round=r, client="a", chance={"iacc": 0.4},
                              defense=[{"name": "flwr.LocalDpMod", "noise_std": 1.0, "sensitivity": 1.0,
                                        "delta": 1e-5}])
                for r in (1, 2)]
    from gleak.report.model import AttackEntry

    for c in captures:
        c.attacks = [AttackEntry(attack="llg", task="labels", status="ok", counts=[1], scores={"iacc": 1.0})]
    report = Report(gleak_version="0", captures=captures)
    report.run = build_run_view(report)
    assert report.run is not None
    report.run.privacy = account_run(captures)
    from gleak.report.plots import figure

    fig = figure(report.run, report.run.series[0])
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "cumulative ε"
    assert [s.name for s in plotted_series(report.run)] == [report.run.series[0].name]
    assert set(run_plots(report.run)) == {f"run-{report.run.series[0].name}.png"}
