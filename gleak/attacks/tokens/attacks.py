"""Token-recovery attacks on language-model captures (task ``tokens``): the bag of input tokens, the next-token
counts and the sequence lengths, read from the embedding, LM-head and position-table gradients.

Methods: METHODS-text §2.1–§2.5 (FILM, Gupta et al., NeurIPS 2022, for the embedding rows; LLG / iLRG-style
label recovery at C = V for the head). Notes: docs/methods/tokens.md.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, RunInputs, TokenOutput
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.attacks.tokens.bag import (
    CHUNK_BYTES,
    RANK_POINTS,
    Bag,
    Subspace,
    head_targets,
    position_lengths,
    tied_bag,
    untied_bag,
)
from gleak.attacks.tokens.firstblock import check_bag
from gleak.attacks.tokens.inputs import MAX_POSITIONS
from gleak.attacks.tokens.view import TokenView
from gleak.errors import GleakError

TEXT = Requirements(needs_text=True, gradient_view=False, needs_batch_size=False)
DEFAULT_EXCLUDE = 4096  # reference-set exclusion when B and the padded length are not known
FILM = "Gupta et al., Recovering Private Text in Federated Learning of Language Models (FILM), NeurIPS 2022"


def _output(bag: Bag, extra: dict[str, Any] | None = None, warnings: list[str] | None = None) -> TokenOutput:
    ids = bag.flagged.nonzero().flatten()
    diagnostics = {"method": bag.method, **bag.diagnostics, **(extra or {})}
    return TokenOutput(token_ids=ids, counts=bag.counts[ids], scores=bag.scores, diagnostics=diagnostics,
                       warnings=[*bag.warnings, *(warnings or [])])


def _exclude(view: TokenView, requested: int | None) -> int:
    """K, the largest-norm rows kept out of the reference set: the option, else 4·B·T when both are known (a
    generous bound on the distinct tokens of the batch, §2.2(a)), else :data:`DEFAULT_EXCLUDE`; at most V/2."""
    spec = view.spec
    if requested is not None:
        k = requested
    elif spec.batch_size and spec.max_length:
        k = 4 * spec.batch_size * spec.max_length * spec.local_steps
    else:
        k = DEFAULT_EXCLUDE
    return min(k, spec.vocab_size // 2)


def _max_rank(view: TokenView) -> int | None:
    """M ≤ B·(T − 1) per step: the largest possible dimension of 𝓗 when B and T are known."""
    spec = view.spec
    if spec.batch_size and spec.max_length:
        return spec.batch_size * max(1, spec.max_length - 1) * spec.local_steps
    return None


def _max_tokens(view: TokenView) -> int | None:
    """B·T per step: the most distinct tokens the batch can hold, when B and the padded length are known."""
    spec = view.spec
    if spec.batch_size and spec.max_length:
        return spec.batch_size * spec.max_length * spec.local_steps
    return None


def _separation(ctx: Context, view: TokenView, exclude: int | None, rho_threshold: float | None,
                min_gap: float | None) -> tuple[Bag, Subspace | None]:
    """:func:`~gleak.attacks.tokens.bag.tied_bag` on the capture's tied embedding gradient, once per context and
    arguments: token-bag and next-tokens read the same separation (seconds at V = 50,257), and neither changes it."""
    key = f"tied_bag:{view.embedding_name}:{exclude}:{rho_threshold}:{min_gap}"
    if key not in ctx._cache:
        ctx._cache[key] = tied_bag(view.embedding, exclude=_exclude(view, exclude), rho_threshold=rho_threshold,
                                   min_gap=min_gap, max_rank=_max_rank(view), max_tokens=_max_tokens(view))
    found: tuple[Bag, Subspace | None] = ctx._cache[key]
    return found


def _positions(view: TokenView) -> int:
    """Positions the first block's test reads (learned positions only): the recorded padded length, else the
    longest sequence the position table's gradient shows (§2.4), else :data:`MAX_POSITIONS`."""
    spec = view.spec
    if spec.max_length:
        return min(spec.max_length, MAX_POSITIONS)
    if view.positions is not None:
        found = position_lengths(view.positions, view.position_offset, spec.task == "causal_lm").max_length
        if found:
            return min(found, MAX_POSITIONS)
    return MAX_POSITIONS


