"""``gleak audit`` as a library: find captures, match each to its model and auxiliary data, plan and run the
attacks by budget, score them against the ground truth, turn the scores into findings, and build the
:class:`~gleak.report.model.Report` that every output format renders.

Findings and their thresholds (defaults in :class:`~gleak.report.model.Thresholds`, documented in the README):

* ``GLEAK-LABELS`` — the best label attack's iAcc (the instance-level accuracy of the recovered label counts,
  as in Ma et al., ICLR 2023, and Chen & Vikalo, ICML 2024): critical when every label is recovered exactly,
  high at iAcc ≥ 0.9, medium when it beats random guessing (the exact chance iAcc of the same batch) by ≥ 0.2,
  low by ≥ 0.05.
* ``GLEAK-SOFT-LABEL`` — the soft label of one example recovered within L1 < 1e-3, the success criterion of
  Wang, Liang & He (ICLR 2024): high.
* ``GLEAK-IMAGES`` — the mean PSNR of the matched reconstructions: critical ≥ 30 dB, high ≥ 20 dB, medium when
  ≥ 3 dB above the no-attack baseline (each image's flat mean colour, or the mean of the other true images),
  low ≥ 1 dB above it.
* ``GLEAK-LABELS-AGREE`` (no ground truth) — independent label attacks that agree exactly: info, since only
  the truth can say whether they agree on the right answer.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from gleak import __version__
from gleak.attacks import Context, build_context, get_attack, run_attack
from gleak.attacks.base import AttackResult
from gleak.attacks.plan import run_label_attacks, select_attacks
from gleak.capture import Capture, Truth, load_capture, load_truth, safetensors_kind, truth_path_for
from gleak.data import Dataset
from gleak.errors import GleakError, shorten
from gleak.io import file_sha256
from gleak.metrics.labels import chance_scores, truth_counts
from gleak.models import LoadedModel, load_model
from gleak.pipeline import resolve_device, score_reconstruction
from gleak.report.model import (
    AttackEntry,
    CaptureReport,
    FileRef,
    Finding,
    Notice,
    Report,
    Severity,
    Thresholds,
)

BUDGETS = ("quick", "standard", "full")
# budget -> iterations of the bounded gradient-matching run (None: the attack's default); quick runs none
STANDARD_ITERATIONS = {"adam": 500, "lbfgs": 50}
MODEL_SUFFIXES = (".safetensors", ".pt", ".pth", ".pt2")
CAPTURE_KINDS = ("gradient", "update")
FORWARD_CACHE_ENTRIES = 8  # (model, aux, mode) combinations whose aux forwards an audit keeps


CaptureResult = tuple[CaptureReport, list[Finding], list[Notice]]


@dataclass
class AuditConfig:
    """What to run and how to judge it."""

    budget: str = "quick"
    fail_on: Severity | Literal["none"] = "high"
    thresholds: Thresholds = field(default_factory=Thresholds)
    seed: int = 0
    device: str = "auto"
    lpips: str = "alex"
    allow_model_mismatch: bool = False
    trust_pickle: bool = False
    arch: str | None = None
    arch_kwargs: str | None = None
    command: list[str] = field(default_factory=list)
    options: dict[str, dict[str, str]] = field(default_factory=dict)  # -O ATTACK.KEY=VALUE, validated by the CLI
    confidence: int = 24  # simulated batches that calibrate the label attacks when there is no truth (0: off)

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise GleakError(f"--budget must be one of {', '.join(BUDGETS)}, got {shorten(repr(self.budget), 40)}")


# ----------------------------------------------------------------------------------------------- discovery
def find_captures(paths: Sequence[Path]) -> list[Path]:
    """Captures named directly, and every capture file (gleak.kind gradient/update) under the directories."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += [p for p in sorted(path.rglob("*.safetensors"))
                      if p.is_file() and safetensors_kind(p) in CAPTURE_KINDS]
        elif path.exists():
            found.append(path)
        else:
            raise GleakError(f"{path}: no such file or directory")
    if not found:
        raise GleakError("no captures found in " + ", ".join(str(p) for p in paths))
    return list(dict.fromkeys(found))


