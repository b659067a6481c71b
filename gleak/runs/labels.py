"""The label-recovery run behind ``gleak labels``: open the capture, run every applicable label attack (or the
ones named) with their typed options, score them against the ground truth and the chance baseline when it is
known, calibrate them on simulated batches on request, and return the typed :class:`LabelsReport`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gleak import __version__
from gleak.attacks.base import Attack
from gleak.attacks.plan import run_label_attacks, select_attacks
from gleak.attacks.registry import attack_class, resolve_assignments
from gleak.errors import GleakError
from gleak.io import header_value
from gleak.metrics.labels import chance_scores, truth_counts
from gleak.registry import check_flag_conflicts, resolve_options
from gleak.report.model import ChanceScores, LabelResult, LabelsReport, LossInfo, TokensReport
from gleak.runs.inputs import InputSpec, model_mode_of, open_inputs, soft_truth
from gleak.runs.tokens import run_tokens

# dedicated flags of `gleak labels` -> the attack whose option they set
FLAG_OWNERS = {"augmentation": "softlabel"}


@dataclass(kw_only=True, frozen=True)
class LabelsRequest:
    """``gleak labels``: the inputs, the attacks to run (None: every default one), the dedicated flags' values
    (``{"augmentation": "mixup"}``, see :data:`FLAG_OWNERS`), ``-O`` assignments by attack, and the number of
    simulated batches to calibrate each attack on (0: off)."""

    inputs: InputSpec
    attacks: Sequence[str] | None = None
    flags: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    confidence: int = 0
    show_text: bool = False  # a language model's capture: decoded tokens in the report (the leak itself)

    @property
    def task(self) -> str:
        """``tokens`` for a language model's capture (its header says so), else ``labels``."""
        return "tokens" if header_value(self.inputs.capture, "gleak.modality") == "text" else "labels"

    def check(self) -> list[Attack]:
        """Every option and attack name checked before any file is read (one-line GleakErrors); the attacks to
        run, not yet configured."""
        if self.task == "tokens":
            return self._check_tokens()
        for key, value in self.flags.items():
            owner = FLAG_OWNERS[key]
            check_flag_conflicts({key: value}, self.options, [owner])
            resolve_options(attack_class(owner), {key: value}, {key: f"--{key}"})
        resolve_assignments(self.options, task="labels")  # every -O checked before any work
        return select_attacks("labels", self.attacks)

    def _check_tokens(self) -> list[Attack]:
        """A language model's capture: the token attacks, and the options that only image captures take refused."""
        for key in self.flags:
            raise GleakError(f"--{key} applies to image classifiers' captures; this is a language model's capture")
        if self.confidence:
            raise GleakError("--confidence calibrates the label attacks of image classifiers; it does not apply to "
                             "a language model's capture")
        resolve_assignments(self.options, task="tokens")
        return select_attacks("tokens", self.attacks)

    def attack_options(self, name: str) -> dict[str, Any]:
        """What configures attack ``name``: its flags, then its ``-O`` values."""
        flags = {k: v for k, v in self.flags.items() if FLAG_OWNERS[k] == name}
        return {**flags, **self.options.get(name, {})}


def run_labels(request: LabelsRequest,
               progress: Callable[[str], None] | None = None) -> LabelsReport | TokensReport:
    """Open the inputs, run and score the label attacks; the typed report (``progress`` is called with each
    attack's name as it starts). A language model's capture gets the token attacks and a
    :class:`~gleak.report.model.TokensReport` (:func:`gleak.runs.tokens.run_tokens`)."""
    chosen = request.check()
    inputs = open_inputs(request.inputs)
    if inputs.ctx.text_model is not None:
        return run_tokens(inputs, chosen, request.options, request.show_text, progress)
    ctx = inputs.ctx
    counts = truth_counts(inputs.truth.labels, ctx.num_classes) if inputs.truth is not None else None
    truth_soft = soft_truth(ctx, inputs.truth)
    sources = {k: f"--{k}" for k in request.flags}
    for attack in chosen:
        attack.configure(request.attack_options(attack.name), sources)
    results = run_label_attacks(ctx, chosen, counts, progress, truth_soft, request.confidence)
    ran = {r.attack for r in results if r.status != "not_applicable"}  # a failed attack still used its options
    ignored = [f"--{key}: only {FLAG_OWNERS[key]} uses it, and {FLAG_OWNERS[key]} did not run"
               for key in request.flags if FLAG_OWNERS[key] not in ran]
    ignored += [f"-O {name}.{key}: {name} did not run" for name, values in request.options.items()
                if name not in ran for key in values]
    loss = ctx.loss
    return LabelsReport(
        gleak_version=__version__, capture=str(ctx.capture.path), kind=ctx.kind, batch_size=ctx.batch_size,
        local_steps=ctx.local_steps, num_classes=ctx.num_classes, last_layer=ctx.layer.name,
        gradient_note=ctx.gradient_note,
        loss=LossInfo(name=loss.name, reduction=loss.reduction, temperature=loss.temperature,
                      label_smoothing=loss.label_smoothing, focal_gamma=loss.focal_gamma,
                      focal_alpha=loss.focal_alpha),
        truth_file=str(inputs.truth_path) if inputs.truth_path else None,
        model_check=ctx.model_check, model_mode=model_mode_of(ctx),
        truth_counts=counts.tolist() if counts is not None else None,
        chance=ChanceScores.model_validate(chance_scores(counts)) if counts is not None else None,
        results=[LabelResult.model_validate(r.to_json()) for r in results],
        threads=torch.get_num_threads(),
        truth_soft_label=truth_soft.tolist() if truth_soft is not None else None,
        ignored_options=ignored)


def no_counts_reason(report: LabelsReport | TokensReport) -> str | None:
    """Why no attack gave an answer (every one not applicable, or every one that ran failed), or None. An attack
    that abstained answered (the calibrated selector: no attack beats chance here) — that is not bad input."""
    noun = "token" if isinstance(report, TokensReport) else "label"
    if any(r.status in ("ok", "abstained") for r in report.results):
        return None
    if all(r.status == "not_applicable" for r in report.results):
        return f"no {noun} attack applies to this capture"
    return f"no {noun} attack gave {'tokens' if noun == 'token' else 'counts'} for this capture"
