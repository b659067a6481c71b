"""The audit's finding rules and notices: what a capture's scores mean, by documented thresholds.

Findings and their thresholds (defaults in :class:`~gleak.report.model.Thresholds`, documented in docs/audit.md):

* ``GLEAK-LABELS`` — the best label attack's iAcc (the instance-level accuracy of the recovered label counts,
  as in Ma et al., ICLR 2023, and Chen & Vikalo, ICML 2024): critical when every label is recovered exactly,
  high at iAcc ≥ 0.9, medium when it beats random guessing (the exact chance iAcc of the same batch) by ≥ 0.2,
  low by ≥ 0.05.
* ``GLEAK-SOFT-LABEL`` — the soft label of one example recovered within L1 < 1e-3, the success criterion of
  Wang, Liang & He (ICLR 2024): high.
* ``GLEAK-IMAGES`` — identification: each true image in a lineup with K distractors of its class, picked out
  by its reconstruction (:mod:`gleak.metrics.identification`); severity from identification over chance
  κ = (rate − chance) / (1 − chance): critical ≥ 0.9, high ≥ 0.6, medium ≥ 0.3, low ≥ 0.1, and only when the
  rate's 95 % interval lies above chance. PSNR, SSIM and LPIPS are reported beside it.
* ``GLEAK-IMAGES-EXPECTED`` (no ground truth, ``--aux``, standard or full budget) — the same ladder (never
  critical) on the identification of twin batches simulated like the capture's (:mod:`gleak.runs.audit.expected`).
* ``GLEAK-LABELS-AGREE`` (no ground truth) — independent label attacks that agree exactly: info, since only
  the truth can say whether they agree on the right answer.
* ``GLEAK-LABELS-EXPECTED`` (no ground truth, ``--aux`` and ``--confidence``) — the calibrated answer: the label
  attacks and their stacked combination calibrated together on batches simulated like the capture's, and the
  selector's choice among them (the best worst-case margin over chance); its expected iAcc with a 95 % interval
  against chance for batches drawn the same way (on the composition where its margin is smallest), by the
  GLEAK-LABELS ladder on that expectation; never critical.
* ``GLEAK-LABELS-ABSTAINED`` (no ground truth, ``--confidence``) — the selector abstains: no label attack nor their
  combination beats chance on batches simulated like the capture's. Info: an answer ("not recoverable here by
  these attacks"), neither a leak nor an error; it names the best candidate and its margin over chance per
  composition.
* ``GLEAK-TEXT-TOKENS`` (a language model's capture, with the truth's token batches) — the token attack (bag of
  input tokens, next-token counts) with the highest recall over the batch's distinct tokens, by the GLEAK-LABELS
  ladder and thresholds on recall: critical when the recovered set is exactly the batch's (recall and precision 1,
  ``labels_critical``), high at recall ≥ ``labels_high``, medium / low at recall − chance recall ≥ the label
  margins. Its message gives recall, chance and the share of sensitive tokens (a digit or a capital first letter)
  recovered — never the tokens' text.
* ``GLEAK-TEXT-TOKENS-EXPECTED`` (a language model's capture without truth, ``--aux`` text) — the same ladder (never
  critical) on the best token attack's mean recall over twin batches simulated like the capture's, with the range
  over the twins, precision and sensitive-token recall beside chance.
* ``GLEAK-NOT-ASSESSED`` — a threat that applies to the capture (labels and images; tokens and sentences) that no
  attack could measure, or whose applicable attack failed (:mod:`gleak.runs.audit.coverage`): high, so the default
  gate fails and the verdict is INCONCLUSIVE; info under ``--accept-unassessed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gleak.attacks.context import Context
from gleak.report.model import AttackEntry, CaptureReport, Finding, Notice, Severity, Thresholds, TokenResult


def label_findings(report: CaptureReport, th: Thresholds) -> list[Finding]:
    best = report.best_label()
    findings: list[Finding] = []
    if best is not None and report.chance is not None:
        best_scores = best.scores or {}
        iacc = float(best_scores["iacc"] or 0.0)
        chance = float(report.chance["iacc"])
        margin = iacc - chance
        exact = float(best_scores.get("exact") or 0.0)
        severity, threshold = label_severity(iacc, chance, th, exact=exact >= 1.0)
        if severity is not None:
            findings.append(Finding(
                rule="GLEAK-LABELS", severity=severity, capture=report.capture.path, attack=best.attack,
                title=f"{best.attack} recovers {iacc:.0%} of the batch's labels (chance {chance:.0%})",
                measured=round(iacc, 4), metric="iacc", chance=round(chance, 4), threshold=round(threshold, 4),
                detail=f"margin over random guessing {margin:+.3f}; exact-count accuracy {exact:.3f}"))
    soft = [(a, a.scores) for a in report.attacks if a.scores and a.scores.get("soft_success") == 1.0]
    if soft:
        a, s = soft[0]
        findings.append(Finding(
            rule="GLEAK-SOFT-LABEL", severity="high", capture=report.capture.path, attack=a.attack,
            title=f"{a.attack} recovers the example's soft label (L1 {s['soft_l1']:.1e})",
            measured=s["soft_l1"], metric="soft_l1", threshold=1e-3,
            detail="success criterion of Wang, Liang & He (ICLR 2024): L1 distance below 1e-3"))
    if best is None:
        expected = expected_finding(report, th)
        if expected is not None:
            findings.append(expected)
        abstained = abstained_finding(report)
        if abstained is not None:
            findings.append(abstained)
        ok = [a for a in report.attacks if a.task == "labels" and a.status == "ok" and a.counts is not None
              and a.attack != SELECTOR]  # the selector repeats a candidate's counts: no second vote
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


SELECTOR = "calibrated"  # the calibrated selector's entry (gleak.attacks.labels.calibrated)


def label_severity(iacc: float, chance: float, th: Thresholds, exact: bool) -> tuple[Severity | None, float]:
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


def calibrated_attacks(report: CaptureReport) -> dict[str, AttackEntry]:
    """The label attacks that ran and were calibrated on simulated batches (no truth, ``--confidence``), the
    selector's entry left out."""
    return {a.attack: a for a in report.attacks if a.task == "labels" and a.status == "ok" and a.confidence
            and a.confidence.get("calibrated") and a.attack != SELECTOR}


