"""Per-example last-layer quantities from a batch's last-layer gradient: the maths fgla and rgla share.

Notation (mean-reduced cross-entropy, PyTorch layout): logits Ŷ = F·Wᵀ + 1·bᵀ ∈ R^{B×C} from features
F ∈ R^{B×H}; D = ∂ℓ/∂Ŷ = (softmax(Ŷ) − T)/B for targets T; then ∇W = Dᵀ·F and ∇b = Dᵀ·1.

* the RGLA paper (anonymous ICLR 2024 submission), Prop. 1: ∇W·Wᵀ = Dᵀ·(Ŷ − 1·bᵀ), C×C equations in Ŷ;
  Eq. 3: ∇b = Dᵀ·1, C more;
  Prop. 2: ℓ ≈ −(1/B)·Σ_i ln(∇b_{y_i} + λ_{y_i}/B) (λ_c: how many labels are c), which singles out the true
  outputs among the "twin" solutions of the first two;
  Eq. 5: F = pinv(Dᵀ)·∇W once D is known (exact when D has full row rank, B ≤ C − 1: D's rows sum to zero, so
  its rank is at most C − 1).
* Xue et al. (FGLA, INFOCOM 2023): f_i = (∇W[y_i] − o_W)/(∇b[y_i] − o_b), the offsets o being the mean of the
  rows of classes absent from the batch times (B − 1)/B (their reference code).

Notes and the reference code's deviations: docs/methods/generative.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gleak.errors import GleakError


def loss_gradient(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """D = ∂ℓ/∂Ŷ of the mean cross-entropy: (softmax(Ŷ) − T)/B, differentiable in Ŷ."""
    return (torch.softmax(logits, dim=1) - targets) / logits.shape[0]


def batch_loss_estimate(grad_bias: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[float | None, int]:
    """Prop. 2's estimate of the batch's mean cross-entropy from ∇b and the hard labels, and how many of the B
    terms entered it. A term whose argument ∇b_y + λ_y/B is not positive has no logarithm; like the authors'
    code, such terms are left out and the mean is over the rest (None when none is left)."""
    B = len(labels)
    counts = torch.bincount(labels, minlength=num_classes).double()
    args = grad_bias.double()[labels] + counts[labels] / B
    kept = args > 0
    if not bool(kept.any()):
        return None, 0
    return float(-(args[kept].log()).mean()), int(kept.sum())


def features_from_outputs(grad_weight: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Eq. 5: F = pinv(Dᵀ)·∇W, the least-squares (minimum-norm) features [B, H] given D [B, C]."""
    features: torch.Tensor = torch.linalg.pinv(d.double().T) @ grad_weight.double()
    return features


def fgla_features(grad_weight: torch.Tensor, grad_bias: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """FGLA's per-label features [B, H]: (∇W[y_i] − o_W)/(∇b[y_i] − o_b); examples sharing a label get the same
    row (the method cannot tell them apart). Rows whose denominator vanishes come out as zeros (as in the
    reference code, which maps NaN and Inf to 0)."""
    gw, gb = grad_weight.double(), grad_bias.double()
    C, B = gb.shape[0], len(labels)
    absent = torch.ones(C, dtype=torch.bool)
    absent[torch.unique(labels)] = False
    if bool(absent.any()):
        o_w, o_b = gw[absent].mean(0) * (B - 1) / B, gb[absent].mean() * (B - 1) / B
    else:  # every class present: no row shows the others' contribution alone
        o_w, o_b = torch.zeros_like(gw[0]), gb.new_zeros(())
    num, den = gw[labels] - o_w, (gb[labels] - o_b).unsqueeze(1)
    out = num / den
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))


@dataclass
class Candidate:
    """One start's end point: recovered outputs, its exact-equation residual and its Prop. 2 misfit."""

    start: str
    logits: torch.Tensor
    residual: float  # Σ of squared normalised residuals of Prop. 1 and Eq. 3 (0 for an exact solution)
    loss_gap: float | None  # |ℓ(Ŷ′) − ℓ̂| (Prop. 2), None without an estimate
    evaluations: int


