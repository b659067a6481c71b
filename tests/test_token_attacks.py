"""Token recovery (issue 37): the bag of input tokens, next-token counts and lengths on tiny HF models built here.

Quality bars of issue 37 at small width (d = 128, V = 1000, B = 8, lengths 4–8 so that the M scored positions
stay below d, which the tied separation needs: METHODS-text §2.2(a); d = 192 for tied FedAvg, whose head part
spans the union of the 3 steps' spans; a tiny GPT-2 trained in the test on the synthetic notes for a model that
knows the domain). docs/methods/tokens.md lists what was measured."""

from __future__ import annotations

import pytest
import torch

from gleak.attacks.base import TokenOutput
from gleak.attacks.tokens.bag import (
    head_targets,
    log_gap_cut,
    rank_grid,
    residual_ratios,
    residual_sweep,
    row_stats,
    tied_bag,
    untied_bag,
)
from gleak.attacks.tokens.view import LORA_REASON, TextModelSpec, token_view
from gleak.errors import GleakError
from gleak.metrics.tokens import bag_scores, truth_bags
from tests.conftest import SAMPLES
from tests.token_models import (
    fedavg_update,
    gpt2,
    gradient,
    llama,
    lm_loss,
    run_token_attack,
    spec_of,
    text_context,
    token_batch,
)

V, D, B = 1000, 128, 8
D_AVG = 192  # tied FedAvg: the union of 3 steps' head spans and the inputs fit in the width


def _bag(result_output: object) -> dict[int, int]:
    assert isinstance(result_output, TokenOutput)
    return result_output.bag()


# ------------------------------------------------------------------------------------------ the view (no HF)
def test_view_finds_tensors_by_name_and_shape() -> None:
    spec = TextModelSpec(model_type="gpt2", vocab_size=50, hidden_size=8, tie_word_embeddings=True, n_positions=16)
    tensors = {"transformer.wte.weight": torch.zeros(50, 8), "transformer.wpe.weight": torch.zeros(16, 8),
               "transformer.h.0.attn.c_attn.weight": torch.zeros(8, 24)}
    view = token_view(tensors, spec)
    assert (view.embedding_name, view.head_name, view.position_name) == ("transformer.wte.weight", None,
                                                                         "transformer.wpe.weight")
    untied = TextModelSpec(model_type="llama", vocab_size=50, hidden_size=8, tie_word_embeddings=False,
                           kind="update", learning_rate=0.5, local_steps=2)
    view = token_view({"model.embed_tokens.weight": torch.zeros(50, 8), "lm_head.weight": torch.zeros(50, 8)}, untied)
    assert view.head_name == "lm_head.weight" and view.positions is None and view.scale == -1.0
    with pytest.raises(GleakError, match=r"no token-embedding matrix of shape \[50, 8\].*found "):
        token_view({"model.embed_tokens.weight": torch.zeros(49, 8)}, untied)
    lora = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 8),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(8, 2)}
    with pytest.raises(GleakError) as info:
        token_view(lora, untied)
    assert str(info.value) == LORA_REASON and "\n" not in LORA_REASON


