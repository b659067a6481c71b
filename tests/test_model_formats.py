"""torch.export (.pt2) and TorchScript models: loading one never unpickles or runs what the file holds, and every
label attack works on them or says why it does not apply."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import threading
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gleak.attacks import REGISTRY, build_context, get_attack, run_attack
from gleak.capture import Capture, capture_gradients, load_capture, save_capture
from gleak.data.images import Dataset, load_dataset
from gleak.errors import GleakError
from gleak.models import build_zoo_model, load_model, save_model
from gleak.models.export_archive import (
    UnsafeArchiveError,
    check_program,
    guard_load,
    guard_text_safe,
    pickle_problem,
    sympy_text_safe,
    torch_save_problem,
)

from .conftest import MNIST_AUX

LABEL_ATTACKS = [name for name, cls in REGISTRY.items() if cls.task == "labels"]


class Marker:
    """Unpickling this creates ``path``: the stand-in for a payload that runs code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (self.path, "w")


def saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rewrite(src: Path, dst: Path, files: dict[str, bytes | None] | None = None,
            edit: dict[str, Callable[[Any], None]] | None = None) -> Path:
    """Copy the archive ``src`` to ``dst``: entries (relative to its folder) replaced, added or (None) dropped,
    JSON entries changed in place by ``edit``."""
    files = dict(files or {})
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            rel = info.filename.split("/", 1)[1]
            data = files.pop(rel) if rel in files else zin.read(info.filename)
            if data is None:
                continue
            if edit and rel in edit:
                doc = json.loads(data)
                edit[rel](doc)
                data = json.dumps(doc).encode()
            zout.writestr(info.filename, data)
        for rel, data in files.items():
            if data is not None:
                zout.writestr(f"{root}/{rel}", data)
    return dst


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def lenet() -> nn.Module:
    torch.manual_seed(0)
    return build_zoo_model("lenet").eval()


