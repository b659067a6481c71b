"""LoRA captures (issue 37): the --peft spec, `gleak simulate --peft` (FedSGD and FedAvg on a fresh adapter, the global
adapter written beside the capture), `gleak capture GLOBAL CLIENT` on a pair of adapter folders, and every refusal in
one line. Tiny models built here (tests/text_models.py); nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gleak.capture import load_capture
from gleak.errors import GleakError
from gleak.io import read_safetensors, save_safetensors, tensors_sha256

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from typer.testing import CliRunner  # noqa: E402

from gleak.cli import app  # noqa: E402
from gleak.models.peft import LoraSpec, load_adapter, parse_lora_spec  # noqa: E402

from .text_models import build_notes_and_models  # noqa: E402

EPOCH = "1700000000"


def gleak(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error:") and "Traceback" not in err, err
    for word in words:
        assert word in err, err


@pytest.fixture(scope="module")
def notes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return build_notes_and_models(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def fedsgd(notes: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A FedSGD LoRA capture of the LLaMA-style model (r = 4, peft's default targets), and the console output."""
    text, llama, _ = notes
    out = tmp_path_factory.mktemp("fedsgd") / "c.safetensors"
    code, stdout, err = gleak("simulate", "--model", llama, "--data", text, "--peft", "lora:r=4", "-b", 4,
                              "--max-length", 12, "--seed", 3, "-o", out)
    assert code == 0, err
    return out, stdout


def base_hash(folder: Path) -> str:
    from gleak.models import load_model

    return load_model(folder).weights_sha256


