"""Scores of reconstructed token sequences against the true ones (METHODS-text §5), next to chance.

Everything here works on **token ids**, never on decoded text: a reconstruction is scored on what it recovered,
not on how a tokenizer renders it, and the report never has to hold the client's text.

* **ROUGE over token ids.** ROUGE-1, ROUGE-2 and ROUGE-L F1 (Lin, ACL Workshop on Text Summarization Branches
  Out, 2004) are computed by the ``rouge-score`` package's ``RougeScorer`` on strings of ids, each id one "word"
  (a tokenizer that splits on spaces; no stemming, ``use_stemmer=False``, no lower-casing). The numbers are
  therefore ROUGE over tokens, not over words: a word split into three sub-word tokens counts three times, and a
  paper's ROUGE on decoded text (FILM, LAMP and DAGER score words, FILM with stemming) is not directly
  comparable. ROUGE-2 is averaged only over references of at least two tokens: a one-token reference has no
  bigram, and the library then scores 0 whatever was recovered (the artefact DAGER, Petrov et al., NeurIPS 2024,
  points out).
* **One-to-one matching.** Each true sequence gets at most one prediction, by a Hungarian assignment
  (``scipy.optimize.linear_sum_assignment``) on the cost 1 − ROUGE-1 F1, the predictions padded with empty
  sequences up to the number of references (an empty prediction scores 0). This is the matching of LAMP
  (Balunović et al., NeurIPS 2022) and of DAGER's encoder path. DAGER's decoder evaluation instead lets every
  reference pick its best prediction, which can count one prediction for several references; that is not done.
* **Exact match** (identical ids), **exact up to the last token** (every token but the last equal; the prediction
  may lack the last token or get it wrong: under next-token loss the last token of a sequence is in no gradient,
  METHODS-text §1.1; averaged over references of ≥ 2 tokens, like ROUGE-2), and **token accuracy**
  (position-wise: the share of a reference's tokens that the matched prediction has at the same position; extra
  predicted tokens cost nothing here, they cost ROUGE precision), each averaged over references.
* **Chance** (§5.6), each run through the same matching and averaged over ``chance_draws`` seeded draws:
  (a) ``chance_*``: random sequences of the true lengths, tokens drawn uniformly from the vocabulary (less the
  stripped ids) or from a given unigram distribution; (b) ``bag_only_*``: each reference's own tokens in a
  shuffled order, which recovers the bag perfectly (ROUGE-1 = 1) and nothing of the order, so it isolates what a
  bag-of-tokens attack alone already gives away.

``rouge-score`` (the ``text`` extra) is imported when a score is computed, never at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypedDict, overload

import numpy as np

from gleak.errors import GleakError

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
#: the per-reference scores averaged into the means (``rouge2``, ``exact_up_to_last``: references of ≥ 2 tokens)
PAIR_SCORES = ("rouge1", "rouge2", "rougeL", "exact", "exact_up_to_last", "token_accuracy")
#: mean key of each per-reference score
MEAN_KEYS = {"rouge1": "rouge1", "rouge2": "rouge2", "rougeL": "rougeL", "exact": "exact_match",
             "exact_up_to_last": "exact_up_to_last", "token_accuracy": "token_accuracy"}
CHANCE_KEYS = {"rouge1": "chance_rouge1", "rouge2": "chance_rouge2", "rougeL": "chance_rougeL",
               "exact": "chance_exact_match", "token_accuracy": "chance_token_accuracy"}
BAG_ONLY_KEYS = {"rouge2": "bag_only_rouge2", "rougeL": "bag_only_rougeL", "exact": "bag_only_exact_match",
                 "token_accuracy": "bag_only_token_accuracy"}


class _IdTokenizer:
    """The tokenizer ``RougeScorer`` is given: the ids of a space-joined string, unchanged."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


class _Rouge:
    """One ``RougeScorer`` per call, over strings of token ids."""

    def __init__(self) -> None:
        try:
            from rouge_score import rouge_scorer  # the text extra; nltk comes with it, so only when scoring
        except ImportError:
            from gleak.models.text import EXTRA_HINT

            raise GleakError(f"scoring recovered text needs the rouge-score package: {EXTRA_HINT}") from None

        tokenizer = _IdTokenizer()
        self.all = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False, tokenizer=tokenizer)
        self.unigram = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=False, tokenizer=tokenizer)

    @staticmethod
    def _text(ids: Sequence[int]) -> str:
        return " ".join(str(int(t)) for t in ids)

    def rouge1(self, prediction: Sequence[int], reference: Sequence[int]) -> float:
        return float(self.unigram.score(self._text(reference), self._text(prediction))["rouge1"].fmeasure)

    def scores(self, prediction: Sequence[int], reference: Sequence[int]) -> dict[str, float]:
        result = self.all.score(self._text(reference), self._text(prediction))
        return {name: float(result[name].fmeasure) for name in ROUGE_TYPES}


