"""Soft-label recovery for one example (Wang, Liang & He, ICLR 2024, §3, App. B, C): label smoothing and mixup.

Notes, reference-code settings and gleak's deviations: docs/methods/label-recovery.md#softlabel.

With x the last-layer input and ∇W[i] = (p_i − y_i)·xᵀ, any non-zero row r gives x = λ·∇W[r]. For a
candidate scalar s (x(s) = s·∇W[r]/coe, the reference's parametrisation, λ = s/coe) the pseudo-label
ŷ_i(s) = p_i(x(s)) − ∇W[i, a]/x_a(s) with a = argmax |x| (Eq. 4) equals y at the true s and always sums to
1 (Theorem 1). Smoothing leaves every entry but the top-1 equal, mixup every entry but the top-2 zero, so
the search minimises L(s) = 1000·Var(all but the top-k of ŷ) (Eq. 5): first L-BFGS from s = +1 then
s = −1 (bound 100, 100 outer steps per side, the reference's plateau skip), accepted at L < 1e−9; if that
fails, particle swarms (pyswarms, 500 particles, 40 iterations, c1 = c2 = 0.5, w = 0.8, positions clipped
like scikit-opt) over the reference's widening intervals, and then (gleak's extension, reported as such)
two more interval pairs out to |s| = 1000 for trained models whose λ lies past the reference's reach.
Every swarm is evaluated in one batched forward of the last layer. The recovered feature is
x* = s*·∇W[r]/coe (§3.1), used by reconstruction.

Deviations, by choice: a candidate below the 1e−9 threshold is polished by strong-Wolfe L-BFGS steps (the
threshold alone leaves label errors near 1e−4) and kept only if it then reaches 1e−12 inside the bound (on
trained models L(s) also creeps below 1e−9 at spurious far-out points); success is decided by the loss
(the reference code uses an oracle on the true s). Every search runs on the rank-1 projection of ∇W
(`rank_one`; a no-op, to rounding, on a clean single-example gradient).

Noisy gradients (§5.2, gleak's own method; the reference's `pso_noise` takes the global minimum of L over
|s| ≤ 10). The noise level is estimated from the rank-one residual of ∇W; above ``NOISY`` (50× a float32
gradient's rounding) no exact zero can exist and the exact stages are skipped. Then :class:`NoisyFit` fits
each label family — smoothing, pure mixup, and the reference's mixup family (two free classes, the rest
equal, which contains smoothing) — by generalised least squares along x = t·v, with the noise's first-order
covariance (also through the softmax) and ∇b as a second view of p − y when the layer has a bias, t profiled
by a log grid and Brent's method. :func:`choose` picks the family by a penalised likelihood that does not
favour the richer model: pure mixup pays the prior cost of naming a second class, the reference's mixup
family a likelihood-ratio test at level 1 % that the second class carries mass of its own. Every result
reports a confidence: 1 − (90 % bound on ‖ŷ − y‖₁)/2, the bound from the fitted label's covariance and the
competing local minima weighted by their likelihood (:func:`l1_bound`), with a warning when it is low.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import row_sums
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError

THRESHOLD = 1e-9  # the reference's acceptance threshold on L(s)
CONFIRM = 1e-12  # what a polished true solution must reach in float64
# below this a polished zero is certain; between SURE and CONFIRM it may be a shoulder next to the true zero of a
# trained model (λ off by ~1 %), so a dense grid scan looks for a clearly lower zero first (`grid_rescue`)
SURE = 1e-14
BOUND = 100.0
STEPS_PER_SIDE = 100
COEFFICIENT = {"smoothing": 4.0, "mixup": 2.0}
EXCLUDED = {"smoothing": 1, "mixup": 2}
PSO_INTERVAL_BOUND = {"smoothing": 20.0, "mixup": 50.0}
PSO_PARTICLES, PSO_ITERS = 500, 40
# gleak's extension past the reference's reach (|s| < 70): trained models put λ there (Wang et al., App. B.2)
EXTENDED_INTERVALS = [(69.7, 200.0), (-200.3, -70.0), (199.7, 1000.0), (-1000.3, -200.0)]
EXTENDED_BOUND = 1000.0
# the reference's `pso_noise` (its DP experiment) swarms 200 particles for 30 iterations over |s| ≤ 10; gleak's
# noisy fit (NoisyFit) keeps the numbers as its budget: 200 grid points per sign, 30 Brent steps per minimum
NOISE_PARTICLES, NOISE_ITERS = 200, 30
# L-BFGS on the one scalar s: in one dimension the two-loop recursion reduces to the newest secant pair
# (s_k/y_k), so a history of 2 gives the reference's iterates (PyTorch default 100) up to rounding, ~3x faster
HISTORY = 2


class SoftLabelOptions(AttackOptions):
    augmentation: Literal["auto", "smoothing", "mixup"] = Field(
        "auto", description="the label's kind: auto (search both), smoothing or mixup")
    lbfgs_steps: int = Field(STEPS_PER_SIDE, ge=1, le=100_000, description="L-BFGS outer steps per side of s "
                             "(the first stage)")
    pso_particles: int = Field(PSO_PARTICLES, ge=1, le=100_000, description="particles per swarm when L-BFGS "
                               "finds no exact zero")
    pso_iterations: int = Field(PSO_ITERS, ge=1, le=100_000, description="iterations per swarm")
    noise_particles: int = Field(NOISE_PARTICLES, ge=3, le=100_000, description="noisy gradients: points per "
                                 "sign of the log grid over the feature's scale that the noise-aware fit scans")
    noise_iterations: int = Field(NOISE_ITERS, ge=1, le=100_000, description="noisy gradients: Brent steps "
                                  "refining each local minimum of the noise-aware fit")


@dataclass
class Search:
    augmentation: str
    s: float
    loss: float
    stage: str
    exact: bool


def rank_one(grad: torch.Tensor) -> torch.Tensor:
    """The best rank-1 approximation of ∇W (truncated SVD): a single example's gradient is exactly
    (p − y)·xᵀ (Wang, Liang & He, ICLR 2024, §3.1), so this leaves a clean gradient unchanged (to float64
    rounding) and, for a noisy one (§5.2), pools every row's copy of x and every coordinate's copy of p − y
    instead of reading them off one row r and one column a. With ∇W projected, ŷ(s) no longer depends on
    the choice of a."""
    u, sv, vh = torch.linalg.svd(grad.double(), full_matrices=False)
    approx: torch.Tensor = sv[0] * torch.outer(u[:, 0], vh[0])
    return approx


class PseudoLabel:
    """ŷ(s) and L(s) for a batch of candidate scalars s (one forward of the last layer for all).

    ``denoise`` (gleak's choice, default) searches on the rank-1 projection of ∇W (see ``rank_one``): the same
    landscape as the reference's for a clean gradient, a far less noisy one under DP noise (§5.2)."""

    def __init__(self, grad: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, row: int,
                 augmentation: str, denoise: bool = True) -> None:
        self.grad = rank_one(grad) if denoise else grad.double()
        self.weight = weight.double()
        self.bias = None if bias is None else bias.double()
        self.r = self.grad[row] / COEFFICIENT[augmentation]
        self.a = int(torch.argmax(self.r.abs()))  # the coordinate a = argmax |x| (same for every s ≠ 0)
        self.keep = self.grad.shape[0] - EXCLUDED[augmentation]

    def labels(self, s: torch.Tensor) -> torch.Tensor:
        x = s[:, None] * self.r[None, :]  # [S, d]
        z = x @ self.weight.T
        if self.bias is not None:
            z = z + self.bias
        p = torch.softmax(z, dim=1)
        return p - self.grad[:, self.a][None, :] / x[:, self.a:self.a + 1]

    def loss(self, s: torch.Tensor) -> torch.Tensor:
        y = self.labels(s)
        smallest = torch.topk(y, self.keep, dim=1, largest=False).values
        return 1000 * smallest.var(dim=1, unbiased=False)

    def noise_loss(self, s: torch.Tensor) -> torch.Tensor:
        """‖x(s)‖²·L(s), the variance loss rescaled for noisy gradients (Wang, Liang & He, ICLR 2024, §5.2).

        Noise δ on ∇W enters ŷ(s) as δ/x(s), so it adds ~σ²/‖x(s)‖² to L(s): that term fades as |s| grows and,
        with the softmax saturating (App. B.2), drags the minimum of L outward. Weighted by ‖x(s)‖² the noise
        term is flat in s, and the weighted loss no longer vanishes as |s| → ∞ (it tends to the spread of the
        non-top rows of ∇W). Since ∇W − (p(x) − y)·xᵀ = (ŷ(s) − y)·xᵀ for the projected gradient, it is about
        the least-squares misfit of the best smoothing / mixup label, i.e. the likelihood objective under
        i.i.d. Gaussian gradient noise. It vanishes exactly where L does (s ≠ 0).

        No longer searched: :class:`NoisyFit` replaces it with the full generalised least squares (the noise also
        reaches p through the noisy feature, and ∇b is a second view of p − y), which this approximates."""
        weighted: torch.Tensor = (s * self.r.norm()) ** 2 * self.loss(s)
        return weighted


def lbfgs_search(f: PseudoLabel, first_sign: float = 1.0, steps: int = STEPS_PER_SIDE) -> tuple[float, float, str]:
    """The reference's two-sided L-BFGS (lr 0.5, ``steps`` (100) outer steps per side, bound 100, plateau skip).

    ``first_sign`` only orders the two sides (both are searched unless the first succeeds)."""
    best: tuple[float, float, str] = (float("nan"), float("inf"), "lbfgs: no side converged")
    for sign in (first_sign, -first_sign):
        s = torch.tensor([sign], dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([s], lr=0.5, history_size=HISTORY)
        history: list[float] = []
        skip = 0.5

        def closure(opt: torch.optim.Optimizer = opt, s: torch.Tensor = s) -> torch.Tensor:
            opt.zero_grad()
            value = f.loss(s)[0]
            if torch.isfinite(value):
                torch.autograd.backward(value)  # value.backward(), typed
            return value

        for _ in range(steps):
            with torch.no_grad():
                value = float(f.loss(s)[0])
            if not np.isfinite(value):
                break
            if abs(float(s.detach())) > BOUND:
                break  # out of bound: this side failed (the reference flips side, then falls back to PSO)
            if value < THRESHOLD:
                return float(s.detach()), value, f"lbfgs from {sign:+.0f}"
            history.append(value)
            if len(history) >= 3 and max(history[-3:]) - min(history[-3:]) < sum(history[-3:]) / 3000:
                with torch.no_grad():
                    s += sign * skip  # plateau: jump ahead, doubling the jump each time
                skip *= 2
                history.clear()
                continue
            opt.step(closure)  # type: ignore[no-untyped-call]  # torch leaves LBFGS.step unannotated
            if value < best[1]:
                best = (float(s.detach()), value, f"lbfgs from {sign:+.0f} (not converged)")
    return best


@contextlib.contextmanager
def _quiet_pyswarms(seed: int) -> Iterator[None]:
    """pyswarms sets up the root logger and a report.log file whenever it makes a Reporter (at import and per
    optimizer) unless LOG_CFG names a config: give it ours, which touches nothing. Also seed numpy's global
    generator (pyswarms draws from it) and restore its state afterwards."""
    previous = os.environ.get("LOG_CFG")
    os.environ["LOG_CFG"] = str(Path(__file__).with_name("pyswarms_logging.yaml"))
    state = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        np.random.set_state(state)
        if previous is None:
            os.environ.pop("LOG_CFG", None)
        else:
            os.environ["LOG_CFG"] = previous


def pso_intervals(inter_bound: float, upper: float = 70.0) -> list[tuple[float, float]]:
    """The reference's widening intervals, each mirrored and overlapping by 0.3: widths 5, inter_bound/5,
    then inter_bound, while the upper end stays below 70 — [0.7, 6], [−6.3, −1], [5.7, 10], ..., [−50.3, −30]
    for smoothing (20) and [0.7, 6], [5.7, 16], [15.7, 66] (and mirrors) for mixup (50)."""
    out: list[tuple[float, float]] = []
    low = 1.0
    for width in [5.0, inter_bound / 5] + [inter_bound] * 100:
        high = low + width
        if high >= upper:
            break
        out += [(low - 0.3, high), (-high - 0.3, -low)]
        low = high
    return out


def pso_search(f: PseudoLabel, augmentation: str, seed: int, intervals: list[tuple[float, float]] | None = None,
               particles: int = PSO_PARTICLES, iters: int = PSO_ITERS) -> tuple[float, float, str, bool]:
    """Particle swarms over the widening intervals; the first swarm below the threshold wins, else the lowest."""
    best = (float("nan"), float("inf"), "pso: no interval", False)
    extended = intervals is not None
    bound = EXTENDED_BOUND if extended else BOUND
    for k, (low, high) in enumerate(intervals or pso_intervals(PSO_INTERVAL_BOUND[augmentation])):
        with _quiet_pyswarms(seed + k):
            from pyswarms.single import GlobalBestPSO

            opt = GlobalBestPSO(n_particles=particles, dimensions=1, options={"c1": 0.5, "c2": 0.5, "w": 0.8},
                                bounds=(np.array([low]), np.array([high])), bh_strategy="nearest")

            def objective(positions: np.ndarray) -> np.ndarray:
                with torch.no_grad():
                    t = torch.from_numpy(positions[:, 0])
                    values = f.loss(t)
                return torch.nan_to_num(values, nan=1e30, posinf=1e30).numpy()

            cost, pos = opt.optimize(objective, iters=iters, verbose=False)
        name = f"pso{' extended' if extended else ''} [{low:g}, {high:g}]"
        if cost < THRESHOLD and confirm(f, float(pos[0]), float(cost), bound)[2]:
            return float(pos[0]), float(cost), name, True
        if cost < best[1]:
            best = (float(pos[0]), float(cost), name, False)
    return best


def polish(f: PseudoLabel, s: float, loss: float) -> tuple[float, float]:
    """Refine an accepted scalar (strong-Wolfe L-BFGS from it): the 1e−9 acceptance threshold leaves errors
    of ~1e−4 in the label; polishing brings them to the float64 floor. Keeps the old value unless it helps."""
    t = torch.tensor([s], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([t], lr=1.0, max_iter=50, history_size=HISTORY, tolerance_grad=1e-30,
                            tolerance_change=1e-30, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = f.loss(t)[0]
        torch.autograd.backward(value)  # value.backward(), typed
        return value

    try:
        opt.step(closure)  # type: ignore[no-untyped-call]  # torch leaves LBFGS.step unannotated
    except RuntimeError:
        return s, loss
    with torch.no_grad():
        new = float(f.loss(t.detach())[0])
    return (float(t.detach()), new) if np.isfinite(new) and new < loss else (s, loss)


def confirm(f: PseudoLabel, s: float, loss: float, bound: float = BOUND) -> tuple[float, float, bool]:
    """Polish a candidate below the reference threshold and keep it only if it is a true zero in float64.

    On trained models the softmax saturates and L(s) creeps below 1e−9 far out (|s| → ∞) or on shoulders
    next to the solution; true solutions polish to ~1e−15. So: polished loss < 1e−12 and |s| within the bound."""
    if loss >= THRESHOLD:
        return s, loss, False
    ps, pl = polish(f, s, loss)
    if pl < CONFIRM and abs(ps) <= bound:
        return ps, pl, True
    return s, loss, False


RESCUE_WINDOW, RESCUE_POINTS = 0.1, 4001  # ±10 % around a held near-zero, 0.005 % apart


def grid_rescue(f: PseudoLabel, held: Search) -> Search | None:
    """A held near-zero (between SURE and CONFIRM) may be a shoulder beside the true zero (trained models, λ off
    by 0.2–1.2 %). Scan L(s) on a dense batched grid within ±10 % of it, polish the lowest local minima that
    undercut the held loss tenfold and return the first that confirms below it; None when nothing better
    exists (a float32 gradient's true zero can itself sit above SURE)."""
    s = held.s * (1 + torch.linspace(-RESCUE_WINDOW, RESCUE_WINDOW, RESCUE_POINTS, dtype=torch.float64))
    with torch.no_grad():
        values = torch.nan_to_num(f.loss(s), nan=1e30)
    interior = (values[1:-1] <= values[:-2]) & (values[1:-1] <= values[2:]) & (values[1:-1] < held.loss / 10)
    minima = torch.nonzero(interior).flatten() + 1
    for i in minima[torch.argsort(values[minima])][:5].tolist():
        ps, pl, exact = confirm(f, float(s[i]), float(values[i]), EXTENDED_BOUND)
        if exact and pl < held.loss / 10:
            return Search(held.augmentation, ps, pl, f"grid [{float(s[i]):.4g}] past a near-zero", True)
    return None


def search(fs: dict[str, PseudoLabel], seed: int, first_sign: float = 1.0,
           options: SoftLabelOptions | None = None) -> list[Search]:
    """L-BFGS for every objective first (cheap), then swarms for each objective only if none was exact. ``fs`` is
    in search order; ``options`` sets the step, particle and iteration counts (default: :class:`SoftLabelOptions`'
    defaults). When nothing is exact, the caller fits the label to the noisy gradient (:class:`NoisyFit`).

    A confirmed zero below ``SURE`` ends the search at once. One between ``SURE`` and ``CONFIRM`` — a float32
    gradient's true zero can sit there, and so can a trained model's shoulder next to it — ends it too, after
    a dense grid scan (:func:`grid_rescue`) has looked for a clearly lower zero."""
    o = options or SoftLabelOptions()
    results: dict[str, Search] = {}

    def settle(found: Search) -> list[Search]:
        if found.loss >= SURE:
            found = grid_rescue(fs[found.augmentation], found) or found
        results[found.augmentation] = found
        return list(results.values())

    for kind, f in fs.items():
        s, loss, stage = lbfgs_search(f, first_sign, o.lbfgs_steps)
        s, loss, exact = confirm(f, s, loss)
        results[kind] = Search(kind, s, loss, stage if exact or loss >= THRESHOLD else stage + ", rejected", exact)
        if exact:
            return settle(results[kind])
    for extended in (None, EXTENDED_INTERVALS):
        for kind, f in fs.items():
            ps, ploss, pstage, _ = pso_search(f, kind, seed, extended, o.pso_particles, o.pso_iterations)
            ps, ploss, exact = confirm(f, ps, ploss, EXTENDED_BOUND if extended else BOUND)
            # beyond the reference's range only an exact zero counts: there L(s) creeps down as the softmax
            # saturates, so with noisy gradients the far-out region would always win a "lowest loss" contest
            if exact or (extended is None and ploss < results[kind].loss):
                results[kind] = Search(kind, ps, ploss, pstage, exact)
            if exact:
                return settle(results[kind])
    return list(results.values())


# ------------------------------------------------------------------------------------------ noisy gradients
# Relative noise level (rank-one residual / RMS of ∇W) above which no exact zero can exist: a clean float32
# single-example gradient sits at ~2e−8 (rounding), and L < 1e−12 needs ŷ exact to ~1e−7.
NOISY = 1e-6
NOISE_RANGE = (0.5, 1e4)  # |t|/σ₁ the noisy fit scans: ‖p − y‖ = σ₁/|t| runs from 2 (its maximum, √2) to 1e−4
NOISE_BASINS = 4  # local minima of each family's misfit refined and weighed against each other
FAMILY_AUGMENTATION = {"smoothing": "smoothing", "mixup": "mixup", "mixup+smoothing": "mixup"}
FAMILY_PARAMETERS = {"smoothing": 1, "mixup": 1, "mixup+smoothing": 2}
CHOICE_ALPHA = 0.01  # false-alarm rate of the test that the second class carries mass of its own
CONFIDENCE_DRAWS = 1000
LOW_CONFIDENCE_L1 = 0.1  # warn when the 90 % L1 error bound exceeds this (confidence below 0.95)
LOW_AUGMENTATION = 0.9  # warn when the chosen augmentation has less weight than this
POOR_FIT = 4.0  # warn when the chosen noisy fit's reduced χ² exceeds this
FAMILIES = {"auto": ("smoothing", "mixup", "mixup+smoothing"), "smoothing": ("smoothing",),
            "mixup": ("mixup", "mixup+smoothing")}


def family_penalty(family: str, C: int) -> float:
    """The penalty a family pays in the choice (in χ² units; the smallest χ²/φ + penalty wins).

    smoothing 0; mixup (pure) 2·ln(C − 1), the price of naming the second class among C − 1 (an AIC-style
    model prior: a pure-mixup fit that is no better than the smoothing fit is reported as smoothing, which it
    then equals up to ε ≈ 1 − r); mixup+smoothing (the reference's mixup family, which contains smoothing) the
    1 − α quantile of the largest of C − 1 independent χ²₁, i.e. a likelihood-ratio test at level α that the
    second class carries mass beyond the common off-target value."""
    if family == "smoothing":
        return 0.0
    if family == "mixup":
        return 2.0 * math.log(max(C - 1, 1))
    p = (1.0 - CHOICE_ALPHA) ** (1.0 / max(C - 1, 1))
    return float(2.0 * torch.special.erfinv(torch.tensor(p, dtype=torch.float64)) ** 2)


@dataclass
class Fit:
    """One local minimum of a family's misfit along x = t·v (noisy-gradient fit)."""

    family: str
    t: float
    chi2: float
    logdet: float  # log det of the observations' covariance (in units of τ²) at t
    label: torch.Tensor
    dof: int
    theta_cov: torch.Tensor  # covariance of the family's parameters at fixed t, in units of τ²


@dataclass
class Misfit:
    """A family's misfit on a batch of t: χ² [S], fitted labels [S, C], parameter covariance [S, k, k] (τ²)."""

    chi2: torch.Tensor
    label: torch.Tensor
    theta_cov: torch.Tensor


def _design(order: torch.Tensor, C: int, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """y = a0 + A·θ for each candidate (rows of ``order``: classes by decreasing target), Σy = 1 built in.

    smoothing: y = e₁ + ε·(1/C − e₁); mixup: y = e₂ + r·(e₁ − e₂); mixup+smoothing:
    y = e₂ + a·(e₁ − e₂) + ε·(1/C − e₂) (a = (1 − ε)·r)."""
    e1 = torch.nn.functional.one_hot(order[:, 0], C).double()
    e2 = torch.nn.functional.one_hot(order[:, 1], C).double()
    if family == "smoothing":
        return e1, (1.0 / C - e1)[:, :, None]
    if family == "mixup":
        return e2, (e1 - e2)[:, :, None]
    return e2, torch.stack([e1 - e2, 1.0 / C - e2], dim=2)


def _solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched solve of small positive semi-definite systems through numpy (torch's batched LAPACK calls pay
    milliseconds of thread-pool overhead on small batches, which the Brent refinement would pay hundreds of
    times); a ridge of 1e−12 of the diagonal keeps an exactly singular one (a fully saturated softmax) finite."""
    return torch.from_numpy(np.linalg.solve(_ridge(a).numpy(), b.numpy()))


def _inv(a: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.linalg.inv(_ridge(a).numpy()))


def _ridge(a: torch.Tensor) -> torch.Tensor:
    scale = a.diagonal(dim1=-2, dim2=-1).abs().amax(-1).clamp_min(1e-300)
    return a + 1e-12 * scale[..., None, None] * torch.eye(a.shape[-1], dtype=a.dtype)


class NoisyFit:
    """Gaussian likelihood of the soft-label families on a noisy single-example gradient (§5.2).

    With G = ∇W = σ₁·u·vᵀ + noise (best rank one by SVD) and x = t·v, the gradient's rank-one part says
    σ₁·u = t·(p(t) − y), i.e. ŷ(t) = p(t) − σ₁·u/t = y + noise (the pseudo-label of Eq. 4 on the projected
    gradient), and ∇b (when the layer has a bias) says ∇b = p(t) − y, i.e. p(t) − ∇b = y + noise. To first order
    in i.i.d. noise N of std τ on ∇W (δ(σ₁u) = N·v, δv = (I − vvᵀ)·Nᵀu/σ₁, which moves p through the softmax
    Jacobian J = diag p − ppᵀ), cov ŷ = τ²·(I/t² + (t/σ₁)²·J·K·J) with K = W(I − vvᵀ)Wᵀ, cov(p − ∇b) =
    τ²·(t/σ₁)²·JKJ + τ_b²·I, and the two share the JKJ term. τ is estimated from the SVD residual
    (‖G − G₁‖²/((C − 1)(d − 1))), τ_b from ∇b's component orthogonal to u. For each family (affine in its
    parameters, see :func:`_design`) the misfit χ²(t) = min_θ (obs − H·y(θ))ᵀ Σ⁻¹ (obs − H·y(θ)) is a
    generalised least squares in closed form; since Σ depends on t, the profile objective is −2·log-likelihood
    = χ²(t) + log det Σ_data(t), the covariance of the residuals in the data's own units (σ₁u − t·(p − y) and
    ∇b − (p − y); without it a fit drifts to where Σ is largest). t is profiled on a
    log grid over |t| ∈ σ₁·[0.5, 10⁴] on both signs, then Brent's method around the best local minima. All
    covariances are in units of τ², so the same code runs on clean gradients, where τ is float32 rounding."""

    def __init__(self, grad: torch.Tensor, grad_bias: torch.Tensor | None, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        G = grad.double()
        C, d = G.shape
        u, sv, vh = torch.linalg.svd(G, full_matrices=False)
        self.C, self.d = C, d
        self.s1, self.u, self.v = float(sv[0]), u[:, 0], vh[0]
        self.rms = float(G.pow(2).mean().sqrt())
        residual = float((sv[1:] ** 2).sum()) / max((C - 1) * (d - 1), 1)
        self.tau = max(residual ** 0.5, 1e-15 * self.rms, 1e-300)
        self.relative = self.tau / self.rms if self.rms > 0 else 0.0
        self.weight = weight.double()
        self.bias = None if bias is None else bias.double()
        self.grad_bias = None if grad_bias is None or bias is None else grad_bias.double()
        self.tau_b = 0.0
        if self.grad_bias is not None:
            perp = self.grad_bias - (self.grad_bias @ self.u) * self.u
            self.tau_b = max(float(perp.norm()) / max(C - 1, 1) ** 0.5, 1e-15 * float(self.grad_bias.norm()),
                             1e-300)
        wp = self.weight - (self.weight @ self.v)[:, None] * self.v[None, :]
        self.K = wp @ wp.T
        self.n_obs = C if self.grad_bias is None else 2 * C

    def dof(self, family: str) -> int:
        return max(self.n_obs - FAMILY_PARAMETERS[family] - 1, 1)

    def misfit(self, t: torch.Tensor, families: tuple[str, ...]) -> tuple[dict[str, Misfit], torch.Tensor]:
        """Each family's misfit at each t [S], and log det Σ_data(t) [S] (in units of τ²; the same for all families).

        The observations (ŷ, and p − ∇b with a bias) combine into one GLS estimate ȳ with precision P; then
        χ² = (ȳ − y)ᵀ P (ȳ − y) + the misfit between ŷ and p − ∇b themselves (the same for every family)."""
        C = self.C
        x = t[:, None] * self.v[None, :]
        z = x @ self.weight.T
        if self.bias is not None:
            z = z + self.bias
        p = torch.softmax(z, dim=1)
        yh = p - self.s1 * self.u[None, :] / t[:, None]
        J = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
        jkj = (t / self.s1)[:, None, None] ** 2 * (J @ self.K @ J)
        # obs = H·(y + ξ) + ζ with ξ ~ N(0, JKJ) shared by both views and ζ ~ N(0, diag(I/t², r·I)) their own:
        # their precision-weighted mean ȳ ~ N(y, JKJ + c·I), c = 1/(t² + 1/r), and what is left, ŷ − (p − ∇b),
        # does not depend on y. JKJ is positive semi-definite, so its eigenvalues are clipped at 0 (a saturated
        # softmax leaves it with rounding-size negative ones beside a huge one).
        if self.grad_bias is None:
            target, c = yh, 1.0 / t**2
            common = torch.zeros_like(t)
            extra = 2 * C * torch.log(t.abs())  # the data's units: ŷ − y = (residual of σ₁u)/t
        else:
            yb = p - self.grad_bias[None, :]
            r = (self.tau_b / self.tau) ** 2
            target = (t[:, None] ** 2 * yh + yb / r) / (t**2 + 1.0 / r)[:, None]
            c = 1.0 / (t**2 + 1.0 / r)
            common = ((yh - yb) ** 2).sum(1) / (1.0 / t**2 + r)
            extra = C * torch.log1p(r * t**2)
        evals, evecs = np.linalg.eigh(((jkj + jkj.transpose(1, 2)) / 2).numpy())
        w = torch.from_numpy(evals).clamp_min(0.0) + c[:, None]
        # whiten in the eigenbasis (sums of squares, no cancellation where w spans many decades)
        white = torch.from_numpy(evecs).transpose(1, 2) / w.sqrt()[:, :, None]  # [S, C, C]
        logdet = torch.log(w).sum(1) + extra
        order = torch.argsort(target, dim=1, descending=True)
        out = {}
        for family in families:
            a0, A = _design(order, C, family)
            w_a = white @ A  # [S, C, k]
            w_d = white @ (target - a0)[:, :, None]
            gram = w_a.transpose(1, 2) @ w_a
            theta = _solve(gram, w_a.transpose(1, 2) @ w_d)  # [S, k, 1]
            # the family's bounds: ε, r ∈ [0, 1]; mixup+smoothing: ε ∈ [0, 1], then a ∈ [0, 1 − ε]
            if family == "mixup+smoothing":
                eps = theta[:, 1:2].clamp(0.0, 1.0)
                a = (w_a[:, :, 0:1] * (w_d - w_a[:, :, 1:2] * eps)).sum(1, keepdim=True) / gram[:, 0:1, 0:1]
                theta = torch.cat([torch.minimum(a.clamp_min(0.0), 1.0 - eps), eps], dim=1)
            else:
                theta = theta.clamp(0.0, 1.0)
            chi2 = (((w_d - w_a @ theta) ** 2).sum((1, 2)) + common) / self.tau**2
            out[family] = Misfit(torch.nan_to_num(chi2, nan=1e300, posinf=1e300), a0 + (A @ theta)[:, :, 0],
                                 _inv(gram))
        return out, torch.nan_to_num(logdet, nan=1e300, posinf=1e300)

    def objective(self, t: float, family: str, dispersion: float = 1.0) -> float:
        """−2·log-likelihood up to a constant: χ²(t)/φ + log det Σ(t)."""
        fits, logdet = self.misfit(torch.tensor([t], dtype=torch.float64), (family,))
        return float(fits[family].chi2[0]) / dispersion + float(logdet[0])

    def grid(self, points: int) -> torch.Tensor:
        g = torch.logspace(math.log10(NOISE_RANGE[0]), math.log10(NOISE_RANGE[1]), points, dtype=torch.float64)
        return torch.cat([-g.flip(0), g]) * self.s1

    def at(self, t: float, family: str) -> Fit:
        fits, logdet = self.misfit(torch.tensor([t], dtype=torch.float64), (family,))
        m = fits[family]
        return Fit(family, t, float(m.chi2[0]), float(logdet[0]), m.label[0], self.dof(family), m.theta_cov[0])

    def fit(self, families: tuple[str, ...], points: int, iterations: int) -> list[Fit]:
        """The best local minima (up to NOISE_BASINS per family) of χ²(t) + log det Σ(t) on the grid (``points``
        per sign), each refined by Brent's method (at most ``iterations`` steps) between its grid neighbours. (All
        are refined: at low noise a well is far narrower than the grid's spacing, so grid values say little about
        how deep it is.)"""
        from scipy.optimize import minimize_scalar

        t = self.grid(points)
        with torch.no_grad():
            misfits, logdet = self.misfit(t, families)
        fits: list[Fit] = []
        for family in families:
            c = misfits[family].chi2 + logdet
            inner = torch.zeros_like(c, dtype=torch.bool)
            inner[1:-1] = (c[1:-1] <= c[:-2]) & (c[1:-1] <= c[2:])
            inner[points - 1:points + 1] = False  # the two signs meet here: not neighbours
            minima = torch.nonzero(inner).flatten()
            for i in minima[torch.argsort(c[minima])][:NOISE_BASINS].tolist():
                lo, hi = sorted((float(t[i - 1]), float(t[i + 1])))
                res = minimize_scalar(self.objective, bounds=(lo, hi), args=(family,), method="bounded",
                                      options={"xatol": 1e-10 * max(abs(lo), abs(hi)), "maxiter": iterations})
                fits.append(self.at(float(res.x) if float(res.fun) <= float(c[i]) else float(t[i]), family))
        return fits

    def label_covariance(self, fit: Fit, dispersion: float) -> torch.Tensor:
        """Covariance of the fitted label (delta method): t's profile variance 2/objective''(t) carried through the
        fitted label's slope, plus the parameters' covariance at fixed t (times the dispersion φ). Two batched
        evaluations: the second one's step is about one standard deviation of t."""
        t0 = fit.t
        h = abs(t0) * 1e-4
        var_t, slope = (abs(t0) * 1e-2) ** 2, torch.zeros_like(fit.label)
        for _ in range(2):
            misfits, logdet = self.misfit(torch.tensor([t0 - h, t0, t0 + h], dtype=torch.float64), (fit.family,))
            c = misfits[fit.family].chi2 / dispersion + logdet
            curvature = float(c[0] - 2 * c[1] + c[2]) / h**2
            if curvature > 0:
                var_t = 2.0 / curvature
            labels = misfits[fit.family].label
            slope = (labels[2] - labels[0]) / (2 * h)
            h = min(max(var_t**0.5, abs(t0) * 1e-12), abs(t0) * 1e-2)
        _, A = _design(torch.argsort(fit.label, descending=True)[None, :], self.C, fit.family)
        at_fixed_t = A[0] @ fit.theta_cov @ A[0].T
        cov: torch.Tensor = var_t * torch.outer(slope, slope) + dispersion * self.tau**2 * at_fixed_t
        return cov


@dataclass
class Choice:
    """The chosen fit, the dispersion φ, and each fit's score and weight (same order as the fits)."""

    best: int
    dispersion: float
    scores: list[float]
    weights: list[float]


def choose(fits: list[Fit], C: int) -> Choice:
    """The fit with the smallest χ²/φ + log det Σ + penalty (:func:`family_penalty`). φ = max(1, reduced χ² of the
    best fit of the richest family present) puts an under-estimated noise level right (a quasi-likelihood
    dispersion); the weights exp(−(score − best)/2), normalised, are Akaike-style weights over families and
    local minima."""
    richest = max(FAMILY_PARAMETERS[f.family] for f in fits)
    rich = min((f for f in fits if FAMILY_PARAMETERS[f.family] == richest), key=lambda f: f.chi2)
    dispersion = max(1.0, rich.chi2 / rich.dof)
    scores = [f.chi2 / dispersion + f.logdet + family_penalty(f.family, C) for f in fits]
    best = min(range(len(fits)), key=lambda i: scores[i])
    weights = torch.exp(-(torch.tensor(scores, dtype=torch.float64) - scores[best]) / 2)
    return Choice(best, dispersion, scores, (weights / weights.sum()).tolist())


def l1_bound(fits: list[Fit], weights: list[float], reported: torch.Tensor, cov: torch.Tensor,
             gen: torch.Generator) -> tuple[float, float]:
    """The 90 % quantile of ‖ŷ − y‖₁ and P(‖ŷ − y‖₁ ≤ 0.1) when the truth is drawn from the fits' mixture:
    a local minimum with its weight, then a Gaussian of the chosen fit's label covariance around its label."""
    evals, evecs = torch.linalg.eigh((cov + cov.T) / 2)
    root = evecs * evals.clamp_min(0.0).sqrt()[None, :]
    pick = torch.multinomial(torch.tensor(weights, dtype=torch.float64), CONFIDENCE_DRAWS, True, generator=gen)
    centres = torch.stack([f.label for f in fits])[pick]
    z = torch.randn(CONFIDENCE_DRAWS, len(reported), generator=gen, dtype=torch.float64)
    l1 = (centres + z @ root.T - reported[None, :]).abs().sum(1)
    return float(torch.quantile(l1, 0.9)), float((l1 <= LOW_CONFIDENCE_L1).double().mean())


def probe_prefers_mixup(fs: dict[str, PseudoLabel]) -> bool:
    """Order the two searches: one batched evaluation of both losses on a grid of λ; search first the objective
    whose grid minimum is clearly lower. (A smoothing label also zeroes the mixup loss, so only a clear gap
    points to mixup; the searches themselves are unchanged.)"""
    grid = torch.logspace(-1, 2.5, 400, dtype=torch.float64)
    lam = torch.cat([-grid, grid])
    with torch.no_grad():
        best = {k: float(torch.nan_to_num(f.loss(lam * COEFFICIENT[k]), nan=1e30).min()) for k, f in fs.items()}
    return best["mixup"] < 1e-3 * best["smoothing"]


def describe(label: torch.Tensor, augmentation: str) -> dict[str, Any]:
    """Implied ε (smoothing: off-target mass ε/C each) or the mixing pair and ratio (mixup)."""
    C = len(label)
    order = torch.argsort(label, descending=True)
    if augmentation == "smoothing":
        others = torch.cat([label[:order[0]], label[order[0] + 1:]])
        return {"class": int(order[0]), "epsilon": float(others.mean() * C)}
    return {"classes": [int(order[0]), int(order[1])], "ratio": float(label[order[0]])}


@register
class SoftLabel(Attack):
    name = "softlabel"
    paper = "Wang, Liang & He, Towards Eliminating Hard Label Constraints in Gradient Inversion Attacks, ICLR 2024"
    summary = "soft label (smoothing ε or mixup pair) and last-layer feature of one example via a scalar search"
    requires = Requirements(single_sample=True, needs_model=True)
    Options: ClassVar[type[AttackOptions]] = SoftLabelOptions
    options: SoftLabelOptions

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        grad = ctx.require_grad_weight().double().cpu()
        weight = ctx.layer.weight.double().cpu()
        bias = ctx.layer.bias.double().cpu() if ctx.layer.bias is not None else None
        g = row_sums(grad)
        C = ctx.num_classes
        warnings: list[str] = []
        if float(g.abs().max()) == 0.0:
            label = ctx.predicted_class()
            if label is None:
                raise GleakError("zero gradient and no model forward: the label cannot be recovered")
            soft = torch.nn.functional.one_hot(torch.tensor(label), C).double()
            warnings.append("zero gradient: the model already predicts this example with probability 1; "
                            "returned its prediction as a one-hot label")
            return LabelOutput(_counts(soft), soft, {"case": "zero gradient"}, warnings)
        nonzero = (g.abs() > 1e-9 * float(g.abs().max())).nonzero().flatten()
        if len(nonzero) == 2 and abs(float(g[nonzero].sum())) <= 1e-6 * float(g.abs().max()):
            warnings.append(f"ambiguous (App. B.3): only classes {nonzero.tolist()} have non-zero gradients with "
                            "opposite sums; the one-hot label may be either")
        row = int(torch.argmax(g.abs()))
        kinds = ["smoothing", "mixup"] if self.options.augmentation == "auto" else [self.options.augmentation]
        # With non-negative features x = λ·∇W[r] forces sign(λ) = sign(g_r): search that side first.
        first = 1.0 if float(g[row]) > 0 else -1.0
        grad_bias = ctx.grad_bias.double().cpu() if ctx.grad_bias is not None else None
        noise = NoisyFit(grad, grad_bias, weight, bias)
        noisy = noise.relative > NOISY
        fs = {kind: PseudoLabel(grad, weight, bias, row, kind) for kind in kinds}
        results: list[Search] = []
        if not noisy:  # a noisy gradient has no exact zero: straight to the noise-aware fit
            if len(fs) == 2 and probe_prefers_mixup(fs):
                fs = {"mixup": fs["mixup"], "smoothing": fs["smoothing"]}
            results = search(fs, ctx.seed, first, self.options)
        exact = [r for r in results if r.exact]
        if exact:
            chosen = exact[0]
            f = fs[chosen.augmentation]
            with torch.no_grad():
                soft = f.labels(torch.tensor([chosen.s], dtype=torch.float64))[0]
            if chosen.augmentation == "mixup" and "smoothing" in kinds:
                rest = torch.sort(soft, descending=True).values[1:]
                if 1000 * float(rest.var(unbiased=False)) < THRESHOLD:  # the mixup search found a smoothing label
                    chosen = Search("smoothing", chosen.s * COEFFICIENT["smoothing"] / COEFFICIENT["mixup"],
                                    chosen.loss, chosen.stage, True)
                    f = PseudoLabel(grad, weight, bias, row, "smoothing")
            s, loss, stage, augmentation = chosen.s, chosen.loss, chosen.stage, chosen.augmentation
            # the exact label, with the local noise model of its family (the reference's mixup family for mixup)
            t = s * float(f.r @ noise.v)
            fit = replace(noise.at(t, "smoothing" if augmentation == "smoothing" else "mixup+smoothing"), label=soft)
            fits, choice = [fit], Choice(0, max(1.0, fit.chi2 / fit.dof), [fit.chi2], [1.0])
            why = f"exact zero of the {augmentation} loss (L = {loss:.2g} < {CONFIRM:g})"
            if "extended" in stage:
                warnings.append(f"found beyond the reference's search range (s = {s:.4g}, reference bound "
                                f"±{BOUND:g}) by gleak's extended swarm")
        else:
            fits = noise.fit(FAMILIES[self.options.augmentation], self.options.noise_particles,
                             self.options.noise_iterations)
            choice = choose(fits, C)
            fit = fits[choice.best]
            soft, augmentation = fit.label, FAMILY_AUGMENTATION[fit.family]
            f = fs[augmentation]
            s = fit.t / (float(f.r @ noise.v) or 1e-300)  # x = t·v = s·∇W₁[r]/coe
            with torch.no_grad():
                loss = float(f.loss(torch.tensor([s], dtype=torch.float64))[0])
            stage = "noise fit (GLS misfit: log grid, then Brent)"
            why = "smallest score χ²/φ + log det Σ + penalty: " + "; ".join(
                f"{x.family} {x.chi2:.3g}/{choice.dispersion:.3g} + {x.logdet:.3g} + {family_penalty(x.family, C):.3g}"
                for x in _best_per_family(fits))
            if noisy:
                warnings.append(f"noisy gradient (rank-one residual {noise.relative:.2g} × RMS of ∇W): no exact "
                                f"solution exists; fitted the {fit.family} label by noise-weighted least squares")
            else:
                warnings.append(f"the loss search found no exact zero (best loss {min(r.loss for r in results):.3g}); "
                                "the label is the noise-aware fit's")
        cov = noise.label_covariance(fit, choice.dispersion)
        bound, p_close = l1_bound(fits, choice.weights, soft, cov, self.rng(ctx))
        by_augmentation = {a: sum(w for x, w in zip(fits, choice.weights, strict=True)
                                  if FAMILY_AUGMENTATION[x.family] == a) for a in ("smoothing", "mixup")}
        confidence = max(0.0, 1.0 - bound / 2)
        if bound > LOW_CONFIDENCE_L1:
            warnings.append(f"low confidence {confidence:.3f}: under the estimated noise the soft label may be off by "
                            f"up to L1 = {bound:.2g} (90 % bound; P(L1 ≤ {LOW_CONFIDENCE_L1:g}) ≈ {p_close:.2f})")
            if not exact and not noisy:
                warnings.append(f"searched |s| ≤ {EXTENDED_BOUND:g} (λ = s/{COEFFICIENT[augmentation]:g}) exactly; a "
                                "trained model's true λ can lie beyond (Wang, Liang & He, ICLR 2024, App. B.2)")
        if by_augmentation[augmentation] < LOW_AUGMENTATION:
            warnings.append(f"uncertain augmentation: {augmentation} has weight {by_augmentation[augmentation]:.2f} "
                            f"(smoothing {by_augmentation['smoothing']:.2f}, mixup {by_augmentation['mixup']:.2f})")
        if not exact and fit.chi2 / fit.dof > POOR_FIT:
            warnings.append(f"the {fit.family} label fits the gradient only to χ²/dof = {fit.chi2 / fit.dof:.3g}: the "
                            "noise may not be Gaussian, or the label neither smoothing nor mixup")
        diagnostics = {
            "augmentation": augmentation, "family": fit.family if not exact else augmentation, "stage": stage,
            "loss": loss, "exact": bool(exact), "s": s, "lambda": s / COEFFICIENT[augmentation], "row": row,
            "feature": s * f.r, **describe(soft, augmentation),
            "confidence": confidence, "l1_error_bound": bound, "p_l1_le_0.1": p_close,
            "augmentation_confidence": by_augmentation[augmentation], "augmentation_weights": by_augmentation,
            "choice": why, "noise": {"relative": noise.relative, "detected": noisy, "dispersion": choice.dispersion},
            "fits": [{"family": x.family, "t": x.t, "chi2": x.chi2, "dof": x.dof, "score": sc, "weight": w}
                     for x, sc, w in zip(fits, choice.scores, choice.weights, strict=True)],
            "searched": {r.augmentation: {"loss": r.loss, "stage": r.stage, "exact": r.exact} for r in results},
        }
        if not exact and fit.family == "mixup+smoothing":  # the common off-target mass of smoothed mixup labels
            diagnostics["epsilon"] = float(torch.sort(soft).values[:-2].mean()) * C
        return LabelOutput(_counts(soft), soft, diagnostics, warnings)


def _best_per_family(fits: list[Fit]) -> list[Fit]:
    best: dict[str, Fit] = {}
    for x in fits:
        if x.family not in best or x.chi2 < best[x.family].chi2:
            best[x.family] = x
    return list(best.values())


def _counts(soft: torch.Tensor) -> torch.Tensor:
    counts = torch.zeros(len(soft), dtype=torch.long)
    counts[int(torch.argmax(soft))] = 1
    return counts
