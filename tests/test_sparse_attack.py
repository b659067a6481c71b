"""sparse-tokens (issue 45): the bag of input tokens from a LoRA adapter's lora_A gradient or update beyond the span
test's rank, on tiny LLaMA- and GPT-2-style models with real gradients, against the batch's true input tokens; and
the one-line reasons where nothing can be read (a fresh adapter's FedSGD gradient, a batch past (d + rank)/2, an
update at the weights' rounding floor)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from gleak.attacks.base import AttackResult
from gleak.attacks.tokens import atoms
from gleak.metrics.tokens import truth_bags

from .test_lora_tokens import VOCAB, attack, lora_gradient, lora_update, scores
from .token_models import adapt, gpt2, llama, token_batch


def sparse(base: torch.nn.Module, tensors: dict[str, torch.Tensor], ids: torch.Tensor, path: Path | None = None,
           kind: str = "gradient") -> AttackResult:
    return attack(base, tensors, ids, path=path, kind=kind, name="sparse-tokens")


def test_a_trained_adapter_beyond_its_rank_gives_every_input_token() -> None:
    base = llama(d=128, vocab=VOCAB)
    ids, mask = token_batch(8, VOCAB, (8, 12), seed=1)  # 70 distinct input tokens; q, k, v at r = 8: rank 24
    grads = lora_gradient(adapt(base, r=8, trained=True), ids, mask)
    assert attack(base, grads, ids).status == "failed"  # the span test: rank 8 of at most 8
    result = sparse(base, grads, ids)
    s = scores(result, ids, mask)
    assert s["recall"] == 1.0 and s["precision"] == 1.0, s
    out = result.output
    assert out is not None and out.confidence is not None and out.scores is not None
    assert out.diagnostics["trusted"] and out.diagnostics["inputs"] == len(truth_bags(ids, mask)["inputs"])
    assert out.diagnostics["inputs"] < out.diagnostics["identifiable_below"] and out.diagnostics["rank"] == 24
    assert float(out.confidence.min()) > 0.99 and not out.warnings
    # every recovered token scores above every other token of the vocabulary
    found = out.token_ids
    others = torch.ones(VOCAB, dtype=torch.bool)
    others[found] = False
    assert float(out.scores[found].min()) > float(out.scores[others].max())


def test_learned_positions_are_atoms_of_their_own_on_gpt2() -> None:
    base = gpt2(d=64, vocab=VOCAB)
    ids, mask = token_batch(3, VOCAB, (6, 8), seed=2)
    grads = lora_gradient(adapt(base, r=4, trained=True), ids, mask)
    result = sparse(base, grads, ids)
    s = scores(result, ids, mask)
    assert s["recall"] == 1.0 and s["precision"] == 1.0, s
    assert result.output is not None and result.output.diagnostics["positions"] == ids.shape[1]
    # the tokens, not their positions: LN(E[v] + P[t]) points along a_v + b_t, so (v, t) and (v', t') are explained as
    # well by (v, t') and (v', t) with the same two tokens (docs/methods/sparse.md)
    assert result.output.diagnostics["inputs"] >= len(truth_bags(ids, mask)["inputs"])


def test_gpt2s_structured_dictionary_is_the_models_own_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """LN(E[v] + P[t]) with β's direction removed points along a_v + b_t: the structured atoms equal the inputs the
    model computes (projected the same way), and the attack gives the same bag through either."""
    from gleak.attacks.tokens.inputs import module_inputs

    base = gpt2(d=64, vocab=VOCAB)
    layer = base.transformer.h[0].attn.c_attn
    dictionary = atoms.first_block_dictionary(base, layer, VOCAB, 8, 64)
    assert isinstance(dictionary, atoms.PositionalDictionary)
    ids, where = torch.tensor([[3], [77], [499]]), torch.tensor([[0], [5], [7]])
    seen = dictionary.prepare(module_inputs(base, layer, ids, where)[:, 0].double().T).T
    want = seen / seen.norm(dim=1, keepdim=True)
    got = torch.stack([dictionary.atom(int(p) * VOCAB + int(v)) for v, p in zip(ids[:, 0], where[:, 0], strict=True)])
    assert torch.allclose(got, want, atol=1e-6)
    # inner products through the structure equal the atoms' own
    m = torch.randn(64, 3, dtype=torch.float64)
    first, inner = next(iter(dictionary.products(m)))
    assert first == 0 and torch.allclose(inner[:50], dictionary.chunk(0, 50) @ m, atol=1e-9)
    batch, mask = token_batch(3, VOCAB, (6, 8), seed=2)
    grads = lora_gradient(adapt(base, r=4, trained=True), batch, mask)
    structured = sparse(base, grads, batch)
    monkeypatch.setattr(atoms, "_positional", lambda *_: None)
    computed = sparse(base, grads, batch)
    assert structured.output is not None and computed.output is not None
    assert set(structured.output.bag()) == set(computed.output.bag()) == set(truth_bags(batch, mask)["inputs"])


def test_a_fedavg_update_reads_the_union_of_its_steps() -> None:
    base = llama(d=128, vocab=VOCAB)
    ids, mask = token_batch(6, VOCAB, (8, 12), seed=3)
    update = lora_update(adapt(base, r=4, trained=True), ids, mask, steps=3, lr=0.05)
    s = scores(sparse(base, update, ids, kind="update"), ids, mask)
    assert s["recall"] == 1.0 and s["precision"] == 1.0, s


def test_a_streamed_dictionary_gives_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(3, VOCAB, (6, 9), seed=4)
    grads = lora_gradient(adapt(base, r=4, trained=True), ids, mask)
    held = sparse(base, grads, ids)
    monkeypatch.setattr(atoms, "CACHE_BYTES", 0)
    monkeypatch.setattr(atoms, "CHUNK_ATOMS", 64)
    streamed = sparse(base, grads, ids)
    assert held.output is not None and streamed.output is not None
    assert held.output.bag() == streamed.output.bag() and len(held.output.bag()) > 12


def test_a_fresh_adapters_fedsgd_gradient_is_left_to_the_span_test() -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (6, 8), seed=5)
    result = sparse(base, lora_gradient(adapt(base, r=4, trained=False), ids, mask), ids)
    assert result.status == "not_applicable" and "lora_A's is zero" in (result.reason or "")
    assert "\n" not in (result.reason or "")


def test_past_the_identifiable_size_it_says_so_instead_of_guessing() -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(6, VOCAB, (10, 14), seed=6)  # ~60 distinct tokens; (d + rank)/2 = 38
    result = sparse(base, lora_gradient(adapt(base, r=4, trained=True), ids, mask), ids)
    reason = result.reason or ""
    assert result.status == "failed" and "no cliff" in reason and "(d + rank)/2 = 38" in reason, reason


def test_an_update_at_the_rounding_floor_of_the_global_adapter_is_named(tmp_path: Path) -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (6, 8), seed=7)
    model = adapt(base, r=4, trained=False)
    update = lora_update(model, ids, mask, steps=2, lr=1e-4)
    model.save_pretrained(str(tmp_path / "c.adapter"))  # the global adapter is what the client started from
    state = {n.replace(".default", ""): p.detach() for n, p in model.named_parameters() if "lora_" in n}
    for name, p in state.items():  # the update as a client writes it: θ_local − θ_global, rounded in float32
        update[name] = (p.float() + update[name]).float() - p.float()
    result = sparse(base, update, ids, path=tmp_path / "c.safetensors", kind="update")
    assert result.status == "failed" and "rounding floor" in (result.reason or ""), result.reason


def test_full_fine_tuning_of_gpt2_past_the_pair_count_gives_the_tokens() -> None:
    """GPT-2's first block reads LN(E[v] + P[t]): the span tests count every (token, position) pair against d, the
    split dictionary only the distinct tokens plus the positions. 8 sequences of 14–16 tokens over a vocabulary of
    40: about 115 pairs at d = 64 (beyond the span tests), at most 37 tokens + 15 positions (within it)."""
    from .token_models import gradient, spec_of, text_context

    base = gpt2(d=64, vocab=40)
    ids, mask = token_batch(8, 40, (14, 16), seed=9)
    pairs = {(t, p) for row, m in zip(ids.tolist(), mask.tolist(), strict=True) for p, t in enumerate(row[:sum(m) - 1])}
    assert len(pairs) > 64
    ctx = text_context(gradient(base, ids, mask), spec_of(base, batch_size=8, max_length=int(ids.shape[1])))
    ctx.model = base
    from .token_models import run_token_attack

    result = run_token_attack("sparse-tokens", ctx)
    assert result.status == "ok", result.reason
    assert result.output is not None and result.output.diagnostics["atoms"] == "tokens and positions apart"
    assert set(result.output.bag()) == set(truth_bags(ids, mask)["inputs"])
    assert result.output.diagnostics["positions_found"] == int(mask.sum(1).max()) - 1
    # every position before the longest sequence's last token is an input: known atoms, projected out first
    assert result.output.diagnostics["known_positions"] == ids.shape[1] - 1


def test_full_fine_tuning_of_a_rotary_model_is_left_to_the_span_tests() -> None:
    from .token_models import gradient, run_token_attack, spec_of, text_context

    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (6, 8), seed=8)
    ctx = text_context(gradient(base, ids, mask), spec_of(base, batch_size=2, max_length=int(ids.shape[1])))
    ctx.model = base
    result = run_token_attack("sparse-tokens", ctx)
    assert result.status == "not_applicable" and "rotary positions" in (result.reason or ""), result.reason


def test_a_recorded_length_past_the_models_positions_is_not_trusted_to_index_them() -> None:
    """Metadata is untrusted: a capture claiming sequences longer than GPT-2's position table (64 here) is read at
    the table's positions, not failed with an IndexError."""
    from .token_models import run_token_attack, spec_of, text_context

    base = gpt2(d=64, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (6, 8), seed=2)
    grads = lora_gradient(adapt(base, r=4, trained=True), ids, mask)
    results = {}
    for name in ("sparse-tokens", "lora-tokens"):
        ctx = text_context(grads, spec_of(base, batch_size=2, max_length=100))
        ctx.model = base
        results[name] = run_token_attack(name, ctx)
    sparse_result, span = results["sparse-tokens"], results["lora-tokens"]
    assert sparse_result.status == "ok" and sparse_result.output is not None, sparse_result.reason
    assert set(sparse_result.output.bag()) == set(truth_bags(ids, mask)["inputs"])
    assert span.status == "failed" and "rank 4 of at most 4" in (span.reason or ""), span.reason