def selector_answer(report: CaptureReport) -> AttackEntry | None:
    """The calibrated selector's answer (counts or an abstention, with its calibration), when the audit made one."""
    return next((a for a in report.attacks if a.attack == SELECTOR and a.status in ("ok", "abstained")
                 and a.confidence and "expected_iacc" in a.confidence), None)


def _interval(conf: Mapping[str, Any]) -> str:
    """' [0.74, 0.88]' (the expected iAcc's 95 % interval), or nothing."""
    low_high = conf.get("expected_interval")
    return f" [{low_high[0]:.0%}, {low_high[1]:.0%}]" if low_high else ""


def _worst_margin(conf: Mapping[str, Any]) -> float:
    """The calibration's worst-case margin over chance (older reports without it: the mean margin)."""
    return float(conf.get("worst_margin", conf["expected_iacc"] - conf["chance_iacc"]))


def _composition(conf: Mapping[str, Any]) -> str:
    """'uniform batches' / 'dirichlet(0.5) batches' / 'simulated batches' (the composition the numbers are for)."""
    name = conf.get("composition")
    if not name:
        return "simulated batches"
    alpha = ((conf.get("by_composition") or {}).get(name) or {}).get("alpha")
    return f"{name}({alpha:g}) batches" if alpha is not None else f"{name} batches"


def _by_composition(conf: Mapping[str, Any]) -> str:
    """'uniform 0.808 vs chance 0.867, dirichlet 0.609 vs chance 0.544' (empty without per-composition numbers)."""
    by = conf.get("by_composition") or {}
    return ", ".join(f"{n} {m['expected_iacc']:.3f} vs chance {m['chance_iacc']:.3f}" for n, m in by.items())


