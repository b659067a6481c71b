"""Sequence-reconstruction metrics (gleak.metrics.text, METHODS-text §5): ROUGE over token ids against the
rouge-score package's own scorer, one-to-one matching, exact / up-to-last / token accuracy, chance baselines."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("rouge_score", reason="gleak[text] not installed")

from rouge_score import rouge_scorer

from gleak.metrics.text import (
    TextScores,
    chance_scores,
    exact_up_to_last,
    match_sequences,
    sensitive_recall,
    text_scores,
    token_accuracy,
)


def _library(prediction: list[int], reference: list[int]) -> dict[str, float]:
    """rouge-score with its default tokenizer on the ids written as words (digits survive its normalisation)."""
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    result = scorer.score(" ".join(map(str, reference)), " ".join(map(str, prediction)))
    return {k: v.fmeasure for k, v in result.items()}


def test_rouge_matches_the_library_and_hand_values() -> None:
    truth = [[1, 2, 3, 4], [10, 20, 30, 40, 50, 60], [7, 8, 7, 8, 9]]
    predicted = [[1, 2, 4], [20, 10, 30, 40, 60, 50, 99], [7, 8, 9]]
    result = text_scores(predicted, truth, vocab_size=100, chance=False)
    for record in result["pairs"]:
        i, j = record["truth"], record["prediction"]
        assert j == i
        expected = _library(predicted[j], truth[i])
        for name in ("rouge1", "rouge2", "rougeL"):
            assert record[name] == pytest.approx(expected[name], abs=1e-12)
    first = result["pairs"][0]
    # [1 2 4] against [1 2 3 4]: 3 of 4 unigrams (P 1, R 3/4), 1 of 3 bigrams (P 1/2, R 1/3), LCS 3
    assert first["rouge1"] == pytest.approx(6 / 7)
    assert first["rouge2"] == pytest.approx(0.4)
    assert first["rougeL"] == pytest.approx(6 / 7)
    # repeated tokens are clipped: [7 8 9] against [7 8 7 8 9] has 3 unigram hits (P 1, R 3/5)
    assert result["pairs"][2]["rouge1"] == pytest.approx(0.75)
    assert result["rouge1"] == pytest.approx(sum(r["rouge1"] for r in result["pairs"]) / 3)


def test_each_id_is_one_token() -> None:
    """Id 12 is not ids 1 and 2: the scorer sees ids, not characters."""
    result = text_scores([[12, 3]], [[1, 2, 3]], vocab_size=20, chance=False)
    record = result["pairs"][0]
    assert record["rouge1"] == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))
    assert record["rouge2"] == 0.0


def test_hungarian_undoes_a_permutation() -> None:
    truth = [[1, 2, 3, 4, 5], [6, 7, 8, 9], [1, 6, 11, 12], [13, 14, 2, 7, 15, 16]]
    noisy = [[1, 2, 3, 4, 0], [6, 7, 8, 0], [1, 6, 11, 0], [13, 14, 2, 7, 15, 0]]
    order = [2, 0, 3, 1]
    predicted = [noisy[k] for k in order]
    matching = match_sequences(predicted, truth)
    assert matching == [(i, order.index(i)) for i in range(len(truth))]
    straight = text_scores(noisy, truth, vocab_size=20, chance=False)
    permuted = text_scores(predicted, truth, vocab_size=20, chance=False)
    for key in ("rouge1", "rouge2", "rougeL", "exact_match", "token_accuracy"):
        assert permuted[key] == pytest.approx(straight[key])
    assert [r["prediction"] for r in permuted["pairs"]] == [order.index(i) for i in range(4)]


def test_matching_is_one_to_one() -> None:
    """One prediction close to two references scores only one of them (a best-per-reference matching would give
    both a high ROUGE-1); the other is matched to an empty prediction."""
    truth = [[1, 2, 3, 4], [1, 2, 3, 5]]
    result = text_scores([[1, 2, 3, 4]], truth, vocab_size=10, chance=False)
    assert [r["prediction"] for r in result["pairs"]] == [0, None]
    assert result["rouge1"] == pytest.approx(0.5)
    assert result["exact_match"] == pytest.approx(0.5)
    assert result["info"]["matched"] == 1
    # more predictions than references: the best one is used, the others left out
    assert match_sequences([[9, 9], [1, 2, 3, 5], [1, 2]], [[1, 2, 3, 5]]) == [(0, 1)]


@pytest.mark.parametrize(("prediction", "exact", "up_to_last", "accuracy"), [
    ([5, 6, 7, 8], True, True, 1.0),
    ([5, 6, 7, 9], False, True, 0.75),  # the last token wrong (next-token LM: in no gradient)
    ([5, 6, 7], False, True, 0.75),  # the last token missing
    ([6, 7, 8], False, False, 0.0),  # every token, shifted by one: nothing in place
    ([5, 6, 7, 8, 9], False, False, 1.0),  # one token too many: every reference token in place
    ([5, 9, 7, 8], False, False, 0.75),
    ([], False, False, 0.0),
])
def test_exact_up_to_last_and_token_accuracy(prediction: list[int], exact: bool, up_to_last: bool,
                                             accuracy: float) -> None:
    reference = [5, 6, 7, 8]
    assert exact_up_to_last(prediction, reference) is up_to_last
    assert token_accuracy(prediction, reference) == pytest.approx(accuracy)
    record = text_scores([prediction], [reference], vocab_size=10, chance=False)["pairs"][0]
    assert record["exact"] is exact
    assert record["exact_up_to_last"] is up_to_last
    assert record["token_accuracy"] == pytest.approx(accuracy)


def test_rouge2_and_up_to_last_skip_one_token_references() -> None:
    truth = [[7], [1, 2, 3]]
    assert _library([7], [7])["rouge2"] == 0.0  # the library's artefact the mean avoids
    result = text_scores([[7], [1, 2, 3]], truth, vocab_size=10, chance=False)
    assert result["pairs"][0]["rouge2"] is None
    assert result["pairs"][0]["exact_up_to_last"] is None
    assert result["rouge2"] == 1.0
    assert result["exact_up_to_last"] == 1.0
    assert result["exact_match"] == 1.0
    assert result["info"]["rouge2_references"] == 1
    only_short = text_scores([[7]], [[7]], vocab_size=10, chance=False)
    assert only_short["rouge2"] is None and only_short["rouge1"] == 1.0


def test_strip_ids_removes_pads_and_specials() -> None:
    pad, bos, eos = 0, 1, 2
    truth = [[bos, 5, 6, 7, eos, pad, pad]]
    predicted = [[5, 6, 7]]
    assert text_scores(predicted, truth, vocab_size=10, chance=False)["exact_match"] == 0.0
    result = text_scores(predicted, truth, vocab_size=10, strip_ids=(pad, bos, eos), chance=False)
    assert result["exact_match"] == 1.0 and result["token_accuracy"] == 1.0


def test_no_prediction_scores_zero() -> None:
    truth = [[1, 2, 3], [4, 5], [6]]
    result = text_scores([], truth, vocab_size=50, chance_draws=2)
    for key in ("rouge1", "rouge2", "rougeL", "exact_match", "exact_up_to_last", "token_accuracy"):
        assert result[key] == 0.0, key
    assert [r["prediction"] for r in result["pairs"]] == [None, None, None]
    assert result["chance_rouge1"] is not None
    # empty predictions (an attack that returned nothing per slot) are the same
    assert text_scores([[], [], []], truth, vocab_size=50, chance=False)["rouge1"] == 0.0
    # no truth either: nothing to average
    empty = text_scores([], [], vocab_size=50)
    assert empty["rouge1"] is None and empty["pairs"] == [] and empty["chance_rouge1"] is None


def test_chance_is_seeded_and_plausible() -> None:
    truth = [[3 * k + t for t in range(12)] for k in range(6)]
    first = chance_scores(truth, vocab_size=1000, draws=3, seed=7)
    assert first == chance_scores(truth, vocab_size=1000, draws=3, seed=7)
    assert first != chance_scores(truth, vocab_size=1000, draws=3, seed=8)
    assert first["chance_rouge1"] is not None and 0.0 <= first["chance_rouge1"] < 0.1
    assert first["chance_rouge2"] is not None and first["chance_rouge2"] < 0.02
    assert first["chance_exact_match"] == 0.0
    assert first["chance_token_accuracy"] is not None and first["chance_token_accuracy"] < 0.02
    # the shuffled bag: every token there (ROUGE-1 = 1), little of the order
    assert first["bag_only_rouge2"] is not None and first["bag_only_rouge2"] < 0.5
    assert first["bag_only_rougeL"] is not None and 0.1 < first["bag_only_rougeL"] < 0.8
    assert first["bag_only_exact_match"] == 0.0
    # a two-token vocabulary: random tokens share about half of each reference
    small = chance_scores([[0, 1, 0, 1, 1, 0, 0, 1]] * 4, vocab_size=2, draws=3, seed=0)
    assert small["chance_rouge1"] is not None and 0.5 < small["chance_rouge1"] <= 1.0
    assert small["chance_token_accuracy"] is not None and 0.25 < small["chance_token_accuracy"] < 0.8


def test_chance_pool_skips_stripped_ids_and_follows_a_unigram() -> None:
    truth = [[2, 2, 2], [2, 2]]
    stripped = chance_scores(truth, vocab_size=3, strip_ids=(0, 1), draws=2)
    assert stripped["chance_exact_match"] == 1.0  # only id 2 is left to draw
    unigram = chance_scores(truth, vocab_size=1000, unigram={2: 5.0, 3: 0.0}, draws=2)
    assert unigram["chance_rouge1"] == 1.0
    with pytest.raises(ValueError):
        chance_scores(truth, vocab_size=2, strip_ids=(0, 1))
    result = text_scores(truth, truth, vocab_size=1000, unigram={2: 1.0}, chance_draws=2)
    assert result["info"]["chance"]["tokens"] == "unigram"


def test_sensitive_recall() -> None:
    truth = [[10, 11, 12, 13], [20, 21, 22]]
    predicted = [[21, 20, 99], [10, 11, 12, 99]]
    words = {10: "Alice", 11: " saw", 12: " Dr", 13: " 1984", 20: " on", 21: " 12", 22: " May", 99: " x"}

    def capital_or_digit(text: str) -> bool:
        word = text.strip()
        return any(c.isdigit() for c in word) or word[:1].isupper()

    # sensitive: Alice, Dr, 1984 / 12, May; recovered in place: Alice, Dr (12 is there, one position early)
    result = sensitive_recall(predicted, truth, capital_or_digit, decode=words.__getitem__)
    assert result == {"sensitive_tokens": 5, "recovered": 2, "recall": pytest.approx(0.4)}
    by_id = sensitive_recall(predicted, truth, lambda token: token in {13, 22})
    assert by_id == {"sensitive_tokens": 2, "recovered": 0, "recall": 0.0}
    assert sensitive_recall([], truth, lambda token: False)["recall"] is None
    assert sensitive_recall([], truth, lambda token: True)["recall"] == 0.0


def test_batches_pool_with_an_interval() -> None:
    metric = TextScores(vocab_size=100, chance_draws=1)
    metric.update([[1, 2, 3]], [[1, 2, 3]])
    single = metric.compute(resamples=50)
    assert single["rouge1"] == 1.0 and single["ci"]["rouge1"] is None
    metric.update([[4, 5, 9], [6]], [[4, 5, 6], [7, 8]])
    pooled = metric.compute(resamples=200)
    batch = metric.batches[1]
    assert pooled["references"] == 3 and pooled["batches"] == 2
    assert pooled["exact_match"] == pytest.approx(1 / 3)
    assert pooled["token_accuracy"] == pytest.approx((1.0 + sum(r["token_accuracy"] for r in batch["pairs"])) / 3)
    low, high = pooled["ci"]["rouge1"]
    assert low <= pooled["rouge1"] <= high <= 1.0
    assert pooled["chance_rouge1"] is not None
    assert metric.batches[0]["info"]["chance"]["seed"] != batch["info"]["chance"]["seed"]


def test_rouge_score_is_imported_only_when_scoring() -> None:
    code = "import sys, gleak.metrics.text; print('rouge_score' in sys.modules, 'nltk' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
