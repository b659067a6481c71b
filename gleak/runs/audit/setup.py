"""Audit set-up: the configuration (:class:`AuditConfig`: budget, gate, thresholds, options), finding the
captures and model files, and the model store (:class:`ModelSet`) that matches each capture to its model by the
weights' hash and picks the auxiliary data that fits it."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from gleak.attacks.labels.confidence import CalibrationCache
from gleak.capture import Capture
from gleak.data.images import Dataset
from gleak.data.text import TextData
from gleak.errors import GleakError, Origin
from gleak.io import probe_input, safetensors_kind, show
from gleak.lru import BoundedLRU
from gleak.models import LoadedModel, is_text_model_dir, load_model
from gleak.runs.audit.server import ModelChecks
from gleak.runs.inputs import memory_limit
from gleak.settings.audit import AuditSettings
from gleak.settings.values import BUDGETS, EXECUTORS, FAIL_ON, FAIL_ROUNDS_EXPECTED, normal_fail_rounds
from gleak.timebox import Clock, Deadline

__all__ = ["BUDGETS", "BUDGET_SECONDS", "EXECUTORS", "FAIL_ON", "AuditConfig", "HashCache", "ModelSet",
           "budget_deadline", "find_captures", "find_models", "parse_fail_rounds"]
# budget -> iterations of the bounded gradient-matching run (None: the attack's default); quick runs none
STANDARD_ITERATIONS = {"adam": 500, "lbfgs": 50}
# budget -> twin batches simulated to expect the image leakage of a capture without truth (quick: none)
EXPECTED_TWINS: dict[str, int] = {"quick": 0, "standard": 2, "full": 4}
# budget -> the most wall time (seconds) the audit of one capture takes: stated for 2 cores and a language model's
# B = 8 × 150-token capture at d = 768, and kept for any capture by the deadline of budget_deadline
BUDGET_SECONDS: dict[str, float] = {"quick": 120.0, "standard": 600.0, "full": 1200.0}
# kept back from each budget for what runs outside the attacks' checkpoints: start-up, opening the capture, the model's
# first load, scoring, the report, and the last step an attack takes before it sees its deadline
RESERVE_SHARE, RESERVE_MIN = 0.1, 30.0
MODEL_SUFFIXES = (".safetensors", ".pt", ".pth", ".pt2")
CAPTURE_KINDS = ("gradient", "update")
FORWARD_CACHE_ENTRIES = 8  # (model, aux, mode) combinations whose aux forwards an audit keeps
GLOB_CHARACTERS = frozenset("*?[")


class AuditConfig(AuditSettings):
    """What to run and how to judge it: the audit's settings (:class:`~gleak.settings.AuditSettings`, each declared
    once) and the command line that asked for it. Constructing one checks the values (a bad one is a GleakError
    naming the setting) and probes nothing: the memory an attack may add is resolved by :meth:`resolved`, once,
    where an audit starts (:func:`~gleak.runs.audit.run_audit`)."""

    command: list[str] = Field(default_factory=list)
    memory_limit: int | None = None  # bytes an attack may add, filled by resolved() (max_memory, else the default)

    def resolved(self) -> AuditConfig:
        """This config with the memory limit filled in: ``max_memory`` GB, else
        :func:`~gleak.runs.inputs.memory_limit`'s default (half the memory available now), probed here, so every
        capture of the audit gets the same budget. Itself when there is nothing to resolve."""
        if self.memory_limit is not None:
            return self
        return self.model_copy(update={"memory_limit": memory_limit(self.max_memory)})

    def attack_options(self, name: str, budget: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What configures attack ``name``: the budget's bounds (e.g. ``{"iterations": 500}``), then the user's
        ``-O`` values, which win."""
        return {**(budget or {}), **self.options.get(name, {})}


def budget_deadline(budget: str, seconds: float | None = None, spent: float = 0.0, clock: Clock = time.monotonic
                    ) -> Deadline:
    """The deadline of one capture's attacks under ``budget``: its :data:`BUDGET_SECONDS` (or ``seconds``, the
    --time-limit) less the reserve (:data:`RESERVE_SHARE` of it, at least :data:`RESERVE_MIN` s, at most half) and
    less the seconds already ``spent`` on the capture (opening it), from now. The audit's stages take shares of it
    (:meth:`gleak.timebox.Deadline.share`)."""
    total = BUDGET_SECONDS[budget] if seconds is None else seconds
    reserve = min(max(RESERVE_SHARE * total, RESERVE_MIN), total / 2)
    named = budget if seconds is None else f"{budget}, --time-limit {total:g}"
    return Deadline.after(max(0.0, total - reserve - spent), "audit", budget=named, clock=clock)