def expected_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """Without truth: the best informative attack's iAcc on batches simulated like this capture's (calibrated
    confidence) against chance for batches drawn the same way, on the composition where its margin is smallest,
    judged by the GLEAK-LABELS thresholds; never critical (exactness needs the truth)."""
    from gleak.attacks.labels.confidence import best_informative

    selector = selector_answer(report)
    if selector is not None:
        if selector.status != "ok":
            return None  # abstained: abstained_finding says so
        conf = selector.confidence or {}
        attack, name = SELECTOR, f"{SELECTOR} ({conf.get('chosen', '?')})"
    else:  # an audit without the selector: the best informative single attack
        calibrated = calibrated_attacks(report)
        best_name = best_informative({n: a.confidence or {} for n, a in calibrated.items()})
        if best_name is None:
            return None
        conf, attack = calibrated[best_name].confidence or {}, best_name
        name = attack
    iacc, chance = float(conf["expected_iacc"]), float(conf["chance_iacc"])
    severity, threshold = label_severity(iacc, chance, th, exact=False)
    if severity is None:
        return None
    by = _by_composition(conf)
    return Finding(
        rule="GLEAK-LABELS-EXPECTED", severity=severity, capture=report.capture.path, attack=attack,
        title=f"{name} is expected to recover {iacc:.0%}{_interval(conf)} of the labels (chance {chance:.0%}) on "
              f"{_composition(conf)}, measured on {conf['simulations']} batches simulated like this one",
        measured=round(iacc, 4), metric="expected_iacc", chance=round(chance, 4), threshold=round(threshold, 4),
        detail=f"no ground truth; expected iAcc {iacc:.3f}{_interval(conf)} (95 % interval over the simulated "
               f"batches) vs chance {chance:.3f}; {100 * conf['level']:.0f} % count intervals ±{conf['half_width']} "
               "per class" + (f"; by composition: {by}" if by else ""))


def abstained_finding(report: CaptureReport) -> Finding | None:
    """Without truth: when label attacks were calibrated and none beats chance on batches simulated like this
    capture's, the audit's answer on the labels — it abstains (info; the best attack's margin over chance)."""
    from gleak.attacks.labels.confidence import best_informative

    selector = selector_answer(report)
    if selector is not None:
        if selector.status != "abstained":
            return None
        conf = selector.confidence or {}
        name = str(conf.get("attack", SELECTOR))
        considered = len(conf.get("expected_iacc_by_attack") or {}) or 1
    else:
        calibrated = calibrated_attacks(report)
        if not calibrated or best_informative({n: a.confidence or {} for n, a in calibrated.items()}) is not None:
            return None
        name = max(calibrated, key=lambda n: _worst_margin(calibrated[n].confidence or {}))
        conf, considered = calibrated[name].confidence or {}, len(calibrated)
    iacc, chance, margin = float(conf["expected_iacc"]), float(conf["chance_iacc"]), _worst_margin(conf)
    by = _by_composition(conf)
    return Finding(
        rule="GLEAK-LABELS-ABSTAINED", severity="info", capture=report.capture.path, attack=name,
        title=f"gleak abstains on the labels: no label attack beats chance on batches simulated like this one "
              f"(best of {considered}: {name}, {iacc:.0%} vs chance {chance:.0%} on {_composition(conf)})",
        measured=round(iacc, 4), metric="expected_iacc", chance=round(chance, 4),
        detail=f"worst-case margin over chance {margin:+.3f}" + (f" ({by})" if by else "")
               + f", on {conf['simulations']} simulated batches; the labels are not recoverable here by these "
               "attacks: not evidence of a leak, nor proof that none exists")


def token_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """GLEAK-TEXT-TOKENS: the best scored token attack's recall over chance (module docstring); None below the low
    margin or without a scored attack. Ids and numbers only: the tokens' text never enters a finding."""
    best = report.best_tokens()
    if best is None:
        return None
    scores = best.scores or {}
    recall, chance = float(scores["recall"]), float(scores["chance_recall"])
    precision = float(scores.get("precision", 0.0))
    severity, threshold = label_severity(recall, chance, th, exact=recall >= 1.0 and precision >= 1.0)
    if severity is None:
        return None
    what = {"inputs": "input tokens", "targets": "next tokens"}.get(best.truth or "", "tokens")
    sensitive = scores.get("sensitive_recall")
    shared = (f"{sensitive:.0%} of its sensitive ones (a digit or a capital: names, dates, record numbers)"
              if sensitive is not None else "sensitive tokens not counted (no tokenizer beside the model)")
    detail = (f"recall margin over chance {recall - chance:+.3f}; precision {precision:.3f} (chance "
              f"{scores.get('chance_precision', 0.0):.3f}), F1 {scores.get('f1', 0.0):.3f} (chance "
              f"{scores.get('chance_f1', 0.0):.3f}), count accuracy {scores.get('count_accuracy', 0.0):.3f} (chance "
              f"{scores.get('chance_count_accuracy', 0.0):.3f})")
    if sensitive is not None:
        detail += (f"; sensitive-token recall {sensitive:.3f} (chance "
                   f"{scores.get('chance_sensitive_recall', 0.0):.3f})")
    return Finding(
        rule="GLEAK-TEXT-TOKENS", severity=severity, capture=report.capture.path, attack=best.attack,
        title=f"{best.attack} recovers {recall:.0%} of the batch's distinct {what} (chance {chance:.0%}), "
              f"{shared}",
        measured=round(recall, 4), metric="token_recall", chance=round(chance, 4), threshold=round(threshold, 4),
        detail=detail + "; token ids only: the audit never shows decoded text")


