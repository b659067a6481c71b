"""The reports: versioned, typed result models (pydantic v2) behind every JSON document gleak writes.

``Report`` is what ``gleak audit`` builds and what the formatters in :mod:`gleak.report.formats` read;
``LabelsReport``, ``ReconstructReport``, ``InspectReport``, ``SweepReport`` and ``TrainGeneratorReport`` are the JSON
of ``gleak labels``, ``gleak reconstruct`` (stdout and ``metrics.json``), ``gleak inspect``, ``gleak sweep``
(``sweep.json``) and ``gleak train-generator``. Every one starts with the same header (``schema_version``, ``tool``,
``gleak_version`` and ``report``, naming the model). One JSON Schema covering them all (``oneOf``) ships as
``gleak/report/schema.json`` (regenerate with ``python -m gleak.report.model``); tests check that the shipped file
matches the models and validate every JSON gleak writes against it.

Untrusted text (file names, metadata, reasons quoting them) is stored as given: escaping is each formatter's
job (HTML, Markdown, XML), never the model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer
from pydantic.json_schema import models_json_schema

from gleak.model_check import ModelCheck as ModelCheck  # the one type: made by gleak.capture.check_model_hash

# the vocabularies of the settings, which the reports record (re-exported)
from gleak.settings.values import FAIL_ROUNDS_PATTERN as FAIL_ROUNDS_PATTERN
from gleak.settings.values import SEVERITIES as SEVERITIES
from gleak.settings.values import Budget as Budget
from gleak.settings.values import ExecutorName as ExecutorName
from gleak.settings.values import FailOn as FailOn
from gleak.settings.values import Severity as Severity
from gleak.settings.values import Thresholds as Thresholds

SCHEMA_VERSION: Literal["2"] = "2"
SCHEMA_PATH = Path(__file__).with_name("schema.json")

Status = Literal["ok", "not_applicable", "failed", "error", "abstained"]
"""ok: counts or images; not_applicable: the attack cannot run on this input; failed: bad input stopped it; error: an
unexpected exception; abstained: it ran and answered that it cannot tell (the calibrated selector when no candidate
beats chance on batches simulated like this one): no counts, the reason and its calibration say why."""


def severity_rank(severity: str) -> int:
    """Position of ``severity`` in :data:`SEVERITIES` (info = 0 … critical = 4)."""
    if severity == "none":  # --fail-on none: above every severity, so nothing reaches it
        return len(SEVERITIES)
    return [str(s) for s in SEVERITIES].index(severity)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileRef(_Model):
    """An input file: its path as given and the sha256 of its bytes."""

    path: str
    sha256: str | None = None


class AttackEntry(_Model):
    """One attack on one capture."""

    attack: str
    task: Literal["labels", "reconstruct"]
    status: Status
    seconds: float = 0.0
    reason: str | None = Field(None, description="why it did not apply, failed, raised or abstained (one line)")
    counts: list[int] | None = Field(None, description="recovered examples per class (label attacks)")
    soft_label: list[float] | None = None
    scores: dict[str, float | None] | None = Field(None, description="against the ground truth, when known")
    options: dict[str, Any] = Field(default_factory=dict, description="the options the attack ran with")
    warnings: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list, description="files written for this attack (relative)")
    confidence: dict[str, Any] | None = Field(None, description="label attacks without truth: calibrated on "
                                              "simulated batches (level, half_width, intervals, composition, "
                                              "expected_iacc, chance_iacc, informative, simulations, "
                                              "by_composition, fit), or why not; an abstention: the calibration "
                                              "it rests on")
    identification: dict[str, Any] | None = Field(None, description="reconstructions with ground truth: the "
                                                  "lineup (rate, identified, n, chance, kappa, interval, level, "
                                                  "similarity, distractors, lineup source, ranks, matched)")


NOT_ASSESSED = "GLEAK-NOT-ASSESSED"  # a threat that applies to a capture and that no attack could measure


class Finding(_Model):
    """A leak measured against a documented threshold."""

    rule: str = Field(description="stable finding type, e.g. GLEAK-LABELS")
    severity: Severity
    capture: str
    title: str
    measured: float | None = None
    metric: str | None = None
    chance: float | None = Field(None, description="the same metric for random guessing, where one exists")
    threshold: float | None = Field(None, description="the value at which this severity starts")
    attack: str | None = None
    detail: str | None = None


class Notice(_Model):
    """A warning with a stable code (e.g. NO_TRUTH, SKIPPED)."""

    code: str
    message: str
    capture: str | None = None


Finite = Annotated[float, Field(allow_inf_nan=False)]  # JSON has no NaN or infinity: a sweep never records one


class EpsilonTerms(_Model):
    """The terms an ε of DP-SGD holds under (``gleak.dp.*``): without them an ε is not a guarantee anyone can
    check. :func:`gleak.report.privacy.describe_epsilon` states them in words."""

    delta: Finite = Field(ge=0, description="δ of the (ε, δ) guarantee")
    accountant: Literal["rdp", "prv"] = Field(description="the Opacus accountant that gave ε")
    sample_rate: Finite = Field(ge=0, description="q: the sample rate the accountant used")
    steps: int = Field(ge=1, description="noisy steps per round accounted")
    rounds: int = Field(ge=1, description="rounds accounted (1: the ε of this one contribution)")
    noise_multiplier: Finite = Field(ge=0, description="z: noise std over the clipping bound")
    max_grad_norm: Finite | None = Field(None, ge=0, description="C: the per-example clipping bound")
    target_epsilon: Finite | None = Field(None, description="the ε aimed at (dpsgd:epsilon=E; z picked by Opacus's "
                                          "get_noise_multiplier), else null")


class SentenceResult(_Model):
    """The audit's sentence reconstruction of a language model's capture: counts and scores, never token ids or
    text (audit reports end up in CI logs)."""

    attack: str
    status: Status
    reason: str | None = None
    seconds: float
    sequences: int = Field(0, description="sequences recovered")
    exact: int = Field(0, description="sequences with every token proven by the attack's tests")
    exact_up_to_last: int = Field(0, description="sequences with every token but the last proven (exact ones "
                                  "included)")
    scores: dict[str, float] | None = Field(None, description="against the truth: rouge1, rouge2, rougeL, "
                                            "exact_match, exact_up_to_last, token_accuracy, with chance_ values")
    expected: dict[str, Any] | None = Field(None, description="without truth, with --aux text: the mean scores of "
                                            "the same attack on twin batches drawn from it (twins, rouge1, "
                                            "exact_match, chance_rouge1, aux)")


Threat = Literal["labels", "images", "tokens", "sentences"]
"""What a capture can give away: an image classifier's labels and images; a language model's tokens (the batch's
bag of tokens) and sentences (its sequences in order)."""


class ThreatCoverage(_Model):
    """Whether the audit measured one threat of a capture: ``assessed`` (scored against the truth, expected from
    twin batches or calibrated simulations, or implied: no token leaks, so no sentence does), ``not_assessed`` (no
    attack could measure it: the reason says why; a GLEAK-NOT-ASSESSED finding), or ``outside_budget`` (the
    budget plans no attack for it: the quick budget reconstructs no images unless an analytic inversion applies)."""

    threat: Threat
    status: Literal["assessed", "not_assessed", "outside_budget"]
    by: str | None = Field(None, description="how it was measured: the attack, and truth / expected / implied")
    reason: str | None = Field(None, description="why it was not assessed (one line)")


class CaptureReport(_Model):
    """Everything the audit learned from one capture (or why it could not read it)."""

    capture: FileRef
    status: Literal["ok", "error"] = "ok"
    error: str | None = None
    model: FileRef | None = None
    aux: FileRef | None = None
    truth: FileRef | None = None
    round: int | None = Field(None, description="the federated round (gleak.fl.round), when recorded")
    client: str | None = Field(None, description="the client (gleak.fl.client_id), when recorded")
    defense: list[dict[str, Any]] | None = Field(None, description="the defenses the capture records (gleak.defense, "
                                                 "in the order applied), when any")
    epsilon: float | None = Field(None, description="DP-SGD: the ε the capture records (gleak.dp.epsilon), when any")
    epsilon_terms: EpsilonTerms | None = Field(None, description="what epsilon holds under (gleak.dp.*: δ, "
                                               "accountant, q, steps, rounds, z)")
    kind: str | None = None
    batch_size: int | None = None
    local_steps: int | None = None
    num_classes: int | None = None
    last_layer: str | None = None
    loss: dict[str, Any] | None = None
    model_mode: str | None = None
    assumptions: list[str] = Field(default_factory=list, description="what the attacks assumed, and from where")
    truth_counts: list[int] | None = None
    chance: dict[str, float] | None = None
    attacks: list[AttackEntry] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="planned work left out, and why")
    expected_images: dict[str, Any] | None = Field(None, description="without truth, with aux data: identification "
                                                   "of reconstructions of twin batches simulated like this capture's "
                                                   "(rate, chance, kappa, interval, predicted, twins, n, attack)")
    seconds: float = 0.0
    stage_seconds: dict[str, float] | None = Field(None, description="where the time went: load (files, hashes), "
                                                   "context, model_check (the server-structure check), labels, "
                                                   "reconstruction")
    tokens: list[TokenResult] | None = Field(None, description="a language model's capture: the token attacks' "
                                             "results (token ids, counts and scores; never decoded text: the audit "
                                             "has no --show-text); absent for other captures")
    sentences: SentenceResult | None = Field(None, description="a language model's capture: the sentence "
                                             "reconstruction (DAGER), scored against the truth or, without it, "
                                             "expected from twin batches of --aux text; absent for other captures")
    expected_tokens: dict[str, Any] | None = Field(None, description="a language model's capture without truth, "
                                                   "with --aux text: the token attacks on twin batches simulated like "
                                                   "this capture's, scored (attack, twins, recall, precision, "
                                                   "sensitive_recall: mean, min and max over the twins, with chance)")
    coverage: list[ThreatCoverage] | None = Field(None, description="each threat that applies to the capture and "
                                                  "whether the audit measured it (GLEAK-NOT-ASSESSED when not)")

    @model_serializer(mode="wrap")
    def _without_absent_tokens(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``tokens`` and ``sentences`` are left out of the JSON of a capture that has none (every image capture's
        report keeps its bytes)."""
        data: dict[str, Any] = handler(self)
        for key in ("tokens", "sentences", "expected_tokens"):
            if data.get(key, ...) is None:
                del data[key]
        return data

    def best_label(self) -> AttackEntry | None:
        """The label attack with the highest iAcc against the truth (the first on a tie), or None when none was
        scored — what GLEAK-LABELS, the run view and every format report as "the best label attack"."""
        scored = [a for a in self.attacks if a.task == "labels" and a.scores and a.scores.get("iacc") is not None]
        return max(scored, key=lambda a: float((a.scores or {})["iacc"] or 0.0), default=None)

    def best_tokens(self) -> TokenResult | None:
        """The token attack with the highest recall against the truth's tokens (the first on a tie), or None when
        none was scored — what GLEAK-TEXT-TOKENS and every format report as "the best token attack"."""
        scored = [t for t in self.tokens or [] if t.status == "ok" and t.scores and "recall" in t.scores]
        return max(scored, key=lambda t: float((t.scores or {})["recall"]), default=None)