class TokenAttack(Attack):
    """Base of the token attacks: a text capture is required; the view's tensors are found once per context."""

    task = "tokens"
    requires = TEXT

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        try:
            return self.view_problem(ctx.require_tokens())
        except GleakError as e:
            return str(e)

    def view_problem(self, view: TokenView) -> str | None:
        """Why this attack cannot read ``view`` (one line), or None."""
        return None

    def memory_bytes(self, ctx: Context) -> int:
        """Two float64 blocks of rows (:data:`CHUNK_BYTES`), about eight float64 vectors [V] and, tied models only,
        two d × d float64 matrices (the Gram matrix and its eigenvectors), the float32 [V, RANK_POINTS] table of
        residual ratios of the rank sweep, and the first block's check: the SVD of its stacked weight gradients
        (3·d × d and d × d, float64) and a chunk of candidate inputs with their coordinates."""
        spec = ctx.text_model
        if spec is None:
            return 0
        first_block = 8 * 5 * spec.hidden_size ** 2 + 2 * 4 * 2048 * spec.hidden_size if spec.tied_lm else 0
        return (2 * CHUNK_BYTES + 8 * 8 * spec.vocab_size + 2 * 8 * spec.hidden_size ** 2
                + 4 * RANK_POINTS * spec.vocab_size + first_block)


class TokenBagOptions(AttackOptions):
    method: Literal["auto", "row-norm"] = Field(
        "auto", description="auto: exact non-zero rows (untied) or the span-residual separation (tied); row-norm: "
        "the plain row-norm gap cut (a baseline)")
    relative: float = Field(0.0, ge=0, lt=1, description="untied: a row is present when max|row| exceeds this "
                            "share of the largest entry (default 0: any non-zero row; an absent token's row is exactly "
                            "zero, and an input seen once at a confident position can be 1e-7 of the largest)")
    exclude: int | None = Field(None, ge=1, description="tied: the largest-norm rows kept out of the head-span "
                                "estimate (default 4·B·T when known, else 4096)")
    min_gap: float | None = Field(None, gt=1, description="tied, optional: fall back to the row-norm cut when the "
                                  "widest gap of the residual ratios ρ is narrower (the rule before issue 44, 10 "
                                  "then); default: never, the widest gap decides and its width is reported")
    rho_threshold: float | None = Field(None, gt=0, lt=1, description="tied: flag rows whose residual ratio ρ "
                                        "exceeds this (default: the widest gap of the sorted ρ)")
    first_block: bool = Field(True, description="tied: check the bag with the first block's span test (DAGER's "
                              "layer 1) when the model is given and the batch has fewer distinct first-block inputs "
                              "than the width: proven tokens join the bag")