def expected_token_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """GLEAK-TEXT-TOKENS-EXPECTED: without truth, the best token attack's mean recall on twin batches simulated like
    this capture's (``report.expected_tokens``), by the GLEAK-TEXT-TOKENS ladder on recall over chance; never
    critical (an expectation for batches like this one, not a measurement of this one)."""
    ex = report.expected_tokens
    if not ex:
        return None
    recall, chance = ex["recall"], ex.get("chance_recall", {"mean": 0.0})
    precision = ex.get("precision", {"mean": 0.0})
    severity, threshold = label_severity(float(recall["mean"]), float(chance["mean"]), th, exact=False)
    if severity is None:
        return None
    sensitive = ex.get("sensitive_recall")
    shared = (f", {sensitive['mean']:.0%} of their sensitive ones" if sensitive is not None
              else ", sensitive tokens not counted (no tokenizer beside the model)")
    twins = int(ex["twins"])
    interval = (f" (range {recall['min']:.0%}–{recall['max']:.0%} over {twins} twin batches)" if twins > 1
                else " (1 twin batch)")
    return Finding(
        rule="GLEAK-TEXT-TOKENS-EXPECTED", severity=severity, capture=report.capture.path, attack=str(ex["attack"]),
        title=f"batches like this one give away their tokens: {ex['attack']} recovers {recall['mean']:.0%} of a "
              f"twin batch's distinct tokens{interval} at precision {precision['mean']:.0%} (chance "
              f"{chance['mean']:.0%}){shared}",
        measured=round(float(recall["mean"]), 4), metric="expected_token_recall",
        chance=round(float(chance["mean"]), 4), threshold=round(threshold, 4),
        detail=f"no ground truth; {twins} twin batch{'es' if twins != 1 else ''} drawn from "
               f"{Path(str(ex.get('aux'))).name}, simulated like this capture (same model and adapter, B, length, "
               f"steps, learning rate and optimiser) and attacked the same way; precision {precision['mean']:.3f} "
               f"(range {precision['min']:.3f}–{precision['max']:.3f})"
               + (f", sensitive-token recall {sensitive['mean']:.3f} (range {sensitive['min']:.3f}–"
                  f"{sensitive['max']:.3f})" if sensitive is not None else "")
               + "; an expectation for this client's batches, not a measurement of this one; token ids only")


def image_severity(kappa: float, low: float, chance: float, th: Thresholds,
                   highest: Severity = "critical") -> tuple[Severity | None, float]:
    """The GLEAK-IMAGES ladder on identification over chance κ; nothing unless the rate's interval lies above
    chance (``low`` > ``chance``). ``highest`` caps it (an expectation is never critical)."""
    if low <= chance:
        return None, 0.0
    ladder: list[tuple[Severity, float]] = [("critical", th.image_critical), ("high", th.image_high),
                                            ("medium", th.image_medium), ("low", th.image_low)]
    for severity, threshold in ladder[[s for s, _ in ladder].index(highest):]:
        if kappa >= threshold:
            return severity, threshold
    return None, 0.0


def image_finding(report: CaptureReport, entry: AttackEntry, th: Thresholds) -> Finding | None:
    """GLEAK-IMAGES: the reconstructions' identification in their lineups (module docstring), with truth."""
    ident = entry.identification
    if not ident:
        return None
    kappa, (low, high), chance = float(ident["kappa"]), ident["interval"], float(ident["chance"])
    severity, threshold = image_severity(kappa, float(low), chance, th)
    if severity is None:
        return None
    scores = entry.scores or {}
    secondary = ", ".join(f"{k.upper()} {fmt.format(scores[k])}" for k, fmt in
                          (("psnr", "{:.1f} dB"), ("ssim", "{:.3f}"), ("lpips", "{:.3f}")) if scores.get(k) is not None)
    return Finding(
        rule="GLEAK-IMAGES", severity=severity, capture=report.capture.path, attack=entry.attack,
        title=f"{entry.attack} reconstructions identify {ident['identified']:g} of {ident['n']} inputs in lineups of "
              f"{ident['distractors'] + 1} (chance {chance:.0%})",
        measured=round(kappa, 4), metric="identification_kappa", chance=0.0, threshold=round(threshold, 4),
        detail=f"identification rate {ident['rate']:.2f}, {100 * ident['level']:.0f} % interval "
               f"[{low:.2f}, {high:.2f}], chance {chance:.2f}; κ = (rate − chance) / (1 − chance); distractors: "
               f"{ident['lineup']}; similarity {ident['similarity']}" + (f"; {secondary}" if secondary else ""))


