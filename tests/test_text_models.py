"""Language models (issue 37): Hugging Face folders loaded offline, captures of token batches, text data, simulate
and inspect on text. Every model and tokenizer is built here, tiny; nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gleak.capture import (
    SCHEMA,
    TextTruth,
    capture_token_gradients,
    load_capture,
    load_text_truth,
    load_truth,
    save_capture,
    token_loss,
    validate_against_model,
)
from gleak.data.text import load_text_data, tokenize
from gleak.errors import GleakError
from gleak.io import tensors_sha256

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

SENTENCES = ["the patient was seen on monday", "alice smith has record 1234", "bob jones came back on friday",
             "the doctor called alice", "no fever was found today", "record 5678 was closed"]


def make_tokenizer(folder: Path, side: str = "right", pad: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[BOS]", "[EOS]"]))
    extra = {"pad_token": "[PAD]"} if pad else {}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]",
                                                eos_token="[EOS]", padding_side=side, **extra)
    fast.save_pretrained(folder)
    return fast


def make_model(folder: Path, kind: str = "gpt2", task: str = "causal_lm", num_labels: int = 3) -> Path:
    """A tiny random model and its tokenizer, saved as a Hugging Face folder (safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder, side="left" if kind == "llama" else "right", pad=kind == "llama")
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tok), n_positions=64,
                                         bos_token_id=2, eos_token_id=3, num_labels=num_labels,
                                         pad_token_id=3 if task != "causal_lm" else None)
        cls = transformers.GPT2LMHeadModel if task == "causal_lm" else transformers.GPT2ForSequenceClassification
    else:
        config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                          num_attention_heads=2, num_key_value_heads=2, vocab_size=len(tok),
                                          max_position_embeddings=64, pad_token_id=1, bos_token_id=2, eos_token_id=3,
                                          num_labels=num_labels)
        cls = transformers.LlamaForCausalLM if task == "causal_lm" else transformers.LlamaForSequenceClassification
    cls(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hf") / "gpt2")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hf") / "llama", kind="llama")