def find_models(paths: Sequence[Path]) -> list[Path]:
    """Model files named directly, and every model-like file in the directories (captures and data excluded)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += [p for p in sorted(path.iterdir()) if p.is_file() and p.suffix.lower() in MODEL_SUFFIXES
                      and (p.suffix.lower() != ".safetensors" or safetensors_kind(p) is None)]
        elif path.exists():
            found.append(path)
        else:
            raise GleakError(f"{path}: no such file or directory")
    if not found:
        hint = next((f" (global models saved by gleak.integrations are in {p / 'models'}: pass that folder)"
                     for p in paths if p.is_dir() and (p / "models").is_dir()), "")
        raise GleakError("no model files found in " + ", ".join(str(p) for p in paths) + hint)
    return found


@dataclass
class ModelSet:
    """The models given, loaded once, indexed by the tensor hash captures record (gleak.model.sha256)."""

    models: list[tuple[Path, LoadedModel]]
    # aux-set forwards shared by every capture audited with the same model, aux data and forward mode
    forward_cache: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, paths: Sequence[Path], config: AuditConfig) -> ModelSet:
        return cls([(p, load_model(p, config.arch, config.arch_kwargs, config.trust_pickle)) for p in paths])

    def match(self, capture: Capture) -> tuple[Path, LoadedModel]:
        recorded = capture.get("gleak.model.sha256")
        if recorded is not None:
            for path, loaded in self.models:
                if loaded.weights_sha256 == recorded:
                    return path, loaded
            if len(self.models) == 1:
                return self.models[0]  # build_context then refuses it unless --allow-model-mismatch
            raise GleakError(f"none of the {len(self.models)} models has the weights this capture was made with "
                             f"(gleak.model.sha256 {recorded[:12]}…)")
        if len(self.models) == 1:
            return self.models[0]
        raise GleakError("the capture records no gleak.model.sha256 and several models were given: audit it "
                         "with its one model")


def _aux_fits(data: Dataset, ctx_shape: tuple[int, ...] | None, num_classes: int) -> bool:
    if ctx_shape is not None and tuple(data.input_shape) != tuple(ctx_shape):
        return False
    try:
        data.check_classes(num_classes)  # the same check build_context makes
    except GleakError:
        return False
    return True


# ----------------------------------------------------------------------------------------------- running
def _entry(result: AttackResult, task: str, scores: dict[str, float | None] | None = None,
           options: dict[str, Any] | None = None) -> AttackEntry:
    counts = soft = None
    if result.status == "ok" and task == "labels":
        counts = [int(c) for c in result.labels.counts.tolist()]
        if result.labels.soft_label is not None:
            soft = [float(v) for v in result.labels.soft_label.tolist()]
    return AttackEntry(attack=result.attack, task=task, status=result.status,
                       seconds=round(result.seconds, 4), reason=result.reason, counts=counts, soft_label=soft,
                       scores=scores, options=options or result.options or {}, warnings=list(result.warnings),
                       confidence=result.confidence)


def _label_findings(report: CaptureReport, th: Thresholds) -> list[Finding]:
    scored = [a for a in report.attacks if a.task == "labels" and a.scores and "iacc" in a.scores]
    findings: list[Finding] = []
    if scored and report.chance is not None:
        best = max(scored, key=lambda a: a.scores["iacc"] or 0.0)  # type: ignore[index]
        iacc = float(best.scores["iacc"] or 0.0)  # type: ignore[index]
        chance = float(report.chance["iacc"])
        margin = iacc - chance
        exact = float((best.scores or {}).get("exact") or 0.0)
        severity, threshold = _label_severity(iacc, chance, th, exact=exact >= 1.0)
        if severity is not None:
            findings.append(Finding(
                rule="GLEAK-LABELS", severity=severity, capture=report.capture.path, attack=best.attack,
                title=f"{best.attack} recovers {iacc:.0%} of the batch's labels (chance {chance:.0%})",
                measured=round(iacc, 4), metric="iacc", chance=round(chance, 4), threshold=round(threshold, 4),
                detail=f"margin over random guessing {margin:+.3f}; exact-count accuracy {exact:.3f}"))
    soft = [a for a in report.attacks if a.scores and a.scores.get("soft_success") == 1.0]
    if soft:
        a = soft[0]
        findings.append(Finding(
            rule="GLEAK-SOFT-LABEL", severity="high", capture=report.capture.path, attack=a.attack,
            title=f"{a.attack} recovers the example's soft label (L1 {a.scores['soft_l1']:.1e})",  # type: ignore[index]
            measured=a.scores["soft_l1"], metric="soft_l1", threshold=1e-3,  # type: ignore[index]
            detail="success criterion of Wang, Liang & He (ICLR 2024): L1 distance below 1e-3"))
    if not scored:
        expected = _expected_finding(report, th)
        if expected is not None:
            findings.append(expected)
        ok = [a for a in report.attacks if a.task == "labels" and a.status == "ok" and a.counts is not None]
        groups: dict[tuple[int, ...], list[str]] = {}
        for a in ok:
            groups.setdefault(tuple(a.counts or ()), []).append(a.attack)
        agreeing = max(groups.values(), key=len, default=[])
        if len(agreeing) >= 2:
            findings.append(Finding(
                rule="GLEAK-LABELS-AGREE", severity="info", capture=report.capture.path, attack=agreeing[0],
                title=f"{len(agreeing)} of {len(ok)} label attacks agree on the same label counts",
                measured=round(len(agreeing) / len(ok), 4), metric="agreement",
                detail=f"{', '.join(agreeing)}; without ground truth, agreement is not proof of a leak"))
    return findings


def _label_severity(iacc: float, chance: float, th: Thresholds, exact: bool) -> tuple[Severity | None, float]:
    """The GLEAK-LABELS ladder: critical (every label exactly), high (iAcc ≥ labels_high), then margins over chance;
    (None, 0) below the low margin."""
    if exact and iacc >= th.labels_critical:
        return "critical", th.labels_critical
    if iacc >= th.labels_high:
        return "high", th.labels_high
    if iacc - chance >= th.labels_medium_margin:
        return "medium", chance + th.labels_medium_margin
    if iacc - chance >= th.labels_low_margin:
        return "low", chance + th.labels_low_margin
    return None, 0.0


def _expected_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """Without truth: the best informative attack's iAcc on batches simulated like this capture's (calibrated
    confidence), judged by the GLEAK-LABELS thresholds; never critical (exactness needs the truth)."""
    from gleak.attacks.labels.confidence import best_informative

    calibrated = {a.attack: a for a in report.attacks if a.task == "labels" and a.status == "ok" and a.confidence
                  and a.confidence.get("calibrated")}
    name = best_informative({n: a.confidence or {} for n, a in calibrated.items()})
    if name is None:
        return None
    best, conf = calibrated[name], calibrated[name].confidence or {}
    iacc, chance = float(conf["expected_iacc"]), float(conf["chance_iacc"])
    severity, threshold = _label_severity(iacc, chance, th, exact=False)
    if severity is None:
        return None
    return Finding(
        rule="GLEAK-LABELS-EXPECTED", severity=severity, capture=report.capture.path, attack=best.attack,
        title=f"{best.attack} is expected to recover {iacc:.0%} of the labels (chance {chance:.0%}), measured on "
              f"{conf['simulations']} batches simulated like this one",
        measured=round(iacc, 4), metric="expected_iacc", chance=round(chance, 4), threshold=round(threshold, 4),
        detail=f"no ground truth; {100 * conf['level']:.0f} % count intervals ±{conf['half_width']} per class")


def _image_finding(report: CaptureReport, entry: AttackEntry, baseline: float, th: Thresholds) -> Finding | None:
    psnr = (entry.scores or {}).get("psnr")
    if psnr is None:
        return None
    severity: Severity | None = None
    threshold = 0.0
    if psnr >= th.image_critical_psnr:
        severity, threshold = "critical", th.image_critical_psnr
    elif psnr >= th.image_high_psnr:
        severity, threshold = "high", th.image_high_psnr
    elif psnr >= baseline + th.image_medium_margin:
        severity, threshold = "medium", baseline + th.image_medium_margin
    elif psnr >= baseline + th.image_low_margin:
        severity, threshold = "low", baseline + th.image_low_margin
    if severity is None:
        return None
    ssim = (entry.scores or {}).get("ssim")
    return Finding(rule="GLEAK-IMAGES", severity=severity, capture=report.capture.path, attack=entry.attack,
                   title=f"{entry.attack} reconstructs the inputs at {psnr:.1f} dB PSNR", measured=round(psnr, 3),
                   metric="psnr", chance=round(baseline, 3), threshold=round(threshold, 3),
                   detail=f"SSIM {ssim:.3f}; no-attack baseline {baseline:.2f} dB" if ssim is not None else None)


def _reconstruction_plan(ctx: Context, budget: str) -> tuple[str | None, int | None, str | None]:
    """(attack, iterations or None for its default, why nothing runs) for ``budget``."""
    fcn = get_attack("fcn")
    if fcn.not_applicable(ctx) is None:
        return "fcn", None, None
    if budget == "quick":
        return None, None, ("reconstruction skipped (budget quick: analytic attacks only; fcn does not apply: "
                            f"{fcn.not_applicable(ctx)})")
    name = "feature" if ctx.batch_size == 1 else "ig"
    reason = get_attack(name).not_applicable(ctx)
    if reason:
        return None, None, f"reconstruction skipped ({name} does not apply: {reason})"
    if budget == "standard":
        return name, STANDARD_ITERATIONS["lbfgs" if name == "feature" else "adam"], None
    return name, None, None


def _reconstruct(ctx: Context, truth: Truth | None, config: AuditConfig, out_dir: Path | None,
                 stem: str) -> tuple[AttackEntry | None, float | None, str | None]:
    """Run the budget's reconstruction; (entry, baseline PSNR or None, why skipped)."""
    from gleak.attacks.reconstruct.base import to_pixels
    from gleak.attacks.reconstruct.inputs import prepare

    budget, lpips = config.budget, config.lpips
    name, iterations, skipped = _reconstruction_plan(ctx, budget)
    if name is None:
        return None, None, skipped
    attack = get_attack(name)
    try:
        prepared = prepare(ctx, "auto", truth, want_feature=name in ("feature", "fcn"))
    except GleakError as e:
        return None, None, f"reconstruction skipped (no labels to reconstruct with: {e})"
    user = config.options.get(name, {})
    attack.configure(user)
    if iterations is not None and "iterations" not in user:  # the budget's bound, unless -O set it
        attack.options.iterations = iterations  # type: ignore[attr-defined]
    attack.options.targets = prepared.targets  # type: ignore[attr-defined]
    attack.options.feature = prepared.feature  # type: ignore[attr-defined]
    result = run_attack(attack, ctx)
    options = {**(result.options or {}), "labels": prepared.source}
    if result.status != "ok":
        return _entry(result, "reconstruct", options=options), None, None
    images = result.images.images
    if images is None:  # the budget plans gradient-matching and analytic attacks only; they always make images
        raise TypeError(f"{name} returned no images")
    if not bool(torch.isfinite(images).all()):
        result.status, result.reason, result.output = "failed", "non-finite pixels (diverged)", None
        return _entry(result, "reconstruct", options=options), None, None
    scores: dict[str, float | None] | None = None
    baseline = None
    artifacts: list[str] = []
    if truth is not None:
        try:
            scored = score_reconstruction(ctx, images, truth, lpips)
        except GleakError:
            scored = None  # truth of another shape: the images are reported unscored
        if scored is not None:
            mean = scored.metrics["mean"]
            scores = {"psnr": _finite(mean.get("psnr")), "ssim": _finite(mean.get("ssim")),
                      "lpips": _finite(mean.get("lpips"))}
            baseline, images = scored.baseline_psnr, scored.images
    if out_dir is not None:
        from gleak.io import write_bytes_atomic
        from gleak.report.images import grid, png_bytes

        rows = [to_pixels(ctx, truth.inputs), images] if truth is not None and scores is not None else [images]
        relative = Path("captures") / stem / f"{name}_grid.png"
        write_bytes_atomic(out_dir / relative, png_bytes(grid(rows)), force=True)
        artifacts.append(relative.as_posix())
    entry = _entry(result, "reconstruct", scores=scores, options=options)
    entry.artifacts = artifacts
    return entry, baseline, None


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value and abs(value) != float("inf") else None


