"""fgla and rgla: logit, feature and image recovery against ground truth on real MNIST batches, the maths
they share, when they do not apply, and `gleak reconstruct --attack rgla|fgla` with and without a generator."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gleak.attacks import RunInputs, build_context, get_attack, run_attack
from gleak.attacks.reconstruct.disaggregate import (
    OutputSystem,
    batch_loss_estimate,
    features_from_outputs,
    fgla_features,
    loss_gradient,
)
from gleak.attacks.reconstruct.inputs import targets_from_truth
from gleak.capture import load_capture, load_truth, truth_path_for
from gleak.data.images import load_dataset
from gleak.generator.file import load_generator, save_generator
from gleak.models import forward, load_model
from gleak.simulate.images import ClientConfig, simulate_client

from .conftest import FEDSGD, LENET, MNIST_CLIENT, SAMPLES

B8 = SAMPLES / "captures/fedsgd_b8.safetensors"
GEN = SAMPLES / "generators/lenet_untrained_mnist.safetensors"


def context(capture_path: Path, model_path: Path = LENET):
    cap = load_capture(capture_path)
    ctx = build_context(cap, load_model(model_path))
    truth = load_truth(truth_path_for(capture_path), cap)
    return ctx, truth


def true_outputs(ctx, truth) -> tuple[torch.Tensor, torch.Tensor]:
    h, z = forward.features_and_logits(ctx.model, ctx.layer, truth.inputs)
    return h.double(), z.double()


def run(name: str, ctx, truth, generator=None, **options):
    attack = get_attack(name)
    attack.configure(options)
    result = run_attack(attack, ctx, RunInputs(targets=targets_from_truth(truth, ctx), generator=generator))
    assert result.status == "ok", result.reason
    return result


@pytest.fixture(scope="module")
def b6_duplicates(tmp_path_factory) -> Path:
    """A fresh B = 6 MNIST batch with four examples of one class (not a shipped sample)."""
    data = load_dataset(MNIST_CLIENT)
    by_class = data.indices_by_class()
    idx = torch.cat([by_class[3][:4], by_class[5][:1], by_class[8][:1]])
    model = load_model(LENET).module
    capture, truth = simulate_client(model, data.subset(idx), ClientConfig(batch_size=6, seed=11))
    from gleak.capture import save_capture, save_truth

    path = tmp_path_factory.mktemp("b6") / "b6.safetensors"
    save_capture(capture, path)
    save_truth(truth, truth_path_for(path), capture_path=path)
    labels = truth.hard_labels()
    assert int((labels == 3).sum()) >= 3 and len(labels.unique()) >= 2  # the client samples the 6 with replacement
    return path


@pytest.mark.parametrize("which", ["sample", "b6"])
def test_rgla_recovers_logits_and_features(which, b6_duplicates):
    ctx, truth = context(B8 if which == "sample" else b6_duplicates)
    result = run("rgla", ctx, truth, restarts=0)  # the FGLA start alone (restarts cost 15 s on the b6 batch)
    h, z = true_outputs(ctx, truth)
    logits, feats = result.images.recovered["logits"].double(), result.images.recovered["features"].double()
    assert result.images.images is None  # no generator: features only, with the reason
    assert any("no generator" in w for w in result.warnings)
    # targets come from the truth in its order, so rows correspond one-to-one
    mse, cos = float((logits - z).pow(2).mean()), float(F.cosine_similarity(feats, h, dim=1).min())
    print(which, mse, cos, result.images.diagnostics["exact"])
    if which == "sample":  # one repeated pair: exact
        assert mse < 1e-6 and cos > 0.999 and result.images.diagnostics["exact"] is True
    else:  # four of six alike on an untrained model: ill-conditioned (docs/methods/generative.md), still close
        assert mse < 1e-3  # the bar (the paper: 8.8e-5 at B = 8)
        assert cos > 0.85


def test_fgla_features_collide_on_repeated_labels(b6_duplicates):
    ctx, truth = context(b6_duplicates)
    result = run("fgla", ctx, truth)
    feats = result.images.recovered["features"].double()
    labels = truth.hard_labels()
    h, _ = true_outputs(ctx, truth)
    same = (labels == 3).nonzero().flatten()
    assert torch.allclose(feats[same[0]], feats[same[1]])  # FGLA cannot tell them apart
    assert float(F.cosine_similarity(feats[same], h[same], dim=1).min()) < 0.999  # so it misses them
    assert any("share a label" in w for w in result.warnings)


def test_shared_maths_against_ground_truth():
    ctx, truth = context(B8)
    h, z = true_outputs(ctx, truth)
    targets = targets_from_truth(truth, ctx)
    d = loss_gradient(z, targets)
    gw, gb = ctx.grad_weight, ctx.grad_bias
    # the captured gradient is the model's: ∇W = Dᵀ F, ∇b = Dᵀ 1 (float32 capture)
    assert torch.allclose(d.T @ h, gw, rtol=1e-4, atol=1e-7)
    # Eq. 5 with the true D gives the true features (B ≤ C − 1)
    assert float(F.cosine_similarity(features_from_outputs(gw, d), h, dim=1).min()) > 0.9999
    # Prop. 2 on an untrained model: the estimate is close to the batch loss (paper: 2.295 vs 2.305)
    estimate, kept = batch_loss_estimate(gb, truth.hard_labels(), ctx.num_classes)
    true_loss = float(F.cross_entropy(z, truth.hard_labels()))
    assert kept == 8 and estimate is not None and abs(estimate - true_loss) < 0.05
    # FGLA's split with unique labels is close to exact
    u = fgla_features(gw, gb, torch.arange(3))
    assert u.shape == (3, gw.shape[1])


def test_rgla_images_through_the_sample_generator():
    ctx, truth = context(B8)
    gen = load_generator(GEN)
    rg = run("rgla", ctx, truth, gen)
    fg = run("fgla", ctx, truth, gen)
    h, _ = true_outputs(ctx, truth)
    ceiling = gen.decoder.generate(h.float())
    pixels = truth.inputs * 0.3081 + 0.1307

    def psnr(x: torch.Tensor) -> float:
        return float((-10 * F.mse_loss(x, pixels, reduction="none").flatten(1).mean(1).log10()).mean())

    assert rg.images.images is not None and rg.images.images.shape == (8, 1, 28, 28)
    assert abs(psnr(rg.images.images) - psnr(ceiling)) < 0.1  # exact features: the generator's own quality
    assert psnr(rg.images.images) > psnr(fg.images.images)  # the repeated label costs fgla
    assert psnr(rg.images.images) > 13  # a trained decoder, well above the mean-image baseline (~11 dB)


def test_not_applicable_reasons():
    ctx, _ = context(FEDSGD)  # B = 32 > C + 1
    reason = get_attack("rgla").not_applicable(ctx)
    assert reason is not None and "C + 1" in reason
    ctx, _ = context(B8)
    no_bias = replace(ctx.layer, bias_key=None, bias=None)
    ctx.layer, ctx.grad_bias = no_bias, None
    for name in ("rgla", "fgla"):
        reason = get_attack(name).not_applicable(ctx)
        assert reason is not None and "bias" in reason


def test_generator_for_another_model_is_refused(tmp_path, gleak):
    gen = load_generator(GEN)
    other = tmp_path / "other.safetensors"
    save_generator(other, gen.decoder, model_sha256="0" * 64, layer="fc3", mean=(0.1307,), std=(0.3081,),
                   aux_sha256="1" * 64, aux_examples=10, aux_source="x", train={"epochs": 1})
    r = gleak("reconstruct", B8, "-M", LENET, "--attack", "rgla", "--generator", other, "--labels", "truth",
              "-o", tmp_path / "out")
    assert r.exit_code == 2 and "another model" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
    r = gleak("reconstruct", B8, "-M", LENET, "--attack", "ig", "--generator", GEN, "-o", tmp_path / "out")
    assert r.exit_code == 2 and "generative attacks" in r.stderr
    r = gleak("reconstruct", B8, "-M", LENET, "--attack", "rgla", "--generator", B8, "-o", tmp_path / "out")
    assert r.exit_code == 2 and "not a gleak generator" in r.stderr
    r = gleak("reconstruct", FEDSGD, "-M", LENET, "--attack", "rgla", "--generator", GEN, "-o", tmp_path / "out")
    assert r.exit_code == 2 and "C + 1" in r.stderr


def test_cli_rgla_end_to_end(tmp_path, gleak):
    out = tmp_path / "out"
    r = gleak("reconstruct", B8, "-M", LENET, "--attack", "rgla", "--generator", GEN, "--labels", "truth",
              "--lpips", "off", "-o", out, "--format", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["attack"] == "rgla" and data["images_written"] is True
    assert data["output_scores"]["logit_mse"] < 1e-6 and data["output_scores"]["feature_cosine_min"] > 0.999
    assert data["output_scores"]["logit_mse"] > 0  # a 1e-13 error is reported as such, not rounded to 0
    assert data["metrics"]["mean"]["psnr"] > 13 and data["generator"]["layer"] == "fc3"
    assert {p.name for p in out.iterdir()} >= {"grid.png", "metrics.json", "recovered.safetensors"}


def test_cli_rgla_without_generator_writes_features(tmp_path, gleak):
    out = tmp_path / "out"
    r = gleak("reconstruct", B8, "-M", LENET, "--attack", "rgla", "--labels", "truth", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "recovered.safetensors"]
    assert "no images written" in r.stdout
    data = json.loads((out / "metrics.json").read_text())
    assert data["images_written"] is False and data["output_scores"]["feature_cosine_min"] > 0.999
    from safetensors.torch import load_file

    rec = load_file(str(out / "recovered.safetensors"))
    assert rec["logits"].shape == (8, 10) and rec["features"].shape == (8, 84)


def test_paper_solver_runs_and_reports_itself():
    ctx, truth = context(B8)
    result = run("rgla", ctx, truth, solver="adam", iterations=300)
    d = result.images.diagnostics
    assert d["solver"] == "adam" and d["evaluations_run"] == 300
    assert result.options == get_attack("rgla").configure({"solver": "adam", "iterations": 300}).model_dump(
        mode="json")


def test_json_values_keep_small_errors_and_drop_non_finite():
    from gleak.attacks.base import jsonable

    out = jsonable({"mse": 2.345678912345e-13, "psnr": 14.861234567891, "bad": float("nan"),
                    "t": torch.tensor([1e-20])})
    assert out["mse"] == 2.34567891e-13 and out["psnr"] == 14.8612346 and out["bad"] is None
    assert out["t"] == [pytest.approx(1e-20, rel=1e-6)]


@pytest.mark.parametrize(("B", "C", "loss_weight"), [(8, 10, 0.0), (3, 5, 1.5), (11, 10, 1.0)])
def test_closed_form_jacobian_equals_autodiff(B, C, loss_weight):
    g = torch.Generator().manual_seed(B * C)
    gw, gb = torch.randn(C, 7, generator=g), torch.randn(C, generator=g)
    weight, bias = torch.randn(C, 7, generator=g), torch.randn(C, generator=g)
    targets = F.one_hot(torch.randint(C, (B,), generator=g), C).double()
    system = OutputSystem(gw, gb, weight, bias, targets, 0.7)
    y = torch.randn(B * C, generator=g, dtype=torch.float64)
    auto = torch.func.jacfwd(lambda t: system.residual(t, loss_weight))(y)
    assert torch.allclose(system.jacobian(y, loss_weight), auto, atol=1e-12, rtol=0)