def strip(sequences: Sequence[Sequence[int]], strip_ids: Collection[int] = ()) -> list[list[int]]:
    """Each sequence as a list of ints without the ids in ``strip_ids`` (pad, BOS, EOS), wherever they occur."""
    drop = {int(t) for t in strip_ids}
    return [[int(t) for t in seq if int(t) not in drop] for seq in sequences]


def _match(predicted: list[list[int]], truth: list[list[int]], rouge: _Rouge) -> list[tuple[int, int | None]]:
    from scipy.optimize import linear_sum_assignment

    if not truth:
        return []
    columns = max(len(predicted), len(truth))  # the predictions padded with empties up to B
    cost = np.ones((len(truth), columns))
    pred_sets = [set(p) for p in predicted]
    for i, ref in enumerate(truth):
        ref_set = set(ref)
        for j, pred in enumerate(predicted):
            if not ref_set.isdisjoint(pred_sets[j]):  # no shared token: ROUGE-1 is 0, the cost 1 already
                cost[i, j] = 1.0 - rouge.rouge1(pred, ref)
    rows, cols = linear_sum_assignment(cost)
    assigned = dict(zip(rows.tolist(), cols.tolist(), strict=True))
    return [(i, assigned[i] if assigned[i] < len(predicted) else None) for i in range(len(truth))]


def match_sequences(predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]]
                    ) -> list[tuple[int, int | None]]:
    """For each true sequence, in order, ``(truth index, prediction index)``: a one-to-one assignment maximising
    the total ROUGE-1 F1 over token ids (Hungarian). With fewer predictions than references the missing ones are
    empty sequences, and their references get ``None``; with more, the unassigned predictions are left out."""
    return _match([list(map(int, p)) for p in predicted], [list(map(int, t)) for t in truth], _Rouge())


def exact_up_to_last(prediction: Sequence[int], reference: Sequence[int]) -> bool | None:
    """Every token of ``reference`` but its last is recovered in place, and the prediction has nothing beyond
    the reference's length (it may lack the last token or hold a wrong one). None for a reference of fewer than
    two tokens, where it would hold for any guess: such references are left out of its mean."""
    if len(reference) < 2:
        return None
    return len(reference) - 1 <= len(prediction) <= len(reference) and \
        list(prediction[:len(reference) - 1]) == list(reference[:-1])


def token_accuracy(prediction: Sequence[int], reference: Sequence[int]) -> float | None:
    """The share of the reference's tokens that the prediction holds at the same position (None for an empty
    reference)."""
    if not reference:
        return None
    hits = sum(1 for t, r in enumerate(reference) if t < len(prediction) and prediction[t] == r)
    return hits / len(reference)


def _pair(prediction: list[int], reference: list[int], rouge: _Rouge) -> dict[str, Any]:
    scores: dict[str, Any] = rouge.scores(prediction, reference)
    if len(reference) < 2:
        scores["rouge2"] = None  # no bigram to recover: left out of the ROUGE-2 mean
    scores["exact"] = prediction == reference
    scores["exact_up_to_last"] = exact_up_to_last(prediction, reference)
    scores["token_accuracy"] = token_accuracy(prediction, reference)
    return scores


