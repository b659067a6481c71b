"""The Ray executor (``gleak audit --executor ray [--address ADDR]``; the ``ray`` extra: ``pip install -e
'.[ray]'`` from a clone).

The models and auxiliary data are checked once here; each actor (``--jobs``, default one per CPU of the cluster)
gets their paths and the index of the models' hashes — never model objects: a torch.export program cannot be
pickled, and a run's hundred global models need not travel — loads the aux data once and a model when a capture
needs it, with the same safe loaders as the local executor, then audits captures by path, one task per capture,
at most two in flight per actor, results streamed back as they finish. Workers read the captures and models
(and write image grids) at the paths given: on a multi-machine cluster use a shared filesystem.
Without ``--address`` (and without ``RAY_ADDRESS``) a local Ray instance is started for the run and stopped
after it."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gleak.errors import GleakError, shorten

if TYPE_CHECKING:
    from gleak.runs.audit.capture import CaptureResult
    from gleak.runs.audit.executors import WorkerSetup

LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024  # a local instance: results only, fits a small /dev/shm
IN_FLIGHT_PER_WORKER = 2


class AuditActor:
    """One Ray worker: the aux data loaded once and the model store (models loaded on demand); then one capture
    per call."""

    def __init__(self, setup: WorkerSetup) -> None:
        torch.set_num_threads(setup.threads)
        self.models, self.auxes = setup.load()
        self.config = setup.config

    def audit(self, path: Path, out_dir: Path | None) -> CaptureResult:
        from gleak.runs.audit.capture import audit_capture

        return audit_capture(path, self.models, self.auxes, self.config, out_dir)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise GleakError("--executor ray needs Ray: install the ray extra (pip install -e '.[ray]' from a "
                             "clone)") from None
    return ray


def run_ray(files: Sequence[Path], setup: WorkerSetup, out_dir: Path | None, jobs: int,
            address: str | None, stats: dict[str, int] | None = None) -> Iterator[tuple[int, CaptureResult]]:
    ray = _import_ray()
    setup.load()  # bad inputs fail here, before Ray starts
    started_here = not ray.is_initialized()
    if started_here:
        _init(ray, address, jobs)
    actors: list[Any] = []
    try:
        workers = jobs if jobs > 1 else max(1, int(ray.cluster_resources().get("CPU", 1)))
        remote = ray.remote(num_cpus=1)(AuditActor)
        actors = [remote.remote(setup) for _ in range(workers)]
        if stats is not None:
            stats["workers"] = workers
        yield from _stream(ray, actors, files, out_dir)
    finally:
        for actor in actors:
            ray.kill(actor)
        if started_here:
            ray.shutdown()


def _init(ray: Any, address: str | None, jobs: int) -> None:
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None and not os.environ.get("RAY_ADDRESS"):  # a local instance, sized for this run
        kwargs.update(num_cpus=jobs if jobs > 1 else os.cpu_count() or 1,
                      object_store_memory=LOCAL_OBJECT_STORE_BYTES)
    if address is not None:
        _check_reachable(address)
    try:
        with warnings.catch_warnings():  # Ray's notice about accelerator variables: nothing for the user to do
            warnings.simplefilter("ignore", FutureWarning)
            ray.init(address=address, **kwargs)
    except (Exception, SystemExit) as e:  # ConnectionError, a bad address, no cluster there
        where = f"at {address}" if address else "locally"
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GleakError(f"could not start or reach Ray {where}: {shorten(why, 200)}") from None


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds, not after Ray's minute of retries, when nothing listens at ``host:port``."""
    import socket

    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or address == "auto":
        return  # "auto", or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise GleakError(f"could not start or reach Ray at {address}: {e.strerror or e}") from None


def _stream(ray: Any, actors: list[Any], files: Sequence[Path],
            out_dir: Path | None) -> Iterator[tuple[int, CaptureResult]]:
    """Keep at most IN_FLIGHT_PER_WORKER captures queued per actor; yield each result as it finishes."""
    pending: dict[Any, tuple[int, Any]] = {}
    queue = iter(enumerate(files))
    load = dict.fromkeys(range(len(actors)), 0)

    def submit() -> bool:
        nxt = next(queue, None)
        if nxt is None:
            return False
        slot = min(load, key=load.__getitem__)
        load[slot] += 1
        pending[actors[slot].audit.remote(nxt[1], out_dir)] = (nxt[0], slot)
        return True

    for _ in range(IN_FLIGHT_PER_WORKER * len(actors)):
        if not submit():
            break
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        ref = done[0]
        i, slot = pending.pop(ref)
        load[slot] -= 1
        try:
            result = ray.get(ref)
        except Exception as e:  # the worker died, or could not load what it was given (its first line says why)
            why = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise GleakError(f"a Ray worker failed: {shorten(why, 300)}") from None
        yield i, result
        submit()
