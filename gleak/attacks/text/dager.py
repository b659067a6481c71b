"""DAGER: exact sentences from a decoder's gradient or update (Petrov, Dimitrov, Baader, Müller, Vechev,
NeurIPS 2024; METHODS-text §3; notes in docs/methods/text.md).

1. **Spans.** The first block's attention-input projections (GPT-2's c_attn; q/k/v of LLaMA-style models) read
   inputs u_t; their weight gradient ∇W = Σ δ_t u_tᵀ keeps span{u_t}. The same projections of the second block
   keep the span of the layer-2 inputs, each of which depends only on its prefix (causal attention). For a LoRA
   update, the adapters' factors keep the same spans (:mod:`gleak.attacks.tokens.spantest`).
2. **Layer-1 token sets.** Every vocabulary token's layer-1 input (at every position when positions are learned)
   is tested against the first span: T_p, the tokens that can stand at position p (§3.4). The threshold sits in
   the gap of the residuals.
3. **Assembly.** Prefixes grow one token at a time: a candidate s + (v,) stays when its layer-2 input at the new
   position lies in the second span (§3.5), below a threshold set from that span's noise floor. A prefix with no
   extension is a finished sequence.
4. **The last token.** Under next-token loss the last token of each sequence is read by nothing, so no span holds
   it. The LM head sees it as a target: with every other position known, M·∇W_out = (P − Y)ᵀH is linear in the
   unknown last targets, solved with the pseudo-inverse of the last hidden states (§2.3, "exact counts once H is
   known"). On tied embeddings the input part of the gradient adds to the same rows: the solve is then a best
   guess, and the report says which.

Preconditions are checked, not assumed: the spans must stay below the width (fewer distinct inputs than d, or
than the LoRA rank), or the attack fails in one line naming the rank.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gleak.attacks.text.encoder import MAX_COMBINATIONS, is_bidirectional, search
from gleak.attacks.text.prefix import PrefixInputs
from gleak.attacks.tokens.adapters import LORA_NAME, lora_factors
from gleak.attacks.tokens.inputs import (
    MAX_POSITIONS,
    candidate_residuals,
    first_tokenwise,
    input_kind,
    linear_gradient,
    module_inputs,
    tested_positions,
    weight_gradients,
)
from gleak.attacks.tokens.span import gap_threshold
from gleak.attacks.tokens.spantest import SpanTest, lora_span, margin, weight_span
from gleak.attacks.tokens.view import TextModelSpec, is_lora_only
from gleak.capture import model_logits, token_loss
from gleak.errors import GleakError
from gleak.timebox import checkpoint

CANDIDATES = 5  # runners-up per last token kept from the head solve
UNSURE = 0.05  # a solved weight further than this from 1 is checked by recomputing the gradient (tied heads)
CUT_STEPS = 3  # positions in a row with the frontier over its limit before the search gives up
MAX_FRONTIER = 4096  # prefixes kept per step (the best by layer-2 residual) before the search is cut


@dataclass(frozen=True, kw_only=True)
class ModuleGroup:
    """Modules of one block that read the same input: their paths, one of them (to hook), and their span test."""

    paths: list[str]
    layer: nn.Module
    test: SpanTest


@dataclass(kw_only=True)
class Sentences:
    """What DAGER found: token ids per sequence (in discovery order), whether each passed every test, whether its
    last token came from the head, and diagnostics."""

    sequences: list[list[int]]
    exact: list[bool]
    last_from_head: list[bool]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def next_block(path: str) -> str | None:
    """The same module one block later: the first number in the path plus one."""
    m = re.search(r"\.(\d+)\.", path)
    if m is None:
        return None
    return f"{path[:m.start(1)]}{int(m.group(1)) + 1}{path[m.end(1):]}"


def _weight_groups(model: nn.Module, tensors: dict[str, torch.Tensor], min_gap: float
                   ) -> tuple[ModuleGroup, ModuleGroup, bool]:
    """Full fine-tuning: the first block's token-wise projections and the same projections one block later."""
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
    modules, grads = weight_gradients(model, tensors, linear_gradient)
    group = first_tokenwise(model, [(p, modules[p]) for p in grads], vocab)
    positional = group is not None and group[0].positional
    first = [(p, modules[p], grads[p]) for p in (group[1] if group else [])]
    if not first:
        raise GleakError("no first-block projection with a gradient reads token-wise inputs (the capture must hold "
                         "the first attention block's weights: c_attn, or q/k/v_proj)")
    second = _second_group(model, modules, tensors, [p for p, _, _ in first], vocab)
    g1 = weight_span([g for _, _, g in first], [p for p, _, _ in first], min_gap)
    g2t = weight_span([g for _, _, g in second], [p for p, _, _ in second], min_gap)
    return (ModuleGroup(paths=[p for p, _, _ in first], layer=first[0][1], test=g1),
            ModuleGroup(paths=[p for p, _, _ in second], layer=second[0][1], test=g2t), positional)


