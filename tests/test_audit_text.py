"""`gleak audit` on a language model's capture: a Hugging Face folder as --model (alone or in a folder of them), the
token attacks scored into GLEAK-TEXT-TOKENS, every report format written, and the leak (decoded text, the batch's
fake names) in none of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gleak.cli import app
from gleak.runs.audit.setup import find_models

from .conftest import ROOT
from .text_models import NAMES, build_notes_and_models

FORMATS = "table,json,html,md,sarif,junit"
OUTPUTS = ("report.json", "report.html", "report.md", "report.sarif", "junit.xml")


def gleak(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def text_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a folder holding one LLaMA-style capture of B = 8 notes beside its truth, the folder of both models)."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("text")
    notes, llama, _ = build_notes_and_models(folder)
    captures = folder / "captures"
    code, _, err = gleak("simulate", "--model", llama, "--data", notes, "-b", 8, "--max-length", 16, "--seed", 5,
                         "-o", captures / "client.safetensors")
    assert code == 0, err
    return captures, folder


def leaked(text: str) -> list[str]:
    return [name for name in NAMES if name in text]


def test_a_text_capture_is_audited_in_every_format_without_its_text(text_capture: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    import jsonschema

    captures, models = text_capture
    out = tmp_path / "audit"
    # the folder of model folders: each Hugging Face folder is one model, matched by its weights' hash
    code, stdout, stderr = gleak("audit", captures, "--model", models, "--format", FORMATS, "-o", out,
                                 "--fail-on", "high")
    assert code == 1, stderr
    assert "GLEAK-TEXT-TOKENS" in stdout and "token-bag" in stdout
    assert not leaked(stdout) and not leaked(stderr)
    for name in OUTPUTS:
        assert not leaked((out / name).read_text(encoding="utf-8")), name
    report = json.loads((out / "report.json").read_text())
    jsonschema.validate(report, json.loads((ROOT / "gleak" / "report" / "schema.json").read_text()))
    (capture,) = report["captures"]
    assert capture["status"] == "ok" and capture["model"]["path"].endswith("llama")
    bag = next(t for t in capture["tokens"] if t["attack"] == "token-bag")
    assert bag["scores"]["recall"] == 1.0 and bag["tokens"] and all(t["text"] is None for t in bag["tokens"])
    (finding,) = [f for f in report["findings"] if f["rule"] == "GLEAK-TEXT-TOKENS"]
    assert finding["severity"] in ("critical", "high") and finding["measured"] == 1.0
    assert finding["chance"] < 0.5 and "sensitive" in finding["title"]
    assert not {n["code"] for n in report["notices"]} & {"NO_AUX", "NO_TRUTH"}
    sarif = json.loads((out / "report.sarif").read_text())
    rules = {r["id"]: r for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert rules["GLEAK-TEXT-TOKENS"]["name"] == "TokenLeakage"
    junit = (out / "junit.xml").read_text()
    assert 'name="tokens"' in junit and 'type="GLEAK-TEXT-TOKENS"' in junit and 'name="images"' not in junit
    assert "token\\-bag (token recall)" in (out / "report.md").read_text()
    assert "<h3>Tokens</h3>" in (out / "report.html").read_text()


def test_without_truth_the_tokens_are_reported_not_scored(text_capture: tuple[Path, Path], tmp_path: Path) -> None:
    captures, models = text_capture
    shutil.copy(captures / "client.safetensors", tmp_path / "client.safetensors")  # its truth left behind
    code, stdout, stderr = gleak("audit", tmp_path / "client.safetensors", "--model", models / "llama",
                                 "--format", "json", "--fail-on", "low")
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["findings"] == [] and "NO_TRUTH" in {n["code"] for n in report["notices"]}
    assert any(t["tokens"] for t in report["captures"][0]["tokens"]) and not leaked(stdout)


def test_model_discovery_takes_hugging_face_folders(tmp_path: Path) -> None:
    """A model folder is one model, named directly or in a folder of them (beside plain model files)."""
    for name in ("gpt", "llama"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
        (tmp_path / "models" / name / "model.safetensors").write_bytes(b"")
    (tmp_path / "models" / "notes").mkdir()  # a plain folder is not a model
    shutil.copy(ROOT / "samples" / "models" / "lenet_untrained.safetensors", tmp_path / "models" / "lenet.safetensors")
    models = tmp_path / "models"
    assert find_models([models / "llama"]) == [models / "llama"]
    assert find_models([models]) == [models / "gpt", models / "lenet.safetensors", models / "llama"]
    assert find_models([Path(str(models / "*"))]) == [models / "gpt", models / "lenet.safetensors",
                                                       models / "llama"]


def test_whole_sequences_give_gleak_text_and_twins_give_the_expected_leak(tmp_path: Path) -> None:
    """A small batch (B = 2, 12 tokens: within the tiny model's width) comes back exactly: GLEAK-TEXT critical; the
    same capture without its truth and with --aux text: GLEAK-TEXT-EXPECTED from twin batches, never critical."""
    pytest.importorskip("transformers")
    notes, llama, _ = build_notes_and_models(tmp_path)
    capture = tmp_path / "caps" / "c.safetensors"
    code, _, err = gleak("simulate", "--model", llama, "--data", notes, "-b", 2, "--max-length", 12, "--seed", 9,
                         "-o", capture)
    assert code == 0, err
    code, stdout, err = gleak("audit", capture, "--model", llama, "--format", "table,json,sarif,junit",
                              "-o", tmp_path / "a", "--fail-on", "critical")
    assert code == 1, err
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    entry = report["captures"][0]["sentences"]
    assert entry["status"] == "ok" and entry["scores"]["exact_match"] == 1.0, entry
    rules = {f["rule"]: f["severity"] for f in report["findings"]}
    assert rules.get("GLEAK-TEXT") == "critical", rules
    assert not leaked(stdout) and not leaked((tmp_path / "a" / "report.sarif").read_text())
    blind = tmp_path / "blind"
    blind.mkdir()
    shutil.copy(capture, blind / "c.safetensors")  # no truth beside it
    code, stdout, err = gleak("audit", blind / "c.safetensors", "--model", llama, "--aux", notes, "--format", "json",
                              "-o", tmp_path / "b", "--fail-on", "none")
    assert code == 0, err
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    expected = report["captures"][0]["sentences"]["expected"]
    assert expected["twins"] >= 2 and expected["rouge1"] > expected["chance_rouge1"] + 0.5, expected
    rules = {f["rule"]: f["severity"] for f in report["findings"]}
    assert rules.get("GLEAK-TEXT-EXPECTED") in ("high", "medium") and "GLEAK-TEXT" not in rules, rules


def test_a_lora_capture_without_truth_gets_the_expected_leak_from_twins_of_its_adapter(tmp_path: Path) -> None:
    """Twins of a LoRA capture train the same adapter from the global one beside the capture: GLEAK-TEXT-EXPECTED
    (every sequence up to its last token: the head is frozen); without that adapter, one notice says what is
    missing."""
    pytest.importorskip("peft")
    notes, llama, _ = build_notes_and_models(tmp_path, layers=2)  # LoRA's prefix test reads the second block
    capture = tmp_path / "caps" / "c.safetensors"
    code, _, err = gleak("simulate", "--model", llama, "--data", notes, "-b", 2, "--max-length", 12, "--seed", 9,
                         "--peft", "lora:r=32,target=q_proj+k_proj+v_proj", "-o", capture)
    assert code == 0, err
    blind = tmp_path / "blind"
    blind.mkdir()
    shutil.copy(capture, blind / "c.safetensors")
    shutil.copytree(capture.with_name("c.adapter"), blind / "c.adapter")
    code, _, err = gleak("audit", blind / "c.safetensors", "--model", llama, "--aux", notes, "--format", "json",
                         "-o", tmp_path / "b", "--fail-on", "none")
    assert code == 0, err
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    expected = report["captures"][0]["sentences"]["expected"]
    assert expected["exact_up_to_last"] == 1.0 and expected["rouge1"] > expected["chance_rouge1"] + 0.5, \
        json.dumps({k: report["captures"][0].get(k) for k in ("sentences", "skipped")})
    rules = {f["rule"]: f["severity"] for f in report["findings"]}
    assert rules.get("GLEAK-TEXT-EXPECTED") == "high", rules
    shutil.rmtree(blind / "c.adapter")
    code, _, err = gleak("audit", blind / "c.safetensors", "--model", llama, "--aux", notes, "--format", "json",
                         "-o", tmp_path / "c", "--fail-on", "none")
    assert code == 0, err
    report = json.loads((tmp_path / "c" / "report.json").read_text())
    notices = {n["code"]: n["message"] for n in report["notices"]}
    assert "NAME.adapter" in notices.get("TEXT_EXPECTED_SKIPPED", ""), notices
