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

    from gleak.integrations.nvflare import GLOBAL_MODEL_PROP, GleakCaptureFilter

    g, loc = _states()
    data_filter = GleakCaptureFilter(str(tmp_path), arch=ARCH, arch_kwargs=KWARGS)
    data_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_DATA_CHAIN)
    task = DXO(DataKind.WEIGHTS, {k: v.numpy() for k, v in g.items()}).to_shareable()
    task.set_header(AppConstants.CURRENT_ROUND, 4)
    fl_ctx = _fl_ctx()  # NVFlare's client runner: one context for a task's data filters, executor, result filters
    data_filter.process(task, fl_ctx)
    assert fl_ctx.get_prop(GLOBAL_MODEL_PROP)[0] == 4
    result_filter = GleakCaptureFilter(str(tmp_path), arch=ARCH, arch_kwargs=KWARGS, learning_rate=0.01,
                                       batch_size=16)
    result_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    diff = {k: (loc[k] - g[k]).numpy() for k in g}
    result = DXO(DataKind.WEIGHT_DIFF, diff, meta={MetaKey.NUM_STEPS_CURRENT_ROUND: 10}).to_shareable()
    result.set_header(AppConstants.CURRENT_ROUND, 4)
    out = result_filter.process(result, fl_ctx)
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

    from gleak.integrations.nvflare import GleakCaptureFilter

    _, loc = _states()
    flt = GleakCaptureFilter(str(tmp_path))
    flt.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    result = DXO(DataKind.WEIGHTS, {k: v.numpy() for k, v in loc.items()}).to_shareable()
    flt.process(result, _fl_ctx("site-2"))
    assert not list(tmp_path.rglob("client-*.safetensors"))  # skipped, with a warning, not a crash
    broken = DXO(DataKind.WEIGHT_DIFF, {"fc3.bias": "not an array"}).to_shareable()
    assert flt.process(broken, _fl_ctx("site-2")) is not None  # a failure inside the filter: the task goes on
    assert not list(tmp_path.rglob("client-*.safetensors"))


def test_nvflare_the_global_model_lives_in_the_tasks_context_only(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The task-data filter hands the global model to the result filter through the task's FLContext: a result
    filtered under another context (another task) sees none, and the module keeps no state between tasks."""
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.apis.filter import FilterChainType, FilterContextKey
    from nvflare.app_common.app_constant import AppConstants

    from gleak.integrations import nvflare

    assert not any(hasattr(nvflare, name) for name in ("_GLOBALS", "_GLOBALS_LOCK", "forget_globals"))
    g, loc = _states()
    data_filter = nvflare.GleakCaptureFilter(str(tmp_path))
    data_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_DATA_CHAIN)
    task = DXO(DataKind.WEIGHTS, {k: v.numpy() for k, v in g.items()}).to_shareable()
    task.set_header(AppConstants.CURRENT_ROUND, 1)
    data_filter.process(task, _fl_ctx())  # this task's context ends here
    result_filter = nvflare.GleakCaptureFilter(str(tmp_path))
    result_filter.set_prop(FilterContextKey.CHAIN_TYPE, FilterChainType.TASK_RESULT_CHAIN)
    result = DXO(DataKind.WEIGHT_DIFF, {k: (loc[k] - g[k]).numpy() for k in g}).to_shareable()
    result.set_header(AppConstants.CURRENT_ROUND, 1)
    with caplog.at_level("WARNING"):
        result_filter.process(result, _fl_ctx())  # another task
    assert "no global model seen" in caplog.text
    cap = load_capture(tmp_path / "round-0001" / "client-site-1.safetensors")
    assert "gleak.model.sha256" not in cap.meta and not list(tmp_path.glob("models/*"))


@pytest.mark.integration
def test_nvflare_simulator_job_links_the_two_filters_through_the_task(tmp_path: Path) -> None:
    """NVFlare's simulator runs the job the Job API exports (each filter rebuilt from its arguments): every round's
    capture carries the hash of the global model of that round, which only the task-data filter saw."""
    import subprocess
    import sys

    from gleak.capture import load_capture

    from .nvflare_sim_job import GLOBAL, ROUNDS

    script = Path(__file__).with_name("nvflare_sim_job.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), str(tmp_path / "ws")],
                       capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-2000:]
    assert "no global model seen" not in log and "capture skipped" not in log
    state = {k: torch.as_tensor(v) for k, v in GLOBAL.items()}
    for rnd in range(1, ROUNDS + 1):
        cap = load_capture(tmp_path / "out" / f"round-{rnd:04d}" / "client-site-1.safetensors")
        assert cap.meta["gleak.model.sha256"] == tensors_sha256(state) and cap.local_steps == 3
        state = {k: v + 0.1 for k, v in state.items()}
