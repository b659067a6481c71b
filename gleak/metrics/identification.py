"""Identification: can the true image be picked out of a lineup by its reconstruction?

PSNR rewards a blurred average and punishes a recognisable image with a noisy background, so it says little about
what a person sees. The audit's image metric is a lineup instead. For each true image t_j the lineup holds t_j and
K distractors — images of the same class from the auxiliary data — so the test is one of identity, not of class.
The distractors must be independent of the batch: another image of the batch has its own reconstruction, which
would make it look identified too, so without auxiliary data there is no lineup. Each candidate c is scored by the
similarity of the reconstruction the Hungarian matching pairs with it when c stands in t_j's place; t_j is
identified when its score beats every distractor's (a tie shares the credit). Under the null hypothesis —
reconstructions that carry nothing of the batch — the K + 1 candidates are exchangeable, so the chance of
identifying t_j is exactly 1 / (K + 1) however the reconstructions were matched; matching on the truth alone would
hand it an advantage.

The similarity (:data:`SIMILARITIES`) is the Pearson correlation of the images after a Gaussian low-pass
(``ncc``) by default: it ignores brightness and contrast (reconstructions are often washed out) and the blur
averages pixel noise away; bench/images.py compares it with SSIM after the same low-pass, LPIPS and
negative MSE on a graded set whose order is known (bench/results/images.md).

The rate comes with its chance and a Clopper–Pearson interval (scipy's ``binomtest``); severity follows the
identification over chance, κ = (rate − chance) / (1 − chance), which is 0 at chance and 1 when every image is
identified.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from gleak.metrics.perceptual import LPIPSModel

SIMILARITIES = ("ncc", "ssim", "lpips", "mse")
DEFAULT_SIMILARITY = "ncc"
DEFAULT_DISTRACTORS = 9  # K: chance 10 %
LEVEL = 0.95
DUPLICATE_MSE = 1e-6  # an aux image this close to the true one is the same picture, never its distractor
SimilarityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------------------------------------ similarity
def lowpass(images: torch.Tensor, sigma: float | None = None) -> torch.Tensor:
    """Images [N, C, H, W] blurred by a Gaussian of ``sigma`` pixels (default: the short side / 28, so 1 px on
    28–32 px images), reflect-padded; separable."""
    sigma = sigma if sigma is not None else max(1.0, min(images.shape[-2:]) / 28)
    radius = max(1, math.ceil(3 * sigma))
    radius = min(radius, min(images.shape[-2:]) - 1)
    if radius < 1:
        return images
    x = torch.arange(-radius, radius + 1, dtype=images.dtype)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    c = images.shape[1]
    out = F.pad(images, (radius, radius, radius, radius), mode="reflect")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(out, kernel.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


def ncc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[len(a), len(b)] Pearson correlations of the low-passed images (a flat image correlates 0 with all)."""
    def standardised(x: torch.Tensor) -> torch.Tensor:
        flat = lowpass(x.double()).flatten(1)
        flat = flat - flat.mean(1, keepdim=True)
        norm = flat.norm(dim=1, keepdim=True)
        flat_image = norm <= 1e-9 * flat.shape[1] ** 0.5  # no structure: rounding error is not a signal
        return torch.where(flat_image, torch.zeros_like(flat), flat / norm.clamp_min(1e-300))

    return standardised(a) @ standardised(b).T


