"""Each defense against its definition, the gleak.defense record, `gleak defend`, `gleak defenses`, and DP-SGD
through Opacus (ε against Opacus's own accountant, per-example clipping checked by hand on a tiny model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from gleak.capture import Capture, load_capture, load_truth, truth_path_for
from gleak.data.images import Dataset, load_dataset
from gleak.defenses import DEFENSES, apply_defenses, parse_defense
from gleak.errors import GleakError
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import FEDSGD, LENET, MNIST_AUX, MNIST_CLIENT

pytestmark = pytest.mark.usefixtures("one_thread")
N = 200_000  # entries: standard errors of 0.2 % of σ


def _capture(tensors: dict[str, torch.Tensor], **meta: object) -> Capture:
    return Capture(tensors=tensors, meta={"gleak.kind": "gradient", "gleak.model.sha256": "ab" * 32, **meta})


def _one(spec: str, tensors: dict[str, torch.Tensor], seed: int = 0, **meta: object) -> Capture:
    return apply_defenses(_capture(tensors, **meta), [parse_defense(spec)], seed)


def test_gaussian_noise_has_the_stated_mean_and_spread() -> None:
    sigma = 0.5
    noise = _one(f"gaussian:sigma={sigma}", {"w": torch.zeros(N)}).tensors["w"].double()
    assert abs(float(noise.mean())) < 3 * sigma / math.sqrt(N)
    assert abs(float(noise.std()) - sigma) < 3 * sigma / math.sqrt(2 * N)
    x = torch.full((N,), 2.0)  # relative: σ times the tensor's RMS (2)
    rel = _one("gaussian:sigma=0.1,relative=true", {"w": x}).tensors["w"].double() - 2.0
    assert abs(float(rel.std()) - 0.2) < 3 * 0.2 / math.sqrt(2 * N)


def test_laplace_noise_has_the_stated_mean_and_spread() -> None:
    b = 0.3
    noise = _one(f"laplace:scale={b}", {"w": torch.zeros(N)}).tensors["w"].double()
    std = b * math.sqrt(2)
    assert abs(float(noise.mean())) < 3 * std / math.sqrt(N)
    assert abs(float(noise.std()) - std) < 3 * 1.59 * b / math.sqrt(N)  # SE of a Laplace sample's std: √5/√2·b/√n
    assert abs(float(noise.abs().mean()) - b) < 3 * b / math.sqrt(N)  # E|X| = b


def test_clip_bounds_the_whole_contribution_and_leaves_it_alone_inside() -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {"a": torch.randn(50, generator=g) * 3, "b": torch.randn(7, 3, generator=g)}
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors.values()))
    clipped = _one("clip:norm=2", tensors).tensors
    after = math.sqrt(sum(float(t.double().pow(2).sum()) for t in clipped.values()))
    assert after <= 2 + 1e-6 and after == pytest.approx(2, rel=1e-6)
    assert torch.allclose(clipped["a"] / clipped["a"].norm(), tensors["a"] / tensors["a"].norm())  # direction kept
    inside = _one(f"clip:norm={norm * 1.01}", tensors).tensors
    assert all(torch.equal(inside[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.99, 0.999])
def test_topk_zeroes_exactly_the_stated_fraction(ratio: float) -> None:
    g = torch.Generator().manual_seed(2)
    tensors = {"w": torch.randn(100, 37, generator=g), "b": torch.randn(1001, generator=g)}
    out = _one(f"topk:ratio={ratio}", tensors).tensors
    for name, t in tensors.items():
        zeros = int((out[name] == 0).sum())
        assert zeros == math.floor(ratio * t.numel())
        kept = out[name] != 0
        if kept.any() and (~kept).any():  # the kept entries are the largest in magnitude
            assert float(t[kept].abs().min()) >= float(t[~kept].abs().max())
    glob = _one(f"topk:ratio={ratio},scope=global", tensors).tensors
    assert sum(int((v == 0).sum()) for v in glob.values()) == math.floor(ratio * (100 * 37 + 1001))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quantize_has_at_most_two_to_the_k_levels(bits: int) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=g, dtype=torch.float64)
    for spec in (f"quantize:bits={bits}", f"quantize:bits={bits},stochastic=true"):
        q = _one(spec, {"w": x}).tensors["w"]
        assert len(torch.unique(q)) <= 2 ** bits
        assert float(q.min()) == pytest.approx(float(x.min())) and float(q.max()) == pytest.approx(float(x.max()))
    step = float(x.max() - x.min()) / (2 ** bits - 1)
    assert float((_one(f"quantize:bits={bits}", {"w": x}).tensors["w"] - x).abs().max()) <= step / 2 + 1e-12


def test_stochastic_quantization_is_unbiased() -> None:
    x = torch.linspace(-1, 1, 11, dtype=torch.float64).repeat(4000)
    q = _one("quantize:bits=1,stochastic=true", {"w": x}).tensors["w"].view(4000, 11).mean(0)
    assert torch.allclose(q, x[:11], atol=3 * 1 / math.sqrt(4000))  # levels ±1: per-entry std ≤ 1


def test_sign_keeps_only_signs() -> None:
    x = torch.tensor([-3.0, 0.0, 0.5, 2.0])
    assert torch.equal(_one("sign", {"w": x}).tensors["w"], torch.tensor([-1.0, 0.0, 1.0, 1.0]))
    assert torch.allclose(_one("sign:scale=mean", {"w": x}).tensors["w"], torch.tensor([-1.375, 0.0, 1.375, 1.375]))


@pytest.mark.parametrize("spec", ["gaussian:sigma=0.1", "laplace:scale=0.1", "quantize:bits=2,stochastic=true"])
def test_the_same_seed_gives_the_same_bytes_and_another_does_not(spec: str) -> None:
    x = {"w": torch.linspace(-1, 1, 1000)}
    a, b, c = (_one(spec, x, seed).tensors["w"] for seed in (5, 5, 6))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_record_keeps_order_options_seed_and_the_model_hash_and_skips_buffers() -> None:
    cap = _capture({"w": torch.ones(10), "bn.running_mean": torch.ones(3)}, **{"gleak.buffers": ["bn.running_mean"],
                                                                               "gleak.defense": [{"name": "earlier"}]})
    out = apply_defenses(cap, [parse_defense("clip:norm=1"), parse_defense("gaussian:sigma=0.01")], seed=4)
    names = [r["name"] for r in out.meta["gleak.defense"]]
    assert names == ["earlier", "clip", "gaussian"]
    assert out.meta["gleak.defense"][1] == {"name": "clip", "tensors": None, "norm": 1.0, "seed": 4}
    assert out.meta["gleak.defense"][2]["sigma"] == 0.01 and out.meta["gleak.defense"][2]["seed"] != 4
    assert out.meta["gleak.model.sha256"] == "ab" * 32
    assert torch.equal(out.tensors["bn.running_mean"], torch.ones(3))  # buffers are not the contribution
    assert cap.meta["gleak.defense"] == [{"name": "earlier"}] and torch.equal(cap.tensors["w"], torch.ones(10))


def test_named_tensors_only_and_a_pattern_that_matches_nothing_is_an_error() -> None:
    tensors = {"fc.weight": torch.ones(4), "fc.bias": torch.ones(2), "conv.weight": torch.ones(3)}
    out = _one("topk:ratio=0.5,tensors=fc.*", tensors).tensors
    assert int((out["fc.weight"] == 0).sum()) == 2 and torch.equal(out["conv.weight"], torch.ones(3))
    with pytest.raises(GleakError, match="matches no tensor"):
        _one("clip:norm=1,tensors=fc.weight+head.*", tensors)


@pytest.mark.parametrize(("spec", "expected"), [
    ("bogus", "Known defenses: clip, dpsgd, gaussian, laplace, quantize, sign, topk"),
    ("clip:nrm=3", "did you mean 'norm'"),
    ("gaussian:sigma=-1", "greater than or equal to 0"),
    ("topk:ratio=1", "less than 1"),
    ("quantize:bits=0", "greater than or equal to 1"),
    ("clip:norm", "expected NAME[:KEY=VALUE,...]"),
    (":norm=1", "expected NAME[:KEY=VALUE,...]"),
])
def test_bad_specs_are_one_line_naming_the_choices(gleak, tmp_path: Path, spec: str, expected: str) -> None:
    r = gleak("defend", FEDSGD, "--defense", spec, "-o", tmp_path / "out.safetensors")
    assert r.exit_code == 2 and expected in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_defend_writes_the_capture_and_a_truth_bound_to_it(gleak, tmp_path: Path) -> None:
    out = tmp_path / "def.safetensors"
    args = ("defend", FEDSGD, "--defense", "clip:norm=1", "--defense", "gaussian:sigma=0.001", "--seed", "3")
    r = gleak(*args, "-o", out)
    assert r.exit_code == 0, r.stderr
    defended, source = load_capture(out), load_capture(FEDSGD)
    assert defended.meta["gleak.model.sha256"] == source.meta["gleak.model.sha256"]
    assert [d["name"] for d in defended.meta["gleak.defense"]] == ["clip", "gaussian"]
    load_truth(truth_path_for(out), defended)  # bound to the new file's bytes (raises otherwise)
    again = tmp_path / "again.safetensors"
    assert gleak(*args, "-o", again).exit_code == 0
    assert again.read_bytes() == out.read_bytes()  # the same seed: the same file
    r = gleak(*args, "-o", out)
    assert r.exit_code == 2 and "--force" in r.stderr  # nothing overwritten without --force
    assert gleak(*args, "-o", out, "--force").exit_code == 0
    r = gleak("defend", FEDSGD, "--defense", "dpsgd", "-o", tmp_path / "dp.safetensors")
    assert r.exit_code == 2 and "gleak simulate --defense dpsgd" in r.stderr
    r = gleak("defend", out, "--defense", "sign", "-o", out, "--force")
    assert r.exit_code == 2 and "is the input capture" in r.stderr


def test_defenses_lists_every_defense_with_its_strength(gleak) -> None:
    r = gleak("defenses", "--format", "json")
    rows = {d["name"]: d for d in json.loads(r.stdout)}
    assert set(rows) == set(DEFENSES)
    assert {n: d["strength"] for n, d in rows.items()} == {"gaussian": "sigma", "laplace": "scale", "clip": "norm",
                                                           "topk": "ratio", "quantize": "bits", "sign": None,
                                                           "dpsgd": "noise_multiplier"}
    assert rows["dpsgd"]["kind"] == "training" and "tensors" not in [o["name"] for o in rows["dpsgd"]["options"]]


# ----------------------------------------------------------------------------------------------- DP-SGD
def test_dpsgd_epsilon_is_opacus_accountant_for_the_same_setting() -> None:
    from opacus.accountants import RDPAccountant

    data = load_dataset(MNIST_CLIENT)
    model = _lenet()
    dp = parse_defense("dpsgd:noise_multiplier=0.8,max_grad_norm=1,delta=1e-5")
    cap, _ = simulate_client(model, data, ClientConfig(batch_size=8, local_steps=3, scheme="fedavg", seed=2,
                                                       learning_rate=0.05, defenses=(dp,)))
    q = 8 / len(data)
    accountant = RDPAccountant()
    for _ in range(3):
        accountant.step(noise_multiplier=0.8, sample_rate=q)
    assert cap.meta["gleak.dp.epsilon"] == pytest.approx(accountant.get_epsilon(delta=1e-5), rel=1e-9)
    assert cap.meta["gleak.dp.sample_rate"] == pytest.approx(q) and cap.meta["gleak.dp.steps"] == 3
    assert cap.meta["gleak.dp.accountant"] == "rdp" and cap.meta["gleak.defense"][0]["name"] == "dpsgd"


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_dpsgd_really_clips_each_example() -> None:
    """With negligible noise, the shared gradient is the mean of the per-example gradients each clipped to C,
    computed here by hand."""
    torch.manual_seed(0)
    model = _Tiny()
    data = Dataset(images=torch.rand(40, 1, 2, 2), labels=torch.arange(40) % 3, mean=(0.5,), std=(0.1,),
                   source="tiny")
    c = 0.05
    dp = parse_defense(f"dpsgd:noise_multiplier=1e-9,max_grad_norm={c}")
    cap, truth = simulate_client(model, data, ClientConfig(batch_size=4, seed=1, defenses=(dp,)))
    clipped = []
    for x, y in zip(truth.inputs, truth.labels, strict=True):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[None]), y[None]).backward()  # truth inputs: the model's inputs
        g = torch.cat([model.fc.weight.grad.flatten(), model.fc.bias.grad.flatten()])
        clipped.append(g * min(1.0, c / float(g.norm())))
    expected = torch.stack(clipped).mean(0)
    got = torch.cat([cap.tensors["fc.weight"].flatten(), cap.tensors["fc.bias"].flatten()])
    assert float(torch.stack(clipped).norm(dim=1).max()) <= c + 1e-6
    assert torch.allclose(got, expected, atol=1e-6)
    plain, _ = simulate_client(model, data, ClientConfig(batch_size=4, seed=1))  # without DP: not clipped
    assert float(torch.cat([t.flatten() for t in plain.tensors.values()]).norm()) > 2 * c


def test_dpsgd_refuses_batchnorm_in_one_line_naming_the_layer(gleak, tmp_path: Path) -> None:
    from gleak.models import save_model

    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    with pytest.raises(GleakError, match=r"layer '2' \(BatchNorm1d\).*GroupNorm"):
        simulate_client(model, load_dataset(MNIST_CLIENT), ClientConfig(batch_size=4,
                                                                         defenses=(parse_defense("dpsgd"),)))
    save_model(_lenet(), tmp_path / "lenet.safetensors", "lenet")
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", tmp_path / "c.safetensors", "--defense",
              "dpsgd:noise_multiplier=0.5", "--defense", "topk:ratio=0.9")
    assert r.exit_code == 0, r.stderr
    cap = load_capture(tmp_path / "c.safetensors")
    assert [d["name"] for d in cap.meta["gleak.defense"]] == ["dpsgd", "topk"] and cap.meta["gleak.dp.epsilon"] > 0
    assert "ε = " in r.stdout


def _lenet() -> nn.Module:
    from gleak.models import load_model

    return load_model(LENET).module


@pytest.mark.extended  # seconds of end-to-end work: make test runs it
def test_the_audit_simulates_a_recorded_defense_when_it_calibrates(gleak, tmp_path: Path) -> None:
    """Without truth, the calibrated expectation is measured on batches simulated with the capture's recorded
    defenses (gleak.defense rebuilt from the registry): strong noise brings the expected iAcc down to chance."""
    import shutil

    clean = tmp_path / "clean.safetensors"
    shutil.copy(FEDSGD, clean)  # no truth beside it
    noisy = tmp_path / "noisy.safetensors"
    assert gleak("defend", clean, "--defense", "gaussian:sigma=0.5", "-o", noisy).exit_code == 0
    expected = {}
    for name, path in (("clean", clean), ("noisy", noisy)):
        r = gleak("audit", path, "-M", LENET, "--aux", MNIST_AUX, "--format", "json",
                  "--confidence", "8", "--fail-on", "none")
        report = json.loads(r.stdout)
        entry = next(a for a in report["captures"][0]["attacks"] if a["attack"] == "calibrated")
        expected[name] = (entry["status"], (entry["confidence"] or {}).get("expected_iacc"),
                          (entry["confidence"] or {}).get("chance_iacc"))
    assert expected["clean"][0] == "ok" and expected["clean"][1] >= 0.9
    status, iacc, chance = expected["noisy"]
    assert status == "abstained" or iacc < chance + 0.05, expected  # the simulated twins carry the noise too


# ----------------------------------------------------------------------------------------------- DP-SGD: target ε
@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_dpsgd_aims_at_a_target_epsilon_with_opacus_noise_multiplier(gleak, tmp_path: Path) -> None:
    """dpsgd:epsilon=2 through `gleak simulate`: z is Opacus's get_noise_multiplier for the client's q and steps,
    the recorded ε is at most 2 and within 5 % of it, and every ε shown states δ, accountant, q, steps and rounds."""
    from opacus.accountants.utils import get_noise_multiplier

    from gleak.defenses.dpsgd import EPSILON_TOLERANCE

    out = tmp_path / "dp.safetensors"
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-b", "8", "--local-steps", "3", "-o", out,
              "--defense", "dpsgd:epsilon=2")
    assert r.exit_code == 0, r.stderr
    meta = load_capture(out).meta
    q = 8 / len(load_dataset(MNIST_CLIENT))
    assert 1.9 <= meta["gleak.dp.epsilon"] <= 2.0
    z = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=q, steps=3, accountant="rdp",
                             epsilon_tolerance=EPSILON_TOLERANCE * 2.0)
    assert meta["gleak.dp.noise_multiplier"] == pytest.approx(z, rel=1e-12)
    assert meta["gleak.dp.target_epsilon"] == 2.0 and meta["gleak.dp.steps"] == 3
    record = meta["gleak.defense"][0]
    assert record["epsilon"] == 2.0 and "noise_multiplier" not in record  # rebuilt, it aims at the same ε again
    from gleak.defenses.apply import rebuild_defenses

    rebuilt, unknown = rebuild_defenses([record])
    assert not unknown and rebuilt[0].options.epsilon == 2.0
    eps = f"{meta['gleak.dp.epsilon']:.3g}"
    assert f"ε = {eps} at δ = 1e-5 (RDP; q = {q:.3g}, 3 steps × 1 round)" in r.stdout, r.stdout
    assert f"z = {z:.3g}" in r.stdout and "target ε = 2" in r.stdout
    # the audit carries ε with its terms as fields, and its HTML states them
    r = gleak("audit", out, "-M", LENET, "--format", "json,html", "-o", tmp_path / "audit", "--fail-on", "none")
    assert r.exit_code == 0, r.stderr
    capture = json.loads((tmp_path / "audit" / "report.json").read_text())["captures"][0]
    assert capture["epsilon"] == meta["gleak.dp.epsilon"]
    assert capture["epsilon_terms"] == {"delta": 1e-5, "accountant": "rdp", "sample_rate": q, "steps": 3,
                                        "rounds": 1, "noise_multiplier": z, "max_grad_norm": 1.0,
                                        "target_epsilon": 2.0}
    html = (tmp_path / "audit" / "report.html").read_text()
    assert f"ε = {eps} at δ = 1e-5 (RDP; q = {q:.3g}, 3 steps × 1 round)" in html


def test_dpsgd_takes_a_target_epsilon_or_a_noise_multiplier_not_both(gleak, tmp_path: Path) -> None:
    r = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-o", tmp_path / "c.safetensors",
              "--defense", "dpsgd:epsilon=2,noise_multiplier=1")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--defense dpsgd: give epsilon" in r.stderr and "not both" in r.stderr and "Value error" not in r.stderr
    assert not (tmp_path / "c.safetensors").exists()
    r = gleak("defenses", "--format", "json")
    dpsgd = next(d for d in json.loads(r.stdout) if d["name"] == "dpsgd")
    assert dpsgd["also_sweeps"] == ["epsilon"]
    assert "get_noise_multiplier" in next(o["help"] for o in dpsgd["options"] if o["name"] == "epsilon")


def test_every_epsilon_is_stated_with_its_terms() -> None:
    from gleak.report.model import EpsilonTerms
    from gleak.report.privacy import describe_epsilon, statement, terms_of

    terms = EpsilonTerms(delta=1e-5, accountant="prv", sample_rate=0.016, steps=3, rounds=4, noise_multiplier=1.1)
    assert describe_epsilon(1.2345, terms) == "ε = 1.23 at δ = 1e-5 (PRV; q = 0.016, 3 steps × 4 rounds)"
    meta = {"gleak.dp.epsilon": 0.5, "gleak.dp.delta": 1e-6, "gleak.dp.accountant": "rdp",
            "gleak.dp.sample_rate": 0.5, "gleak.dp.steps": 1, "gleak.dp.noise_multiplier": 2.0,
            "gleak.dp.max_grad_norm": 4.0}
    assert statement(0.5, terms_of(meta)) == "ε = 0.5 at δ = 1e-6 (RDP; q = 0.5, 1 step × 1 round); z = 2 (C = 4)"
    assert terms_of({k: v for k, v in meta.items() if k != "gleak.dp.delta"}) is None  # no δ: no stated ε


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the lent GPU machine)")
def test_dpsgd_trains_on_cuda_with_a_seeded_generator_there(gleak, tmp_path: Path) -> None:
    """Opacus draws DP-SGD's noise where the parameters are: the seeded generator must be on the model's device."""
    outs = []
    for i in range(2):
        out = tmp_path / f"c{i}.safetensors"
        result = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "-b", 8, "--local-steps", 2, "--device",
                       "cuda", "--defense", "dpsgd:epsilon=2", "--seed", 5, "-o", out, "-q")
        assert result.exit_code == 0, result.stderr
        outs.append(load_capture(out))
    assert 1.9 <= outs[0].meta["gleak.dp.epsilon"] <= 2.0
    for name, tensor in outs[0].tensors.items():
        assert torch.equal(tensor, outs[1].tensors[name]), name  # the same seed, the same noise
