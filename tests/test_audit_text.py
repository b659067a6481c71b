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


def test_without_truth_nor_aux_the_tokens_are_not_assessed_and_the_gate_never_passes(
        text_capture: tuple[Path, Path], tmp_path: Path) -> None:
    """Recovered but unscored tokens are no measurement: GLEAK-NOT-ASSESSED (high) names what --aux would give, the
    verdict is INCONCLUSIVE (exit 1, whatever --fail-on); --accept-unassessed, or its variable, lets it pass."""
    captures, models = text_capture
    shutil.copy(captures / "client.safetensors", tmp_path / "client.safetensors")  # its truth left behind
    code, stdout, stderr = gleak("audit", tmp_path / "client.safetensors", "--model", models / "llama",
                                 "--format", "json", "--fail-on", "critical")
    assert code == 1 and "INCONCLUSIVE" in stderr, stderr
    report = json.loads(stdout)
    notes = {f["metric"]: f for f in report["findings"] if f["rule"] == "GLEAK-NOT-ASSESSED"}
    assert notes["tokens"]["severity"] == "high" and "--aux" in notes["tokens"]["title"], notes
    coverage = {c["threat"]: c["status"] for c in report["captures"][0]["coverage"]}
    assert coverage["tokens"] == "not_assessed", coverage
    assert "NO_TEXT_AUX" in {n["code"] for n in report["notices"]}
    assert any(t["tokens"] for t in report["captures"][0]["tokens"]) and not leaked(stdout)
    for accept in (["--accept-unassessed"], []):
        result = CliRunner().invoke(app, ["audit", str(tmp_path / "client.safetensors"), "--model",
                                          str(models / "llama"), "--format", "table", *accept],
                                    env={"COLUMNS": "200", "GLEAK_ACCEPT_UNASSESSED": "" if accept else "1"})
        assert result.exit_code == 0, result.stderr
        assert "PASS" in result.stdout and "not assessed, accepted" in result.stdout, result.stdout
        assert "info GLEAK-NOT-ASSESSED" in result.stdout