@register
class TokenBag(TokenAttack):
    """The bag of input tokens from the token-embedding gradient ∇E (METHODS-text §2.1, §2.2; FILM, Gupta et al.,
    NeurIPS 2022).

    Untied embedding (or a classification loss): ∇E[v] = Σ_{x_it = v} ∂L/∂x_it is non-zero exactly at tokens that
    occur at loss-relevant input positions; rows are flagged when max|row| > ``relative``·max (float64; default 0). Tied
    embedding under next-token loss: ∇E = G_in + G_head with every row of G_head in 𝓗 = span{h} (the union over the
    local steps for an update); rows are scored by the share ρ_v of the row outside an estimate of 𝓗 from the
    rows of absent tokens, its rank chosen as the one whose ρ separate best and the estimate redone from the rows it
    explains (§2.2(a), see :func:`gleak.attacks.tokens.bag.tied_bag`); the cut is the widest gap of the sorted ρ
    among at most B·T rows, with no minimum ratio (its width: ``diagnostics.separation``). With the model, the first
    block's span test (DAGER's layer 1, :mod:`gleak.attacks.tokens.firstblock`) checks the cut: when its own
    separation is the wider, the tokens it proves are the bag (for the tokens it tested), else the cut stands.
    ``diagnostics.method`` says what ran. Scores: max|row|/max (untied), ρ (tied), norm/max (row-norm).

    What is recovered: untied, the tokens at input positions (a sequence's last token is invisible under
    next-token loss: see ``next-tokens``); tied, the same. Tokens seen only as targets are head-only and stay out,
    unless the absent tokens' rows never weigh the hidden state that predicted them (a model certain of every
    alternative at a position, e.g. a fixed template): then they are flagged too (docs/methods/tokens.md).

    Counts: round(‖row‖ / median flagged ‖row‖), the residual norm for tied models (§2.1's heuristic: a row sums
    occurrences of unknown norms). Rough: measured count accuracy is in docs/methods/tokens.md.

    Updates are read as their direction −Δ (FedAvg: the rows of every local step add up; untied, still exactly
    the batch's rows; tied, a float32 update rounds the absent tokens' small rows against the weights, which can
    hide 𝓗: docs/methods/tokens.md). Peak extra memory: a 64 MiB float64 block of rows and its |·| or its
    coordinates (128 MiB), a few float64 [V] vectors and, tied, two d × d float64 matrices (Gram and
    eigenvectors: 268 MB at d = 4096) and a float32 [V, 48] table of ρ (9.6 MB at V = 50,257)."""

    name = "token-bag"
    paper = FILM
    summary = "bag of input tokens from the token-embedding gradient (tied: span-residual separation)"
    Options = TokenBagOptions
    options: TokenBagOptions

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TokenOutput:
        view = ctx.require_tokens()
        o = self.options
        warnings = [view.note] if view.note else []
        if o.method == "row-norm":
            bag, _ = tied_bag(view.embedding, exclude=0, min_gap=float("inf"))
            bag.method, bag.warnings = "row-norm-gap", []
        elif view.spec.tied_lm:
            bag, _ = _separation(ctx, view, o.exclude, o.rho_threshold, o.min_gap)
            if o.first_block and ctx.model is not None and o.rho_threshold is None:
                bag = check_bag(bag, ctx.model, ctx.capture.tensors, view.spec.vocab_size, _positions(view),
                                _max_tokens(view))
        else:
            bag = untied_bag(view.embedding, relative=o.relative, max_tokens=_max_tokens(view))
        return _output(bag, {"tensor": view.embedding_name}, warnings)


class NextTokenOptions(AttackOptions):
    exclude: int | None = Field(None, ge=1, description="tied: the largest-norm rows kept out of the head-span "
                                "estimate (default 4·B·T when known, else 4096)")
    min_gap: float | None = Field(None, gt=1, description="tied, optional: refuse when the widest gap of the sorted "
                                  "residual ratios ρ is narrower (the rule before issue 44, 10 then); default: "
                                  "never")


