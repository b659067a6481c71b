"""gleak.integrations.nvflare with NVFlare's real DXO, Shareable and FLContext classes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("nvflare", reason="gleak[nvflare] not installed")

from gleak.capture import load_capture
from gleak.io import tensors_sha256
from gleak.models import load_model

from .test_recorder import ARCH, KWARGS, _states


def _fl_ctx(site: str = "site-1"):  # type: ignore[no-untyped-def]
    from nvflare.apis.fl_context import FLContextManager

    return FLContextManager(identity_name=site, job_id="job-1").new_context()


def test_nvflare_filter_writes_weight_diff_with_round_steps_and_site(tmp_path: Path) -> None:
    from nvflare.apis.dxo import DXO, DataKind, MetaKey, from_shareable
    from nvflare.apis.filter import FilterChainType, FilterContextKey
    from nvflare.app_common.app_constant import AppConstants

    from gleak.integrations.nvflare import GleakCaptureFilter, forget_globals

    forget_globals()
    g, loc = _states()
    data_filter = GleakCaptureFilter(str(tmp_path), arch=ARCH, arch_kwargs=KWARGS)
    data_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_DATA_CHAIN)
    task = DXO(DataKind.WEIGHTS, {k: v.numpy() for k, v in g.items()}).to_shareable()
    task.set_header(AppConstants.CURRENT_ROUND, 4)
    data_filter.process(task, _fl_ctx())
    result_filter = GleakCaptureFilter(str(tmp_path), arch=ARCH, arch_kwargs=KWARGS, learning_rate=0.01,
                                       batch_size=16)
    result_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    diff = {k: (loc[k] - g[k]).numpy() for k in g}
    result = DXO(DataKind.WEIGHT_DIFF, diff, meta={MetaKey.NUM_STEPS_CURRENT_ROUND: 10}).to_shareable()
    result.set_header(AppConstants.CURRENT_ROUND, 4)
    out = result_filter.process(result, _fl_ctx())
    back = from_shareable(out)
    assert back.data_kind == DataKind.WEIGHT_DIFF and all((back.data[k] == diff[k]).all() for k in diff)
    cap = load_capture(tmp_path / "round-0004" / "client-site-1.safetensors")
    assert cap.local_steps == 10 and cap.batch_size == 16 and cap.meta["gleak.fl.client_id"] == "site-1"
    assert cap.meta["gleak.model.sha256"] == tensors_sha256(g)
    assert torch.allclose(cap.tensors["fc1.weight"], loc["fc1.weight"] - g["fc1.weight"], atol=1e-6)
    models = list((tmp_path / "models").glob("round-0004-*.safetensors"))
    assert len(models) == 1 and load_model(models[0]).weights_sha256 == tensors_sha256(g)


def test_nvflare_weights_result_needs_the_global_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.apis.filter import FilterChainType, FilterContextKey

    from gleak.integrations.nvflare import GleakCaptureFilter, forget_globals

    forget_globals()
    _, loc = _states()
    flt = GleakCaptureFilter(str(tmp_path))
    flt.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    result = DXO(DataKind.WEIGHTS, {k: v.numpy() for k, v in loc.items()}).to_shareable()
    flt.process(result, _fl_ctx("site-2"))
    assert not list(tmp_path.rglob("client-*.safetensors"))  # skipped, with a warning, not a crash
    broken = DXO(DataKind.WEIGHT_DIFF, {"fc3.bias": "not an array"}).to_shareable()
    assert flt.process(broken, _fl_ctx("site-2")) is not None  # a failure inside the filter: the task goes on
    assert not list(tmp_path.rglob("client-*.safetensors"))
