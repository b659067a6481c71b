"""gleak in NVFlare (the ``nvflare`` extra, ``pip install -e '.[nvflare]'`` from a clone): a DXO filter that
writes one capture per site per round, and :class:`GleakGuardFilter`, a task-data filter that refuses a task whose
global model carries a malicious server's trap (``gleak check-model``).

Add :class:`GleakCaptureFilter` to a client's ``task_result_filters`` (Job API:
``job.to(GleakCaptureFilter("captures"), "site-1", filter_type=FilterType.TASK_RESULT, tasks=["train"])``):

* a ``WEIGHT_DIFF`` result is the update itself; a ``WEIGHTS`` result is turned into local − global;
* the global weights come from the same filter class in the site's ``task_data_filters``
  (``filter_type=FilterType.TASK_DATA``), which hands the model the server sent to the task-result filter of the
  same task (see "How the two filters are linked" below; the model is saved under ``models/``). Without it a
  ``WEIGHT_DIFF`` capture is still written, without the model's sha256, and a ``WEIGHTS`` result is skipped with a
  warning;
* metadata: the round (``current_round`` header), the site name, ``NUM_STEPS_CURRENT_ROUND`` as the local steps,
  plus what the filter is told (learning rate, batch size, optimizer, arch).

Behind a privacy filter (NVFlare's ``PercentilePrivacy`` or ``SVTPrivacy``): a site's task-result filters run
in order (those of the site's privacy scope first, then the job's, in the order ``job.to`` added them), so add
:class:`GleakCaptureFilter` *after* the privacy filter to capture what leaves the site, with
``defense=[the filter]`` to stamp what it did into every capture's ``gleak.defense`` (:func:`defense_record`, with
the equivalent gleak defense where one exists; docs/defenses.md, "Inside FL frameworks").

The filter never changes the DXO (it returns None, "not filtered"); a failure to write is logged, never raised.

How the two filters are linked: through the task's own ``FLContext``, not through a shared object. NVFlare's Job API
exports each filter as its class path and constructor arguments (``config_fed_client.json``) and the client builds
every filter anew from them, so two filters cannot be handed one Python object (an object argument is exported as
a component of its own, and each filter would get its own copy). What NVFlare does hand both is the task's context:
the client runner applies a task's data filters, runs its executor and applies its result filters with one
``FLContext`` (``ClientRunner._do_process_task``). The task-data filter puts the round and the global weights on it
as a private, non-sticky property (:data:`GLOBAL_MODEL_PROP`: never sent to a peer, never carried to another task);
the task-result filter of the same task reads them there. Nothing is kept between tasks, so there is no store to
bound or to clear: the weights are freed with the task's context. A result filter that runs with another context
(its own ``FLContext`` in a test, say) sees no global model and says so, as without the task-data filter.
"""

from __future__ import annotations

import math
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

from gleak.errors import GleakError, shorten
from gleak.integrations.recorder import CaptureRecorder, ClientRecord, defense_entry

GLOBAL_MODEL_PROP = "gleak.nvflare.global_model"
"""The task's ``FLContext`` property (private, not sticky) under which the task-data filter leaves ``(round, global
weights)`` for the task-result filter of the same task (see the module docs)."""


# NVFlare's privacy filters (nvflare.app_common.filters) and the constructor options recorded for each
PRIVACY_FILTERS: dict[str, tuple[str, ...]] = {
    "PercentilePrivacy": ("percentile", "gamma"),
    "SVTPrivacy": ("fraction", "epsilon", "noise_var", "gamma", "tau", "replace", "epsilon_threshold",
                   "epsilon_query", "epsilon_release"),
}
SVT_BUDGET = "svt_privacy_budget"  # the DXO meta property SVTPrivacy writes (its per-call privacy accounting)


def defense_record(defense: Any) -> dict[str, Any]:
    """One ``gleak.defense`` entry for a filter that runs before the capture filter: NVFlare's ``PercentilePrivacy``
    or ``SVTPrivacy`` becomes ``{"name": "nvflare.PercentilePrivacy", "percentile", "gamma"}`` (or the SVT options);
    a mapping with a string ``name`` (and JSON values) is kept as given (checked by
    :func:`~gleak.integrations.recorder.defense_entry`). Each capture's entry adds what the
    filter did to that update and the equivalent gleak defense where one exists."""
    if isinstance(defense, Mapping):
        return defense_entry(defense)
    if isinstance(defense, DXOFilter) and type(defense).__name__ in PRIVACY_FILTERS:
        kind = type(defense).__name__
        return defense_entry({"name": f"nvflare.{kind}",
                              **{k: getattr(defense, k, None) for k in PRIVACY_FILTERS[kind]}})
    raise GleakError(f"defense {shorten(repr(defense), 80)}: expected NVFlare's PercentilePrivacy or SVTPrivacy, "
                     "or a mapping with a 'name'")


