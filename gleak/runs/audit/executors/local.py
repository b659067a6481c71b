"""The local executor: this process (``--jobs 1``) or a pool of spawned worker processes, each loading the
models and auxiliary data once and auditing one capture at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gleak.runs.audit.capture import CaptureResult
    from gleak.runs.audit.executors import WorkerSetup


def run_local(files: Sequence[Path], setup: WorkerSetup, out_dir: Path | None,
              jobs: int) -> Iterator[tuple[int, CaptureResult]]:
    from gleak.runs.audit.capture import audit_capture

    if jobs <= 1 or len(files) <= 1:
        models, auxes = setup.load()
        for i, path in enumerate(files):
            yield i, audit_capture(path, models, auxes, setup.config, out_dir)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    setup.load()  # bad model or aux files fail here, once, before any worker starts
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
                yield i, future.result()
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
