"""The client-side guard (issue 46): the framework-free check, Flower's client mod and NVFlare's task-data filter
refuse a crafted global model in one line and let an honest one train."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from gleak.errors import GleakError
from gleak.integrations.guard import check_state, guard
from gleak.models.zoo import build_zoo_model
from gleak.tamper import craft


def states() -> tuple[nn.Module, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = build_zoo_model("mlp")
    return model, dict(model.state_dict()), dict(craft.imprint(model, shuffle=True).model.state_dict())


def test_guard_core_refuses_traps_and_passes_honest_models() -> None:
    model, honest, trapped = states()
    assert not guard(honest).refused and guard(honest).hits == []
    verdict = guard(trapped)
    assert verdict.refused and verdict.line().startswith("gleak: model refused: GLEAK-SERVER-IMPRINT layer body.1")
    assert not guard(trapped, "warn").refused and guard(trapped, "warn").hits
    assert guard(trapped, "off").hits == []
    # with the client's own model: an inserted tensor is an architecture finding
    extra = {**honest, "trap.weight": torch.ones(8, 1) * torch.linspace(-1, 2, 64)}
    assert {h.rule for h in check_state(extra, model)} == {"GLEAK-SERVER-ARCHITECTURE", "GLEAK-SERVER-IMPRINT"}
    assert check_state(honest, model) == []


class TestFlower:
    @pytest.fixture(autouse=True)
    def _flower(self, monkeypatch: pytest.MonkeyPatch) -> None:
        pytest.importorskip("flwr", reason="gleak[flower] not installed")
        from flwr.supercore.task_identity import TaskIdentity  # as tests/test_flower.py: messages made outside an app

        for name in ("_run_id", "_node_id", "_task_id"):
            if hasattr(TaskIdentity, name):
                monkeypatch.setattr(TaskIdentity, name, 1)

    @staticmethod
    def _train(state: dict[str, torch.Tensor]):  # type: ignore[no-untyped-def]
        from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

        return Message(RecordDict({"arrays": ArrayRecord(state), "config": ConfigRecord({})}), dst_node_id=5,
                       message_type=MessageType.TRAIN)

    @staticmethod
    def _context(run_config: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        from flwr.app import Context, RecordDict

        return Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config=run_config or {})

    def test_the_mod_refuses_a_trap_before_training(self, caplog: pytest.LogCaptureFixture) -> None:
        from flwr.app import ArrayRecord, Message, RecordDict

        from gleak.integrations.flower import GUARD_ERROR_CODE, GleakGuardMod

        model, honest, trapped = states()
        trained: list[int] = []

        def train(msg, ctx):  # type: ignore[no-untyped-def]
            trained.append(1)
            return Message(RecordDict({"arrays": ArrayRecord(honest)}), reply_to=msg)

        mod = GleakGuardMod(model=model)
        with caplog.at_level(logging.WARNING):
            reply = mod(self._train(trapped), self._context(), train)
        assert trained == [] and reply.has_error()
        assert reply.error.code == GUARD_ERROR_CODE and "GLEAK-SERVER-IMPRINT" in (reply.error.reason or "")
        assert any("model refused" in r.getMessage() for r in caplog.records)
        assert not mod(self._train(honest), self._context(), train).has_error() and trained == [1]
        # warn only: logged, trained; the run config overrides the mode
        assert not GleakGuardMod("warn")(self._train(trapped), self._context(), train).has_error()
        assert not mod(self._train(trapped), self._context({"gleak-guard-mode": "warn"}), train).has_error()
        assert trained == [1, 1, 1]
        with pytest.raises(GleakError, match="mode must be one of"):
            GleakGuardMod("block")


def test_nvflare_filter_refuses_a_trap() -> None:
    pytest.importorskip("nvflare", reason="gleak[nvflare] not installed")
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.apis.fl_context import FLContextManager

    from gleak.integrations.nvflare import GleakGuardFilter

    _, honest, trapped = states()
    fl_ctx = FLContextManager(identity_name="site-1", job_id="job-1").new_context()
    numpy = {k: v.numpy() for k, v in trapped.items()}
    dxo = DXO(DataKind.WEIGHTS, data=numpy)
    with pytest.raises(GleakError, match="GLEAK-SERVER-IMPRINT"):
        GleakGuardFilter().process_dxo(dxo, dxo.to_shareable(), fl_ctx)
    assert GleakGuardFilter("warn").process_dxo(dxo, dxo.to_shareable(), fl_ctx) is None
    clean = DXO(DataKind.WEIGHTS, data={k: v.numpy() for k, v in honest.items()})
    assert GleakGuardFilter().process_dxo(clean, clean.to_shareable(), fl_ctx) is None
