"""TAG / LAMP-style gradient matching for sentences: the optimisation baseline beside DAGER (METHODS-text §4;
notes in docs/methods/text-tag.md).

TAG (Deng et al., EMNLP Findings 2021) and LAMP (Balunović et al., NeurIPS 2022) look for inputs whose gradient
matches the client's. Here, without a pretrained prior (§4.3):

1. **Unknowns.** Continuous input embeddings X̂ [B, T, d], fed to the model through ``inputs_embeds`` (GPT-2 adds
   its learned positions itself). B is the capture's batch size. Every sequence is as long as the longest, read
   exactly from the position-table gradient when the model has one (§2.4,
   :func:`gleak.attacks.tokens.bag.position_lengths`; ``lengths=histogram`` takes its heuristic histogram instead),
   else the recorded padded length. Right padding, as the client's forward.
2. **Loss of the dummy.** The client's next-token cross-entropy (mean over scored positions, §1.1) needs the next
   tokens, which are the unknowns themselves. Relaxation: the target at position t + 1 is the soft distribution
   q_{t+1} = softmax(cos(x̂_{t+1}, E_c) / temperature) over the candidate tokens c, and the loss at t is
   −Σ_c q_{t+1,c} log p_{t,c}. It is differentiable in X̂, equals the client's loss when the dummy sits on true
   embeddings and the targets are sharp, and is the only path by which the last position (read by no other
   position) is learned: through the LM head's gradient.
3. **Distance** over every captured parameter that has a gradient on the dummy side (all but the input embedding,
   which the dummy bypasses): TAG's Σ‖ĝ − g‖² + α Σ‖ĝ − g‖₁ (``l1l2``) or LAMP's mean of 1 − cos (``cos``).
4. **Optimiser.** Adam at a fixed learning rate (TAG's baseline: no decay, no swaps, no prior), on X̂ measured in
   units of the embedding table's standard deviation; seeded Gaussian start; the iterate with the lowest distance
   is kept; ``restarts`` independent starts, the best kept.
5. **Projection.** Each position goes to the candidate token of highest cosine similarity. The candidates are the
   recovered bag (``token-bag`` plus ``next-tokens``: inputs and targets, so the last token can be found) when
   ``bag_restricted``, else the whole vocabulary.

Never exact: the output marks every sequence ``exact = False``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gleak.attacks.base import NO_INPUTS, RunInputs, TextOutput, run_attack
from gleak.attacks.context import Context
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import get_attack, register
from gleak.attacks.requirements import Requirements
from gleak.attacks.text.base import SentenceAttack
from gleak.attacks.tokens.bag import position_lengths
from gleak.attacks.tokens.view import LORA_MARKERS, TextModelSpec, is_lora_only, token_view
from gleak.capture import model_logits
from gleak.errors import GleakError
from gleak.timebox import Forecast, checkpoint

TEXT = Requirements(needs_text=True, gradient_view=False, needs_batch_size=True)
TAG = ("Deng et al., TAG: Gradient Attack on Transformer-based Language Models, EMNLP Findings 2021; "
       "Balunović et al., LAMP: Extracting Text from Gradients with Language Model Priors, NeurIPS 2022")
REPORT_EVERY = 10  # steps between progress calls


class TagOptions(AttackOptions):
    iterations: int = Field(500, ge=1, le=100_000, description="Adam steps per start; each is one forward and a "
                            "double backward through the model (the papers use 2000-2500)")
    lr: float = Field(0.1, gt=0, description="Adam learning rate, in units of the embedding table's standard "
                      "deviation (TAG's baseline: 0.1, no decay)")
    restarts: int = Field(1, ge=1, le=100, description="independent seeded starts, each with the full budget; the "
                          "one with the lowest gradient distance is kept")
    tag_factor: float = Field(0.01, ge=0, description="α, the weight of the L1 term of the l1l2 distance (TAG's "
                              "scripts: 0.01; 0 is DLG's L2)")
    distance: Literal["l1l2", "cos"] = Field("l1l2", description="l1l2: TAG's Σ‖ĝ−g‖² + α·Σ‖ĝ−g‖₁; cos: LAMP's mean "
                                             "of 1 − cos(ĝ, g) over tensors")
    bag_restricted: bool = Field(True, description="project (and form the soft next-token targets) among the "
                                 "recovered bag of tokens (token-bag and next-tokens) instead of the whole "
                                 "vocabulary")
    lengths: Literal["max", "histogram"] = Field("max", description="max: every sequence as long as the longest "
                                                 "(read from the position-table gradient, else the recorded padded "
                                                 "length); histogram: the position gradient's heuristic length "
                                                 "histogram (§2.4; it undercounts long sequences on causal models)")
    temperature: float = Field(0.1, gt=0, description="soft next-token targets of the dummy: softmax of the "
                               "cosine similarity to the candidate embeddings divided by this")


@dataclass(kw_only=True)
class Problem:
    """What the optimisation needs, found once: the matched parameters and the client's gradient for each (as a
    gradient: updates rescaled), the lengths, the candidate tokens and their embeddings."""

    names: list[str]
    params: list[nn.Parameter]
    targets: list[torch.Tensor]
    lengths: list[int]
    candidates: torch.Tensor  # [C] token ids
    embeddings: torch.Tensor  # [C, d] their input embeddings (detached)
    scale: float  # the embedding table's standard deviation: X̂ = scale · Z
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Matched:
    """The result of the optimisation: token ids per sequence and what the report says about the run."""

    sequences: list[list[int]]
    diagnostics: dict[str, Any]
    warnings: list[str]


def gradient_scale(spec: TextModelSpec) -> tuple[float, str | None]:
    """The factor that turns the stored tensors into a gradient: 1 (gradient), −1/(η·steps) (update with η
    recorded), −1 (update without η: the l1l2 scale is then wrong; said in the note)."""
    if spec.kind != "update":
        return 1.0, None
    if spec.learning_rate:
        steps = spec.learning_rate * spec.local_steps
        note = f"update matched as the pseudo-gradient −Δ/(η·steps) = −Δ/{steps:g}"
        if spec.local_steps > 1:
            note += f" ({spec.local_steps} local steps at moving weights: matched as one gradient, approximately)"
        return -1.0 / steps, note
    return -1.0, ("update matched as its direction −Δ (no learning rate recorded): the l1l2 distance compares "
                  "magnitudes, so prefer distance=cos")


def matched_parameters(model: nn.Module, tensors: dict[str, torch.Tensor], scale: float
                       ) -> tuple[list[str], list[nn.Parameter], list[torch.Tensor]]:
    """The model's parameters that the capture holds (same name, same shape), without the input embedding (the
    dummy enters through ``inputs_embeds``, so that table gets no input part on the dummy side; tied to the head,
    its head part alone would not match the client's sum either)."""
    embedding: Any = model.get_input_embeddings()  # type: ignore[operator]
    skip = embedding.weight if embedding is not None else None
    names, params, grads = [], [], []
    for name, p in model.named_parameters():
        g = tensors.get(name)
        if g is None or p is skip or any(m in name for m in LORA_MARKERS) or tuple(g.shape) != tuple(p.shape):
            continue
        names.append(name)
        params.append(p)
        grads.append((g.detach().to(p.device, torch.float32) * scale).to(p.dtype))
    return names, params, grads