def _second_group(model: nn.Module, modules: dict[str, nn.Module], tensors: dict[str, torch.Tensor],
                  first: list[str], vocab: int) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """The prefix test's modules: the first block's projections one block later (DAGER's choice), else — a
    one-block model — the first later module group with a gradient whose input mixes the prefix (the MLP input)."""
    later = [next_block(p) for p in first]
    if all(p is not None and p in modules and f"{p}.weight" in tensors for p in later):
        found = [(p, modules[p], linear_gradient(modules[p], tensors[f"{p}.weight"])) for p in later if p]
        return [(p, m, g) for p, m, g in found if g is not None]
    names = list(modules)
    start = max(names.index(p) for p in first) + 1
    probe_ids = torch.arange(min(vocab, 5)).unsqueeze(0)
    group: list[tuple[str, nn.Module, torch.Tensor]] = []
    probe: torch.Tensor | None = None
    for path in names[start:]:
        layer, grad = modules[path], tensors.get(f"{path}.weight")
        g = linear_gradient(layer, grad) if grad is not None and grad.dim() == 2 else None
        if g is None:
            continue
        seen = module_inputs(model, layer, probe_ids)
        if group:
            if probe is None or seen.shape != probe.shape or not torch.allclose(seen, probe):
                break
            group.append((path, layer, g))
            continue
        if not input_kind(model, layer, vocab).tokenwise:
            group, probe = [(path, layer, g)], seen
    if not group:
        raise GleakError("no module after the first block's projections has a gradient whose input depends on the "
                         "prefix: DAGER's prefix test has nothing to read")
    return group


def _lora_groups(model: nn.Module, tensors: dict[str, torch.Tensor], stored: dict[str, torch.Tensor] | None,
                 missing_global: str, min_gap: float) -> tuple[ModuleGroup, ModuleGroup, bool]:
    """A LoRA update: the first block's adapted token-wise projections and the same ones a block later."""
    factors = {f.module: f for f in lora_factors(tensors, model)}
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
    group = first_tokenwise(model, [(f.module, f.layer) for f in factors.values()], vocab)
    positional = group is not None and group[0].positional
    first = [factors[p] for p in (group[1] if group else [])]
    if not first:
        raise GleakError("no adapted module of the first block reads token-wise inputs (LoRA on q/k/v_proj or "
                         "c_attn): DAGER cannot test tokens against deeper adapters alone")
    second = [factors.get(next_block(f.module) or "") for f in first]
    if any(s is None for s in second):
        raise GleakError("the adapter has no second-block counterpart of the first block's adapted modules: "
                         "DAGER's prefix test needs both")
    groups = []
    for members in (first, [s for s in second if s is not None]):
        reasons = []
        for test in lora_span(members, stored, min_gap, missing_global):
            if isinstance(test, SpanTest):
                groups.append(ModuleGroup(paths=[f.module for f in members], layer=members[0].layer, test=test))
                break
            reasons.append(test)
        else:
            raise GleakError(reasons[0])
    return groups[0], groups[1], positional