@pytest.fixture(scope="module")
def notes(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "notes.txt"
    path.write_text("\n".join(SENTENCES[:3]) + "\n\n  \n" + "\n".join(SENTENCES[3:]) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ loading


def test_load_gpt2_folder(gpt2_dir: Path) -> None:
    from gleak.models import load_model, load_tokenizer, tokenizer_sha256

    loaded = load_model(gpt2_dir)
    meta = loaded.metadata
    assert loaded.arch == "hf:gpt2" and not loaded.module.training
    assert meta["gleak.modality"] == "text" and meta["gleak.task"] == "causal_lm"
    assert meta["gleak.tie_word_embeddings"] == "true" and meta["gleak.max_positions"] == "64"
    assert meta["gleak.eos_token_id"] == "3" and meta["gleak.tokenizer.padding_side"] == "right"
    assert int(meta["gleak.vocab_size"]) == len(load_tokenizer(gpt2_dir))
    assert meta["gleak.tokenizer.sha256"] == tokenizer_sha256(gpt2_dir)
    assert loaded.weights_sha256 == tensors_sha256(loaded.module.state_dict())
    assert load_model(gpt2_dir).weights_sha256 == loaded.weights_sha256  # stable for the same weights


def test_load_llama_and_classifier(tmp_path: Path, llama_dir: Path) -> None:
    from gleak.models import load_model

    loaded = load_model(llama_dir)
    assert loaded.arch == "hf:llama" and loaded.metadata["gleak.tie_word_embeddings"] == "false"
    assert loaded.metadata["gleak.tokenizer.padding_side"] == "left" and loaded.metadata["gleak.pad_token_id"] == "1"
    clf = load_model(make_model(tmp_path / "clf", task="sequence_classification", num_labels=4))
    assert clf.metadata["gleak.task"] == "sequence_classification" and clf.metadata["gleak.num_labels"] == "4"


def test_tokenizer_sha256_is_stable_and_sensitive(tmp_path: Path, gpt2_dir: Path) -> None:
    from gleak.models import tokenizer_sha256

    copy = tmp_path / "copy"
    shutil.copytree(gpt2_dir, copy)
    assert tokenizer_sha256(copy) == tokenizer_sha256(gpt2_dir)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["padding_side"] = "left"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_sha256(copy) != tokenizer_sha256(gpt2_dir)


def test_refusals_are_one_line(tmp_path: Path, gpt2_dir: Path) -> None:
    from gleak.models import load_model

    def folder(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(gpt2_dir, target)
        return target

    remote = folder("remote")
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "x.Y"}}))
    with pytest.raises(GleakError, match="--trust-remote-code"):
        load_model(remote)
    unknown = folder("unknown")
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    with pytest.raises(GleakError, match="model_type 'no-such-model'.*--trust-remote-code"):
        load_model(unknown)
    pickled = folder("pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(GleakError, match="pickle.*--trust-pickle"):
        load_model(pickled)
    empty = folder("empty")
    (empty / "model.safetensors").unlink()
    with pytest.raises(GleakError, match="no weights"):
        load_model(empty)
    no_arch = folder("no-arch")
    (no_arch / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    with pytest.raises(GleakError, match="names no architectures"):
        load_model(no_arch)
    with pytest.raises(GleakError, match="drop --arch"):
        load_model(gpt2_dir, arch="lenet")


def test_sharded_safetensors(tmp_path: Path, gpt2_dir: Path) -> None:
    from gleak.models import load_model

    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir, local_files_only=True)
    target = tmp_path / "sharded"
    model.save_pretrained(target, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(gpt2_dir / name, target / name)
    assert (target / "model.safetensors.index.json").is_file()
    assert load_model(target).weights_sha256 == load_model(gpt2_dir).weights_sha256


def test_missing_extra_names_it(monkeypatch, gpt2_dir: Path) -> None:
    import builtins

    from gleak.models import load_model

    real_import = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(GleakError, match=r"pip install '\.\[text\]'"):  # from the clone: gleak is on no index
        load_model(gpt2_dir)


# ------------------------------------------------------------------------------------------ captures


def test_token_loss_matches_transformers(gpt2_dir: Path) -> None:
    from gleak.models import load_model

    module = load_model(gpt2_dir).module
    ids = torch.tensor([[4, 5, 6, 7, 3], [8, 9, 10, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    labels = ids.masked_fill(mask == 0, -100)
    out = module(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.allclose(token_loss(out.logits, ids, mask), out.loss, atol=1e-6)


def test_capture_token_gradients_and_truth(tmp_path: Path, gpt2_dir: Path) -> None:
    from gleak.models import load_model

    loaded = load_model(gpt2_dir)
    module = loaded.module
    ids = torch.tensor([[4, 5, 6, 3], [7, 8, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    cap = capture_token_gradients(module, ids, mask, tokenizer_sha256="a" * 64, padding_side="right", pad_token_id=3)
    names = [n for n, _ in module.named_parameters()]
    assert list(cap.tensors) == names and "lm_head.weight" not in cap.tensors  # tied: once
    assert cap.meta["gleak.model.sha256"] == loaded.weights_sha256 and cap.meta["gleak.model.train_mode"] is False
    assert cap.meta["gleak.modality"] == "text" and cap.meta["gleak.vocab_size"] == module.config.vocab_size
    assert cap.meta["gleak.max_length"] == 4 and cap.meta["gleak.batch_size"] == 2
    validate_against_model(cap, module)
    rows = cap.tensors["transformer.wte.weight"].abs().sum(1)
    assert bool((rows > 0).all())  # tied: the head makes every row non-zero
    out = save_capture(cap, tmp_path / "c.safetensors", truth=TextTruth(input_ids=ids, attention_mask=mask))
    back = load_capture(out)
    assert back.meta["gleak.task"] == "causal_lm" and back.meta["gleak.pad_token_id"] == 3
    truth = load_text_truth(tmp_path / "c.truth.safetensors", back)
    assert torch.equal(truth.input_ids, ids) and truth.labels is None
    with pytest.raises(GleakError, match="load_text_truth"):
        load_truth(tmp_path / "c.truth.safetensors")


def test_untied_embedding_gradient_rows_are_the_input_tokens(llama_dir: Path) -> None:
    from gleak.models import load_model

    module = load_model(llama_dir).module
    ids = torch.tensor([[1, 1, 2, 5, 6, 7], [2, 8, 9, 10, 11, 12]])  # left padded (pad 1)
    mask = (ids != 1).long()
    cap = capture_token_gradients(module, ids, mask)
    rows = cap.tensors["model.embed_tokens.weight"].abs().sum(1).nonzero().flatten().tolist()
    # every real input token but each sequence's last (its output is not scored; METHODS-text §1.1)
    assert set(rows) == {2, 5, 6, 8, 9, 10, 11}


def test_classifier_capture(tmp_path: Path) -> None:
    from gleak.models import load_model

    module = load_model(make_model(tmp_path / "clf", task="sequence_classification")).module
    ids = torch.tensor([[4, 5, 6], [7, 8, 3]])
    mask = torch.ones_like(ids)
    cap = capture_token_gradients(module, ids, mask, torch.tensor([2, 0]))
    assert cap.meta["gleak.task"] == "sequence_classification" and cap.meta["gleak.num_classes"] == 3
    with pytest.raises(GleakError, match="labels must be int64"):
        TextTruth(input_ids=ids, attention_mask=mask, labels=torch.tensor([1.0, 0.0])).check()


def test_bad_token_batches() -> None:
    module = torch.nn.Linear(2, 2)
    with pytest.raises(GleakError, match="integer tensor"):
        capture_token_gradients(module, torch.zeros(2, 3))
    with pytest.raises(GleakError, match="only 0 and 1"):
        capture_token_gradients(module, torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3), 2))
    with pytest.raises(GleakError, match="no next-token target"):
        token_loss(torch.zeros(1, 2, 5), torch.tensor([[1, 2]]), torch.tensor([[1, 0]]))


def test_schema_documents_the_text_keys() -> None:
    for key in ("gleak.modality", "gleak.task", "gleak.vocab_size", "gleak.tokenizer.sha256",
                "gleak.tokenizer.padding_side", "gleak.max_length", "gleak.pad_token_id"):
        assert key in SCHEMA
        assert f"`{key}`" in (Path(__file__).parents[1] / "docs/capture-format.md").read_text()


# ------------------------------------------------------------------------------------------ text data


def test_text_data_files(tmp_path: Path, notes: Path, gpt2_dir: Path) -> None:
    from gleak.models import load_tokenizer

    data = load_text_data(notes)
    assert len(data) == len(SENTENCES) and data.labels is None  # blank lines skipped
    jl = tmp_path / "d.jsonl"
    jl.write_text('{"text": "alice smith", "label": 1}\n\n{"text": "bob", "label": 0}\n')
    assert load_text_data(jl).labels == (1, 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "alice"}\n')
    with pytest.raises(GleakError, match=r'bad.jsonl:1: .*"text" field'):
        load_text_data(bad)
    bad.write_text("not json\n")
    with pytest.raises(GleakError, match="not a JSON object"):
        load_text_data(bad)
    batch = tokenize(load_tokenizer(gpt2_dir), ["alice smith has record 1234", "bob"], max_length=3)
    assert batch.input_ids.shape == (2, 3) and batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.pad_token_id == 3  # GPT-2 style: no pad token, the EOS pads


# ------------------------------------------------------------------------------------------ CLI


def test_simulate_text_fedsgd_and_fedavg(gleak, tmp_path: Path, gpt2_dir: Path, llama_dir: Path, notes: Path) -> None:
    out = tmp_path / "g.safetensors"
    r = gleak("simulate", "--model", gpt2_dir, "--data", notes, "-b", "3", "--max-length", "5", "-o", out)
    assert r.exit_code == 0, (r.stdout + r.stderr)
    assert "alice" not in (r.stdout + r.stderr)  # the client's text is never printed
    cap = load_capture(out)
    assert cap.kind == "gradient" and cap.meta["gleak.max_length"] == 5 and cap.meta["gleak.batch_size"] == 3
    truth = load_text_truth(tmp_path / "g.truth.safetensors", cap)
    assert truth.input_ids.shape[0] == 3 and truth.input_ids.shape[1] <= 5
    upd = tmp_path / "u.safetensors"
    r = gleak("simulate", "--model", llama_dir, "--data", notes, "-b", "2", "-m", "3", "--optimizer", "sgdm",
              "--defense", "gaussian:sigma=0.001", "-o", upd)
    assert r.exit_code == 0, (r.stdout + r.stderr)
    cap = load_capture(upd)
    assert cap.kind == "update" and cap.meta["gleak.local_steps"] == 3 and cap.meta["gleak.momentum"] == 0.9
    assert cap.meta["gleak.tokenizer.padding_side"] == "left" and cap.get("gleak.defense")
    assert load_text_truth(tmp_path / "u.truth.safetensors", cap).input_ids.shape[0] == 6
    r = gleak("inspect", upd, "--model", llama_dir)
    assert r.exit_code == 0, (r.stdout + r.stderr)
    assert "lm_head" in (r.stdout + r.stderr) and "image attack" in (r.stdout + r.stderr)


@pytest.mark.parametrize(("args", "message"), [
    (("--mixup",), "--mixup mixes images"),
    (("--composition", "unique"), "draw batches by image class"),
    (("--loss", "focal"), "cross-entropy"),
    (("--defense", "dpsgd:noise_multiplier=1,max_grad_norm=1"), "dpsgd is not supported for text"),
])
def test_simulate_text_refuses_image_options(gleak, tmp_path: Path, gpt2_dir: Path, notes: Path, args, message):
    r = gleak("simulate", "--model", gpt2_dir, "--data", notes, "-o", tmp_path / "x.safetensors", *args)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in (r.stdout + r.stderr)


def test_simulate_mismatched_modalities(gleak, tmp_path: Path, gpt2_dir: Path, notes: Path) -> None:
    from .conftest import LENET

    r = gleak("simulate", "--model", LENET, "--data", notes, "-o", tmp_path / "x.safetensors")
    assert r.exit_code == 2 and "needs a language model" in r.stderr
    r = gleak("simulate", "--model", gpt2_dir, "--data", LENET, "-o", tmp_path / "x.safetensors")
    assert r.exit_code == 2 and "trains on text" in r.stderr


def test_trust_remote_code_is_command_line_only(gleak, tmp_path: Path) -> None:
    from gleak.settings import AuditSettings

    assert AuditSettings().trust_remote_code is False
    config = tmp_path / "gleak.toml"
    config.write_text("trust-remote-code = true\n")
    r = gleak("audit", tmp_path, "--model", tmp_path, "--config", config)
    assert r.exit_code == 2 and "--trust-remote-code" in r.stderr