def estimate_lengths(ctx: Context, spec: TextModelSpec, batch: int, histogram: bool
                     ) -> tuple[list[int], str, list[str]]:
    """Per-sequence lengths (longest first). With a learned position table's gradient in the capture: its exact
    maximum for every sequence, or (``histogram``) its heuristic length histogram (§2.4). Without one: the recorded
    padded length for every sequence."""
    warnings: list[str] = []
    view = None
    with contextlib.suppress(GleakError):
        view = token_view(ctx.capture.tensors, spec)
    if view is not None and view.positions is not None:
        found = position_lengths(view.positions, view.position_offset, spec.task == "causal_lm", batch)
        if found.max_length is not None:
            top = found.max_length
            if not histogram:
                return [top] * batch, "position gradient (maximum)", found.warnings
            lengths: list[int] = []
            for length, n in sorted((found.histogram or {}).items(), reverse=True):
                lengths += [min(length, top)] * n
            lengths = (lengths + [top] * batch)[:batch]
            return sorted(lengths, reverse=True), "position gradient (histogram)", found.warnings
    if spec.max_length:
        warnings.append(f"no learned position table: every sequence is taken to have the recorded padded length "
                        f"{spec.max_length}")
        return [spec.max_length] * batch, "recorded max length", warnings
    raise GleakError("needs the sequence lengths: the model has no learned position table and the capture records "
                     "no padded length (gleak.max_length)")