@dataclass
class OutputFit:
    """The chosen outputs Ŷ′ [B, C] (rows in the order of the targets), D′, and every candidate tried."""

    logits: torch.Tensor
    d: torch.Tensor
    chosen: Candidate
    candidates: list[Candidate]
    loss_estimate: float | None
    exact: bool

    @property
    def evaluations(self) -> int:
        return sum(c.evaluations for c in self.candidates)


EXACT = 1e-10  # a candidate whose squared normalised residual is below this solves Prop. 1 and Eq. 3
LSMR_STEPS = 200  # inner iterations of the matrix-free solver per step (each one forward and one backward pass)
DENSE_LIMIT = 1_000_000  # Jacobian entries up to which the solver runs on a dense Jacobian
POLISH_STEPS = 20  # matrix-free fits: evaluations allowed once the residual is below POLISH_BELOW
POLISH_BELOW = EXACT  # (see least_squares_fit)


class OutputSystem:
    """The equations Ŷ′ must satisfy, as a residual vector (the RGLA paper, anonymous ICLR 2024 submission,
    Prop. 1, Eq. 3, Prop. 2).

    r = [vec(∇W·Wᵀ − D′ᵀ(Ŷ′ − 1bᵀ))/‖∇W·Wᵀ‖, (∇b − D′ᵀ1)/‖∇b‖, w·(ℓ(Ŷ′) − ℓ̂)]: the first two blocks are exact
    for the true outputs, the third only approximately (Prop. 2). Each block is scaled by its own size so that
    the fit does not depend on the gradient's magnitude. D′ is the closed form of ∂ℓ/∂Ŷ′, so every block is
    differentiated through it, as the paper states (the authors' code reads D from ``.grad`` and gives L_b no
    gradient)."""

    def __init__(self, grad_weight: torch.Tensor, grad_bias: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 targets: torch.Tensor, loss_estimate: float | None) -> None:
        self.m = grad_weight.double() @ weight.double().T  # ∇W·Wᵀ, C×C, computed once
        self.gb = grad_bias.double()
        self.b = bias.double()
        self.t = targets.double()
        self.loss_estimate = loss_estimate
        self.sw = float(self.m.norm()) or 1.0
        self.sb = float(self.gb.norm()) or 1.0
        self.shape = (targets.shape[0], targets.shape[1])

    def residual(self, flat: torch.Tensor, loss_weight: float) -> torch.Tensor:
        y = flat.view(self.shape)
        d = loss_gradient(y, self.t)
        parts = [((self.m - d.T @ (y - self.b)) / self.sw).flatten(), (self.gb - d.sum(0)) / self.sb]
        if loss_weight and self.loss_estimate is not None:
            ce = -(self.t * torch.log_softmax(y, dim=1)).sum(1).mean()
            parts.append((loss_weight * (ce - self.loss_estimate)).view(1))
        return torch.cat(parts)

    def jacobian(self, flat: torch.Tensor, loss_weight: float) -> torch.Tensor:
        """∂r/∂vec(Ŷ′) in closed form (rows as :meth:`residual`, columns example-major). With S_i = ∂d_i/∂ŷ_i
        = (diag(p_i) − p_i p_iᵀ)/B and z_i = ŷ_i − b: ∂(Dᵀ Z)[a, c]/∂ŷ_ik = S_i[a, k]·z_ic + d_ia·[c = k];
        ∂(Dᵀ1)[a]/∂ŷ_ik = S_i[a, k]; ∂ℓ/∂ŷ_ik = d_ik. About 50× faster than forward-mode autodiff at C = 10."""
        y = flat.view(self.shape)
        B, C = self.shape
        p = torch.softmax(y, dim=1)
        d = (p - self.t) / B
        s = (torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)) / B  # [B, C, C]
        z = y - self.b
        eye = torch.eye(C, dtype=y.dtype)
        jw = torch.einsum("iak,ic->acik", s, z) + torch.einsum("ia,ck->acik", d, eye)
        parts = [-jw.reshape(C * C, B * C) / self.sw, -s.permute(1, 0, 2).reshape(C, B * C) / self.sb]
        if loss_weight and self.loss_estimate is not None:
            parts.append(loss_weight * d.reshape(1, B * C))
        return torch.cat(parts)

    def exact_residual(self, y: torch.Tensor) -> float:
        with torch.no_grad():
            return float(self.residual(y.flatten().double(), 0.0).pow(2).sum())

    def loss_gap(self, y: torch.Tensor) -> float | None:
        if self.loss_estimate is None:
            return None
        with torch.no_grad():
            ce = -(self.t * torch.log_softmax(y.double(), dim=1)).sum(1).mean()
        return abs(float(ce) - self.loss_estimate)

    def paper_objective(self, y: torch.Tensor, alphas: tuple[float, float, float]) -> torch.Tensor:
        """α1·L_w + α2·L_b + α3·L_loss exactly as Eq. 7 writes it (unscaled), for the paper's Adam solver."""
        d = loss_gradient(y, self.t)
        total = alphas[0] * (self.m - d.T @ (y - self.b)).pow(2).sum() + alphas[1] * (self.gb - d.sum(0)).pow(2).sum()
        if self.loss_estimate is not None:
            ce = -(self.t * torch.log_softmax(y, dim=1)).sum(1).mean()
            total = total + alphas[2] * (ce - self.loss_estimate).pow(2)
        return total