def audit_capture(path: Path, models: ModelSet, auxes: Sequence[tuple[Path, Dataset]], config: AuditConfig,
                  out_dir: Path | None = None) -> tuple[CaptureReport, list[Finding], list[Notice]]:
    """Audit one capture file; bad input becomes an error entry (never an exception)."""
    started = time.perf_counter()
    report = CaptureReport(capture=FileRef(path=str(path)))
    try:
        report.capture.sha256 = file_sha256(path)
        capture = load_capture(path)
        model_path, loaded = models.match(capture)
        report.model = FileRef(path=str(model_path), sha256=loaded.weights_sha256 or None)
        truth_file = truth_path_for(path)
        truth = load_truth(truth_file, capture) if truth_file.exists() else None
        if truth is not None:
            report.truth = FileRef(path=str(truth_file), sha256=file_sha256(truth_file))
    except GleakError as e:
        return _error(report, e, started), [], []
    report.stage_seconds = {"load": round(time.perf_counter() - started, 6)}
    return audit_loaded(capture, loaded, auxes, config, truth, out_dir, report=report, started=started,
                        cache=models.forward_cache)


def audit_loaded(capture: Capture, loaded: LoadedModel, auxes: Sequence[tuple[Path, Dataset]],
                 config: AuditConfig, truth: Truth | None = None, out_dir: Path | None = None,
                 name: str | None = None, report: CaptureReport | None = None,
                 started: float | None = None,
                 cache: dict[tuple[Any, ...], dict[str, Any]] | None = None,
                 ) -> tuple[CaptureReport, list[Finding], list[Notice]]:
    """Audit a capture already in memory against its model (e.g. an update a server just received, from
    :mod:`gleak.integrations.flower`); ``name`` labels it in the report. Bad input becomes an error entry.
    ``cache`` (kept by the caller across captures) shares the auxiliary set's model forwards between captures
    made with the same model weights and forward mode."""
    started = time.perf_counter() if started is None else started
    label = str(capture.path) if name is None and capture.path is not None else (name or "<in memory>")
    report = report or CaptureReport(capture=FileRef(path=label))
    path = report.capture.path
    notices: list[Notice] = []
    stages = report.stage_seconds = dict(report.stage_seconds or {})
    mark = time.perf_counter()
    try:
        ctx = build_context(capture, loaded, None, resolve_device(config.device), config.seed,
                            allow_model_mismatch=config.allow_model_mismatch)
        aux = next(((p, d) for p, d in auxes if _aux_fits(d, ctx.input_shape, ctx.num_classes)), None)
        if aux is not None:  # _aux_fits made build_context's aux checks (shape, classes): attach it
            shared: dict[str, Any] = {}
            if cache is not None and loaded.weights_sha256:
                key = (loaded.weights_sha256, str(aux[0]), id(aux[1]), ctx.batch_stats,
                       ctx.batch_size if ctx.batch_stats else None, ctx.seed, str(ctx.device))
                if key not in cache and len(cache) >= FORWARD_CACHE_ENTRIES:
                    cache.pop(next(iter(cache)))  # the oldest model's forwards
                shared = cache.setdefault(key, {})
            ctx = dataclasses.replace(ctx, aux=aux[1], _cache=shared)
            report.aux = FileRef(path=str(aux[0]), sha256=_aux_sha256(aux[0]))
        if truth is not None:
            where = f"ground truth {report.truth.path}" if report.truth is not None else "ground truth"
            truth.check(ctx.num_classes, ctx.total_examples, where)
    except GleakError as e:
        return _error(report, e, started), [], notices
    stages["context"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    report.kind, report.batch_size, report.local_steps = ctx.kind, ctx.batch_size, ctx.local_steps
    report.num_classes, report.last_layer = ctx.num_classes, ctx.layer.name
    report.loss = {"name": ctx.loss.name, "reduction": ctx.loss.reduction, "label_smoothing": ctx.loss.label_smoothing,
                   "temperature": ctx.loss.temperature}
    report.model_mode = ctx.mode_note
    report.assumptions = _assumptions(ctx, capture)
    counts = truth_counts(truth.labels, ctx.num_classes) if truth is not None else None
    soft_truth = None
    if truth is not None and ctx.total_examples == 1:
        lab = truth.labels
        soft_truth = (lab[0].double() if lab.dim() == 2
                      else torch.nn.functional.one_hot(lab[0], ctx.num_classes).double())
    if counts is not None:
        report.truth_counts = [int(c) for c in counts.tolist()]
        report.chance = chance_scores(counts)
    else:
        notices.append(Notice(code="NO_TRUTH", capture=path, message=(
            "no ground truth next to the capture: recovered labels are reported, but leakage cannot be scored "
            "(gleak simulate and the capture helpers write NAME.truth.safetensors)")))
    # the same planning, running and scoring as `gleak labels` (gleak.attacks.plan)
    label_attacks = sorted(select_attacks("labels", None), key=lambda a: a.name)
    for label_attack in label_attacks:
        label_attack.configure(config.options.get(label_attack.name, {}))
    simulations = config.confidence if counts is None and ctx.aux is not None else 0
    calibration_cache = cache.setdefault(("confidence",), {}) if cache is not None and simulations else None
    for result in run_label_attacks(ctx, label_attacks, counts, None, soft_truth, simulations, calibration_cache):
        report.attacks.append(_entry(result, "labels", dict(result.scores) if result.scores is not None else None))
        if result.status == "not_applicable":
            report.skipped.append(f"{result.attack}: {result.reason}")
    findings = _label_findings(report, config.thresholds)
    stages["labels"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    entry, baseline, skipped = _reconstruct(ctx, truth, config, out_dir, _stem(Path(path)))
    if skipped:
        report.skipped.append(skipped)
        notices.append(Notice(code="RECONSTRUCTION_SKIPPED", capture=path, message=skipped))
    notices += _notices(ctx, report, path, bool(auxes))
    if entry is not None:
        report.attacks.append(entry)
        if baseline is not None:
            image = _image_finding(report, entry, baseline, config.thresholds)
            if image is not None:
                findings.append(image)
    stages["reconstruction"] = round(time.perf_counter() - mark, 6)
    report.seconds = round(time.perf_counter() - started, 3)
    return report, findings, notices


def _error(report: CaptureReport, error: GleakError, started: float) -> CaptureReport:
    report.status, report.error = "error", shorten(str(error), 600)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


@functools.lru_cache(maxsize=64)
def _aux_sha256(path: Path) -> str:
    """The aux file's hash, once per process (the same file is attached to every capture it fits)."""
    return file_sha256(path)


NOTICE_CODES = {
    "NO_TRUTH": "no ground truth beside the capture: recovered values are reported, not scored",
    "NO_AUX": "no auxiliary data fits the capture's model: attacks that need it did not run",
    "NO_MODEL_HASH": "the capture records no gleak.model.sha256: the model could not be verified",
    "MODEL_MISMATCH_ALLOWED": "the model's weights differ from the capture's (--allow-model-mismatch)",
    "ATTACK_FAILED": "an attack could not finish on this input (its reason says why)",
    "ATTACK_ERROR": "an attack raised an unexpected error (recorded; the audit went on)",
    "RECONSTRUCTION_SKIPPED": "the budget's reconstruction did not run (the message says why)",
    "LABELS_UNINFORMATIVE": "without truth, no label attack beats chance on batches simulated like this capture's",
}


def _notices(ctx: Context, report: CaptureReport, capture: str, aux_given: bool) -> list[Notice]:
    """Warnings with stable codes (:data:`NOTICE_CODES`) about one audited capture."""
    out: list[Notice] = []
    if report.aux is None:
        out.append(Notice(code="NO_AUX", capture=capture, message=(
            "none of the --aux data fits this capture's model (input shape and classes)" if aux_given else
            "no --aux data given: attacks that need it (e.g. posterior, rlu, llg-plus, zlg-plus) did not run")))
    check = ctx.model_check
    if check is not None and check.status == "not_recorded":
        out.append(Notice(code="NO_MODEL_HASH", capture=capture, message=NOTICE_CODES["NO_MODEL_HASH"]))
    if check is not None and check.status == "mismatch_allowed":
        out.append(Notice(code="MODEL_MISMATCH_ALLOWED", capture=capture,
                          message=NOTICE_CODES["MODEL_MISMATCH_ALLOWED"]))
    calibrated = [a for a in report.attacks if a.confidence and a.confidence.get("calibrated")]
    if calibrated and not any((a.confidence or {}).get("informative") for a in calibrated):
        out.append(Notice(code="LABELS_UNINFORMATIVE", capture=capture, message=(
            f"none of the {len(calibrated)} label attacks beats chance on both the uniform and the skewed batches "
            "simulated like this capture's: their counts are no evidence of a leak at this model and setting")))
    for a in report.attacks:
        if a.status in ("failed", "error"):
            out.append(Notice(code=f"ATTACK_{a.status.upper()}", capture=capture,
                              message=f"{a.attack}: {a.reason or a.status}"))
    return out


def _stem(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:60]
    return f"{safe}-{digest}"


def _assumptions(ctx: Context, capture: Capture) -> list[str]:
    out = [f"kind {ctx.kind}: {ctx.gradient_note or 'read as captured'}",
           f"loss {ctx.loss.name} ({ctx.loss.reduction}), label smoothing {ctx.loss.label_smoothing:g}, "
           f"temperature {ctx.loss.temperature:g}",
           f"B = {ctx.batch_size}, m = {ctx.local_steps}, C = {ctx.num_classes}, last layer '{ctx.layer.name}'"]
    if ctx.mode_note:
        out.append(f"model {ctx.mode_note}")
    read = sorted(k for k in capture.meta if k.startswith("gleak."))
    out.append(f"metadata read: {', '.join(read)}" if read else "no gleak.* metadata")
    return out


def run_audit(captures: Sequence[Path], model_paths: Sequence[Path], aux_paths: Sequence[Path],
              config: AuditConfig, out_dir: Path | None = None,
              progress: Callable[[int, int, Path], None] | None = None, jobs: int = 1,
              executor: str = "local", address: str | None = None) -> Report:
    """Audit every capture under ``captures`` against the models and aux data given; the whole report.

    ``executor`` ``local`` audits in this process, or with ``jobs`` > 1 in that many worker processes (spawned,
    the same torch thread count, each loading the models and aux data once); ``ray`` audits on a Ray cluster
    (:mod:`gleak.executors.ray`). The report keeps the captures' order either way; captures are read one at a
    time, so memory does not grow with their number."""
    from gleak.executors import WorkerSetup, run_captures

    started = time.perf_counter()
    files = find_captures(captures)
    model_files = find_models(model_paths)
    report = Report(gleak_version=__version__, command=list(config.command), budget=config.budget,
                    fail_on=config.fail_on, seed=config.seed, device=str(resolve_device(config.device)),
                    threads=torch.get_num_threads(), thresholds=config.thresholds, jobs=jobs, executor=executor)
    setup = WorkerSetup(tuple(model_files), tuple(aux_paths), config, torch.get_num_threads())
    results: list[CaptureResult | None] = [None] * len(files)
    for done, (i, result) in enumerate(run_captures(files, setup, out_dir, executor, jobs, address)):
        results[i] = result
        if progress is not None:
            progress(done, len(files), files[i])
    for entry in results:
        assert entry is not None
        report.captures.append(entry[0])
        report.findings += entry[1]
        report.notices += entry[2]
    report.seconds = round(time.perf_counter() - started, 3)
    return report