def candidate_tokens(ctx: Context, restricted: bool) -> tuple[torch.Tensor, str, list[str]]:
    """The token ids the dummy is projected to: the union of the token-bag and next-tokens attacks' ids on the
    same context (inputs and targets) when ``restricted`` and the bag is found, else the whole vocabulary."""
    assert ctx.text_model is not None
    vocab = ctx.text_model.vocab_size
    everything = torch.arange(vocab)
    if not restricted:
        return everything, "vocabulary", []
    ids: set[int] = set()
    reasons = []
    for name in ("token-bag", "next-tokens"):
        result = run_attack(get_attack(name, "tokens"), ctx)
        if result.status == "ok" and result.output is not None and hasattr(result.output, "token_ids"):
            ids.update(int(t) for t in result.output.token_ids.tolist())
        elif name == "token-bag":
            reasons.append(f"{name}: {result.reason}")
    if not ids:
        why = reasons[0] if reasons else "the bag is empty"
        return everything, "vocabulary", [f"bag of tokens not recovered ({why}): projected to the whole vocabulary"]
    return torch.tensor(sorted(ids), dtype=torch.long), "bag", []


def soft_loss(model: nn.Module, x: torch.Tensor, mask: torch.Tensor, embeddings: torch.Tensor,
              candidates: torch.Tensor, temperature: float) -> torch.Tensor:
    """The next-token loss of the dummy with soft targets (module docstring, step 2): mean over the scored
    positions (t and t + 1 real) of −Σ_c q_{t+1,c} log p_{t,c}."""
    logits = model_logits(model(inputs_embeds=x, attention_mask=mask)).float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)[..., candidates.to(logits.device)]  # [B, T-1, C]
    sim = nn.functional.normalize(x[:, 1:].float(), dim=-1) @ nn.functional.normalize(embeddings.float(), dim=-1).T
    q = torch.softmax(sim / temperature, dim=-1)
    scored = (mask[:, :-1] * mask[:, 1:]).to(logp.dtype)
    per = -(q * logp).sum(-1)
    return (per * scored).sum() / scored.sum().clamp_min(1)


def hard_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The client's loss on token ids (right padding): next-token cross-entropy over non-pad targets."""
    logits = model_logits(model(input_ids=ids, attention_mask=mask)).float()
    targets = ids[:, 1:].masked_fill((mask[:, :-1] * mask[:, 1:]) == 0, -100)
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                       ignore_index=-100)


def grad_distance(dummy: list[torch.Tensor], target: list[torch.Tensor], kind: str, alpha: float) -> torch.Tensor:
    """TAG's l1l2 (Σ‖ĝ − g‖² + α·Σ‖ĝ − g‖₁) or LAMP's cos (mean over tensors of 1 − cos(ĝ, g)); float32."""
    if kind == "cos":
        terms = [1 - nn.functional.cosine_similarity(a.flatten().float(), b.flatten().float(), dim=0, eps=1e-30)
                 for a, b in zip(dummy, target, strict=True)]
        return torch.stack(terms).mean()
    diffs = [(a.float() - b.float()) for a, b in zip(dummy, target, strict=True)]
    l2 = torch.stack([d.square().sum() for d in diffs]).sum()
    if alpha == 0:
        return l2
    return l2 + alpha * torch.stack([d.abs().sum() for d in diffs]).sum()


@contextlib.contextmanager
def grads_on(params: list[nn.Parameter]) -> Iterator[None]:
    """Parameters that require a gradient for the duration (restored afterwards); the model's ``.grad`` fields are
    never written (everything goes through :func:`torch.autograd.grad`)."""
    before = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, flag in zip(params, before, strict=True):
            p.requires_grad_(flag)