class SeriesInfo(_Model):
    """One leakage series of the run view: what it measures, and the finding rule it belongs to."""

    name: str = Field(description="stable key, e.g. label_iacc")
    title: str = Field(description="what it shows, e.g. 'best label iAcc over rounds' (the plots' accessible name)")
    metric: str
    unit: str | None = None
    rule: str | None = Field(None, description="the finding rule measured on the same numbers, if any")


class SeriesPoint(_Model):
    """One series at one round: over the round's captures that have a value."""

    n: int = Field(description="captures with a value")
    max: float
    median: float
    chance: float | None = Field(None, description="median over those captures of the same metric for random "
                                 "guessing, where one exists")


class RoundSummary(_Model):
    """One round of the run (or the captures without a round)."""

    round: int | None = Field(description="gleak.fl.round; null: the captures that record no round ('unknown round')")
    captures: int
    clients: int = Field(description="distinct clients (captures without gleak.fl.client_id count one each)")
    errors: int = Field(0, description="captures that could not be audited")
    worst: Severity | None = Field(None, description="the highest severity of the round's findings")
    findings: int = Field(0, description="findings in the round's captures")
    gated: bool = Field(True, description="whether the gate (fail_rounds) looks at this round")
    series: dict[str, SeriesPoint] = Field(default_factory=dict)