def layer_one_sets(model: nn.Module, group: ModuleGroup, vocab: int, positions: int, min_gap: float,
                   progress: Callable[[str], None] | None = None) -> tuple[list[list[int]], dict[str, Any]]:
    """T_p for each position p (one set for position-free inputs), ordered by residual; the threshold from the gap
    of all residuals, else the span's spectral threshold."""
    dist = candidate_residuals(model, group.layer, vocab, positions, group.test.residual, progress)
    tau, ratio = gap_threshold(dist.flatten())
    source = "gap"
    if ratio < min_gap:
        tau, source = group.test.threshold(), "spectrum"
    sets = []
    for p in range(positions):
        keep = (dist[p] < tau).nonzero().flatten()
        sets.append(keep[torch.argsort(dist[p][keep])].tolist())
    return sets, {"tau1": tau, "tau1_from": source, "gap1": ratio if ratio != float("inf") else None}


def step_threshold(dist: torch.Tensor, cap: float, fallback: float, min_gap: float) -> tuple[float, float]:
    """(τ, gap) for one assembly step: the middle of the largest log-gap among the candidates' residuals below
    ``cap`` (and the first one above it), when that gap is at least ``min_gap``; else ``fallback`` (the first-block
    threshold: the same float32 forward passes, calibrated on the whole vocabulary). True prefixes sit at the
    rounding floor, wrong ones from about 1e-3 up, so the gap is there whenever a true prefix is among them."""
    s = torch.sort(dist[torch.isfinite(dist)].double()).values.clamp_min(1e-300)
    below = int((s < cap).sum())
    if below == 0:
        return min(fallback, cap), 1.0
    window = s[:below + 1] if below < len(s) else torch.cat([s, s.new_tensor([cap])])
    logs = torch.log(window)
    steps = logs[1:] - logs[:-1]
    k = int(torch.argmax(steps))
    gap = float(torch.exp(steps[k]))
    if gap < min_gap:
        return min(fallback, cap), gap
    return float(torch.exp((logs[k] + logs[k + 1]) / 2)), gap


