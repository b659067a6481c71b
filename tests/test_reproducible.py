"""Same inputs and seed, same bytes: captures, defended captures, audit reports and sweeps (gleak.reproducible)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gleak.capture import load_capture
from gleak.report.model import SweepReport
from gleak.reproducible import zero_timings

from .conftest import FEDSGD, LENET, MNIST_CLIENT

EPOCH = "1767225600"  # 2026-01-01T00:00:00Z
B8 = FEDSGD.with_name("fedsgd_b8.safetensors")


def without_time_stamp(src: Path, dst: Path) -> Path:
    """``src`` with its gleak.created_at removed from the safetensors header (a capture some other tool wrote)."""
    data = src.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header["__metadata__"].pop("gleak.created_at")
    text = json.dumps(header).encode()
    dst.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])
    return dst


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("stamped", [True, False])
def test_defend_twice_gives_the_same_bytes_and_keeps_the_capture_time(
        gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamped: bool) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    source = FEDSGD if stamped else without_time_stamp(FEDSGD, tmp_path / "plain.safetensors")
    outputs = []
    for i in range(2):
        out = tmp_path / f"defended{i}.safetensors"
        result = gleak("defend", source, "--defense", "gaussian:sigma=0.1", "--seed", 3, "-o", out, "-q")
        assert result.exit_code == 0, result.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    kept = load_capture(tmp_path / "defended0.safetensors").meta.get("gleak.created_at")
    assert kept == (load_capture(FEDSGD).meta["gleak.created_at"] if stamped else None)


def test_defend_without_an_input_time_takes_source_date_epoch(
        gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    source = without_time_stamp(FEDSGD, tmp_path / "plain.safetensors")
    out = tmp_path / "defended.safetensors"
    assert gleak("defend", source, "--defense", "sign", "-o", out, "-q").exit_code == 0
    assert load_capture(out).meta["gleak.created_at"] == "2026-01-01T00:00:00+00:00"


def test_simulate_twice_with_source_date_epoch_gives_the_same_bytes(
        gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    written = []
    for i in range(2):
        out = tmp_path / f"sim{i}.safetensors"
        result = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "--batch-size", 4, "--local-steps", 2,
                       "--seed", 11, "-o", out, "-q")
        assert result.exit_code == 0, result.stderr
        written.append(out.read_bytes())
    assert written[0] == written[1]
    assert load_capture(tmp_path / "sim0.safetensors").meta["gleak.created_at"] == "2026-01-01T00:00:00+00:00"


def folder_twice(gleak, out: Path, *args: object) -> dict[str, bytes]:
    """Run ``gleak *args`` (writing into ``out``) twice; the files of each run must be byte-identical."""
    runs = []
    for _ in range(2):
        result = gleak(*args, "-o", out, "--force", "-q")
        assert result.exit_code == 0, result.stderr
        runs.append(files_of(out))
    assert runs[0] == runs[1]
    return runs[0]


def test_audit_files_are_identical_with_source_date_epoch(
        gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    files = folder_twice(gleak, tmp_path / "audit", "audit", B8, "--model", LENET, "--budget", "quick", "--format",
                         "json,md,html,sarif,junit", "--fail-on", "none")
    assert {"report.json", "report.md", "report.html", "report.sarif", "junit.xml"} <= set(files)
    report = json.loads(files["report.json"])
    assert report["seconds"] == 0 and all(c["seconds"] == 0 for c in report["captures"])


def test_sweep_files_are_identical_with_source_date_epoch(
        gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    files = folder_twice(gleak, tmp_path / "sweep", "sweep", "--model", LENET, "--data", MNIST_CLIENT, "--defense",
                         "gaussian=0.01,0.1", "--attack", "llg", "--trials", 1, "--batch-size", 4)
    assert {"sweep.json", "sweep.md", "gaussian.png"} <= set(files)
    assert json.loads(files["sweep.json"])["seconds"] == 0


def test_timings_are_kept_without_source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    report = SweepReport.model_construct(seconds=1.5, rows=[])
    assert zero_timings(report).seconds == 1.5
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    assert zero_timings(report).seconds == 0.0


@pytest.mark.parametrize("value", ["yesterday", "-5", "1.5"])
def test_a_bad_source_date_epoch_is_one_line(gleak, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             value: str) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    result = gleak("simulate", "--model", LENET, "--data", MNIST_CLIENT, "--batch-size", 4, "-o",
                   tmp_path / "x.safetensors")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "SOURCE_DATE_EPOCH" in result.stderr
    assert not (tmp_path / "x.safetensors").exists()
