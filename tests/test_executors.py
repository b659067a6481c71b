"""Where audits run: the shared aux-forward cache changes nothing, the local pool streams, and Ray (marked
``integration``: a local Ray instance with 2 CPUs) gives the same report as the local executor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gleak.data.images import load_dataset
from gleak.runs.audit import AuditConfig, ModelSet, audit_capture

from .conftest import LENET, MNIST_AUX, SAMPLES


def _counts(result) -> list:  # type: ignore[no-untyped-def]
    return [(a.attack, a.status, a.counts) for a in result[0].attacks]


def test_the_shared_aux_forwards_give_the_same_results_as_fresh_ones() -> None:
    config = AuditConfig(lpips="off")
    auxes = [(MNIST_AUX, load_dataset(MNIST_AUX))]
    captures = [SAMPLES / "captures" / n for n in ("fedsgd_b32.safetensors", "fedsgd_b8.safetensors",
                                                     "fedavg_m10.safetensors")]
    shared = ModelSet.load([LENET], config)
    together = [audit_capture(p, shared, auxes, config) for p in captures]
    alone = [audit_capture(p, ModelSet.load([LENET], config), auxes, config) for p in captures]
    assert [_counts(r) for r in together] == [_counts(r) for r in alone]
    assert len(shared.forward_cache) == 1  # one model, one aux set, one forward mode: computed once
    stages = {"load", "context", "model_check", "labels", "reconstruction"}
    assert all(r[0].stage_seconds and set(r[0].stage_seconds) == stages for r in together)


def test_executor_and_address_mistakes_are_one_line_and_exit_2(gleak) -> None:
    base = ("audit", SAMPLES / "captures" / "fedsgd_b8.safetensors", "-M", LENET)
    r = gleak(*base, "--executor", "spark")
    assert r.exit_code == 2 and "--executor must be one of local, ray" in r.stderr
    r = gleak(*base, "--address", "ray://head:10001")
    assert r.exit_code == 2 and "use it with --executor ray" in r.stderr


@pytest.mark.integration
def test_ray_gives_the_same_report_as_local(gleak, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="gleak[ray] not installed")
    folder = tmp_path / "caps"
    folder.mkdir()
    for name in ("fedsgd_b8", "fedsgd_b32", "fedavg_m10"):
        for suffix in (".safetensors", ".truth.safetensors"):
            shutil.copy(SAMPLES / "captures" / f"{name}{suffix}", folder / f"{name}{suffix}")
    args = ("audit", folder, "-M", SAMPLES / "models", "--aux", MNIST_AUX, "--lpips", "off", "--format", "json")
    local = json.loads(gleak(*args).stdout)
    on_ray = gleak(*args, "--executor", "ray", "--jobs", "2")
    assert on_ray.exit_code == 1, on_ray.stderr  # they leak: the same verdict
    remote = json.loads(on_ray.stdout)
    assert remote["executor"] == "ray" and local["executor"] == "local"
    assert remote["findings"] == local["findings"]
    for a, b in zip(local["captures"], remote["captures"], strict=True):  # same order, same counts
        assert a["capture"] == b["capture"]
        assert [x["counts"] for x in a["attacks"]] == [x["counts"] for x in b["attacks"]]
    assert not ray.is_initialized()  # the local instance started for the run was stopped


@pytest.mark.integration
def test_an_unreachable_ray_cluster_is_one_line_and_exit_2(gleak) -> None:
    pytest.importorskip("ray", reason="gleak[ray] not installed")
    r = gleak("audit", SAMPLES / "captures" / "fedsgd_b8.safetensors", "-M", LENET, "--executor", "ray",
              "--address", "127.0.0.1:1")
    assert r.exit_code == 2 and "could not start or reach Ray at 127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr


def test_ray_executor_without_ray_says_how_to_install_it(gleak, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    r = gleak("audit", SAMPLES / "captures" / "fedsgd_b8.safetensors", "-M", LENET, "--executor", "ray")
    assert r.exit_code == 2 and "pip install -e '.[ray]'" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------------ the model store
def _run_folder(root: Path, rounds: int, pt2: bool = False) -> Path:
    """A small FL run on disk: one LeNet-5 per round (the last one a torch.export program when ``pt2``) and one
    FedSGD capture of 8 MNIST digits made with it, with its truth."""
    import torch

    from gleak.capture import save_capture
    from gleak.models import build_zoo_model, save_model
    from gleak.simulate.images import ClientConfig, simulate_client

    (root / "models").mkdir(parents=True)
    (root / "captures").mkdir()
    client = load_dataset(SAMPLES / "data" / "mnist_client.safetensors")
    for r in range(rounds):
        torch.manual_seed(r)
        model = build_zoo_model("lenet")
        if pt2 and r == rounds - 1:
            program = torch.export.export(model.eval(), (torch.zeros(2, 1, 28, 28),),
                                          dynamic_shapes=({0: torch.export.Dim("batch")},))
            torch.export.save(program, root / "models" / f"round-{r:04d}.pt2")
        else:
            save_model(model, root / "models" / f"round-{r:04d}.safetensors", "lenet")
        capture, truth = simulate_client(model, client, ClientConfig(batch_size=8, seed=r))
        save_capture(capture, root / "captures" / f"round-{r:04d}.safetensors", truth=truth)
    return root


def test_models_are_indexed_once_and_loaded_when_a_capture_needs_them(tmp_path: Path) -> None:
    from gleak.runs.audit.setup import HashCache, find_models

    root = _run_folder(tmp_path / "run", rounds=5)
    config = AuditConfig(lpips="off", confidence=0, model_cache=2)
    files = find_models([root / "models" / "round-*.safetensors"])  # a glob, as the shell would pass it quoted
    assert [p.name for p in files] == [f"round-{r:04d}.safetensors" for r in range(5)]
    hashes = HashCache()  # the caller's, shared by both stores (a store's own otherwise)
    store = ModelSet.load(files, config, hashes=hashes)
    assert store.loads == 5 and len(set(store.index.values())) == 5  # each hashed once, one at a time
    again = ModelSet.load(files, config, hashes=hashes)
    assert again.loads == 0  # unchanged files are not read again with the same HashCache
    assert ModelSet.load(files, config).loads == 5  # no hidden process-wide cache: a fresh store hashes again
    for r in range(5):
        report, _, _ = audit_capture(root / "captures" / f"round-{r:04d}.safetensors", again, [], config)
        assert report.status == "ok" and report.model is not None and report.model.path.endswith(f"round-{r:04d}"
                                                                                                 ".safetensors")
        assert len(again._lru) <= 2  # never more than --model-cache models in memory
    assert again.loads == 5


def test_model_cache_and_globs_are_checked(gleak, tmp_path: Path) -> None:
    r = gleak("audit", SAMPLES / "captures" / "fedsgd_b8.safetensors", "-M", tmp_path / "nothing-*.safetensors")
    assert r.exit_code == 2 and "no file matches this pattern" in r.stderr
    r = gleak("audit", SAMPLES / "captures" / "fedsgd_b8.safetensors", "-M", LENET, "--model-cache", "0")
    assert r.exit_code == 2 and "--model-cache" in r.stderr


@pytest.mark.integration
def test_ray_loads_every_model_format_in_its_workers_and_agrees_with_local(gleak, tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="gleak[ray] not installed")
    root = _run_folder(tmp_path / "run", rounds=3, pt2=True)  # two .safetensors + arch metadata, one .pt2
    args = ("audit", root / "captures", "-M", root / "models", "--lpips", "off", "--format", "json",
            "--fail-on", "none", "--confidence", "0")
    local = gleak(*args, "--jobs", "2")
    on_ray = gleak(*args, "--executor", "ray", "--jobs", "2")
    assert local.exit_code == 0 and on_ray.exit_code == 0, (local.stderr, on_ray.stderr)
    a, b = json.loads(local.stdout), json.loads(on_ray.stdout)
    assert a["findings"] == b["findings"] and len(a["findings"]) >= 3
    assert [c["model"]["path"] for c in a["captures"]] == [c["model"]["path"] for c in b["captures"]]
    assert any(c["model"]["path"].endswith(".pt2") for c in b["captures"])
