"""Work in spawned worker processes, shared by the audit's local executor and the sweep: :func:`pool` runs items in
N workers, and :func:`pool_pays` is the one break-even rule for ``--jobs auto``.

``--jobs auto`` starts in the calling process and hands the items left to one worker per available CPU only once
they would take longer than :data:`AUTO_BREAK_EVEN_SECONDS` at the pace measured so far (the median seconds per item
after a warm-up, the first left out): starting workers costs about 1.8 s on 2 CPUs (each imports torch and loads the
models), and two workers audit 1.9× as fast as one process (bench/results/run-scale.md), so a pool pays for itself
from about 4 s of work left."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

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
