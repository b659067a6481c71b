"""Tests for gleak.models: the zoo, loading/saving, and last-layer detection."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from gleak.errors import GleakError
from gleak.models import (
    ZOO,
    build_arch,
    build_zoo_model,
    find_last_layer,
    load_model,
    save_model,
    zoo_input_shape,
)

# (zoo name, kwargs, expected last-layer name, feature dim, has bias)
ZOO_CASES = [
    ("lenet", {"image_size": 28}, "fc3", 84, True),
    ("lenet", {"image_size": 32, "in_channels": 3}, "fc3", 84, True),
    ("idlg-cnn", {"image_size": 28}, "fc", 588, True),
    ("idlg-cnn", {"image_size": 32, "in_channels": 3}, "fc", 768, True),
    ("fcn4", {}, "fc", 64, False),
    ("fcn4", {"input_shape": [3, 32, 32], "hidden": [128, 64, 32]}, "fc", 32, False),
    ("mlp", {}, "fc", 300, True),
    ("mlp", {"input_shape": (3, 32, 32), "hidden": [50, 40]}, "fc", 40, True),
    ("resnet-cifar", {"depth": 8}, "fc", 64, True),
    ("resnet-cifar", {"depth": 8, "image_size": 28, "in_channels": 1}, "fc", 64, True),
]


@pytest.fixture(autouse=True)
def _quiet_jit() -> None:
    warnings.filterwarnings("ignore", message=".*torch.jit.*deprecated.*")


def _seed() -> None:
    torch.manual_seed(0)


# --------------------------------------------------------------------------- zoo


@pytest.mark.parametrize(("name", "kwargs", "fc", "dim", "has_bias"), ZOO_CASES)
def test_zoo_models_build_and_detect_fc(name: str, kwargs: dict, fc: str, dim: int, has_bias: bool) -> None:
    _seed()
    model = build_zoo_model(name, num_classes=7, **kwargs).eval()
    shape = zoo_input_shape(name, **kwargs)
    assert model(torch.randn(3, *shape)).shape == (3, 7)
    layer = find_last_layer(model, input_shape=shape)
    assert layer.name == fc
    assert layer.weight_key == f"{fc}.weight"
    assert (layer.num_classes, layer.feature_dim) == (7, dim)
    assert (layer.bias is not None) == has_bias
    assert (layer.bias_key == f"{fc}.bias") if has_bias else layer.bias_key is None
    assert layer.reason.startswith("traced a forward pass")


def test_zoo_input_shapes() -> None:
    assert zoo_input_shape("lenet") == (1, 28, 28)
    assert zoo_input_shape("zoo:lenet", image_size=32, in_channels=3) == (3, 32, 32)
    assert zoo_input_shape("resnet-cifar") == (3, 32, 32)
    assert zoo_input_shape("fcn4", input_shape=[3, 32, 32]) == (3, 32, 32)
    assert set(ZOO) == {"lenet", "idlg-cnn", "fcn4", "mlp", "resnet-cifar", "imprinted"}
    for entry in ZOO.values():
        assert entry.description and entry.paper


def test_lenet_padding_and_activation_and_uniform_init() -> None:
    m28 = build_zoo_model("lenet")
    m32 = build_zoo_model("lenet", image_size=32)
    assert m28.features[0].padding == (2, 2) and m32.features[0].padding == (0, 0)
    assert m28.fc1.in_features == 16 * 5 * 5 == m32.fc1.in_features
    sig = build_zoo_model("lenet", activation="sigmoid")
    assert isinstance(sig.act1, nn.Sigmoid) and isinstance(sig.features[1], nn.Sigmoid)
    _seed()
    uni = build_zoo_model("lenet", init="uniform")
    values = torch.cat([p.detach().flatten() for p in uni.parameters()])
    assert values.abs().max() <= 0.5 and values.abs().max() > 0.45  # default init of fc3 stays below 0.11
    assert uni.fc3.bias.abs().max() > 0.2
    with pytest.raises(GleakError, match="activation"):
        build_zoo_model("lenet", activation="gelu")
    with pytest.raises(GleakError, match="init"):
        build_zoo_model("lenet", init="xavier")


def test_idlg_cnn_hidden_sizes_and_default_uniform_init() -> None:
    assert build_zoo_model("idlg-cnn").fc.in_features == 588
    assert build_zoo_model("idlg-cnn", image_size=32, in_channels=3).fc.in_features == 768
    model = build_zoo_model("idlg-cnn")
    assert all(isinstance(model.body[i], nn.Sigmoid) for i in (1, 3, 5))
    assert [c.stride for c in model.body if isinstance(c, nn.Conv2d)] == [(2, 2), (2, 2), (1, 1)]
    values = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert values.abs().max() <= 0.5 and values.abs().max() > 0.45


def test_fcn4_has_no_bias_and_checks_hidden() -> None:
    model = build_zoo_model("fcn4")
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [1024, 256, 64, 10]
    with pytest.raises(GleakError, match="hidden"):
        build_zoo_model("fcn4", hidden=[10, 10])


def test_resnet_cifar_structure() -> None:
    model = build_zoo_model("resnet-cifar")  # depth 20 -> 3 blocks per stage
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3)] == [3, 3, 3]
    assert isinstance(model.layer1[0].shortcut, nn.Identity)
    proj = model.layer2[0].shortcut
    assert (
        isinstance(proj[0], nn.Conv2d)
        and proj[0].kernel_size == (1, 1)
        and isinstance(proj[1], nn.BatchNorm2d)
    )
    assert model.fc.in_features == 64
    with pytest.raises(GleakError, match=r"6n\+2"):
        build_zoo_model("resnet-cifar", depth=21)


def test_zoo_errors_name_the_problem() -> None:
    with pytest.raises(GleakError, match=r"lenet.*idlg-cnn.*fcn4.*mlp.*resnet-cifar"):
        build_zoo_model("alexnet")
    with pytest.raises(GleakError, match="'widht'"):
        build_zoo_model("mlp", widht=3)
    with pytest.raises(GleakError, match="num_classes"):
        build_zoo_model("mlp", num_classes=0)


# --------------------------------------------------------------------------- last layer: other models


def test_torchvision_resnet18_fc() -> None:
    layer = find_last_layer(build_arch("torchvision:resnet18"), input_shape=(3, 64, 64))
    assert (layer.name, layer.num_classes, layer.feature_dim, layer.bias_key) == ("fc", 1000, 512, "fc.bias")


def test_torchvision_vgg11_classifier6() -> None:
    model = build_arch("torchvision:vgg11", {"num_classes": 20})
    model.train()
    layer = find_last_layer(model, input_shape=(3, 64, 64))
    assert (layer.name, layer.weight_key) == ("classifier.6", "classifier.6.weight")
    assert (layer.num_classes, layer.feature_dim) == (20, 4096)
    assert model.training and model.classifier[2].training  # train mode restored


class BiasFree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU())
        self.head = nn.Linear(8, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class DropoutTail(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({"proj": nn.Linear(12, 8), "out": nn.Linear(8, 4)})
        self.drop = nn.Dropout(0.3)
        self.ident = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.blocks["proj"](x.flatten(1)))
        return self.ident(self.drop(self.blocks["out"](h)))


class UnusedLater(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 6)
        self.classifier = nn.Linear(6, 3)
        self.aux_head = nn.Linear(6, 9)  # defined last, never called in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.fc1(x.flatten(1))))


def test_bias_free_final_linear() -> None:
    layer = find_last_layer(BiasFree(), input_shape=(1, 3, 4))
    assert (layer.name, layer.bias, layer.bias_key, layer.num_classes, layer.feature_dim) == (
        "head",
        None,
        None,
        5,
        8,
    )
    assert layer.reason.startswith("traced")


def test_dropout_and_identity_after_final_linear() -> None:
    layer = find_last_layer(DropoutTail(), input_shape=(12,))
    assert (layer.name, layer.num_classes, layer.feature_dim) == ("blocks.out", 4, 8)
    assert "Dropout/Identity" in layer.reason


def test_tracing_beats_fallback_for_unused_later_linear() -> None:
    model = UnusedLater()
    traced = find_last_layer(model, input_shape=(1, 3, 4))
    assert (traced.name, traced.num_classes) == ("classifier", 3)
    fallback = find_last_layer(model)  # no input shape: only the state-dict order is left
    assert fallback.name == "aux_head" and fallback.reason.startswith("fallback")


def test_fallback_when_forward_fails() -> None:
    layer = find_last_layer(build_zoo_model("lenet"), input_shape=(3, 5, 5))
    assert layer.name == "fc3" and layer.reason.startswith("fallback") and "failed" in layer.reason


def test_torch_export_lenet(tmp_path: Path) -> None:
    _seed()
    model = build_zoo_model("lenet").eval()
    x = torch.randn(2, 1, 28, 28)
    path = tmp_path / "lenet.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    loaded = load_model(path)
    assert loaded.source == "torch.export program" and loaded.arch is None
    assert loaded.input_shape == (1, 28, 28)
    assert torch.allclose(loaded.module(x), model(x))
    assert loaded.module.eval() is loaded.module and not loaded.module.training  # torch refuses eval() itself
    layer = find_last_layer(loaded.module, input_shape=loaded.input_shape)
    assert (layer.weight_key, layer.bias_key, layer.num_classes, layer.feature_dim) == (
        "fc3.weight",
        "fc3.bias",
        10,
        84,
    )
    assert torch.equal(layer.weight, model.fc3.weight)
    program_layer = find_last_layer(torch.export.load(str(path)))  # lifted graph with a signature
    assert program_layer.weight_key == "fc3.weight" and program_layer.bias_key == "fc3.bias"


def test_torchscript_lenet(tmp_path: Path) -> None:
    _seed()
    model = build_zoo_model("lenet", num_classes=6).eval()
    path = tmp_path / "lenet.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    loaded = load_model(path, arch="lenet")
    assert loaded.source == "TorchScript archive" and loaded.input_shape == (1, 28, 28)
    x = torch.randn(2, 1, 28, 28)
    assert torch.allclose(loaded.module(x), model(x))
    layer = find_last_layer(loaded.module)
    assert (layer.name, layer.bias_key, layer.num_classes, layer.feature_dim) == ("fc3", "fc3.bias", 6, 84)
    assert not layer.reason.startswith("fallback")


# --------------------------------------------------------------------------- override and capture slices


def test_override_by_module_name_and_weight_key() -> None:
    model = build_zoo_model("lenet")
    # without an input shape nothing can be traced: the override is taken, marked unverified
    by_name = find_last_layer(model, override="fc2")
    assert (by_name.name, by_name.weight_key, by_name.bias_key) == ("fc2", "fc2.weight", "fc2.bias")
    assert (by_name.num_classes, by_name.feature_dim) == (84, 120)
    assert "override" in by_name.reason and "not verified" in by_name.reason
    # traced: only the layer whose output is the logits may be chosen
    by_key = find_last_layer(model, override="fc3.weight", input_shape=(1, 28, 28))
    assert (by_key.weight_key, by_key.num_classes) == ("fc3.weight", 10) and "override" in by_key.reason
    with pytest.raises(GleakError, match=r"'fc2.weight'.*not the layer that produces.*'fc3.weight'"):
        find_last_layer(model, override="fc2.weight", input_shape=(1, 28, 28))


def test_bad_override_lists_candidates() -> None:
    with pytest.raises(GleakError, match=r"'fc9'.*fc1\.weight, fc2\.weight, fc3\.weight"):
        find_last_layer(build_zoo_model("lenet"), override="fc9")
    with pytest.raises(GleakError, match="2-D"):
        find_last_layer(build_zoo_model("lenet"), override="features.0")  # a 4-D conv weight


def test_capture_slices_and_shape_mismatch() -> None:
    model = build_zoo_model("lenet")
    grads = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    layer = find_last_layer(model, tensors=grads, input_shape=(1, 28, 28))
    assert layer.grad_weight is grads["fc3.weight"] and layer.grad_bias is grads["fc3.bias"]
    grads["fc3.weight"] = torch.randn(12, 84)
    hint = r"is this the model the capture was made with\? pass it with --model .*--fc-layer$"
    with pytest.raises(GleakError, match=r"fc3\.weight.*\[12, 84\].*\[10, 84\]; " + hint):
        find_last_layer(model, tensors=grads, input_shape=(1, 28, 28))
    del grads["fc3.weight"]
    with pytest.raises(GleakError, match=r"fc3\.weight.*" + hint):
        find_last_layer(model, tensors=grads, input_shape=(1, 28, 28))


def test_no_capture_gives_no_grad_slices() -> None:
    layer = find_last_layer(build_zoo_model("mlp"), input_shape=(1, 28, 28))
    assert layer.grad_weight is None and layer.grad_bias is None


# --------------------------------------------------------------------------- loading and saving


def test_save_load_round_trip(tmp_path: Path) -> None:
    _seed()
    model = build_zoo_model("lenet", image_size=32, in_channels=3, num_classes=5).eval()
    path = save_model(
        model, tmp_path / "m.safetensors", "lenet", {"image_size": 32, "in_channels": 3, "num_classes": 5},
        metadata={"note": "hello"},
    )  # fmt: skip
    loaded = load_model(path)
    assert loaded.arch == "lenet" and loaded.source == "safetensors weights + zoo:lenet"
    assert loaded.arch_kwargs == {"image_size": 32, "in_channels": 3, "num_classes": 5}
    assert loaded.input_shape == (3, 32, 32)
    assert loaded.metadata["note"] == "hello" and json.loads(loaded.metadata["gleak.input_shape"]) == [
        3,
        32,
        32,
    ]
    assert not loaded.module.training
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(loaded.module(x), model(x))
    from gleak.io import tensors_sha256

    assert loaded.weights_sha256 == tensors_sha256(model.state_dict())
    with pytest.raises(GleakError, match="already exists"):
        save_model(model, path, "lenet", {"image_size": 32, "in_channels": 3, "num_classes": 5})
    save_model(model, path, "lenet", {"image_size": 32, "in_channels": 3, "num_classes": 5}, force=True)


def test_round_trip_keeps_batchnorm_buffers(tmp_path: Path) -> None:
    _seed()
    model = build_zoo_model("resnet-cifar", depth=8)
    model.train()
    model(torch.randn(8, 3, 32, 32))  # move the running statistics away from their defaults
    model.eval()
    loaded = load_model(save_model(model, tmp_path / "r.safetensors", "zoo:resnet-cifar", {"depth": 8}))
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(loaded.module(x), model(x))
    assert torch.equal(loaded.module.bn1.running_mean, model.bn1.running_mean)


def test_state_dict_files(tmp_path: Path) -> None:
    _seed()
    model = build_zoo_model("mlp", hidden=[20, 10]).eval()
    plain, wrapped = tmp_path / "sd.pt", tmp_path / "ckpt.pth"
    torch.save(model.state_dict(), plain)
    torch.save({"epoch": 3, "model_state_dict": model.state_dict()}, wrapped)
    x = torch.randn(2, 1, 28, 28)
    for path in (plain, wrapped):
        loaded = load_model(path, arch="mlp", arch_kwargs='{"hidden": [20, 10]}')
        assert torch.equal(loaded.module(x), model(x))
        assert loaded.input_shape == (1, 28, 28) and loaded.arch_kwargs == {"hidden": [20, 10]}
    with pytest.raises(GleakError, match="needs --arch"):
        load_model(plain)
    imported = load_model(plain, arch="gleak.models.zoo:MLP", arch_kwargs={"hidden": (20, 10)})
    assert torch.equal(imported.module(x), model(x)) and imported.input_shape is None


def test_state_dict_mismatches_are_reported(tmp_path: Path) -> None:
    state = build_zoo_model("lenet").state_dict()
    missing = dict(state)
    del missing["fc2.bias"]
    torch.save(missing, tmp_path / "missing.pt")
    hint = r"are --arch and --arch-kwargs the architecture these weights were saved from\?$"
    with pytest.raises(GleakError, match=r"missing 1 model tensor\(s\): 'fc2\.bias'; " + hint):
        load_model(tmp_path / "missing.pt", arch="lenet")
    with pytest.raises(
        GleakError, match=r"shape mismatch for 'fc3\.weight': file has \[10, 84\], model has \[4, 84\]; .*" + hint
    ):
        load_model(tmp_path / "missing.pt", arch="lenet", arch_kwargs={"num_classes": 4})
    extra = {**state, "head.weight": torch.zeros(2, 2)}
    torch.save(extra, tmp_path / "extra.pt")
    with pytest.raises(GleakError, match=r"1 tensor\(s\) not in the model: 'head\.weight'; " + hint):
        load_model(tmp_path / "extra.pt", arch="lenet")


def test_bad_inputs_are_gleak_errors(tmp_path: Path) -> None:
    with pytest.raises(GleakError, match="no such file"):
        load_model(tmp_path / "nope.safetensors")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00\x01not a model at all" * 20)
    with pytest.raises(GleakError, match=r"garbage.pt is not a recognised model file"):
        load_model(garbage, arch="lenet")
    fake_st = tmp_path / "fake.safetensors"
    fake_st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken json!!!}")
    with pytest.raises(GleakError, match=r"fake.safetensors"):
        load_model(fake_st)
    sd = tmp_path / "sd.pt"
    torch.save(build_zoo_model("lenet").state_dict(), sd)
    with pytest.raises(GleakError, match="unknown arch 'resnet-9000'"):
        load_model(sd, arch="resnet-9000")
    with pytest.raises(GleakError, match=r"unknown torchvision model 'resnet19'.*resnet18"):
        load_model(sd, arch="torchvision:resnet19")
    with pytest.raises(GleakError, match="not valid JSON"):
        load_model(sd, arch="lenet", arch_kwargs="{num_classes: 3")
    with pytest.raises(GleakError, match="JSON object"):
        load_model(sd, arch="lenet", arch_kwargs="[1, 2]")
    with pytest.raises(GleakError, match=r"cannot import 'no_such_pkg.models'"):
        build_arch("no_such_pkg.models:make")
    with pytest.raises(GleakError, match=r"not a torch.nn.Module"):
        build_arch("json:dumps", {"obj": 1})


def test_pickled_module_needs_trust(tmp_path: Path) -> None:
    _seed()
    model = build_zoo_model("mlp", hidden=[16]).eval()
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    with pytest.raises(GleakError, match=r"pickled.*--trust-pickle"):
        load_model(path)
    loaded = load_model(path, trust_pickle=True)
    assert isinstance(loaded.module, nn.Module) and "pickled" in loaded.source
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(loaded.module(x), model(x))


def test_safetensors_without_arch_metadata_needs_arch(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = build_zoo_model("lenet")
    path = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    with pytest.raises(GleakError, match="needs --arch"):
        load_model(path)
    loaded = load_model(path, arch="lenet")
    assert loaded.input_shape == (1, 28, 28) and loaded.metadata == {}


def test_save_model_checks_arch_and_suffix(tmp_path: Path) -> None:
    model = build_zoo_model("lenet")
    with pytest.raises(GleakError, match=r"does not match arch.*shape mismatch for 'fc3\.weight': module has "
                                         r"\[10, 84\], model has \[3, 84\]; .*; pass the arch and arch_kwargs"):
        save_model(model, tmp_path / "x.safetensors", "lenet", {"num_classes": 3})
    with pytest.raises(GleakError, match=r".safetensors"):
        save_model(model, tmp_path / "x.pt", "lenet")
    assert not (tmp_path / "x.safetensors").exists()


FACTORY_MODULE = '''
from torch import nn

import {sibling}


def build(num_classes: int = 3) -> nn.Module:
    width = {sibling}.WIDTH  # imported by the factory's module from the same directory
    return nn.Sequential(nn.Flatten(), nn.Linear(4, width), nn.ReLU(), nn.Linear(width, num_classes))
'''


def _forget(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    import sys

    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_arch_factory_module_found_in_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--arch mynet:build next to mynet.py works without PYTHONPATH, and sys.path is left as it was."""
    import sys

    (tmp_path / "gleak_cwd_net.py").write_text(FACTORY_MODULE.format(sibling="gleak_cwd_width"))
    (tmp_path / "gleak_cwd_width.py").write_text("WIDTH = 5\n")
    _forget(monkeypatch, "gleak_cwd_net", "gleak_cwd_width")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    try:
        module = build_arch("gleak_cwd_net:build", {"num_classes": 4})
        assert [tuple(p.shape) for p in module.parameters()] == [(5, 4), (5,), (4, 5), (4,)]
        assert sys.path == before
    finally:
        _forget(monkeypatch, "gleak_cwd_net", "gleak_cwd_width")


