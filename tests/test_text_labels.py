"""`gleak labels` on a language model's capture: the token attacks through the command line, scored against the
truth, and the leak never printed (ids and counts only, decoded text in the JSON only with --show-text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from gleak.cli import app  # noqa: E402

from .conftest import ROOT  # noqa: E402
from .text_models import NAMES, build_notes_and_models  # noqa: E402


def gleak(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def notes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Synthetic notes (fake names, record numbers, dates), a word-level tokenizer trained on them, and a tiny
    random LLaMA-style (untied) and GPT-2-style (tied) model, each a Hugging Face folder."""
    return build_notes_and_models(tmp_path_factory.mktemp("text"))


def simulate(notes: Path, model: Path, out: Path, batch: int, length: int) -> Path:
    code, _, err = gleak("simulate", "--model", model, "--data", notes, "-b", batch, "--max-length", length,
                         "--seed", 5, "-o", out)
    assert code == 0, err
    return out


def scores_of(report: dict[str, object], attack: str) -> dict[str, float]:
    result = next(r for r in report["results"] if r["attack"] == attack)  # type: ignore[attr-defined, index]
    assert result["status"] == "ok", result
    return dict(result["scores"])


def test_untied_tokens_are_recovered_and_never_printed(notes: tuple[Path, Path, Path], tmp_path: Path) -> None:
    import jsonschema

    text, llama, _ = notes
    capture = simulate(text, llama, tmp_path / "c.safetensors", batch=8, length=16)
    code, out, err = gleak("labels", capture, "--model", llama, "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    jsonschema.validate(report, json.loads((ROOT / "gleak" / "report" / "schema.json").read_text()))
    assert report["report"] == "tokens" and report["show_text"] is False
    bag, targets = scores_of(report, "token-bag"), scores_of(report, "next-tokens")
    assert bag["recall"] == 1.0 and bag["precision"] == 1.0 and bag["chance_f1"] < 0.3
    assert targets["recall"] == 1.0 and targets["precision"] == 1.0
    assert report["sensitive_tokens"] > 0 and bag["sensitive_recall"] == 1.0
    # the union covers every token of the batch: the last tokens come from the head, the first from the embedding
    union = scores_of(report, "union")
    assert report["token_scores"] == union and union["recall"] == 1.0 and union["precision"] == 1.0
    distinct = report["truth_tokens"]
    assert len(report["tokens"]) == distinct["all"] > max(distinct["inputs"], distinct["targets"]), distinct
    # the leak stays out of every output without --show-text: ids and counts only
    assert not [n for n in NAMES if n in out]
    code, table, _ = gleak("labels", capture, "--model", llama)
    assert code == 0 and "token-bag" in table and not [n for n in NAMES if n in table]
    code, shown, _ = gleak("labels", capture, "--model", llama, "--format", "json", "--show-text")
    assert code == 0 and [n for n in NAMES if n in shown]  # asked for: the JSON holds the names
    code, table, _ = gleak("labels", capture, "--model", llama, "--show-text")
    assert code == 0 and not [n for n in NAMES if n in table] and "JSON report only" in table


def test_tied_gpt2_bag_from_the_span_residual(notes: tuple[Path, Path, Path], tmp_path: Path) -> None:
    text, _, gpt2 = notes
    capture = simulate(text, gpt2, tmp_path / "g.safetensors", batch=4, length=12)
    code, out, err = gleak("labels", capture, "--model", gpt2, "--format", "json")
    assert code == 0, err
    result = next(r for r in json.loads(out)["results"] if r["attack"] == "token-bag")
    assert result["method"] == "span-residual + first block", result  # the first block's span test checked the cut
    assert result["diagnostics"]["first_block"]["proven"] >= 1, result["diagnostics"]
    assert result["scores"]["recall"] >= 0.99 and result["scores"]["precision"] >= 0.95, result["scores"]


def test_image_only_options_and_a_missing_model_are_one_line(notes: tuple[Path, Path, Path], tmp_path: Path) -> None:
    text, llama, _ = notes
    capture = simulate(text, llama, tmp_path / "c.safetensors", batch=2, length=8)
    for args, words in ((["--model", llama, "--confidence", "4"], "--confidence calibrates"),
                        (["--model", llama, "--augmentation", "mixup"], "--augmentation applies to image"),
                        ([], "needs its model: --model DIR")):
        code, _, err = gleak("labels", capture, *args)
        assert code == 2 and err.count("\n") == 1 and words in err, err