class ClientSummary(_Model):
    """One client across the run."""

    client: str | None = Field(description="gleak.fl.client_id; null: captures that record none")
    captures: int
    rounds: int = Field(description="distinct rounds it took part in")
    worst: Severity | None = None
    worst_round: int | None = Field(None, description="the round of its worst finding (the latest, on a tie)")
    worst_rule: str | None = None
    worst_title: str | None = None
    series_max: dict[str, float] = Field(default_factory=dict, description="per series, its largest value")


class EpsilonAfterRound(_Model):
    """A client's cumulative ε after one round it trained in."""

    round: int | None = Field(description="the round (null: a capture without a round, composed last)")
    epsilon: Finite | None = Field(description="ε composed over every round so far; null when unknown (reason)")
    reason: str | None = Field(None, description="why ε is unknown: the first round that records no DP, or no "
                               "finite bound (z = 0)")
    sample_rate: Finite | None = Field(None, description="q of this round's noisy steps (gleak.dp.sample_rate)")
    steps: int | None = Field(None, description="this round's noisy steps (gleak.dp.steps)")
    noise_multiplier: Finite | None = Field(None, description="z of this round (gleak.dp.noise_multiplier)")


class ClientPrivacy(_Model):
    """One client's privacy spent over the run, round by round."""

    client: str | None = Field(description="gleak.fl.client_id; null: a capture that records none")
    rounds: list[EpsilonAfterRound] = Field(default_factory=list, description="in round order")
    epsilon: Finite | None = Field(None, description="after its last round (null: unknown, see the rounds)")
    over_budget_round: int | None = Field(None, description="the first round whose cumulative ε exceeds "
                                          "max_epsilon, when one does")


class RunPrivacy(_Model):
    """Differential privacy accounted over the run: each client's cumulative ε after each round, composed by
    Opacus's accountant from what its captures record (gleak.dp.*), at one δ stated once."""

    delta: Finite = Field(gt=0, description="δ every ε here holds at")
    accountant: Literal["rdp", "prv"]
    kind: str = Field(description="what is accounted: local DP-SGD on each client (gleak.dp.*)")
    max_epsilon: Finite | None = Field(None, description="the budget --max-epsilon set, else null")
    clients: list[ClientPrivacy] = Field(default_factory=list, description="largest ε first; unknown last")
    notes: list[str] = Field(default_factory=list, description="what the accounting assumed or could not do")


class RunView(_Model):
    """The captures grouped by round and client (gleak.fl.round / gleak.fl.client_id), computed from the captures'
    scores and findings in this report: no attack runs again for it."""

    series: list[SeriesInfo] = Field(default_factory=list)
    rounds: list[RoundSummary] = Field(default_factory=list, description="by round number; the unknown round last")
    clients: list[ClientSummary] = Field(default_factory=list, description="worst first")
    clear_from: int | None = Field(None, description="the first round from which no round has a finding at or above "
                                   "fail_on (null: the last round has one, there are no rounds, or fail_on is none)")
    series_clear_from: dict[str, int | None] = Field(default_factory=dict, description="per series with a rule: the "
                                                     "first round from which no capture has a finding of that rule")
    plots: list[str] = Field(default_factory=list, description="PNG files written beside the report (with -o)")
    privacy: RunPrivacy | None = Field(None, description="ε accounted over the run, when a capture records DP-SGD "
                                       "(gleak.dp.*)")


