"""The local executor: this process (``--jobs 1``) or a pool of spawned worker processes, each loading the
models and auxiliary data once and auditing one capture at a time.

``--jobs auto`` (the default, ``jobs = 0`` here) starts in this process and hands the rest of the captures to one
worker per available CPU once a pool pays (:func:`gleak.runs.parallel.pool_pays`, the break-even the sweep uses
too). The workers then share the CPUs' threads (the driver's count divided among them)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gleak.runs import parallel

if TYPE_CHECKING:
    from gleak.runs.audit.capture import CaptureResult
    from gleak.runs.audit.executors import WorkerSetup


def run_local(files: Sequence[Path], setup: WorkerSetup, out_dir: Path | None, jobs: int,
              stats: dict[str, int] | None = None) -> Iterator[tuple[int, CaptureResult]]:
    """Audit ``files`` here (``jobs`` 1), in ``jobs`` workers, or (``jobs`` 0, auto) here until a pool pays off;
    ``stats["workers"]`` is set to the processes that audited captures."""
    from gleak.runs.audit.capture import audit_capture

    stats = stats if stats is not None else {}
    stats["workers"] = 1
    if jobs == 0:
        yield from _auto(files, setup, out_dir, stats)
        return
    if jobs <= 1 or len(files) <= 1:
        models, auxes = setup.load()
        for i, path in enumerate(files):
            yield i, audit_capture(path, models, auxes, setup.config, out_dir)
        return
    setup.load()  # bad model or aux files fail here, once, before any worker starts
    stats["workers"] = jobs
    yield from _audit_pool(files, 0, setup, out_dir, jobs)


def _auto(files: Sequence[Path], setup: WorkerSetup, out_dir: Path | None,
          stats: dict[str, int]) -> Iterator[tuple[int, CaptureResult]]:
    from gleak.runs.audit.capture import audit_capture

    workers = min(parallel.available_cpus(), len(files))
    models, auxes = setup.load()
    seconds: list[float] = []
    for i, path in enumerate(files):
        started = time.perf_counter()
        yield i, audit_capture(path, models, auxes, setup.config, out_dir)
        seconds.append(time.perf_counter() - started)
        done, left = i + 1, len(files) - i - 1
        if parallel.pool_pays(seconds, left, workers):
            del models, auxes  # the workers load their own
            stats["workers"] = workers
            shared = dataclasses.replace(setup, threads=max(1, setup.threads // workers))
            yield from _audit_pool(files[done:], done, shared, out_dir, workers)
            return


def _audit_pool(files: Sequence[Path], offset: int, setup: WorkerSetup, out_dir: Path | None,
                jobs: int) -> Iterator[tuple[int, CaptureResult]]:
    """``files`` audited by ``jobs`` spawned workers; yields (offset + index, result) as they finish."""
    for i, result in parallel.pool(files, _worker_init, (setup,), functools.partial(_worker_audit, out_dir=out_dir),
                                   jobs):
        yield offset + i, result


_WORKER: dict[str, Any] = {}


def _worker_init(setup: WorkerSetup) -> None:
    """A worker process: the parent's thread count, the models and aux data loaded once."""
    torch.set_num_threads(setup.threads)
    _WORKER["models"], _WORKER["auxes"] = setup.load()
    _WORKER["config"] = setup.config


def _worker_audit(path: Path, out_dir: Path | None) -> CaptureResult:
    from gleak.runs.audit.capture import audit_capture

    return audit_capture(path, _WORKER["models"], _WORKER["auxes"], _WORKER["config"], out_dir)
