"""`gleak check-model` (issue 46): the weight tests flag every published craft, at default and stealthier settings,
and nothing on honest models (zoo and torchvision at init, trained ones, a Hugging Face decoder); the imprint's
closed-form inversion brings a batch back at the rate the bins allow."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from gleak.data.images import load_dataset
from gleak.models.zoo import build_zoo_model
from gleak.report.model import SCHEMA_PATH
from gleak.tamper import craft
from gleak.tamper import imprint as inversion
from gleak.tamper.structure import check_views
from gleak.tamper.views import layer_views

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT / "samples" / "data" / "mnist_client.safetensors"


def rules(model: nn.Module) -> set[str]:
    return {h.rule for h in check_views(list(layer_views(model))) if h.tier == "trap"}


def digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_dataset(MNIST)
    x = ((ds.images - ds.mean[0]) / ds.std[0]).flatten(1)
    pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:n]
    return x[pick], ds.labels[pick]


def trained(name: str, steps: int = 150) -> nn.Module:
    """A zoo model after ordinary SGD on the shipped digits."""
    torch.manual_seed(0)
    model = build_zoo_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = load_dataset(MNIST)
    x = (ds.images - ds.mean[0]) / ds.std[0]
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        pick = torch.randint(len(x), (64,), generator=gen)
        batch = x[pick] if name != "mlp" else x[pick].flatten(1)
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch), ds.labels[pick]).backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("name", ["lenet", "mlp", "fcn4", "resnet-cifar", "idlg-cnn"])
def test_no_finding_on_zoo_models_at_init(name: str) -> None:
    for seed in range(5):
        torch.manual_seed(seed)
        assert check_views(list(layer_views(build_zoo_model(name)))) == [], (name, seed)


def test_no_finding_on_torchvision_models_at_init() -> None:
    torchvision = pytest.importorskip("torchvision")
    for factory in (torchvision.models.resnet18, torchvision.models.mobilenet_v3_small):
        torch.manual_seed(0)
        assert check_views(list(layer_views(factory()))) == []


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_no_finding_after_training(name: str) -> None:
    model = trained(name)
    assert check_views(list(layer_views(model))) == []
    # ... and class fishing on the trained model is flagged (constant target row, biases of 1000)
    assert {"GLEAK-SERVER-CONSTANT-ROWS", "GLEAK-SERVER-EXTREME-BIAS"} <= rules(craft.class_fishing(model).model)


def test_no_finding_on_a_hugging_face_decoder() -> None:
    pytest.importorskip("transformers")
    from tests.token_models import gpt2, llama

    for model in (gpt2(d=128, vocab=500), llama(d=128, vocab=500)):
        assert check_views(list(layer_views(model))) == []


@pytest.mark.parametrize("options", [{}, {"shuffle": True}, {"noise": 0.01, "shuffle": True}, {"gain": 1e-3},
                                     {"linfunc": "randn"}, {"linfunc": "avg"}, {"bins": 8}, {"noise": 0.05}])
def test_imprint_is_flagged(options: dict[str, object]) -> None:
    found = rules(craft.imprint(build_zoo_model("mlp"), **options).model)  # type: ignore[arg-type]
    assert found & {"GLEAK-SERVER-IMPRINT", "GLEAK-SERVER-CONSTANT-ROWS"}, options


@pytest.mark.parametrize("options", [{}, {"scale": 0.999, "sigma": 1 / 28}, {"mu": 0.1}])
def test_trap_weights_are_flagged(options: dict[str, float]) -> None:
    assert "GLEAK-SERVER-TRAP-WEIGHTS" in rules(craft.trap_weights(build_zoo_model("mlp"), **options).model)


def test_an_input_passing_convolution_is_flagged() -> None:
    model = build_zoo_model("lenet")
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    with torch.no_grad():
        first.weight.zero_()
        first.weight[:, 0, 2, 2] = 1.0  # Dirac kernels: every channel copies the image
    assert "GLEAK-SERVER-INPUT-PASSING" in rules(model)


def test_where_detection_ends_on_noisy_imprint_rows() -> None:
    """Row noise of energy 0.1 × the row's brings rows to cos ≈ 0.91 with each other: below the loose cluster's
    0.95, so the weight tests stop there (the data tests of the spec are not built)."""
    assert "GLEAK-SERVER-IMPRINT" not in rules(craft.imprint(build_zoo_model("mlp"), noise=0.1).model)


@pytest.mark.parametrize("batch", [16, 64])
def test_imprint_inversion_matches_the_bins_expectation(batch: int) -> None:
    """Exact copies (≥ 40 dB) of about B(1 − 1/K)^(B−1) digits: a bin holding one sample gives it exactly."""
    recovered = []
    for seed in range(4):
        crafted = craft.imprint(build_zoo_model("mlp"), bins=64, seed=seed)
        x, y = digits(batch, seed)
        layer = dict(crafted.model.named_modules())[crafted.layer]
        assert isinstance(layer, nn.Linear)
        loss = nn.functional.cross_entropy(crafted.model(x), y)
        gw, gb = torch.autograd.grad(loss, [layer.weight, layer.bias])
        rows = inversion.imprint_rows(layer.weight)
        assert sorted(rows) == list(range(64))
        out = inversion.invert(layer.weight, layer.bias, gw, gb, rows, batch)
        assert len(out.inputs) <= batch
        span = float(x.max() - x.min())
        mse = ((out.inputs.float()[:, None] - x[None]) ** 2).mean(-1).min(1).values
        recovered.append(int((10 * torch.log10(span ** 2 / mse.clamp_min(1e-20)) >= 40).sum()))
    expected = batch * (1 - 1 / 64) ** (batch - 1)
    assert abs(sum(recovered) / 4 - expected) <= 0.25 * expected + 2, (recovered, expected)


def save(model: nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_cli_exit_codes_formats_and_schema(gleak, tmp_path: Path) -> None:
    honest = save(build_zoo_model("mlp"), tmp_path / "honest.safetensors")
    trap = save(craft.imprint(build_zoo_model("mlp"), shuffle=True).model, tmp_path / "trap.safetensors")
    ok = gleak("check-model", honest, "--arch", "mlp")
    assert ok.exit_code == 0 and "CLEAN" in ok.stdout
    bad = gleak("check-model", trap, "--arch", "mlp", "--format", "json")
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert data["verdict"] == "flagged" and data["findings"][0]["rule"] == "GLEAK-SERVER-IMPRINT"
    assert data["findings"][0]["layer"] == "body.1"
    sarif = json.loads(gleak("check-model", trap, "--format", "sarif").stdout)
    assert sarif["runs"][0]["results"][0]["ruleId"] == "GLEAK-SERVER-IMPRINT"
    out = gleak("check-model", trap, "--format", "table,json,sarif", "--out", tmp_path / "r")
    assert out.exit_code == 1 and {p.name for p in (tmp_path / "r").iterdir()} == {"check-model.json",
                                                                                 "check-model.sarif"}
    again = gleak("check-model", trap, "--format", "json,sarif", "--out", tmp_path / "r")
    assert again.exit_code == 2 and "exists" in again.stderr
    assert gleak("check-model", trap, "--format", "json,sarif", "--out", tmp_path / "r", "--force").exit_code == 1


def test_cli_architecture_mismatch_and_bad_input(gleak, tmp_path: Path) -> None:
    """An inserted layer (the published imprint form) does not fit the client's architecture: flagged, and the
    inserted tensors are still tested. Bad input: one line, exit 2."""
    base = build_zoo_model("mlp")
    inserted = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), base)
    with torch.no_grad():
        inserted[1].weight.copy_(torch.ones(32, 1) * torch.linspace(-1, 1, 784))
    path = save(inserted, tmp_path / "inserted.safetensors")
    res = gleak("check-model", path, "--arch", "mlp", "--format", "json")
    assert res.exit_code == 1
    found = {f["rule"] for f in json.loads(res.stdout)["findings"]}
    assert {"GLEAK-SERVER-ARCHITECTURE", "GLEAK-SERVER-IMPRINT"} <= found
    for args in (("missing.safetensors",), (path, "--format", "xml"), (path, "--format", "json,sarif")):
        r = gleak("check-model", *args)
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, args
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    r = gleak("check-model", tmp_path / "junk.safetensors")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_simulate_server_reconstruct_and_audit_end_to_end(gleak, tmp_path: Path) -> None:
    """The published form on LeNet (a block inserted in front): simulate --server writes the crafted model beside
    the capture, check-model flags it, reconstruct (auto: imprint) brings digits back exactly and says how many,
    and the audit of the update is critical with a GLEAK-SERVER finding."""
    lenet = ROOT / "samples" / "models" / "lenet_untrained.safetensors"
    cap = tmp_path / "cap.safetensors"
    res = gleak("simulate", "--model", lenet, "--data", MNIST, "-o", cap, "-b", "16", "--server", "imprint:bins=128")
    assert res.exit_code == 0, res.stderr
    crafted = tmp_path / "cap.model.safetensors"
    assert crafted.exists() and "server: imprint" in res.stdout
    check = gleak("check-model", crafted, "--format", "json")
    assert check.exit_code == 1 and "GLEAK-SERVER-IMPRINT" in {f["rule"] for f in json.loads(check.stdout)["findings"]}
    assert gleak("check-model", crafted, "--arch", "lenet").exit_code == 1
    rec = gleak("reconstruct", cap, "--model", crafted, "-o", tmp_path / "rec", "--format", "json")
    assert rec.exit_code == 0, rec.stderr
    report = json.loads(rec.stdout)
    assert report["attack"] == "imprint"
    copies = sum(1 for p in report["metrics"]["psnr"] if p is not None and p >= 40)
    assert copies >= 10, report["metrics"]["psnr"]  # B(1 − 1/K)^(B−1) = 14.2 expected at K = 128
    table = gleak("reconstruct", cap, "--model", crafted, "-o", tmp_path / "rec2")
    assert f"{copies} of 16 images came back exactly" in table.stdout
    audit = gleak("audit", cap, "--model", crafted, "-o", tmp_path / "audit", "--format", "json")
    assert audit.exit_code == 1
    findings = json.loads((tmp_path / "audit" / "report.json").read_text())["findings"]
    server = [f for f in findings if f["rule"].startswith("GLEAK-SERVER-")]
    assert server and all(f["severity"] == "critical" for f in server)


def test_simulate_server_mistakes(gleak, tmp_path: Path) -> None:
    lenet = ROOT / "samples" / "models" / "lenet_untrained.safetensors"
    for spec, message in (("imprnt", "did you mean 'imprint'"), ("imprint:bins=1", "bins"),
                          ("trap-weights:foo=1", "no option 'foo'"), ("fishing:target=99", "target class")):
        r = gleak("simulate", "--model", lenet, "--data", MNIST, "-o", tmp_path / "c.safetensors", "--server", spec)
        assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (spec, r.stderr)
        assert not (tmp_path / "c.safetensors").exists() and not (tmp_path / "c.model.safetensors").exists()


def test_trap_weights_attack_recovers_examples_from_their_rows(gleak, tmp_path: Path) -> None:
    """simulate --server trap-weights, then reconstruct (auto picks trap-weights): some examples come back exactly;
    an honest model's capture is not applicable in one line."""
    lenet = ROOT / "samples" / "models" / "lenet_untrained.safetensors"
    cap = tmp_path / "t.safetensors"
    assert gleak("simulate", "--model", lenet, "--data", MNIST, "-o", cap, "-b", "16", "--server",
                 "trap-weights:rows=256").exit_code == 0
    rec = gleak("reconstruct", cap, "--model", tmp_path / "t.model.safetensors", "-o", tmp_path / "r", "--format",
                "json")
    report = json.loads(rec.stdout)
    assert report["attack"] == "trap-weights"
    assert sum(1 for p in report["metrics"]["psnr"] if p is not None and p >= 40) >= 2
    honest = tmp_path / "h.safetensors"
    assert gleak("simulate", "--model", lenet, "--data", MNIST, "-o", honest, "-b", "4").exit_code == 0
    bad = gleak("reconstruct", honest, "--model", lenet, "--attack", "trap-weights", "-o", tmp_path / "r2")
    assert bad.exit_code == 2 and "no trap weights" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_data_test_counts_what_a_server_copies(gleak, tmp_path: Path) -> None:
    """--data: the imprinted MLP gives a large share of the probe away exactly (B(1 − 1/K)^(B−1) / B ≈ 0.69 at
    K = 128, B = 64) and is flagged by it alone; an honest MLP at init gives ≤ 2 of 64; a model without an
    architecture cannot be run."""
    trapped = save(craft.imprint(build_zoo_model("mlp"), bins=128).model, tmp_path / "trap.safetensors")
    res = gleak("check-model", trapped, "--arch", "mlp", "--data", MNIST, "--format", "json")
    report = json.loads(res.stdout)
    assert res.exit_code == 1 and report["probe"]["share"] >= 0.5
    assert "GLEAK-SERVER-EXACT-LEAK" in {f["rule"] for f in report["findings"]}
    honest = save(build_zoo_model("mlp"), tmp_path / "honest.safetensors")
    clean = json.loads(gleak("check-model", honest, "--arch", "mlp", "--data", MNIST, "--format", "json").stdout)
    assert clean["verdict"] == "clean" and clean["probe"]["copied"] <= 2 and clean["probe"]["layer"] == "body.1"
    lenet = json.loads(gleak("check-model", ROOT / "samples" / "models" / "lenet_untrained.safetensors", "--data",
                             MNIST, "--format", "json").stdout)
    assert lenet["probe"]["reason"].startswith("the model's first layer is not linear")
    bare = gleak("check-model", honest, "--data", MNIST)
    assert bare.exit_code == 2 and "architecture" in bare.stderr
    three = save(build_zoo_model("mlp", num_classes=3), tmp_path / "three.safetensors")  # digits 3–9 do not fit
    wrong = gleak("check-model", three, "--arch", "mlp", "--arch-kwargs", '{"num_classes": 3}', "--data", MNIST)
    assert wrong.exit_code == 2 and "cannot run on" in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1


