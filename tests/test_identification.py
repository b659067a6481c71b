"""The identification lineup (gleak.metrics.identification), the image findings built on it, the expected image
leakage without truth, the batch-size checks, and capture_gradients leaving BatchNorm statistics alone."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from gleak.attacks import build_context
from gleak.attacks.consistency import batch_size_conflicts, gradient_rank
from gleak.capture import capture_gradients, save_capture
from gleak.data.images import load_dataset
from gleak.io import tensors_sha256
from gleak.metrics.identification import clopper_pearson, draw_distractors, identify, lowpass, ncc
from gleak.models import LoadedModel
from gleak.report.model import AttackEntry, CaptureReport, FileRef, Thresholds
from gleak.runs.audit.capture import audit_loaded
from gleak.runs.audit.findings import expected_image_finding, image_finding, image_severity
from gleak.runs.audit.setup import AuditConfig
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import MNIST_AUX, MNIST_CLIENT

pytestmark = pytest.mark.usefixtures("one_thread")


class HeadCNN(nn.Module):
    """A user's BatchNorm CNN whose classifier is called ``head`` (as in the issue's report)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


@pytest.fixture(scope="module")
def aux():
    return load_dataset(MNIST_AUX)


@pytest.fixture(scope="module")
def digits():
    data = load_dataset(MNIST_CLIENT)
    return data.images[:16], data.labels[:16].tolist()


def _loaded(model: nn.Module) -> LoadedModel:
    return LoadedModel(model, "head-cnn", None, {}, (1, 28, 28), tensors_sha256(model.state_dict()), {})


# ------------------------------------------------------------------------------------------------ the metric
def test_the_true_images_are_identified_and_a_flat_image_scores_exactly_chance(aux, digits) -> None:
    true, labels = digits
    drawn = draw_distractors(true, labels, aux.images, aux.labels, k=9, seed=0)
    assert drawn.source == "aux, same class" and drawn.same_class == 1.0
    exact = identify(true, true, drawn)
    assert exact.rate == 1.0 and exact.chance == pytest.approx(0.1) and exact.interval[0] > 0.1
    assert exact.kappa == 1.0 and all(r == 1.0 for r in exact.ranks)
    flat = identify(torch.full_like(true, 0.3), true, drawn)  # correlates 0 with every candidate: all tie
    assert flat.rate == pytest.approx(0.1) and flat.kappa == pytest.approx(0.0)


def test_reconstructions_that_carry_nothing_are_identified_at_chance_despite_the_matching(aux, digits) -> None:
    """The matching pairs each true image with the reconstruction most like it; were the distractors not put
    through the same matching, noise would beat chance. Over many draws noise stays at 1 / (K + 1)."""
    true, labels = digits
    rates = []
    for seed in range(24):
        noise = torch.rand(true.shape, generator=torch.Generator().manual_seed(seed))
        drawn = draw_distractors(true, labels, aux.images, aux.labels, k=4, seed=seed)
        rates.append(identify(noise, true, drawn).rate)
    mean = statistics.fmean(rates)
    se = (0.2 * 0.8 / (len(rates) * len(true))) ** 0.5
    assert abs(mean - 0.2) < 3 * se, (mean, se)


