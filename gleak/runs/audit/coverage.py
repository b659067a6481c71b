"""What the audit could measure of each threat a capture poses, and the GLEAK-NOT-ASSESSED finding for each it
could not.

A gate that passes a capture nobody could assess is worse than no gate: it reads as "no leak". So every threat that
applies to a capture — an image classifier's labels and images, a language model's tokens and sentences — ends as
one of three answers (:class:`~gleak.report.model.ThreatCoverage`):

* ``assessed``: an attack's result was scored against the truth, or, without truth, its leakage was expected from
  batches simulated like the capture's (calibrated label attacks, twin batches), or it is implied (no token of the
  batch leaks, so none of its sentences can);
* ``not_assessed``: every attack that applies refused, failed or raised, or what they recovered could be scored
  neither against a truth nor against twins. Also when one applicable attack failed while another measured the
  threat: the gate never passes while an applicable attack failed. Each is a GLEAK-NOT-ASSESSED finding, high (the
  default gate fails, INCONCLUSIVE), or info under ``--accept-unassessed``;
* ``outside_budget``: the budget plans no attack for it (the quick budget reconstructs images only where the
  analytic inversion applies); the verdict says so beside PASS.
"""

from __future__ import annotations

from collections.abc import Sequence

from gleak.report.model import NOT_ASSESSED, AttackEntry, CaptureReport, Finding, ThreatCoverage, TokenResult
from gleak.runs.audit.findings import SELECTOR, calibrated_attacks, selector_answer
from gleak.runs.tokens import TRUTH_OF

BROKEN = ("failed", "error")  # an attack that applied but could not finish (failed) or raised (error)
# attacks that read the same threat, the batch's input tokens, by different methods (the embedding gradient, the
# span test and the sparse fit of the first block): one of them measuring it answers for the others' refusals
# (beyond a rank or the identifiable bound; a fresh adapter's lora_A)
ALTERNATIVES = (frozenset({"token-bag", "lora-tokens", "sparse-tokens"}),)


def _unanswered(entries: Sequence[TokenResult]) -> list[TokenResult]:
    """The token attacks that failed or raised, less those an alternative reading of the same trace answered."""
    ok = {t.attack for t in entries if t.status == "ok"}
    return [t for t in entries if t.status in BROKEN
            and not any(t.attack in group and ok & (group - {t.attack}) for group in ALTERNATIVES)]


def _why(entries: Sequence[AttackEntry | TokenResult]) -> str:
    """'a: reason; b: reason' for the attacks that did not run to the end."""
    return "; ".join(f"{e.attack} {e.status}: {e.reason or e.status}" for e in entries)


def _with_broken(cover: ThreatCoverage, broken: Sequence[AttackEntry | TokenResult]) -> ThreatCoverage:
    """An assessed threat with an applicable attack that failed or raised is not assessed: what the others measured
    stands in the report, but the gate cannot pass on it."""
    if cover.status != "assessed" or not broken:
        return cover
    return ThreatCoverage(threat=cover.threat, status="not_assessed", by=cover.by,
                          reason=f"{_why(broken)} (measured by {cover.by} alone)")


def token_coverage(report: CaptureReport, truth: bool, aux: bool, expected_error: str | None) -> ThreatCoverage:
    """The tokens of a language model's batch: the best token attack scored against the truth, or the token attacks
    expected from twin batches of ``--aux`` text (``report.expected_tokens``)."""
    attacks = [t for t in report.tokens or [] if t.attack in TRUTH_OF]
    broken = _unanswered(attacks)
    best = report.best_tokens()
    if best is not None:
        cover = ThreatCoverage(threat="tokens", status="assessed", by=f"{best.attack} against the truth")
    elif report.expected_tokens:
        ex = report.expected_tokens
        cover = ThreatCoverage(threat="tokens", status="assessed",
                               by=f"{ex['attack']} expected from {ex['twins']} twin batches")
    elif not any(t.status == "ok" for t in attacks):
        why = _why(broken or [t for t in attacks if t.status != "ok"]) or "no token attack applies"
        return ThreatCoverage(threat="tokens", status="not_assessed", reason=f"no token attack could run: {why}")
    elif truth:
        return ThreatCoverage(threat="tokens", status="not_assessed", reason="no token attack's result could be "
                              "scored against the truth")
    elif not aux:
        return ThreatCoverage(threat="tokens", status="not_assessed", reason=(
            "tokens recovered but not scored: no truth beside the capture, and no --aux text to simulate twin "
            "batches like it (give --aux FILE.txt, text like the client's, for the expected leakage)"))
    else:
        return ThreatCoverage(threat="tokens", status="not_assessed", reason=(
            f"tokens recovered but not scored: no truth, and the twin batches failed ({expected_error or 'unknown'})"))
    return _with_broken(cover, broken)


