"""tag: the gradient-matching baseline for sentences (TAG / LAMP-style, no prior) on tiny random language models:
the tokens it recovers against the batch's true tokens, the same output for the same seed, and the one-line
reasons where it does not apply (a LoRA-only capture, a classifier, no model)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from gleak.attacks import Context, run_attack
from gleak.attacks.base import AttackResult, TextOutput
from gleak.attacks.registry import get_attack
from gleak.attacks.tokens.view import TextModelSpec
from gleak.capture import Capture
from gleak.losses import LossSpec
from gleak.models.lastlayer import LastLayer

from .token_models import gpt2, gradient, llama, spec_of, token_batch

VOCAB = 200
Case = tuple[nn.Module, torch.Tensor, dict[str, torch.Tensor], TextModelSpec]


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def context(model: nn.Module | None, tensors: dict[str, torch.Tensor], spec: TextModelSpec, seed: int = 0
            ) -> Context:
    layer = LastLayer(name="lm_head", weight_key="lm_head.weight", bias_key=None, weight=torch.zeros(1), bias=None,
                      grad_weight=None, grad_bias=None, num_classes=spec.vocab_size, feature_dim=spec.hidden_size,
                      reason="")
    return Context(capture=Capture(tensors=tensors, meta={"gleak.kind": spec.kind}), layer=layer, model=model,
                   num_classes=spec.vocab_size, batch_size=spec.batch_size, local_steps=1, loss=LossSpec(),
                   text_model=spec, seed=seed)


def tag(ctx: Context, **options: object) -> AttackResult:
    attack = get_attack("tag", "text")
    attack.configure(options)
    return run_attack(attack, ctx)


def text(result: AttackResult) -> TextOutput:
    assert result.status == "ok", result.reason
    assert isinstance(result.output, TextOutput)
    return result.output


@pytest.fixture(scope="module")
def gpt2_case() -> Case:
    model = gpt2(d=32, vocab=VOCAB)
    ids, mask = token_batch(1, VOCAB, (6, 6), seed=1)
    spec = spec_of(model, batch_size=1, max_length=int(ids.shape[1]))
    return model, ids, gradient(model, ids, mask), spec


def test_recovers_most_tokens_of_one_sentence(gpt2_case: Case) -> None:
    model, ids, grads, spec = gpt2_case
    out = text(tag(context(model, grads, spec), iterations=80))
    truth = Counter(ids[0].tolist())
    found = Counter(t for s in out.sequences for t in s)
    recall = sum((truth & found).values()) / sum(truth.values())
    # chance: 6 draws from 200 ids hit a given multiset of 6 about 6·6/200 = 0.18 times
    assert recall >= 0.8, (out.sequences, ids.tolist())
    assert out.exact == [False] and len(out.sequences[0]) == 6  # the length read from the position gradient
    d = out.diagnostics
    assert d["method"] == "tag" and d["iterations"] == 80 and d["lengths_from"].startswith("position gradient")
    assert d["final_distance"] < d["initial_distance"] and d["seconds"] > 0 and d["candidates_from"] == "bag"


def test_same_seed_same_output(gpt2_case: Case) -> None:
    model, _, grads, spec = gpt2_case
    ctx = context(model, grads, spec, seed=3)
    model.zero_grad(set_to_none=True)
    runs = [text(tag(ctx, iterations=15, distance="cos", bag_restricted=False)) for _ in range(2)]
    assert runs[0].sequences == runs[1].sequences
    assert runs[0].diagnostics["final_distance"] == runs[1].diagnostics["final_distance"]
    assert runs[0].diagnostics["method"] == "lamp-cos" and runs[0].diagnostics["candidates"] == VOCAB
    assert all(p.grad is None for p in model.parameters())  # the model's .grad is never written


def test_rotary_model_takes_the_recorded_length() -> None:
    model = llama(d=32, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (4, 4), seed=2)
    spec = spec_of(model, batch_size=2, max_length=4)
    out = text(tag(context(model, gradient(model, ids, mask), spec), iterations=5, restarts=2))
    assert [len(s) for s in out.sequences] == [4, 4] and len(out.diagnostics["restart_distances"]) == 2
    assert any("recorded padded length 4" in w for w in out.warnings)


def test_not_applicable_one_line_reasons(gpt2_case: Case) -> None:
    model, _, grads, spec = gpt2_case
    lora = {"transformer.h.0.attn.c_attn.lora_A.weight": torch.zeros(4, 32),
            "transformer.h.0.attn.c_attn.lora_B.weight": torch.zeros(96, 4)}
    cases = {"LoRA adapter tensors": context(model, lora, spec),
             "sequence classifier": context(model, grads, replace(spec, task="sequence_classification")),
             "needs the model": context(None, grads, spec)}
    for fragment, ctx in cases.items():
        result = tag(ctx)
        assert result.status == "not_applicable" and fragment in (result.reason or ""), result.reason
        assert "\n" not in (result.reason or "")
