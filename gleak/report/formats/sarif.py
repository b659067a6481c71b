"""``report.sarif``: the findings as SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.

One run whose driver is gleak; one rule per finding type (``Finding.rule``), each carrying help on the leak and
its mitigations and a GitHub ``security-severity``; one result per finding, plus one ``GLEAK-INPUT-ERROR``
result per capture that could not be audited. Every result is located at its capture file (GitHub requires a
location): the path relative to the working directory when the capture lies under it, so that it matches the
repository's checkout, with a line-1 region, and a ``partialFingerprints`` hash of rule and path so that GitHub
tracks an alert across runs. Tests validate the output against the official OASIS schema.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import quote

from gleak.report.model import SEVERITIES, CaptureReport, Finding, Report, Severity, severity_rank

NAME = "sarif"
FILENAME = "report.sarif"

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://raw.githubusercontent.com/oasis-tcs/sarif-spec/master/Schemata/sarif-schema-2.1.0.json"
INPUT_ERROR = "GLEAK-INPUT-ERROR"
FINGERPRINT_KEY = "gleakFindingHash/v1"

# GitHub reads "security-severity" (a number as a string, 0.0-10.0): > 9 critical, 7-8.9 high, 4-6.9 medium,
# 0.1-3.9 low.
SECURITY_SEVERITY: dict[str, str] = {"critical": "9.5", "high": "8.0", "medium": "5.5", "low": "3.0", "info": "0.0"}
LEVEL: dict[str, str] = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}

_MITIGATIONS = (
    "- **Aggregate securely**: with secure aggregation the server only sees the sum of many clients' updates, "
    "never one client's gradient.\n"
    "- **Add differential privacy**: clip per-example gradients and add calibrated noise (DP-SGD, e.g. with "
    "Opacus for PyTorch); the privacy budget bounds what any attack can learn.\n"
    "- **Train on larger batches and more local steps**: the leak is averaged over more examples, which "
    "slows but does not stop the attacks.\n"
)
_LABEL_MITIGATIONS = _MITIGATIONS + (
    "- **Do not share the last layer's bias** (or its gradient): the label attacks read the batch's label "
    "counts from it and from the last layer's weight gradient.\n"
)


@dataclass(frozen=True)
class RuleInfo:
    """The text of one rule: what leaks, why it matters, and what to do about it."""

    name: str
    short: str
    full: str
    help_markdown: str
    default_severity: Severity


RULES: dict[str, RuleInfo] = {
    "GLEAK-LABELS": RuleInfo(
        name="LabelLeakage",
        short="The shared update reveals the training batch's labels.",
        full=("A label-recovery attack reconstructs how many examples of each class were in the client's batch "
              "(instance-level accuracy, iAcc) clearly better than random guessing. Label counts leak the "
              "client's class distribution and make input reconstruction easier."),
        help_markdown=(
            "# Label leakage (GLEAK-LABELS)\n\n"
            "gleak ran analytic label-recovery attacks on the captured gradient or model update and compared "
            "the recovered label counts with the ground truth. The severity grows with the instance-level "
            "accuracy (iAcc) of the best attack: critical when every label is recovered exactly, high at "
            "iAcc >= 0.9, medium or low when it beats the chance iAcc of the same batch by a margin.\n\n"
            "## Mitigations\n\n" + _LABEL_MITIGATIONS),
        default_severity="high"),
    "GLEAK-SOFT-LABEL": RuleInfo(
        name="SoftLabelLeakage",
        short="The shared update reveals an example's soft label.",
        full=("A soft-label attack recovers the full label distribution of a training example (for example a "
              "label-smoothed or distilled target) within L1 distance 1e-3, which also exposes its class."),
        help_markdown=(
            "# Soft-label leakage (GLEAK-SOFT-LABEL)\n\n"
            "gleak recovered the soft label of the single training example behind the capture to within L1 "
            "distance 1e-3 of the truth, the success criterion of Wang, Liang & He (ICLR 2024).\n\n"
            "## Mitigations\n\n" + _LABEL_MITIGATIONS),
        default_severity="high"),
    "GLEAK-IMAGES": RuleInfo(
        name="InputReconstruction",
        short="The shared update lets an attacker reconstruct the training inputs.",
        full=("A gradient-inversion attack reconstructs the client's training inputs from the shared update well "
              "enough to pick each true input out of a lineup of look-alikes (same class) clearly more often than "
              "chance."),
        help_markdown=(
            "# Input reconstruction (GLEAK-IMAGES)\n\n"
            "gleak inverted the captured gradient or model update and put each true input in a lineup with K "
            "distractors of its class from the auxiliary data. An input is identified when its reconstruction is "
            "more like it than like any distractor (correlation after a low-pass). The severity grows with the "
            "identification over chance, kappa = (rate - chance) / (1 - chance): critical at >= 0.9, high at "
            ">= 0.6, medium at >= 0.3, low at >= 0.1, and only when the rate's 95 % interval lies above chance. "
            "PSNR, SSIM and LPIPS are reported beside it; the lineup picture shows what was identified.\n\n"
            "## Mitigations\n\n" + _MITIGATIONS),
        default_severity="high"),
    "GLEAK-TEXT-TOKENS": RuleInfo(
        name="TokenLeakage",
        short="The shared update of a language model reveals the tokens of the client's text.",
        full=("A token attack reads which tokens were in the client's batch (the rows of the token-embedding "
              "gradient that are not zero, the language-model head's next-token counts) and recovers clearly more "
              "of the batch's distinct tokens than random guessing, names, dates and record numbers included."),
        help_markdown=(
            "# Token leakage (GLEAK-TEXT-TOKENS)\n\n"
            "gleak ran the token attacks on the captured gradient or update of a language model and compared the "
            "recovered token ids with the token batches the client trained on. The severity grows with the recall "
            "of the best attack over the batch's distinct tokens (the GLEAK-LABELS thresholds): critical when the "
            "recovered set is exactly the batch's, high at recall >= 0.9, medium or low when it beats the recall "
            "of as many ids guessed at random by a margin. The message gives the share of sensitive tokens (a "
            "digit or a capital first letter: names, dates, record numbers) recovered. Reports hold token ids and "
            "counts only, never decoded text.\n\n"
            "## Mitigations\n\n" + _MITIGATIONS
            + "- **Freeze the token embeddings and the LM head** (e.g. LoRA on the attention and MLP layers only): "
              "their gradients are where the batch's tokens show.\n"),
        default_severity="high"),
    "GLEAK-TEXT": RuleInfo(
        name="TextLeakage",
        short="The shared update of a language model reveals whole sequences of the client's text.",
        full=("A sentence-reconstruction attack (DAGER) recovered the client's token sequences from the first "
              "transformer blocks' gradients (or a LoRA adapter's), scored against the token batches the client "
              "trained on: ROUGE-1 well above chance, and often every sequence exactly."),
        help_markdown=(
            "# Text leakage (GLEAK-TEXT)\n\n"
            "gleak ran DAGER (Petrov et al., NeurIPS 2024) on the captured gradient or update: every vocabulary "
            "token is tested against the span of the first block's attention-input gradient, and prefixes are "
            "grown while the second block's inputs stay in its span; the last token of each sequence comes from "
            "the LM head. The recovered sequences are matched one to one with the truth's and scored with ROUGE over "
            "token ids. The severity follows the GLEAK-LABELS thresholds on ROUGE-1 over chance: critical when "
            "every sequence came back exactly, high at ROUGE-1 >= 0.9. Reports hold counts and scores only.\n\n"
            "## Mitigations\n\n" + _MITIGATIONS
            + "- **Larger batches of longer sequences, or a LoRA rank below the batch's distinct tokens**: the "
              "attack needs fewer distinct inputs than the layer width (or the adapter's rank).\n"),
        default_severity="critical"),
    "GLEAK-TEXT-EXPECTED": RuleInfo(
        name="ExpectedTextLeakage",
        short="Batches like this client's leak their text: DAGER recovers twin batches of the auxiliary text.",
        full=("Without ground truth, gleak simulated batches like this capture's (same model, batch size, length and "
              "local steps) from the --aux text and attacked them the same way; the scores are an expectation for "
              "this client's batches."),
        help_markdown=(
            "# Expected text leakage (GLEAK-TEXT-EXPECTED)\n\n"
            "No truth was beside the capture. gleak drew twin batches from the --aux text, simulated the client's "
            "step on each with the capture's model and settings, ran DAGER and scored it against each twin. The "
            "severity follows the GLEAK-TEXT ladder on the mean ROUGE-1, capped at high (an expectation, not a "
            "measurement of this batch).\n\n"
            "## Mitigations\n\n" + _MITIGATIONS),
        default_severity="high"),
    "GLEAK-TEXT-TOKENS-EXPECTED": RuleInfo(
        name="ExpectedTokenLeakage",
        short="Batches like this client's give away their tokens: token attacks recover twin batches of the "
              "auxiliary text.",
        full=("Without ground truth, gleak simulated batches like this capture's (same model and adapter, batch "
              "size, length, local steps and optimiser) from the --aux text and ran the token attacks on them; the "
              "recall, precision and sensitive-token recall are an expectation for this client's batches."),
        help_markdown=(
            "# Expected token leakage (GLEAK-TEXT-TOKENS-EXPECTED)\n\n"
            "No truth was beside the capture. gleak drew twin batches from the --aux text, simulated the client's "
            "round on each with the capture's model and settings, ran the token attacks that ran on the capture "
            "and scored them against each twin. The severity follows the GLEAK-TEXT-TOKENS ladder on the best "
            "attack's mean recall, capped at high; the message gives the range over the twins.\n\n"
            "## Mitigations\n\n" + _MITIGATIONS
            + "- **Freeze the token embeddings and the LM head** (e.g. LoRA on the attention and MLP layers only).\n"),
        default_severity="high"),
    "GLEAK-NOT-ASSESSED": RuleInfo(
        name="LeakageNotAssessed",
        short="A threat of this capture could not be measured: no attack could assess it, so the gate cannot pass.",
        full=("Every attack that applies to this threat (labels, images, tokens or sentences) refused, failed or "
              "raised, or what they recovered could be scored neither against a truth file nor against batches "
              "simulated like the capture's. No leak was found, and none was ruled out."),
        help_markdown=(
            "# Leakage not assessed (GLEAK-NOT-ASSESSED)\n\n"
            "The finding names the threat and why nothing measured it (an attack's one-line reason: a rank "
            "refusal, a time share reached, no --aux data for twin batches). The verdict is INCONCLUSIVE and the "
            "gate fails, whatever --fail-on (but none), unless --accept-unassessed (GLEAK_ACCEPT_UNASSESSED, "
            "accept_unassessed in a config file) accepts such captures; the finding is then info.\n\n"
            "## What to do\n\n- Give the truth file or --aux data like the client's, so the leakage can be "
            "measured or expected.\n- Run a larger --budget where an attack stopped at its time share.\n"),
        default_severity="high"),
    "GLEAK-DP-BUDGET": RuleInfo(
        name="PrivacyBudgetExceeded",
        short="A client's cumulative privacy loss ε exceeds the budget set with --max-epsilon.",
        full=("Composed over every round the client trained in (Opacus's accountant, from the noise multiplier, "
              "sample rate and steps its captures record), the client's ε passes the budget. The finding names "
              "the round where it first does, the δ and the accountant."),
        help_markdown=(
            "# Privacy budget exceeded (GLEAK-DP-BUDGET)\n\n"
            "`gleak audit --max-epsilon E` composes each client's differential-privacy loss over the rounds of the "
            "run with Opacus's RDP (or PRV) accountant and reports every client whose cumulative ε exceeds E, at "
            "the round where it first does. DP-SGD is accounted per example (record-level); Flower's LocalDpMod "
            "per client update (client-level).\n\n"
            "## Mitigations\n\n- Fewer rounds or local steps per client, a smaller sample rate, or more noise "
            "(`dpsgd:epsilon=` picks the noise for a target ε).\n- Stop a client's participation when its budget "
            "is spent.\n"),
        default_severity="high"),
    "GLEAK-LABELS-AGREE": RuleInfo(
        name="LabelAttacksAgree",
        short="Independent label attacks agree on the batch's label counts.",
        full=("Without ground truth gleak cannot score a leak, but independent label attacks recovering the same "
              "label counts suggests the labels are recoverable. Informational: supply the ground truth to "
              "measure it."),
        help_markdown=(
            "# Label attacks agree (GLEAK-LABELS-AGREE)\n\n"
            "No ground truth was found next to the capture, so gleak could not measure how much leaks. Several "
            "independent label attacks nevertheless recovered exactly the same label counts, which is a strong "
            "hint that the labels leak. Write the truth file next to the capture (`gleak simulate` and the "
            "capture helpers write `NAME.truth.safetensors`) to get a scored finding.\n\n"
            "## Mitigations\n\n" + _LABEL_MITIGATIONS),
        default_severity="info"),
    "GLEAK-LABELS-EXPECTED": RuleInfo(
        name="LabelLeakageExpected",
        short="Without ground truth, label attacks are expected to recover the batch's labels.",
        full=("No ground truth was available, so gleak measured each label attack on client contributions it "
              "simulated with the capture's own settings (model, batch size, steps, optimizer) from the auxiliary "
              "data. The best attack that beats chance there is expected to recover this share of the labels."),
        help_markdown=(
            "# Expected label leakage (GLEAK-LABELS-EXPECTED)\n\n"
            "gleak had no ground truth for this capture. It calibrated every label attack on batches simulated "
            "like the client's from the auxiliary data, in two compositions (labels uniform over the classes, as "
            "an IID client's; skewed Dirichlet class shares, as a non-IID client's), and reports the best "
            "attack's expected instance-level accuracy (iAcc) against the chance iAcc of random guessing on "
            "batches drawn the same way, for the composition where its margin over chance is smallest, with 90 % "
            "count intervals. The severity follows the GLEAK-LABELS thresholds but is never critical: exact "
            "recovery needs the truth.\n\n"
            "## Mitigations\n\n" + _LABEL_MITIGATIONS),
        default_severity="medium"),
    "GLEAK-IMAGES-EXPECTED": RuleInfo(
        name="InputReconstructionExpected",
        short="Without ground truth, the inputs of batches like this one are expected to be reconstructable.",
        full=("No ground truth was available, so gleak simulated twin batches with the capture's own settings "
              "(model, batch size, steps, optimizer, loss, train mode) from the auxiliary data, reconstructed them "
              "with the same attack and budget, and measured how often each true input was identified in a "
              "lineup of look-alikes."),
        help_markdown=(
            "# Expected input reconstruction (GLEAK-IMAGES-EXPECTED)\n\n"
            "gleak had no ground truth for this capture. It simulated a few batches like the client's from the "
            "auxiliary data, reconstructed them with the attack and budget the capture got, and scored each "
            "reconstruction's identification in a lineup of same-class distractors. The finding reports the "
            "pooled identification rate, its 95 % interval and the range one batch of this size is expected in. "
            "The severity follows the GLEAK-IMAGES thresholds but is never critical.\n\n"
            "## Mitigations\n\n" + _MITIGATIONS),
        default_severity="medium"),
    "GLEAK-LABELS-ABSTAINED": RuleInfo(
        name="LabelLeakageAbstained",
        short="Without ground truth, no label attack beats chance on batches simulated like this one.",
        full=("No ground truth was available and no label attack beat random guessing on client contributions "
              "gleak simulated with the capture's settings, on uniform and on skewed batches alike: gleak abstains "
              "on the labels. Informational: not a leak, and not proof that none exists."),
        help_markdown=(
            "# Label leakage: gleak abstains (GLEAK-LABELS-ABSTAINED)\n\n"
            "gleak had no ground truth for this capture. It calibrated every label attack on batches simulated "
            "like the client's from the auxiliary data, and none beat the chance iAcc of random guessing on both "
            "compositions (uniform and skewed batches). Rather than report counts that are no better than a "
            "guess, it abstains: the message names the best attack and its margin over chance on each "
            "composition. Stronger attacks, a different model state or the ground truth may still show a leak; "
            "write the truth file next to the capture to score it.\n"),
        default_severity="info"),
    INPUT_ERROR: RuleInfo(
        name="InputError",
        short="A capture could not be audited.",
        full=("gleak could not read or audit this capture (a malformed file, a missing model, an unsupported "
              "layout): nothing is known about what it leaks."),
        help_markdown=(
            "# Input error (GLEAK-INPUT-ERROR)\n\n"
            "gleak could not audit this capture, so its leakage is unknown. The result's message gives the "
            "reason; fix the input (or the model and auxiliary data it needs) and run the audit again.\n"),
        default_severity="high"),
}


def _generic_rule(rule_id: str) -> RuleInfo:
    return RuleInfo(
        name="".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", rule_id) if part) or "Finding",
        short=f"gleak finding {rule_id}.",
        full=f"A leak measured by gleak against a documented threshold (finding type {rule_id}).",
        help_markdown=(f"# {rule_id}\n\nA leak measured by gleak against a documented threshold; see the "
                       "result's message and the audit report for the measurement.\n\n"
                       "## Mitigations\n\n" + _MITIGATIONS),
        default_severity="medium")


def _markdown_to_text(markdown: str) -> str:
    text = re.sub(r"^#+\s*", "", markdown, flags=re.MULTILINE)
    return text.replace("**", "").replace("`", "")


def _finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    return value if value is None or math.isfinite(value) else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def artifact_uri(path: str, cwd: Path | None = None) -> str:
    """The capture ``path`` as a SARIF ``artifactLocation.uri``.

    Relative to ``cwd`` (default: the working directory) with posix separators when the file lies under it;
    otherwise the path as given, with posix separators and without a Windows drive or UNC host, so that it is
    never mistaken for a URI scheme. Percent-encoded where URI syntax requires it.
    """
    base = Path.cwd() if cwd is None else cwd
    relative: str | None = None
    windows = re.match(r"^(?:[A-Za-z]:[\\/]|\\\\)", path) is not None
    if path and not windows:
        for resolve in (os.path.abspath, os.path.realpath):
            try:
                rel = Path(resolve(base / path)).relative_to(resolve(base))
            except (ValueError, OSError):
                continue
            if rel.parts:
                relative = rel.as_posix()
                break
    if relative is None:
        if windows:
            win = PureWindowsPath(path)
            relative = PurePosixPath("/", *win.parts[1:]).as_posix()
        else:
            relative = path.replace(os.sep, "/") if os.sep != "/" else path
    # ':' is encoded too: "a:b" in a relative reference would read as the scheme "a".
    return quote(relative, safe="/-._~!$&'()*+,;=@", errors="surrogateescape")


def _location(uri: str) -> dict[str, Any]:
    artifact: dict[str, Any] = {"uri": uri}
    if not uri.startswith("/"):
        artifact["uriBaseId"] = "%SRCROOT%"
    return {"physicalLocation": {"artifactLocation": artifact, "region": {"startLine": 1}}}


def _fingerprint(rule: str, uri: str) -> dict[str, str]:
    return {FINGERPRINT_KEY: hashlib.sha256(f"{rule}\0{uri}".encode()).hexdigest()}


def _finding_message(f: Finding) -> str:
    parts = [f.title.rstrip(".")]
    measures = []
    if f.measured is not None:
        measures.append(f"measured {f.metric or 'value'} {_fmt(f.measured)}")
    if f.chance is not None:
        measures.append(f"chance {_fmt(f.chance)}")
    if f.threshold is not None:
        measures.append(f"{f.severity} threshold {_fmt(f.threshold)}")
    if measures:
        parts.append(": " + ", ".join(measures))
    parts.append(f" [{f.severity}].")
    if f.detail:
        parts.append(f" {f.detail}")
    return "".join(parts)


def _rule_severities(report: Report) -> dict[str, Severity]:
    """Each rule's security severity: the worst of its results in this report, else the rule's default."""
    worst: dict[str, Severity] = {}
    for f in report.findings:
        if f.rule not in worst or severity_rank(f.severity) > severity_rank(worst[f.rule]):
            worst[f.rule] = f.severity
    if report.has_errors():
        worst[INPUT_ERROR] = "high"
    return worst


def _rule(rule_id: str, severity: Severity) -> dict[str, Any]:
    info = RULES.get(rule_id) or SERVER_RULES.get(rule_id) or _generic_rule(rule_id)
    return {
        "id": rule_id,
        "name": info.name,
        "shortDescription": {"text": info.short},
        "fullDescription": {"text": info.full},
        "defaultConfiguration": {"level": LEVEL[severity]},
        "help": {"text": _markdown_to_text(info.help_markdown), "markdown": info.help_markdown},
        "properties": {
            "tags": ["security", "privacy"] if rule_id != INPUT_ERROR else ["security", "privacy", "input"],
            "precision": "high",
            "security-severity": SECURITY_SEVERITY[severity],
        },
    }


def _finding_result(f: Finding, index: int) -> dict[str, Any]:
    uri = artifact_uri(f.capture)
    return {
        "ruleId": f.rule,
        "ruleIndex": index,
        "level": LEVEL[f.severity],
        "message": {"text": _finding_message(f)},
        "locations": [_location(uri)],
        "partialFingerprints": _fingerprint(f.rule, uri),
        "properties": {
            "severity": f.severity,
            "security-severity": SECURITY_SEVERITY[f.severity],
            "metric": f.metric,
            "measured": _finite(f.measured),
            "chance": _finite(f.chance),
            "threshold": _finite(f.threshold),
            "attack": f.attack,
        },
    }


def _error_result(capture: CaptureReport, index: int) -> dict[str, Any]:
    uri = artifact_uri(capture.capture.path)
    return {
        "ruleId": INPUT_ERROR,
        "ruleIndex": index,
        "level": "error",
        "message": {"text": f"gleak could not audit this capture: {capture.error or 'unknown error'}"},
        "locations": [_location(uri)],
        "partialFingerprints": _fingerprint(INPUT_ERROR, uri),
        "properties": {"severity": "high", "security-severity": SECURITY_SEVERITY["high"]},
    }


def build(report: Report) -> dict[str, Any]:
    """The SARIF log of ``report`` as a JSON-ready dict."""
    severities = _rule_severities(report)
    rule_ids = list(RULES)
    rule_ids += sorted({f.rule for f in report.findings} - set(RULES))
    index = {rule_id: i for i, rule_id in enumerate(rule_ids)}
    rules = [_rule(r, severities.get(r) or (RULES.get(r) or SERVER_RULES.get(r) or _generic_rule(r)).default_severity)
             for r in rule_ids]

    results: list[dict[str, Any]] = []
    for capture in report.captures:
        if capture.status == "error":
            results.append(_error_result(capture, index[INPUT_ERROR]))
    ordered = sorted(report.findings, key=lambda f: -severity_rank(f.severity))
    results += [_finding_result(f, index[f.rule]) for f in ordered]

    invocation: dict[str, Any] = {"executionSuccessful": not report.has_errors()}
    if report.command:
        invocation["commandLine"] = shlex.join(report.command)
    notifications = []
    for notice in report.notices:
        note: dict[str, Any] = {"level": "warning", "message": {"text": notice.message},
                                "descriptor": {"id": notice.code}}
        if notice.capture:
            note["locations"] = [_location(artifact_uri(notice.capture))]
        notifications.append(note)
    if notifications:
        invocation["toolExecutionNotifications"] = notifications

    run: dict[str, Any] = {
        "tool": {"driver": {
            "name": "gleak",
            "fullName": "gleak: gradient leakage audit for federated learning",
            "version": report.gleak_version,
            "semanticVersion": report.gleak_version,
            "rules": rules,
        }},
        "invocations": [invocation],
        "columnKind": "unicodeCodePoints",
        "results": results,
        "properties": {
            "budget": report.budget,
            "failOn": report.fail_on,
            "failed": report.failed(),
            "seed": report.seed,
            "severities": list(SEVERITIES),
        },
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def render(report: Report, out_dir: Path | None = None) -> str:
    """The SARIF log as indented JSON (ASCII: undecodable file names stay writable)."""
    return json.dumps(build(report), indent=1, allow_nan=False) + "\n"


_SERVER_HELP = (
    "## What to do\n\n"
    "- **Do not train on this model.** A client that trains on it sends back an update from which the server can "
    "read training examples exactly, whatever the batch size and even under secure aggregation.\n"
    "- **Load received weights into your own architecture with a strict key and shape check**, and run "
    "`gleak check-model` on every round's model (the Flower guard does this before local training).\n"
    "- **Ask the federation's operator** why the model carries this structure; honest initialisation and "
    "training do not produce it.\n")

SERVER_RULES: dict[str, RuleInfo] = {
    rule: RuleInfo(name=name, short=short, full=full,
                   help_markdown=f"# {short} ({rule})\n\n{full}\n\n{_SERVER_HELP}", default_severity="critical")
    for rule, name, short, full in (
        ("GLEAK-SERVER-ARCHITECTURE", "TamperedArchitecture", "The global model does not fit the client's "
         "architecture.", "Tensors were added, removed or reshaped: the published forms of Robbing the Fed (Fowl "
         "et al., ICLR 2022), trap weights (Boenisch et al., EuroS&P 2023) and LOKI insert a layer before the "
         "model that copies inputs into its gradient."),
        ("GLEAK-SERVER-IMPRINT", "ImprintLayer", "A layer's rows read one direction (an imprint).",
         "Many rows of one layer are (near-)copies of one measurement vector, as in Robbing the Fed's imprint "
         "layer: each row fires above its own threshold, and the difference of adjacent rows' gradients is a "
         "training example."),
        ("GLEAK-SERVER-CONSTANT-ROWS", "ConstantRows", "A layer holds rows of one constant value.",
         "Rows whose entries are all equal: class fishing's target rows (Wen et al., ICML 2022), averaging "
         "imprints, and the equal-weight connections behind imprint layers."),
        ("GLEAK-SERVER-TRAP-WEIGHTS", "TrapWeights", "A layer holds trap weights.",
         "Each row pairs every negative weight with a scaled positive copy (Boenisch et al., EuroS&P 2023), so "
         "the row fires for few inputs and its gradient is one training example."),
        ("GLEAK-SERVER-INPUT-PASSING", "InputPassing", "A layer passes its input through.",
         "A convolution kernel or matrix that copies one input (Dirac kernels, identities, shifts), as the deep "
         "placements of imprint attacks and Decepticons use to carry the input to a trap."),
        ("GLEAK-SERVER-EXTREME-BIAS", "ExtremeBias", "A layer's biases are far outside its scale.",
         "Biases tens to thousands of times the layer's weight scale: class fishing sets every other class's "
         "bias to 1000 so that only the target's examples send gradient into the model."),
        ("GLEAK-SERVER-EXACT-LEAK", "ExactLeak", "A server can copy your examples exactly from this model.",
         "Measured on your own examples before training: the share of a probe batch that the gradient of the "
         "model's first layer gives away exactly (one neuron or one pair of adjacent imprint rows per example)."),
        ("GLEAK-SERVER-ZEROED-EMBEDDING", "ZeroedEmbedding", "An embedding's leading columns are zero.",
         "Columns of a token or position embedding set to zero in every row, freed to carry a measurement "
         "(Decepticons, Fowl et al., ICLR 2023)."),
    )
}
TIER_LEVEL = {"trap": "error", "suspicious": "warning"}


def build_check(report: Any) -> dict[str, Any]:
    """The SARIF log of a ``gleak check-model`` report: one rule per finding type, one result per finding,
    located at the model file."""
    rule_ids = sorted({f.rule for f in report.findings})
    index = {r: i for i, r in enumerate(rule_ids)}
    uri = artifact_uri(report.model)
    rules = []
    for r in rule_ids:
        info = SERVER_RULES.get(r) or _generic_rule(r)
        rules.append({"id": r, "name": info.name, "shortDescription": {"text": info.short},
                      "fullDescription": {"text": info.full}, "defaultConfiguration": {"level": "error"},
                      "help": {"text": _markdown_to_text(info.help_markdown), "markdown": info.help_markdown},
                      "properties": {"tags": ["security", "privacy", "malicious-server"], "precision": "high",
                                     "security-severity": SECURITY_SEVERITY["critical"]}})
    results = [{
        "ruleId": f.rule, "ruleIndex": index[f.rule], "level": TIER_LEVEL[f.tier],
        "message": {"text": f"{f.title} ({f.metric} {_fmt(f.measured)}, threshold {_fmt(f.threshold)}; honest: "
                            f"{f.null}) [{f.tier}]."},
        "locations": [_location(uri)],
        "partialFingerprints": _fingerprint(f"{f.rule}\0{f.layer}", uri),
        "properties": {"tier": f.tier, "layer": f.layer, "metric": f.metric, "measured": _finite(f.measured),
                       "threshold": _finite(f.threshold)},
    } for f in report.findings]
    run = {"tool": {"driver": {"name": "gleak", "fullName": "gleak: gradient leakage audit for federated learning",
                               "version": report.gleak_version, "semanticVersion": report.gleak_version,
                               "rules": rules}},
           "invocations": [{"executionSuccessful": True}], "columnKind": "unicodeCodePoints", "results": results,
           "properties": {"verdict": report.verdict}}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}
