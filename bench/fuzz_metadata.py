"""Set every capture metadata key to each of a list of awkward values and run the CLI on the result.

The default test run covers each class of bad input once (tests/test_untrusted_inputs.py); this sweep tries
every key × value on a FedSGD gradient, a 10-step FedAvg update (label attacks with auxiliary data) and a
single-example capture (reconstruction), and lists every run that did not end in exit 0 or a one-line exit 2.
About 2,400 runs, 15 minutes on 2 cores:

    python bench/fuzz_metadata.py [--only fedsgd|fedavg|smoothing]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from typer.testing import CliRunner

from gleak.capture import SCHEMA
from gleak.cli import app
from gleak.io import read_safetensors, safetensors_bytes

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
LENET = SAMPLES / "models/lenet_untrained.safetensors"
AUX = SAMPLES / "data/mnist_aux.safetensors"
CAPTURES = {"fedsgd": SAMPLES / "captures/fedsgd_b32.safetensors",
            "fedavg": SAMPLES / "captures/fedavg_m10.safetensors",
            "smoothing": SAMPLES / "captures/smoothing_1.safetensors"}
VALUES = ["0", "-1", "1", "2", "0.5", "1e308", "nan", "[]", "[0]", "[1,28,28]", "[1,2,3]", "{}", '"x"', "true",
          "65536", "[0.5]", "sum", "adam", "fedprox", "scaffold", "focal", "bce"]
LABEL_ATTACKS = ("llg", "ilrg", "posterior", "rlu", "zlg-plus", "llg-star", "idlg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CAPTURES))
    args = parser.parse_args()
    runner = CliRunner()
    bad, runs = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, source in CAPTURES.items():
            if args.only and name != args.only:
                continue
            tensors, meta = read_safetensors(source)
            for key in SCHEMA:
                for value in VALUES:
                    path = work / f"{name}.safetensors"
                    path.write_bytes(safetensors_bytes(tensors, {**meta, key: value}))
                    if name == "smoothing":
                        cli = ["reconstruct", str(path), "-M", str(LENET), "-n", "2", "-o", str(work / "r"),
                               "--force", "--no-truth"]
                    else:
                        cli = ["labels", str(path), "-M", str(LENET), "--aux", str(AUX), "--no-truth", "--format",
                               "json", *[a for attack in LABEL_ATTACKS for a in ("-a", attack)]]
                    r = runner.invoke(app, cli, catch_exceptions=True)
                    runs += 1
                    one_line = len(r.stderr.splitlines()) == 1
                    if r.exit_code not in (0, 2) or "Traceback" in r.stderr or (r.exit_code == 2 and not one_line):
                        bad.append(f"{name} {key}={value!r}: exit {r.exit_code}: {r.stderr.strip()[-200:]}")
                        print("BAD", bad[-1], flush=True)
                    if runs % 100 == 0:
                        print(f"{runs} runs, {len(bad)} bad", flush=True)
    print(f"{runs} runs, {len(bad)} bad")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