class _Polished(Exception):
    """Raised from inside the solver's residual function to end a fit that is already exact."""


def least_squares_fit(system: OutputSystem, start: torch.Tensor, loss_weight: float,
                      max_evaluations: int) -> tuple[torch.Tensor, int]:
    """Levenberg–Marquardt (scipy, MINPACK) on the residual vector, float64, with the closed-form dense Jacobian
    when it fits in :data:`DENSE_LIMIT` entries; else scipy's trust-region solver with a matrix-free Jacobian
    (forward- and reverse-mode products, LSMR).

    A matrix-free fit on the exact equations (``loss_weight`` 0) ends :data:`POLISH_STEPS` evaluations after the
    squared residual first falls below :data:`POLISH_BELOW` (the exactness threshold), keeping the best point:
    each of its evaluations costs up to :data:`LSMR_STEPS` forward and backward passes, and an ill-conditioned
    system (an untrained model's similar features, or several examples of one class) otherwise crawls on
    towards the rounding level for hundreds of them (C = 100, B = 32: 88 evaluations and 145 s with the rule;
    with a threshold of 1e-13 instead, still running after 7 min). Dense fits run to
    convergence: there the last digits are cheap and improve the logits measurably (bench/rgla.py)."""
    import numpy as np
    from scipy.optimize import least_squares
    from scipy.sparse.linalg import LinearOperator

    best: dict[str, Any] = {"cost": math.inf, "x": None, "below": 0, "calls": 0}

    def f(v: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            r = system.residual(torch.from_numpy(v), loss_weight).numpy()
        best["calls"] += 1
        cost = float(np.dot(r, r))
        if matrix_free and not loss_weight and cost < POLISH_BELOW:
            if cost < best["cost"]:
                best.update(cost=cost, x=v.copy())
            best["below"] += 1
            if best["below"] > POLISH_STEPS:
                raise _Polished
        return r

    x0 = start.detach().double().flatten().numpy().copy()
    n = x0.size
    with torch.no_grad():
        rows = system.residual(torch.from_numpy(x0), loss_weight).numel()
    matrix_free = rows * n > DENSE_LIMIT
    tol = dict(xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=max_evaluations)
    try:
        if not matrix_free:
            def jac(v: np.ndarray) -> np.ndarray:
                return system.jacobian(torch.from_numpy(v), loss_weight).numpy()

            method = "lm" if rows >= n else "trf"
            x = least_squares(f, x0, jac=jac, method=method, **tol).x
        else:
            def jac_op(v: np.ndarray, *_: object) -> LinearOperator:
                point = torch.from_numpy(v.copy())

                def fun(t: torch.Tensor) -> torch.Tensor:
                    return system.residual(t, loss_weight)

                def mv(u: np.ndarray) -> np.ndarray:
                    step = torch.from_numpy(np.ascontiguousarray(u).ravel())
                    jv: np.ndarray = torch.func.jvp(fun, (point,), (step,))[1].numpy()
                    return jv

                pull = torch.func.vjp(fun, point)[1]

                def rmv(u: np.ndarray) -> np.ndarray:
                    vj: np.ndarray = pull(torch.from_numpy(np.ascontiguousarray(u).ravel()))[0].numpy()
                    return vj

                return LinearOperator((rows, n), matvec=mv, rmatvec=rmv, dtype=np.float64)

            x = least_squares(f, x0, jac=jac_op, method="trf", tr_solver="lsmr", tr_options={"maxiter": LSMR_STEPS},
                              **tol).x
    except _Polished:
        x = best["x"]
    if best["x"] is not None and system.exact_residual(torch.from_numpy(x)) > best["cost"]:
        x = best["x"]  # the solver's end point is never worse than the best exact point it passed
    return torch.from_numpy(x).view(system.shape), int(best["calls"])


Progress = Callable[[int, int, int, float], None]  # (restart, step, steps, loss)


def fit_outputs(system: OutputSystem, starts: list[tuple[str, torch.Tensor]], *, max_evaluations: int,
                loss_weight: float = 1.0, stop_when_exact: bool = True,
                progress: Progress | None = None) -> OutputFit:
    """Recover Ŷ′ from each start in two stages and choose among the end points.

    1. With Prop. 2 (weight ``loss_weight``): pulls the fit towards the true outputs and away from the "twin"
       solutions of Prop. 1 and Eq. 3 (RGLA paper, §4.2). Skipped for a start named ``"fgla"`` (already near).
    2. Without it: Prop. 2 is only approximate (its error grows with the model's accuracy, the RGLA paper,
       Table 5), so the end point is polished on the exact equations alone.

    With ``stop_when_exact`` the later starts run only while no end point solves the exact equations.
    Chosen: among the end points that solve the exact equations (squared normalised residual < :data:`EXACT`),
    the one whose loss is nearest Prop. 2's estimate (the earlier start on ties); when none does, the smallest
    residual."""
    candidates: list[Candidate] = []
    for k, (name, start) in enumerate(starts):
        if stop_when_exact and any(c.residual < EXACT for c in candidates):
            break  # an exact solution is in hand; the remaining starts are fallbacks
        used = 0
        y = start.double()
        if name != "fgla" and loss_weight and system.loss_estimate is not None:
            y, used = least_squares_fit(system, y, loss_weight, max_evaluations)
        y, more = least_squares_fit(system, y, 0.0, max_evaluations)
        cand = Candidate(name, y, system.exact_residual(y), system.loss_gap(y), used + more)
        candidates.append(cand)
        if progress is not None:
            progress(0, k + 1, len(starts), cand.residual)
    return choose(system, candidates)


def choose(system: OutputSystem, candidates: list[Candidate]) -> OutputFit:
    finite = [c for c in candidates if math.isfinite(c.residual) and bool(torch.isfinite(c.logits).all())]
    if not finite:
        raise GleakError("the output recovery diverged from every start (non-finite residual)")
    exact = [c for c in finite if c.residual < EXACT]
    if exact:
        best = min(exact, key=lambda c: c.loss_gap if c.loss_gap is not None else 0.0)
    else:
        best = min(finite, key=lambda c: c.residual)
    return OutputFit(best.logits, loss_gradient(best.logits, system.t), best, candidates, system.loss_estimate,
                     bool(exact))


def adam_fit(system: OutputSystem, start: torch.Tensor, *, alphas: tuple[float, float, float], lr: float,
             iterations: int, progress: Progress | None = None) -> Candidate:
    """The paper's solver: Adam on Eq. 7 as written (α = 10⁴, 1, 100; lr 10⁻³; 20,000 steps)."""
    y = start.double().clone().requires_grad_(True)
    opt = torch.optim.Adam([y], lr=lr)
    for it in range(iterations):
        opt.zero_grad(set_to_none=True)
        loss = system.paper_objective(y, alphas)
        torch.autograd.backward(loss)  # loss.backward(), typed
        opt.step()
        if progress is not None and (it % 100 == 0 or it == iterations - 1):
            progress(0, it + 1, iterations, float(loss.detach()))
    out = y.detach()
    return Candidate("randn", out, system.exact_residual(out), system.loss_gap(out), iterations)
