"""Issue 44, part 6: what a new user's trial of the language-model path tripped over. Tables fit 80 columns or fold
a column into lines below (never drop one); `gleak simulate --help` shows the --peft syntax whole; the missing text
extra names an install that works from a clone; `gleak labels -o` writes the JSON report its error points to; a
recovered sequence is `exact` only when every token is (exact up to the last token is its own field); the audit's
columns are named for tokens on a language model's capture."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gleak.attacks.base import TextOutput
from gleak.attacks.tokens.view import TextModelSpec
from gleak.cli import app
from gleak.errors import GleakError
from gleak.report.formats import get_format
from gleak.report.formats.console import print_audit, print_labels, print_text
from gleak.report.model import (
    CaptureReport,
    ChanceScores,
    FileRef,
    LabelResult,
    LabelsReport,
    LossInfo,
    RecoveredSequence,
    Report,
    SentenceResult,
    TextReport,
    TokenResult,
)
from gleak.runs.text import sequence_exactness

from .conftest import FEDSGD, LENET, ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

NOTES = ROOT / "samples" / "text" / "notes.txt"
NOTES_LLAMA = ROOT / "samples" / "text" / "notes-llama"
TABLE_LINE = re.compile(r"^[┃│┏┡└]")


def cli(*args: object, columns: int = 80) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)})
    return result.exit_code, result.stdout, result.stderr


def rendered(print_fn: object, *args: object, width: int = 80) -> str:
    console = Console(width=width, record=True, force_terminal=False, file=io.StringIO())
    print_fn(console, *args)  # type: ignore[operator]
    return console.export_text()


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if TABLE_LINE.match(line)]


def header_cells(text: str) -> list[str]:
    """The words of the table's header rows (a header cell may wrap onto two lines)."""
    lines = [line for line in text.splitlines() if line.startswith("┃")]
    return " ".join(lines).replace("┃", " ").split()


# --- tables at 80 columns ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def notes_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's LM quick start: one FedSGD step of the shipped LLaMA-style model on 8 notes of 32 tokens."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("notes") / "notes_b8.safetensors"
    code, _, err = cli("simulate", "--model", NOTES_LLAMA, "--data", NOTES, "--batch-size", 8, "--max-length", 32,
                       "--seed", 7, "-o", out)
    assert code == 0, err
    return out


def test_the_token_table_keeps_every_column_at_80_columns_and_folds_the_methods(notes_capture: Path) -> None:
    code, out, err = cli("labels", notes_capture, "--model", NOTES_LLAMA, "--format", "json")
    assert code == 0, err
    results = json.loads(out)["results"]
    code, narrow, err = cli("labels", notes_capture, "--model", NOTES_LLAMA)
    assert code == 0, err
    rows = table_lines(narrow)
    assert rows and max(len(line) for line in rows) <= 80, narrow
    assert header_cells(narrow) == ["attack", "tokens", "prec.", "recall", "F1", "chance", "sens."]
    for r in results:  # every attack whole on one row; every method whole, below the table
        assert any(f"│ {r['attack']} " in line for line in rows), (r["attack"], narrow)
        if r.get("method"):
            assert f"{r['attack']}: {r['method']}" in narrow, narrow
    assert "…" not in narrow
    union = next(r for r in results if r["attack"] == "union")
    row = next(line for line in rows if "│ union " in line)
    assert row.split("│")[-2].strip() == f"{union['scores']['sensitive_recall']:.3f}"  # the last column: sens.
    code, wide, _ = cli("labels", notes_capture, "--model", NOTES_LLAMA, columns=200)
    assert code == 0 and "method" in header_cells(wide) and "sens." in header_cells(wide)