def assemble(model: nn.Module, group: ModuleGroup, sets: list[list[int]], positional: bool, batch_size: int | None,
             fallback: float, min_gap: float, progress: Callable[[str], None] | None = None,
             max_length: int | None = None) -> tuple[list[list[int]], list[float], dict[str, Any]]:
    """Grow prefixes position by position (§3.5); returns the finished sequences, their mean layer-2 residual, and
    diagnostics. Each step's threshold sits in the gap of its candidates' residuals (:func:`step_threshold`), never
    above the span's spectral bound. At most 8·B prefixes are kept per step (a batch has at most B distinct
    prefixes at a position): more means the test does not separate, and the search keeps the closest; when that
    happens at :data:`CUT_STEPS` positions in a row the test separates nothing and the search fails in one line.
    Position-free sets (rotary models) are searched up to ``max_length`` (the capture's padded length) when known."""
    cap = group.test.threshold()
    limit = max(8 * batch_size, 64) if batch_size else MAX_FRONTIER
    frontier: list[tuple[int, ...]] = [()]
    scores: dict[tuple[int, ...], float] = {(): 0.0}
    finished: list[tuple[int, ...]] = []
    cut_at: list[int] = []
    untested: list[int] = []
    taus: list[float] = []
    positions = len(sets) if positional else min(max_length or MAX_POSITIONS, MAX_POSITIONS)
    inputs = PrefixInputs(model, group.layer)
    steps = 0
    for i in range(positions):
        checkpoint(f"layer 2: position {i + 1}/{positions}, {len(frontier)} prefixes")
        options = sets[i] if positional else sets[0]
        if not frontier:
            break
        if not options:
            break
        cands = [(*s, v) for s in frontier for v in options]
        dist = _layer_two(group, inputs, cands)
        tau, _ = step_threshold(dist, cap, fallback, min_gap)
        taus.append(tau)
        passed = {s: float(d) for s, d in zip(cands, dist.tolist(), strict=True) if d < tau}
        if i == 0 and not passed:
            # the first position is not in a query-only span (a query at position 0 attends only to itself, so
            # its gradient there is zero): every first-block candidate stays, and position 1 on decides
            passed = dict.fromkeys(cands, 0.0)
            untested.append(0)
        extended = {s[:-1] for s in passed}
        finished += [s for s in frontier if s and s not in extended]
        ranked = sorted(passed, key=lambda s: passed[s])
        if len(ranked) > limit:
            ranked = ranked[:limit]
            cut_at.append(i)
            if len(cut_at) >= CUT_STEPS and cut_at[-CUT_STEPS:] == list(range(i - CUT_STEPS + 1, i + 1)):
                raise GleakError(f"the second-block test does not separate prefixes: more than {limit} passed at "
                                 f"each of positions {cut_at[-CUT_STEPS]}–{i} (a batch has at most "
                                 f"{batch_size or 'B'}); the span is too noisy for DAGER (a float32 update of "
                                 "several local steps, or added noise)")
        scores.update({s: (scores[s[:-1]] * i + passed[s]) / (i + 1) for s in ranked})
        frontier = ranked
        steps = i + 1
        if progress is not None:
            progress(f"layer 2: position {i + 1}, {len(frontier)} prefixes")
    finished += [s for s in frontier if s]
    if untested:  # a one-token prefix that never extended was never tested at all
        finished = [s for s in finished if len(s) > 1]
    dropped = 0
    if batch_size and len(finished) > batch_size:
        # a batch holds B sequences: the surplus are dead-end branches that passed a step by a narrow margin,
        # which their mean residual shows; DAGER keeps at most B as well (§3.5, step 6)
        best = sorted(range(len(finished)), key=lambda k: scores.get(finished[k], 0.0))[:batch_size]
        dropped = len(finished) - batch_size
        finished = [finished[k] for k in sorted(best)]
    seqs = [list(s) for s in finished]
    return seqs, [scores.get(s, 0.0) for s in finished], {
        "tau2_cap": cap, "tau2_max": max(taus, default=None), "tau2_min": min(taus, default=None),
        "positions_searched": steps, "frontier_cut_at": cut_at, "positions_untested": untested,
        "dead_ends_dropped": dropped, "batch_size": batch_size, **inputs.diagnostics}


def _layer_two(group: ModuleGroup, inputs: PrefixInputs, cands: Sequence[tuple[int, ...]]) -> torch.Tensor:
    """The layer-2 residual of each candidate's input at its last position."""
    x, before = inputs(cands)
    dist = group.test.residual(x)
    if before is not None:
        # a token repeated right after itself at the start of a rotary model's sequence reproduces the vector
        # before it exactly (identical keys and values): the span cannot tell such a chain from one token, so
        # an extension that adds no new vector is not accepted (DAGER rejects the same chains; §3.5)
        same = (x - before).norm(dim=1) <= 1e-6 * x.norm(dim=1)
        dist = torch.where(same, torch.inf, dist)
    return dist.to(torch.float64)


