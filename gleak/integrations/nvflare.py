"""gleak in NVFlare (the ``nvflare`` extra, ``pip install -e '.[nvflare]'`` from a clone): a DXO filter that
writes one capture per site per round.

Add :class:`GleakCaptureFilter` to a client's ``task_result_filters`` (Job API:
``job.to(GleakCaptureFilter("captures"), "site-1", filter_type=FilterType.TASK_RESULT, tasks=["train"])``):

* a ``WEIGHT_DIFF`` result is the update itself; a ``WEIGHTS`` result is turned into local − global;
* the global weights come from the same filter class in the site's ``task_data_filters``
  (``filter_type=FilterType.TASK_DATA``), which remembers the model the server sent (and saves it under
  ``models/``). Without it a ``WEIGHT_DIFF`` capture is still written, without the model's sha256, and a
  ``WEIGHTS`` result is skipped with a warning;
* metadata: the round (``current_round`` header), the site name, ``NUM_STEPS_CURRENT_ROUND`` as the local steps,
  plus what the filter is told (learning rate, batch size, optimizer, arch).

The filter never changes the DXO (it returns None, "not filtered"); a failure to write is logged, never raised.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from nvflare.apis.dxo import DXO, DataKind, MetaKey
from nvflare.apis.dxo_filter import DXOFilter
from nvflare.apis.filter import FilterChainType, FilterContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.app_constant import AppConstants

from gleak.errors import shorten
from gleak.integrations.recorder import CaptureRecorder, ClientRecord

# the last global model each (job, site) received, from the task-data instance to the task-result instance
# (NVFlare builds one filter object per chain)
_GLOBALS: dict[tuple[str, str], tuple[int | None, dict[str, torch.Tensor]]] = {}
_GLOBALS_LOCK = threading.Lock()


def _tensors(data: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {str(k): torch.as_tensor(np.array(v, copy=True)) if not isinstance(v, torch.Tensor)
            else v.detach().cpu().clone() for k, v in data.items()}


class GleakCaptureFilter(DXOFilter):
    """Write each ``WEIGHT_DIFF`` / ``WEIGHTS`` task result as a gleak capture; see the module docs.

    ``out_dir``: captures as ``round-NNNN/client-<site>.safetensors``, global models under ``models/``.
    ``arch`` / ``arch_kwargs``: the model's gleak arch spec, stored with the global models."""

    def __init__(self, out_dir: str = "gleak-captures", arch: str | None = None,
                 arch_kwargs: Mapping[str, Any] | None = None, learning_rate: float | None = None,
                 batch_size: int | None = None, optimizer: str | None = None, momentum: float | None = None,
                 weight_decay: float | None = None, input_shape: Sequence[int] | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 save_global: bool = True, force: bool = False) -> None:
        super().__init__(supported_data_kinds=[DataKind.WEIGHTS, DataKind.WEIGHT_DIFF],
                         data_kinds_to_filter=[DataKind.WEIGHTS, DataKind.WEIGHT_DIFF])
        self.recorder = CaptureRecorder(out_dir, arch=arch, arch_kwargs=arch_kwargs, save_global=save_global,
                                        input_shape=input_shape, mean=mean, std=std, force=force,
                                        producer="nvflare filter")
        self.learning_rate, self.batch_size, self.optimizer = learning_rate, batch_size, optimizer
        self.momentum, self.weight_decay = momentum, weight_decay
        self._warned: set[str] = set()

    def process_dxo(self, dxo: DXO, shareable: Shareable, fl_ctx: FLContext) -> DXO | None:
        try:
            self._process(dxo, shareable, fl_ctx)
        except Exception as e:  # a filter must never break the task
            self.log_warning(fl_ctx, f"gleak: capture skipped: {shorten(f'{type(e).__name__}: {e}', 300)}")
        return None  # never filtered: the DXO goes on unchanged

    def _process(self, dxo: DXO, shareable: Shareable, fl_ctx: FLContext) -> None:
        site = str(fl_ctx.get_identity_name() or "site")
        key = (str(fl_ctx.get_job_id() or ""), site)
        round = _round(dxo, shareable)
        if self.get_prop(FilterContextKey.CHAIN_TYPE) == FilterChainType.TASK_DATA_CHAIN:
            if dxo.data_kind == DataKind.WEIGHTS:
                with _GLOBALS_LOCK:
                    _GLOBALS[key] = (round, _tensors(dxo.data))
            return
        with _GLOBALS_LOCK:
            known = _GLOBALS.get(key)
        global_state = known[1] if known is not None and (round is None or known[0] in (None, round)) else None
        received = _tensors(dxo.data)
        if dxo.data_kind == DataKind.WEIGHTS:
            if global_state is None:
                self._warn(fl_ctx, "weights", "gleak: a WEIGHTS result needs the global model: add "
                           "GleakCaptureFilter to the site's task_data_filters too; skipped")
                return
            local_state = received
        else:
            if global_state is None:
                self._warn(fl_ctx, "diff", "gleak: no global model seen (add GleakCaptureFilter to the site's "
                           "task_data_filters): captures carry no gleak.model.sha256 and no model is saved")
            base = global_state if global_state is not None else {k: torch.zeros_like(v) for k, v in received.items()}
            missing = sorted(set(received) - set(base))
            if missing:
                raise ValueError(f"the result has tensors the global model lacks: {', '.join(missing[:5])}")
            base = {k: base[k] for k in received}  # a diff may cover only part of the model
            local_state = {k: base[k].to(received[k].dtype) + received[k] for k in received}
            global_state = base if global_state is not None else None
        steps = dxo.get_meta_prop(MetaKey.NUM_STEPS_CURRENT_ROUND)
        record = ClientRecord(
            round=round, client=site, learning_rate=self.learning_rate,
            local_steps=int(steps) if isinstance(steps, int | float) and steps >= 1 else None,
            batch_size=self.batch_size, optimizer=self.optimizer, momentum=self.momentum,
            weight_decay=self.weight_decay, extra={"nvflare.site": site, "nvflare.job_id": key[0],
                                                   "nvflare.data_kind": str(dxo.data_kind)})
        if global_state is not None:
            self.recorder.write(global_state, local_state, record)
        else:
            self._write_without_global(received, record)

    def _write_without_global(self, diff: dict[str, torch.Tensor], record: ClientRecord) -> None:
        """A WEIGHT_DIFF capture when the global model is unknown: the update, with no model hash."""
        zeros = {k: torch.zeros_like(v) for k, v in diff.items()}
        capture, _ = self.recorder.build(zeros, diff, record)
        capture.meta.pop("gleak.model.sha256", None)  # the hash of zeros would be a false statement
        self.recorder.write_built(capture, None, None, record)

    def _warn(self, fl_ctx: FLContext, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.log_warning(fl_ctx, message)


def _round(dxo: DXO, shareable: Shareable) -> int | None:
    for value in (shareable.get_header(AppConstants.CURRENT_ROUND), dxo.get_meta_prop(MetaKey.CURRENT_ROUND)):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def forget_globals() -> None:
    """Drop the remembered global models (tests; a long-lived client process between jobs)."""
    with _GLOBALS_LOCK:
        _GLOBALS.clear()


__all__ = ["GleakCaptureFilter", "forget_globals"]
