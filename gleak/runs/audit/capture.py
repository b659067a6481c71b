"""Auditing one capture: open it (or take it from memory), build its Context with the auxiliary data that fits,
run and score the label attacks as ``gleak labels`` does, run the budget's reconstruction as ``gleak
reconstruct`` does, and turn the scores into findings and notices. Bad input becomes an error entry, never an
exception, so that one bad file does not stop an audit."""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from gleak.attacks import Context, build_context, get_attack
from gleak.attacks.base import AttackResult
from gleak.attacks.consistency import batch_size_conflicts
from gleak.attacks.labels.confidence import CalibrationCache
from gleak.attacks.plan import run_label_attacks, select_attacks
from gleak.capture import Capture, TextTruth, Truth, load_capture, load_text_truth, load_truth, truth_path_for
from gleak.data.images import Dataset
from gleak.data.text import TextData, check_token_batch_fits
from gleak.defenses import recorded_defenses
from gleak.errors import GleakError, shorten
from gleak.io import companion_exists, file_sha256
from gleak.metrics.labels import chance_scores, truth_counts
from gleak.models import LoadedModel
from gleak.report.model import AttackEntry, CaptureReport, EpsilonTerms, FileRef, Finding, Notice
from gleak.report.privacy import terms_of
from gleak.runs.audit.coverage import image_coverage, label_coverage, not_assessed_findings
from gleak.runs.audit.expected import expected_images, not_expected_reason
from gleak.runs.audit.findings import expected_image_finding, image_finding, label_findings, notices_for
from gleak.runs.audit.server import ModelChecks, server_findings
from gleak.runs.audit.setup import (
    FORWARD_CACHE_ENTRIES,
    STANDARD_ITERATIONS,
    AuditConfig,
    ModelSet,
    budget_deadline,
    pick_aux,
    pick_text_aux,
)
from gleak.runs.audit.text import audit_text
from gleak.runs.inputs import resolve_device, soft_truth
from gleak.runs.reconstruct import auto_attack, reconstruct
from gleak.runs.scoring import NO_LINEUP, finite, identification_of
from gleak.timebox import current, running

CaptureResult = tuple[CaptureReport, list[Finding], list[Notice]]


def _epsilon(capture: Capture) -> tuple[float | None, EpsilonTerms | None]:
    """The ε a DP-SGD capture records, with its terms (gleak.dp.*); (None, None) without one."""
    terms = terms_of(capture.meta)
    return (float(capture.meta["gleak.dp.epsilon"]), terms) if terms is not None else (None, None)


def audit_capture(path: Path, models: ModelSet, auxes: Sequence[tuple[Path, Dataset | TextData]], config: AuditConfig,
                  out_dir: Path | None = None) -> CaptureResult:
    """Audit one capture file; bad input becomes an error entry (never an exception)."""
    started = time.perf_counter()
    report = CaptureReport(capture=FileRef(path=str(path)))
    try:
        report.capture.sha256 = file_sha256(path)
        capture = load_capture(path)
        report.round, report.client = capture.get("gleak.fl.round"), capture.get("gleak.fl.client_id")
        report.defense = recorded_defenses(capture) or None
        report.epsilon, report.epsilon_terms = _epsilon(capture)
        model_path, loaded = models.match(capture)
        report.model = FileRef(path=str(model_path), sha256=loaded.weights_sha256 or None)
        truth_file = truth_path_for(path)
        text = capture.get("gleak.modality") == "text"
        truth: Truth | TextTruth | None = None
        if companion_exists(truth_file):
            truth = load_text_truth(truth_file, capture) if text else load_truth(truth_file, capture)
            report.truth = FileRef(path=str(truth_file), sha256=file_sha256(truth_file))
    except GleakError as e:
        return _error(report, e, started), [], []
    report.stage_seconds = {"load": round(time.perf_counter() - started, 6)}
    return audit_loaded(capture, loaded, auxes, config, truth, out_dir, report=report, started=started,
                        cache=models.forward_cache, calibration_cache=models.calibration_cache,
                        model_checks=models.model_checks,
                        model_folder=model_path if text else None)