def _applied(record: dict[str, Any], dxo: DXO, data: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], str | None]:
    """``record`` with what its filter did to this update (read from the filtered DXO) and ``gleak_equivalent``:
    gleak defense specs that transform the clean update the same way, or None and ``no_equivalent`` (why). The
    second value: a warning when the DXO does not show the filter ran before this one."""
    out = dict(record)
    name = record.get("name")
    steps = dxo.get_meta_prop(MetaKey.NUM_STEPS_CURRENT_ROUND, 1)  # both filters divide by it (default 1)
    m = float(steps) if isinstance(steps, int | float) and not isinstance(steps, bool) and steps > 0 else 1.0
    arrays = [t for t in data.values() if t.dim() > 0]
    if name == "nvflare.PercentilePrivacy":
        # zero every entry with |Δ/m| below the percentile of all |Δ/m|, then clamp each to ±gamma per step
        p, gamma = float(record.get("percentile", 10)), float(record.get("gamma", 0.01))
        if gamma <= 0 or not 0 <= p <= 100:
            out.update(gleak_equivalent=[], note="inactive: NVFlare skips gamma <= 0 or a percentile outside 0..100")
            return out, None
        bound = gamma * m * (1 - 1e-6)
        clamped = sum(int((t.abs() >= bound).sum()) for t in arrays)
        out["clamped"] = clamped  # entries at ±gamma·m: the clamp bound on this update
        if dxo.data_kind != DataKind.WEIGHT_DIFF:
            out.update(gleak_equivalent=None, no_equivalent="applied to the weights, not to the update")
        elif clamped:
            out.update(gleak_equivalent=None, no_equivalent=f"{clamped} entries clamped to ±gamma per local step: "
                       "gleak has no per-entry clamp (topk:ratio=percentile/100,scope=global is the rest)")
        elif p >= 100:
            out.update(gleak_equivalent=None, no_equivalent="percentile 100 keeps only the largest entry")
        else:
            out["gleak_equivalent"] = [f"topk:ratio={round(p / 100, 12)!r},scope=global"]
    elif name == "nvflare.SVTPrivacy":
        # a noisy-threshold (sparse vector) choice of about fraction × the entries; each released entry is
        # clamp(Δ/m, ±gamma) + Laplace(2·gamma·n_upload / epsilon_release), times m; the rest are zeroed
        budget = dxo.get_meta_prop(SVT_BUDGET)
        if not isinstance(budget, Mapping):
            return out, ("gleak: the DXO carries no SVTPrivacy accounting: list GleakCaptureFilter after "
                         "SVTPrivacy to capture what leaves the site")
        n_upload, eps_release = budget.get("n_upload"), budget.get("epsilon_release")
        out.update({k: budget.get(k) for k in ("n_upload", "epsilon_total", "epsilon_release")})
        gamma = float(record.get("gamma", 1e-5))
        if isinstance(n_upload, int | float) and isinstance(eps_release, int | float) and eps_release > 0:
            scale = 2.0 * gamma * float(n_upload) / float(eps_release) * m
            out["release_noise_scale"] = scale
            total = sum(t.numel() for t in arrays)
            if float(record.get("fraction", 0.1)) >= 1 and not record.get("replace", True) and n_upload >= total \
                    and dxo.data_kind == DataKind.WEIGHT_DIFF and math.isfinite(scale):
                out["gleak_equivalent"] = [f"laplace:scale={scale!r}"]
                out["gleak_equivalent_if"] = "every |update entry| / local steps <= gamma (SVT clamps it there)"
            else:
                out.update(gleak_equivalent=None, no_equivalent="SVT releases a random subset of about fraction × "
                           "the entries (noisy threshold queries; drawn with replacement when replace) and clamps "
                           "each to ±gamma per local step: gleak has no random sparsification or per-entry clamp")
    return out, None


