"""The audit's sentence reconstruction of a language model's capture.

DAGER is analytic and fast, so it runs at every budget; at the full budget the optimisation baseline ``tag``
takes over where DAGER's precondition fails. The result is scored against the truth (``GLEAK-TEXT``) or, without
truth, expected from twin batches drawn from ``--aux`` text and attacked the same way (``GLEAK-TEXT-EXPECTED``),
as the image findings do with aux images.

Only counts and scores enter the report: recovered sequences are the client's text (token ids decode to it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gleak.attacks import Context, run_attack
from gleak.attacks.base import TextOutput
from gleak.attacks.registry import get_attack
from gleak.capture import TextTruth
from gleak.report.model import CaptureReport, Finding, SentenceResult
from gleak.runs.audit.findings import label_severity
from gleak.runs.audit.setup import AuditConfig
from gleak.runs.audit.twins import Twin, spread
from gleak.runs.text import score_sequences, sequence_exactness, truth_sequences
from gleak.settings.values import Thresholds

ATTACK = "dager"
BASELINE = "tag"  # gradient matching: only at the full budget, where DAGER's precondition fails
DAGER_SHARE = 0.5  # at the full budget, of the time left: DAGER's share, the rest for tag where DAGER fails


def audit_sentences(ctx: Context, truth: TextTruth | None, config: AuditConfig, report: CaptureReport
                    ) -> list[Finding]:
    """Fill ``report.sentences`` with the sentence attack on the capture (DAGER; tag at the full budget where DAGER
    fails), scored against the truth when it is there; the GLEAK-TEXT finding."""
    spec = ctx.text_model
    if spec is None:
        return []
    attack = get_attack(ATTACK, "text")
    attack.configure(config.attack_options(ATTACK))
    result = run_attack(attack, ctx.sharing(ATTACK, fraction=DAGER_SHARE if config.budget == "full" else None))
    if result.status != "ok" and config.budget == "full":
        # DAGER's precondition failed (the batch is beyond the span's room): the optimisation baseline, whose
        # budget only the full audit affords
        report.skipped.append(f"{ATTACK}: {result.reason}; the full budget runs {BASELINE} instead")
        attack = get_attack(BASELINE, "text")
        attack.configure(config.attack_options(BASELINE))
        result = run_attack(attack, ctx.sharing(BASELINE))
    out = result.output if isinstance(result.output, TextOutput) else None
    exact, up_to_last = sequence_exactness(out, spec) if out else ([], [])
    entry = SentenceResult(attack=attack.name, status=result.status, reason=result.reason,
                           seconds=round(result.seconds, 3), sequences=len(out.sequences) if out else 0,
                           exact=sum(exact), exact_up_to_last=sum(up_to_last))
    report.sentences = entry
    if result.status != "ok":
        report.skipped.append(f"{attack.name}: {result.reason}")
    if truth is None or out is None:
        return []
    entry.scores, _ = score_sequences(out.sequences, truth_sequences(truth), spec.vocab_size)
    finding = text_finding(report, config.thresholds)
    return [finding] if finding is not None else []


def twin_sentence_scores(twin: Twin, config: AuditConfig, name: str) -> tuple[dict[str, float] | None, str | None]:
    """The sentence attack ``name`` on one twin batch, scored against the twin's truth; (None, why) when it did not
    finish on the twin (then the twin measures nothing: an empty answer is not "no leak")."""
    spec = twin.ctx.text_model
    if spec is None:
        raise TypeError("a twin of a language model's capture")
    attack = get_attack(name, "text")
    attack.configure(config.attack_options(name))
    result = run_attack(attack, twin.ctx)
    out = result.output if isinstance(result.output, TextOutput) else None
    if result.status != "ok" or out is None:
        return None, f"{name} {result.status} on a twin: {result.reason or result.status}"
    scores, _ = score_sequences(out.sequences, truth_sequences(twin.truth), spec.vocab_size)
    return {k: float(scores.get(k) or 0.0) for k in EXPECTED_KEYS} | {"seconds": result.seconds}, None


EXPECTED_KEYS = ("rouge1", "rouge2", "exact_match", "exact_up_to_last", "chance_rouge1")


def expected_sentences(per_twin: list[dict[str, float]], aux: Path) -> dict[str, Any]:
    """The mean of the twins' sentence scores (``SentenceResult.expected``), with the range of ROUGE-1."""
    n = len(per_twin)
    mean = {k: round(sum(t[k] for t in per_twin) / n, 4) for k in EXPECTED_KEYS}
    return {"twins": n, "aux": str(aux), **mean, "rouge1_range": spread([t["rouge1"] for t in per_twin]),
            "seconds": round(sum(t["seconds"] for t in per_twin), 3)}


