"""The bag of input tokens beyond the span test's rank (issue 45; METHODS-sparse §1.3 R2, §3; docs/methods/sparse.md):
``sparse-tokens``.

A LoRA adapter of rank r on the first block's q/k/v sees a batch's n distinct first-layer inputs; lora_A's gradient
(or a FedAvg update's ΔA) stacked over those modules is Y = U_S C, [d, Σr]. The span test (``lora-tokens``, DAGER's
layer-1 test) reads S only while n < rank Y. Every input is an atom of a known dictionary (each vocabulary token's
first-block input, per position where the model learns positions), and a batch uses a few hundred of them, so the
joint-sparse fit of :mod:`gleak.attacks.tokens.sparse` identifies S while n < (d + rank Y)/2 (Chen & Huo, IEEE TSP
2006; Davies & Eldar, IEEE TIT 2012): at LoRA r = 16 and d = 768 that moves the limit from 16 inputs to about 390.

What it answers, and when to trust it (checked on the capture): the residual must fall to the numerical floor at
one step (the *cliff*: the support size n̂) and n̂ must stay below (d + rank Y)/2. Each token's confidence is the
share of its own explained energy (leave-one-out) above the residual floor.

Full fine-tuning of a model with learned positions before a LayerNorm (GPT-2) is read too: its tokens and positions
are atoms of their own (:meth:`~gleak.attacks.tokens.atoms.PositionalDictionary.split`), so the fit needs
n_tokens + n_positions below d where the span tests need every (token, position) pair below it.

Not read here (one line each): a fresh adapter's FedSGD gradient (lora_A's gradient is exactly zero; lora_B's rows
hold the inputs only in r dimensions, where no linear fit beats the span test), and full fine-tuning of a rotary
model, where the span test already covers n < d and no linear fit identifies more (R3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from pydantic import Field
from torch import nn

from gleak.attacks.base import NO_INPUTS, Attack, RunInputs, TokenOutput
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.attacks.tokens.adapters import LoraFactors, lora_a_is_zero, lora_factors
from gleak.attacks.tokens.atoms import CACHE_BYTES, PositionalDictionary, first_block_dictionary
from gleak.attacks.tokens.inputs import (
    InputKind,
    first_tokenwise,
    linear_gradient,
    tested_positions,
    weight_gradients,
)
from gleak.attacks.tokens.lora import global_adapter
from gleak.attacks.tokens.sparse import (
    CHUNK_ATOMS,
    CLIFF,
    CLIFF_STEPS,
    Dictionary,
    SparseFit,
    leave_one_out,
    ormp_somp,
)
from gleak.attacks.tokens.view import is_lora_only
from gleak.errors import GleakError

PAPERS = ("joint-sparse recovery (simultaneous OMP: Tropp, Gilbert & Strauss, Signal Processing 2006; uniqueness: "
          "Davies & Eldar, IEEE TIT 2012) over the first-block inputs, as SOMP (Li & Li, arXiv 2603.16761, 2026) "
          "builds on")
MAX_WORK = 3e12  # multiply-adds the fit may spend (about 10 minutes on 2 cores); beyond it the attack refuses
KNOWN_SHARE = 0.25  # known positions are projected out only while they take at most this share of d
TYPICAL_RANK = 48  # the stacked rank memory is planned for before the capture is read (r = 16 on q, k and v)
MAX_FIT_BYTES = 2 * 2**30  # the fit's per-atom state (correlations with the residual) at most
RANK_TOL = 1e-5  # singular values below this share of the largest are float32 rounding, not inputs
SHALLOW_CLIFF = 1e-2  # a cliff ratio above this: the measurement is only near the linear model (say so)
MIN_SNR = 100.0  # a lora_A update must stand this far above the weights' rounding noise to be read


class SparseTokensOptions(AttackOptions):
    max_atoms: int | None = Field(None, ge=1, description="the most inputs the fit selects (default: d − 1); it "
                                  "stops two steps after the residual's cliff")
    cliff: float = Field(CLIFF, gt=0, lt=1, description="the residual ratio one selection must reach to mark the "
                         "end of the support (the cliff)")


@register
class SparseTokens(Attack):
    """The bag of input tokens from a trained LoRA adapter's lora_A gradient or update beyond its rank: ORMP-SOMP
    over the vocabulary's first-block inputs (module docstring; METHODS-sparse §3). Scores: log10 of each token's
    explained energy over the residual floor. Counts: the positions a token was found at (1 for position-free
    inputs)."""

    task = "tokens"
    requires = Requirements(needs_text=True, gradient_view=False, needs_batch_size=False)
    name = "sparse-tokens"
    paper = PAPERS
    summary = ("bag of input tokens beyond a LoRA adapter's rank, or GPT-2's pair count (joint-sparse fit over the "
               "vocabulary's first-block inputs)")
    Options = SparseTokensOptions
    options: SparseTokensOptions

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason:
            return reason
        if ctx.model is None:
            return "needs the base model (--model DIR)"
        if not is_lora_only(ctx.capture.tensors) and ctx.text_model is not None:
            found = _full_group(ctx.model, ctx.capture.tensors, ctx.text_model.vocab_size)
            if isinstance(found, str):
                return found
        elif _fresh(ctx.capture.tensors, ctx.model):
            return ("a fresh adapter's gradient: lora_A's is zero (lora_B starts at 0), and lora_B's rows hold the "
                    "inputs only in r dimensions, where the span test (lora-tokens) reads all a linear fit can; a "
                    "FedAvg update of two or more local steps moves lora_A and is read")
        return None

    def memory_bytes(self, ctx: Context) -> int:
        spec = ctx.text_model
        if spec is None:
            return 0
        atoms = spec.vocab_size * (spec.max_length or 1)
        held = min(4 * atoms * spec.hidden_size, CACHE_BYTES)
        fit = 8 * atoms * (TYPICAL_RANK + 4)  # the fit's per-atom state (_check_cost refuses past the bound)
        return held + min(fit, MAX_FIT_BYTES) + 8 * CHUNK_ATOMS * spec.hidden_size * 2

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TokenOutput:
        spec, model = ctx.text_model, ctx.model
        if spec is None or model is None:  # pragma: no cover - not_applicable guards both
            raise GleakError("needs a language model's capture and its base model")
        warnings: list[str] = []
        read = _measure(ctx, model, spec.vocab_size, warnings)
        y, kind, layer, case, label = read.y, read.kind, read.layer, read.case, read.label
        d, vocab = y.shape[0], spec.vocab_size
        sv = torch.linalg.svdvals(y)
        rank = int((sv > RANK_TOL * sv[0]).sum())
        positions = tested_positions(spec.max_length, spec.n_positions) if kind.positional else 1
        steps = min(self.options.max_atoms or d - 1, d - 1)
        pairs = first_block_dictionary(model, layer, vocab, positions, d)
        split = isinstance(pairs, PositionalDictionary)
        # learned positions before a LayerNorm: tokens and positions as atoms of their own (V + T, exact)
        dictionary = pairs.split() if isinstance(pairs, PositionalDictionary) else pairs
        if case != "lora_A rows" and not split:
            raise GleakError("full fine-tuning of a model whose learned positions do not enter as a LayerNorm of "
                             "token plus position: no linear fit identifies more inputs than the span tests read")
        _check_cost(dictionary, rank, d, steps)
        # every position before the longest sequence's last token is an input of it: known atoms of the support,
        # when the recorded length leaves most of the room (it is metadata: a length above the batch's longest
        # forces absent positions, which cost room but not correctness)
        longest = min(spec.max_length or 0, positions)
        known = [vocab + t for t in range(longest - 1)] if split and longest - 1 <= KNOWN_SHARE * d else []
        fit = ormp_somp(y, dictionary, max_atoms=steps, known=known, threshold=self.options.cliff)
        edge = fit.size
        if edge == 0:
            raise GleakError(f"the measurement is zero ({label}): no input left a trace")
        bound = (d - len(known) + rank) / 2  # known atoms are projected out: d − k dimensions are left
        formula = f"(d − {len(known)} known positions + rank)/2" if known else "(d + rank)/2"
        where = f"{label}: rank {rank}, d = {d}"
        if edge is None and steps < d - 1 and len(fit.order) >= steps:
            raise GleakError(f"no cliff in the residual within the {steps} selections max_atoms allows ({where})")
        if edge is None:
            raise GleakError(f"no cliff in the residual within {len(fit.order)} selections ({where}): the batch has "
                             f"more distinct inputs than a sparse fit identifies (about {formula} = {bound:.0f}), "
                             "or the update is not linear in them (Adam, trained embeddings)"
                             + "".join(f"; {w}" for w in warnings))
        support, own, confidence, pruned, residual_share = _pruned_support(fit, edge, known, dictionary, y)
        found = len(support)
        places = sorted({a - vocab for a in [*known, *support] if a >= vocab}) if split else []
        token_atoms = [i for i, a in enumerate(support) if not split or a < vocab]
        ids = torch.tensor([support[i] % vocab for i in token_atoms], dtype=torch.long)
        confidence = confidence[token_atoms]
        token_ids, inverse = torch.unique(ids, return_inverse=True)
        counts = torch.zeros(len(token_ids), dtype=torch.long).index_add_(0, inverse, torch.ones_like(inverse))
        best = torch.zeros(len(token_ids), dtype=torch.float64).scatter_reduce_(0, inverse, confidence, "amax")
        scores = _token_scores(fit.rest, support, own, residual_share, vocab, 1 if split else positions)
        depth = math.prod(fit.ratios[max(0, edge - CLIFF_STEPS):edge])  # the fall over the last selections
        trusted = found < bound
        if not trusted:
            warnings.append(f"{found} inputs found, at or beyond what a sparse fit identifies ({formula} = "
                            f"{bound:.0f}): some of these tokens may be wrong")
        if depth >= SHALLOW_CLIFF:
            warnings.append(f"the residual's cliff is shallow (it fell {depth:.2g}× over its last steps; exact "
                            "float32 data: about 1e-5×): the update is only close to linear in the inputs "
                            "(rounding of θ_local − θ_global, Adam, trained embeddings, dropout), so the bag is "
                            "approximate")
        return TokenOutput(
            token_ids=token_ids, counts=counts, scores=scores, confidence=best, warnings=warnings,
            diagnostics={"method": "ormp-somp", "case": case, "modules": read.names,
                         "positions": positions, "rank": rank, "width": d, "inputs": found, "pruned": pruned,
                         "atoms": "tokens and positions apart" if split else
                         ("(token, position) pairs" if positions > 1 else "tokens"),
                         **({"positions_found": len(places)} if split else {}),
                         "identifiable_below": bound, "known_positions": len(known), "trusted": trusted,
                         "cliff_ratio": depth, "residual_share": residual_share})


@dataclass(frozen=True)
class _Measured:
    """What the fit reads: Y [d, L] and the first-block module group it comes from."""

    y: torch.Tensor
    kind: InputKind
    layer: nn.Module
    case: str
    names: list[str]
    label: str


def _measure(ctx: Context, model: nn.Module, vocab: int, warnings: list[str]) -> _Measured:
    """Y of a LoRA capture (lora_A of the first block's adapted q/k/v or c_attn, less modules at the rounding floor)
    or of full fine-tuning (the first block's weight gradients), or one line."""
    if is_lora_only(ctx.capture.tensors):
        factors = lora_factors(ctx.capture.tensors, model)
        group = first_tokenwise(model, [(f.module, f.layer) for f in factors], vocab)
        if group is None:
            raise GleakError("no adapted module reads token-wise inputs (LoRA on the first block's q/k/v or c_attn)")
        kind, paths = group
        members = [f for f in factors if f.module in paths]
        if ctx.capture.kind == "update":
            members = _above_storage_floor(members, global_adapter(ctx.capture.path), warnings)
        y = torch.cat([f.a.double().T for f in members], 1)  # [d, Σr]: every column in span{u}
        return _Measured(y=y, kind=kind, layer=members[0].layer, case="lora_A rows",
                         names=[f.module for f in members], label=_lora(members))
    full = _full_group(model, ctx.capture.tensors, vocab)
    if isinstance(full, str):  # pragma: no cover - not_applicable says the same
        raise GleakError(full)
    kind, names, layer, y = full
    return _Measured(y=y, kind=kind, layer=layer, case="weight gradient rows", names=names,
                     label=f"full fine-tuning of {', '.join(names)}")


def _check_cost(dictionary: Dictionary, rank: int, d: int, steps: int) -> None:
    """One line before the fit when its state or its work would pass the bounds (:data:`MAX_FIT_BYTES`,
    :data:`MAX_WORK`)."""
    size = dictionary.size
    held = 8.0 * size * (min(rank, d) + 4)  # the fit's correlations, energies and scores, float64
    if held > MAX_FIT_BYTES:
        raise GleakError(f"the fit would hold {held / 2**30:.1f} GiB ({size:,} candidate inputs × {rank} columns; "
                         f"at most {MAX_FIT_BYTES / 2**30:.0f} GiB): record the batch's max length (fewer "
                         "positions), or adapt fewer first-block modules")
    work = dictionary.pass_cost() * (steps + 2) * 2
    if work > MAX_WORK:
        raise GleakError(f"the fit would take about {work / 5e9 / 60:.0f} min on 2 cores ({size:,} candidate inputs "
                         f"of {d} dimensions, up to {steps} selections); pass --option sparse-tokens.max_atoms=N "
                         "with fewer, or record the batch's max length")


def _pruned_support(fit: SparseFit, edge: int, known: list[int], dictionary: Dictionary, y: torch.Tensor
                    ) -> tuple[list[int], torch.Tensor, torch.Tensor, int, float]:
    """The support up to the cliff, each atom's own share of ‖Y‖² (leave-one-out, the known atoms in the model),
    its confidence own / (own + residual share), less the atoms below the residual floor: (support, own,
    confidence, how many were pruned, the residual share). An atom whose own share is below the floor explains
    nothing the others do not — the greedy fit picked it on the way, near the bound, and its coefficient is ~0."""
    support = fit.order[:edge]
    atoms = torch.stack([dictionary.atom(a) for a in [*known, *support]])
    own = leave_one_out(dictionary.prepare(y), atoms)[len(known):]
    residual_share = max((fit.diagnostics.get("left", 1.0) * math.prod(fit.ratios[:edge])) ** 2, 1e-300)
    confidence = own / (own + residual_share)
    kept = confidence >= 0.5
    support = [a for a, k in zip(support, kept.tolist(), strict=True) if k]
    return support, own[kept], confidence[kept], int((~kept).sum()), residual_share


def _full_group(model: nn.Module, tensors: Mapping[str, torch.Tensor], vocab: int
                ) -> tuple[InputKind, list[str], nn.Module, torch.Tensor] | str:
    """Full fine-tuning: the first block's token-wise projections with a weight gradient, their input kind, and
    Y = [∇W_1ᵀ …] [d_in, Σ d_out]; or why the sparse fit adds nothing there (one line). Only learned positions
    added before a LayerNorm (GPT-2) gain: their tokens and positions are atoms of their own, n_tokens + n_positions
    of them where the span tests count every (token, position) pair."""
    modules, grads = weight_gradients(model, tensors, linear_gradient)
    group = first_tokenwise(model, [(p, modules[p]) for p in grads], vocab)
    if group is None:
        return ("no first-block projection with a weight gradient reads token-wise inputs (LoRA adapters or the "
                "first block's q/k/v or c_attn)")
    kind, paths = group
    if not kind.positional:
        return ("full fine-tuning of a model with one first-block input per token (rotary positions): the span "
                "tests (token-bag, dager) read fewer than d distinct inputs, and no linear fit identifies more")
    y = torch.cat([grads[p].double().T for p in paths], 1)
    return kind, paths, modules[paths[0]], y


def _fresh(tensors: Mapping[str, torch.Tensor], model: nn.Module) -> bool:
    """A fresh adapter's FedSGD gradient (:func:`~gleak.attacks.tokens.adapters.lora_a_is_zero`); a capture whose
    factors do not pair with the model is left to :meth:`SparseTokens.run`, which says why in one line."""
    try:
        return lora_a_is_zero(lora_factors(tensors, model))
    except GleakError:
        return False


def _above_storage_floor(members: list[LoraFactors], stored: Mapping[str, torch.Tensor] | None,
                         warnings: list[str]) -> list[LoraFactors]:
    """The modules whose lora_A update stands clear of the rounding of the weights it was taken from (an update is
    θ_local − θ_global in the weights' dtype: each entry carries up to half an ulp of the global A; METHODS-sparse
    §5). Needs the global adapter beside the capture; without it every module is kept. One line when none is
    left: a fresh adapter's ΔA after a few small steps can sit entirely at that floor."""
    if stored is None:
        return members
    kept, worst = [], math.inf
    for f in members:
        a0 = stored.get(f.a_name)
        if a0 is None or a0.shape != f.a.shape or not a0.is_floating_point():
            return members
        noise = torch.finfo(a0.dtype).eps / 2 * float(a0.double().square().mean().sqrt()) * math.sqrt(a0.numel())
        snr = float(f.a.double().norm()) / max(noise, 1e-300)
        worst = min(worst, snr)
        if snr >= MIN_SNR:
            kept.append(f)
    if not kept:
        raise GleakError(f"lora_A's update is at the {stored[members[0].a_name].dtype} rounding floor of the global "
                         f"adapter's A (signal {worst:.3g}× the rounding noise, below {MIN_SNR:g}×): the local steps "
                         "moved it too little to hold a measurable trace of the inputs")
    if len(kept) < len(members):
        warnings.append(f"{len(members) - len(kept)} of {len(members)} adapted modules' lora_A updates are at the "
                        "weights' rounding floor and were left out")
    return kept


def _token_scores(rest: torch.Tensor | None, support: list[int], own: torch.Tensor, floor: float, vocab: int,
                  positions: int) -> torch.Tensor:
    """Per vocabulary token [V]: log10 of its explained energy over the residual floor, the best over positions
    (a selected input's own share; any other input's share it would still explain after the fit)."""
    energy = rest.clone() if rest is not None else torch.zeros(vocab * positions, dtype=torch.float64)
    energy[torch.tensor(support, dtype=torch.long)] = own
    energy = energy[:vocab * positions]  # a split dictionary's position atoms follow the tokens
    scores: torch.Tensor = torch.log10(energy.clamp_min(1e-300) / floor).reshape(positions, vocab).amax(0)
    return scores


def _lora(members: list[LoraFactors]) -> str:
    where = f"{len(members)} modules" if len(members) > 1 else members[0].module
    return f"LoRA r = {members[0].rank} on {where}"