def labels_report(calibrated: bool) -> LabelsReport:
    counts = [2, 3, 4, 6, 4, 1, 5, 0, 3, 4]
    confidence = {"calibrated": True, "half_width": 1, "expected_iacc": 0.97, "chance_iacc": 0.71,
                  "informative": True, "composition": "uniform"} if calibrated else None
    results = [LabelResult(attack="idlg", status="not_applicable", seconds=0.0, reason="single-sample attack",
                           warnings=[])]
    results += [LabelResult(attack=name, status="ok", seconds=0.0123, counts=counts, warnings=[],
                            scores={"iacc": 1.0, "cacc": 1.0, "exact": 1.0, "chance_iacc": 0.7},
                            confidence=confidence) for name in ("ilrg", "llg-star", "posterior")]
    return LabelsReport.build({
        "capture": "fedsgd_b32.safetensors", "kind": "gradient", "batch_size": 32, "local_steps": 1, "num_classes": 10,
        "last_layer": "fc3", "gradient_note": None, "truth_file": None, "model_check": None, "model_mode": None,
        "loss": LossInfo(name="cross_entropy", reduction="mean", temperature=1.0, label_smoothing=0.0,
                         focal_gamma=2.0, focal_alpha=1.0).model_dump(),
        "truth_counts": counts, "chance": ChanceScores(iacc=0.7, cacc=0.87).model_dump(),
        "results": [r.model_dump() for r in results], "threads": 1, "truth_soft_label": None,
        "ignored_options": []})


@pytest.mark.parametrize("calibrated", [False, True], ids=["scored", "calibrated"])
def test_the_labels_table_fits_80_columns_folding_counts_then_times(calibrated: bool) -> None:
    report = labels_report(calibrated)
    text = rendered(print_labels, report)
    rows = table_lines(text)
    assert max(len(line) for line in rows) <= 80, text
    scores = ["iAcc", "cAcc", "exact", "chance"] + (["90", "%", "±", "expected/chance"] if calibrated else [])
    assert set(scores) <= set(header_cells(text)), text
    for name in ("idlg", "ilrg", "llg-star", "posterior"):  # names whole, never cut to '…'
        assert any(f"│ {name} " in line for line in rows), text
    assert "…" not in text
    if calibrated:  # nine columns do not fit: the counts and the times go below, one line per attack
        assert "class×count" not in text and "time" not in header_cells(text)
        assert "ilrg (12.3 ms): 0×2 1×3 2×4 3×6 4×4 5×1 6×5 8×3 9×4" in text
        assert "0.97/0.71 uni" in "".join(rows)
    else:  # they fit: the counts wrap inside their column
        assert "class×count" in text and "time" in header_cells(text)
    wide = rendered(print_labels, report, width=200)
    assert "class×count" in wide and "time" in header_cells(wide)  # a wide terminal folds nothing


def text_capture(path: str, tokens: bool = True) -> CaptureReport:
    return CaptureReport(
        capture=FileRef(path=path), kind="gradient", batch_size=8,
        tokens=[TokenResult(attack="token-bag", status="ok", seconds=0.1, warnings=[],
                            scores={"recall": 1.0, "precision": 1.0, "chance_recall": 0.24})] if tokens else None,
        sentences=SentenceResult(attack="dager", status="ok", seconds=0.2, sequences=8, exact=0, exact_up_to_last=8,
                                 scores={"rouge1": 0.97, "exact_match": 0.0, "exact_up_to_last": 1.0}))


def image_capture(path: str) -> CaptureReport:
    from gleak.report.model import AttackEntry

    return CaptureReport(capture=FileRef(path=path), kind="gradient", batch_size=8, chance={"iacc": 0.4},
                         attacks=[AttackEntry(attack="llg", task="labels", status="ok", counts=[1],
                                              scores={"iacc": 1.0})])


def test_the_audit_table_names_its_columns_for_tokens_on_text_captures() -> None:
    text = Report(gleak_version="0", captures=[text_capture("runs/round-1/client-a.safetensors")])
    shown = rendered(print_audit, text)
    heads = header_cells(shown)
    assert {"tokens", "recall/chance", "sentences"} <= set(heads) and not {"labels", "iAcc/chance"} & set(heads)
    rows = table_lines(shown)
    assert max(len(line) for line in rows) <= 80 and "1.00/0.24" in shown and "ROUGE-1 0.97" in shown
    image = Report(gleak_version="0", captures=[image_capture("c.safetensors")])
    heads = header_cells(rendered(print_audit, image))
    assert {"labels", "iAcc/chance", "images"} <= set(heads) and "tokens" not in heads
    both = Report(gleak_version="0", captures=[image_capture("c.safetensors"), text_capture("t.safetensors")])
    assert {"labels/tokens", "images/sentences"} <= set(header_cells(rendered(print_audit, both, width=120)))
    md = get_format("md").render(text)
    assert "| Best token attack | Token recall |" in md and "Best label attack" not in md and "iAcc" not in md
    assert "0/8 exact, 8/8 up to the last token" in md
    assert "Best label attack | iAcc" in get_format("md").render(image)