class Report(_Model):
    """The whole audit."""

    schema_version: Literal["2"] = SCHEMA_VERSION
    tool: Literal["gleak"] = "gleak"
    gleak_version: str
    report: Literal["audit"] = "audit"
    command: list[str] = Field(default_factory=list, description="how to reproduce the run")
    budget: Budget = "quick"
    fail_on: FailOn = "high"
    fail_rounds: str = Field("any", pattern=FAIL_ROUNDS_PATTERN, description="which rounds the gate looks at: any, "
                             "last:K or all")
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    jobs: int = Field(1, description="--jobs: captures audited at once (0: auto)")
    workers: int = Field(1, description="processes (local) or actors (Ray) that audited the captures")
    executor: ExecutorName = "local"
    thresholds: Thresholds = Field(default_factory=Thresholds)
    captures: list[CaptureReport] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    notices: list[Notice] = Field(default_factory=list)
    run: RunView | None = Field(None, description="captures grouped by round and client, when any records one")
    accept_unassessed: bool = Field(False, description="--accept-unassessed: threats no attack could measure do not "
                                    "fail the gate (their GLEAK-NOT-ASSESSED findings are info)")
    seconds: float = 0.0

    def worst(self) -> Severity | None:
        """The highest severity among the findings, or None."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=severity_rank)

    def failed(self) -> bool:
        """Whether a finding is at or above ``fail_on`` (never with ``none``) in the rounds ``fail_rounds`` names:
        any round; the last K rounds (captures without a round always count); or every round (a leak throughout).
        Without round metadata every scope is ``any``. A threat not assessed (GLEAK-NOT-ASSESSED) fails it too, at
        any ``fail_on`` but ``none``, unless ``accept_unassessed``."""
        if self.fail_on == "none":
            return False
        return self._gates({f.capture for f in self.findings if self._at_gate(f) or self._unassessed(f)})

    def inconclusive(self) -> bool:
        """Whether the gate fails only because threats were not assessed (GLEAK-NOT-ASSESSED): no leak found at the
        gate, and none ruled out either. Such findings fail the gate whatever ``fail_on`` (bar ``none``), unless
        ``accept_unassessed``."""
        if not self.failed():
            return False
        return not self._gates({f.capture for f in self.findings if self._at_gate(f) and f.rule != NOT_ASSESSED})

    def _at_gate(self, finding: Finding) -> bool:
        return severity_rank(finding.severity) >= severity_rank(self.fail_on)

    def _unassessed(self, finding: Finding) -> bool:
        return finding.rule == NOT_ASSESSED and not self.accept_unassessed

    def _gates(self, failing: set[str]) -> bool:
        """Whether findings of these captures fail the gate in the rounds ``fail_rounds`` names."""
        rounds = sorted({c.round for c in self.captures if c.round is not None})
        if self.fail_rounds == "any" or not rounds:
            return bool(failing)
        round_of = {c.capture.path: c.round for c in self.captures}
        if self.fail_rounds == "all":
            hit = {round_of.get(path) for path in failing}
            return all(r in hit for r in rounds)
        gated = self.gated_rounds()
        return any(round_of.get(path) is None or round_of[path] in gated for path in failing)

    def gated_rounds(self) -> set[int]:
        """The round numbers the gate looks at (``last:K``: the K highest; otherwise every round)."""
        rounds = sorted({c.round for c in self.captures if c.round is not None})
        if self.fail_rounds.startswith("last:"):
            return set(rounds[-int(self.fail_rounds.partition(":")[2]):])
        return set(rounds)

    def has_errors(self) -> bool:
        """Whether any capture could not be audited (bad input)."""
        return any(c.status == "error" for c in self.captures)


# ------------------------------------------------------------------------ labels, reconstruct, inspect
# These mirror, key for key, the JSON the commands wrote before they had models. Keys a command writes only
# sometimes default to None and are left out of the JSON when not given (see ``CommandReport.to_json``).


class ModelMode(_Model):
    """The mode the attacks run the model in."""

    batch_statistics: bool
    note: str


class LossInfo(_Model):
    """The training loss the attacks assume."""

    name: str
    reduction: str
    temperature: float
    label_smoothing: float
    focal_gamma: float
    focal_alpha: float


class ChanceScores(_Model):
    """Expected iAcc and cAcc of uniform random guessing for the true batch."""

    iacc: float
    cacc: float


class LabelResult(_Model):
    """One label attack's result."""

    attack: str
    status: Status
    seconds: float
    reason: str | None = Field(None, description="why it did not apply, failed, raised or abstained (one line)")
    options: dict[str, Any] | None = Field(None, description="the options the attack ran with")
    counts: list[int] | None = Field(None, description="recovered examples per class")
    soft_label: list[float] | None = None
    diagnostics: dict[str, Any] | None = None
    warnings: list[str]
    scores: dict[str, float] | None = Field(None, description="against the ground truth, when known")
    confidence: dict[str, Any] | None = Field(None, description="with --confidence: calibrated on simulated batches "
                                              "(level, half_width, intervals, composition, expected_iacc, "
                                              "chance_iacc, informative, simulations, by_composition, fit), or why "
                                              "not; an abstention (status abstained): the calibration it rests on")


HEADER_KEYS = ("schema_version", "tool", "gleak_version", "report")