@pytest.fixture(scope="module")
def inputs() -> torch.Tensor:
    return torch.rand(8, 1, 28, 28, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, lenet: nn.Module, inputs: torch.Tensor) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("formats")
    x = torch.zeros(3, 1, 28, 28)
    out = {"dynamic": d / "dynamic.pt2", "static": d / "static.pt2", "static3": d / "static3.pt2",
           "script": d / "script.pt", "weights": d / "weights.safetensors", "capture": d / "capture.safetensors"}
    dynamic = torch.export.export(lenet, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(dynamic, out["dynamic"])
    torch.export.save(torch.export.export(lenet, (x[:1],)), out["static"])
    torch.export.save(torch.export.export(lenet, (x,)), out["static3"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(lenet).save(str(out["script"]))
    save_model(lenet, out["weights"], "lenet")
    labels = torch.tensor([3, 1, 3, 7, 0, 9, 9, 2])
    save_capture(capture_gradients(lenet, inputs, labels), out["capture"])
    return out


def _capture(files: dict[str, Path]) -> Capture:
    return load_capture(files["capture"])


# ------------------------------------------------------------------------------------------ payloads

def weight_entry(src: Path, fqn: str) -> str:
    """The archive entry (relative to its folder) holding the weight ``fqn``."""
    with zipfile.ZipFile(src) as z:
        name = next(n for n in z.namelist() if n.endswith("data/weights/model_weights_config.json"))
        return "data/weights/" + json.loads(z.read(name))["config"][fqn]["path_name"]


def _weight(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    def pickled(doc: Any) -> None:
        doc["config"]["fc3.bias"]["use_pickle"] = True

    entry = weight_entry(src, "fc3.bias")
    path = rewrite(src, dst, {entry: saved(Marker(marker))}, {"data/weights/model_weights_config.json": pickled})
    return path, entry


def _constant(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    def add(doc: Any) -> None:
        doc["config"]["evil"] = {"path_name": "tensor_0", "is_param": False, "use_pickle": True, "tensor_meta": None}

    path = rewrite(src, dst, {"data/constants/tensor_0": saved(Marker(marker))},
                   {"data/constants/model_constants_config.json": add})
    return path, "data/constants/tensor_0"


def _sample_inputs(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    return rewrite(src, dst, {"data/sample_inputs/model.pt": saved(((Marker(marker),), {}))}), \
        "data/sample_inputs/model.pt"


def _opaque(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    def add(doc: Any) -> None:
        doc["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                 "tensor_meta": None}

    path = rewrite(src, dst, {"data/constants/opaque_obj_0": pickle.dumps(Marker(marker))},
                   {"data/constants/model_constants_config.json": add})
    return path, "data/constants/opaque_obj_0"


def _legacy_weights(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    return rewrite(src, dst, {"data/weights/model.pt": saved(Marker(marker))}), "data/weights/model.pt"


def _legacy_format(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    """The pre-2.7 layout torch.export.load falls back to: top-level version and serialized_* entries."""
    from torch._export.serde.schema import SCHEMA_VERSION

    with zipfile.ZipFile(src) as zin:
        program = zin.read(zin.namelist()[0].split("/", 1)[0] + "/models/model.json")
    with zipfile.ZipFile(dst, "w") as z:
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        z.writestr("serialized_exported_program.json", program)
        z.writestr("serialized_state_dict.pt", saved({}))
        z.writestr("serialized_constants.pt", saved(Marker(marker)))
        z.writestr("serialized_example_inputs.pt", saved(((torch.zeros(2, 1, 28, 28),), {})))
    return dst, "serialized_constants.pt"


def _json_payload(old: str, new: Callable[[Path], str]) -> Callable[[Path, Path, Path], tuple[Path, str]]:
    """A payload in the program JSON: the raw JSON text ``old`` replaced by ``new(marker)``."""
    def build(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
        def edit(doc: Any) -> None:
            text = json.dumps(doc)
            assert old in text
            doc.clear()
            doc.update(json.loads(text.replace(old, new(marker))))

        return rewrite(src, dst, edit={"models/model.json": edit}), "models/model.json"

    return build


def _first_with(doc: Any, key: str) -> dict[str, Any]:
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if key in item:
                return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    raise AssertionError(f"no {key!r} in the program")


def _sympy(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    def edit(doc: Any) -> None:
        holder = _first_with(doc, "expr_str")
        holder["expr_str"] = f"{OPEN.format(str(marker))} and {holder['expr_str']}"

    return rewrite(src, dst, edit={"models/model.json": edit}), "models/model.json"


def _guards(src: Path, dst: Path, marker: Path) -> tuple[Path, str]:
    def edit(doc: Any) -> None:
        doc["guards_code"] = [f"{OPEN.format(str(marker))} is not None"]

    return rewrite(src, dst, edit={"models/model.json": edit}), "models/model.json"


OPEN = "__import__('builtins').open({!r}, 'w')"
PAYLOADS: dict[str, Callable[[Path, Path, Path], tuple[Path, str]]] = {
    "weight": _weight,
    "constant": _constant,
    "sample_inputs": _sample_inputs,
    "opaque_object": _opaque,
    "legacy_weights": _legacy_weights,
    "legacy_format": _legacy_format,
    "sympy_expression": _sympy,
    "guards_code": _guards,
    "call_target": _json_payload('"torch.ops.aten.relu.default"', lambda m: '"torch.os.system"'),
    "argument_name": _json_payload('"forward_arg_names": ["x"]',
                                   lambda m: f'"forward_arg_names": [{json.dumps("x=" + OPEN.format(str(m)))}]'),
}
PICKLE_PAYLOADS = ["weight", "constant", "sample_inputs", "opaque_object", "legacy_weights", "legacy_format"]


@pytest.fixture
def evil(files: dict[str, Path], tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str, Path]:
    marker = tmp_path / "MARKER"
    path, entry = PAYLOADS[request.param](files["dynamic"], tmp_path / "evil.pt2", marker)
    return path, entry, marker


@pytest.mark.parametrize("evil", [*PICKLE_PAYLOADS, "sympy_expression", "guards_code"], indirect=True)
def test_payloads_are_live_when_trusted(evil: tuple[Path, str, Path]) -> None:
    """The payloads below are real: loading them as torch does (trusted) runs them."""
    path, _, marker = evil
    with contextlib.suppress(Exception), guard_load(path, trusted=True):
        torch.export.load(str(path)).module()(torch.zeros(2, 1, 28, 28))  # guard code runs on the first call
    assert marker.exists()


@pytest.mark.parametrize("evil", list(PAYLOADS), indirect=True)
def test_cli_refuses_payload_in_one_line(gleak: Any, files: dict[str, Path], evil: tuple[Path, str, Path]) -> None:
    path, entry, marker = evil
    result = gleak("inspect", files["capture"], "--model", path)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert entry in lines[0] and "--trust-pickle" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not marker.exists()


@pytest.mark.parametrize("evil", list(PAYLOADS), indirect=True)
def test_load_model_refuses_payload(evil: tuple[Path, str, Path]) -> None:
    path, entry, marker = evil
    with pytest.raises(GleakError, match=entry.replace(".", r"\.")):
        load_model(path)
    assert not marker.exists()


@pytest.mark.parametrize("evil", [*PICKLE_PAYLOADS, "sympy_expression"], indirect=True)
def test_second_line_stops_torch_even_without_the_inspection(evil: tuple[Path, str, Path]) -> None:
    """Skip the archive inspection: torch.export.load itself must not get to unpickle or evaluate the payload
    (this includes the sample inputs' silent retry with weights_only=False)."""
    path, _, marker = evil
    with pytest.raises(GleakError), guard_load(path, trusted=False) as guard:
        try:
            torch.export.load(str(path))
        except Exception as exc:
            raise guard.cause(exc) from None
    assert not marker.exists()


def test_guarded_load_leaves_torch_as_it_was(files: dict[str, Path]) -> None:
    before = (torch.load, pickle.loads, torch._C._pickle_load_obj)
    with guard_load(files["dynamic"], trusted=False):
        torch.export.load(str(files["dynamic"]))
    assert (torch.load, pickle.loads, torch._C._pickle_load_obj) == before


def test_trust_pickle_loads_a_benign_pickled_constant(tmp_path: Path, lenet: nn.Module) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = lenet
            self.scale = torch.tensor(2.0)  # a lifted tensor constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x) * self.scale

    model = Scaled().eval()
    x = torch.rand(2, 1, 28, 28)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "plain.pt2")

    def pickled(doc: Any) -> None:
        (meta,) = doc["config"].values()
        meta["use_pickle"] = True

    path = rewrite(tmp_path / "plain.pt2", tmp_path / "scaled.pt2",
                   {"data/constants/tensor_0": saved(torch.tensor(2.0))},
                   {"data/constants/model_constants_config.json": pickled})
    with pytest.raises(GleakError, match=r"data/constants/tensor_0' is a pickle \(use_pickle\)"):
        load_model(path)
    loaded = load_model(path, trust_pickle=True)
    torch.testing.assert_close(loaded.module(x), model(x))


def test_missing_or_corrupt_weight_is_one_error_line(gleak: Any, files: dict[str, Path], tmp_path: Path) -> None:
    entry = weight_entry(files["dynamic"], "fc1.weight")
    cases = {
        "missing": ({entry: None}, f"{entry}' (weight 'fc1.weight') is missing"),
        "ragged": ({entry: b"\0" * 101}, "multiple of element size"),  # torch < 2.13: "must be a multiple"
        "short": ({entry: b"\0" * 400}, "out of bounds"),
    }
    for name, (change, expected) in cases.items():
        path = rewrite(files["dynamic"], tmp_path / f"{name}.pt2", change)
        result = gleak("inspect", files["capture"], "--model", path)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr
        assert expected in lines[0] and "Traceback" not in result.stderr


def test_valid_archives_load_quietly(gleak: Any, files: dict[str, Path]) -> None:
    for name in ("dynamic", "static", "script"):
        result = gleak("inspect", files["capture"], "--model", files[name], "--format", "json")
        assert result.exit_code == 0 and result.stderr == "", (name, result.stderr)


def test_check_program_refuses_calls_that_are_not_operators(files: dict[str, Path]) -> None:
    program = torch.export.load(str(files["dynamic"]))
    check_program(program, files["dynamic"])
    graph = program.graph
    first = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_before(first):
        graph.call_function(os.getcwd, ())
    with pytest.raises(UnsafeArchiveError, match="getcwd"):
        check_program(program, files["dynamic"])


def test_text_and_pickle_checks() -> None:
    assert sympy_text_safe("Symbol('s77', positive=True, integer=True)")
    assert sympy_text_safe("Max(1, FloorDiv(s0, 2)) + 3*s1 <= 64")
    for bad in ("__import__('os')", "S('x')", "s0.__class__", "lambdify(s0, 'x')", "exec(s0)", "[s0][0]"):
        assert not sympy_text_safe(bad), bad
    assert guard_text_safe("L['x'].size()[0] <= 64")
    assert guard_text_safe("Eq(Mod(L['x'].size()[0], 2), 0) and math.floor(2.5) == 2")
    for bad in ("L['x'].__class__", "torch.load('f')", "L['x\"'].size()", "open('f')", "L['x'].size()[0] or exec"):
        assert not guard_text_safe(bad), bad
    assert torch_save_problem(saved({"w": torch.ones(2)})) is None
    assert "io.open" in (pickle_problem(pickle.dumps(Marker(Path("m")), protocol=2)) or "")
    assert "STACK_GLOBAL" in (pickle_problem(pickle.dumps(Marker(Path("m")), protocol=4)) or "")
    assert "not a torch.save zip" in (torch_save_problem(pickle.dumps([1])) or "")


# ------------------------------------------------------------------------------------------ attacks


@pytest.fixture(scope="module")
def reference(files: dict[str, Path]) -> dict[str, list[int]]:
    ctx = build_context(_capture(files), load_model(files["weights"]))
    return {name: run_attack(get_attack(name), ctx).output.counts.tolist() for name in ("llg", "ilrg")}


@pytest.fixture(scope="module")
def aux() -> Dataset:
    return load_dataset(MNIST_AUX)


@pytest.mark.parametrize("fmt", ["dynamic", "static", "script"])
def test_label_attacks_run_or_say_why(files: dict[str, Path], fmt: str, reference: dict[str, list[int]],
                                      aux: Dataset) -> None:
    ctx = build_context(_capture(files), load_model(files[fmt]), aux)
    results = {name: run_attack(get_attack(name), ctx) for name in LABEL_ATTACKS}
    for name, result in results.items():
        assert result.status in ("ok", "not_applicable"), (name, result.status, result.reason)
        if result.status == "not_applicable":
            assert result.reason and "\n" not in result.reason
    for name in ("llg", "ilrg"):
        assert results[name].status == "ok" and results[name].output.counts.tolist() == reference[name]
    forward = [n for n in LABEL_ATTACKS if REGISTRY[n].requires.needs_model_forward]
    assert len(forward) >= 5
    for name in forward:
        if fmt == "script":
            assert "TorchScript" in (results[name].reason or ""), name
        elif fmt == "static" and REGISTRY[name].requires.needs_batch_forward:
            # calibrated trains simulated clients on batches of B: a program exported for batches of 1 cannot
            # (it passed here only while a process-wide cache reused the dynamic export's calibration)
            assert results[name].status == "not_applicable" and "dynamic batch" in (results[name].reason or "")
        else:
            assert results[name].status == "ok", (name, results[name].reason)


@pytest.mark.parametrize("fmt", ["dynamic", "static3"])
def test_features_and_logits_equal_the_eager_module(files: dict[str, Path], fmt: str, lenet: nn.Module,
                                                    inputs: torch.Tensor) -> None:
    ctx = build_context(_capture(files), load_model(files[fmt]))
    seen: list[torch.Tensor] = []
    handle = lenet.fc3.register_forward_hook(lambda _m, args, _o: seen.append(args[0]))
    try:
        with torch.no_grad():
            logits = lenet(inputs[:7])
    finally:
        handle.remove()
    h, z = ctx.features_and_logits(inputs[:7])  # 7 = 3 + 3 + 1 padded to 3 for the static export
    torch.testing.assert_close(h, seen[0])
    torch.testing.assert_close(z, logits)


def test_whole_batch_attacks_say_why_on_a_static_export(files: dict[str, Path]) -> None:
    static = build_context(_capture(files), load_model(files["static"]))
    reason = get_attack("dlg").not_applicable(static)
    assert reason is not None and "exactly 1 example" in reason and "B = 8" in reason
    assert get_attack("zlg").not_applicable(static) is None  # chunked forwards still work
    dynamic = build_context(_capture(files), load_model(files["dynamic"]))
    assert get_attack("dlg").not_applicable(dynamic) is None
    script = build_context(_capture(files), load_model(files["script"]))
    assert "TorchScript" in (get_attack("dlg").not_applicable(script) or "")


def test_exported_last_layer_is_hookable_and_unchanged(files: dict[str, Path], inputs: torch.Tensor) -> None:
    loaded = load_model(files["dynamic"])
    before = loaded.module(inputs)
    ctx = build_context(_capture(files), loaded)
    assert ctx.no_forward_reason is None
    torch.testing.assert_close(loaded.module(inputs), before)
    names = [n for n, _ in loaded.module.named_parameters()]
    assert "fc3.weight" in names and "fc3.bias" in names
    assert build_context(_capture(files), loaded).layer.weight_key == "fc3.weight"  # found again after the tap


def test_inspect_lists_what_applies(gleak: Any, files: dict[str, Path]) -> None:
    def attacks(fmt: str) -> dict[str, Any]:
        result = gleak("inspect", files["capture"], "--model", files[fmt], "--format", "json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["attacks"]

    script, static, dynamic = attacks("script"), attacks("static"), attacks("dynamic")
    assert script["ilrg"] is None and script["llg"] is None and "TorchScript" in script["zlg"]
    assert static["zlg"] is None and "exactly 1" in static["dlg"]
    assert dynamic["zlg"] is None and dynamic["dlg"] is None


# ------------------------------------------------------------------------------------------ inside a host process


class HostObject:
    """What a host program (a Flower or Ray server) unpickles all the time: an instance of its own class."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostObject) and other.value == self.value


def test_a_host_thread_keeps_unpickling_and_logging_while_gleak_loads_models(
        files: dict[str, Path], tmp_path: Path) -> None:
    """gleak as a library: its safety checks act in the loading thread only. A host thread that unpickles in full,
    calls torch.load and logs on a torch logger throughout sees no error and loses no record, while the main thread
    loads .pt2 and TorchScript models and hostile archives are still refused."""
    marker = tmp_path / "MARKER"
    hostile = [PAYLOADS[name](files["dynamic"], tmp_path / f"{name}.pt2", marker)[0]
               for name in ("weight", "sample_inputs", "sympy_expression")]
    blob = pickle.dumps({"object": HostObject(7), "numbers": [1, 2.5]})
    tensors = saved({"w": torch.arange(3.0)})
    seen: list[logging.LogRecord] = []
    host_logger = logging.getLogger("torch.gleak_host_test")
    collect = logging.Handler()
    collect.emit = seen.append  # type: ignore[method-assign]
    host_logger.addHandler(collect)
    loading, stop = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    counts = {"calls": 0, "during_loads": 0, "logged": 0}

    def host() -> None:
        while not stop.is_set():
            during = loading.is_set()
            try:
                assert pickle.loads(blob)["object"] == HostObject(7)
                assert pickle.load(io.BytesIO(blob))["numbers"] == [1, 2.5]
                assert torch.load(io.BytesIO(tensors), weights_only=False)["w"].tolist() == [0.0, 1.0, 2.0]
                host_logger.warning("host record %d", counts["calls"])
                counts["logged"] += 1
            except BaseException as exc:  # every failure in the host counts
                errors.append(exc)
            counts["calls"] += 1
            counts["during_loads"] += during

    thread = threading.Thread(target=host)
    thread.start()
    try:
        for _ in range(4):
            loading.set()
            try:
                load_model(files["dynamic"])
                load_model(files["script"])
                for path in hostile:
                    with pytest.raises(GleakError, match="--trust-pickle"):
                        load_model(path)
            finally:
                loading.clear()
    finally:
        stop.set()
        thread.join()
        host_logger.removeHandler(collect)
    assert errors == [], f"{len(errors)} of the host's {counts['calls']} calls failed, first: {errors[:1]}"
    assert counts["during_loads"] > 0  # the host did run while gleak was loading
    assert len(seen) == counts["logged"] > 0
    assert not marker.exists()
    assert (torch.load, pickle.loads, pickle.load, torch._C._pickle_load_obj) == ORIGINALS


ORIGINALS = (torch.load, pickle.loads, pickle.load, torch._C._pickle_load_obj)


def test_audit_of_a_fixed_batch_export_says_why_it_is_not_calibrated(gleak: Any, files: dict[str, Path]) -> None:
    """The audit calibrates label attacks by training simulated clients on batches of B; a program exported for
    batches of 1 cannot run them: one reason, exit 0, never an internal error (exit 3 before)."""
    result = gleak("audit", files["capture"], "--model", files["static"], "--aux", MNIST_AUX, "--fail-on", "none",
                   "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    failed = [n for n in report["notices"] if n["code"] == "ATTACK_FAILED" and n["message"].startswith("calibrated")]
    assert failed and "dynamic batch" in failed[0]["message"]