def sentence_coverage(report: CaptureReport, tokens: ThreatCoverage, token_leak: bool,
                      expected_error: str | None) -> ThreatCoverage:
    """The batch's sentences: the sentence attack scored against the truth or expected from twins; or implied when
    the tokens were assessed and do not leak (a sentence is made of the batch's tokens)."""
    entry = report.sentences
    if entry is not None and entry.status == "ok" and entry.scores:
        return ThreatCoverage(threat="sentences", status="assessed", by=f"{entry.attack} against the truth")
    if entry is not None and entry.status == "ok" and entry.expected:
        return ThreatCoverage(threat="sentences", status="assessed",
                              by=f"{entry.attack} expected from {entry.expected.get('twins')} twin batches")
    if tokens.status == "assessed" and not token_leak:
        return ThreatCoverage(threat="sentences", status="assessed",
                              by=f"implied: no token leaks ({tokens.by}), so no sentence can")
    if entry is None:
        return ThreatCoverage(threat="sentences", status="not_assessed", reason="no sentence attack ran")
    if entry.status != "ok":
        return ThreatCoverage(threat="sentences", status="not_assessed",
                              reason=f"{entry.attack} {entry.status}: {entry.reason or entry.status}")
    why = expected_error or ("no truth beside the capture, and no --aux text to simulate twin batches like it"
                                   if not entry.scores else "unscored")
    return ThreatCoverage(threat="sentences", status="not_assessed",
                          reason=f"sentences recovered but not scored: {why}")


def label_coverage(report: CaptureReport) -> ThreatCoverage:
    """An image classifier's labels: the best label attack against the truth, or the calibrated attacks' answer on
    batches simulated like the capture's (expected iAcc, or an abstention: both measure)."""
    attacks = [a for a in report.attacks if a.task == "labels" and a.attack != SELECTOR]
    broken = [a for a in attacks if a.status in BROKEN]
    best = report.best_label()
    selector = selector_answer(report)
    calibrated = [*calibrated_attacks(report).values(), *([selector] if selector is not None else [])]
    if best is not None:
        cover = ThreatCoverage(threat="labels", status="assessed", by=f"{best.attack} against the truth")
    elif calibrated:
        sims = next((a.confidence or {}).get("simulations") for a in calibrated)
        cover = ThreatCoverage(threat="labels", status="assessed",
                               by=f"calibrated on {sims} batches simulated like this one")
    elif not any(a.status == "ok" for a in attacks):
        why = _why(broken or [a for a in attacks if a.status != "ok"]) or "no label attack applies"
        return ThreatCoverage(threat="labels", status="not_assessed", reason=f"no label attack could run: {why}")
    else:
        return ThreatCoverage(threat="labels", status="not_assessed", reason=(
            "labels recovered but not scored: no truth beside the capture, and no calibration on simulated batches "
            "(it needs --aux data that fits the model, and --confidence above 0)"))
    return _with_broken(cover, broken)


def image_coverage(report: CaptureReport, entry: AttackEntry | None, skipped: str | None, truth: bool,
                   outside_budget: bool, expected_why: str | None) -> ThreatCoverage:
    """An image classifier's inputs: the budget's reconstruction identified in lineups against the truth, or its
    expected identification on twin batches. ``outside_budget``: the budget planned no reconstruction."""
    if entry is None:
        return ThreatCoverage(threat="images", status="outside_budget" if outside_budget else "not_assessed",
                              reason=skipped or "no reconstruction ran")
    if entry.status != "ok":
        return ThreatCoverage(threat="images", status="not_assessed",
                              reason=f"{entry.attack} {entry.status}: {entry.reason or entry.status}")
    if truth and entry.identification:
        return ThreatCoverage(threat="images", status="assessed", by=f"{entry.attack} identified against the truth")
    if not truth and report.expected_images:
        return ThreatCoverage(threat="images", status="assessed",
                              by=f"{entry.attack} expected from {report.expected_images.get('twins')} twin batches")
    why = ("no --aux images of the capture's classes for the identification lineup" if truth
           else expected_why or "no truth beside the capture, and the expected leakage was not simulated")
    return ThreatCoverage(threat="images", status="not_assessed", reason=f"reconstructions not judged: {why}")


def not_assessed_findings(report: CaptureReport, accept: bool) -> list[Finding]:
    """GLEAK-NOT-ASSESSED for each threat of ``report.coverage`` the audit could not measure: high (the default gate
    fails; the verdict INCONCLUSIVE when nothing else does), info under ``--accept-unassessed``."""
    out = []
    for cover in report.coverage or []:
        if cover.status != "not_assessed":
            continue
        out.append(Finding(
            rule=NOT_ASSESSED, severity="info" if accept else "high", capture=report.capture.path,
            title=f"{cover.threat} not assessed: {cover.reason}", metric=cover.threat,
            detail=("no leak was found, and none was ruled out: the gate cannot pass on it" if cover.by is None
                    else f"{cover.by} measured it, but an applicable attack did not finish")
            + ("; accepted (--accept-unassessed)" if accept else "; --accept-unassessed lets such captures pass")))
    return out
