"""DAGER on sequence classifiers: decoders (GPT-2 style, the paper's main setting: every token, the last included,
lies in the spans) and encoders (BERT style, the paper's Alg. 3: whole sequences searched, since each position
sees every token), against the true batch; the reason given when the second block is a classifier's last; and
``gleak simulate``, ``gleak reconstruct`` and ``gleak audit`` on a BERT classifier's capture from the command
line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from typer.testing import CliRunner

from gleak.attacks.text.dager import run_dager
from gleak.attacks.text.encoder import is_bidirectional
from gleak.attacks.tokens.inputs import position_offset
from gleak.capture import model_logits, token_loss
from gleak.cli import app
from gleak.errors import GleakError

from .test_text_models import SENTENCES
from .token_models import spec_of, token_batch

VOCAB = 400


def bert(layers: int = 3, d: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers, num_attention_heads=2,
        max_position_embeddings=64, pad_token_id=0, num_labels=3)).eval()


def gpt2_classifier(layers: int = 3, d: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        n_layer=layers, n_embd=d, n_head=2, vocab_size=VOCAB, n_positions=64, pad_token_id=0,
        num_labels=3)).eval()


def classify(model: torch.nn.Module, batch: int, seed: int, lengths: tuple[int, int] = (5, 8), pad: int = 0,
             **kw: int):
    """(sequences, run_dager's result) for a FedSGD classification gradient on a random batch."""
    ids, mask = token_batch(batch, VOCAB, lengths, seed=seed, pad=pad)
    labels = torch.arange(batch) % 3
    model.zero_grad()
    token_loss(model_logits(model(input_ids=ids, attention_mask=mask)), ids, mask, labels,
               "sequence_classification").backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    spec = dataclasses.replace(spec_of(model, batch_size=batch, max_length=int(ids.shape[1])),
                               task="sequence_classification")
    found = run_dager(model, spec, grads, head=None, head_scale=1.0, stored_adapter=None, missing_global="none",
                      min_gap=100.0, **kw)
    truth = [[t for t, m in zip(r, k, strict=True) if m] for r, k in zip(ids.tolist(), mask.tolist(), strict=True)]
    return truth, found


def test_an_encoder_is_told_from_a_decoder() -> None:
    b, g = bert(), gpt2_classifier()
    assert is_bidirectional(b, b.bert.encoder.layer[1].attention.self.query, VOCAB)
    assert not is_bidirectional(g, g.transformer.h[1].attn.c_attn, VOCAB)


@pytest.mark.parametrize("batch", [1, 2])
def test_a_bert_classifier_batch_comes_back_exactly(batch: int) -> None:
    truth, found = classify(bert(), batch, seed=3)
    assert sorted(found.sequences) == sorted(truth)
    assert all(found.exact) and found.diagnostics["encoder"]
    assert set(found.diagnostics["lengths_searched"].values()) == {"all"}


def roberta() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.RobertaForSequenceClassification(transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        max_position_embeddings=70, pad_token_id=1, num_labels=3)).eval()


def test_a_model_numbering_positions_from_its_pad_index_is_read_at_its_own_positions() -> None:
    """RoBERTa numbers a sequence's positions from pad index + 1 (2 here): the first-block candidates are read at
    p + 2, found by probing, not assumed."""
    r, g = roberta(), gpt2_classifier()
    assert position_offset(r, r.roberta.encoder.layer[0].attention.self.query, VOCAB) == 2
    assert position_offset(g, g.transformer.h[0].attn.c_attn, VOCAB) == 0
    truth, found = classify(r, 2, seed=3, pad=1)
    assert sorted(found.sequences) == sorted(truth) and all(found.exact)


