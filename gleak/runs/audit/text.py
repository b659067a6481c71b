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
from pathlib import Path

from gleak.attacks import Context
from gleak.attacks.plan import select_attacks
from gleak.capture import TextTruth
from gleak.report.model import CaptureReport, Finding, Notice
from gleak.runs.audit.findings import notices_for, token_finding
from gleak.runs.audit.sentences import audit_sentences
from gleak.runs.audit.setup import AuditConfig
from gleak.runs.tokens import run_token_attacks
from gleak.text_data import TextData

NO_LABEL_ATTACKS = ("label attacks skipped (a language model's capture: the label attacks of image classifiers do "
                    "not apply; the token attacks ran)")


def audit_text(ctx: Context, truth: TextTruth | None, config: AuditConfig, report: CaptureReport,
               model_folder: Path | None, text_aux: tuple[Path, TextData] | None = None
               ) -> tuple[list[Finding], list[Notice]]:
    """Fill ``report`` (setting, assumptions, ``tokens``) for a language model's capture; its findings and notices.
    ``model_folder``: the Hugging Face folder whose tokenizer tells the sensitive tokens apart (None: not counted)."""
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
    attacks = select_attacks("tokens", None)
    run = run_token_attacks(ctx, truth, attacks, {a.name: config.attack_options(a.name) for a in attacks},
                            model_folder=model_folder, trust_remote_code=config.trust_remote_code)
    report.tokens = run.results
    report.skipped.append(NO_LABEL_ATTACKS)
    for result in run.results:
        if result.status == "not_applicable":
            report.skipped.append(f"{result.attack}: {result.reason}")
    notices: list[Notice] = []
    findings: list[Finding] = []
    if truth is None:
        notices.append(Notice(code="NO_TRUTH", capture=path, message=(
            "no ground truth next to the capture: the recovered token ids and counts are reported, but how much "
            "leaks cannot be scored, so there is no GLEAK-TEXT-TOKENS finding (gleak simulate and the capture "
            "helpers write NAME.truth.safetensors)")))
    else:
        if run.sensitive is None:
            notices.append(Notice(code="SENSITIVE_TOKENS_UNKNOWN", capture=path, message=(
                "no tokenizer beside the model: the share of sensitive tokens (digits, capitals) recovered is not "
                "measured; recall and precision are")))
        finding = token_finding(report, config.thresholds)
        if finding is not None:
            findings.append(finding)
    stages["tokens"] = round(time.perf_counter() - mark, 6)
    mark = time.perf_counter()
    more, notes = audit_sentences(ctx, truth, config, report, model_folder, text_aux)
    findings += more
    notices += notes
    stages["sentences"] = round(time.perf_counter() - mark, 6)
    notices += notices_for(ctx, report, path, aux_given=False)
    return findings, notices