def audit_loaded(capture: Capture, loaded: LoadedModel, auxes: Sequence[tuple[Path, Dataset | TextData]],
                 config: AuditConfig, truth: Truth | TextTruth | None = None, out_dir: Path | None = None,
                 name: str | None = None, report: CaptureReport | None = None,
                 started: float | None = None,
                 cache: dict[tuple[Any, ...], dict[str, Any]] | None = None,
                 calibration_cache: CalibrationCache | None = None,
                 model_folder: Path | None = None,
                 model_checks: ModelChecks | None = None,
                 ) -> CaptureResult:
    """Audit a capture already in memory against its model (e.g. an update a server just received, from
    :mod:`gleak.integrations.flower`); ``name`` labels it in the report. Bad input becomes an error entry.
    ``cache`` (kept by the caller across captures) shares the auxiliary set's model forwards between captures
    made with the same model weights and forward mode; ``calibration_cache`` (the caller's too, bounded) shares
    the label attacks' calibrations (``config.confidence``) between them; None: each capture calibrates afresh.
    A config not yet :meth:`~gleak.runs.audit.AuditConfig.resolved` is resolved here, for this capture.

    A language model's capture (``gleak.modality`` text, its truth a :class:`~gleak.capture.TextTruth`) gets the
    token attacks instead (:func:`gleak.runs.audit.text.audit_text`): ``model_folder``, the Hugging Face folder,
    lends its tokenizer to count the sensitive tokens recovered; the report never holds decoded text.

    Everything runs under the budget's deadline (:func:`~gleak.runs.audit.setup.budget_deadline`, also
    ``ctx.deadline``): an attack that reaches its share stops and says so in its reason."""
    started = time.perf_counter() if started is None else started
    config = config.resolved()
    # the budget's time counts from when this capture was opened (``started``)
    with running(budget_deadline(config.budget, config.time_limit, time.perf_counter() - started)):
        return _audit_loaded(capture, loaded, auxes, config, truth, out_dir, name, report, started, cache,
                             calibration_cache, model_folder, model_checks)