def _mean(values: Sequence[float | bool | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _scored(predicted: list[list[int]], truth: list[list[int]], rouge: _Rouge
            ) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Per-reference records (matched, scored) and the means of each score over references."""
    records = []
    for i, j in _match(predicted, truth, rouge):
        prediction = predicted[j] if j is not None else []
        records.append({"truth": i, "prediction": j, **_pair(prediction, truth[i], rouge)})
    means = {name: _mean([r[name] for r in records]) for name in PAIR_SCORES}
    return records, means


def _chance_pool(vocab_size: int, strip_ids: Collection[int], unigram: Mapping[int, float] | None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """The ids a random guesser draws from and their probabilities (None: uniform)."""
    dropped = {int(t) for t in strip_ids}
    drop = np.array(sorted(dropped), dtype=np.int64)
    if unigram is None:
        if vocab_size < 1:
            raise ValueError("vocab_size must be ≥ 1")
        ids = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), drop)
        if not len(ids):
            raise ValueError("every id of the vocabulary is stripped: no token to draw")
        return ids, None
    items = sorted((int(t), float(w)) for t, w in unigram.items() if w > 0 and int(t) not in dropped)
    if not items:
        raise ValueError("the unigram distribution has no positive weight outside the stripped ids")
    weights = np.array([w for _, w in items])
    return np.array([t for t, _ in items], dtype=np.int64), weights / weights.sum()


def chance_scores(truth: Sequence[Sequence[int]], *, vocab_size: int, strip_ids: Collection[int] = (),
                  unigram: Mapping[int, float] | None = None, draws: int = 5, seed: int = 0
                  ) -> dict[str, float | None]:
    """The chance baselines of :func:`text_scores` (see the module notes), each through the same matching,
    averaged over ``draws`` draws from ``numpy.random.default_rng(seed)`` (deterministic for a seed):
    ``chance_rouge1``, ``chance_rouge2``, ``chance_rougeL``, ``chance_exact_match``, ``chance_token_accuracy``
    (random tokens of the true lengths) and ``bag_only_rouge2``, ``bag_only_rougeL``, ``bag_only_exact_match``,
    ``bag_only_token_accuracy`` (each reference's tokens shuffled). A mean with nothing to average is None."""
    if draws < 1:
        raise ValueError("draws must be ≥ 1")
    refs = strip(truth, strip_ids)
    pool, probs = _chance_pool(vocab_size, strip_ids, unigram)
    rng = np.random.default_rng(seed)
    rouge = _Rouge()
    random_means: list[dict[str, float | None]] = []
    bag_means: list[dict[str, float | None]] = []
    for _ in range(draws):
        guesses = [rng.choice(pool, size=len(ref), p=probs).tolist() for ref in refs]
        random_means.append(_scored(guesses, refs, rouge)[1])
        shuffled = [rng.permutation(np.array(ref, dtype=np.int64)).tolist() for ref in refs]
        bag_means.append(_scored(shuffled, refs, rouge)[1])
    out: dict[str, float | None] = {}
    for name, key in CHANCE_KEYS.items():
        out[key] = _mean([m[name] for m in random_means])
    for name, key in BAG_ONLY_KEYS.items():
        out[key] = _mean([m[name] for m in bag_means])
    return out


def text_scores(predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]], *, vocab_size: int,
                strip_ids: Collection[int] = (), chance: bool = True, unigram: Mapping[int, float] | None = None,
                chance_draws: int = 5, seed: int = 0) -> dict[str, Any]:
    """Score recovered token sequences against the true ones (token ids; ``strip_ids``, e.g. pad, BOS and EOS,
    are removed from both first).

    Returns the means over the true sequences, ``rouge1``, ``rouge2`` and ``exact_up_to_last`` (these two over
    references of ≥ 2 tokens; None when there is none), ``rougeL``, ``exact_match`` and ``token_accuracy``; with
    ``chance`` the baselines of :func:`chance_scores`; ``pairs``, one record per true sequence in order (``truth``: its
    index, ``prediction``: the matched prediction's index or None, and its ``rouge1``, ``rouge2``, ``rougeL``,
    ``exact``, ``exact_up_to_last``, ``token_accuracy``); and ``info`` (counts and settings). No prediction at
    all scores 0 everywhere (not None), except where the reference itself has nothing to score."""
    preds, refs = strip(predicted, strip_ids), strip(truth, strip_ids)
    rouge = _Rouge()
    records, means = _scored(preds, refs, rouge)
    out: dict[str, Any] = {MEAN_KEYS[name]: value for name, value in means.items()}
    if chance:
        out.update(chance_scores(refs, vocab_size=vocab_size, strip_ids=strip_ids, unigram=unigram,
                                 draws=chance_draws, seed=seed))
    out["pairs"] = records
    out["info"] = {"references": len(refs), "predictions": len(preds),
                   "matched": sum(1 for r in records if r["prediction"] is not None),
                   "rouge2_references": sum(1 for r in refs if len(r) >= 2),
                   "rouge_over": "token ids", "use_stemmer": False, "matching": "hungarian, 1 - ROUGE-1 F1",
                   "chance": ({"draws": chance_draws, "seed": seed,
                               "tokens": "unigram" if unigram is not None else "uniform"} if chance else None)}
    return out


class SensitiveRecall(TypedDict):
    """The truth's sensitive tokens, how many of them the matched predictions hold in place, and the share."""

    sensitive_tokens: int
    recovered: int
    recall: float | None


@overload
def sensitive_recall(predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]],
                     is_sensitive: Callable[[int], bool], *, decode: None = None, strip_ids: Collection[int] = (),
                     matching: Sequence[tuple[int, int | None]] | None = None) -> SensitiveRecall: ...