class CommandReport(_Model):
    """The header every command's JSON report starts with."""

    schema_version: Literal["2"] = SCHEMA_VERSION
    tool: Literal["gleak"] = "gleak"
    gleak_version: str

    @classmethod
    def build(cls, data: dict[str, Any]) -> Self:
        """The report of ``data`` (the command's keys), with the header filled in; raises on a missing,
        unknown or mistyped key."""
        from gleak import __version__

        header = {"schema_version": SCHEMA_VERSION, "tool": "gleak", "gleak_version": __version__,
                  "report": cls.model_fields["report"].default}
        return cls.model_validate({**header, **data})

    def model_post_init(self, context: Any, /) -> None:
        """The header is part of every report, however it was built (keyword arguments leave defaults unset)."""
        self.__pydantic_fields_set__.update(HEADER_KEYS)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data: every key given when built (optional keys not given stay out)."""
        return self.model_dump(mode="json", exclude_unset=True)


class LabelsReport(CommandReport):
    """``gleak labels``: the capture, the loss, the truth and chance baseline, each attack's result."""

    report: Literal["labels"] = "labels"
    capture: str
    kind: str
    batch_size: int | None
    local_steps: int
    num_classes: int
    last_layer: str
    gradient_note: str | None
    loss: LossInfo
    truth_file: str | None
    model_check: ModelCheck | None
    model_mode: ModelMode | None
    truth_counts: list[int] | None
    chance: ChanceScores | None
    results: list[LabelResult]
    threads: int
    truth_soft_label: list[float] | None
    ignored_options: list[str] = Field(description="options the user set that no attack that ran used")


class RecoveredToken(_Model):
    """One token a token attack recovered: its id and rough count; its text only with ``--show-text``."""

    id: int
    count: int
    confidence: float | None = Field(None, description="how sure the attack is of this token, in [0, 1], where it "
                                     "measures one (sparse-tokens: the share of the token's own explained energy "
                                     "above the residual floor)")
    text: str | None = Field(None, description="the decoded token: present only when the run asked for it "
                             "(--show-text); recovered text is the client's data itself")


class TokenResult(_Model):
    """One token attack's result (ids and counts; scored against the truth's token multiset when known)."""

    attack: str
    status: Status
    seconds: float
    reason: str | None = Field(None, description="why it did not apply, failed or raised (one line)")
    options: dict[str, Any] | None = None
    method: str | None = Field(None, description="how the tokens were told apart (e.g. nonzero-rows, span-residual, "
                               "row-norm)")
    truth: str | None = Field(None, description="what the scores compare with: inputs (the tokens the model read), "
                              "targets (the tokens it predicted) or all")
    tokens: list[RecoveredToken] | None = None
    max_length: int | None = Field(None, description="the longest sequence (seq-length)")
    lengths: dict[str, int] | None = Field(None, description="sequence length -> sequences (seq-length, heuristic)")
    scores: dict[str, float] | None = Field(None, description="precision, recall and F1 over distinct tokens, count "
                                            "accuracy, sensitive_recall, and each one's chance_ value")
    diagnostics: dict[str, Any] | None = None
    warnings: list[str]


class TokensReport(CommandReport):
    """``gleak labels`` on a language model's capture: the token attacks' results. No decoded text unless the run
    asked for it (``show_text``)."""

    report: Literal["tokens"] = "tokens"
    capture: str
    kind: str
    task: str
    model_type: str
    vocab_size: int
    batch_size: int | None
    local_steps: int
    tied_embeddings: bool
    truth_file: str | None
    model_check: ModelCheck | None
    truth_tokens: dict[str, int] | None = Field(None, description="distinct tokens of the truth's inputs, targets "
                                                "and all (counts of ids, never the text)")
    sensitive_tokens: int | None = Field(None, description="distinct tokens of the batch that hold a digit or start "
                                         "with a capital letter (names, dates, record numbers)")
    show_text: bool = False
    tokens: list[RecoveredToken] | None = Field(None, description="every token of the batch the update gives away: "
                                                "the union of the input bag and the next tokens (the results' "
                                                "'union' entry), ids and counts; text only with show_text")
    token_scores: dict[str, float] | None = Field(None, description="the union's precision, recall, F1 and count "
                                                  "accuracy against every real token of the batch, with chance")
    results: list[TokenResult]
    threads: int


class RecoveredSequence(_Model):
    """One sequence a text reconstruction recovered: its token ids, whether every token (``exact``) or every token
    but the last (``exact_up_to_last``) passed the attack's tests, where its last token came from; its text only
    with ``--show-text``."""

    token_ids: list[int]
    exact: bool = Field(description="every token proven by the attack's tests (DAGER: each position in the "
                        "second-block span, and a last token from the LM head only when its solve is exact)")
    exact_up_to_last: bool = Field(False, description="every token but the last proven (DAGER on a causal LM: the "
                                   "last token is read by no span; it is solved from the LM head or missing)")
    last_from_head: bool = Field(False, description="the last token was solved from the LM head's gradient")
    matched_truth: int | None = Field(None, description="the truth sequence it is matched to (one-to-one, by "
                                      "ROUGE-1), when scored")
    scores: dict[str, float] | None = Field(None, description="against its matched truth sequence: rouge1, rouge2, "
                                            "rougeL, exact, token_accuracy")
    text: str | None = Field(None, description="the decoded sequence: only with --show-text (the leak itself)")


