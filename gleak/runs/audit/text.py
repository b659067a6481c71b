"""Auditing a language model's capture (``gleak.modality`` text): the token attacks that ``gleak labels`` runs
(:func:`gleak.runs.tokens.run_token_attacks`), scored against the truth's token batches when they are beside the
capture, and the finding ``GLEAK-TEXT-TOKENS`` (:func:`gleak.runs.audit.findings.token_finding`); then the
sentence reconstruction (:mod:`gleak.runs.audit.sentences`: ``GLEAK-TEXT``, ``GLEAK-TEXT-EXPECTED``).

Recovered text is the client's data itself, and audit reports end up in CI logs: the capture's report holds token
ids, counts and scores only. The model folder's tokenizer decodes the truth's tokens in memory, to count the
sensitive ones (a digit, or a capital first letter), and nothing decoded is kept. The audit has no ``--show-text``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gleak.attacks import Attack, Context
from gleak.attacks.plan import select_attacks
from gleak.capture import TextTruth
from gleak.data.text import TextData
from gleak.errors import GleakError
from gleak.report.model import CaptureReport, Finding, Notice
from gleak.runs.audit.coverage import not_assessed_findings, sentence_coverage, token_coverage
from gleak.runs.audit.findings import expected_token_finding, notices_for, token_finding
from gleak.runs.audit.sentences import audit_sentences, expected_sentences, expected_text_finding, twin_sentence_scores
from gleak.runs.audit.setup import AuditConfig
from gleak.runs.audit.twins import TEXT_TWINS, spread, text_twins
from gleak.runs.tokens import UNION, run_token_attacks
from gleak.timebox import running

NO_LABEL_ATTACKS = ("label attacks skipped (a language model's capture: the label attacks of image classifiers do "
                    "not apply; the token attacks ran)")


def audit_text(ctx: Context, truth: TextTruth | None, config: AuditConfig, report: CaptureReport,
               model_folder: Path | None, text_aux: tuple[Path, TextData] | None = None
               ) -> tuple[list[Finding], list[Notice]]:
    """Fill ``report`` (setting, assumptions, ``tokens``, ``sentences``, ``expected_tokens``, ``coverage``) for a
    language model's capture; its findings and notices. ``model_folder``: the Hugging Face folder whose tokenizer
    tells the sensitive tokens apart (None: not counted) and makes the twins."""
    spec = ctx.text_model
    if spec is None:
        raise TypeError("audit_text needs a language model's capture")
    path = report.capture.path
    stages = report.stage_seconds = dict(report.stage_seconds or {})
    mark = time.perf_counter()
    report.kind, report.batch_size, report.local_steps = ctx.kind, ctx.batch_size, ctx.local_steps
    report.num_classes, report.last_layer = spec.vocab_size, ctx.layer.name
    report.assumptions = [
        f"kind {ctx.kind}: a language model's {spec.kind} ({spec.model_type}, {spec.task})",
        "loss: next-token cross-entropy over non-pad tokens" if spec.task == "causal_lm"
        else "loss: cross-entropy of the sequence classifier",
        f"B = {ctx.batch_size}, m = {ctx.local_steps}, V = {spec.vocab_size} (the vocabulary: the token attacks' "
        f"classes), {'tied' if spec.tie_word_embeddings else 'untied'} embeddings",
        "reports hold token ids and counts, never decoded text",
    ]
    twins = truth is None and text_aux is not None
    attacks = select_attacks("tokens", None)
    options = {a.name: config.attack_options(a.name) for a in attacks}
    run = run_token_attacks(ctx.sharing("token attacks", fraction=TOKEN_SHARE), truth, attacks, options,
                            model_folder=model_folder, trust_remote_code=config.trust_remote_code)
    report.tokens = run.results
    report.skipped.append(NO_LABEL_ATTACKS)
    for result in run.results:
        if result.status == "not_applicable":
            report.skipped.append(f"{result.attack}: {result.reason}")
    notices: list[Notice] = []
    findings: list[Finding] = []
    if truth is None and text_aux is None:
        notices.append(Notice(code="NO_TEXT_AUX", capture=path, message=(
            "no ground truth and no --aux text: the recovered tokens and sentences are not scored; give --aux "
            "FILE.txt (text like the client's) for the leakage to expect from batches like this one (twin batches "
            "simulated as the capture was made, attacked and scored)")))
    elif truth is not None:
        if run.sensitive is None:
            notices.append(Notice(code="SENSITIVE_TOKENS_UNKNOWN", capture=path, message=(
                "no tokenizer beside the model: the share of sensitive tokens (digits, capitals) recovered is not "
                "measured; recall and precision are")))
        finding = token_finding(report, config.thresholds)
        if finding is not None:
            findings.append(finding)
    stages["tokens"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    findings += audit_sentences(ctx.sharing("sentences", fraction=SENTENCE_SHARE if twins else None), truth, config,
                                report)
    stages["sentences"] = round(time.perf_counter() - mark, 6)
    expected_error = None
    if twins and text_aux is not None:
        mark = time.perf_counter()
        expected_error = expected_text(ctx.sharing("twin batches"), text_aux, config, report, model_folder, attacks,
                                       options)
        if expected_error is not None:
            notices.append(Notice(code="TEXT_EXPECTED_SKIPPED", capture=path, message=expected_error))
        for rule in (expected_token_finding, expected_text_finding):
            finding = rule(report, config.thresholds)
            if finding is not None:
                findings.append(finding)
        stages["twins"] = round(time.perf_counter() - mark, 6)
    tokens = token_coverage(report, truth is not None, text_aux is not None, expected_error)
    leak = any(f.rule in TOKEN_RULES for f in findings)
    report.coverage = [tokens, sentence_coverage(report, tokens, leak, expected_error)]
    findings += not_assessed_findings(report, config.accept_unassessed)
    notices += notices_for(ctx, report, path, aux_given=False)
    return findings, notices


TOKEN_SHARE = 0.25  # of the capture's time: the token attacks (analytic: seconds, even at V = 128k)
SENTENCE_SHARE = 0.4  # of what is left, for the sentence attack when twin batches follow (else all of it)
TOKEN_RULES = ("GLEAK-TEXT-TOKENS", "GLEAK-TEXT-TOKENS-EXPECTED")


def expected_text(ctx: Context, text_aux: tuple[Path, TextData], config: AuditConfig, report: CaptureReport,
                  model_folder: Path | None, attacks: list[Attack], options: Mapping[str, Mapping[str, Any]]
                  ) -> str | None:
    """Without truth: twin batches of the aux text (:mod:`gleak.runs.audit.twins`), each attacked as the capture
    was — the token attacks that ran on the capture, and the sentence attack where it finished on the capture —
    and scored against the twin's own truth: ``report.expected_tokens`` and ``report.sentences.expected``. Returns
    why they could not be measured (None: measured)."""
    deadline = ctx.deadline
    ran = {r.attack for r in report.tokens or [] if r.status == "ok"}
    token_attacks = [a for a in attacks if a.name in ran]
    sentence = report.sentences.attack if report.sentences is not None and report.sentences.status == "ok" else None
    if not token_attacks and sentence is None:
        return "no token or sentence attack finished on the capture, so twin batches would measure nothing"
    # what attacking one twin costs, as it cost on the capture: a twin is made only when it and its attacks fit
    cost = sum(r.seconds for r in report.tokens or [] if r.attack in ran and r.attack != UNION)
    cost += report.sentences.seconds if sentence is not None and report.sentences is not None else 0.0
    per_attack: dict[str, list[dict[str, float]]] = {}
    per_twin_sentences: list[dict[str, float]] = []
    why: list[str] = []
    made = 0
    try:
        with running(deadline):
            for twin in text_twins(ctx, text_aux, TEXT_TWINS.get(config.budget, 2), config, model_folder,
                                   time_left=None if deadline is None else lambda: deadline.remaining() - cost):
                made += 1
                if token_attacks:
                    twin_run = run_token_attacks(twin.ctx, twin.truth, token_attacks, options,
                                                 model_folder=model_folder, trust_remote_code=config.trust_remote_code)
                    for r in twin_run.results:
                        if r.status == "ok" and r.scores and "recall" in r.scores:
                            per_attack.setdefault(r.attack, []).append(dict(r.scores))
                        elif r.status != "ok":
                            why.append(f"{r.attack} {r.status} on a twin: {r.reason}")
                if sentence is not None:
                    scores, error = twin_sentence_scores(twin, config, sentence)
                    if scores is not None:
                        per_twin_sentences.append(scores)
                    elif error:
                        why.append(error)
    except GleakError as e:  # no twin could be made, or the twins reached their time share
        why.insert(0, str(e))
    aux = text_aux[0]
    complete = {name: scores for name, scores in per_attack.items() if len(scores) == made and made}
    if complete:
        report.expected_tokens = expected_tokens(complete, aux)
    if sentence is not None and report.sentences is not None and made and len(per_twin_sentences) == made:
        report.sentences.expected = expected_sentences(per_twin_sentences, aux)
    if report.expected_tokens is None or (sentence is not None and report.sentences is not None
                                          and report.sentences.expected is None):
        return "; ".join(dict.fromkeys(why)) or ("no twin batch fit the time left" if not made else
                                                 "no token attack finished on every twin")
    return None


def expected_tokens(per_attack: Mapping[str, list[dict[str, float]]], aux: Path) -> dict[str, Any]:
    """The best token attack by mean recall over the twins (ties: the first), its recall, precision and
    sensitive-token recall as mean, min and max over the twins, with chance; every attack's mean recall beside."""
    means = {name: sum(s["recall"] for s in scores) / len(scores) for name, scores in per_attack.items()}
    best = max(means, key=lambda n: means[n])
    scores = per_attack[best]
    out: dict[str, Any] = {"attack": best, "twins": len(scores), "aux": str(aux)}
    for key in ("recall", "precision", "sensitive_recall", "chance_recall", "chance_precision",
                "chance_sensitive_recall"):
        values = [float(s[key]) for s in scores if key in s]
        if values:
            out[key] = spread(values)
    out["by_attack"] = {name: round(m, 4) for name, m in means.items()}
    return out
