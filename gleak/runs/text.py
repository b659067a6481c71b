"""``gleak reconstruct`` on a language model's capture: run a sentence-reconstruction attack (DAGER, or the
optimisation baseline), score the sequences against the truth's token batches (ROUGE over token ids, exact match,
token accuracy, next to chance: :mod:`gleak.metrics.text`), and write ``metrics.json`` and ``sequences.txt``.

Recovered text is the client's data itself: the report and ``sequences.txt`` hold token ids, and decoded text only
when the caller asks (``show_text``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gleak import __version__
from gleak.attacks.base import RunInputs, TextOutput, run_attack
from gleak.attacks.plan import select_attacks
from gleak.attacks.registry import resolve_assignments
from gleak.attacks.text.dager import UNSURE
from gleak.attacks.tokens.view import TextModelSpec, is_lora_only
from gleak.capture import TextTruth
from gleak.errors import GleakError
from gleak.io import OutputSet
from gleak.report.model import RecoveredSequence, TextReport
from gleak.runs.inputs import InputSpec, open_inputs
from gleak.runs.tokens import token_decoder

TEXT_OUTPUTS = ("metrics.json", "sequences.txt")
AUTO = "dager"
RECOMPUTED = 1e-6  # a float32 gradient recomputed from the right batch: its relative distance to the capture's


@dataclass(frozen=True, kw_only=True)
class TextRequest:
    """``gleak reconstruct`` on a text capture: the inputs, the attack (``auto``: DAGER), ``-O`` assignments and
    whether decoded text may enter the report."""

    inputs: InputSpec
    attack: str = "auto"
    options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    show_text: bool = False

    def check(self) -> str:
        """The attack's name, every option checked, before any file is read."""
        name = AUTO if self.attack == "auto" else self.attack
        select_attacks("text", [name])  # a one-line error naming the text attacks when unknown
        resolve_assignments(self.options, task="text")
        return name


def truth_sequences(truth: TextTruth) -> list[list[int]]:
    """Each truth sequence's real token ids (mask 1), in order; either padding side."""
    ids, mask = truth.input_ids.long().tolist(), truth.attention_mask.long().tolist()
    return [[t for t, m in zip(row, keep, strict=True) if m] for row, keep in zip(ids, mask, strict=True)]


def run_text(request: TextRequest, note: Callable[[str], None] | None = None) -> TextReport:
    """Open the inputs, run the attack, score it; the typed report (``note`` receives progress lines)."""
    name = request.check()
    inputs = open_inputs(request.inputs)
    ctx = inputs.ctx
    spec = ctx.text_model
    if spec is None:
        raise GleakError("this is not a language model's capture (gleak.modality is not text)")
    attack = select_attacks("text", [name])[0]
    attack.configure(dict(request.options.get(name, {})))
    result = run_attack(attack, ctx, RunInputs(note=note))
    out = result.output if isinstance(result.output, TextOutput) else None
    truth = truth_sequences(inputs.text_truth) if inputs.text_truth is not None else None
    decode = None
    if request.show_text:
        decode = token_decoder(inputs.spec.model.path, inputs.spec.model.trust_remote_code)
    sequences = []
    scores = None
    if out is not None:
        pairs: list[dict[str, Any]] = [{} for _ in out.sequences]
        if truth is not None:
            scores, pairs = score_sequences(out.sequences, truth, spec.vocab_size)
        last = out.diagnostics.get("last_from_head") or [False] * len(out.sequences)
        exact, up_to_last = sequence_exactness(out, spec)
        for k, seq in enumerate(out.sequences):
            pair = pairs[k] if k < len(pairs) else {}
            sequences.append(RecoveredSequence(
                token_ids=list(seq), exact=exact[k], exact_up_to_last=up_to_last[k],
                last_from_head=bool(last[k]), matched_truth=pair.get("truth"), scores=pair.get("scores"),
                text=_join(decode, seq) if decode is not None else None))
    diagnostics = {k: v for k, v in (out.diagnostics if out is not None else {}).items() if k != "last_from_head"}
    return TextReport(
        gleak_version=__version__, capture=str(ctx.capture.path), kind=ctx.kind, model_type=spec.model_type,
        vocab_size=spec.vocab_size, batch_size=ctx.batch_size, local_steps=ctx.local_steps,
        lora=is_lora_only(ctx.capture.tensors),
        attack=name, status=result.status, reason=result.reason, seconds=round(result.seconds, 3),
        options=result.options, sequences=sequences, truth_file=str(inputs.truth_path) if inputs.truth_path else None,
        truth_sequences=len(truth) if truth is not None else None, scores=scores, model_check=ctx.model_check,
        diagnostics=_plain(diagnostics), warnings=list(result.warnings), show_text=request.show_text,
        threads=torch.get_num_threads())


