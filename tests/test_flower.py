"""gleak.integrations.flower with flwr's real Message, ArrayRecord and Context classes: the client mod and the
server-side strategy wrapper."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="gleak[flower] not installed")

from gleak.capture import load_capture, load_truth, truth_path_for
from gleak.models import load_model

from .conftest import MNIST_AUX, SAMPLES
from .test_recorder import ARCH, KWARGS, _states


@pytest.fixture(autouse=True)
def _flower_task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages made outside a running app need the task identity Flower's runtime would set."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        if hasattr(TaskIdentity, name):
            monkeypatch.setattr(TaskIdentity, name, 1)


def _flower_pair(config: dict, state: dict[str, torch.Tensor]):  # type: ignore[no-untyped-def]
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

    return Message(RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord(config)}), dst_node_id=5,
                   message_type=MessageType.TRAIN)


def _context(node: int = 5):  # type: ignore[no-untyped-def]
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=node, node_config={"partition-id": 2, "num-partitions": 3},
                   state=RecordDict(), run_config={"local-epochs": 1})


def test_flower_mod_writes_the_update_and_leaves_the_reply_alone(tmp_path: Path) -> None:
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    from gleak.integrations.flower import GleakCaptureMod, record_batch

    g, loc = _states()
    msg = _flower_pair({"server-round": 2, "lr": 0.05, "batch-size": 4}, g)
    ctx = _context()
    x, y = torch.randn(8, 1, 28, 28), torch.tensor([0, 1, 2, 3, 3, 3, 9, 9])

    def client(m, c):  # type: ignore[no-untyped-def]
        record_batch(c, x[:4], y[:4])
        record_batch(c, x[4:], y[4:])
        return Message(RecordDict({"arrays": ArrayRecord(loc), "metrics": MetricRecord({"num-examples": 8})}),
                       reply_to=m)

    mod = GleakCaptureMod(tmp_path, arch=ARCH, arch_kwargs=KWARGS)
    reply = mod(msg, ctx, client)
    mod.flush()  # the capture is written by the mod's writer thread
    returned = reply.content["arrays"].to_torch_state_dict()
    assert all(torch.equal(returned[k], loc[k]) for k in loc)  # the reply is what the client returned
    assert not any(k.startswith("gleak.") for k in ctx.state)  # the recorded batches were cleared
    cap = load_capture(tmp_path / "round-0002" / "client-5.safetensors")
    assert cap.meta["gleak.learning_rate"] == 0.05 and cap.local_steps == 2 and cap.batch_size == 4
    assert cap.extra["flower.partition-id"] == "2" and cap.extra["fl.reported_examples"] == "8"
    assert torch.equal(load_truth(truth_path_for(cap.path), cap).labels, y)  # type: ignore[arg-type]
    timing = json.loads((tmp_path / "gleak-mod.jsonl").read_text())
    assert timing["capture"] == str(cap.path) and timing["blocking_seconds"] < timing["write_seconds"] + 1


def test_flower_mod_passes_other_messages_and_survives_a_failing_write(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    from flwr.app import ArrayRecord, Message, MessageType, RecordDict

    from gleak.integrations.flower import GleakCaptureMod

    g, loc = _states()
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    mod = GleakCaptureMod(blocked)
    evaluate = Message(RecordDict({"arrays": ArrayRecord(g)}), dst_node_id=5, message_type=MessageType.EVALUATE)
    assert mod(evaluate, _context(), lambda m, c: m) is evaluate  # not a train message: untouched, no capture
    msg = _flower_pair({"server-round": 1}, g)
    reply = Message(RecordDict({"arrays": ArrayRecord(loc)}), reply_to=msg)
    with caplog.at_level(logging.WARNING):
        assert mod(msg, _context(), lambda m, c: reply) is reply
        mod.flush()
    assert "no capture written" in caplog.text and mod.recorder.failures == 1


def test_flower_strategy_audits_each_reply_and_aggregates_unchanged(tmp_path: Path) -> None:
    """The wrapper recovers a client's labels from its reply (one local step, B = 8, untrained LeNet)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvg

    from gleak.integrations.flower import GleakAuditStrategy

    model = load_model(SAMPLES / "models" / "lenet_untrained.safetensors").module
    g = {k: v.clone() for k, v in model.state_dict().items()}
    from gleak.data.images import load_dataset

    data = load_dataset(MNIST_AUX)
    x, y = data.batch(range(100, 108))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    loc = {k: v.detach().clone() for k, v in model.state_dict().items()}
    strategy = GleakAuditStrategy(FedAvg(), model=ARCH, arch_kwargs=KWARGS, aux=MNIST_AUX,
                                  log_path=tmp_path / "audit.jsonl", capture_dir=tmp_path / "caps",
                                  confidence=0)  # calibration: covered by the simulation test and test_confidence
    strategy._round = {1: (ArrayRecord(g), ConfigRecord({"lr": 0.1, "batch-size": 8, "local-steps": 1}))}
    sent = _flower_pair({"server-round": 1}, g)
    reply = Message(RecordDict({"arrays": ArrayRecord(loc), "metrics": MetricRecord({"num-examples": 8})}),
                    reply_to=sent)
    arrays, _ = strategy.aggregate_train(1, [reply])
    assert arrays is not None and torch.allclose(arrays.to_torch_state_dict()["fc3.bias"], loc["fc3.bias"])
    line = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])
    truth = torch.bincount(y, minlength=10).tolist()
    exact = [a["attack"] for a in line["attacks"] if a["counts"] == truth]
    assert line["status"] == "ok" and len(exact) >= 2, line["attacks"]  # e.g. llg-plus, posterior, rlu
    assert any(f["rule"] == "GLEAK-LABELS-AGREE" for f in line["findings"])
    assert len(list((tmp_path / "caps").rglob("client-*.safetensors"))) == 1
    with pytest.raises(Exception, match="already exists"):
        GleakAuditStrategy(FedAvg(), model=ARCH, log_path=tmp_path / "audit.jsonl")


@pytest.mark.parametrize("values", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(5, dtype=np.int64), np.array(2.5),
    np.array([True, False]), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.arange(4, dtype=">f4"), np.zeros((0, 3), dtype=np.float16)], ids=str)
def test_the_fast_array_reader_equals_flowers_own(values: np.ndarray) -> None:
    from flwr.app import Array

    from gleak.integrations.flower import _tensor

    array = Array(values)
    got = _tensor(array)
    assert got.numpy().tolist() == array.numpy().tolist() and got.numpy().dtype.isnative