def test_lora_and_image_captures_are_not_applicable() -> None:
    spec = TextModelSpec(model_type="llama", vocab_size=50, hidden_size=8, tie_word_embeddings=False, kind="update")
    lora = {"model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 8),
            "model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(8, 2)}
    for name in ("token-bag", "next-tokens", "seq-length"):
        r = run_token_attack(name, text_context(lora, spec))
        assert r.status == "not_applicable" and r.reason == LORA_REASON
    image = text_context({"fc.weight": torch.ones(10, 4)}, spec)
    image.text_model = None  # an image capture: no text model
    r = run_token_attack("token-bag", image)
    assert r.status == "not_applicable" and "language model" in (r.reason or "")
    llama_spec = TextModelSpec(model_type="llama", vocab_size=50, hidden_size=8, tie_word_embeddings=False)
    r = run_token_attack("seq-length", text_context({"model.embed_tokens.weight": torch.ones(50, 8)}, llama_spec))
    assert r.status == "not_applicable" and "rotary" in (r.reason or "")


def test_head_attack_streams_a_large_vocabulary() -> None:
    """V = 128,256: the head is read in blocks; a small block size gives the same answer."""
    gen = torch.Generator().manual_seed(0)
    v, d = 128_256, 16
    head = torch.randn(v, d, generator=gen) * 1e-6
    targets = torch.randperm(v, generator=gen)[:40]
    head[targets] = torch.randn(40, d, generator=gen)
    bag = head_targets(head)
    assert set(bag.flagged.nonzero().flatten().tolist()) == set(targets.tolist())
    small = head_targets(head, chunk_bytes=4096)
    assert torch.equal(small.flagged, bag.flagged) and torch.equal(small.counts, bag.counts)
    amax, norm = row_stats(head, chunk_bytes=1000)
    assert torch.allclose(norm, head.double().norm(dim=1)) and torch.allclose(amax, head.double().abs().amax(1))


def test_log_gap_cut_and_untied_dense_fallback() -> None:
    assert log_gap_cut(torch.tensor([5.0, 4.0, 0.01, 0.009]), 3)[0] == 2
    assert log_gap_cut(torch.tensor([5.0, 1e-3, 5e-4] + [1e-5] * 6), 8, lowest_above=10)[0] == 3
    mat = torch.full((20, 4), 1e-3)
    mat[[2, 7]] = 1.0
    bag = untied_bag(mat)
    assert bag.method == "row-norm-gap" and bag.flagged.nonzero().flatten().tolist() == [2, 7] and bag.warnings


def test_residual_sweep_matches_one_basis_at_a_time() -> None:
    """The one-pass rank sweep gives, for every candidate rank, the residual ratio of a projection on that many
    basis vectors (blocks of any size)."""
    gen = torch.Generator().manual_seed(0)
    mat = torch.randn(300, 16, generator=gen)
    mat[:5] = 0.0
    basis = torch.linalg.qr(torch.randn(16, 16, generator=gen, dtype=torch.float64)).Q
    ranks = rank_grid(14, points=5)
    assert ranks[0] == 1 and ranks[-1] == 14 and len(ranks) == 5 and rank_grid(3) == [1, 2, 3]
    sweep = residual_sweep(mat, basis, ranks, chunk_bytes=1000)
    for j, r in enumerate(ranks):
        rho, _ = residual_ratios(mat, basis[:, :r].contiguous())
        assert torch.allclose(sweep[:, j].double(), rho, rtol=1e-5, atol=1e-7)
    assert float(sweep[:5].abs().max()) == 0.0


# ------------------------------------------------------------------------------------------ tiny HF models
transformers = pytest.importorskip("transformers")


def _setting(model_kind: str, seed: int, left: bool = False) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = gpt2(D, V) if model_kind == "gpt2" else llama(D, V)
    ids, mask = token_batch(B, V, (4, 8), seed, left=left)
    return model, ids, mask


@pytest.mark.parametrize("seed", [0, 1])
def test_fedsgd_b8_tied_gpt2(seed: int) -> None:
    model, ids, mask = _setting("gpt2", seed)
    ctx = text_context(gradient(model, ids, mask), spec_of(model, batch_size=B, max_length=ids.shape[1]))
    truth = truth_bags(ids, mask)
    bag = run_token_attack("token-bag", ctx)
    assert bag.status == "ok" and bag.output is not None
    assert isinstance(bag.output, TokenOutput) and bag.output.diagnostics["method"] == "span-residual"
    s = bag_scores(_bag(bag.output), truth["inputs"], V)
    assert s["recall"] >= 0.99 and s["precision"] >= 0.95, s
    assert s["chance_recall"] < 0.1
    targets = run_token_attack("next-tokens", ctx)
    assert targets.status == "ok"
    union = {**_bag(targets.output), **_bag(bag.output)}
    assert bag_scores(union, truth["all"], V)["recall"] >= 0.99
    lengths = run_token_attack("seq-length", ctx)
    assert lengths.status == "ok" and isinstance(lengths.output, TokenOutput)
    assert lengths.output.max_length == int(mask.sum(1).max())
    assert "tokens" in bag.to_json() and "max_length" in lengths.to_json()


@pytest.mark.parametrize("seed", [0, 1])
def test_fedsgd_b8_untied_llama(seed: int) -> None:
    model, ids, mask = _setting("llama", seed, left=True)
    ctx = text_context(gradient(model, ids, mask), spec_of(model))
    truth = truth_bags(ids, mask)
    bag = run_token_attack("token-bag", ctx)
    assert bag.status == "ok" and isinstance(bag.output, TokenOutput)
    assert bag.output.diagnostics["method"] == "nonzero-rows"
    s = bag_scores(_bag(bag.output), truth["inputs"], V)
    assert s["recall"] >= 0.99 and s["precision"] >= 0.95, s
    assert s["count_accuracy"] >= 0.9, s  # few repeats at V = 1000: rough counts are mostly 1
    nxt = run_token_attack("next-tokens", ctx)
    t = bag_scores(_bag(nxt.output), truth["targets"], V)
    assert t["recall"] >= 0.99 and t["precision"] >= 0.95, t
    union = {**_bag(nxt.output), **_bag(bag.output)}
    assert bag_scores(union, truth["all"], V)["recall"] == 1.0
    r = run_token_attack("seq-length", ctx)
    assert r.status == "not_applicable" and "rotary" in (r.reason or "")


@pytest.mark.parametrize(("model_kind", "seed"), [("gpt2", 4), ("gpt2", 5), ("llama", 3)])
def test_fedavg_three_local_steps_reads_the_update_direction(model_kind: str, seed: int) -> None:
    """FedAvg, 3 local SGD steps on one batch: the tied head part lies in the union of the three steps' spans
    (rank ≤ 3·M), which the rank sweep finds; the flagged rows are exactly the inputs (tokens seen only as targets
    are head-only and stay out). Width 192 for the tied model: 3·M + the distinct inputs must fit in d
    (METHODS-text §2.2(a)). Seeds 4 and 5: the largest-singular-gap rank (before issue 37's fix) fell back to the
    row-norm cut there, precision 0.85 and 0.82 against the inputs."""
    model = gpt2(D_AVG, V) if model_kind == "gpt2" else llama(D, V)
    ids, mask = token_batch(B, V, (4, 8), seed)
    lr = 0.05
    delta = fedavg_update(model, ids, mask, 3, lr)
    spec = spec_of(model, "update", 3, lr, batch_size=B, max_length=ids.shape[1])
    ctx = text_context(delta, spec)
    assert ctx.require_tokens().scale == pytest.approx(-1 / (3 * lr))
    truth = truth_bags(ids, mask)
    bag = run_token_attack("token-bag", ctx)
    assert bag.status == "ok" and isinstance(bag.output, TokenOutput)
    assert bag.output.diagnostics["method"] == ("span-residual" if model_kind == "gpt2" else "nonzero-rows")
    s = bag_scores(_bag(bag.output), truth["inputs"], V)
    assert s["recall"] >= 0.95 and s["precision"] >= 0.95, s  # measured 1.00 / 1.00
    # −Δ is the direction: the flagged set does not depend on the scale, and one step equals the gradient's answer
    one = fedavg_update(model, ids, mask, 1, lr)
    grad = gradient(model, ids, mask)
    a = run_token_attack("token-bag", text_context(one, spec_of(model, "update", 1, lr, B, ids.shape[1])))
    b = run_token_attack("token-bag", text_context(grad, spec_of(model, batch_size=B, max_length=ids.shape[1])))
    assert _bag(a.output).keys() == _bag(b.output).keys()


def _corpus_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic notes: fixed template tokens with slots drawn from small pools (names, dates, numbers, words)."""
    pools = [list(range(10, 40)), list(range(40, 70)), list(range(70, 110)), list(range(110, 130))]
    ids = torch.zeros(batch, 11, dtype=torch.long)
    mask = torch.zeros(batch, 11, dtype=torch.long)
    for i in range(batch):
        slots = [p[int(torch.randint(len(p), (1,), generator=gen))] for p in pools]
        sentence = [1, 2, slots[0], 3, 4, slots[1], 5, slots[2], 6, slots[3], 7]
        n = 11 - int(torch.randint(0, 3, (1,), generator=gen))
        ids[i, :n] = torch.tensor(sentence[:n])
        mask[i, :n] = 1
    return ids, mask



@pytest.mark.extended
@pytest.mark.usefixtures("one_thread")
def test_model_that_knows_the_domain() -> None:
    """A tiny GPT-2 trained on a repetitive corpus: its confident predictions make absent rows large; the plain
    row-norm cut loses precision, the span-residual separation does not."""
    model = gpt2(D, 512, layers=2, seed=0).train()
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        ids, mask = _corpus_batch(16, gen)
        loss = lm_loss(model, ids, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert float(loss.detach()) < 1.7
    span, plain = [], []
    for _ in range(3):
        ids, mask = _corpus_batch(B, gen)
        ctx = text_context(gradient(model, ids, mask), spec_of(model, batch_size=B, max_length=ids.shape[1]))
        truth = truth_bags(ids, mask)
        good = run_token_attack("token-bag", ctx)
        base = run_token_attack("token-bag", ctx, {"method": "row-norm"})
        assert isinstance(good.output, TokenOutput) and good.output.diagnostics["method"] == "span-residual"
        span.append(bag_scores(_bag(good.output), truth["all"], 512))
        plain.append(bag_scores(_bag(base.output), truth["all"], 512))
    # scored against every token of the batch: on this model the separation also flags a few tokens seen only as
    # targets (against the inputs alone precision was 0.90-0.94, recall 1.0)
    assert all(s["recall"] >= 0.95 and s["precision"] >= 0.95 for s in span), span
    assert all(p["precision"] < 0.5 for p in plain), plain  # measured 0.24-0.25


@pytest.mark.extended
@pytest.mark.usefixtures("one_thread")
def test_model_trained_on_notes() -> None:
    """A tiny GPT-2 (d = 128, BPE vocabulary of 1000) trained for 40 steps on the synthetic notes
    (samples/text/notes.txt) and attacked on notes of another generator seed. Confident predictions inflate absent
    tokens' head rows: the plain row-norm cut fails (recall / precision 1.00 / 0.33, 0.07 / 0.67, 0.07 / 0.50).
    The head span seen by the absent rows decays over decades without a gap at M, so the rank is chosen by the ρ
    separation itself and the inputs come out exactly; the largest-singular-gap rank used before issue 37's fix
    fell back to that row-norm cut on all three batches."""
    from tests.notes_lm import bpe_tokenizer, encode, make_notes, train_gpt2

    lines = (SAMPLES / "text" / "notes.txt").read_text().splitlines()
    tok = bpe_tokenizer(lines, 1000)
    v = tok.get_vocab_size()
    model, info = train_gpt2(tok, lines, d=D, layers=2, heads=2, steps=40, lr=3e-3)
    assert info["train_loss"] < 2.2, info  # measured 1.85 (3 s alone, 10 s beside a bench)
    held = make_notes(7)
    for k in range(3):
        ids, mask = encode(tok, held[8 * k: 8 * k + 8], 10)
        ctx = text_context(gradient(model, ids, mask), spec_of(model, batch_size=B, max_length=ids.shape[1]))
        truth = truth_bags(ids, mask)
        good = run_token_attack("token-bag", ctx)
        assert isinstance(good.output, TokenOutput) and good.output.diagnostics["method"] == "span-residual"
        s = bag_scores(_bag(good.output), truth["inputs"], v)
        assert s["recall"] >= 0.95 and s["precision"] >= 0.95, s  # measured 1.00 / 1.00
        assert bag_scores(_bag(good.output), truth["all"], v)["precision"] == 1.0
        base = run_token_attack("token-bag", ctx, {"method": "row-norm"})
        assert bag_scores(_bag(base.output), truth["inputs"], v)["f1"] < 0.7  # measured 0.12-0.50


def test_tied_separation_direct_and_fallback() -> None:
    """tied_bag on a gradient whose scored positions outnumber the width falls back to the row-norm cut, saying
    so."""
    model = gpt2(32, 300)
    ids, mask = token_batch(8, 300, (10, 12), 5)
    grad = gradient(model, ids, mask)["transformer.wte.weight"]
    bag, sub = tied_bag(grad, exclude=150)
    assert sub is None and bag.method == "row-norm-gap" and "fell back" in bag.warnings[0]
    ctx = text_context({"transformer.wte.weight": grad}, spec_of(model))
    r = run_token_attack("next-tokens", ctx)
    assert r.status == "failed" and "cannot separate" in (r.reason or "")