def test_every_model_format_is_read(gleak, tmp_path: Path) -> None:
    """TorchScript and torch.export archives and Hugging Face folders are checked like safetensors files."""
    model = craft.class_fishing(build_zoo_model("lenet")).model
    script = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(model), str(script))
    exported = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model, (torch.zeros(1, 1, 28, 28),)), str(exported))
    for path in (script, exported):
        res = gleak("check-model", path, "--trust-pickle", "--format", "json")
        assert res.exit_code == 1, (path, res.stderr)
        assert "GLEAK-SERVER-EXTREME-BIAS" in {f["rule"] for f in json.loads(res.stdout)["findings"]}
    pytest.importorskip("transformers")
    from tests.token_models import gpt2

    folder = tmp_path / "gpt2"
    gpt2(d=64, vocab=300).save_pretrained(folder)
    assert gleak("check-model", folder).exit_code == 0


def test_large_and_coherent_matrices_are_checked_without_false_alarm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The projected search for parallel rows (K²·n past its bound, lowered here to keep the test small) finds a
    planted imprint and falls back to exact cosines on a coherent block (one candidate pair per row pair past
    MAX_PAIRS); a bare state dict's output head, as many rows as the token embedding, is read as tokens
    (collapsed rare tokens are not an imprint)."""
    from gleak.tamper import structure
    from gleak.tamper.views import LayerView, tensor_views

    monkeypatch.setattr(structure, "PROJECT_ABOVE", 1e6)
    monkeypatch.setattr(structure, "MAX_PAIRS", 1000)
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(1500, 300, generator=gen)
    wide[100:164] = wide[5]  # 64 identical rows
    hit = check_views([LayerView("wide", "dense", wide, None, 0)])
    assert [h.rule for h in hit] == ["GLEAK-SERVER-IMPRINT"] and hit[0].rows == 65
    coherent = torch.randn(1, 300, generator=gen) + 0.3 * torch.randn(1500, 300, generator=gen)  # cos ≈ 0.92
    assert check_views([LayerView("coherent", "dense", coherent, None, 0)]) == []
    coherent[:8] = coherent[9]  # and a cluster inside it, found on the exact fallback
    assert [h.rule for h in check_views([LayerView("coherent", "dense", coherent, None, 0)])] == [
        "GLEAK-SERVER-IMPRINT"]
    vocab = torch.randn(3000, 64, generator=gen)
    vocab[2000:] = vocab[1999]  # a thousand rare tokens collapsed onto one row
    state = {"model.embed_tokens.weight": vocab.clone(), "lm_head.weight": vocab.clone(),
             "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64, generator=gen)}
    assert check_views(list(tensor_views(state))) == []
