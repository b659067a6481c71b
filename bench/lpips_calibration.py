"""Check gleak's offline LPIPS against published official values (pyiqa's calibration set).

    python bench/lpips_calibration.py PATH/TO/pyiqa-0.1.16/ResultsCalibra

The pyiqa sdist (PyPI, `pip download --no-binary :all: --no-deps pyiqa==0.1.16`) ships five TID2013
reference/distorted pairs and, in ``results_official.csv``, the scores of the official implementations
(LPIPS: richzhang/PerceptualSimilarity, AlexNet, v0.1). The images are not redistributed with gleak
(PolyForm Noncommercial licence), so this check runs on a path you supply; nothing is downloaded here.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gleak.metrics.perceptual import load_lpips


def read(path: Path) -> torch.Tensor:
    with Image.open(path) as img:
        array = np.array(img.convert("RGB"), dtype=np.float32) / 255
    return torch.from_numpy(array).permute(2, 0, 1)[None]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = Path(sys.argv[1])
    with open(folder / "results_official.csv") as f:
        rows = {r[0]: r[1:] for r in csv.reader(f)}
    names = rows["Method"]
    official = [float(v) for v in rows["lpips"]]
    model = load_lpips("alex")
    if not model.available:
        sys.exit(f"LPIPS unavailable: {model.reason}")
    print(f"LPIPS trunk: {model.source}")
    worst = 0.0
    for name, want in zip(names, official, strict=True):
        got = float(model.distance(read(folder / "dist_dir" / name), read(folder / "ref_dir" / name))[0][0])
        worst = max(worst, abs(got - want))
        print(f"{name}: gleak {got:.5f}  official {want:.5f}  |diff| {abs(got - want):.1e}")
    print(f"largest difference {worst:.1e}")
    sys.exit(0 if worst < 5e-4 else 1)


if __name__ == "__main__":
    main()
