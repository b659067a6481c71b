"""Auditing many captures: discover them, start the executor (:mod:`gleak.runs.audit.executors`) with what
every worker loads once, and stream the per-capture results, in the captures' order, into one
:class:`~gleak.report.model.Report`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gleak import __version__
from gleak.report.model import ExecutorName, Report
from gleak.report.run_privacy import account_run, budget_findings, privacy_notices
from gleak.report.run_view import build_run_view
from gleak.reproducible import zero_timings
from gleak.runs.audit.capture import CaptureResult
from gleak.runs.audit.executors import WorkerSetup, run_captures
from gleak.runs.audit.setup import AuditConfig, HashCache, ModelSet, find_captures, find_models
from gleak.runs.inputs import resolve_device


def run_audit(captures: Sequence[Path], model_paths: Sequence[Path], aux_paths: Sequence[Path],
              config: AuditConfig, out_dir: Path | None = None,
              progress: Callable[[int, int, Path], None] | None = None, jobs: int = 1,
              executor: ExecutorName = "local", address: str | None = None,
              hashes: HashCache | None = None) -> Report:
    """Audit every capture under ``captures`` against the models and aux data given; the whole report.

    ``executor`` ``local`` audits in this process, or with ``jobs`` > 1 in that many worker processes (spawned,
    the same torch thread count, each loading the models and aux data once), or with ``jobs`` 0 (``--jobs auto``)
    here until the captures left make a pool pay (:mod:`gleak.runs.audit.executors.local`); ``ray`` audits on a
    Ray cluster (:mod:`gleak.runs.audit.executors.ray`). The report keeps the captures' order either way; captures
    are read one at a time, so memory does not grow with their number."""
    started = time.perf_counter()
    config = config.resolved()  # the machine's defaults (--max-memory), probed once here, not in the config
    files = find_captures(captures)
    model_files = find_models(model_paths)
    report = Report(gleak_version=__version__, command=list(config.command), budget=config.budget,
                    fail_on=config.fail_on, fail_rounds=config.fail_rounds, accept_unassessed=config.accept_unassessed,
                    seed=config.seed, device=str(resolve_device(config.device)),
                    threads=torch.get_num_threads(), thresholds=config.thresholds, jobs=jobs, executor=executor)
    store = ModelSet.load(model_files, config, hashes=hashes)  # every file hashed once, one model in memory at a time
    setup = WorkerSetup(model_files=tuple(model_files), aux_paths=tuple(aux_paths), config=config,
                        threads=torch.get_num_threads(), index=tuple(store.index.items()))
    del store
    results: list[CaptureResult | None] = [None] * len(files)
    stats: dict[str, int] = {}
    for done, (i, result) in enumerate(run_captures(files, setup, out_dir, executor, jobs, address, stats)):
        results[i] = result
        if progress is not None:
            progress(done, len(files), files[i])
    for entry in results:
        assert entry is not None
        report.captures.append(entry[0])
        report.findings += entry[1]
        report.notices += entry[2]
    report.workers = stats.get("workers", 1)
    privacy = account_run(report.captures, config.max_epsilon)  # ε over the run, before the view counts findings
    report.notices += privacy_notices(privacy, config.max_epsilon)
    if privacy is not None:
        report.findings += budget_findings(privacy, report.captures)
    report.run = build_run_view(report)
    if report.run is not None:
        report.run.privacy = privacy
    report.seconds = round(time.perf_counter() - started, 3)
    return zero_timings(report)  # SOURCE_DATE_EPOCH set: identical files from identical runs
