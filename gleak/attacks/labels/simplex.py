"""Least squares on the probability simplex: min ‖Az − u‖² subject to z ≥ 0 and Σz = 1.

RLU (Chen & Vikalo, ICML 2024, Eq. 10) reads label proportions this way. The problem is a small convex
quadratic programme (one variable per class), solved here exactly by a primal active-set method in the style
of Lawson & Hanson's non-negative least squares (Solving Least Squares Problems, 1974, ch. 23), with the sum
constraint kept in every subproblem:

* the *free* set F holds the classes allowed to be positive; on F the equality-constrained least-squares
  problem min ‖A_F z_F − u‖² s.t. Σ z_F = 1 is solved in closed form (its KKT system, by least squares so
  that a rank-deficient A_F still gives the minimum-norm solution);
* if that solution has a negative entry, the method moves from the current feasible point towards it until
  the first entry reaches zero, and drops that class from F;
* otherwise it checks the multipliers of the fixed classes (∂/∂z_j of the objective, less the sum
  constraint's multiplier): a negative one means that z_j > 0 lowers the objective, and the most negative
  joins F. None negative: the KKT conditions hold and z is optimal.

Written out (rather than calling scipy's SLSQP) because importing scipy.optimize costs about half a second of
every CLI run; tests compare it with SLSQP.
"""

from __future__ import annotations

import numpy as np
import torch

TOLERANCE = 1e-12  # relative: multipliers and entries within this of zero count as zero
LU_MIN_FREE = 64  # up to this many free classes the KKT system is solved by least squares (SVD), as always


def simplex_least_squares(A: np.ndarray, u: np.ndarray, max_iterations: int | None = None) -> np.ndarray:
    """The z on the probability simplex that minimises ‖Az − u‖² (A: [M, C], u: [M]), float64."""
    A = np.asarray(A, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    C = A.shape[1]
    if C == 0:
        return np.zeros(0)
    large = C > LU_MIN_FREE  # thousands of classes: torch's BLAS, much faster here than numpy's for these sizes
    if large:  # no scaled or absolute copy of a [rows, C] A: G and h carry the scale (ties and tolerances alike)
        scale = max(float(A.max(initial=0.0)), -float(A.min(initial=0.0)), float(np.abs(u).max(initial=0.0)),
                    1e-300)
        G, h = _gram(A) / scale**2, (A.T @ u) / scale**2
        start = int(np.argmin(G.diagonal() - 2 * h))
    else:
        scale = max(float(np.abs(A).max(initial=0.0)), float(np.abs(u).max(initial=0.0)), 1e-300)
        A, u = A / scale, u / scale  # the minimiser does not change; tolerances become relative
        G, h = A.T @ A, A.T @ u  # objective ½‖Az − u‖² has gradient Gz − h
        # start at the best vertex (one class takes everything): feasible, and often close
        start = int(np.argmin(np.einsum("ij,ij->j", A, A) - 2 * (A.T @ u)))
    z = np.zeros(C)
    z[start] = 1.0
    free = np.zeros(C, dtype=bool)
    free[start] = True
    limit = max_iterations or 10 * C + 50
    for _ in range(limit):
        target = _on_free_set(G, h, free)
        if np.all(target[free] > -TOLERANCE):
            z = np.where(free, np.clip(target, 0.0, None), 0.0)
            z /= z.sum()
            gradient = (_matvec(G, z) if large else G @ z) - h
            multiplier = float(gradient[free].mean())  # equal on F at the optimum of the subproblem
            reduced = gradient - multiplier
            reduced[free] = np.inf
            j = int(np.argmin(reduced))
            if reduced[j] >= -TOLERANCE * max(1.0, float(np.abs(gradient).max())):
                return z
            free[j] = True
            continue
        # step from z towards target until the first free entry that would turn negative reaches zero
        falling = free & (target < z) & (target <= TOLERANCE)
        steps = np.where(falling, z / np.maximum(z - target, 1e-300), np.inf)
        alpha = float(min(1.0, steps.min()))
        z = np.where(free, z + alpha * (target - z), 0.0)
        free &= z > TOLERANCE
        if not free.any():  # cannot happen in exact arithmetic; keep the best vertex
            free[int(np.argmax(z))] = True
        z = np.where(free, np.clip(z, 0.0, None), 0.0)
        z /= z.sum()
    return z  # the iteration limit: the last feasible point


def _on_free_set(G: np.ndarray, h: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Minimiser of ½zᵀGz − hᵀz over z with z_j = 0 off ``free`` and Σz = 1 (KKT system, least squares)."""
    index = np.flatnonzero(free)
    k = len(index)
    kkt = np.zeros((k + 1, k + 1))
    kkt[:k, :k] = G[np.ix_(index, index)]
    kkt[:k, k] = kkt[k, :k] = 1.0
    rhs = np.append(h[index], 1.0)
    if k <= LU_MIN_FREE:
        solution = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    else:  # large free sets (C in the thousands): LU in torch, least squares only when it is singular
        kt, rt = torch.from_numpy(kkt), torch.from_numpy(rhs)
        lu = torch.linalg.solve_ex(kt, rt)
        x = lu.result
        if int(lu.info) != 0 or not bool(torch.isfinite(x).all()):
            x = torch.linalg.lstsq(kt, rt[:, None], driver="gelsd").solution[:, 0]
        solution = x.numpy()
    out = np.zeros(len(h))
    out[index] = solution[:k]
    return out


def _gram(A: np.ndarray) -> np.ndarray:
    """AᵀA through torch (the [C, K] systems of large heads)."""
    t = torch.from_numpy(A)
    return (t.T @ t).numpy()


def _matvec(G: np.ndarray, z: np.ndarray) -> np.ndarray:
    return torch.mv(torch.from_numpy(G), torch.from_numpy(z)).numpy()