def last_tokens(model: nn.Module, spec: TextModelSpec, head_grad: torch.Tensor, scale: float,
                prefixes: list[list[int]], tied: bool) -> tuple[list[int | None], dict[str, Any]]:
    """The last token of each recovered sequence from the LM head's gradient (module docstring, step 4)."""
    head: Any = model.get_output_embeddings()  # type: ignore[operator]
    if head is None or not prefixes:
        return [None] * len(prefixes), {"last_tokens": "no LM head"}
    hs, ps, known = [], [], []
    with torch.no_grad():
        for s in prefixes:
            ids = torch.tensor([s], dtype=torch.long)
            h = module_inputs(model, head, ids)[0].double()
            logits = head(h.to(head.weight.dtype)).double()
            hs.append(h)
            ps.append(torch.softmax(logits, dim=-1))
            known.append(s[1:])
    m = sum(len(s) for s in prefixes)
    d = int(hs[0].shape[1])
    if m > d:
        return [None] * len(prefixes), {"last_tokens": f"not solved: {m} scored positions exceed the width {d}"}
    h_last = torch.stack([h[-1] for h in hs])  # [n, d]
    pinv = torch.linalg.pinv(h_last)  # [d, n]
    vocab = spec.vocab_size
    score = torch.empty(vocab, len(prefixes), dtype=torch.float64)
    step = max(1, (64 << 20) // (8 * d))
    all_h = torch.cat(hs)  # [M, d]
    all_p = torch.cat(ps)  # [M, V]
    offsets = []
    start = 0
    for s in prefixes:
        offsets.append(start)
        start += len(s)
    targets = torch.tensor([t for s in known for t in s], dtype=torch.long)
    known_index = torch.tensor([offsets[k] + j for k, s in enumerate(prefixes) for j in range(len(s) - 1)],
                               dtype=torch.long)
    for first in range(0, vocab, step):
        checkpoint(f"last tokens: rows {first}/{vocab}")
        rows = slice(first, min(first + step, vocab))
        r = all_p[:, rows].T @ all_h - m * scale * head_grad[rows].double()
        hit = (targets >= first) & (targets < rows.stop)
        if bool(hit.any()):
            r.index_add_(0, targets[hit] - first, -all_h[known_index[hit]])
        score[rows] = r @ pinv
    best = score.argmax(0).tolist()
    confidence = score.max(0).values.tolist()
    top = score.topk(min(CANDIDATES, vocab), dim=0).indices.T.tolist()  # [n, k]: each sequence's runners-up
    return [int(b) for b in best], {"last_tokens": "head solve" + (" (tied: approximate)" if tied else ""),
                                    "last_token_scores": [round(float(c), 4) for c in confidence],
                                    "last_token_candidates": top}


def refine_last_tokens(model: nn.Module, captured: torch.Tensor, prefixes: list[list[int]], picks: list[int],
                       candidates: list[list[int]], confidence: list[float], pad: int, left: bool
                       ) -> tuple[list[int], dict[str, Any]]:
    """Tied embeddings: the head solve shares its rows with the input part of the gradient, so a pick whose
    solved weight is not about 1 is checked by recomputing the batch's gradient of the (tied) embedding for each
    runner-up and keeping the one closest to the capture's (METHODS-text §2.2(d), verification). FedSGD only."""
    emb: Any = model.get_input_embeddings()  # type: ignore[operator]
    weight = emb.weight
    target = captured.double()
    scale = float(target.norm()) or 1.0
    was = weight.requires_grad

    def distance(lasts: list[int]) -> float:
        checkpoint("last tokens: checking a runner-up")
        rows = [[*s, t] for s, t in zip(prefixes, lasts, strict=True)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, r in enumerate(rows):
            cols = slice(width - len(r), width) if left else slice(0, len(r))
            ids[k, cols] = torch.tensor(r)
            mask[k, cols] = 1
        with torch.enable_grad():
            loss = token_loss(model_logits(model(input_ids=ids, attention_mask=mask)), ids, mask, None, "causal_lm")
            (grad,) = torch.autograd.grad(loss, [weight])
        return float((grad.double() - target).norm()) / scale

    weight.requires_grad_(True)
    try:
        picks = list(picks)
        best = distance(picks)
        start = best
        for j, c in enumerate(confidence):
            if abs(c - 1.0) <= UNSURE:
                continue
            for option in candidates[j]:
                if option == picks[j]:
                    continue
                trial = [*picks[:j], option, *picks[j + 1:]]
                d = distance(trial)
                if d < best:
                    best, picks = d, trial
    finally:
        weight.requires_grad_(was)
    return picks, {"last_tokens_checked": True, "last_tokens_distance": (round(start, 6), round(best, 6))}


def rounding_reason(model: nn.Module, tensors: Mapping[str, torch.Tensor], spec: TextModelSpec) -> str | None:
    """Why a float32 update (FedAvg) has no usable span, when that is its rounding: θ_E − θ_0 stored in float32
    carries about ulp(θ)/√12 per entry and step, a noise matrix whose singular values reach σ(√m + √n). When fewer
    of the first linear module's singular values stand 3× above that than the width less the margin, the spectrum
    runs into rounding rather than into a full batch (METHODS-text §3.10: DAGER's FedAvg code runs in float64).
    None when that is not the cause."""
    if spec.kind != "update":
        return None
    params = dict(model.named_parameters())
    for path, layer in model.named_modules():
        name = f"{path}.weight"
        delta, weight = tensors.get(name), params.get(name)
        g = linear_gradient(layer, delta) if delta is not None and delta.dim() == 2 else None
        if g is None or weight is None:
            continue
        if g.dtype != torch.float32:
            return None
        steps = max(1, spec.local_steps or 1)
        ulp = weight.detach().double().abs() * 2.0 ** -23
        sigma = math.sqrt(steps * float(ulp.square().mean()) / 12)
        floor = sigma * (math.sqrt(g.shape[0]) + math.sqrt(g.shape[1]))
        above = int((torch.linalg.svdvals(g.double()) > 3 * floor).sum())
        width = int(g.shape[1])
        if above >= width - margin(width):
            return None
        return (f"this float32 update has no clear rank: its singular values fall to its rounding floor (about "
                f"{sigma:.1g} per entry over {steps} local step(s), from the weights' size) without a clear drop, "
                f"and only {above} of {path}'s {width} directions stand 3× above it (DAGER reads such updates in "
                "float64: METHODS-text §3.10)")
    return None


def lora_scale(config: Mapping[str, Any]) -> float:
    """peft's scaling s of an adapter's update s·B·A: lora_alpha / r, or lora_alpha / √r with rsLoRA."""
    r = float(config.get("r", 8))
    alpha = float(config.get("lora_alpha", 8))
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def merged(model: nn.Module, adapter: Mapping[str, torch.Tensor], scale: float) -> nn.Module:
    """A copy of the base ``model`` with the global adapter's s·B·A added to each adapted weight: the model the
    client started its round from (block 1's outputs, hence the second-block inputs, depend on it)."""
    out = copy.deepcopy(model)
    modules = dict(out.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapter.items():
        m = LORA_NAME.match(name)
        if m is not None:
            pairs.setdefault(m["module"], {})[m["factor"]] = tensor
    with torch.no_grad():
        for path, factors in pairs.items():
            layer = modules.get(path)
            if layer is None or set(factors) != {"lora_A", "lora_B"}:
                raise GleakError(f"the global adapter's {path} does not fit the base model")
            delta = scale * (factors["lora_B"].double() @ factors["lora_A"].double())
            weight: Any = layer.weight
            weight += (delta if isinstance(layer, nn.Linear) else delta.T).to(weight.dtype)
    return out


def run_dager(model: nn.Module, spec: TextModelSpec, tensors: dict[str, torch.Tensor], *, head: torch.Tensor | None,
              head_scale: float, stored_adapter: tuple[Mapping[str, Any], dict[str, torch.Tensor]] | None,
              missing_global: str, min_gap: float, span_gap: float = 10.0, padding_side: str = "right",
              max_combinations: int = MAX_COMBINATIONS, progress: Callable[[str], None] | None = None) -> Sentences:
    """The whole attack on one capture (module docstring). ``stored_adapter``: the global adapter's config and
    tensors (a LoRA update: its A tests a fresh adapter's lora_B, and the second-block inputs are computed with it
    merged into the base model)."""
    start = time.perf_counter()
    lora = is_lora_only(tensors)
    warnings: list[str] = []
    if lora:
        if stored_adapter is not None:
            model = merged(model, stored_adapter[1], lora_scale(stored_adapter[0]))
        else:
            warnings.append("no global adapter beside the capture: the second-block inputs are computed with the "
                            "base model alone, exact only for a fresh adapter (lora_B = 0)")
        g1, g2, positional = _lora_groups(model, tensors, stored_adapter[1] if stored_adapter else None,
                                          missing_global, span_gap)
    else:
        try:
            g1, g2, positional = _weight_groups(model, tensors, span_gap)
        except GleakError as err:
            raise GleakError(rounding_reason(model, tensors, spec) or str(err)) from None
    positions = tested_positions(spec.max_length, spec.n_positions) if positional else 1
    sets, diag1 = layer_one_sets(model, g1, spec.vocab_size, positions, min_gap, progress)
    if not any(sets):
        raise GleakError("no vocabulary token passes the first-block span test: the capture does not match this "
                         "model, or its noise hides the span")
    if is_bidirectional(model, g2.layer, spec.vocab_size):
        if not positional:
            # one set for every position: the search would test orders that only the attention tells apart, and a
            # random-weight ModernBERT passed a permuted sequence at 2e-5 (METHODS-text §3.8 covers BERT)
            raise GleakError("DAGER's encoder search needs learned positions (BERT, RoBERTa: the paper's setting); "
                             "this encoder's first-block inputs do not depend on the position (rotary), so the "
                             "order of each sequence cannot be read from them")
        seqs, exact, diag2 = search(model, g2.layer, g2.test, sets, spec.batch_size,
                                    # never above the first block's threshold: the same float32 passes
                                    cut=lambda d: step_threshold(d, min(g2.test.threshold(), diag1["tau1"]), 0.0,
                                                                 span_gap),
                                    max_combinations=max_combinations, progress=progress)
    else:
        seqs, scores, diag2 = assemble(model, g2, sets, positional, spec.batch_size, fallback=diag1["tau1"],
                                       min_gap=min_gap, progress=progress, max_length=spec.max_length)
        exact = [sc < g2.test.threshold() and not diag2["frontier_cut_at"] for sc in scores]
    if not seqs:
        last_block = next_block(g2.paths[0]) not in dict(model.named_modules())
        raise GleakError("no prefix passed the second-block span test: the capture's second block does not hold "
                         "this model's prefixes (another model, noise, or a LoRA update read without its global "
                         "adapter)" + ("; here the second block is a classifier's last, whose gradient sees the "
                                       "other positions only through the pooled one: DAGER needs a deeper model"
                                       if last_block and spec.task == "sequence_classification" else ""))
    last: list[int | None] = [None] * len(seqs)
    diag3: dict[str, Any] = {}
    if spec.task == "causal_lm" and head is not None:
        last, diag3 = last_tokens(model, spec, head, head_scale, seqs, tied=spec.tie_word_embeddings)
        if spec.tie_word_embeddings and spec.kind == "gradient" and "last_token_candidates" in diag3:
            picks, checked = refine_last_tokens(
                model, head, seqs, [int(t) for t in last if t is not None], diag3.pop("last_token_candidates"),
                diag3["last_token_scores"], spec.pad_token_id or 0, padding_side == "left")
            last = list(picks)
            diag3.update(checked)
        diag3.pop("last_token_candidates", None)
    out = [s + ([t] if t is not None else []) for s, t in zip(seqs, last, strict=True)]
    return Sentences(sequences=out, exact=exact, last_from_head=[t is not None for t in last], warnings=warnings,
                     diagnostics={"layer1": g1.paths, "layer2": g2.paths, "span1": g1.test.diagnostics,
                                  "span2": g2.test.diagnostics, "positional": positional, "lora": lora,
                                  "set_sizes": [len(s) for s in sets], **diag1, **diag2, **diag3,
                                  "seconds": round(time.perf_counter() - start, 3)})