def client_from(global_dir: Path, base: Path, out: Path, seed: int = 1, scale: float = 0.01) -> Path:
    """A client's adapter as peft writes it: the global adapter loaded on the base model, every tensor moved."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    wrapped = peft.PeftModel.from_pretrained(model, global_dir, is_trainable=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in wrapped.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=gen))
    wrapped.save_pretrained(out)
    return out


# ------------------------------------------------------------------------------------------------- the spec


def test_the_spec_parses_with_peft_defaults() -> None:
    assert parse_lora_spec("lora") == LoraSpec(r=8, alpha=8.0, target_modules=None, dropout=0.0)
    assert parse_lora_spec("lora:r=16,alpha=32,target=q_proj+v_proj,dropout=0.1") == LoraSpec(
        r=16, alpha=32.0, target_modules=("q_proj", "v_proj"), dropout=0.1)
    assert parse_lora_spec(" LoRA: r = 2 ").r == 2


@pytest.mark.parametrize(("spec", "word"), [
    ("ia3:r=8", "only LoRA"), ("lora:r=0", "r must be"), ("lora:r=x", "r must be an integer"),
    ("lora:rank=8", "unknown key 'rank'"), ("lora:alpha=-1", "alpha"), ("lora:alpha=nan", "alpha"),
    ("lora:r", "not KEY=VALUE"), ("lora:r=8,r=4", "given twice"), ("lora:dropout=1", "dropout"),
    ("lora:target=q_proj+", "target"), ("lora:target=q_proj+q_proj", "named twice"),
])
def test_a_bad_spec_is_one_line_naming_it(spec: str, word: str) -> None:
    with pytest.raises(GleakError, match=word) as info:
        parse_lora_spec(spec)
    assert "\n" not in str(info.value)


def test_simulate_refuses_a_bad_spec_and_peft_on_images(notes: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from .conftest import ROOT

    text, llama, _ = notes
    code, _, err = gleak("simulate", "--model", llama, "--data", text, "--peft", "lora:r=0", "-o", tmp_path / "x")
    one_line_error(code, err, "--peft: r must be")
    code, _, err = gleak("simulate", "--model", llama, "--data", text, "--peft", "lora:target=nowhere", "-b", 2,
                         "-o", tmp_path / "y.safetensors")
    one_line_error(code, err, "--peft", "nowhere")
    assert not list(tmp_path.iterdir())
    lenet = ROOT / "samples" / "models" / "lenet_untrained.safetensors"
    mnist = ROOT / "samples" / "data" / "mnist_client.safetensors"
    code, _, err = gleak("simulate", "--model", lenet, "--data", mnist, "--peft", "lora", "-o", tmp_path / "z")
    one_line_error(code, err, "--peft applies to text data")


# ---------------------------------------------------------------------------------------------- simulate


def test_fedsgd_lora_a_gradients_are_zero_and_b_are_not(fedsgd: tuple[Path, str],
                                                        notes: tuple[Path, Path, Path]) -> None:
    path, stdout = fedsgd
    _, llama, _ = notes
    capture = load_capture(path)  # the metadata validates
    adapter_dir = path.with_name("c.adapter")
    config, adapter = load_adapter(adapter_dir)
    # the capture's names are the saved adapter's names, the file's order
    assert list(capture.tensors) == list(adapter) and len(adapter) == 4
    assert all(".lora_A.weight" in n or ".lora_B.weight" in n for n in adapter)
    for name, grad in capture.tensors.items():
        assert grad.shape == adapter[name].shape
        if ".lora_A." in name:  # lora_B = 0 at init: dL/dA = s·Bᵀδuᵀ = 0 exactly (METHODS-text §3.9)
            assert torch.count_nonzero(grad) == 0, name
            assert torch.count_nonzero(adapter[name]) > 0
        else:
            assert torch.count_nonzero(grad) > 0, name
            assert torch.count_nonzero(adapter[name]) == 0
    meta = capture.meta
    assert meta["gleak.kind"] == "gradient" and meta["gleak.modality"] == "text" and meta["gleak.task"] == "causal_lm"
    assert meta["gleak.peft.type"] == "lora" and meta["gleak.peft.r"] == 4 and meta["gleak.peft.alpha"] == 8.0
    assert meta["gleak.peft.target_modules"] == ["q_proj", "v_proj"]  # peft's default for LLaMA
    assert meta["gleak.model.sha256"] == base_hash(llama)  # bound to the base model
    assert meta["gleak.peft.adapter.sha256"] == tensors_sha256(adapter)
    assert meta["gleak.tokenizer.sha256"] and meta["gleak.vocab_size"] > 0 and meta["gleak.max_length"] == 12
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["target_modules"] == ["q_proj", "v_proj"]
    assert "LoRA r=4" in stdout and "targets q_proj+v_proj" in stdout and "4 adapter tensors" in stdout
    assert "c.adapter" in stdout
    # peft itself reads the folder, with the same tensors
    model = transformers.AutoModelForCausalLM.from_pretrained(llama)
    wrapped = peft.PeftModel.from_pretrained(model, adapter_dir)
    state = peft.get_peft_model_state_dict(wrapped)
    assert list(state) == list(adapter) and all(torch.equal(state[n], adapter[n]) for n in adapter)


def test_fedavg_on_gpt2_moves_both_factors(notes: tuple[Path, Path, Path], tmp_path: Path) -> None:
    text, _, gpt2 = notes
    out = tmp_path / "u.safetensors"
    code, _, err = gleak("simulate", "--model", gpt2, "--data", text, "--peft", "lora:r=2,alpha=16,target=c_attn",
                         "-b", 2, "-m", 2, "--lr", 0.5, "--max-length", 10, "--no-truth", "-o", out)
    assert code == 0, err
    capture = load_capture(out)
    assert capture.kind == "update" and capture.meta["gleak.local_steps"] == 2 and capture.meta["gleak.batch_size"] == 2
    assert capture.meta["gleak.peft.alpha"] == 16.0 and capture.meta["gleak.peft.target_modules"] == ["c_attn"]
    assert capture.meta["gleak.model.sha256"] == base_hash(gpt2)
    assert {n.rsplit(".", 2)[-2] for n in capture.tensors} == {"lora_A", "lora_B"}
    assert all(torch.count_nonzero(t) > 0 for t in capture.tensors.values())  # both factors changed
    assert (tmp_path / "u.adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "u.truth.safetensors").exists()


def test_the_same_seed_gives_the_same_files(notes: tuple[Path, Path, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    text, llama, _ = notes
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    runs = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        out = tmp_path / name / "c.safetensors"
        code, _, err = gleak("simulate", "--model", llama, "--data", text, "--peft", "lora:r=2", "-b", 2, "-m", 2,
                             "--seed", seed, "-o", out)
        assert code == 0, err
        runs.append(out)
    a, b, c = runs
    for rel in ("c.safetensors", "c.truth.safetensors", "c.adapter/adapter_config.json",
                "c.adapter/adapter_model.safetensors"):
        assert (a.parent / rel).read_bytes() == (b.parent / rel).read_bytes(), rel
    assert (a.parent / "c.adapter/adapter_model.safetensors").read_bytes() != \
        (c.parent / "c.adapter/adapter_model.safetensors").read_bytes()  # another seed, another adapter


def test_simulate_never_replaces_the_adapter_without_force(fedsgd: tuple[Path, str], notes: tuple[Path, Path, Path],
                                                           tmp_path: Path) -> None:
    text, llama, _ = notes
    out = tmp_path / "c.safetensors"
    (tmp_path / "c.adapter").mkdir()
    (tmp_path / "c.adapter" / "adapter_config.json").write_text("{}")
    args = ("simulate", "--model", llama, "--data", text, "--peft", "lora:r=2", "-b", 2, "-o", out)
    code, _, err = gleak(*args)
    one_line_error(code, err, "c.adapter", "--force")
    assert not out.exists()
    code, _, err = gleak(*args, "--force")
    assert code == 0, err
    assert load_adapter(tmp_path / "c.adapter")[0]["r"] == 2
    (tmp_path / "d.adapter").mkdir()
    (tmp_path / "d.adapter" / "notes.txt").write_text("mine")  # a folder that is not an adapter: never replaced
    code, _, err = gleak(*args[:-1], tmp_path / "d.safetensors", "--force")
    one_line_error(code, err, "holds no adapter")


# ------------------------------------------------------------------------------------------ gleak capture


def test_a_pair_of_adapters_becomes_the_clients_update(fedsgd: tuple[Path, str], notes: tuple[Path, Path, Path],
                                                       tmp_path: Path) -> None:
    path, _ = fedsgd
    _, llama, _ = notes
    global_dir = path.with_name("c.adapter")
    client_dir = client_from(global_dir, llama, tmp_path / "client")
    out = tmp_path / "pair.safetensors"
    code, stdout, err = gleak("capture", global_dir, client_dir, "--model", llama, "-o", out, "--learning-rate", 0.01,
                              "--local-steps", 3, "--batch-size", 4, "--optimizer", "adam", "--round", 2,
                              "--client-id", "c7")
    assert code == 0, err
    assert "LoRA r=4" in stdout and "4 adapter tensors" in stdout and str(out) in stdout
    capture = load_capture(out)
    (_, global_state), (_, client_state) = load_adapter(global_dir), load_adapter(client_dir)
    assert list(capture.tensors) == list(global_state)
    for name, delta in capture.tensors.items():
        assert torch.equal(delta, client_state[name] - global_state[name]), name
    meta = capture.meta
    assert meta["gleak.kind"] == "update" and meta["gleak.modality"] == "text" and meta["gleak.task"] == "causal_lm"
    assert meta["gleak.model.sha256"] == base_hash(llama)
    assert meta["gleak.peft.adapter.sha256"] == load_capture(path).meta["gleak.peft.adapter.sha256"]
    assert (meta["gleak.peft.r"], meta["gleak.peft.alpha"], meta["gleak.peft.target_modules"]) == \
        (4, 8.0, ["q_proj", "v_proj"])
    assert meta["gleak.tokenizer.sha256"] == load_capture(path).meta["gleak.tokenizer.sha256"]
    assert (meta["gleak.learning_rate"], meta["gleak.local_steps"], meta["gleak.batch_size"],
            meta["gleak.num_examples"], meta["gleak.optimizer"]) == (0.01, 3, 4, 12, "adam")
    assert meta["gleak.fl.round"] == 2 and meta["gleak.fl.client_id"] == "c7"
    assert meta["gleak.peft.base_model"] == str(llama)  # recorded as peft wrote it, not resolved
    # unknown training is not made up
    bare = tmp_path / "bare.safetensors"
    code, _, err = gleak("capture", global_dir, client_dir, "--model", llama, "-o", bare, "-q")
    assert code == 0, err
    assert not {"gleak.learning_rate", "gleak.local_steps", "gleak.optimizer"} & set(load_capture(bare).meta)
    # and never overwritten without --force
    code, _, err = gleak("capture", global_dir, client_dir, "--model", llama, "-o", out)
    one_line_error(code, err, "already exists", "--force")
    code, _, err = gleak("capture", global_dir, client_dir, "--model", llama, "-o", out, "--force", "-q")
    assert code == 0, err
    # inspect shows the LoRA keys and checks the base model
    code, report, err = gleak("inspect", out, "--model", llama, "--format", "json")
    assert code == 0, err
    data = json.loads(report)
    assert data["metadata"]["gleak.peft.type"] == "lora" and data["model"]["matches_capture"] is True
    assert data["last_layer"]["weight_key"].endswith("lora_A.weight")
    code, table, err = gleak("inspect", out)
    assert code == 0 and "gleak.peft.r" in table, err


def copy_adapter(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_the_pair_command_refuses_in_one_line(fedsgd: tuple[Path, str], notes: tuple[Path, Path, Path],
                                              tmp_path: Path) -> None:
    path, _ = fedsgd
    text, llama, gpt2 = notes
    global_dir = path.with_name("c.adapter")
    out = tmp_path / "x.safetensors"

    def pair(client: Path, *extra: object, model: Path = llama) -> tuple[int, str]:
        code, _, err = gleak("capture", global_dir, client, "--model", model, "-o", out, *extra)
        return code, err

    code, err = pair(tmp_path / "nowhere")
    one_line_error(code, err, "not a PEFT adapter folder")
    ia3 = copy_adapter(global_dir, tmp_path / "ia3")
    config = json.loads((ia3 / "adapter_config.json").read_text())
    (ia3 / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    one_line_error(*pair(ia3), "peft_type 'IA3'", "LoRA")
    other = tmp_path / "r2.safetensors"
    code, _, err = gleak("simulate", "--model", llama, "--data", text, "--peft", "lora:r=2", "-b", 2, "-o", other)
    assert code == 0, err
    one_line_error(*pair(tmp_path / "r2.adapter"), "differ in r", "4", "2")
    bare = copy_adapter(global_dir, tmp_path / "bare")
    (bare / "adapter_model.safetensors").unlink()
    one_line_error(*pair(bare), "no weights", "adapter_model.safetensors")
    pickled = copy_adapter(global_dir, tmp_path / "pickled")
    state, _ = read_safetensors(pickled / "adapter_model.safetensors")
    torch.save(state, pickled / "adapter_model.bin")
    (pickled / "adapter_model.safetensors").unlink()
    one_line_error(*pair(pickled), "adapter_model.bin", "--trust-pickle")
    code, err = pair(pickled, "--trust-pickle", "-q")
    assert code == 0 and all(torch.count_nonzero(t) == 0 for t in load_capture(out).tensors.values()), err
    nan = copy_adapter(global_dir, tmp_path / "nan")
    first = next(iter(state))
    save_safetensors(nan / "adapter_model.safetensors", {**state, first: torch.full_like(state[first], float("nan"))},
                     {"format": "pt"}, force=True)
    one_line_error(*pair(nan, "--force"), "client adapter tensor", "NaN")
    renamed = copy_adapter(global_dir, tmp_path / "renamed")
    save_safetensors(renamed / "adapter_model.safetensors", {k.replace("layers.0", "layers.9"): v
                                                             for k, v in state.items()}, force=True)
    one_line_error(*pair(renamed, "--force"), "hold different tensors")
    one_line_error(*pair(global_dir, "--force", model=gpt2), "does not fit the base model")
    one_line_error(*pair(global_dir, "--optimizer", "lion"), "--optimizer")