class TextReport(CommandReport):
    """``gleak reconstruct`` on a language model's capture: the recovered sequences as token ids, scored against
    the truth (ROUGE over token ids, exact match, token accuracy, next to chance). No decoded text unless asked."""

    report: Literal["text"] = "text"
    capture: str
    kind: str
    model_type: str
    vocab_size: int
    batch_size: int | None
    local_steps: int
    lora: bool = Field(description="the capture is a LoRA adapter's update")
    attack: str
    status: Status
    reason: str | None = Field(None, description="why it did not apply or failed (one line)")
    seconds: float
    options: dict[str, Any] | None = None
    sequences: list[RecoveredSequence]
    truth_file: str | None
    truth_sequences: int | None = Field(None, description="sequences in the truth (their number, never their text)")
    scores: dict[str, float] | None = Field(None, description="means over the truth's sequences: rouge1, rouge2, "
                                            "rougeL, exact_match, token_accuracy, with chance_ and bag_only_ "
                                            "baselines")
    model_check: ModelCheck | None
    diagnostics: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)
    show_text: bool = False
    threads: int


class ReconstructLabels(_Model):
    """The labels a reconstruction used."""

    source: str
    targets: list[dict[str, float]] = Field(description="per example: its top classes and their mass")
    classes: list[int] = Field(description="top class per reconstruction, in order")
    attack_seconds: float | None = None


class MeanImageScores(_Model):
    psnr: float | None
    ssim: float | None
    lpips: float | None = None


class ImageMetrics(_Model):
    """Matched per-image and mean PSNR / SSIM / LPIPS (null: not finite)."""

    matching: list[int]
    psnr: list[float | None]
    ssim: list[float | None]
    mean: MeanImageScores
    lpips: list[float | None] | None
    lpips_info: dict[str, Any]


class Baseline(_Model):
    """The no-attack PSNR baseline a reconstruction must beat."""

    psnr: float
    kind: str
    margin_db: float
    beaten: bool
    statement: str | None


class ReconstructReport(CommandReport):
    """``gleak reconstruct`` (stdout and ``metrics.json``)."""

    report: Literal["reconstruct"] = "reconstruct"
    capture: str
    model: str
    attack: str
    paper: str
    options: dict[str, Any]
    batch_size: int | None
    labels: ReconstructLabels
    feature_source: str | None
    seed: int
    device: str
    seconds: float
    total_seconds: float
    diagnostics: dict[str, Any]
    warnings: list[str]
    metrics: ImageMetrics | None
    model_check: ModelCheck | None
    model_mode: ModelMode | None
    ignored_options: list[str]
    threads: int
    baseline: Baseline | None
    identification: dict[str, Any] | None = Field(None, description="with ground truth: the identification lineup "
                                                  "(rate, chance, kappa, interval, distractors, lineup source, "
                                                  "ranks); lineup.png shows it")
    iterations_per_second: float | None = None
    evaluations_per_second: float | None = None
    generator: dict[str, Any] | None = None  # fgla/rgla: the generator file used and what it records
    output_scores: dict[str, Any] | None = None  # fgla/rgla: recovered logits/features vs the truth's
    images_written: bool = True  # False: a generative attack without a generator (features only)


class TensorInfo(_Model):
    name: str
    shape: list[int]
    dtype: str


class InspectModel(_Model):
    """The model given to ``inspect``."""

    file: str
    source: str
    arch: str | None
    weights_sha256: str
    model_check: ModelCheck
    matches_capture: bool | None
    mode: ModelMode | None


class LastLayerInfo(_Model):
    name: str
    weight_key: str
    bias_key: str | None
    weight_shape: list[int]
    has_bias: bool
    num_classes: int
    feature_dim: int
    reason: str


class InspectReport(CommandReport):
    """``gleak inspect``: what a capture holds, and which last layer the attacks will use."""

    report: Literal["inspect"] = "inspect"
    file: str
    kind: str
    capture_schema_version: int | None = Field(description="the capture format's version (gleak.schema_version)")
    num_tensors: int
    num_parameters: int
    batch_size: int | None
    local_steps: int
    truth_file: str | None
    metadata: dict[str, Any]
    unknown_metadata: dict[str, Any]
    tensors: list[TensorInfo]
    model: InspectModel | None
    attacks: dict[str, str | None] | None = Field(None, description="with a model: each attack -> null when it "
                                                  "applies, else why not")
    last_layer: LastLayerInfo


class ServerFinding(_Model):
    """A structure of a crafted global model found in one layer (``gleak check-model``)."""

    rule: str = Field(description="stable finding type, e.g. GLEAK-SERVER-IMPRINT")
    tier: Literal["trap", "suspicious"] = Field(description="trap: a structure honest models do not have (exit 1); "
                                                "suspicious: an outlier, reported")
    layer: str
    title: str
    metric: str
    measured: float
    threshold: float
    null: str = Field(description="what honest models give for the same statistic")


class ProbeResult(_Model):
    """``check-model --data``: how many of the client's probe examples a server could copy exactly from the model's
    first layer (the leak census), or why it was not measured."""

    data: str
    batch: int
    layer: str | None = None
    copied: int | None = Field(None, description="probe examples recovered exactly (relative error ≤ 1e-3)")
    share: float | None = Field(None, description="copied / batch: what an analytic server extracts")
    reason: str | None = Field(None, description="why nothing was measured (one line)")


class CheckModelReport(CommandReport):
    """``gleak check-model``: whether a global model carries a malicious server's structures."""

    report: Literal["check-model"] = "check-model"
    model: str
    sha256: str
    source: str = Field(description="how the weights were read (format, architecture)")
    verdict: Literal["clean", "suspicious", "flagged"] = Field(description="flagged: at least one trap; clean "
                                                              "means none of the tests found a structure, never "
                                                              "that the model is safe")
    layers: int = Field(description="weighted layers tested")
    parameters: int
    seconds: float
    findings: list[ServerFinding]
    probe: ProbeResult | None = Field(None, description="with --data: the leak census on the client's examples")
    notes: list[str] = Field(default_factory=list, description="what was not checked, and why")


