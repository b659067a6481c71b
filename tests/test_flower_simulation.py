"""The Flower example end to end (marked ``integration``): flwr's simulation engine on Ray, 3 clients × 2 rounds
on the shipped MNIST data, every update captured by the mod, then ``gleak audit`` on the captures folder.

Nothing here depends on how fast the machine is: every round waits for every client (no round timeout that could
drop one) and the example's ServerApp waits for the mod's writer threads to finish the last round's captures
before flwr kills the Ray actors. The subprocess timeout is a hang guard only (the run takes about 30 s alone on
2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gleak.capture import load_capture, load_truth, truth_path_for

from .conftest import MNIST_AUX

pytest.importorskip("flwr", reason="gleak[flower] not installed")
pytest.importorskip("ray", reason="flwr[simulation] not installed")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower" / "run.py"
REQUIRED = ("gleak.kind", "gleak.fl.round", "gleak.fl.client_id", "gleak.learning_rate", "gleak.local_steps",
            "gleak.batch_size", "gleak.num_examples", "gleak.model.sha256", "gleak.input_shape", "gleak.num_classes")


@pytest.mark.integration
def test_flower_simulation_captures_every_update_and_the_audit_recovers_the_labels(gleak, tmp_path: Path) -> None:
    out = tmp_path / "flower"
    run = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out), "--clients", "3", "--rounds", "2"],
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    captures = sorted((out / "captures").glob("round-*/client-*[0-9].safetensors"))
    assert len(captures) == 6, (captures, run.stderr[-3000:])  # 3 clients × 2 rounds
    assert sorted(p.parent.name for p in captures) == ["round-0001"] * 3 + ["round-0002"] * 3
    for path in captures:
        cap = load_capture(path)
        missing = [k for k in REQUIRED if k not in cap.meta]
        assert not missing, (path, missing)
        assert cap.local_steps == 3 and cap.batch_size == 8 and cap.meta["gleak.learning_rate"] == 0.05
        assert {"flower.node_id", "flower.partition-id", "fl.reported_examples"} <= set(cap.extra)
        assert load_truth(truth_path_for(path), cap).labels.shape == (24,)
    assert len(list((out / "captures" / "models").glob("round-*.safetensors"))) == 2  # one global per round
    timings = [json.loads(line) for line in (out / "captures" / "gleak-mod.jsonl").read_text().splitlines()]
    # the writer threads finished before the actors were ended: one line per update, naming its capture
    assert len(timings) == 6 and all(t["capture"] and t["background"] for t in timings)
    assert sorted(Path(t["capture"]).resolve() for t in timings) == [p.resolve() for p in captures]
    server = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert sorted(line["round"] for line in server) == [1, 1, 1, 2, 2, 2] and all(s["status"] == "ok" for s in server)
    # no truth on the server: the strategy's calibrated estimate, once per round (rlu is exact on these updates)
    expected = [f for line in server for f in line["findings"] if f["rule"] == "GLEAK-LABELS-EXPECTED"]
    assert len(expected) == 6 and all(f["measured"] >= 0.9 for f in expected), expected

    r = gleak("audit", out / "captures", "--model", out / "captures" / "models", "--aux", MNIST_AUX, "--lpips", "off",
              "--format", "json", "--fail-on", "none")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert len(report["captures"]) == 6 and all(c["status"] == "ok" for c in report["captures"])
    best = [max((a["scores"] or {}).get("iacc") or 0 for a in c["attacks"] if a["scores"]) for c in report["captures"]]
    chance = [c["chance"]["iacc"] for c in report["captures"]]
    # an untrained LeNet-5, m = 3 steps of B = 8: rlu recovers the labels (simulate captures of this setting
    # score 1.0 as well; README, "Flower")
    assert min(best) >= 0.9 and min(b - c for b, c in zip(best, chance, strict=True)) > 0.2, (best, chance)
    assert sum(f["rule"] == "GLEAK-LABELS" for f in report["findings"]) == 6
