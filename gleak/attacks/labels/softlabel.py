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
(the reference code uses an oracle on the true s). For noisy gradients (§5.2) two more: every search runs
on the rank-1 projection of ∇W (`rank_one`; a no-op, to rounding, on a clean single-example gradient),
and when nothing reaches the threshold the returned candidate, marked inexact, is the global minimum of
‖x(s)‖²·L(s) (`PseudoLabel.noise_loss`) over the reference's PSO range — the reference's `pso_noise`
takes the minimum of L itself over |s| ≤ 10, a window its Table 5 needs because noise drags L's minimum
toward large |s|.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
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
# the reference's `pso_noise` (its DP experiment): fewer particles, global minimum, no threshold. The reference
# searches |s| ≤ 10 with coefficient 1 (its Table 5 runs), i.e. |λ| ≤ 10; gleak searches the weighted loss
# (PseudoLabel.noise_loss) over the whole reference PSO range |s| < 70 instead (see `search`).
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
    noise_particles: int = Field(NOISE_PARTICLES, ge=1, le=100_000, description="particles per swarm of the "
                                 "noisy-gradient fallback (global minimum of ‖x‖²·L)")
    noise_iterations: int = Field(NOISE_ITERS, ge=1, le=100_000, description="iterations per swarm of the "
                                  "noisy-gradient fallback")


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
    return sv[0] * torch.outer(u[:, 0], vh[0])


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
        i.i.d. Gaussian gradient noise. It vanishes exactly where L does (s ≠ 0)."""
        return (s * self.r.norm()) ** 2 * self.loss(s)


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
                value.backward()
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
            opt.step(closure)
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
               particles: int = PSO_PARTICLES, iters: int = PSO_ITERS,
               label: str = "pso", weighted: bool = False) -> tuple[float, float, str, bool]:
    """Particle swarms over the widening intervals; the first swarm below the threshold wins, else the lowest.

    ``weighted`` ranks the intervals by ``PseudoLabel.noise_loss`` (the noisy-gradient fallback) and still
    reports the plain L(s) of the winner."""
    best = (float("nan"), float("inf"), "pso: no interval", False)
    best_key = float("inf")
    extended = intervals is not None and label == "pso"
    bound = EXTENDED_BOUND if extended else BOUND
    for k, (low, high) in enumerate(intervals or pso_intervals(PSO_INTERVAL_BOUND[augmentation])):
        with _quiet_pyswarms(seed + k):
            from pyswarms.single import GlobalBestPSO

            opt = GlobalBestPSO(n_particles=particles, dimensions=1, options={"c1": 0.5, "c2": 0.5, "w": 0.8},
                                bounds=(np.array([low]), np.array([high])), bh_strategy="nearest")

            def objective(positions: np.ndarray) -> np.ndarray:
                with torch.no_grad():
                    t = torch.from_numpy(positions[:, 0])
                    values = f.noise_loss(t) if weighted else f.loss(t)
                return torch.nan_to_num(values, nan=1e30, posinf=1e30).numpy()

            cost, pos = opt.optimize(objective, iters=iters, verbose=False)
        name = f"{label}{' extended' if extended else ''} [{low:g}, {high:g}]"
        key = float(cost)
        if weighted:  # rank the intervals by the weighted loss, report the plain L(s)
            with torch.no_grad():
                cost = float(f.loss(torch.tensor([float(pos[0])], dtype=torch.float64))[0])
        if cost < THRESHOLD and confirm(f, float(pos[0]), float(cost), bound)[2]:
            return float(pos[0]), float(cost), name, True
        if key < best_key:
            best, best_key = (float(pos[0]), float(cost), name, False), key
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
        value.backward()
        return value

    try:
        opt.step(closure)
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
    """L-BFGS for every objective first (cheap), then swarms for each objective only if none was exact, then
    (noisy gradients) the reference's pso_noise global minimum. ``fs`` is in search order; ``options`` sets the
    step, particle and iteration counts (default: :class:`SoftLabelOptions`' defaults).

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
    # nothing exact (noisy gradients, §5.2): as the reference's pso_noise, a global minimum, here of the
    # noise-weighted loss ‖x(s)‖²·L(s) over the reference's PSO range. The earlier stages' candidates are
    # dropped: they minimise the unweighted L, whose minimum noise drags outward.
    for kind, f in fs.items():
        ps, ploss, pstage, _ = pso_search(f, kind, seed, pso_intervals(PSO_INTERVAL_BOUND[kind]), o.noise_particles,
                                          o.noise_iterations, "pso_noise", weighted=True)
        results[kind] = Search(kind, ps, ploss, pstage + " (global minimum of ‖x‖²·L)", False)
    return list(results.values())


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
        fs = {kind: PseudoLabel(grad, weight, bias, row, kind) for kind in kinds}
        if len(fs) == 2 and probe_prefers_mixup(fs):
            fs = {"mixup": fs["mixup"], "smoothing": fs["smoothing"]}
        results = search(fs, ctx.seed, first, self.options)
        exact = [r for r in results if r.exact]
        chosen = exact[0] if exact else min(results, key=lambda r: r.loss)
        f = PseudoLabel(grad, weight, bias, row, chosen.augmentation)
        with torch.no_grad():
            soft = f.labels(torch.tensor([chosen.s], dtype=torch.float64))[0]
        if chosen.augmentation == "mixup" and "smoothing" in kinds and chosen.exact:
            rest = torch.sort(soft, descending=True).values[1:]
            if 1000 * float(rest.var(unbiased=False)) < THRESHOLD:  # the mixup search found a smoothing label
                chosen = Search("smoothing", chosen.s * COEFFICIENT["smoothing"] / COEFFICIENT["mixup"], chosen.loss,
                                chosen.stage, True)
                f = PseudoLabel(grad, weight, bias, row, "smoothing")
        feature = chosen.s * f.r
        if not chosen.exact:
            warnings.append(f"no exact solution (best loss {chosen.loss:.3g} ≥ {THRESHOLD:g}, {chosen.stage}); "
                            "returned the best candidate — expected with noisy gradients")
        if not chosen.exact:
            warnings.append(f"searched |s| ≤ {EXTENDED_BOUND:g} (λ = s/{COEFFICIENT[chosen.augmentation]:g}); a "
                            "trained model's true λ can lie beyond (Wang, Liang & He, ICLR 2024, App. B.2)")
        elif "extended" in chosen.stage:
            warnings.append(f"found beyond the reference's search range (s = {chosen.s:.4g}, reference bound "
                            f"±{BOUND:g}) by gleak's extended swarm")
        diagnostics = {
            "augmentation": chosen.augmentation, "stage": chosen.stage, "loss": chosen.loss, "exact": chosen.exact,
            "s": chosen.s, "lambda": chosen.s / COEFFICIENT[chosen.augmentation], "row": row,
            "feature": feature, **describe(soft, chosen.augmentation),
            "searched": {r.augmentation: {"loss": r.loss, "stage": r.stage, "exact": r.exact} for r in results},
        }
        return LabelOutput(_counts(soft), soft, diagnostics, warnings)


def _counts(soft: torch.Tensor) -> torch.Tensor:
    counts = torch.zeros(len(soft), dtype=torch.long)
    counts[int(torch.argmax(soft))] = 1
    return counts
