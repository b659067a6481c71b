"""``gleak labels`` on a language model's capture: run the token attacks (the bag of input tokens, the next-token
counts, the sequence lengths), score them against the truth's token multisets and the chance of guessing, and
return the typed :class:`~gleak.report.model.TokensReport`.

Recovered text is the client's data itself: the report holds token ids and counts, and decoded tokens only when
the caller asks (``show_text``). Scoring decodes the truth's tokens in memory to find the sensitive ones (a digit,
or a capital first letter: record numbers, dates, names) and keeps only their number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gleak import __version__
from gleak.attacks.base import Attack, AttackResult, TokenOutput, run_attack
from gleak.attacks.context import Context
from gleak.capture import TextTruth
from gleak.metrics.tokens import bag_scores, truth_bags
from gleak.report.model import RecoveredToken, TokenResult, TokensReport
from gleak.runs.inputs import Inputs

# which of the truth's multisets each attack recovers (METHODS-text §2.1-§2.3)
TRUTH_OF = {"token-bag": "inputs", "lora-tokens": "inputs", "sparse-tokens": "inputs", "next-tokens": "targets"}


def is_sensitive(text: str) -> bool:
    """A token that may identify someone: it holds a digit (record numbers, dates, phone numbers) or starts with a
    capital letter (names, places)."""
    word = text.strip().lstrip("Ġ▁#")
    return any(c.isdigit() for c in word) or (word[:1].isalpha() and word[:1].isupper())


def token_decoder(folder: str | Path | None, trust_remote_code: bool = False) -> Callable[[int], str] | None:
    """Token id -> its text, from the tokenizer in the model's folder (None when there is no folder or it has no
    tokenizer)."""
    from gleak.models.text import load_tokenizer, tokenizer_files

    if folder is None or not Path(folder).is_dir() or not tokenizer_files(folder):
        return None
    tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)

    def decode(token: int) -> str:
        return str(tokenizer.decode([token]))

    return decode


@dataclass(frozen=True, kw_only=True)
class TokenRun:
    """The token attacks' results on one capture, scored (:func:`run_token_attacks`), with what they were scored
    against: the truth's token multisets (``inputs``, ``targets``, ``all``) and the sensitive token ids among them
    (None without truth, or without a tokenizer to tell them)."""

    results: list[TokenResult]
    bags: dict[str, Counter[int]] | None
    sensitive: set[int] | None


def run_token_attacks(ctx: Context, truth: TextTruth | None, attacks: Sequence[Attack],
                      options: Mapping[str, Mapping[str, Any]], *, model_folder: str | Path | None = None,
                      trust_remote_code: bool = False, show_text: bool = False,
                      progress: Callable[[str], None] | None = None) -> TokenRun:
    """Run ``attacks`` (token attacks, each configured from ``options``) on a language model's capture and score
    them against ``truth`` (when known) and chance. ``model_folder``'s tokenizer decodes the truth's tokens in
    memory to count the sensitive ones, and the recovered tokens into the results only with ``show_text``. What
    ``gleak labels`` (:func:`run_tokens`) and the audit (:mod:`gleak.runs.audit.capture`) both run."""
    spec = ctx.text_model
    if spec is None:
        raise TypeError("the token attacks need a language model's capture")
    bags = (truth_bags(truth.input_ids, truth.attention_mask, causal_lm=spec.task == "causal_lm")
            if truth is not None else None)
    decode = token_decoder(model_folder, trust_remote_code) if bags is not None or show_text else None
    sensitive = ({t for t in bags["all"] if is_sensitive(decode(t))} if bags is not None and decode is not None
                 else None)
    longest = int(truth.attention_mask.sum(dim=1).max()) if truth is not None and truth.attention_mask.numel() else None
    results = []
    for attack in attacks:
        if progress is not None:
            progress(attack.name)
        attack.configure(dict(options.get(attack.name, {})))
        result = run_attack(attack, ctx)
        results.append(_result(result, bags, sensitive, spec.vocab_size, decode if show_text else None, longest))
    union = _union(results, bags, sensitive, spec.vocab_size, decode if show_text else None)
    return TokenRun(results=results + ([union] if union is not None else []), bags=bags, sensitive=sensitive)


UNION = "union"  # the pseudo-attack that merges the input bag and the next tokens


def _union(results: Sequence[TokenResult], bags: Mapping[str, Counter[int]] | None, sensitive: set[int] | None,
           vocab_size: int, decode: Callable[[int], str] | None) -> TokenResult | None:
    """Every token of the batch the update gives away: the union of the input bag (token-bag) and the next tokens
    (next-tokens), each token's count the larger of the two (a lower bound of its count in the batch, which is
    the input count plus the sequences it ends), scored against every real token of the batch. Under next-token
    loss the last token of each sequence is seen only as a target, so neither attack alone covers the batch
    (METHODS-text §2.3). token-bag's bag already holds the tokens the first block's span test proves, when that
    check runs and separates more clearly than the embedding gradient (:mod:`gleak.attacks.tokens.firstblock`).
    None when neither ran."""
    parts = [r for r in results if r.status == "ok" and r.attack in TRUTH_OF and r.tokens]
    if not parts:
        return None
    merged: Counter[int] = Counter()
    for part in parts:
        for token in part.tokens or []:
            merged[token.id] = max(merged[token.id], token.count)
    tokens = [RecoveredToken(id=t, count=c, text=decode(t) if decode is not None else None)
              for t, c in sorted(merged.items())]
    return TokenResult(attack=UNION, status="ok", seconds=sum(p.seconds for p in parts), reason=None,
                       method=" ∪ ".join(p.attack for p in parts), truth="all" if bags is not None else None,
                       tokens=tokens, scores=_scores(merged, bags, "all", sensitive, vocab_size) if bags else None,
                       warnings=[])


def run_tokens(inputs: Inputs, attacks: list[Attack], options: Mapping[str, Mapping[str, Any]],
               show_text: bool = False, progress: Callable[[str], None] | None = None) -> TokensReport:
    """Run ``attacks`` (token attacks, configured from ``options``) on an opened text capture; the typed report."""
    ctx = inputs.ctx
    spec = ctx.text_model
    if spec is None:  # pragma: no cover - run_labels routes only text captures here
        raise TypeError("run_tokens needs a language model's capture")
    run = run_token_attacks(ctx, inputs.text_truth, attacks, options, model_folder=inputs.spec.model.path,
                            trust_remote_code=inputs.spec.model.trust_remote_code, show_text=show_text,
                            progress=progress)
    bags, sensitive = run.bags, run.sensitive
    return TokensReport(
        gleak_version=__version__, capture=str(ctx.capture.path), kind=ctx.kind, task=spec.task,
        model_type=spec.model_type, vocab_size=spec.vocab_size, batch_size=ctx.batch_size,
        local_steps=ctx.local_steps, tied_embeddings=spec.tie_word_embeddings,
        truth_file=str(inputs.truth_path) if inputs.truth_path else None, model_check=ctx.model_check,
        truth_tokens={k: len(v) for k, v in bags.items()} if bags is not None else None,
        sensitive_tokens=len(sensitive) if sensitive is not None else None, show_text=show_text,
        tokens=next((r.tokens for r in run.results if r.attack == UNION), None),
        token_scores=next((r.scores for r in run.results if r.attack == UNION), None), results=run.results,
        threads=torch.get_num_threads())


def _result(result: AttackResult, bags: Mapping[str, Counter[int]] | None, sensitive: set[int] | None,
            vocab_size: int, decode: Callable[[int], str] | None, longest: int | None) -> TokenResult:
    """One attack's result in the report: its tokens (ids, counts; text only with ``decode``) and its scores."""
    out = result.output if isinstance(result.output, TokenOutput) else None
    base = TokenResult(attack=result.attack, status=result.status, seconds=result.seconds, reason=result.reason,
                       options=result.options, warnings=list(result.warnings))
    if out is None:
        return base
    bag = out.bag()
    sure = ({int(t): float(c) for t, c in zip(out.token_ids.tolist(), out.confidence.tolist(), strict=True)}
            if out.confidence is not None else {})
    tokens = [RecoveredToken(id=t, count=c, confidence=sure.get(t), text=decode(t) if decode is not None else None)
              for t, c in sorted(bag.items())]
    truth_name = TRUTH_OF.get(result.attack)
    scores = None
    if bags is not None and truth_name is not None:
        scores = _scores(bag, bags, truth_name, sensitive, vocab_size)
    elif longest is not None and out.max_length is not None:
        scores = {"max_length_error": float(abs(out.max_length - longest))}
    return base.model_copy(update={
        "method": str(out.diagnostics["method"]) if "method" in out.diagnostics else None,
        "truth": truth_name if bags is not None else None, "tokens": tokens if bag else None,
        "max_length": out.max_length, "lengths": {str(k): v for k, v in out.lengths.items()} if out.lengths else None,
        "scores": scores, "diagnostics": _plain(out.diagnostics)})


def _scores(bag: Mapping[int, int], bags: Mapping[str, Counter[int]], truth_name: str, sensitive: set[int] | None,
            vocab_size: int) -> dict[str, float]:
    """Bag scores against the attack's truth multiset; the share of its tokens that occur anywhere in the batch
    (a token recovered from the wrong part — a last token, a target — still leaks); the sensitive tokens' recall."""
    truth = bags[truth_name]
    scores = bag_scores(bag, truth, vocab_size)
    found = set(bag)
    scores["precision_all"] = len(found & set(bags["all"])) / len(found) if found else 1.0
    if sensitive is not None:
        wanted = sensitive & set(truth)
        scores["sensitive_recall"] = len(found & wanted) / len(wanted) if wanted else 1.0
        scores["chance_sensitive_recall"] = min(len(found), vocab_size) / vocab_size if wanted else 1.0
    return scores


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """Diagnostics as JSON values (tensors and numbers made plain)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            value = value.tolist() if value.numel() <= 64 else f"tensor of shape {list(value.shape)}"
        out[str(key)] = value
    return out