def project(x: torch.Tensor, embeddings: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """The candidate id of highest cosine similarity at every position: [B, T]."""
    sim = nn.functional.normalize(x.float(), dim=-1) @ nn.functional.normalize(embeddings.float(), dim=-1).T
    return candidates.to(x.device)[sim.argmax(-1)]


def prepare(ctx: Context, options: TagOptions) -> Problem:
    """Everything :func:`optimise` needs (the client's gradient, lengths, candidates), or a one-line GleakError."""
    spec, model = ctx.text_model, ctx.model
    if spec is None or model is None:  # pragma: no cover - not_applicable guards both
        raise GleakError("needs a language model's capture and its model")
    batch = ctx.require_batch_size()
    scale, note = gradient_scale(spec)
    names, params, targets = matched_parameters(model, dict(ctx.capture.tensors), scale)
    if not names:
        raise GleakError("no captured tensor matches a model parameter other than the input embedding: nothing "
                         "to match the dummy's gradient against")
    lengths, lengths_from, warnings = estimate_lengths(ctx, spec, batch, options.lengths == "histogram")
    if spec.n_positions:
        lengths = [min(n, spec.n_positions) for n in lengths]
    if min(lengths) < 2:
        warnings.append("a sequence shorter than two tokens is scored by nobody: its tokens are guesses")
    candidates, candidates_from, more = candidate_tokens(ctx, options.bag_restricted)
    embedding: Any = model.get_input_embeddings()  # type: ignore[operator]
    table = embedding.weight.detach()
    device = next(model.parameters()).device
    cand_emb = table[candidates.to(table.device)].to(device)
    std = float(table.float().std())
    return Problem(names=names, params=params, targets=targets, lengths=lengths, candidates=candidates.to(device),
                   embeddings=cand_emb, scale=std if std > 0 else 1.0,
                   diagnostics={"lengths": lengths, "lengths_from": lengths_from, "candidates": len(candidates),
                                "candidates_from": candidates_from, "matched_tensors": len(names)},
                   warnings=[*([note] if note else []), *warnings, *more])


def optimise(model: nn.Module, problem: Problem, options: TagOptions, gen: torch.Generator,
             progress: Callable[[int, int, int, float], None] | None = None) -> Matched:
    """Adam on the dummy embeddings (module docstring, step 4), ``options.restarts`` times; the best iterate of the
    best start is projected (step 5)."""
    start = time.perf_counter()
    p = problem
    device = p.embeddings.device
    dtype = next(model.parameters()).dtype
    batch, width = len(p.lengths), max(p.lengths)
    d = int(p.embeddings.shape[1])
    mask = torch.zeros(batch, width, dtype=torch.long, device=device)
    for i, n in enumerate(p.lengths):
        mask[i, :n] = 1
    keep = mask.unsqueeze(-1).float()

    def distance(z: torch.Tensor, graph: bool) -> torch.Tensor:
        x = (z * p.scale * keep).to(dtype)
        loss = soft_loss(model, x, mask, p.embeddings, p.candidates, options.temperature)
        grads = torch.autograd.grad(loss, p.params, create_graph=graph, allow_unused=True)
        dummy = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, p.targets, strict=True)]
        return grad_distance(dummy, p.targets, options.distance, options.tag_factor)

    best_z: torch.Tensor | None = None
    best = math.inf
    starts: list[float] = []
    first = math.inf
    forecast = Forecast(options.restarts * options.iterations)  # stops at once when the steps cannot fit its share
    with grads_on(p.params):
        for restart in range(options.restarts):
            z = torch.randn(batch, width, d, generator=gen).to(device).requires_grad_(True)  # float32 always
            opt = torch.optim.Adam([z], lr=options.lr)
            run_best, run_z = math.inf, z.detach().clone()
            for step in range(options.iterations + 1):
                checkpoint(f"restart {restart + 1}/{options.restarts}, step {step}/{options.iterations}")
                opt.zero_grad(set_to_none=True)
                dist = distance(z, graph=step < options.iterations)
                value = float(dist.detach())
                if restart == 0 and step == 0:
                    first = value
                if value < run_best and math.isfinite(value):
                    run_best, run_z = value, z.detach().clone()
                if step == options.iterations:
                    break  # the last iterate's distance is measured, not stepped from
                (g,) = torch.autograd.grad(dist, [z])
                z.grad = g
                opt.step()
                forecast.check(restart * options.iterations + step + 1)
                if progress is not None and step % REPORT_EVERY == 0:
                    progress(restart, step, options.iterations, value)
            starts.append(run_best)
            if run_best < best or best_z is None:
                best, best_z = run_best, run_z
        assert best_z is not None
        ids = project(best_z * p.scale * keep, p.embeddings, p.candidates).masked_fill(mask == 0, 0)
        loss = hard_loss(model, ids, mask)
        grads = torch.autograd.grad(loss, p.params, allow_unused=True)
        dummy = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, p.targets, strict=True)]
        projected = float(grad_distance(dummy, p.targets, options.distance, options.tag_factor))
    sequences = [ids[i, :n].tolist() for i, n in enumerate(p.lengths)]
    return Matched(sequences=sequences,
                   diagnostics={"iterations": options.iterations, "restarts": options.restarts,
                                "distance": options.distance, "initial_distance": first, "final_distance": best,
                                "restart_distances": starts, "projected_distance": projected,
                                "seconds": round(time.perf_counter() - start, 3)},
                   warnings=[])


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The global generator forked and seeded for the duration: any randomness inside the model (dropout in a
    train-mode model) repeats with the seed, and the caller's generator state is left as it was. Scaled dot-product
    attention runs on its plain (math) kernel, the one with a second derivative (the fused CPU and flash kernels
    have none)."""
    with torch.random.fork_rng(devices=[]), sdpa_kernel([SDPBackend.MATH]):
        torch.manual_seed(seed)
        yield


@register
class Tag(SentenceAttack):
    """TAG / LAMP-style gradient matching (Deng et al., EMNLP Findings 2021; Balunović et al., NeurIPS 2022) without
    a language prior: continuous dummy embeddings fed through ``inputs_embeds``, their next-token loss with soft
    targets, the dummy gradient matched to the client's (l1l2 or cos) by Adam, then projected to the nearest token
    of the recovered bag (METHODS-text §4.3). The optimisation baseline beside DAGER: it never claims exactness, and
    its report gives the iterations, the final gradient distance and the seconds spent."""

    requires = TEXT
    name = "tag"
    paper = TAG
    summary = "optimisation baseline: continuous embeddings matched to the gradient, projected to the bag"
    default = False  # minutes per batch on real models: only on request (-a tag)
    Options = TagOptions
    options: TagOptions

    not_causal = ("matches the next-token loss only; a sequence classifier's gradient would need its labels (not "
                  "implemented)")

    def sentence_problem(self, ctx: Context) -> str | None:
        if is_lora_only(ctx.capture.tensors):
            return ("the capture holds only LoRA adapter tensors and the model here has no adapter to differentiate: "
                    "gradient matching through adapters is not implemented (dager reads them)")
        return None

    def memory_bytes(self, ctx: Context) -> int:
        """Float32: about six copies of the parameters (the matched gradients, the dummy's gradients and their
        graph), the [B, T, V] logits a few times over, and the activations of a double backward."""
        spec, model = ctx.text_model, ctx.model
        if spec is None or model is None:
            return 0
        n = sum(p.numel() for p in model.parameters())
        tokens = (ctx.batch_size or 1) * (spec.max_length or spec.n_positions or 64)
        return 4 * (6 * n + 8 * tokens * spec.vocab_size + 256 * tokens * spec.hidden_size) + (64 << 20)

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> TextOutput:
        model = ctx.model
        if model is None:  # pragma: no cover - not_applicable guards it
            raise GleakError("needs the model")
        problem = prepare(ctx, self.options)
        with seeded(ctx.seed):
            found = optimise(model, problem, self.options, self.rng(ctx), inputs.progress)
        method = "tag" if self.options.distance == "l1l2" else "lamp-cos"
        return TextOutput(sequences=found.sequences, exact=[False] * len(found.sequences),
                          diagnostics={"method": method, **problem.diagnostics, **found.diagnostics},
                          warnings=[*problem.warnings, *found.warnings])