def test_an_encoder_without_learned_positions_is_refused_in_one_line() -> None:
    """A rotary encoder (ModernBERT): one first-block set for every position, so the search would rest on orders
    only the attention tells apart (a random one passed a permuted sequence): refused, naming the reason."""
    if not hasattr(transformers, "ModernBertForSequenceClassification"):
        pytest.skip("this transformers has no ModernBERT")
    torch.manual_seed(0)
    model = transformers.ModernBertForSequenceClassification(transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        max_position_embeddings=64, pad_token_id=0, num_labels=3, global_attn_every_n_layers=1, cls_token_id=2,
        sep_token_id=3, bos_token_id=2, eos_token_id=3)).eval()
    with pytest.raises(GleakError) as err:
        classify(model, 1, seed=3)
    assert "needs learned positions" in str(err.value) and "\n" not in str(err.value)


def test_beyond_the_exhaustive_budget_the_coordinate_search_still_finds_them() -> None:
    truth, found = classify(bert(), 2, seed=3, max_combinations=8)
    assert "coordinate" in found.diagnostics["lengths_searched"].values()
    assert sorted(found.sequences) == sorted(truth)


def test_a_decoder_classifier_gives_every_token_without_a_head() -> None:
    truth, found = classify(gpt2_classifier(), 4, seed=5)
    assert sorted(found.sequences) == sorted(truth)  # the last tokens too: the pooled position reads them
    assert all(found.exact) and not any(found.last_from_head) and "encoder" not in found.diagnostics


def test_a_classifier_whose_second_block_is_its_last_says_why() -> None:
    with pytest.raises(GleakError) as err:
        classify(gpt2_classifier(layers=2), 4, seed=5)
    assert "classifier's last" in str(err.value) and "\n" not in str(err.value)


def bert_folder(folder: Path) -> Path:
    """A tiny BERT classifier with a word-level tokenizer that wraps each text in [CLS] … [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]",
                                                                                 "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", padding_side="right")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        max_position_embeddings=64, pad_token_id=0, num_labels=2)).save_pretrained(folder)
    return folder


def bert_capture(tmp_path: Path) -> tuple[Path, Path]:
    """(model folder, capture): `gleak simulate` of the BERT classifier on two labelled notes."""
    model = bert_folder(tmp_path / "bert")
    data = tmp_path / "notes.jsonl"
    data.write_text("".join(json.dumps({"text": s, "label": i % 2}) + "\n" for i, s in enumerate(SENTENCES)))
    cap = tmp_path / "c.safetensors"
    done = CliRunner().invoke(app, ["simulate", "--model", str(model), "--data", str(data), "-b", "2", "--seed",
                                    "1", "-o", str(cap)])
    assert done.exit_code == 0, done.stderr
    return model, cap


def test_gleak_reconstruct_on_a_bert_classifier_capture(tmp_path: Path) -> None:
    model, cap = bert_capture(tmp_path)
    runner = CliRunner()
    done = runner.invoke(app, ["reconstruct", str(cap), "--model", str(model), "-o", str(tmp_path / "rec"),
                               "--format", "json"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["attack"] == "dager" and report["status"] == "ok"
    assert report["scores"]["exact_match"] == 1.0 and report["scores"]["chance_rouge1"] < 0.5
    done = runner.invoke(app, ["audit", str(cap), "--model", str(model), "--format", "json", "-o",
                               str(tmp_path / "audit"), "--fail-on", "none"])
    assert done.exit_code == 0, done.stderr
    audit = json.loads((tmp_path / "audit" / "report.json").read_text())
    rules = {f["rule"]: f["severity"] for f in audit["findings"]}
    assert rules.get("GLEAK-TEXT") == "critical", rules  # the audit reads classifiers' sentences too


def test_an_attack_that_cannot_run_on_the_capture_writes_nothing(tmp_path: Path) -> None:
    """`--attack tag` on a classifier's capture: one reason, exit 2, and no output folder left behind."""
    model, cap = bert_capture(tmp_path)
    out = tmp_path / "rec"
    done = CliRunner().invoke(app, ["reconstruct", str(cap), "--model", str(model), "--attack", "tag", "-o", str(out)])
    assert done.exit_code == 2 and "sequence classifier" in done.stdout + done.stderr
    assert not out.exists() or not any(out.iterdir())