def parse_fail_rounds(value: str, origin: Origin | None = None) -> str:
    """``any``, ``all`` or ``last:K`` (K ≥ 1), normalised; anything else is one line naming the choices and where
    the value came from (``origin``: --fail-rounds unless told)."""
    normal = normal_fail_rounds(value)
    if normal is None:
        raise GleakError((origin or Origin("--fail-rounds")).bad(value, f"must be {FAIL_ROUNDS_EXPECTED}"))
    return normal


# ----------------------------------------------------------------------------------------------- discovery
def find_captures(paths: Sequence[Path]) -> list[Path]:
    """Captures named directly, and every capture file (gleak.kind gradient/update) under the directories."""
    found: list[Path] = []
    for path in paths:
        kind = probe_input(path, "capture")  # not is_dir()/exists(): they raise OSError for an overlong name
        if kind == "dir":
            found += [p for p in sorted(path.rglob("*.safetensors"))
                      if p.is_file() and safetensors_kind(p) in CAPTURE_KINDS]
        elif kind == "file":
            found.append(path)
        else:
            raise GleakError(f"{show(path)}: no such file or directory")
    if not found:
        raise GleakError("no captures found in " + ", ".join(str(p) for p in paths))
    return list(dict.fromkeys(found))


def find_models(paths: Sequence[Path]) -> list[Path]:
    """Model files named directly, matched by a glob (``runs/*/global.safetensors``; quote it in the shell), and
    every model-like file in the directories (captures and data excluded); each once, in the order found. A Hugging
    Face model folder (:func:`~gleak.models.is_text_model_dir`) is one model, named directly, matched by a glob or
    as a subfolder of a folder given."""
    found: list[Path] = []
    for path in paths:
        kind = probe_input(path, "model file")  # not is_dir()/exists(): they raise OSError for an overlong name
        if kind == "dir" and is_text_model_dir(path):
            found.append(path)
        elif kind == "dir":
            try:
                entries = sorted(path.iterdir())
            except OSError as exc:
                raise GleakError(f"cannot read model folder {show(path)}: {exc.strerror or exc}") from None
            found += [p for p in entries if (p.is_file() and p.suffix.lower() in MODEL_SUFFIXES
                      and (p.suffix.lower() != ".safetensors" or safetensors_kind(p) is None))
                      or is_text_model_dir(p)]
        elif kind == "file":
            found.append(path)
        elif GLOB_CHARACTERS & set(str(path)):
            import glob

            matched = [Path(m) for m in sorted(glob.glob(str(path), recursive=True))
                       if Path(m).is_file() or is_text_model_dir(m)]
            if not matched:
                raise GleakError(f"--model {path}: no file matches this pattern")
            found += matched
        else:
            raise GleakError(f"{show(path)}: no such file or directory")
    if not found:
        hint = next((f" (global models saved by gleak.integrations are in {p / 'models'}: pass that folder)"
                     for p in paths if p.is_dir() and (p / "models").is_dir()), "")
        raise GleakError("no model files found in " + ", ".join(str(p) for p in paths) + hint)
    return list(dict.fromkeys(found))


HASH_CACHE_ENTRIES = 4096  # model files whose weights' sha256 a HashCache remembers (least recently used dropped)
_FileKey = tuple[str, int, int, str | None, str | None]


class HashCache(BoundedLRU[_FileKey, str]):
    """The weights' sha256 of model files already hashed, keyed by (resolved path, size, modification time, arch,
    arch kwargs): a bounded LRU of at most ``max_entries`` files, owned by whoever indexes models (a
    :class:`ModelSet` has its own; pass one to :meth:`ModelSet.load` to share it between runs). A file changed in
    size or modification time is hashed again."""

    def __init__(self, max_entries: int = HASH_CACHE_ENTRIES) -> None:
        super().__init__(max_entries)


def _file_key(path: Path, config: AuditConfig | None) -> _FileKey | None:
    """The model's cache key; for a model folder, the total size and latest modification of the files in it (a
    folder's own modification time does not change when a file in it is rewritten)."""
    try:
        stat = path.stat()
        size, mtime = stat.st_size, stat.st_mtime_ns
        if path.is_dir():
            stats = [p.stat() for p in path.iterdir() if p.is_file()]
            size, mtime = sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=mtime)
    except OSError:
        return None
    return (str(path.resolve()), size, mtime, config.arch if config else None,
            config.arch_kwargs if config else None)


