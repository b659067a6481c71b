"""The local executor: this process (``--jobs 1``) or a pool of spawned worker processes, each loading the
models and auxiliary data once and auditing one capture at a time.

``--jobs auto`` (the default, ``jobs = 0`` here) starts in this process and hands the rest of the captures to one
worker per available CPU only once the captures left would take longer than :data:`AUTO_BREAK_EVEN_SECONDS` at the
pace measured so far (the median seconds per capture after :data:`AUTO_WARM_UP` of them, the first left out):
starting workers costs about 1.8 s on 2 CPUs (each imports torch and loads the models), and two workers audit 1.9×
as fast as one process (bench/results/run-scale.md), so a pool pays for itself from about 4 s of work left. The
workers then share the CPUs' threads (the driver's count divided among them)."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gleak.runs.audit.capture import CaptureResult
    from gleak.runs.audit.executors import WorkerSetup


AUTO_BREAK_EVEN_SECONDS = 4.5  # sequential work left from which a pool of workers pays (module docstring)
AUTO_WARM_UP = 4  # captures audited here before the pace is trusted


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


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
    yield from _pool(files, 0, setup, out_dir, jobs)


def _auto(files: Sequence[Path], setup: WorkerSetup, out_dir: Path | None,
          stats: dict[str, int]) -> Iterator[tuple[int, CaptureResult]]:
    from gleak.runs.audit.capture import audit_capture

    workers = min(available_cpus(), len(files))
    models, auxes = setup.load()
    seconds: list[float] = []
    for i, path in enumerate(files):
        started = time.perf_counter()
        yield i, audit_capture(path, models, auxes, setup.config, out_dir)
        seconds.append(time.perf_counter() - started)
        done, left = i + 1, len(files) - i - 1
        if done < AUTO_WARM_UP or workers < 2 or left < workers:
            continue
        pace = statistics.median(seconds[1:])  # the first capture pays for warming up (first forwards, caches)
        if pace * left > AUTO_BREAK_EVEN_SECONDS:
            del models, auxes
            stats["workers"] = workers
            shared = dataclasses.replace(setup, threads=max(1, setup.threads // workers))
            yield from _pool(files[done:], done, shared, out_dir, workers)
            return


def _pool(files: Sequence[Path], offset: int, setup: WorkerSetup, out_dir: Path | None,
          jobs: int) -> Iterator[tuple[int, CaptureResult]]:
    """``files`` audited by ``jobs`` spawned workers; yields (offset + index, result) as they finish."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init, initargs=(setup,)) as pool:
        pending: dict[Future[CaptureResult], int] = {}
        queue = iter(enumerate(files))
        for i, path in queue:  # at most 2 captures per worker in flight: the paths are submitted as they go
            pending[pool.submit(_worker_audit, path, out_dir)] = i
            if len(pending) >= 2 * jobs:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                yield offset + i, future.result()
                nxt = next(queue, None)
                if nxt is not None:
                    pending[pool.submit(_worker_audit, nxt[1], out_dir)] = nxt[0]


_WORKER: dict[str, Any] = {}


def _worker_init(setup: WorkerSetup) -> None:
    """A worker process: the parent's thread count, the models and aux data loaded once."""
    torch.set_num_threads(setup.threads)
    _WORKER["models"], _WORKER["auxes"] = setup.load()
    _WORKER["config"] = setup.config


def _worker_audit(path: Path, out_dir: Path | None) -> CaptureResult:
    from gleak.runs.audit.capture import audit_capture

    return audit_capture(path, _WORKER["models"], _WORKER["auxes"], _WORKER["config"], out_dir)
