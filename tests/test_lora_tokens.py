"""lora-tokens: the bag of input tokens from a LoRA adapter's gradient or update (first-block span test), against
the batch's true input tokens; and the one-line reasons where the adapter's rank or a fresh adapter's zero lora_A
gradient leaves nothing to read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from gleak.attacks import Context  # noqa: E402
from gleak.attacks.base import AttackResult  # noqa: E402
from gleak.capture import Capture  # noqa: E402
from gleak.losses import LossSpec  # noqa: E402
from gleak.metrics.tokens import bag_scores, truth_bags  # noqa: E402
from gleak.models.lastlayer import LastLayer  # noqa: E402

from .token_models import adapt, gpt2, llama, lm_loss, run_token_attack, spec_of, token_batch  # noqa: E402

VOCAB = 500


def saved(model: nn.Module, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameter names -> peft's saved-adapter names (what captures use)."""
    return {n.replace(".default", ""): t for n, t in values.items()}


def lora_gradient(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(lm_loss(model, ids, mask), list(params.values()))
    return saved(model, {n: g.detach() for n, g in zip(params, grads, strict=True)})


def lora_update(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, steps: int, lr: float
                ) -> dict[str, torch.Tensor]:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    start = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        lm_loss(model, ids, mask).backward()
        opt.step()
    return saved(model, {n: p.detach() - start[n] for n, p in params.items()})


def attack(base: nn.Module, tensors: dict[str, torch.Tensor], ids: torch.Tensor, path: Path | None = None,
           kind: str = "gradient", name: str = "lora-tokens") -> AttackResult:
    spec = spec_of(base, kind="gradient" if kind == "gradient" else "update", batch_size=int(ids.shape[0]),
                   max_length=int(ids.shape[1]))
    layer = LastLayer(name="lm_head", weight_key="lm_head.weight", bias_key=None, weight=torch.zeros(1), bias=None,
                      grad_weight=None, grad_bias=None, num_classes=VOCAB, feature_dim=spec.hidden_size, reason="")
    capture = Capture(tensors=tensors, meta={"gleak.kind": kind}, path=path)
    ctx = Context(capture=capture, layer=layer, model=base, num_classes=VOCAB, batch_size=int(ids.shape[0]),
                  local_steps=1, loss=LossSpec(), text_model=spec)
    return run_token_attack(name, ctx)


def scores(result: AttackResult, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    assert result.status == "ok", result.reason
    assert result.output is not None
    return bag_scores(result.output.bag(), truth_bags(ids, mask)["inputs"], VOCAB)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_trained_adapters_gradient_gives_the_input_tokens(family: str) -> None:
    base = (llama if family == "llama" else gpt2)(d=64, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (5, 8), seed=1)
    result = attack(base, lora_gradient(adapt(base, r=32, trained=True), ids, mask), ids)
    s = scores(result, ids, mask)
    assert s["recall"] == 1.0 and s["precision"] == 1.0, s
    assert result.output is not None and result.output.diagnostics["case"] == "lora_A rows"
    # GPT-2's first-block input depends on the position too: every position is tested
    assert (result.output.diagnostics["positions"] > 1) == (family == "gpt2")


def test_a_fresh_adapter_reads_through_lora_b_with_the_global_adapter(tmp_path: Path) -> None:
    base = llama(d=64, vocab=VOCAB)
    model = adapt(base, r=32, trained=False)
    ids, mask = token_batch(1, VOCAB, (6, 6), seed=2)
    grads = lora_gradient(model, ids, mask)
    assert all(float(g.abs().max()) == 0 for n, g in grads.items() if "lora_A" in n)  # B = 0: ∇A = 0 exactly
    capture = tmp_path / "c.safetensors"
    missing = attack(base, grads, ids, path=capture)
    assert missing.status == "failed" and "c.adapter/" in (missing.reason or "")
    model.save_pretrained(str(tmp_path / "c.adapter"))  # what the server sent: the global adapter
    result = attack(base, grads, ids, path=capture)
    s = scores(result, ids, mask)
    assert s["recall"] == 1.0 and s["precision"] == 1.0, s
    assert result.output is not None and result.output.diagnostics["case"].startswith("lora_B")


def test_a_fedavg_update_of_a_fresh_adapter_moves_lora_a() -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(2, VOCAB, (5, 7), seed=3)
    update = lora_update(adapt(base, r=32, trained=False), ids, mask, steps=3, lr=0.05)
    s = scores(attack(base, update, ids, kind="update"), ids, mask)
    assert s["recall"] == 1.0 and s["precision"] == 1.0, s


def test_a_rank_below_the_batchs_tokens_is_named_not_guessed() -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, mask = token_batch(4, VOCAB, (8, 10), seed=4)  # ~35 distinct tokens, each module r = 2
    result = attack(base, lora_gradient(adapt(base, r=2, trained=True), ids, mask), ids)
    reason = result.reason or ""
    assert result.status == "failed" and "rank 2 of at most 2" in reason and "r = 2" in reason
    assert "\n" not in reason


def test_not_a_lora_capture() -> None:
    base = llama(d=64, vocab=VOCAB)
    ids, _ = token_batch(1, VOCAB, (4, 4), seed=5)
    result = attack(base, {"model.embed_tokens.weight": torch.zeros(VOCAB, 64)}, ids)
    assert result.status == "not_applicable" and "not a LoRA update" in (result.reason or "")