def test_noisy_true_images_stay_identified_where_psnr_collapses(aux, digits) -> None:
    true, labels = digits
    noisy = (true + 0.5 * torch.randn(true.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    drawn = draw_distractors(true, labels, aux.images, aux.labels, k=9, seed=0)
    assert identify(noisy, true, drawn).rate >= 0.9
    assert identify(noisy, true, drawn, similarity="mse").rate >= 0.5  # mse too, but ncc is the default


def test_distractors_are_never_an_image_of_the_batch_and_fill_up_from_other_classes(aux, digits) -> None:
    true, labels = digits
    pool = torch.cat([true[:4], aux.images[:200]])  # the batch's own images are in the pool: never drawn
    pool_labels = torch.cat([torch.tensor(labels[:4]), aux.labels[:200]])
    drawn = draw_distractors(true[:4], labels[:4], pool, pool_labels, k=30, seed=0)
    for d in drawn.images:
        assert len(d) == 30 and not any(torch.equal(x, t) for x in d for t in true[:4])
    assert drawn.source == "aux, same class where possible" and 0 < drawn.same_class < 1  # ~20 per class in 200
    again = draw_distractors(true[:4], labels[:4], pool, pool_labels, k=30, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(drawn.images, again.images, strict=True))  # seeded


def test_without_aux_data_there_is_no_lineup_and_the_audit_says_why(head_capture, tmp_path: Path) -> None:
    model, capture, truth = head_capture
    config = AuditConfig(budget="standard", lpips="off", options={"ig": {"iterations": "5"}})
    report, findings, notices = audit_loaded(capture, _loaded(model), [], config, truth, tmp_path)
    entry = next(a for a in report.attacks if a.task == "reconstruct")
    assert entry.identification is None and entry.scores is not None and entry.scores["psnr"] is not None
    assert not any(f.rule == "GLEAK-IMAGES" for f in findings)
    assert any(n.code == "IMAGES_NOT_IDENTIFIED" and "--aux" in n.message for n in notices)


def test_lowpass_keeps_flat_images_and_correlation_ignores_contrast(digits) -> None:
    true, _ = digits
    flat = torch.full((2, 1, 28, 28), 0.4)
    assert torch.allclose(lowpass(flat), flat)
    sims = ncc(true[:3], torch.cat([true[:3] * 0.5 + 0.2]))
    assert torch.allclose(torch.diagonal(sims), torch.ones(3, dtype=sims.dtype), atol=1e-6)


def test_clopper_pearson_matches_the_known_exact_interval() -> None:
    low, high = clopper_pearson(16, 16)
    assert low == pytest.approx(0.7941, abs=1e-4) and high == 1.0
    low, high = clopper_pearson(0, 16)
    assert low == 0.0 and high == pytest.approx(0.2059, abs=1e-4)


# ------------------------------------------------------------------------------------------------ findings
def _entry(rate: float, low: float, chance: float = 0.1, n: int = 16) -> AttackEntry:
    kappa = (rate - chance) / (1 - chance)
    return AttackEntry(attack="ig", task="reconstruct", status="ok", scores={"psnr": 11.0, "ssim": 0.2},
                       identification={"rate": rate, "identified": rate * n, "n": n, "chance": chance, "kappa": kappa,
                                       "interval": [low, 1.0], "level": 0.95, "similarity": "ncc", "distractors": 9,
                                       "lineup": "aux, same class"})


@pytest.mark.parametrize(("rate", "low", "severity"), [
    (1.0, 0.79, "critical"), (0.7, 0.44, "high"), (0.5625, 0.30, "medium"), (0.25, 0.11, "low"),
    (0.25, 0.07, None),  # κ above the low threshold, but the interval reaches chance: no finding
    (0.0625, 0.0, None)])
def test_image_findings_follow_identification_over_chance(rate: float, low: float, severity: str | None) -> None:
    report = CaptureReport(capture=FileRef(path="c.safetensors"))
    finding = image_finding(report, _entry(rate, low), Thresholds())
    assert (finding.severity if finding else None) == severity
    if finding:
        assert finding.rule == "GLEAK-IMAGES" and finding.metric == "identification_kappa"
        assert "chance 10%" in finding.title and "PSNR 11.0 dB" in (finding.detail or "")


def test_an_expectation_is_never_critical() -> None:
    assert image_severity(1.0, 0.9, 0.1, Thresholds(), highest="high") == ("high", 0.6)
    report = CaptureReport(capture=FileRef(path="c"), expected_images={
        "rate": 1.0, "chance": 0.1, "kappa": 1.0, "interval": [0.9, 1.0], "predicted": [0.8, 1.0], "level": 0.95,
        "twins": 2, "n": 32, "attack": "ig", "distractors": 9, "settings": "B = 16"})
    finding = expected_image_finding(report, Thresholds())
    assert finding is not None and finding.rule == "GLEAK-IMAGES-EXPECTED" and finding.severity == "high"


# ------------------------------------------------------------------------------------------------ the audit
@pytest.fixture(scope="module")
def head_capture():
    client = load_dataset(MNIST_CLIENT)
    torch.manual_seed(0)
    model = HeadCNN()
    capture, truth = simulate_client(model, client, ClientConfig(batch_size=8, seed=1))
    return model, capture, truth


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_a_bn_cnn_leak_gets_an_image_finding_and_its_noise_control_none(head_capture, aux, tmp_path: Path) -> None:
    model, capture, truth = head_capture
    control = copy.deepcopy(capture)
    gen = torch.Generator().manual_seed(5)
    control.tensors = {k: torch.randn(v.shape, generator=gen) * float(v.std()) for k, v in capture.tensors.items()}
    config = AuditConfig(budget="standard", lpips="off", options={"ig": {"iterations": "200"}})
    severities = {}
    for name, cap in (("leak", capture), ("control", control)):
        report, findings, _ = audit_loaded(cap, _loaded(model), [(MNIST_AUX, aux)], config, truth, tmp_path,
                                           name=name)
        entry = next(a for a in report.attacks if a.task == "reconstruct")
        assert entry.identification is not None and entry.identification["lineup"] == "aux, same class"
        assert any(a.endswith("ig_lineup.png") for a in entry.artifacts)
        images = [f for f in findings if f.rule == "GLEAK-IMAGES"]
        severities[name] = images[0].severity if images else None
    assert severities["leak"] in ("medium", "high", "critical") and severities["control"] is None, severities


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_without_truth_the_audit_expects_image_leakage_from_twin_batches(head_capture, aux) -> None:
    model, capture, _ = head_capture
    config = AuditConfig(budget="standard", lpips="off", confidence=0, options={"ig": {"iterations": "200"}})
    report, findings, _notices = audit_loaded(capture, _loaded(model), [(MNIST_AUX, aux)], config, None)
    exp = report.expected_images
    assert exp is not None and exp["twins"] == 2 and exp["n"] == 16 and exp["options"] == {"iterations": "200"}
    assert exp["interval"][0] <= exp["rate"] <= exp["interval"][1] and exp["predicted"][0] <= exp["predicted"][1]
    assert any(f.rule == "GLEAK-IMAGES-EXPECTED" for f in findings), [f.rule for f in findings]
    quick, _, quick_notices = audit_loaded(capture, _loaded(model), [(MNIST_AUX, aux)],
                                           AuditConfig(budget="quick", lpips="off", confidence=0), None)
    assert quick.expected_images is None  # quick: fcn does not apply here, nothing reconstructed, nothing expected
    assert {"RECONSTRUCTION_SKIPPED", "IMAGES_NOT_EXPECTED"} <= {n.code for n in quick_notices}
    assert any("budget quick" in n.message for n in quick_notices if n.code == "IMAGES_NOT_EXPECTED")


def test_lpips_that_cannot_run_is_a_notice_in_the_audit(head_capture, aux, monkeypatch) -> None:
    from gleak.metrics import perceptual

    monkeypatch.setattr(perceptual, "load_lpips", lambda net="alex", device="cpu": perceptual.LPIPSModel(
        net, None, None, "no weights here (test)"))
    model, capture, truth = head_capture
    config = AuditConfig(budget="standard", lpips="alex", options={"ig": {"iterations": "5"}})
    _, _, notices = audit_loaded(capture, _loaded(model), [(MNIST_AUX, aux)], config, truth)
    lpips = [n for n in notices if n.code == "LPIPS_UNAVAILABLE"]
    assert len(lpips) == 1 and "no weights here (test)" in lpips[0].message


# ------------------------------------------------------------------------------------------------ batch size
def test_a_batch_size_the_tensors_contradict_is_said(head_capture, aux) -> None:
    model, capture, _truth = head_capture  # 8 real examples of several classes
    assert gradient_rank(capture.tensors["head.weight"].double()) == 8
    claimed = copy.deepcopy(capture)
    claimed.meta.update({"gleak.batch_size": 2, "gleak.num_examples": 2})
    ctx = build_context(claimed, _loaded(model))
    conflicts = batch_size_conflicts(ctx)
    assert any("rank 8" in c and "B = 2" in c for c in conflicts), conflicts
    assert any("negative bias gradient" in c for c in conflicts), conflicts
    assert batch_size_conflicts(build_context(capture, _loaded(model))) == []
    defended = copy.deepcopy(claimed)
    defended.meta["gleak.defense"] = {"noise": 0.1}
    assert batch_size_conflicts(build_context(defended, _loaded(model))) == []  # noise may raise the rank
    config = AuditConfig(budget="quick", lpips="off", confidence=0)
    report, _, notices = audit_loaded(claimed, _loaded(model), [(MNIST_AUX, aux)], config, None)
    assert any(n.code == "BATCH_SIZE_CONTRADICTED" for n in notices)
    assert any(a.startswith("batch size contradicted by the tensors: ") for a in report.assumptions)


def test_capture_gradients_leaves_batchnorm_statistics_as_they_were(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = HeadCNN().train()
    before = tensors_sha256(model.state_dict())
    digits = load_dataset(MNIST_CLIENT)
    x, y = digits.batch(range(8))
    capture = capture_gradients(model, x, y)
    assert tensors_sha256(model.state_dict()) == before == capture.meta["gleak.model.sha256"]
    save_capture(capture, tmp_path / "c.safetensors")
    assert json.loads(json.dumps(capture.meta["gleak.model.sha256"])) == before
