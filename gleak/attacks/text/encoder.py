"""DAGER's encoder variant (Petrov et al., NeurIPS 2024, Alg. 3; METHODS-text §3.8): sentences from a BERT-style
classifier's gradient.

An encoder attends both ways, so a position's second-block input depends on the whole sequence: no prefix can be
tested alone, and sequences are searched whole. For each length ℓ (every position whose first-block set is not
empty), candidates are drawn from T_0 × … × T_(ℓ−1), each set cut to its B closest tokens (§3.8 step 2), and
scored by the mean second-block residual over their positions (step 4). A true sequence lies in the span at every
position; a sequence of the wrong length or with one wrong token does not (every position sees every token).

* Up to ``max_combinations`` candidates per length, every one is scored (the paper's exhaustive search).
* Beyond that (the paper samples 10 M at random on a GPU), a coordinate search from B starts (the k-th closest
  token everywhere): one position at a time takes the token that lowers the score most, until nothing does.
  Each wrong token adds to every position's residual, so the score falls as tokens come right.

Sequences below the span's threshold are exact. Fewer than B exact ones are filled up with the best others that
differ from every chosen one in at least 30 % of positions (§3.5 step 6), flagged as not exact.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from gleak.attacks.tokens.inputs import module_inputs
from gleak.attacks.tokens.spantest import SpanTest
from gleak.timebox import checkpoint

MAX_COMBINATIONS = 20_000  # candidates scored exhaustively per length (beyond: the coordinate search)
CHUNK_TOKENS = 1 << 14  # token positions per forward pass
SIMILAR = 0.7  # two sequences agreeing on this share of positions are one (DAGER's distinct_thresh)


def is_bidirectional(model: nn.Module, layer: nn.Module, vocab_size: int) -> bool:
    """Whether ``layer``'s input at position 0 changes when a later token changes: an encoder (no prefix test)."""
    ids = torch.tensor([[3 % vocab_size, 4 % vocab_size, 5 % vocab_size], [3 % vocab_size, 4 % vocab_size,
                                                                          6 % vocab_size]])
    x = module_inputs(model, layer, ids).double()
    scale = float(x.abs().max()) or 1.0
    return not bool(torch.allclose(x[0, 0], x[1, 0], rtol=1e-4, atol=1e-5 * scale))


class Scorer:
    """Second-block residuals of whole sequences (all of one length): the mean over positions ranks and guides the
    search, the largest decides exactness (a true sequence lies in the span at every position)."""

    def __init__(self, model: nn.Module, layer: nn.Module, test: SpanTest) -> None:
        self.model, self.layer, self.test = model, layer, test
        self.calls = 0

    def __call__(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """([N] mean residuals, [N] worst residuals)."""
        length = len(seqs[0])
        rows = max(1, CHUNK_TOKENS // length)
        out = torch.empty(len(seqs), length, dtype=torch.float64)
        for first in range(0, len(seqs), rows):
            checkpoint(f"encoder: length {length}, {self.calls + first} sequences scored")
            ids = torch.tensor(seqs[first:first + rows], dtype=torch.long)
            x = module_inputs(self.model, self.layer, ids)
            out[first:first + len(ids)] = self.test.residual(x.reshape(-1, x.shape[-1])).reshape(len(ids), length)
        self.calls += len(seqs)
        return out.mean(1), out.amax(1)


def coordinate_search(score: Scorer, options: list[list[int]], start: list[int], sweeps: int = 8
                      ) -> tuple[list[int], float, float]:
    """From ``start``, change one position at a time to the token that lowers the mean residual most (every option
    of that position scored at once), sweeping the positions until no change helps; (sequence, mean, worst)."""
    seq = list(start)
    means, worsts = score([seq])
    best, worst = float(means[0]), float(worsts[0])
    for _ in range(sweeps):
        moved = False
        for p, opts in enumerate(options):
            trials = [[*seq[:p], v, *seq[p + 1:]] for v in opts if v != seq[p]]
            if not trials:
                continue
            means, worsts = score(trials)
            k = int(torch.argmin(means))
            if float(means[k]) < best:
                best, worst, seq = float(means[k]), float(worsts[k]), trials[k]
                moved = True
        if not moved:
            break
    return seq, best, worst


def similar(a: Sequence[int], b: Sequence[int]) -> bool:
    """Lengths at most one apart and agreeing on at least :data:`SIMILAR` of the shorter one's positions (a
    sequence and itself one token longer are one; a one-token sequence is not like every longer one)."""
    n = min(len(a), len(b))
    return abs(len(a) - len(b)) <= 1 and sum(x == y for x, y in zip(a[:n], b[:n], strict=True)) >= SIMILAR * n


def search(model: nn.Module, layer: nn.Module, test: SpanTest, sets: list[list[int]], batch_size: int | None,
           cut: Callable[[torch.Tensor], tuple[float, float]], max_combinations: int = MAX_COMBINATIONS,
           progress: Callable[[str], None] | None = None) -> tuple[list[list[int]], list[bool], dict[str, Any]]:
    """The encoder search (module docstring): (sequences, exact flags, diagnostics). ``cut`` places the threshold
    on the worst residual of every sequence scored (0 where no gap is clear: then nothing is called exact; the
    caller caps it by the first block's threshold, so a loose second-block span cannot call a sequence exact). The
    best sequences by mean residual are kept, up to B, one of each family of near-copies. Lengths run up to the
    first empty set."""
    keep = batch_size or max((len(s) for s in sets), default=1)
    end = next((p for p, s in enumerate(sets) if not s), len(sets))
    lengths = list(range(1, end + 1))
    score = Scorer(model, layer, test)
    scored: list[tuple[float, float, list[int]]] = []  # (mean, worst, sequence)
    searched: dict[int, str] = {}
    for n in lengths:
        opts = sets[:n]
        if math.prod(len(o) for o in opts) > max_combinations:  # the paper's cut: each set to its B closest
            cut_sets = [o[:keep] for o in opts]
            if math.prod(len(o) for o in cut_sets) <= max_combinations:
                opts = cut_sets
        if math.prod(len(o) for o in opts) <= max_combinations:
            combos = [list(c) for c in itertools.product(*opts)]
            means, worsts = score(combos)
            scored += list(zip(means.tolist(), worsts.tolist(), combos, strict=True))
            searched[n] = "all"
        else:  # every option stays open: one position at a time costs only its set's size
            for k in range(keep):
                start = [o[min(k, len(o) - 1)] for o in opts]
                seq, mean, worst = coordinate_search(score, opts, start)
                scored.append((mean, worst, seq))
            searched[n] = "coordinate"
        if progress is not None:
            progress(f"encoder: length {n}/{end}, {score.calls} sequences scored")
    scored.sort(key=lambda t: t[0])
    threshold, gap = cut(torch.tensor([w for _, w, _ in scored], dtype=torch.float64)) if scored else (0.0, 1.0)
    chosen: list[tuple[float, list[int], bool]] = []
    for d, w, s in scored:  # best mean first; one of each family of near-copies
        if batch_size is not None and len(chosen) >= batch_size:
            break
        if not any(similar(s, c) for _, c, _ in chosen):
            chosen.append((d, s, w < threshold))
    return [c for _, c, _ in chosen], [e for _, _, e in chosen], {
        "encoder": True, "lengths_searched": searched, "sequences_scored": score.calls, "tau2": threshold, "gap2": gap,
        "encoder_scores": [float(f"{d:.3g}") for d, _, _ in chosen]}
