"""Text data for a simulated client: ``.txt`` (one example per line) and ``.jsonl`` (one JSON object per line with
a ``"text"`` field, and an integer ``"label"`` for a sequence classifier), tokenised with the model folder's
tokenizer. Files are size-checked before they are read (:func:`gleak.io.check_input_file`) and parsed as plain
text or JSON only: nothing in them is run."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gleak.errors import GleakError, shorten
from gleak.io import check_input_file, show

TEXT_SUFFIXES = (".txt", ".jsonl")
MAX_TEXT_BYTES = 1 << 30  # one text data file, 1 GiB
MAX_LINE_CHARS = 1 << 20  # one example, 1 Mi characters (a tokenizer truncates it anyway)


@dataclass(frozen=True)
class TextData:
    """Examples of text, and a class per example when the file gave one (``.jsonl`` with ``"label"``)."""

    texts: tuple[str, ...]
    labels: tuple[int, ...] | None
    path: Path

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class TokenBatch:
    """Tokenised examples: ``input_ids`` and ``attention_mask`` int64 [N, T], padded on ``padding_side``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    padding_side: str
    pad_token_id: int


def is_text_data(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a text data file (by its suffix: .txt or .jsonl)."""
    return Path(path).suffix.lower() in TEXT_SUFFIXES


def load_text_data(path: str | os.PathLike[str]) -> TextData:
    """Read a ``.txt`` (one example per line; blank lines skipped) or ``.jsonl`` file (objects with ``"text"`` and
    optionally an integer ``"label"``, on every line or none)."""
    p = check_input_file(path, "text data", MAX_TEXT_BYTES)
    suffix = p.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise GleakError(f"{show(p)}: text data must be a .txt (one example per line) or .jsonl file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise GleakError(f"{show(p)}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise GleakError(f"cannot read text data {show(p)}: {exc.strerror or exc}") from None
    texts: list[str] = []
    labels: list[int | None] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise GleakError(f"{show(p)}:{number}: a line of {len(line):,} characters; at most {MAX_LINE_CHARS:,}")
        if suffix == ".txt":
            texts.append(line)
            continue
        text, label = _json_example(line, f"{show(p)}:{number}")
        texts.append(text)
        labels.append(label)
    if not texts:
        raise GleakError(f"{show(p)} holds no examples (every line is blank)")
    given = [label for label in labels if label is not None]
    if given and len(given) != len(labels):
        raise GleakError(f"{show(p)}: some lines have a \"label\" and some do not; give one on every line or none")
    return TextData(texts=tuple(texts), labels=tuple(given) if given else None, path=p)


def _json_example(line: str, where: str) -> tuple[str, int | None]:
    try:
        obj: Any = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise GleakError(f"{where}: not a JSON object ({shorten(str(exc), 80)})") from None
    if not isinstance(obj, dict):
        raise GleakError(f"{where}: each line must be a JSON object with a \"text\" field, got "
                         f"{type(obj).__name__}")
    text = obj.get("text")
    if not isinstance(text, str):
        raise GleakError(f"{where}: each line must be a JSON object with a \"text\" field (a string); "
                         f"this one has {shorten(', '.join(map(str, obj)) or 'no fields', 60)}")
    label = obj.get("label")
    if label is not None and (not isinstance(label, int) or isinstance(label, bool) or label < 0):
        raise GleakError(f"{where}: \"label\" must be a class index (an integer ≥ 0), got {shorten(repr(label), 40)}")
    return text, label


def tokenize(tokenizer: Any, texts: list[str] | tuple[str, ...], max_length: int | None) -> TokenBatch:
    """``texts`` through ``tokenizer`` (a transformers tokenizer), truncated to ``max_length`` tokens when given and
    padded together to the longest on the tokenizer's padding side. A tokenizer without a pad token pads with its
    end-of-sequence token (GPT-2's convention); the pads are masked out of the loss either way."""
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
        if pad_id is None:
            raise GleakError("the tokenizer has neither a pad nor an end-of-sequence token to pad a batch with")
    side = str(getattr(tokenizer, "padding_side", "right"))
    try:
        encoded = tokenizer(list(texts), truncation=max_length is not None, max_length=max_length,
                            padding=False, return_attention_mask=False)
    except Exception as exc:
        raise GleakError(f"the tokenizer failed: {type(exc).__name__}: {shorten(str(exc), 160)}") from None
    rows: list[list[int]] = [list(map(int, ids)) for ids in encoded["input_ids"]]
    empty = [i for i, ids in enumerate(rows) if not ids]
    if empty:
        raise GleakError(f"example {empty[0] + 1} tokenises to no tokens")
    width = max(len(ids) for ids in rows)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, row in enumerate(rows):
        if side == "left":
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        else:
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
    return TokenBatch(input_ids=ids, attention_mask=mask, padding_side=side, pad_token_id=int(pad_id))
