"""gleak.integrations.flower with a LoRA app (issue 37, FlowerTune-style): the client mod writes LoRA captures of
adapter updates (exactly client − global, bound to the base model, with the gleak.peft.* keys), the round's global
adapter and a text truth; the strategy wrapper runs the token attacks on each reply. A tiny LLaMA-style folder and
peft adapters are built here (tests/text_models.py); nothing is downloaded."""

from __future__ import annotations

import copy
import json
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="gleak[flower] not installed")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from gleak.capture import load_capture, load_text_truth, truth_path_for  # noqa: E402
from gleak.errors import GleakError  # noqa: E402
from gleak.io import tensors_sha256  # noqa: E402
from gleak.metrics.tokens import truth_bags  # noqa: E402
from gleak.models.peft import adapter_path_for, is_adapter_dir, load_adapter  # noqa: E402
from gleak.models.text import tokenizer_sha256  # noqa: E402

from .test_flower import _context, _flower_task_identity  # noqa: E402, F401  (the autouse fixture)
from .text_models import build_notes_and_models  # noqa: E402

R, ALPHA, TARGETS = 16, 32, ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaMA-style Hugging Face folder with its tokenizer."""
    return build_notes_and_models(tmp_path_factory.mktemp("text"))[1]


def lora_config() -> Any:
    return peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")


def fresh_adapter(base: Path, seed: int = 0) -> Any:
    """The base model with a fresh LoRA adapter (lora_B = 0), as a FlowerTune client builds it."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(seed)
    return peft.get_peft_model(model, lora_config())


def adapter_arrays(model: Any) -> dict[str, torch.Tensor]:
    """What a FlowerTune client sends: the adapter's state dict as peft saves it."""
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}


def train(model: Any, global_arrays: dict[str, torch.Tensor], batches: list[tuple[torch.Tensor, torch.Tensor]],
          lr: float = 0.5) -> dict[str, torch.Tensor]:
    """A client's round: the global adapter set, one SGD step per batch (next-token loss), the adapter back."""
    local = copy.deepcopy(model)
    peft.set_peft_model_state_dict(local, global_arrays)
    local.eval()  # no dropout: what the audit recomputes
    opt = torch.optim.SGD([p for p in local.parameters() if p.requires_grad], lr=lr)
    for ids, mask in batches:
        opt.zero_grad()
        local(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        opt.step()
    return adapter_arrays(local)


def token_batch(base: Path, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    tok = transformers.AutoTokenizer.from_pretrained(base)
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def messages(global_arrays: dict[str, torch.Tensor], config: dict[str, Any], node: int = 5) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

    return Message(RecordDict({"arrays": ArrayRecord(global_arrays), "config": ConfigRecord(config)}),
                   dst_node_id=node, message_type=MessageType.TRAIN)


def client(local: dict[str, torch.Tensor], record: Callable[[Any], None] | None = None) -> Any:
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    def reply(msg: Any, ctx: Any) -> Any:
        if record is not None:
            record(ctx)
        return Message(RecordDict({"arrays": ArrayRecord(local), "metrics": MetricRecord({"num-examples": 4})}),
                       reply_to=msg)

    return reply


NOTES = ["Alice Smith record 1234 on 2026-01-02 mild fever", "Bob Jones record 9876 chest pain",
         "Carol Novak seen on 2026-03-04", "Hiro Tanaka record 5555 follow up next week"]


def test_the_mod_writes_a_lora_capture_its_adapter_and_its_truth(base: Path, tmp_path: Path) -> None:
    from gleak.integrations.flower import GleakCaptureMod, LoraApp, record_batch
    from gleak.models import load_model

    model = fresh_adapter(base)
    g = adapter_arrays(model)
    first, second = token_batch(base, NOTES[:2]), token_batch(base, NOTES[2:])  # two widths: padded to one
    loc = train(model, g, [first, second])

    def record(ctx: Any) -> None:
        record_batch(ctx, {"input_ids": first[0], "attention_mask": first[1], "labels": first[0]})  # a collator's
        record_batch(ctx, second[0], attention_mask=second[1])

    mod = GleakCaptureMod(tmp_path, lora=LoraApp(base, lora_config(), max_length=32), learning_rate=0.5,
                          optimizer="sgd")
    ctx = _context()
    reply = mod(messages(g, {"server-round": 1}), ctx, client(loc, record))
    mod.flush()
    assert mod.recorder.failures == 0 and not any(k.startswith("gleak.") for k in ctx.state)
    returned = reply.content["arrays"].to_torch_state_dict()
    assert all(torch.equal(returned[k], loc[k]) for k in loc)  # the reply is left alone
    cap = load_capture(tmp_path / "round-0001" / "client-5.safetensors")
    assert set(cap.tensors) == set(g) and all(torch.equal(cap.tensors[k], loc[k] - g[k]) for k in g)
    meta = cap.meta
    assert meta["gleak.kind"] == "update" and meta["gleak.modality"] == "text" and meta["gleak.task"] == "causal_lm"
    assert meta["gleak.model.sha256"] == load_model(base).weights_sha256  # the base model's, as `gleak audit` hashes
    assert meta["gleak.peft.type"] == "lora" and meta["gleak.peft.r"] == R and meta["gleak.peft.alpha"] == ALPHA
    assert meta["gleak.peft.target_modules"] == TARGETS
    assert meta["gleak.peft.adapter.sha256"] == tensors_sha256(g)
    assert meta["gleak.tokenizer.sha256"] == tokenizer_sha256(base) and meta["gleak.max_length"] == 32
    assert meta["gleak.fl.round"] == 1 and meta["gleak.learning_rate"] == 0.5 and meta["gleak.optimizer"] == "sgd"
    assert cap.local_steps == 2 and cap.batch_size == 2  # from the two recorded batches of 2 sequences
    assert cap.meta["gleak.vocab_size"] == load_model(base).module.get_input_embeddings().num_embeddings
    # the round's global adapter: beside the capture (lora-tokens reads it there) and once under models/
    beside = adapter_path_for(cap.path)  # type: ignore[arg-type]
    assert is_adapter_dir(beside)
    config, tensors = load_adapter(beside)
    assert config["r"] == R and all(torch.equal(tensors[k], g[k]) for k in g)
    models = list((tmp_path / "models").iterdir())
    assert [p.name for p in models] == [f"round-0001-{tensors_sha256(g)[:12]}.adapter"] and is_adapter_dir(models[0])
    peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), models[0])  # peft reads it
    # the truth: both batches, padded on the right to one width
    truth = load_text_truth(truth_path_for(cap.path), cap)  # type: ignore[arg-type]
    width = max(first[0].shape[1], second[0].shape[1])
    assert truth.input_ids.shape == (4, width) and truth.labels is None
    assert torch.equal(truth.input_ids[:2, :first[0].shape[1]], first[0])
    assert torch.equal(truth.attention_mask[2:, :second[0].shape[1]], second[1])
    assert int(truth.attention_mask.sum()) == int(first[1].sum() + second[1].sum())
    # `gleak audit` reads it as a LoRA capture of the base model, scored against the truth
    from typer.testing import CliRunner

    from gleak.cli import app

    result = CliRunner().invoke(app, ["audit", str(tmp_path), "--model", str(base), "-f", "json", "--fail-on",
                                      "none"])
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    (report,) = json.loads(result.stdout)["captures"]
    assert report["model"]["sha256"] == meta["gleak.model.sha256"] and report["truth"] is not None
    lora_tokens = next(t for t in report["tokens"] if t["attack"] == "lora-tokens")
    # four notes hold more distinct tokens than r = 16: the attack ran and says why it cannot separate them
    assert lora_tokens["status"] in ("ok", "failed") and "\n" not in (lora_tokens["reason"] or ""), lora_tokens
    # beyond the rank, the sparse fit reads lora_A's update: the fresh adapter's first step leaves lora_A unmoved
    # (B = 0), so exactly the second batch's input tokens are in it
    sparse = next(t for t in report["tokens"] if t["attack"] == "sparse-tokens")
    from gleak.metrics.tokens import truth_bags

    assert sparse["status"] == "ok" and sparse["scores"]["precision"] == 1.0, sparse
    assert {t["id"] for t in sparse["tokens"]} == set(truth_bags(*second)["inputs"])