def _audit_loaded(capture: Capture, loaded: LoadedModel, auxes: Sequence[tuple[Path, Dataset | TextData]],
                  config: AuditConfig, truth: Truth | TextTruth | None, out_dir: Path | None, name: str | None,
                  report: CaptureReport | None, started: float, cache: dict[tuple[Any, ...], dict[str, Any]] | None,
                  calibration_cache: CalibrationCache | None, model_folder: Path | None,
                  model_checks: ModelChecks | None) -> CaptureResult:
    label = str(capture.path) if name is None and capture.path is not None else (name or "<in memory>")
    report = report or CaptureReport(capture=FileRef(path=label), round=capture.get("gleak.fl.round"),
                                     client=capture.get("gleak.fl.client_id"),
                                     defense=recorded_defenses(capture) or None)
    if report.epsilon is None:
        report.epsilon, report.epsilon_terms = _epsilon(capture)
    path = report.capture.path
    notices: list[Notice] = []
    stages = report.stage_seconds = dict(report.stage_seconds or {})
    mark = time.perf_counter()
    try:
        ctx = build_context(capture, loaded, None, resolve_device(config.device), config.seed,
                            allow_model_mismatch=config.allow_model_mismatch,
                            max_memory=config.memory_limit)
        ctx.deadline = current()
        if ctx.text_model is not None and isinstance(truth, TextTruth):  # ids and lengths the model can take
            check_token_batch_fits(truth.input_ids, truth.attention_mask, ctx.text_model.vocab_size,
                                   ctx.text_model.n_positions, "the ground truth")
        if ctx.text_model is not None or isinstance(truth, TextTruth):
            text = _audit_text(ctx, truth, config, report, started, stages, mark, model_folder,
                               pick_text_aux(auxes))
            model = report.model.path if report.model else loaded.source
            return text[0], server_findings(loaded, path, model, model_checks) + text[1], text[2]
        aux = pick_aux(auxes, ctx.input_shape, ctx.num_classes)
        if aux is not None:
            ctx = ctx.with_aux(aux[1], _shared_forwards(cache, loaded, aux, ctx))
            report.aux = FileRef(path=str(aux[0]), sha256=_aux_sha256(aux[0]))
        if truth is not None:
            where = f"ground truth {report.truth.path}" if report.truth is not None else "ground truth"
            truth.check(ctx.num_classes, ctx.total_examples, where)
    except GleakError as e:
        return _error(report, e, started), [], notices
    stages["context"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    findings = server_findings(loaded, path, report.model.path if report.model else loaded.source, model_checks)
    stages["model_check"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    report.kind, report.batch_size, report.local_steps = ctx.kind, ctx.batch_size, ctx.local_steps
    report.num_classes, report.last_layer = ctx.num_classes, ctx.layer.name
    report.loss = {"name": ctx.loss.name, "reduction": ctx.loss.reduction, "label_smoothing": ctx.loss.label_smoothing,
                   "temperature": ctx.loss.temperature}
    report.model_mode = ctx.mode_note
    report.assumptions = _assumptions(ctx, capture)
    for conflict in batch_size_conflicts(ctx):
        report.assumptions.append(f"batch size contradicted by the tensors: {conflict}")
        notices.append(Notice(code="BATCH_SIZE_CONTRADICTED", capture=path, message=(
            f"{conflict}: recovered counts are scaled to the recorded batch size and may be wrong; check "
            "gleak.batch_size / gleak.local_steps")))
    counts = truth_counts(truth.labels, ctx.num_classes) if truth is not None else None
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
        label_attack.configure(config.attack_options(label_attack.name))
    simulations = config.confidence if counts is None and ctx.aux is not None else 0
    for result in run_label_attacks(ctx, label_attacks, counts, None, soft_truth(ctx, truth), simulations,
                                    calibration_cache if simulations else None, combine=simulations > 0):
        report.attacks.append(_entry(result, "labels", dict(result.scores) if result.scores is not None else None))
        if result.status == "not_applicable":
            report.skipped.append(f"{result.attack}: {result.reason}")
    findings += label_findings(report, config.thresholds)
    stages["labels"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    name, bounds, skipped = reconstruction_plan(ctx, config.budget)
    entry, lpips_unavailable = None, None
    if name is not None:
        entry, skipped, lpips_unavailable = _reconstruct(ctx, truth, config, out_dir, _stem(Path(path)), name, bounds)
    if lpips_unavailable:
        notices.append(Notice(code="LPIPS_UNAVAILABLE", capture=path,
                              message=f"LPIPS ({config.lpips}) not computed: {lpips_unavailable}"))
    if skipped:
        report.skipped.append(skipped)
        notices.append(Notice(code="RECONSTRUCTION_SKIPPED", capture=path, message=skipped))
    if entry is not None:
        report.attacks.append(entry)
        if truth is not None and entry.scores and entry.identification is None:
            notices.append(Notice(code="IMAGES_NOT_IDENTIFIED", capture=path, message=NO_LINEUP))
        image = image_finding(report, entry, config.thresholds)
        if image is not None:
            findings.append(image)
    stages["reconstruction"] = round(time.perf_counter() - mark, 6)
    if truth is None and (entry is None or entry.status != "ok") and config.budget == "quick":
        why = not_expected_reason(ctx, config)  # says the budget skips it
        if why:
            notices.append(Notice(code="IMAGES_NOT_EXPECTED", capture=path, message=why))
    expected_why = None
    if truth is None and entry is not None and entry.status == "ok":
        mark = time.perf_counter()
        report.expected_images, expected_why = expected_images(ctx, config, entry.attack, bounds)
        if expected_why:
            report.skipped.append(expected_why)
            notices.append(Notice(code="IMAGES_NOT_EXPECTED", capture=path, message=expected_why))
        expected = expected_image_finding(report, config.thresholds)
        if expected is not None:
            findings.append(expected)
        stages["expected_images"] = round(time.perf_counter() - mark, 6)
    report.coverage = [label_coverage(report), image_coverage(report, entry, skipped, truth is not None,
                                                              name is None and config.budget == "quick", expected_why)]
    findings += not_assessed_findings(report, config.accept_unassessed)
    notices += notices_for(ctx, report, path, bool(auxes))
    report.seconds = round(time.perf_counter() - started, 3)
    return report, findings, notices


def _audit_text(ctx: Context, truth: Truth | TextTruth | None, config: AuditConfig, report: CaptureReport,
                started: float, stages: dict[str, float], mark: float, model_folder: Path | None,
                text_aux: tuple[Path, TextData] | None = None) -> CaptureResult:
    """A language model's capture, once its context is built: the token attacks (:mod:`gleak.runs.audit.text`)."""
    if ctx.text_model is None or isinstance(truth, Truth):
        where = report.truth.path if report.truth is not None else "the ground truth"
        return _error(report, GleakError(f"{where} does not fit the capture: "
                                         + ("a language model's capture needs the token batches it was made from"
                                            if ctx.text_model is not None else "it holds token batches, the capture "
                                            "is an image classifier's")), started), [], []
    stages["context"] = round(time.perf_counter() - mark, 6)
    try:
        findings, notices = audit_text(ctx, truth, config, report, model_folder, text_aux)
    except GleakError as e:
        return _error(report, e, started), [], []
    report.seconds = round(time.perf_counter() - started, 3)
    return report, findings, notices


def _shared_forwards(cache: dict[tuple[Any, ...], dict[str, Any]] | None, loaded: LoadedModel,
                     aux: tuple[Path, Dataset], ctx: Context) -> dict[str, Any] | None:
    """The forward cache shared by captures of the same model weights, aux data and forward mode (the oldest
    combination evicted past :data:`FORWARD_CACHE_ENTRIES`); None (a fresh one) without a cache or a hash."""
    if cache is None or not loaded.weights_sha256:
        return None
    key = (loaded.weights_sha256, str(aux[0]), id(aux[1]), ctx.batch_stats,
           ctx.batch_size if ctx.batch_stats else None, ctx.seed, str(ctx.device))
    if key not in cache and len(cache) >= FORWARD_CACHE_ENTRIES:
        cache.pop(next(iter(cache)))  # the oldest model's forwards
    return cache.setdefault(key, {})


def reconstruction_plan(ctx: Context, budget: str) -> tuple[str | None, dict[str, int], str | None]:
    """(attack, the budget's option bounds, why nothing runs) for ``budget``: the automatic choice of ``gleak
    reconstruct`` (:func:`gleak.runs.reconstruct.auto_attack`), analytic only for ``quick``, bounded iterations
    for ``standard``, the attack's defaults for ``full``."""
    name = auto_attack(ctx)
    if name in ("imprint", "trap-weights", "fcn"):  # analytic and exact: every budget runs them
        return name, {}, None
    if budget == "quick":
        return None, {}, ("reconstruction skipped (budget quick: analytic attacks only; fcn does not apply: "
                          f"{get_attack('fcn').not_applicable(ctx)})")
    reason = get_attack(name).not_applicable(ctx)
    if reason:
        return None, {}, f"reconstruction skipped ({name} does not apply: {reason})"
    if budget == "standard":
        return name, {"iterations": STANDARD_ITERATIONS["lbfgs" if name == "feature" else "adam"]}, None
    return name, {}, None


def _reconstruct(ctx: Context, truth: Truth | None, config: AuditConfig, out_dir: Path | None, stem: str,
                 name: str, bounds: dict[str, int]) -> tuple[AttackEntry | None, str | None, str | None]:
    """Run the planned reconstruction (:func:`reconstruction_plan`) and, with truth, its identification lineup;
    (entry, why skipped, why LPIPS could not be computed)."""
    attack = get_attack(name, "reconstruct")
    attack.configure(config.attack_options(name, bounds))
    try:
        done = reconstruct(ctx, attack, "auto", truth, lpips=config.lpips)
    except GleakError as e:
        return None, f"reconstruction skipped (no labels to reconstruct with: {e})", None
    result = done.result
    options = {**(result.options or {}), "labels": done.prepared.source}
    if not done.ok:
        return _entry(result, "reconstruct", options=options), None, None
    if done.images is None:  # the budget plans gradient-matching and analytic attacks only; they always make images
        raise TypeError(f"{name} returned no images")
    scores: dict[str, float | None] | None = None
    artifacts: list[str] = []
    identification = lineup = lpips_unavailable = None
    if done.scored is not None and done.truth_pixels is not None and truth is not None:
        if config.lpips != "off":
            lpips_unavailable = done.scored.metrics["lpips_info"].get("unavailable")
        mean = done.scored.metrics["mean"]
        scores = {"psnr": finite(mean.get("psnr")), "ssim": finite(mean.get("ssim")),
                  "lpips": finite(mean.get("lpips"))}
        lineup = identification_of(ctx, done.images, done.truth_pixels, truth, config.lineup, config.seed)
        if lineup is not None:
            identification = lineup[0]
            scores = {"identification": round(identification.rate, 4),
                      "identification_chance": round(identification.chance, 4), **scores}
    if out_dir is not None:
        from gleak.io import write_bytes_atomic
        from gleak.report.images import grid, lineup_picture, png_bytes

        rows = [done.truth_pixels, done.images] if done.truth_pixels is not None else [done.images]
        relative = Path("captures") / stem / f"{name}_grid.png"
        write_bytes_atomic(out_dir / relative, png_bytes(grid(rows)), force=True)
        artifacts.append(relative.as_posix())
        if lineup is not None and done.truth_pixels is not None:
            ident, drawn = lineup
            picture = lineup_picture(done.images, done.truth_pixels, drawn.images, ident.matched, ident.scores)
            relative = Path("captures") / stem / f"{name}_lineup.png"
            write_bytes_atomic(out_dir / relative, png_bytes(picture), force=True)
            artifacts.append(relative.as_posix())
    entry = _entry(result, "reconstruct", scores=scores, options=options)
    entry.artifacts = artifacts
    if identification is not None:
        entry.identification = identification.to_json()
    return entry, None, lpips_unavailable


def _entry(result: AttackResult, task: Literal["labels", "reconstruct"], scores: dict[str, float | None] | None = None,
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


def _error(report: CaptureReport, error: GleakError, started: float) -> CaptureReport:
    report.status, report.error = "error", shorten(str(error), 600)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


@functools.lru_cache(maxsize=64)
def _aux_sha256(path: Path) -> str:
    """The aux file's hash, once per process (the same file is attached to every capture it fits)."""
    return file_sha256(path)


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
