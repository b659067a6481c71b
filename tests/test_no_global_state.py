"""Issue 36: no hidden module-level state; caches are explicit, bounded objects owned by whoever runs the work."""

from __future__ import annotations

from pathlib import Path

import pytest

from gleak.attacks.labels import calibrated
from gleak.attacks.labels.confidence import CACHE_ENTRIES, CalibrationCache
from gleak.runs.audit import setup
from gleak.runs.audit.setup import HashCache, ModelSet


def test_the_calibrated_selector_keeps_no_module_cache() -> None:
    assert not hasattr(calibrated, "_CACHE")
    assert calibrated.Calibrated().cache is None  # a fresh cache per run unless the caller sets one


def test_the_calibration_cache_honours_its_bound_least_recently_used_first() -> None:
    assert CalibrationCache().max_entries == CACHE_ENTRIES == 32
    cache = CalibrationCache(max_entries=2)
    cache.put(("a",), {})
    cache.put(("b",), {})
    assert cache.get(("a",)) == {}  # now the most recently used
    cache.put(("c",), {})
    assert len(cache) == 2 and ("b",) not in cache and ("a",) in cache and ("c",) in cache
    with pytest.raises(ValueError):
        CalibrationCache(max_entries=0)


def test_model_hashes_live_in_a_bounded_cache_owned_by_the_store(tmp_path: Path) -> None:
    assert not hasattr(setup, "_HASHES")
    hashes = HashCache(max_entries=2)
    for i in range(3):
        hashes.put((str(tmp_path), i, 1, None, None), f"h{i}")
    assert len(hashes) == 2 and hashes.get((str(tmp_path), 0, 1, None, None)) is None
    assert ModelSet().hashes is not ModelSet().hashes  # each store its own


def test_constructing_an_audit_config_probes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> int:
        raise AssertionError("probed")

    from gleak.runs import inputs

    monkeypatch.setattr(inputs, "available_memory", probe)
    config = setup.AuditConfig()  # max_memory None: "the default", resolved where the audit starts
    assert config.max_memory is None and config.memory_limit is None
    given = setup.AuditConfig(max_memory=99)  # GB, as --max-memory takes it: no probe either
    assert given.resolved().memory_limit == 99_000_000_000
    monkeypatch.setattr(inputs, "available_memory", lambda: 2468)
    assert config.resolved().memory_limit == 1234 and config.memory_limit is None
    resolved = config.resolved()
    assert resolved.resolved() is resolved


FORBIDDEN_GLOBALS = frozenset({"_GLOBALS", "_GLOBALS_LOCK", "_CACHE", "_HASHES"})


def test_no_module_defines_the_old_global_stores() -> None:
    """The module-level stores issue 36 removed stay gone in every module (read with ast: the optional frameworks'
    modules, gleak.integrations.nvflare among them, are checked without importing them). NVFlare's two filters
    share the global model through the task's FLContext instead (gleak.integrations.nvflare's docs)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "gleak"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
            found += [f"{path.relative_to(root.parent)}:{node.lineno} {t.id}" for t in targets
                      if isinstance(t, ast.Name) and t.id in FORBIDDEN_GLOBALS]
    assert not found, found