def test_arch_from_working_directory_never_touches_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The module found in the working directory is loaded without editing sys.path (not even while it is imported
    and its factory runs), and is registered in sys.modules under its name, so pickles that name it resolve."""
    import os
    import sys

    (tmp_path / "gleak_cwd_probe.py").write_text(
        "import sys\nfrom torch import nn\n\nAT_IMPORT = list(sys.path)\n\n\n"
        "def build() -> nn.Module:\n    build.seen = list(sys.path)\n    return nn.Linear(2, 2)\n")
    _forget(monkeypatch, "gleak_cwd_probe")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    before = list(sys.path)
    try:
        build_arch("gleak_cwd_probe:build")
        probe = sys.modules["gleak_cwd_probe"]
        assert Path(probe.__file__).parent == tmp_path
        at_import = probe.AT_IMPORT
        assert at_import == before and probe.build.seen == before and sys.path == before
    finally:
        _forget(monkeypatch, "gleak_cwd_probe")


def test_arch_working_directory_never_shadows_installed_modules(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A json.py in the working directory is not what `--arch json:build` imports: the installed json wins."""
    (tmp_path / "json.py").write_text("def build():\n    raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GleakError, match="'json' has no attribute 'build'"):
        build_arch("json:build")
    with pytest.raises(GleakError, match="cannot import 'gleak_no_such_net'"):
        build_arch("gleak_no_such_net:build")


PICKLED_MODULE = """
import torch
from torch import nn


class GleakCwdPickled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))
"""


def test_trusted_pickle_finds_its_classes_in_working_directory(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--trust-pickle loads a whole module whose class lives in mynet.py beside it, as --arch mynet:build would
    find mynet.py; the working directory is on sys.path only while unpickling."""
    import importlib
    import os
    import sys

    name = "gleak_cwd_pickled"
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / f"{name}.py").write_text(PICKLED_MODULE)
    # Nothing but gleak's own lookup may find the module: no '' or working-directory entry on sys.path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(project))])
    sys.path.insert(0, str(project))
    try:
        model = importlib.import_module(name).GleakCwdPickled().eval()
        torch.save(model, project / "whole.pt")
    finally:
        sys.path.remove(str(project))
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
    before = list(sys.path)
    try:
        monkeypatch.chdir(elsewhere)
        with pytest.raises(GleakError, match=r"cannot unpickle .*gleak_cwd_pickled"):
            load_model(project / "whole.pt", trust_pickle=True)
        monkeypatch.chdir(project)
        with pytest.raises(GleakError, match=r"pickled.*--trust-pickle"):
            load_model("whole.pt")
        assert name not in sys.modules
        loaded = load_model("whole.pt", trust_pickle=True)
        assert type(loaded.module).__name__ == "GleakCwdPickled" and "pickled" in loaded.source
        x = torch.randn(2, 4)
        assert torch.equal(loaded.module(x), model(x))
        assert sys.path == before
    finally:
        sys.modules.pop(name, None)