# --- help, install hints, the JSON report an error points to ----------------------------------------------------


@pytest.mark.parametrize(("command", "syntax"), [("simulate", "--peft lora:r=R[,alpha=A,target=M1+M2,dropout=P]"),
                                                ("sweep", "--defense dpsgd:max_grad_norm=1=0.5,1,2")])
def test_help_shows_an_options_syntax_whole_at_80_columns(command: str, syntax: str) -> None:
    # a process of its own: Typer reads TERMINAL_WIDTH once, when first imported, so an in-process run would take
    # whatever width an earlier test left
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "FORCE_COLOR")} | {"COLUMNS": "80"}
    run = subprocess.run([sys.executable, "-m", "gleak", command, "--help"], capture_output=True, text=True, env=env,
                         timeout=120)
    code, out = run.returncode, run.stdout
    assert code == 0, run.stderr
    # not cut to '…' in the options' narrow help column; a line may break at a space inside it (where depends on
    # Rich's version), never inside a word
    assert re.search(r"\s+".join(map(re.escape, syntax.split())), out), out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_missing_text_extra_names_an_install_that_works_from_a_clone(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    # gleak is on no package index: no message may send the user to 'gleak[text]' there
    sources = [p.read_text() for p in (ROOT / "gleak").rglob("*.py")]
    assert not [s for s in sources if "pip install 'gleak[" in s or 'pip install "gleak[' in s]
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    code, _, err = cli("simulate", "--model", NOTES_LLAMA, "--data", NOTES, "-o", tmp_path / "c.safetensors")
    assert code == 2 and err.count("\n") == 1, err
    assert "pip install '.[text]'" in err and "uv tool install '.[text]'" in err and "gleak[text]" not in err
    monkeypatch.setitem(sys.modules, "rouge_score", None)
    from gleak.metrics.text import text_scores

    with pytest.raises(GleakError, match=re.escape("pip install '.[text]'")):
        text_scores([[1, 2]], [[1, 2]], vocab_size=5)


@pytest.mark.parametrize("format", ["table", "json"])
def test_labels_writes_the_json_report_its_error_points_to(tmp_path: Path, format: str) -> None:
    out = tmp_path / "labels.json"
    code, stdout, err = cli("labels", FEDSGD, "--model", LENET, "-a", "softlabel", "--format", format, "-o", out)
    assert code == 2 and err.count("\n") == 1, err
    assert "JSON report" in err and str(out) in err.replace("\n", "")
    written = json.loads(out.read_text())  # the report the error points to, with the reason
    assert written["results"][0]["status"] == "not_applicable" and "B = 32" in written["results"][0]["reason"]
    if format == "json":
        assert json.loads(stdout) == written


# --- exact, and exact up to the last token --------------------------------------------------------------------


def spec(tied: bool = False, kind: str = "gradient", task: str = "causal_lm") -> TextModelSpec:
    return TextModelSpec(model_type="llama", vocab_size=100, hidden_size=64, tie_word_embeddings=tied,
                         task=task, kind=kind)  # type: ignore[arg-type]


def dager_output(**diagnostics: object) -> TextOutput:
    return TextOutput(sequences=[[5, 6, 7], [8, 9]], exact=[True, False],
                      diagnostics={"last_from_head": [True, True], **diagnostics})


def test_a_sequence_is_exact_only_when_its_last_token_is_proven_too() -> None:
    # an untied head's exact solve (weights 1) proves the last tokens; the prefix flag still gates
    assert sequence_exactness(dager_output(last_token_scores=[1.0, 1.0]), spec()) == ([True, False], [True, False])
    # a solve far from 1 proves nothing: exact up to the last token only
    assert sequence_exactness(dager_output(last_token_scores=[0.6, 1.0]), spec()) == ([False, False], [True, False])
    # a tied head: the recomputed gradient confirms the whole batch, or nothing
    tied = spec(tied=True)
    assert sequence_exactness(dager_output(last_token_scores=[0.6, 0.9], last_tokens_distance=[0.02, 0.0]),
                              tied) == ([True, False], [True, False])
    assert sequence_exactness(dager_output(last_token_scores=[1.0, 1.0], last_tokens_distance=[0.02, 0.01]),
                              tied) == ([False, False], [True, False])
    # a multi-step update's head is no single gradient; a LoRA update's sequences lack their last token
    assert sequence_exactness(dager_output(last_token_scores=[1.0, 1.0]), spec(kind="update"))[0] == [False, False]
    lora = TextOutput(sequences=[[5, 6]], exact=[True], diagnostics={"last_from_head": [False]})
    assert sequence_exactness(lora, spec()) == ([False], [True])
    # every position tested (an encoder, a classifier) or none (the optimisation baseline): the flag is both
    encoder = TextOutput(sequences=[[5, 6]], exact=[True], diagnostics={"last_from_head": [False]})
    assert sequence_exactness(encoder, spec(task="sequence_classification")) == ([True], [True])
    assert sequence_exactness(TextOutput(sequences=[[5]], exact=[False]), spec()) == ([False], [False])


def test_the_console_says_exact_and_exact_up_to_the_last_token_apart() -> None:
    report = TextReport.build({
        "capture": "c.safetensors", "kind": "gradient", "model_type": "llama", "vocab_size": 100, "batch_size": 2,
        "local_steps": 1, "lora": True, "attack": "dager", "status": "ok", "seconds": 0.3,
        "sequences": [RecoveredSequence(token_ids=[5, 6], exact=False, exact_up_to_last=True).model_dump()] * 2,
        "truth_file": "c.truth.safetensors", "truth_sequences": 2, "model_check": None, "threads": 1,
        "scores": {"rouge1": 0.96, "exact_match": 0.0, "exact_up_to_last": 1.0, "token_accuracy": 0.92}})
    text = rendered(print_text, report, [])
    assert "0 exact (every token proven), 2 more exact up to the last token" in text
    assert "up to last" in header_cells(text) or {"up", "to", "last"} <= set(header_cells(text))
    recovered = next(line for line in table_lines(text) if "recovered" in line).split("│")
    assert [c.strip() for c in recovered[5:7]] == ["0.000", "1.000"]  # exact, then up to last
    assert max(len(line) for line in table_lines(text)) <= 80


def test_reconstruct_flags_agree_with_the_truth_on_lora_and_full_captures(tmp_path: Path) -> None:
    """On the shipped model: a LoRA update gives every note but its last token (exact up to the last, never exact),
    a full FedSGD gradient every token (exact); each flag checked against the truth's scores."""
    pytest.importorskip("transformers")
    for name, extra in (("lora", ["--peft", "lora:r=32,target=q_proj+k_proj+v_proj"]), ("full", [])):
        cap = tmp_path / f"{name}.safetensors"
        code, _, err = cli("simulate", "--model", NOTES_LLAMA, "--data", NOTES, "-b", 2, "--max-length", 16,
                           "--seed", 7, "-o", cap, *extra)
        assert code == 0, err
        code, out, err = cli("reconstruct", cap, "--model", NOTES_LLAMA, "-o", tmp_path / name, "--format", "json")
        assert code == 0, err
        sequences = json.loads(out)["sequences"]
        assert len(sequences) == 2
        for seq in sequences:
            assert seq["scores"]["exact"] == float(seq["exact"]) or not seq["exact"], seq
            assert seq["scores"]["exact_up_to_last"] == 1.0 or not seq["exact_up_to_last"], seq
        if name == "lora":
            assert not any(s["exact"] for s in sequences) and all(s["exact_up_to_last"] for s in sequences)
            assert all(s["scores"]["exact"] == 0.0 for s in sequences)
        else:
            assert all(s["exact"] and s["scores"]["exact"] == 1.0 for s in sequences)
        written = (tmp_path / name / "sequences.txt").read_text().splitlines()[1:]
        assert [line.split("\t")[1] for line in written] == ["exact" if name == "full" else "to-last"] * 2
