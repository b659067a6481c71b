"""DAGER's candidate inputs with the prefixes' keys and values cached (gleak.attacks.text.prefix): the same inputs
as running every candidate's whole prefix again, on GPT-2-style and LLaMA-style models, chunked or not; and the
full pass, with the reason in the diagnostics, for a model whose cache does not give the same inputs. The cache is
built through transformers 5's public cache API; older versions (the text extra allows 4.45) take the full pass,
with the same inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import transformers

from gleak.attacks.text.prefix import PrefixInputs
from gleak.attacks.tokens.inputs import module_inputs

from .token_models import gpt2, llama

CACHE_API = int(transformers.__version__.split(".")[0]) >= 5  # DynamicCache(ddp_cache_data=…), iteration


def candidates(vocab: int, prefixes: int, options: int, length: int, seed: int) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    heads = torch.randint(3, vocab, (prefixes, length), generator=gen).tolist()
    tails = torch.randint(3, vocab, (options,), generator=gen).tolist()
    return [(*h, t) for h in heads for t in tails]


def second_block_input(model: torch.nn.Module) -> torch.nn.Module:
    names = dict(model.named_modules())
    return names["transformer.h.1.attn.c_attn"] if "transformer.h.1.attn.c_attn" in names else \
        names["model.layers.1.self_attn.q_proj"]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("chunk", [1 << 15, 7])
def test_cached_inputs_equal_the_full_pass(family: str, chunk: int) -> None:
    model = (gpt2 if family == "gpt2" else llama)(d=64, vocab=300)
    layer = second_block_input(model)
    cands = candidates(300, prefixes=3, options=5, length=6, seed=1)
    inputs = PrefixInputs(model, layer, chunk_tokens=chunk)
    x, before = inputs(cands)
    full = module_inputs(model, layer, torch.tensor(cands))
    if CACHE_API:
        assert inputs.diagnostics == {"prefix_cache": "on"}  # the cache was used, not silently skipped
    else:
        assert inputs.diagnostics["prefix_cache"].startswith("off: ")
    assert before is not None
    torch.testing.assert_close(x, full[:, -1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(before, full[:, -2], rtol=1e-4, atol=1e-5)


def test_one_token_candidates_have_nothing_before() -> None:
    model = gpt2(d=64, vocab=300)
    x, before = PrefixInputs(model, second_block_input(model))([(5,), (9,)])
    assert before is None and x.shape == (2, 64)


class Forgetful(torch.nn.Module):
    """A model that accepts a cache but ignores it: the cached inputs miss the prefix."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any = None,
                use_cache: bool = False, **_: Any) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))


def test_a_model_whose_cache_differs_takes_the_full_pass_and_says_why() -> None:
    inner = llama(d=64, vocab=300)
    model = Forgetful(inner)
    layer = second_block_input(inner)
    cands = candidates(300, prefixes=2, options=3, length=4, seed=2)
    inputs = PrefixInputs(model, layer)
    x, _ = inputs(cands)
    reason = inputs.diagnostics["prefix_cache"]
    assert reason == "off: the cached inputs differ from the full pass" if CACHE_API else reason.startswith("off: ")
    torch.testing.assert_close(x, module_inputs(model, layer, torch.tensor(cands))[:, -1])