def ssim_lowpass(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[len(a), len(b)] SSIM (scikit-image defaults, data range 1) of the low-passed images."""
    from gleak.metrics.images import ssim_pair  # scikit-image (and scipy) only when asked for

    x, y = lowpass(a.double()).clamp(0, 1).numpy(), lowpass(b.double()).clamp(0, 1).numpy()
    out = np.empty((len(x), len(y)))
    for i, u in enumerate(x):
        for j, v in enumerate(y):
            out[i, j] = ssim_pair(u, v)
    return torch.from_numpy(out)


def negative_mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[len(a), len(b)] minus the mean squared pixel error (what PSNR ranks by)."""
    return -torch.cdist(a.double().flatten(1), b.double().flatten(1)).pow(2) / a[0].numel()


def lpips_similarity(model: LPIPSModel) -> SimilarityFn:
    """[len(a), len(b)] minus LPIPS, with a ready :class:`~gleak.metrics.perceptual.LPIPSModel`."""
    def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        left = a.repeat_interleave(len(b), 0)
        right = b.repeat(len(a), 1, 1, 1)
        values, _ = model.distance(left, right)
        return -values.double().view(len(a), len(b))

    return similarity


def similarity_fn(name: str, lpips: Any = None) -> SimilarityFn:
    """The named similarity (:data:`SIMILARITIES`); ``lpips`` needs an available LPIPS model."""
    if name == "ncc":
        return ncc
    if name == "ssim":
        return ssim_lowpass
    if name == "mse":
        return negative_mse
    if name == "lpips":
        if lpips is None or not lpips.available:
            raise ValueError("the lpips similarity needs an available LPIPS model")
        return lpips_similarity(lpips)
    raise ValueError(f"unknown similarity '{name}' ({', '.join(SIMILARITIES)})")


# ------------------------------------------------------------------------------------------------ distractors
@dataclass
class Distractors:
    """Per true image, the pixels of its K distractors, and where they came from."""

    images: list[torch.Tensor]
    source: str  # "aux, same class" / "aux, same class where possible"
    same_class: float  # the share of distractors of the true image's class


def draw_distractors(truth: torch.Tensor, classes: Sequence[int | None], pool: torch.Tensor,
                     pool_labels: torch.Tensor, k: int = DEFAULT_DISTRACTORS, seed: int = 0) -> Distractors:
    """K distractors per true image [B, C, H, W], seeded, from ``pool`` (pixels, with labels): of the image's class
    where the pool holds K of them, topped up from the other classes; never a copy of any image of the batch
    (its reconstruction would vouch for it)."""
    if len(pool) == 0:
        raise ValueError("the distractor pool is empty")
    gen = torch.Generator().manual_seed(seed)
    flat_pool = pool.double().flatten(1)
    copies = torch.zeros(len(pool), dtype=torch.bool)
    for image in truth:
        copies |= ((flat_pool - image.double().flatten()) ** 2).mean(1) < DUPLICATE_MSE
    allowed = ~copies
    out: list[torch.Tensor] = []
    same = total = 0
    for j in range(len(truth)):
        label = classes[j]
        if label is None:
            own, rest = torch.empty(0, dtype=torch.long), torch.nonzero(allowed).flatten()
        else:
            own = torch.nonzero(allowed & (pool_labels == label)).flatten()
            rest = torch.nonzero(allowed & (pool_labels != label)).flatten()
        own = own[torch.randperm(len(own), generator=gen)][:k]
        rest = rest[torch.randperm(len(rest), generator=gen)][: k - len(own)]
        chosen = torch.cat([own, rest])
        same += len(own)
        total += len(chosen)
        out.append(pool[chosen].to(truth.dtype))
    source = "aux, same class" if total and same == total else "aux, same class where possible"
    return Distractors(out, source, same / total if total else 0.0)


# ------------------------------------------------------------------------------------------------ the lineup
@dataclass
class Identification:
    """The lineup's outcome: per true image the matched reconstruction, its rank among the K + 1 candidates (1 is
    first; ties averaged), the credit (1 identified, 1/t when tied with t − 1 distractors, else 0) and the
    candidates' scores (truth first); overall the rate, its chance and interval, and κ."""

    matched: list[int]
    ranks: list[float]
    credits: list[float]
    scores: list[list[float]]
    chance: float
    similarity: str
    distractors: int
    source: str
    level: float = LEVEL
    interval: tuple[float, float] = (0.0, 1.0)
    same_class: float = 0.0  # the share of distractors of the true image's class

    @property
    def n(self) -> int:
        return len(self.credits)

    @property
    def rate(self) -> float:
        return float(sum(self.credits) / self.n) if self.n else 0.0

    @property
    def kappa(self) -> float:
        """Identification over chance, (rate − chance) / (1 − chance)."""
        return (self.rate - self.chance) / (1 - self.chance) if self.chance < 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"rate": round(self.rate, 4), "identified": round(sum(self.credits), 3), "n": self.n,
                "chance": round(self.chance, 4), "kappa": round(self.kappa, 4),
                "interval": [round(self.interval[0], 4), round(self.interval[1], 4)], "level": self.level,
                "similarity": self.similarity, "distractors": self.distractors, "lineup": self.source,
                "ranks": [round(r, 2) for r in self.ranks], "matched": self.matched,
                "same_class": round(self.same_class, 4)}


def clopper_pearson(successes: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Exact binomial interval for ``successes`` (rounded: ties give fractional credit) of ``n``."""
    from scipy.stats import binomtest

    if n == 0:
        return 0.0, 1.0
    k = min(n, max(0, round(successes)))
    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def _assigned(sim: np.ndarray) -> np.ndarray:
    """For each column (true image) the row (reconstruction) paired with it by the maximum-similarity matching
    (−1 when there are fewer reconstructions than columns and it got none)."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(sim, maximize=True)
    out = np.full(sim.shape[1], -1, dtype=np.int64)
    out[cols] = rows
    return out


def identify(recons: torch.Tensor, truth: torch.Tensor, distractors: Distractors,
             similarity: str = DEFAULT_SIMILARITY, lpips: Any = None, level: float = LEVEL) -> Identification:
    """Run the lineup of every true image (module docstring). ``recons`` [R, C, H, W] and ``truth`` [B, C, H, W]
    are pixels in [0, 1]; ``distractors.images[j]`` holds t_j's K_j distractors."""
    if recons.shape[1:] != truth.shape[1:]:
        raise ValueError(f"reconstructions {list(recons.shape[1:])} and truth {list(truth.shape[1:])} differ in shape")
    sim_fn = similarity_fn(similarity, lpips)
    recons, truth = recons.detach().float().cpu().clamp(0, 1), truth.detach().float().cpu().clamp(0, 1)
    base = sim_fn(recons, truth).numpy()  # [R, B]
    matched = _assigned(base)
    ranks: list[float] = []
    credits: list[float] = []
    scores: list[list[float]] = []
    chances: list[float] = []
    for j in range(len(truth)):
        own = float(base[matched[j], j]) if matched[j] >= 0 else -math.inf
        candidates = distractors.images[j]
        against = sim_fn(recons, candidates).numpy() if len(candidates) else np.zeros((len(recons), 0))
        others = []
        for c in range(against.shape[1]):
            swapped = base.copy()
            swapped[:, j] = against[:, c]
            row = _assigned(swapped)[j]
            others.append(float(swapped[row, j]) if row >= 0 else -math.inf)
        higher = sum(1 for s in others if s > own)
        tied = sum(1 for s in others if s == own)
        ranks.append(1 + higher + tied / 2)
        credits.append(1.0 / (1 + tied) if higher == 0 else 0.0)
        scores.append([own, *others])
        chances.append(1.0 / (1 + len(others)))
    chance = float(np.mean(chances)) if chances else 1.0
    k = max((len(d) for d in distractors.images), default=0)
    return Identification([int(m) for m in matched], ranks, credits, scores, chance, similarity, k,
                          distractors.source, level, clopper_pearson(sum(credits), len(credits), level),
                          distractors.same_class)