def _tensors(data: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {str(k): torch.as_tensor(np.array(v, copy=True)) if not isinstance(v, torch.Tensor)
            else v.detach().cpu().clone() for k, v in data.items()}


class GleakCaptureFilter(DXOFilter):  # type: ignore[misc]  # NVFlare ships no type information
    """Write each ``WEIGHT_DIFF`` / ``WEIGHTS`` task result as a gleak capture; see the module docs.

    ``out_dir``: captures as ``round-NNNN/client-<site>.safetensors``, global models under ``models/``.
    ``arch`` / ``arch_kwargs``: the model's gleak arch spec, stored with the global models. ``defense``: the
    privacy filters that run before this one on the task result, in order (NVFlare's ``PercentilePrivacy`` /
    ``SVTPrivacy`` objects, or mappings with a ``name``), stamped as every capture's ``gleak.defense``.

    Every argument is kept as an attribute of its own name, so NVFlare's Job API exports it into the job's config."""

    def __init__(self, out_dir: str = "gleak-captures", arch: str | None = None,
                 arch_kwargs: Mapping[str, Any] | None = None, learning_rate: float | None = None,
                 batch_size: int | None = None, optimizer: str | None = None, momentum: float | None = None,
                 weight_decay: float | None = None, input_shape: Sequence[int] | None = None,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 save_global: bool = True, force: bool = False, defense: Sequence[Any] | None = None) -> None:
        super().__init__(supported_data_kinds=[DataKind.WEIGHTS, DataKind.WEIGHT_DIFF],
                         data_kinds_to_filter=[DataKind.WEIGHTS, DataKind.WEIGHT_DIFF])
        # plain values under the parameters' names: the Job API serialises a component from these attributes
        self.out_dir, self.arch = str(out_dir), arch
        self.arch_kwargs = dict(arch_kwargs) if arch_kwargs is not None else None
        self.learning_rate, self.batch_size, self.optimizer = learning_rate, batch_size, optimizer
        self.momentum, self.weight_decay = momentum, weight_decay
        self.input_shape = [int(n) for n in input_shape] if input_shape is not None else None
        self.mean = [float(v) for v in mean] if mean is not None else None
        self.std = [float(v) for v in std] if std is not None else None
        self.save_global, self.force = save_global, force
        self.defense = [defense_record(d) for d in defense] if defense else None
        # the filter's own state
        self.recorder = CaptureRecorder(out_dir, arch=arch, arch_kwargs=arch_kwargs, save_global=save_global,
                                        input_shape=input_shape, mean=mean, std=std, force=force,
                                        producer="nvflare filter")
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
            if dxo.data_kind == DataKind.WEIGHTS:  # for the result filter of this task (module docs)
                fl_ctx.set_prop(GLOBAL_MODEL_PROP, (round, _tensors(dxo.data)), private=True, sticky=False)
            return
        known = fl_ctx.get_prop(GLOBAL_MODEL_PROP)
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
        if self.defense:
            record.defense = []
            for entry in self.defense:
                applied, warning = _applied(entry, dxo, received)
                record.defense.append(applied)
                if warning:
                    self._warn(fl_ctx, f"order:{entry.get('name')}", warning)
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


__all__ = ["GLOBAL_MODEL_PROP", "GleakCaptureFilter", "defense_record"]


class GleakGuardFilter(DXOFilter):  # type: ignore[misc]  # NVFlare ships no type information
    """Check the global model a site receives before it trains (``gleak check-model``'s weight tests;
    docs/methods/server.md). Add it to the site's ``task_data_filters`` (Job API: ``job.to(GleakGuardFilter(),
    "site-1", filter_type=FilterType.TASK_DATA, tasks=["train"])``).

    A ``WEIGHTS`` task whose model carries a trap structure is refused: the filter raises with one short line, and
    NVFlare answers the task with ``TASK_DATA_FILTER_ERROR`` without running the executor (``abort_job=True``
    raises NVFlare's ``UnsafeJobError`` instead, which marks the job unsafe and ends the site's run). ``mode``:
    ``refuse`` (default), ``warn`` (log only) or ``off``. The DXO is never changed; an internal error of the check
    is logged and the task trains. Every argument is kept as an attribute of its own name (Job API export)."""

    def __init__(self, mode: str = "refuse", refuse_suspicious: bool = False, abort_job: bool = False) -> None:
        from gleak.integrations.guard import MODES

        super().__init__(supported_data_kinds=[DataKind.WEIGHTS], data_kinds_to_filter=[DataKind.WEIGHTS])
        if mode not in MODES:
            raise GleakError(f"GleakGuardFilter mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.refuse_suspicious, self.abort_job = mode, refuse_suspicious, abort_job

    def process_dxo(self, dxo: DXO, shareable: Shareable, fl_ctx: FLContext) -> DXO | None:
        from gleak.integrations.guard import guard

        try:
            verdict = guard(_tensors(dxo.data), self.mode, None, self.refuse_suspicious)
        except Exception as e:  # the check must never break a task by itself
            self.log_warning(fl_ctx, f"gleak: model check failed: {shorten(f'{type(e).__name__}: {e}', 200)}")
            return None
        if verdict.refused:
            self.log_error(fl_ctx, verdict.line())
            if self.abort_job:
                from nvflare.apis.fl_exception import UnsafeJobError

                raise UnsafeJobError(verdict.line())
            raise GleakError(verdict.line())
        if verdict.hits:
            self.log_warning(fl_ctx, verdict.line())
        return None
