"""The audit's sentence reconstruction of a language model's capture.

DAGER is analytic and fast, so it runs at every budget; at the full budget the optimisation baseline ``tag``
takes over where DAGER's precondition fails. The result is scored against the truth (``GLEAK-TEXT``) or, without
truth, expected from twin batches drawn from ``--aux`` text and attacked the same way (``GLEAK-TEXT-EXPECTED``),
as the image findings do with aux images.

Only counts and scores enter the report: recovered sequences are the client's text (token ids decode to it).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from gleak.attacks import Context, run_attack
from gleak.attacks.base import TextOutput
from gleak.attacks.registry import get_attack
from gleak.capture import TextTruth
from gleak.errors import GleakError
from gleak.report.model import CaptureReport, Finding, Notice, SentenceResult
from gleak.runs.audit.findings import label_severity
from gleak.runs.audit.setup import AuditConfig
from gleak.runs.text import score_sequences, truth_sequences
from gleak.settings.values import Thresholds
from gleak.text_data import TextData

ATTACK = "dager"
BASELINE = "tag"  # gradient matching: only at the full budget, where DAGER's precondition fails
TEXT_TWINS = {"quick": 2, "standard": 2, "full": 4}  # twin batches per capture without truth (DAGER is analytic)


def audit_sentences(ctx: Context, truth: TextTruth | None, config: AuditConfig, report: CaptureReport,
                    model_folder: Path | None, text_aux: tuple[Path, TextData] | None
                    ) -> tuple[list[Finding], list[Notice]]:
    """Fill ``report.sentences``; the GLEAK-TEXT or GLEAK-TEXT-EXPECTED finding and notices."""
    spec = ctx.text_model
    path = report.capture.path
    if spec is None:
        return [], []
    attack = get_attack(ATTACK, "text")
    attack.configure(config.attack_options(ATTACK))
    result = run_attack(attack, ctx)
    if result.status != "ok" and config.budget == "full":
        # DAGER's precondition failed (the batch is beyond the span's room): the optimisation baseline, whose
        # budget only the full audit affords
        report.skipped.append(f"{ATTACK}: {result.reason}; the full budget runs {BASELINE} instead")
        attack = get_attack(BASELINE, "text")
        attack.configure(config.attack_options(BASELINE))
        result = run_attack(attack, ctx)
    out = result.output if isinstance(result.output, TextOutput) else None
    entry = SentenceResult(attack=attack.name, status=result.status, reason=result.reason,
                           seconds=round(result.seconds, 3), sequences=len(out.sequences) if out else 0,
                           exact=sum(out.exact) if out else 0)
    report.sentences = entry
    if result.status != "ok":
        report.skipped.append(f"{attack.name}: {result.reason}")
    findings: list[Finding] = []
    notices: list[Notice] = []
    if truth is not None:
        if out is not None:
            entry.scores, _ = score_sequences(out.sequences, truth_sequences(truth), spec.vocab_size)
            finding = text_finding(report, config.thresholds)
            if finding is not None:
                findings.append(finding)
        return findings, notices
    if text_aux is None:
        notices.append(Notice(code="NO_TEXT_AUX", capture=path, message=(
            "no ground truth and no --aux text: how much of the batch's text leaks is not measured; give --aux "
            "FILE.txt (text like the client's) for the expected leakage of batches like this one")))
        return findings, notices
    twins = TEXT_TWINS.get(config.budget, 2)
    try:
        entry.expected = expected_scores(ctx, text_aux, twins, config, model_folder)
    except GleakError as e:
        notices.append(Notice(code="TEXT_EXPECTED_SKIPPED", capture=path, message=str(e)))
        return findings, notices
    finding = expected_text_finding(report, config.thresholds)
    if finding is not None:
        findings.append(finding)
    return findings, notices


def expected_scores(ctx: Context, text_aux: tuple[Path, TextData], twins: int, config: AuditConfig,
                    model_folder: Path | None) -> dict[str, Any]:
    """DAGER's mean scores on ``twins`` batches drawn from the aux text, each simulated as the capture was made
    (same model, B, truncation length, FedSGD or the recorded local steps and learning rate; a LoRA capture's twins
    train the same adapter from the global one beside it; a classifier's twins need labelled aux text) and scored
    against itself."""
    from gleak.attacks.tokens.lora import load_global_adapter
    from gleak.models.peft import LoraSpec, spec_of_config
    from gleak.models.text import load_tokenizer
    from gleak.simulate import ClientConfig
    from gleak.simulate_text import TextClientOptions, simulate_lora_client, simulate_text_client

    spec, model = ctx.text_model, ctx.model
    if spec is None or model is None or model_folder is None:
        raise GleakError("expected text leakage needs the model's Hugging Face folder")
    lora: tuple[LoraSpec, dict[str, Any]] | None = None
    if ctx.capture.get("gleak.peft.type") is not None:
        # the twins fine-tune the same adapter from the global one beside the capture, which DAGER also reads
        stored = load_global_adapter(ctx.capture.path)
        if stored is None:
            raise GleakError("expected text leakage of a LoRA capture needs its global adapter beside it "
                             "(NAME.adapter/, as gleak simulate --peft and the Flower mod write it)")
        lora = (spec_of_config(stored[0]), stored[1])
    tokenizer = load_tokenizer(model_folder, trust_remote_code=config.trust_remote_code)
    b = ctx.batch_size or 1
    steps = ctx.local_steps
    lr = float(ctx.capture.get("gleak.learning_rate") or 0.01)
    path, data = text_aux
    if len(data) < b:
        raise GleakError(f"--aux {path.name} has {len(data)} examples, fewer than a batch of {b}")
    totals: dict[str, float] = {}
    for k in range(twins):
        client = ClientConfig(batch_size=b, local_steps=steps, scheme="fedsgd" if steps == 1 else "fedavg",
                              learning_rate=lr, optimizer=str(ctx.capture.get("gleak.optimizer") or "sgd"),
                              train_mode=False, seed=ctx.seed + 1000 + k)
        classes = ctx.capture.get("gleak.num_classes")
        options = TextClientOptions(task=spec.task, max_length=spec.max_length,
                                    num_labels=int(classes) if isinstance(classes, int) else None)
        if lora is None:
            capture, twin_truth = simulate_text_client(model, tokenizer, data, client, options)
        else:
            capture, twin_truth, _ = simulate_lora_client(model, tokenizer, data, client, options, lora[0],
                                                          start=lora[1])
            capture.path = ctx.capture.path  # the same global adapter beside it
        twin = dataclasses.replace(ctx, capture=capture, batch_size=capture.batch_size, _cache={})
        attack = get_attack(ATTACK, "text")
        attack.configure(config.attack_options(ATTACK))
        started = time.perf_counter()
        result = run_attack(attack, twin)
        out = result.output if isinstance(result.output, TextOutput) else None
        predicted = out.sequences if out is not None else []
        scores, _ = score_sequences(predicted, truth_sequences(twin_truth), spec.vocab_size)
        scores["seconds"] = time.perf_counter() - started
        for key in ("rouge1", "rouge2", "exact_match", "exact_up_to_last", "chance_rouge1"):
            totals[key] = totals.get(key, 0.0) + float(scores.get(key) or 0.0) / twins
        totals["seconds"] = totals.get("seconds", 0.0) + scores["seconds"]
    return {"twins": twins, "aux": str(path), **{k: round(v, 4) for k, v in totals.items()}}


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