def test_with_aux_text_the_tokens_are_expected_from_twin_batches(text_capture: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    """Without truth, with --aux text: twin batches simulated like the capture's, the token attacks run on them and
    scored: GLEAK-TEXT-TOKENS-EXPECTED (high, never critical), the range over the twins, chance beside."""
    captures, models = text_capture
    shutil.copy(captures / "client.safetensors", tmp_path / "client.safetensors")
    code, stdout, stderr = gleak("audit", tmp_path / "client.safetensors", "--model", models / "llama",
                                 "--aux", models / "notes.txt", "--format", "json", "--accept-unassessed")
    assert code == 1, stderr  # the expected token leak is high: it fails the gate, accepted or not
    report = json.loads(stdout)
    capture = report["captures"][0]
    ex = capture["expected_tokens"]
    assert ex["attack"] in ("token-bag", "union") and ex["twins"] == 2, ex
    assert ex["recall"]["min"] >= 0.95 and ex["precision"]["min"] >= 0.95, ex  # untied LLaMA: the embedding rows
    assert ex["chance_recall"]["mean"] < 0.5 and 0 <= ex["sensitive_recall"]["min"] <= 1
    (finding,) = [f for f in report["findings"] if f["rule"] == "GLEAK-TEXT-TOKENS-EXPECTED"]
    assert finding["severity"] == "high" and finding["measured"] == ex["recall"]["mean"], finding
    assert "twin batches" in finding["title"] and "range" in finding["title"]
    assert {c["threat"]: c["status"] for c in capture["coverage"]}["tokens"] == "assessed"
    assert not leaked(stdout)


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
    # without the global adapter nothing reads the update: the tokens are not assessed, and the finding says
    # where the adapter belongs
    titles = {f["metric"]: f["title"] for f in report["findings"] if f["rule"] == "GLEAK-NOT-ASSESSED"}
    assert "c.adapter/" in titles.get("tokens", ""), titles


def test_a_lora_capture_past_its_rank_is_never_a_pass(tmp_path: Path) -> None:
    """LoRA r = 2 and a batch of 8 notes: every token attack refuses (the rank), so does DAGER; with --aux text and
    no truth the gate says INCONCLUSIVE (exit 1) and names the rank, and no twin is simulated for nothing."""
    pytest.importorskip("peft")
    notes, llama, _ = build_notes_and_models(tmp_path)
    capture = tmp_path / "caps" / "c.safetensors"
    code, _, err = gleak("simulate", "--model", llama, "--data", notes, "-b", 8, "--max-length", 12, "--seed", 9,
                         "--peft", "lora:r=2", "-o", capture)
    assert code == 0, err
    capture.with_name("c.truth.safetensors").unlink()
    code, stdout, err = gleak("audit", capture, "--model", llama, "--aux", notes, "--format", "json")
    assert code == 1 and "INCONCLUSIVE" in err, err
    report = json.loads(stdout)
    notes_by_threat = {f["metric"]: f["title"] for f in report["findings"] if f["rule"] == "GLEAK-NOT-ASSESSED"}
    assert set(notes_by_threat) == {"tokens", "sentences"} and "rank" in notes_by_threat["tokens"], notes_by_threat
    assert report["captures"][0]["stage_seconds"]["twins"] < 1.0  # nothing ran on the capture: no twin simulated
    assert "expected_tokens" not in report["captures"][0]
    skipped = {n["code"]: n["message"] for n in report["notices"]}
    assert "twin batches would measure nothing" in skipped.get("TEXT_EXPECTED_SKIPPED", ""), skipped


def test_a_lora_update_past_its_rank_is_assessed_by_the_sparse_fit(tmp_path: Path) -> None:
    """Issue 45: LoRA r = 4 on q, k, v of the shipped LLaMA-style model, a FedAvg update whose batch has more distinct
    input tokens than the rank. The span test refuses; sparse-tokens reads the bag, so the tokens are assessed —
    against the truth beside the capture, and without it from twin batches of --aux text — instead of INCONCLUSIVE
    for the tokens."""
    pytest.importorskip("peft")
    model, notes = ROOT / "samples" / "text" / "notes-llama", ROOT / "samples" / "text" / "notes.txt"
    capture = tmp_path / "caps" / "c.safetensors"
    code, _, err = gleak("simulate", "--model", model, "--data", notes, "-b", 1, "-m", 3, "--lr", 1, "--max-length",
                         24, "--seed", 1, "--peft", "lora:r=4,target=q_proj+k_proj+v_proj", "-o", capture)
    assert code == 0, err
    code, _, err = gleak("audit", capture, "--model", model, "--format", "json", "-o", tmp_path / "a",
                         "--fail-on", "none")
    assert code == 0, err
    report = json.loads((tmp_path / "a" / "report.json").read_text())["captures"][0]
    by = {t["attack"]: t for t in report["tokens"]}
    assert by["lora-tokens"]["status"] == "failed" and "rank 4 of at most 4" in by["lora-tokens"]["reason"]
    sparse = by["sparse-tokens"]
    assert sparse["status"] == "ok" and sparse["scores"]["recall"] > sparse["scores"]["chance_recall"] + 0.5, sparse
    assert all(0.0 <= t["confidence"] <= 1.0 for t in sparse["tokens"])
    tokens = next(c for c in report["coverage"] if c["threat"] == "tokens")
    assert tokens["status"] == "assessed" and tokens["by"].startswith("sparse-tokens"), tokens
    blind = tmp_path / "blind"
    blind.mkdir()
    shutil.copy(capture, blind / "c.safetensors")
    shutil.copytree(capture.with_name("c.adapter"), blind / "c.adapter")
    code, _, err = gleak("audit", blind / "c.safetensors", "--model", model, "--aux", notes, "--format", "json",
                         "-o", tmp_path / "b", "--fail-on", "none")
    assert code == 0, err
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    expected = report["captures"][0]["expected_tokens"]
    assert expected["attack"] == "sparse-tokens" and expected["recall"]["mean"] > expected["chance_recall"]["mean"] \
        + 0.5, expected
    assert "GLEAK-TEXT-TOKENS-EXPECTED" in {f["rule"] for f in report["findings"]}