@register
class NextTokens(TokenAttack):
    """Next-token counts from the LM-head gradient: label recovery at C = V (METHODS-text §2.3; LLG, Wainakh et al.,
    PoPETs 2022, presence from the gradient rows, counts from their magnitude).

    Untied head: ∇W_out = (1/M)(P − Y)ᵀH; a target's row carries −(c_v/M)·Σ h, an absent token's only
    (1/M)·Σ_t p_tv h_t (about V times smaller at random weights). Targets = rows above the largest row-norm
    log-gap; count = round(‖row‖ / median flagged ‖row‖), a rough estimate (one occurrence is taken to be the
    median flagged row; repeated targets in different contexts add with partial cancellation). There is no bias,
    so the exact count identity of §2.3 is unavailable. This degrades on confident (trained) models, whose wrong
    predictions inflate absent rows.

    Tied head: the head part is separated first (§2.2(a)); among the rows the span explains (no input part), the
    targets are read as above: the tokens seen only as targets, including every sequence's last token unless it
    also occurs as an input. When the span cannot be separated, the attack does not run (one line why).

    Memory: the head is read in 64 MiB float64 blocks of rows; peak extra memory is one block and its |·| plus a few
    float64 [V] vectors (measured: 129 MB at V = 50,257, d = 768 and 124 MB at V = 128,256, d = 4096, beside the
    stored head; bench/tokens.py), plus, tied, two d × d float64 matrices and a float32 [V, 48] table; never V × V
    or (B·T) × V."""

    name = "next-tokens"
    paper = "Wainakh et al., User-Level Label Leakage from Gradients in Federated Learning, PoPETs 2022"
    summary = "next-token (target) counts from the LM-head gradient, label recovery at C = vocabulary size"
    Options = NextTokenOptions
    options: NextTokenOptions

    def view_problem(self, view: TokenView) -> str | None:
        if view.spec.task != "causal_lm":
            return "needs a next-token (causal LM) loss; a sequence classifier's head is read by the label attacks"
        if view.head is None and not view.spec.tie_word_embeddings:
            return "the capture has no LM-head tensor (lm_head.weight): the head was frozen or not sent"
        return None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TokenOutput:
        view = ctx.require_tokens()
        warnings = [view.note] if view.note else []
        if view.head is not None:
            return _output(head_targets(view.head), {"tensor": view.head_name}, warnings)
        bag, sub = _separation(ctx, view, self.options.exclude, None, self.options.min_gap)
        if sub is None:
            raise GleakError("cannot separate the head part of the tied embedding gradient (" +
                             bag.warnings[0].split(": ", 1)[1].split(";")[0] + "), so the targets cannot be read")
        pure = ~bag.flagged
        targets = head_targets(view.embedding, candidates=pure, max_flag=max(1, int(bag.flagged.sum())))
        return _output(targets, {"tensor": view.embedding_name, "tied": True, "head_rank": sub.rank,
                                 "inputs_excluded": int(bag.flagged.sum())},
                       [*warnings, "tied head: only tokens seen as targets and never as inputs are listed (the "
                        "target status of input tokens is not separated)"])


class SequenceLengthOptions(AttackOptions):
    relative: float = Field(0.0, ge=0, lt=1, description="a position row is non-zero when max|row| exceeds this "
                            "share of the largest entry (default 0: any non-zero row)")


@register
class SequenceLength(TokenAttack):
    """The longest sequence (and a heuristic length histogram) from the learned position table's gradient
    (METHODS-text §2.4; FILM reads the largest non-zero row).

    ∇P[t] = Σ_i ∂L/∂x_it is non-zero iff some sequence has a loss-relevant token at position t: T_max = 2 + the
    last such t under next-token loss (the last token gets no gradient), 1 + it for classification. Assumes
    right padding (a GPT-2 forward uses positions 0..T−1 whatever the mask). With B known, the lengths are read
    from the steps of ‖∇P[t]‖² (heuristic). RoPE models (LLaMA, Mistral, Qwen) have no position table: not
    applicable. Peak extra memory: one float64 copy of the table."""

    name = "seq-length"
    paper = FILM
    summary = "maximum sequence length and a length histogram from the position-embedding gradient"
    Options = SequenceLengthOptions
    options: SequenceLengthOptions

    def view_problem(self, view: TokenView) -> str | None:
        if view.positions is None:
            if view.spec.n_positions is None:
                return (f"{view.spec.model_type} has no learned position table (rotary positions): lengths come "
                        "only from sequence recovery")
            return "the capture has no position-embedding tensor (wpe / position_embeddings)"
        return None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TokenOutput:
        view = ctx.require_tokens()
        assert view.positions is not None
        lengths = position_lengths(view.positions, view.position_offset, view.spec.task == "causal_lm",
                                   view.spec.batch_size, self.options.relative)
        empty = torch.zeros(0, dtype=torch.long)
        return TokenOutput(token_ids=empty, counts=empty, max_length=lengths.max_length, lengths=lengths.histogram,
                           diagnostics={"tensor": view.position_name, "last_position": lengths.last_position,
                                        "position_norms": lengths.position_norms},
                           warnings=[*([view.note] if view.note else []), *lengths.warnings])
