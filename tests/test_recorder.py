"""gleak.integrations.recorder: captures written from inside FL frameworks, never raising into training."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch

from gleak.capture import load_capture, load_truth, truth_path_for
from gleak.integrations import CaptureRecorder, ClientRecord
from gleak.io import tensors_sha256
from gleak.models import build_arch, load_model

ARCH, KWARGS = "lenet", {"activation": "relu"}


def _states(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    g = {k: v.clone() for k, v in build_arch(ARCH, KWARGS).state_dict().items()}
    return g, {k: v + 0.01 * torch.randn_like(v) for k, v in g.items()}


def test_recorder_writes_capture_truth_and_a_loadable_global_model(tmp_path: Path) -> None:
    g, loc = _states()
    rec = CaptureRecorder(tmp_path, arch=ARCH, arch_kwargs=KWARGS)
    x, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
    record = ClientRecord(round=3, client="site/1", learning_rate=0.1, batch_size=4, optimizer="sgd",
                          num_examples=12, extra={"flower.node_id": "7"}, inputs=x, labels=y)
    path = rec.write(g, loc, record)
    assert path == tmp_path / "round-0003" / "client-site_1.safetensors"
    cap = load_capture(path)
    assert cap.kind == "update" and cap.local_steps == 3  # 12 recorded examples / B = 4
    assert cap.meta["gleak.learning_rate"] == 0.1 and cap.meta["gleak.fl.round"] == 3
    assert cap.meta["gleak.fl.client_id"] == "site/1" and cap.extra["flower.node_id"] == "7"
    assert torch.allclose(cap.tensors["fc3.bias"], loc["fc3.bias"] - g["fc3.bias"])
    truth = load_truth(truth_path_for(path), cap)
    assert torch.equal(truth.labels, y)
    model_file = next((tmp_path / "models").glob("round-0003-*.safetensors"))
    assert load_model(model_file).weights_sha256 == cap.meta["gleak.model.sha256"] == tensors_sha256(g)


def test_recorder_never_raises_and_never_overwrites(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    g, loc = _states()
    rec = CaptureRecorder(tmp_path)
    record = ClientRecord(round=1, client="a", batch_size=4, local_steps=2)
    first = rec.write(g, loc, record)
    assert first is not None and "gleak.local_steps" in load_capture(first).meta
    before = first.read_bytes()
    with caplog.at_level(logging.WARNING, logger="gleak.integrations"):
        assert rec.write(g, {k: v + 1 for k, v in loc.items()}, record) is None  # exists: not overwritten
        assert rec.write(g, {"other": torch.zeros(1)}, ClientRecord(round=1, client="b")) is None  # bad states
    assert first.read_bytes() == before
    assert rec.failures == 2 and "already exists" in caplog.text and "different tensors" in caplog.text
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert CaptureRecorder(blocked).write(g, loc, record) is None  # its root is a file: logged, not raised


def test_recorder_leaves_unknown_steps_out_and_pickles(tmp_path: Path) -> None:
    g, loc = _states()
    rec = CaptureRecorder(tmp_path, save_global=False)
    path = rec.write(g, loc, ClientRecord(round=None, client="x"))
    assert path is not None and path.parent.name == "round-unknown"
    assert "gleak.local_steps" not in load_capture(path).meta  # not known: not claimed to be 1
    clone = pickle.loads(pickle.dumps(rec))  # frameworks ship mods and filters to workers
    assert clone.root == rec.root and clone.write(g, loc, ClientRecord(round=2, client="x")) is not None