def sequence_exactness(out: TextOutput, spec: TextModelSpec) -> tuple[list[bool], list[bool]]:
    """Per recovered sequence, whether every token is proven (``exact``) and whether every token but the last is
    (``exact_up_to_last``). The attack's own flag says that its tests passed at every position they read. On a
    causal LM, DAGER's spans read every token but the last, which is an input to no loss term (METHODS-text §1.1):
    the flag then proves the sequence up to its last token, and the whole sequence only when that token came from
    an exact solve of the LM head (§2.3) — an untied head's gradient (FedSGD), its solved weight within
    :data:`~gleak.attacks.text.dager.UNSURE` of 1 — or from a tied head's best guess that the batch's embedding
    gradient, recomputed with it, confirms (relative distance to the capture's within float32 rounding,
    :data:`RECOMPUTED`). A multi-step update's head is no single gradient, and a missing last token is missing.
    Elsewhere (encoders, classifiers: every position tested; the optimisation baseline: none) the flag is both."""
    n = len(out.sequences)
    flags = [bool(out.exact[k]) if k < len(out.exact) else False for k in range(n)]
    last = out.diagnostics.get("last_from_head")
    if spec.task != "causal_lm" or last is None:
        return flags, list(flags)
    weights = out.diagnostics.get("last_token_scores") or []
    distance = out.diagnostics.get("last_tokens_distance")
    if spec.kind != "gradient":
        proven = [False] * n
    elif spec.tie_word_embeddings:  # the whole batch's gradient recomputed: all of its last tokens, or none
        confirmed = isinstance(distance, list | tuple) and len(distance) == 2 and float(distance[1]) <= RECOMPUTED
        proven = [confirmed and k < len(last) and bool(last[k]) for k in range(n)]
    else:
        proven = [k < len(last) and bool(last[k]) and k < len(weights) and abs(float(weights[k]) - 1.0) <= UNSURE
                  for k in range(n)]
    return [f and p for f, p in zip(flags, proven, strict=True)], flags


def score_sequences(predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]], vocab_size: int
                    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Mean scores over the truth's sequences (with chance) and, per predicted sequence, its matched truth index
    and scores (:func:`gleak.metrics.text.text_scores`)."""
    from gleak.metrics.text import text_scores

    result = text_scores([list(s) for s in predicted], [list(t) for t in truth], vocab_size=vocab_size)
    means = {k: float(v) for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    pairs: list[dict[str, Any]] = [{} for _ in predicted]
    for record in result.get("pairs", []):
        p, t = record.get("prediction"), record.get("truth")
        if p is None or p >= len(predicted):
            continue
        pairs[p] = {"truth": t, "scores": {k: float(v) for k, v in record.items()
                                           if k not in ("prediction", "truth") and isinstance(v, int | float)}}
    return means, pairs


def _join(decode: Callable[[int], str], seq: Sequence[int]) -> str:
    return "".join(decode(t) for t in seq)


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """Diagnostics as plain JSON values (tensors as lists, anything else unknown as its text)."""
    plain: dict[str, Any] = json.loads(json.dumps(
        values, default=lambda v: v.tolist() if isinstance(v, torch.Tensor) else str(v)))
    return plain


def exactness_word(seq: RecoveredSequence) -> str:
    """``exact``, ``to-last`` (exact up to the last token) or ``approx``: a sequence's column in sequences.txt."""
    return "exact" if seq.exact else "to-last" if seq.exact_up_to_last else "approx"


def write_text_outputs(report: TextReport, folder: Path, force: bool) -> list[Path]:
    """``metrics.json`` (the report) and ``sequences.txt`` (one recovered sequence per line: its token ids, or its
    decoded text with ``--show-text``), together or not at all."""
    data = report.to_json()
    lines = []
    for k, seq in enumerate(report.sequences):
        body = seq.text if report.show_text and seq.text is not None else " ".join(str(t) for t in seq.token_ids)
        lines.append(f"{k}\t{exactness_word(seq)}\t{body}")
    header = ("# recovered sequences: index, exact (every token proven) / to-last (every token but the last) / "
              "approx, " + ("decoded text (--show-text)" if report.show_text
                            else "token ids (redacted: --show-text decodes)"))
    with OutputSet(folder, force) as out:
        out.write_bytes("metrics.json", (json.dumps(data, indent=2) + "\n").encode())
        out.write_bytes("sequences.txt", ("\n".join([header, *lines]) + "\n").encode())
        return out.commit()