def text_severity(rouge1: float, chance: float, exact: float, th: Thresholds) -> tuple[Any, float]:
    """GLEAK-TEXT's ladder: the label ladder on ROUGE-1 over chance (the tokens are the label problem at C = V;
    one set of thresholds tunes both), critical when every sequence came back exactly."""
    return label_severity(rouge1, chance, th, exact=exact >= th.labels_critical)


def text_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """GLEAK-TEXT: whole sequences recovered from the capture, against its truth."""
    entry = report.sentences
    if entry is None or not entry.scores:
        return None
    sc = entry.scores
    rouge1, chance = float(sc.get("rouge1") or 0.0), float(sc.get("chance_rouge1") or 0.0)
    exact = float(sc.get("exact_match") or 0.0)
    up_to_last = float(sc.get("exact_up_to_last") or 0.0)
    severity, threshold = text_severity(rouge1, chance, max(exact, up_to_last), th)
    if severity is None:
        return None
    return Finding(
        rule="GLEAK-TEXT", severity=severity, capture=report.capture.path, attack=entry.attack,
        title=f"{entry.attack} recovers the batch's sequences: ROUGE-1 {rouge1:.2f} (chance {chance:.2f}), "
              f"{exact:.0%} exactly" + (f", {up_to_last:.0%} up to the last token" if up_to_last > exact else ""),
        measured=round(rouge1, 4), metric="rouge1", chance=round(chance, 4), threshold=round(threshold, 4),
        detail=(f"ROUGE-2 {float(sc.get('rouge2') or 0.0):.3f}, ROUGE-L {float(sc.get('rougeL') or 0.0):.3f}, token "
                f"accuracy {float(sc.get('token_accuracy') or 0.0):.3f} (chance "
                f"{float(sc.get('chance_token_accuracy') or 0.0):.3f}); ROUGE over token ids; the audit never shows "
                "the text"))


def expected_text_finding(report: CaptureReport, th: Thresholds) -> Finding | None:
    """GLEAK-TEXT-EXPECTED: without truth, DAGER's scores on twin batches of the aux text (never critical: an
    expectation, not this batch)."""
    entry = report.sentences
    if entry is None or not entry.expected:
        return None
    ex = entry.expected
    rouge1, chance = float(ex.get("rouge1", 0.0)), float(ex.get("chance_rouge1", 0.0))
    exact = max(float(ex.get("exact_match", 0.0)), float(ex.get("exact_up_to_last", 0.0)))
    severity, threshold = text_severity(rouge1, chance, exact, th)
    if severity is None:
        return None
    if severity == "critical":
        severity, threshold = "high", th.labels_high
    return Finding(
        rule="GLEAK-TEXT-EXPECTED", severity=severity, capture=report.capture.path, attack=entry.attack,
        title=f"batches like this one leak their text: {entry.attack} recovers twin batches of the aux text at "
              f"ROUGE-1 {rouge1:.2f} (chance {chance:.2f}), {exact:.0%} exactly",
        measured=round(rouge1, 4), metric="expected_rouge1", chance=round(chance, 4), threshold=round(threshold, 4),
        detail=f"on {ex.get('twins')} twin batches drawn from {Path(str(ex.get('aux'))).name}, simulated like this "
               "capture (same model, B, length, steps); an expectation for this client's batches, not a measurement "
               "of this one")