def expected_image_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """GLEAK-IMAGES-EXPECTED: without truth, the identification of twin batches' reconstructions (never critical)."""
    exp = report.expected_images
    if not exp:
        return None
    kappa, (low, high), chance = float(exp["kappa"]), exp["interval"], float(exp["chance"])
    severity, threshold = image_severity(kappa, float(low), chance, th, highest="high")
    if severity is None:
        return None
    lo, hi = exp["predicted"]
    return Finding(
        rule="GLEAK-IMAGES-EXPECTED", severity=severity, capture=report.capture.path, attack=exp["attack"],
        title=f"{exp['attack']} is expected to identify {exp['rate']:.0%} of this batch's inputs in lineups of "
              f"{exp['distractors'] + 1} (chance {chance:.0%}), measured on {exp['twins']} twin batches",
        measured=round(kappa, 4), metric="expected_identification_kappa", chance=0.0, threshold=round(threshold, 4),
        detail=f"no ground truth; twins: {exp['settings']}; pooled rate {exp['rate']:.2f} of {exp['n']}, "
               f"{100 * exp['level']:.0f} % interval [{low:.2f}, {high:.2f}]; one batch like this one: "
               f"[{lo:.2f}, {hi:.2f}]" + (f"; the recorded defense was not simulated ({exp['defense_not_simulated']})"
                                          if exp.get("defense_not_simulated") else ""))


NOTICE_CODES = {
    "NO_TRUTH": "no ground truth beside the capture: recovered values are reported, not scored",
    "NO_AUX": "no auxiliary data fits the capture's model: attacks that need it did not run",
    "NO_MODEL_HASH": "the capture records no gleak.model.sha256: the model could not be verified",
    "MODEL_MISMATCH_ALLOWED": "the model's weights differ from the capture's (--allow-model-mismatch)",
    "ATTACK_FAILED": "an attack could not finish on this input (its reason says why)",
    "ATTACK_ERROR": "an attack raised an unexpected error (recorded; the audit went on)",
    "RECONSTRUCTION_SKIPPED": "the budget's reconstruction did not run (the message says why)",
    "LABELS_UNINFORMATIVE": "without truth, no label attack beats chance on batches simulated like this capture's",
    "IMAGES_NOT_IDENTIFIED": "reconstructions with truth but no auxiliary data for a lineup: no identification, no "
                             "image finding (PSNR, SSIM and LPIPS are reported)",
    "IMAGES_NOT_EXPECTED": "without truth, the expected image leakage was not simulated (the message says why)",
    "LPIPS_UNAVAILABLE": "LPIPS could not be computed (the message says why); identification, PSNR and SSIM were",
    "BATCH_SIZE_CONTRADICTED": "the capture's tensors show more examples or labels than its recorded batch size",
    "DP_UNACCOUNTED": "a client's ε over the run is unknown from a round on: that round records no DP, or no finite "
                      "bound (the message names the round)",
    "SENSITIVE_TOKENS_UNKNOWN": "a language model's capture audited without its folder's tokenizer: the share of "
                                "sensitive tokens recovered is not measured",
    "NO_TEXT_AUX": "a language model's capture without truth nor --aux text: its leakage is not scored",
    "TEXT_EXPECTED_SKIPPED": "without truth, the twin batches of the --aux text measured nothing (the message says "
                             "why)",
    "MAX_EPSILON_UNUSED": "--max-epsilon was given but no capture records DP (gleak.dp.* or Flower's LocalDpMod)",
}


def notices_for(ctx: Context, report: CaptureReport, capture: str, aux_given: bool) -> list[Notice]:
    """Warnings with stable codes (:data:`NOTICE_CODES`) about one audited capture."""
    out: list[Notice] = []
    if report.aux is None and report.tokens is None:  # a language model's capture takes no aux data
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
    ran: list[AttackEntry | TokenResult] = [*report.attacks, *(report.tokens or [])]
    for a in ran:
        if a.status in ("failed", "error"):
            out.append(Notice(code=f"ATTACK_{a.status.upper()}", capture=capture,
                              message=f"{a.attack}: {a.reason or a.status}"))
    return out
