"""Least squares on the probability simplex (RLU's Eq. 10): the active-set solver against scipy's SLSQP."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from gleak.attacks.labels.simplex import simplex_least_squares


def _slsqp(A: np.ndarray, u: np.ndarray) -> np.ndarray:
    C = A.shape[1]
    scale = max(float(np.abs(u).max()), 1e-12)

    def fun(z: np.ndarray) -> tuple[float, np.ndarray]:
        r = (A @ z - u) / scale
        return float(r @ r), 2 * A.T @ r / scale

    res = minimize(fun, np.full(C, 1 / C), jac=True, method="SLSQP", bounds=[(0.0, 1.0)] * C,
                   constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1, "jac": lambda z: np.ones(C)}],
                   options={"maxiter": 1000, "ftol": 1e-15})
    z = np.clip(res.x, 0, None)
    return z / z.sum()


def _objective(A: np.ndarray, u: np.ndarray, z: np.ndarray) -> float:
    return float(np.sum((A @ z - u) ** 2))


@pytest.mark.parametrize("seed", range(4))
def test_never_worse_than_slsqp_and_satisfies_kkt(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(60):
        C = int(rng.integers(1, 30))
        M = C if trial % 2 else int(rng.integers(1, 50))
        A = rng.normal(size=(M, C)) * 10 ** rng.uniform(-6, 3)
        if trial % 5 == 0 and C >= 4:  # duplicated columns: a rank-deficient A, many minimisers
            A[:, : C // 2] = A[:, C // 2: 2 * (C // 2)]
        u = A @ rng.dirichlet(np.full(C, 0.3)) + rng.normal(size=M) * np.abs(A).mean() * rng.choice([0, 0.01, 1])
        z = simplex_least_squares(A, u)
        assert z.min() >= 0 and abs(z.sum() - 1) < 1e-12
        ours, theirs = _objective(A, u, z), _objective(A, u, _slsqp(A, u))
        assert ours <= theirs + 1e-7 * max(theirs, 1e-12 * float(u @ u), 1e-300), (trial, ours, theirs)
        # KKT: the gradient is smallest (and equal) on the support
        g = A.T @ (A @ z - u)
        spread = 1e-6 * max(1.0, float(np.abs(g).max()))
        assert g[z > 1e-9].max() - g.min() <= spread + 1e-9 * float(np.abs(A).max() ** 2 + 1)


def test_exact_proportions_are_recovered() -> None:
    rng = np.random.default_rng(7)
    A = rng.normal(size=(10, 10))
    truth = np.array([0.5, 0.25, 0.25, 0, 0, 0, 0, 0, 0, 0])
    assert np.allclose(simplex_least_squares(A, A @ truth), truth, atol=1e-10)
    assert np.array_equal(simplex_least_squares(np.zeros((3, 1)), np.ones(3)), [1.0])
