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
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from gleak.runs.audit.capture import CaptureResult
    from gleak.runs.audit.executors import WorkerSetup


AUTO_BREAK_EVEN_SECONDS = 4.5  # sequential work left from which a pool of workers pays (module docstring)
AUTO_WARM_UP = 4  # captures audited here before the pace is trusted
T = TypeVar("T")
R = TypeVar("R")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def pool_pays(seconds: Sequence[float], left: int, workers: int, warm_up: int = AUTO_WARM_UP) -> bool:
    """Whether to hand the ``left`` items to a pool of ``workers`` processes, given the ``seconds`` each item done
    here took: only after ``warm_up`` of them (at least 2: the first pays for warming up — imports, first
    forwards, caches — and is left out of the pace), with at least 2 workers and at least one item left per worker,
    and only when the median pace × the items left exceeds :data:`AUTO_BREAK_EVEN_SECONDS`."""
    if len(seconds) < max(warm_up, 2) or workers < 2 or left < workers:
        return False
    return statistics.median(seconds[1:]) * left > AUTO_BREAK_EVEN_SECONDS


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

    workers = min(available_cpus(), len(files))
    models, auxes = setup.load()
    seconds: list[float] = []
    for i, path in enumerate(files):
        started = time.perf_counter()
        yield i, audit_capture(path, models, auxes, setup.config, out_dir)
        seconds.append(time.perf_counter() - started)
        done, left = i + 1, len(files) - i - 1
        if pool_pays(seconds, left, workers):
            del models, auxes  # the workers load their own
            stats["workers"] = workers
            shared = dataclasses.replace(setup, threads=max(1, setup.threads // workers))
            yield from _audit_pool(files[done:], done, shared, out_dir, workers)
            return


def _audit_pool(files: Sequence[Path], offset: int, setup: WorkerSetup, out_dir: Path | None,
                jobs: int) -> Iterator[tuple[int, CaptureResult]]:
    """``files`` audited by ``jobs`` spawned workers; yields (offset + index, result) as they finish."""
    for i, result in pool(files, _worker_init, (setup,), functools.partial(_worker_audit, out_dir=out_dir), jobs):
        yield offset + i, result


def pool(items: Sequence[T], initializer: Callable[..., None], initargs: tuple[Any, ...], work: Callable[[T], R],
         jobs: int) -> Iterator[tuple[int, R]]:
    """``work(item)`` for each of ``items`` in ``jobs`` spawned worker processes, each set up once by
    ``initializer(*initargs)`` (both picklable: module-level functions); yields (index in ``items``, result) as
    they finish. At most 2 items per worker are in flight (the rest are submitted as results come back); an error
    in any item is raised here and cancels the items not started."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    executor = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=initializer, initargs=initargs)
    try:
        pending: dict[Future[R], int] = {}
        queue = iter(enumerate(items))
        for i, item in queue:
            pending[executor.submit(work, item)] = i
            if len(pending) >= 2 * jobs:
                break
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                yield i, future.result()
                nxt = next(queue, None)
                if nxt is not None:
                    pending[executor.submit(work, nxt[1])] = nxt[0]
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


_WORKER: dict[str, Any] = {}


def _worker_init(setup: WorkerSetup) -> None:
    """A worker process: the parent's thread count, the models and aux data loaded once."""
    torch.set_num_threads(setup.threads)
    _WORKER["models"], _WORKER["auxes"] = setup.load()
    _WORKER["config"] = setup.config


def _worker_audit(path: Path, out_dir: Path | None) -> CaptureResult:
    from gleak.runs.audit.capture import audit_capture

    return audit_capture(path, _WORKER["models"], _WORKER["auxes"], _WORKER["config"], out_dir)
