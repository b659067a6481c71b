"""DAGER on language-model captures: exact sequences from tiny random GPT-2-style (tied, learned positions) and
LLaMA-style (untied, RoPE) models, full fine-tuning and LoRA, against the true batch; the one-line refusal when
the batch has more distinct inputs than the span can hold; and `gleak reconstruct` on a text capture (ids only
unless --show-text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from typer.testing import CliRunner

from gleak.attacks.text.dager import run_dager
from gleak.attacks.tokens.view import token_view
from gleak.cli import app
from gleak.errors import GleakError

from .test_lora_tokens import adapt, lora_gradient
from .text_models import NAMES, build_notes_and_models
from .token_models import gpt2, gradient, llama, spec_of, token_batch

VOCAB = 500



def real(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [[t for t, m in zip(r, k, strict=True) if m] for r, k in zip(ids.tolist(), mask.tolist(), strict=True)]


def attack(model: torch.nn.Module, tensors: dict[str, torch.Tensor], ids: torch.Tensor, lora: bool = False,
           adapter: tuple[dict[str, float], dict[str, torch.Tensor]] | None = None):
    spec = spec_of(model, batch_size=int(ids.shape[0]), max_length=int(ids.shape[1]))
    head, scale = None, 1.0
    if not lora:
        view = token_view(tensors, spec)
        head, scale = (view.head if view.head is not None else view.embedding), view.scale
    return run_dager(model, spec, tensors, head=head, head_scale=scale, stored_adapter=adapter,
                     missing_global="none", min_gap=100.0)


def global_adapter(model: torch.nn.Module, r: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """What the server sent: the adapter's config and weights (lora_alpha = 2r, as adapt() builds it)."""
    weights = {n.replace(".default", ""): p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return {"r": r, "lora_alpha": 2 * r}, weights


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_full_fine_tuning_batch_comes_back_exactly(family: str) -> None:
    model = (gpt2 if family == "gpt2" else llama)(d=128, vocab=VOCAB)
    ids, mask = token_batch(4, VOCAB, (6, 10), seed=11)
    found = attack(model, gradient(model, ids, mask), ids)
    assert sorted(found.sequences) == sorted(real(ids, mask))  # every token, the last ones from the head
    assert all(found.exact) and all(found.last_from_head)
    assert found.diagnostics["positional"] == (family == "gpt2")


def test_a_trained_lora_adapter_gives_the_sequences_but_their_last_tokens() -> None:
    base = llama(d=64, vocab=VOCAB, layers=2)
    ids, mask = token_batch(2, VOCAB, (5, 7), seed=12)
    model = adapt(base, r=48, trained=True)
    grads = lora_gradient(model, ids, mask)
    found = attack(base, grads, ids, lora=True, adapter=global_adapter(model, 48))
    # the head is frozen in a LoRA run: each sequence comes back without its last token
    assert sorted(found.sequences) == sorted(s[:-1] for s in real(ids, mask))
    assert found.diagnostics["lora"] is True and not any(found.last_from_head)
    # without the global adapter the second block's inputs are computed without it: nothing passes, and the
    # one-line reason names what is missing
    with pytest.raises(GleakError, match="without its global adapter"):
        attack(base, grads, ids, lora=True)


def test_more_distinct_inputs_than_the_width_is_refused_naming_the_rank() -> None:
    model = gpt2(d=32, vocab=VOCAB)
    ids, mask = token_batch(8, VOCAB, (10, 12), seed=13)  # ~90 (token, position) pairs against width 32
    with pytest.raises(Exception) as err:
        attack(model, gradient(model, ids, mask), ids)
    assert "rank" in str(err.value) and "width 32" in str(err.value) and "\n" not in str(err.value)


def test_a_low_lora_rank_is_refused_naming_it() -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(4, VOCAB, (8, 10), seed=14)
    with pytest.raises(Exception) as err:
        attack(base, lora_gradient(adapt(base, r=8, trained=True), ids, mask), ids, lora=True)
    assert "LoRA r = 8" in str(err.value)


def test_gleak_reconstruct_on_a_text_capture(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    text, llama_dir, _ = build_notes_and_models(tmp_path / "models")
    runner = CliRunner()
    cap = tmp_path / "c.safetensors"
    done = runner.invoke(app, ["simulate", "--model", str(llama_dir), "--data", str(text), "-b", "2",
                               "--max-length", "12", "--seed", "3", "-o", str(cap)])
    assert done.exit_code == 0, done.stderr
    out = tmp_path / "rec"
    done = runner.invoke(app, ["reconstruct", str(cap), "--model", str(llama_dir), "-o", str(out), "--format",
                               "json"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["report"] == "text" and report["attack"] == "dager" and report["status"] == "ok"
    assert report["scores"]["exact_match"] == 1.0 and report["scores"]["chance_rouge1"] < 0.5
    written = (out / "sequences.txt").read_text() + (out / "metrics.json").read_text()
    assert not [n for n in NAMES if n in written + done.stdout]  # ids only without --show-text
    shown = tmp_path / "shown"
    done = runner.invoke(app, ["reconstruct", str(cap), "--model", str(llama_dir), "-o", str(shown), "--show-text"])
    assert done.exit_code == 0, done.stderr
    assert [n for n in NAMES if n in (shown / "sequences.txt").read_text()]
    assert not [n for n in NAMES if n in done.stdout]  # never on the console
    for args, words in ((["--aux", str(text)], "--aux"), (["--iterations", "5"], "only the optimisation")):
        done = runner.invoke(app, ["reconstruct", str(cap), "--model", str(llama_dir), "-o", str(tmp_path / "x"),
                                   *args])
        assert done.exit_code == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.extended
@pytest.mark.usefixtures("one_thread")
def test_a_model_that_knows_the_domain_still_gives_exact_sequences() -> None:
    """A tiny GPT-2 trained on the synthetic notes (tied head): the head solve for the last tokens shares its rows
    with the input part of the gradient, so uncertain picks are checked against the recomputed gradient."""
    from .conftest import ROOT
    from .notes_lm import bpe_tokenizer, encode, make_notes, train_gpt2

    lines = (ROOT / "samples" / "text" / "notes.txt").read_text().splitlines()
    tok = bpe_tokenizer(lines, 1000)
    model, info = train_gpt2(tok, lines, d=128, layers=2, heads=2, steps=40, lr=3e-3)
    assert info["train_loss"] < 2.2, info
    ids, mask = encode(tok, make_notes(7)[:3], 12)
    found = attack(model, gradient(model, ids, mask), ids)
    assert sorted(found.sequences) == sorted(real(ids, mask)), found.diagnostics


def test_a_float32_update_lost_in_rounding_says_so() -> None:
    """FedAvg in float32: θ_E − θ_0 carries the weights' rounding. GPT-2-style at η = 1e-4: the singular values run
    into that floor without a clear drop, and the refusal names the rounding (not a full batch); LLaMA-style: the
    prefix test passes more than 8·B prefixes at every step, and the search stops there instead of running on."""
    from .token_models import fedavg_update

    ids, mask = token_batch(8, 1000, (8, 16), seed=8)
    for family, words in (("gpt2", "rounding floor"), ("llama", "does not separate prefixes")):
        model = (gpt2 if family == "gpt2" else llama)(d=128, vocab=1000)
        update = fedavg_update(model, ids, mask, steps=3, lr=1e-4)
        spec = spec_of(model, "update", 3, 1e-4, batch_size=8, max_length=int(ids.shape[1]))
        view = token_view(update, spec)
        with pytest.raises(GleakError) as err:
            run_dager(model, spec, update, head=view.head if view.head is not None else view.embedding,
                      head_scale=view.scale, stored_adapter=None, missing_global="none", min_gap=100.0)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
