"""The shipped synthetic text sample (samples/text): the notes are what scripts/make_text_samples.py makes from the
recorded seed, the manifest describes the files, and the whole sample stays small. No transformers needed."""

from __future__ import annotations

import importlib.util
import json
import re
from types import ModuleType

from .conftest import ROOT


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_text_samples", ROOT / "scripts" / "make_text_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_text_sample_matches_its_script_and_the_manifest() -> None:
    script = load_script()
    entry = json.loads((ROOT / "samples" / "manifest.json").read_text())["text"]
    notes = ROOT / entry["notes"]
    lines = notes.read_text(encoding="utf-8").splitlines()
    assert lines == script.make_notes(entry["seed"]) and len(lines) == entry["notes_lines"]
    model = ROOT / entry["model"]
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == [entry["architecture"]] and config["tie_word_embeddings"] is False
    assert config["num_hidden_layers"] == entry["layers"] and config["hidden_size"] == entry["hidden"]
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == config["vocab_size"] == entry["vocab_size"]
    # the sensitive tokens the token attacks score are in the vocabulary: names, record numbers, dates
    for line in lines[:20]:
        record = re.search(r"\. (\w+) (\w+), MRN (\d+), DOB (\d+)-", line)
        assert record is not None and all(word in vocab for word in record.groups()), line
    files = [notes, *(p for p in model.iterdir() if p.is_file())]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in files}
    assert sum(p.stat().st_size for p in files) < 2_000_000