@dataclass
class ModelSet:
    """The models of an audit, indexed by the hash of their weights (what captures record as gleak.model.sha256)
    and loaded on demand.

    ``files`` are indexed once, one model in memory at a time (a bad file fails here, before any capture is read;
    a file already in ``hashes``, unchanged in size and modification time, is not read again); then a
    capture's model is loaded when the capture needs it and kept in a small LRU of ``cache_size`` models, so
    memory does not grow with the number of rounds. ``models`` are models already in memory (library callers,
    e.g. an FL server's current global model): always kept."""

    models: list[tuple[Path, LoadedModel]] = field(default_factory=list)
    # aux-set forwards shared by every capture audited with the same model, aux data and forward mode
    forward_cache: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict, repr=False)
    # the label attacks' calibrations shared by every capture of the audit (bounded: its own limit)
    calibration_cache: CalibrationCache = field(default_factory=CalibrationCache, repr=False)
    hashes: HashCache = field(default_factory=HashCache, repr=False)  # files already hashed (this run's own)
    # the check of each model for a malicious server's structures, done once per model (bounded: its own limit)
    model_checks: ModelChecks = field(default_factory=ModelChecks, repr=False)
    files: list[Path] = field(default_factory=list)
    config: AuditConfig | None = None
    cache_size: int = AuditSettings.model_fields["model_cache"].default
    index: dict[Path, str] = field(default_factory=dict)  # file -> weights sha256
    loads: int = 0  # models loaded from files so far (indexing included)
    _lru: OrderedDict[Path, LoadedModel] = field(default_factory=OrderedDict, repr=False)

    @classmethod
    def load(cls, paths: Sequence[Path], config: AuditConfig,
             index: Mapping[Path, str] | None = None, hashes: HashCache | None = None) -> ModelSet:
        """The store for ``paths``; indexed here unless ``index`` (from an earlier indexing) is given. ``hashes``:
        the caller's :class:`HashCache` to reuse (and fill) across runs; None: a fresh one, this store's own."""
        store = cls(files=list(paths), config=config, cache_size=max(1, config.model_cache),
                    hashes=hashes if hashes is not None else HashCache())
        if index is not None:
            store.index.update(index)
        for path in store.files:
            if path not in store.index:
                store._index_file(path)
        return store

    def _index_file(self, path: Path) -> None:
        key = _file_key(path, self.config)
        known = self.hashes.get(key) if key is not None else None
        if known is not None:
            self.index[path] = known
            return
        loaded = self.get(path)
        self.index[path] = loaded.weights_sha256
        if key is not None:
            self.hashes.put(key, loaded.weights_sha256)

    def get(self, path: Path) -> LoadedModel:
        """The model in ``path``: from the LRU, or loaded (evicting the least recently used past cache_size)."""
        if path in self._lru:
            self._lru.move_to_end(path)
            return self._lru[path]
        config = self.config or AuditConfig()
        loaded = load_model(path, config.arch, config.arch_kwargs, config.trust_pickle, config.trust_remote_code)
        self.loads += 1
        self._lru[path] = loaded
        while len(self._lru) > self.cache_size:
            self._lru.popitem(last=False)
        return loaded

    def __len__(self) -> int:
        return len(self.models) + len(self.files)

    def match(self, capture: Capture) -> tuple[Path, LoadedModel]:
        recorded = capture.get("gleak.model.sha256")
        if recorded is not None:
            for path, loaded in self.models:
                if loaded.weights_sha256 == recorded:
                    return path, loaded
            for path, sha in self.index.items():
                if sha == recorded:
                    return path, self.get(path)
            if len(self) == 1:
                return self._only()  # build_context then refuses it unless --allow-model-mismatch
            raise GleakError(f"none of the {len(self)} models has the weights this capture was made with "
                             f"(gleak.model.sha256 {recorded[:12]}…)")
        if len(self) == 1:
            return self._only()
        raise GleakError("the capture records no gleak.model.sha256 and several models were given: audit it "
                         "with its one model")

    def _only(self) -> tuple[Path, LoadedModel]:
        if self.models:
            return self.models[0]
        return self.files[0], self.get(self.files[0])


def pick_aux(auxes: Sequence[tuple[Path, Dataset | TextData]], input_shape: tuple[int, ...] | None,
             num_classes: int) -> tuple[Path, Dataset] | None:
    """The first auxiliary image set that fits a model with ``input_shape`` and ``num_classes``, or None."""
    from gleak.attacks.context import aux_problem

    return next(((p, d) for p, d in auxes if isinstance(d, Dataset) and aux_problem(d, input_shape, num_classes)
                 is None), None)


def pick_text_aux(auxes: Sequence[tuple[Path, Dataset | TextData]]) -> tuple[Path, TextData] | None:
    """The first auxiliary text (.txt/.jsonl), for the expected leakage of language models' captures."""
    return next(((p, d) for p, d in auxes if isinstance(d, TextData)), None)
