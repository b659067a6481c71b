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
    """Tokenised examples: ``input_ids`` and ``attention_mask`` int64 [N, T], padded on ``padding_side``, and what
    :func:`tokenize` did to fit the model."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    padding_side: str
    pad_token_id: int
    truncation: int | None = None  # the length examples were truncated to (max_length or the model's positions)
    truncated: int = 0  # how many examples were longer and cut to it
    notices: tuple[str, ...] = ()  # one line each: truncation, the pad token used


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
        raise GleakError(f"{show(p)} holds no examples (" + ("every line is blank)" if lines else "it is empty)"))
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


def tokenize(tokenizer: Any, texts: list[str] | tuple[str, ...], max_length: int | None, *,
             positions: int | None = None, vocab_size: int | None = None) -> TokenBatch:
    """``texts`` through ``tokenizer`` (a transformers tokenizer), truncated and padded together to the longest on
    the tokenizer's padding side, checked against the model before any forward pass (docs/models.md, "Text
    inputs, checked before any work"):

    * length: truncated to ``max_length`` tokens when given, and never past the model's ``positions`` (a longer
      ``max_length`` is cut to them); examples cut short are counted in a notice. Each line is cut to
      :data:`CHARS_PER_TOKEN` characters per token kept before tokenising (:func:`_encode`), so a line of a million
      characters costs what its first tokens cost;
    * vocabulary: a tokenizer with more tokens than the model's ``vocab_size`` embedding rows is refused, naming
      both; so is any token id ≥ ``vocab_size``;
    * padding: a tokenizer without a pad token, or whose pad token lies outside the model's vocabulary (transformers
      5 may add one at id = vocab size), pads with its end-of-sequence token and says so; without one either, it is
      refused. Pads are masked out of the loss either way."""
    pad_id, pad_notice = _pad_token(tokenizer, vocab_size)
    if vocab_size is not None:
        _check_tokenizer_size(tokenizer, vocab_size, pad_id)
    notices: list[str] = []
    limit = max_length
    if positions is not None and (limit is None or limit > positions):
        if limit is not None:
            notices.append(f"max_length {limit:,} is more than the model's {positions:,} positions: truncated to "
                           f"{positions:,} tokens")
        limit = positions
    side = str(getattr(tokenizer, "padding_side", "right"))
    rows, cut = _encode(tokenizer, list(texts), limit)
    empty = [i for i, ids in enumerate(rows) if not ids]
    if empty:
        raise GleakError(f"example {empty[0] + 1} tokenises to no tokens")
    if vocab_size is not None:
        check_token_ids(rows, vocab_size, "the tokenizer's output")
    if cut:
        why = "max_length" if limit == max_length else "the model's positions"
        notices.append(f"{cut} of {len(rows)} example(s) longer than {limit:,} tokens: truncated to {limit:,} ({why})")
    width = max(len(ids) for ids in rows)
    if pad_notice is not None and any(len(ids) < width for ids in rows):
        notices.append(pad_notice)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, row in enumerate(rows):
        if side == "left":
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        else:
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
    return TokenBatch(input_ids=ids, attention_mask=mask, padding_side=side, pad_token_id=int(pad_id),
                      truncation=limit, truncated=cut, notices=tuple(notices))


def check_token_ids(rows: list[list[int]] | torch.Tensor, vocab_size: int, where: str) -> None:
    """Every token id in ``rows`` (lists of ids, or an int tensor) names one of the model's ``vocab_size`` embedding
    rows: one line otherwise, before a forward pass would index past them."""
    top = (int(rows.max()) if rows.numel() else -1) if isinstance(rows, torch.Tensor) else max(
        (max(r) for r in rows if r), default=-1)
    if top >= vocab_size:
        raise GleakError(f"{where} holds token id {top:,}, but the model's vocabulary has {vocab_size:,} tokens "
                         f"(ids 0–{vocab_size - 1:,})")


def check_token_batch_fits(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int,
                           positions: int | None, where: str) -> None:
    """A recorded token batch (a text capture's ground truth) against the model: its real tokens (mask 1) within
    the vocabulary, and no sequence longer than ``positions`` (give it for models with learned position embeddings,
    which cannot have seen a longer one). One line otherwise."""
    check_token_ids(input_ids[attention_mask.bool()], vocab_size, where)
    longest = int(attention_mask.sum(dim=1).max()) if attention_mask.numel() else 0
    if positions is not None and longest > positions:
        raise GleakError(f"{where} holds a sequence of {longest:,} tokens, but the model has {positions:,} positions: "
                         "it cannot have been made with this model")


def _pad_token(tokenizer: Any, vocab_size: int | None) -> tuple[int, str | None]:
    """The id pads get, and the notice that says it is the end-of-sequence token (None: the tokenizer's own)."""
    pad, eos = _token_id(tokenizer, "pad_token_id"), _token_id(tokenizer, "eos_token_id")

    def inside(token: int | None) -> bool:
        return token is not None and (vocab_size is None or token < vocab_size)

    if inside(pad):
        assert pad is not None
        return pad, None
    why = ("no pad token" if pad is None else
           f"a pad token (id {pad:,}) outside the model's vocabulary of {vocab_size:,} tokens (an added token)")
    if not inside(eos):
        eos_why = "no end-of-sequence token" if eos is None else f"an end-of-sequence token (id {eos:,}) outside it too"
        raise GleakError(f"the tokenizer has {why} and {eos_why} to pad a batch with: give the model folder a "
                         "tokenizer with a pad token in the model's vocabulary")
    assert eos is not None
    return eos, f"the tokenizer has {why}: pads are its end-of-sequence token (id {eos:,}), masked out of the loss"


def _token_id(tokenizer: Any, name: str) -> int | None:
    value = getattr(tokenizer, name, None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _check_tokenizer_size(tokenizer: Any, vocab_size: int, pad_id: int) -> None:
    """A tokenizer larger than the model's embedding can emit ids the model cannot look up: refused (a pad token
    added past the vocabulary is not counted: :func:`_pad_token` replaced it)."""
    try:
        size = len(tokenizer)
    except TypeError:  # not a transformers tokenizer: its ids are checked after tokenising
        return
    added_pad = _token_id(tokenizer, "pad_token_id")
    if added_pad is not None and added_pad >= vocab_size and added_pad != pad_id:
        size -= 1
    if size > vocab_size:
        raise GleakError(f"the tokenizer has {size:,} tokens but the model's embedding only {vocab_size:,}: ids "
                         f"{vocab_size:,} and above have no embedding (is the tokenizer from another model?)")


CHARS_PER_TOKEN = 16  # a line is cut to this many characters per token kept (plus the margin) before tokenising
MIN_CHARS = 4096  # ... and never below this many
MARGIN = 16  # tokens past the limit that the cut text must still give, so the cut cannot reach the kept tokens


def _encode(tokenizer: Any, texts: list[str], limit: int | None) -> tuple[list[list[int]], int]:
    """The token ids of each text, truncated to ``limit`` (the tokenizer's own truncation, special tokens kept),
    and how many were cut short.

    The tokenizer reads the whole line even when it truncates (a million characters take seconds in one
    uninterruptible call), so each line is first cut to ``CHARS_PER_TOKEN · (limit + MARGIN)`` characters (at least
    ``MIN_CHARS``; the end a tokenizer truncating on the left keeps). A cut only changes the tokens around it; when
    the cut text still gives ``limit + MARGIN`` tokens those are past the ``limit`` kept, so the kept ids are the
    whole line's. A cut line that gives fewer (an average token longer than ``CHARS_PER_TOKEN`` characters) is
    tokenised whole."""
    if limit is None:
        return _call(tokenizer, texts, None), 0
    chars = max(CHARS_PER_TOKEN * (limit + MARGIN), MIN_CHARS)
    left = getattr(tokenizer, "truncation_side", "right") == "left"
    source = [t[-chars:] if left else t[:chars] for t in texts]
    rows = _call(tokenizer, source, limit + MARGIN)
    whole = [i for i, t in enumerate(texts) if len(t) > chars and len(rows[i]) < limit + MARGIN]
    if whole:
        for i, ids in zip(whole, _call(tokenizer, [texts[i] for i in whole], limit + MARGIN), strict=True):
            source[i], rows[i] = texts[i], ids
    long = [i for i, ids in enumerate(rows) if len(ids) > limit]
    if long:
        for i, ids in zip(long, _call(tokenizer, [source[i] for i in long], limit), strict=True):
            rows[i] = ids
    return rows, len(long)


def _call(tokenizer: Any, texts: list[str], limit: int | None) -> list[list[int]]:
    """The tokenizer on ``texts`` (no padding; truncated to ``limit`` when given), errors in one line. Texts go in
    calls of about :data:`CALL_CHARS` characters: a call cannot be interrupted, so Ctrl-C waits for one call at
    most, never for the whole batch."""
    rows: list[list[int]] = []
    for chunk in _chunks(texts):
        try:
            encoded = tokenizer(chunk, truncation=limit is not None, max_length=limit, padding=False,
                                return_attention_mask=False)
        except Exception as exc:
            raise GleakError(f"the tokenizer failed: {type(exc).__name__}: {shorten(str(exc), 160)}") from None
        rows.extend(list(map(int, ids)) for ids in encoded["input_ids"])
    return rows


CALL_CHARS = 1 << 16  # characters per tokenizer call (a fast tokenizer reads about 0.1–1 M characters a second)


def _chunks(texts: list[str]) -> list[list[str]]:
    """``texts`` in order, in runs of at most :data:`CALL_CHARS` characters (a longer text alone)."""
    out: list[list[str]] = []
    size = 0
    for text in texts:
        if not out or size + len(text) > CALL_CHARS:
            out.append([])
            size = 0
        out[-1].append(text)
        size += len(text)
    return out