def test_the_mod_survives_what_it_cannot_capture(base: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from gleak.integrations.flower import GleakCaptureMod, LoraApp, record_batch

    model = fresh_adapter(base)
    g = adapter_arrays(model)
    mod = GleakCaptureMod(tmp_path, lora=LoraApp(base, {"r": R, "lora_alpha": ALPHA}), background=False)
    full = {k: v.clone() for k, v in model.state_dict().items() if "layers.0.mlp" in k}  # not an adapter
    images = client(g, lambda ctx: record_batch(ctx, torch.randn(2, 3), torch.tensor([0, 1])))
    with caplog.at_level(logging.WARNING):
        mod(messages(full, {"server-round": 1}), _context(), client(full))
        mod(messages(g, {"server-round": 2}), _context(), images)
    assert "not a LoRA adapter" in caplog.text and "recorded image batches" in caplog.text
    assert mod.recorder.failures == 1 and mod.recorder.written == 1
    cap = load_capture(tmp_path / "round-0002" / "client-5.safetensors")  # written, without truth
    assert cap.meta["gleak.peft.target_modules"] == TARGETS and cap.meta["gleak.peft.r"] == R  # read off the arrays
    assert not truth_path_for(cap.path).exists()  # type: ignore[arg-type]


def test_lora_app_checks_its_inputs_and_travels(base: Path, tmp_path: Path) -> None:
    from flwr.app import Context, RecordDict

    from gleak.integrations.flower import GleakAuditStrategy, GleakCaptureMod, LoraApp, record_batch

    with pytest.raises(GleakError, match="not a Hugging Face model folder"):
        LoraApp(tmp_path, lora_config())
    with pytest.raises(GleakError, match="DoRA"):
        LoraApp(base, {"r": 4, "use_dora": True})
    with pytest.raises(GleakError, match="r is"):
        LoraApp(base, {"r": 0})
    with pytest.raises(GleakError, match="image-model options"):
        GleakCaptureMod(tmp_path, lora=LoraApp(base, lora_config()), arch="lenet")
    with pytest.raises(GleakError, match="one of the two"):
        from flwr.serverapp.strategy import FedAvg

        GleakAuditStrategy(FedAvg(), log_path=tmp_path / "a.jsonl")
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(GleakError, match="integer input_ids"):
        record_batch(ctx, torch.randn(2, 3))
    with pytest.raises(GleakError, match="not both"):
        record_batch(ctx, torch.ones(2, 3, dtype=torch.long), torch.ones(2), attention_mask=torch.ones(2, 3))
    lora = LoraApp(base, lora_config())
    sha = lora.describe().sha256
    copied = pickle.loads(pickle.dumps(lora))  # shipped to simulation workers with the mod
    assert copied.describe().sha256 == sha
    given = LoraApp(base, lora_config(), base_sha256=sha).describe()  # no model loaded: the folder's files only
    assert given == lora.describe()


@pytest.mark.parametrize("write", [True, False], ids=["captures-written", "in-memory"])
def test_the_strategy_runs_the_token_attacks_on_each_reply(base: Path, tmp_path: Path, write: bool) -> None:
    """Round 1 of a fresh adapter: one local step moves lora_B only (read through the global lora_A, which the
    wrapper puts beside the capture, written or not); two steps move lora_A too."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg

    from gleak.integrations.flower import GleakAuditStrategy, LoraApp

    model = fresh_adapter(base)
    g = adapter_arrays(model)
    one = token_batch(base, ["Alice Smith record 1234 mild fever"])
    two = token_batch(base, ["Bob Jones record 9876 chest pain"])
    strategy = GleakAuditStrategy(FedAvg(), lora=LoraApp(base, lora_config()), log_path=tmp_path / "audit.jsonl",
                                  capture_dir=tmp_path / "caps" if write else None)
    strategy._round = {1: (ArrayRecord(g), ConfigRecord({"lr": 0.5, "batch-size": 1}))}
    replies = []
    for node, (local, steps) in enumerate([(train(model, g, [one]), 1), (train(model, g, [two, two]), 2)], 1):
        replies.append(Message(RecordDict({"arrays": ArrayRecord(local),
                                           "metrics": MetricRecord({"local-steps": steps, "num-examples": steps})}),
                               reply_to=messages(g, {"server-round": 1}, node)))
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None  # FedAvg aggregated the same replies
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [line["node_id"] for line in lines] == ["1", "2"]
    for line, (ids, mask) in zip(lines, (one, two), strict=True):
        assert line["status"] == "ok", line
        found = {a["attack"]: a for a in line["attacks"]}
        assert found["lora-tokens"]["status"] == "ok", found["lora-tokens"]
        assert set(found["lora-tokens"]["token_ids"]) == set(truth_bags(ids, mask, causal_lm=True)["inputs"])
        assert found["token-bag"]["status"] == "not_applicable" and found["token-bag"]["reason"]
        assert "text" not in json.dumps(found["lora-tokens"])  # ids and counts, never decoded text
    written = list(tmp_path.rglob("client-*.safetensors"))
    assert len(written) == (2 if write else 0)
    assert len(list(tmp_path.rglob("client-*.adapter"))) == len(written)  # each with its adapter beside it


@pytest.mark.integration
def test_the_flowertune_example_end_to_end(gleak: Any, tmp_path: Path) -> None:
    """examples/flowertune on Ray (2 clients × 2 rounds, about 40 s on 2 cores; the timeout is a hang guard only):
    every adapter update captured with its adapter and truth, and `gleak audit` against the base model reads them."""
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / "flowertune" / "run.py"
    out = tmp_path / "ft"
    run = subprocess.run([sys.executable, str(example), "--out", str(out), "--clients", "2", "--rounds", "2"],
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    captures = sorted((out / "captures").glob("round-*/client-*[0-9].safetensors"))
    assert len(captures) == 4, (captures, run.stderr[-3000:])
    for path in captures:
        cap = load_capture(path)
        assert cap.meta["gleak.peft.type"] == "lora" and cap.local_steps == 2 and cap.batch_size == 2
        assert is_adapter_dir(adapter_path_for(path)) and load_text_truth(truth_path_for(path), cap).num_examples == 4
    assert len(list((out / "captures" / "models").glob("round-*.adapter"))) == 2
    server = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert len(server) == 4 and all(line["status"] == "ok" for line in server)
    r = gleak("audit", out / "captures", "--model", Path(__file__).resolve().parents[1] / "samples" / "text" /
              "notes-llama", "--format", "json", "--fail-on", "none")
    assert r.exit_code == 0, r.stderr
    reports = json.loads(r.stdout)["captures"]
    assert len(reports) == 4 and all(c["status"] == "ok" for c in reports)
    for report in reports:
        (lora,) = [t for t in report["tokens"] if t["attack"] == "lora-tokens"]
        assert lora["status"] == "ok" and lora["scores"]["precision"] == 1.0 and lora["scores"]["recall"] >= 0.9, lora