@overload
def sensitive_recall(predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]],
                     is_sensitive: Callable[[str], bool], *, decode: Callable[[int], str],
                     strip_ids: Collection[int] = (),
                     matching: Sequence[tuple[int, int | None]] | None = None) -> SensitiveRecall: ...


def sensitive_recall(predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]],
                     is_sensitive: Callable[[Any], bool], *, decode: Callable[[int], str] | None = None,
                     strip_ids: Collection[int] = (),
                     matching: Sequence[tuple[int, int | None]] | None = None) -> SensitiveRecall:
    """The share of the truth's sensitive tokens (names, numbers: whatever ``is_sensitive`` says) that the matched
    prediction holds at the same position. ``is_sensitive`` takes a token id, or, with ``decode`` (id → text),
    the token's text. ``matching`` is :func:`match_sequences`'s result on the stripped sequences (computed when
    not given). ``recall`` is None when the truth has no sensitive token."""
    preds, refs = strip(predicted, strip_ids), strip(truth, strip_ids)
    pairs = list(matching) if matching is not None else _match(preds, refs, _Rouge())
    partner = {i: j for i, j in pairs}
    total = hits = 0
    for i, ref in enumerate(refs):
        j = partner.get(i)
        pred = preds[j] if j is not None and j < len(preds) else []
        for t, token in enumerate(ref):
            if not is_sensitive(decode(token) if decode is not None else token):
                continue
            total += 1
            hits += int(t < len(pred) and pred[t] == token)
    return {"sensitive_tokens": total, "recovered": hits, "recall": hits / total if total else None}


class TextScores:
    """Scores accumulated over batches (torchmetrics-style ``update`` / ``compute``): the means over every
    reference of every batch and, over batches, a bootstrap 95 % interval of each mean (METHODS-text §5.3).

    Chance baselines are pooled the same way, weighted by each batch's references."""

    def __init__(self, *, vocab_size: int, strip_ids: Collection[int] = (), chance: bool = True,
                 unigram: Mapping[int, float] | None = None, chance_draws: int = 5, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.strip_ids = tuple(strip_ids)
        self.chance = chance
        self.unigram = unigram
        self.chance_draws = chance_draws
        self.seed = seed
        self.batches: list[dict[str, Any]] = []

    def update(self, predicted: Sequence[Sequence[int]], truth: Sequence[Sequence[int]]) -> dict[str, Any]:
        """Score one batch (:func:`text_scores`; its chance draws seeded by ``seed`` + the batch's index), keep it
        and return its scores."""
        result = text_scores(predicted, truth, vocab_size=self.vocab_size, strip_ids=self.strip_ids,
                             chance=self.chance, unigram=self.unigram, chance_draws=self.chance_draws,
                             seed=self.seed + len(self.batches))
        self.batches.append(result)
        return result

    def reset(self) -> None:
        self.batches = []

    def compute(self, *, resamples: int = 1000, level: float = 0.95) -> dict[str, Any]:
        """Means over every reference (ROUGE-2 over those of ≥ 2 tokens), the pooled chance baselines, ``ci``:
        each mean's bootstrap percentile interval over batches (None with fewer than two batches), and
        ``batches`` / ``references``."""
        keys = list(MEAN_KEYS.items())
        per_batch = [{name: [r[name] for r in b["pairs"]] for name, _ in keys} for b in self.batches]

        def pooled(chosen: Sequence[int]) -> dict[str, float | None]:
            return {key: _mean([v for k in chosen for v in per_batch[k][name]]) for name, key in keys}

        out: dict[str, Any] = dict(pooled(range(len(self.batches))))
        chance_keys = [*CHANCE_KEYS.values(), *BAG_ONLY_KEYS.values()] if self.chance else []
        for key in chance_keys:
            weighted = [(b[key], b["info"]["references"]) for b in self.batches if b.get(key) is not None]
            weight = sum(n for _, n in weighted)
            out[key] = sum(v * n for v, n in weighted) / weight if weight else None
        ci: dict[str, tuple[float, float] | None] = {key: None for _, key in keys}
        if len(self.batches) >= 2:
            rng = np.random.default_rng(self.seed)
            samples: dict[str, list[float]] = {key: [] for _, key in keys}
            for _ in range(resamples):
                chosen = rng.integers(0, len(self.batches), size=len(self.batches)).tolist()
                for key, value in pooled(chosen).items():
                    if value is not None:
                        samples[key].append(value)
            tail = (1.0 - level) / 2 * 100
            for key, values in samples.items():
                if values:
                    lo, hi = np.percentile(values, [tail, 100 - tail])
                    ci[key] = (float(lo), float(hi))
        out["ci"] = ci
        out["batches"] = len(self.batches)
        out["references"] = sum(b["info"]["references"] for b in self.batches)
        return out