class ErrorDetail(_Model):
    message: str = Field(description="the one-line error, as on stderr")
    exit_code: int = Field(description="the command's exit status (2: bad input or configuration)")


class ErrorReport(CommandReport):
    """What a command writes to stdout instead of its report when it fails under ``--format json``."""

    report: Literal["error"] = "error"
    error: ErrorDetail


# ------------------------------------------------------------------------ train-generator
class TrainExamples(_Model):
    total: int
    train: int
    heldout: int


class TrainGeneratorSettings(_Model):
    """How the decoder was trained (``gleak.generator.train.TrainSettings``; the fine-tuning keys with rgla only)."""

    epochs: int
    batch_size: int
    lr: float
    holdout: float
    width: int
    res_blocks: int
    loss: Literal["mse", "rgla"]
    finetune_epochs: int | None = Field(None, description="--loss rgla only")
    finetune_lr: float | None = Field(None, description="--loss rgla only")
    seed: int


class TrainEpoch(_Model):
    phase: str = Field(description="mse, or the fine-tuning loss")
    epoch: int
    loss: float = Field(description="the epoch's mean training loss")
    heldout_mse: float | None


class TrainGeneratorReport(CommandReport):
    """``gleak train-generator``: the generator file written, the model and layer it is bound to, the auxiliary
    data, the training settings and its scores."""

    report: Literal["train-generator"] = "train-generator"
    file: str
    model: str
    model_sha256: str
    layer: str
    feature_dim: int
    num_classes: int
    aux: str
    aux_sha256: str
    image_shape: list[int]
    mean: list[float]
    std: list[float]
    examples: TrainExamples
    settings: TrainGeneratorSettings
    train_loss: float
    train_mse: float
    heldout_mse: float | None
    heldout_psnr: float | None
    baseline_psnr: float | None = Field(description="PSNR of predicting the training images' mean image")
    baseline_beaten: bool | None
    seconds: float = Field(description="training")
    total_seconds: float
    threads: int
    device: str
    history: list[TrainEpoch]
    notes: list[str]


# ------------------------------------------------------------------------ the registries (attacks, defenses)
class OptionInfo(_Model):
    """One option of an attack or a defense (``gleak.registry.describe_options``)."""

    name: str
    type: str
    default: bool | int | float | str | None = Field(description="null: chosen automatically")
    help: str
    range: str | None = Field(None, description="the allowed range; absent where there is none")


