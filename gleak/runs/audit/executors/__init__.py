"""Where ``gleak audit`` audits its captures: ``local`` (this process, or ``--jobs N`` worker processes) or
``ray`` (a Ray cluster; the ``ray`` extra, ``pip install -e '.[ray]'`` from a clone). Every executor takes the
capture paths one at a time and yields ``(index, result)`` as results arrive, so the caller streams them into one
report and memory does not grow with the number of captures."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gleak.errors import GleakError
from gleak.report.model import ExecutorName
from gleak.runs.audit.setup import EXECUTORS

if TYPE_CHECKING:
    from gleak.data.images import Dataset
    from gleak.data.text import TextData
    from gleak.runs.audit.capture import CaptureResult
    from gleak.runs.audit.setup import AuditConfig, ModelSet


@dataclass(kw_only=True, frozen=True)
class WorkerSetup:
    """What every worker starts from — paths, never model objects (a torch.export program cannot be pickled, and
    a run's hundred global models need not travel): the model files with the index of their weights' hashes,
    the auxiliary data files, the config, torch's thread count. Each worker loads the aux data once and a model
    when a capture needs it (:class:`~gleak.runs.audit.setup.ModelSet`)."""

    model_files: tuple[Path, ...]
    aux_paths: tuple[Path, ...]
    config: AuditConfig
    threads: int
    index: tuple[tuple[Path, str], ...] | None = None  # (file, weights sha256), from the driver's indexing

    def load(self) -> tuple[ModelSet, list[tuple[Path, Dataset | TextData]]]:
        """The model store and the aux data: image sets, and text (.txt/.jsonl) for language models' captures
        (bad files fail here with a GleakError)."""
        from gleak.data.images import load_dataset
        from gleak.data.text import is_text_data, load_text_data
        from gleak.runs.audit.setup import ModelSet

        index = dict(self.index) if self.index is not None else None
        return (ModelSet.load(self.model_files, self.config, index),
                [(p, load_text_data(p) if is_text_data(p) else load_dataset(p)) for p in self.aux_paths])


def run_captures(files: Sequence[Path], setup: WorkerSetup, out_dir: Path | None, executor: ExecutorName = "local",
                 jobs: int = 1, address: str | None = None,
                 stats: dict[str, int] | None = None) -> Iterator[tuple[int, CaptureResult]]:
    """Audit ``files`` on ``executor``; yields ``(index into files, result)`` in completion order. ``jobs`` 0 is
    ``--jobs auto``: local, a pool only when it pays (:mod:`~gleak.runs.audit.executors.local`); Ray, one actor per
    cluster CPU. ``stats["workers"]`` is set to the processes or actors that audited."""
    if executor == "local":
        from gleak.runs.audit.executors.local import run_local

        return run_local(files, setup, out_dir, jobs, stats)
    if executor == "ray":
        from gleak.runs.audit.executors.ray import run_ray

        return run_ray(files, setup, out_dir, jobs, address, stats)
    raise GleakError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