class AttackInfo(_Model):
    """``gleak attacks``: one registered attack."""

    name: str
    task: Literal["labels", "reconstruct", "tokens", "text"]
    summary: str
    requires: list[str]
    paper: str
    options: list[OptionInfo]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data, as the registry gives it (an option's range only where it has one)."""
        return self.model_dump(exclude_unset=True)


class DefenseInfo(_Model):
    """``gleak defenses``: one registered defense (``Defense.describe``)."""

    name: str
    summary: str
    kind: Literal["contribution", "training"]
    strength: str | None = Field(description="the option a sweep varies")
    also_sweeps: list[str]
    source: str
    options: list[OptionInfo]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data, as the registry gives it (an option's range only where it has one)."""
        return self.model_dump(exclude_unset=True)


# ------------------------------------------------------------------------ sweep
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"  # defense, attack and option names (registry names)
SweepMetric = Literal["iacc", "identification_kappa", "psnr"]


class SweepUtility(_Model):
    """What the defense costs: the defended contribution against the clean one of the same trial (means over the
    trials; the undefended baseline is 0 and 1)."""

    relative_l2_error: Finite = Field(description="‖defended − clean‖ / ‖clean‖ over the parameter tensors")
    cosine: Finite = Field(description="cosine similarity of the defended and the clean contribution")
    accuracy: Finite | None = Field(None, ge=0, le=1, description="--utility accuracy: the test accuracy of the "
                                    "model trained for settings.training's rounds under this point's defense (the "
                                    "undefended baseline: without one); null: not measured")


BASELINE = "none"  # a sweep's undefended rows: their defense and their strength


class SweepTraining(_Model):
    """``--utility accuracy``: how the model was trained at every point and where its accuracy was measured."""

    rounds: int = Field(ge=1, description="R: FedAvg rounds, each adding the (defended) update to the model")
    local_steps: int = Field(ge=1, description="m: local SGD steps per round")
    batch_size: int = Field(ge=1, description="B per local step (the sweep's --batch-size)")
    learning_rate: Finite = Field(gt=0, description="the client's SGD learning rate")
    seed_offset: int = Field(description="round r draws its batches with seed + seed_offset + r, at every point")
    train_size: int = Field(ge=1, description="examples the rounds draw batches from")
    eval_size: int = Field(ge=1, description="examples the accuracy is measured on, never trained on")
    eval_data: str | None = Field(description="--eval-data; null: a held-out split of --data")
    eval_fraction: Finite | None = Field(description="the share of --data held out (split with the seed); null "
                                         "with --eval-data")


class SweepDefense(_Model):
    """One ``--defense`` of a sweep: the defense, the options it keeps fixed and the strengths it is run at."""

    name: str = Field(pattern=NAME_PATTERN, description="the defense (gleak defenses lists them)")
    spec: str = Field(description="the --defense text as given")
    strength: str | None = Field(pattern=NAME_PATTERN, description="the option the sweep varies (Defense.strength; "
                                 "null: the defense has none, e.g. sign)")
    fixed: dict[str, str] = Field(description="options given as KEY=VALUE, the same at every strength")
    values: list[Finite] = Field(description="the strengths run, in the order given (empty: one point at the "
                                "configured options)")
    training: bool = Field(description="applied while the client trains (dpsgd), not to what it sends")
    plot: str = Field(pattern=NAME_PATTERN, description="the plot's file stem: <plot>.png and <plot>.svg beside "
                      "sweep.json")


class SweepSettings(_Model):
    """What was simulated and attacked, and how."""

    model: str
    model_sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$", description="the sha256 of the model's "
                                     "weights (what captures record as gleak.model.sha256); gleak audit --sweep "
                                     "compares it with the audited models'. null: not recorded (the sweep is then "
                                     "shown unchecked, and report.html says so)")
    arch: str | None
    data: str
    aux: str | None
    generator: str | None
    batch_size: int = Field(ge=1, description="B")
    local_steps: int = Field(ge=1, description="m (1: a FedSGD gradient; more: a FedAvg update)")
    scheme: Literal["fedsgd", "fedavg"]
    trials: int = Field(ge=1, description="simulated client batches per point, the same ones at every point")
    seed: int = Field(ge=0, description="trial t simulates with seed + t·trial_stride")
    trial_stride: int
    attacks: list[str] = Field(description="the attacks with rows, in row order")
    iterations: int = Field(description="the iteration bound of the reconstruction attacks that have one")
    confidence: int = Field(description="batches simulated from aux to calibrate the calibrated selector (0: it "
                            "did not run)")
    distractors: int = Field(description="K of the identification lineup (chance 1 / (K + 1))")
    jobs: int = Field(description="--jobs (0: auto)")
    workers: int = Field(description="processes that ran trials")
    threads: int
    device: str
    utility: Literal["cosine", "accuracy"] = Field("cosine", description="cosine: the defended contribution "
                                                   "against the clean one only; accuracy: also the test accuracy "
                                                   "of a model trained under each point's defense")
    training: SweepTraining | None = Field(None, description="--utility accuracy: the training; else null")


class SweepRow(_Model):
    """One attack at one point: over the trials, how much it recovers, against chance and the utility kept."""

    defense: str = Field(pattern=NAME_PATTERN, description="the defense, or 'none' for the undefended baseline "
                         "(shared by every defense)")
    strength: Finite | Literal["none"] | None = Field(description="the value of the defense's strength option; "
                                                     "'none': the baseline; null: a defense without strength (sign)")
    attack: str = Field(pattern=NAME_PATTERN)
    metric: SweepMetric = Field(description="iacc: label attacks; identification_kappa: reconstruction scored by "
                                "its identification lineup (with aux data); psnr: reconstruction without aux data")
    mean: Finite | None = Field(description="mean over the trials the attack answered (null: none did)")
    std: Finite | None = Field(description="sample standard deviation over those trials (0 for one)")
    trials: int = Field(ge=0, description="trials the attack answered (scored)")
    failed: int = Field(ge=0, description="trials it gave no answer: not applicable, failed, or abstained")
    reason: str | None = Field(description="why, for the first trial without an answer")
    chance: Finite | None = Field(description="iacc: the mean chance iAcc of the trials' batches; "
                                 "identification_kappa: 0; psnr: the mean no-attack baseline PSNR")
    utility: SweepUtility
    epsilon: Finite | None = Field(description="dpsgd: the mean gleak.dp.epsilon of the trials; else null")
    epsilon_terms: EpsilonTerms | None = Field(None, description="dpsgd: what epsilon holds under (δ, accountant, "
                                               "q, steps, rounds, z); else null")


class SweepReport(CommandReport):
    """``gleak sweep`` (``sweep.json``): leakage against defense strength, every (defense, strength, attack) over
    the same simulated batches, the undefended baseline first."""

    report: Literal["sweep"] = "sweep"
    settings: SweepSettings
    defenses: list[SweepDefense]
    rows: list[SweepRow]
    notices: list[str] = Field(description="work left out and why (one line each)")
    seconds: Finite
    training_seconds: Finite | None = Field(None, description="--utility accuracy: seconds spent training the "
                                            "model at every point (part of seconds); null: not measured")

    def to_json(self) -> dict[str, Any]:
        """Every key, always (a sweep's rows have no optional keys)."""
        return self.model_dump(mode="json")


REPORTS: tuple[type[BaseModel], ...] = (Report, LabelsReport, TokensReport, TextReport, ReconstructReport,
                                        InspectReport, SweepReport, TrainGeneratorReport, CheckModelReport,
                                        ErrorReport)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every report (one of :data:`REPORTS`), as shipped in ``schema.json``."""
    _, defs = models_json_schema([(m, "validation") for m in REPORTS], ref_template="#/$defs/{model}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://gleak.invalid/report/v{SCHEMA_VERSION}/schema.json",
        "title": "gleak report",
        "description": "A JSON document gleak writes: the audit, labels, tokens (labels on a language model's "
                       "capture), reconstruct, inspect, sweep, train-generator or check-model report, or the error of "
                       "a command run with --format json (the key 'report' names which).",
        "oneOf": [{"$ref": f"#/$defs/{m.__name__}"} for m in REPORTS],
        "$defs": defs["$defs"],
    }


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
