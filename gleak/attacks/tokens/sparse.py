"""Joint-sparse recovery of a batch's first-layer inputs from a dictionary of every possible input, beyond the rank
the span test needs (issue 45; METHODS-sparse §1.3 R2, §3.3, §3.8; docs/methods/sparse.md).

The measurement Y [d, L] (a LoRA factor's ∇Aᵀ, several adapted modules stacked column-wise, or a first-layer ∇W)
is U_S C: every column combines the same n atoms u_i of the dictionary D (the model's first-block inputs, one per
token or per (token, position)). The span test (DAGER) needs n below the rank of Y (below r for LoRA ∇A); a
sparse fit identifies S while n < (d + rank Y)/2 (Chen & Huo, IEEE TSP 2006; Davies & Eldar, IEEE TIT 2012).

:func:`ormp_somp` is the order-recursive simultaneous OMP (Cotter, Rao, Engan & Kreutz-Delgado, IEEE TSP 2005;
Tropp, Gilbert & Strauss, Signal Processing 2006), kept incremental: the residual R = (I − QQᵀ)Y, the correlations
Z = DᵀR and each atom's energy outside the selected span p_a = ‖(I − QQᵀ)φ_a‖² are updated by one rank-one step per
selection, so each step is one pass over the dictionary, streamed in chunks (:class:`Dictionary`), and nothing of
size |D| × d is ever held. The step whose residual drops to the floor (the *cliff*) says how many atoms the
measurement holds (:func:`cliff`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from gleak.errors import GleakError
from gleak.timebox import checkpoint

CHUNK_ATOMS = 8192  # dictionary atoms computed and used at a time
SPENT = 1e-8  # an atom whose energy outside the selected span falls below this share is in that span already
CLIFF = 0.1  # a residual that falls by more than this ratio in one step ends the support (METHODS-sparse §3.8)
AFTER_CLIFF = 0.5  # ... when the two steps after it remove less than this ratio each (only noise is left)
CLIFF_STEPS = 3  # the drop is measured over this many selections up to the end of the support


class Dictionary:
    """A dictionary of ``size`` unit atoms in ℝ^``dim``, produced a chunk at a time by ``chunk(first, count)``
    (float32 or float64 rows [count, dim], unit norm): the model's first-block inputs are recomputed per pass
    rather than held, which bounds memory at V = 128k. A dictionary with structure overrides :meth:`products`
    (every atom's inner products with a few vectors) to skip building the atoms, and :meth:`prepare` (a left
    linear map both the atoms and the measurement go through: any such map keeps Y = U_S C)."""

    def __init__(self, size: int, dim: int, chunk: Callable[[int, int], torch.Tensor],
                 chunk_atoms: int = CHUNK_ATOMS, transform: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> None:
        self.size, self.dim, self.chunk, self.chunk_atoms = size, dim, chunk, chunk_atoms
        self.transform = transform

    def chunks(self, label: str = "atoms") -> Iterator[tuple[int, torch.Tensor]]:
        """(first index, float64 atoms [count, dim]) over the whole dictionary."""
        for first in range(0, self.size, self.chunk_atoms):
            checkpoint(f"{label} {first}/{self.size}")
            yield first, self.chunk(first, min(self.chunk_atoms, self.size - first)).double()

    def products(self, m: torch.Tensor, label: str = "atoms") -> Iterator[tuple[int, torch.Tensor]]:
        """(first index, float64 [count, k]): the atoms' inner products with the columns of ``m`` [dim, k]."""
        for first, atoms in self.chunks(label):
            yield first, atoms @ m

    def atom(self, index: int) -> torch.Tensor:
        """One atom, float64 [dim]."""
        return self.chunk(index, 1)[0].double()

    def prepare(self, y: torch.Tensor) -> torch.Tensor:
        """The measurement as the atoms see it (``transform`` when given, else as it is)."""
        return self.transform(y) if self.transform is not None else y

    def pass_cost(self) -> float:
        """Multiply-adds of one pass of :meth:`products` with one vector."""
        return float(self.size) * self.dim

    @staticmethod
    def of(atoms: torch.Tensor, chunk_atoms: int = CHUNK_ATOMS) -> Dictionary:
        """A resident dictionary: the rows of ``atoms`` [N, dim], normalised to unit length."""
        unit = atoms.double() / atoms.double().norm(dim=1, keepdim=True).clamp_min(1e-300)
        return Dictionary(size=unit.shape[0], dim=unit.shape[1], chunk=lambda a, n: unit[a:a + n],
                          chunk_atoms=chunk_atoms)


@dataclass
class SparseFit:
    """The atoms selected in order, each step's residual ratio ‖R_k‖/‖R_(k−1)‖ and selection score, and the
    support size the residual's confirmed cliff points to (:func:`confirmed_cliff`; None without one: the fit did
    not reach the floor)."""

    order: list[int]
    ratios: list[float]
    scores: list[float]
    size: int | None
    residual: float  # ‖R‖_F / ‖Y‖_F after the last selection
    diagnostics: dict[str, float] = field(default_factory=dict)
    rest: torch.Tensor | None = None  # every atom's share of ‖Y‖² it would still explain after the last step [|D|]

    @property
    def support(self) -> list[int]:
        """The selected atoms up to the cliff (all of them without one)."""
        return self.order[:self.size] if self.size is not None else list(self.order)


def cliff(ratios: list[float], threshold: float = CLIFF) -> int | None:
    """The support size the residual ratios point to: the step of the steepest drop when it falls below
    ``threshold`` (the last true atom takes the residual to the numerical floor: 2e-6 at float32 noise, while every
    step after it removes almost nothing, ratios near 1), else None."""
    if not ratios:
        return None
    k = min(range(len(ratios)), key=lambda i: ratios[i])
    return k + 1 if ratios[k] < threshold else None


def confirmed_cliff(fit: SparseFit, threshold: float = CLIFF, after: float = AFTER_CLIFF) -> int | None:
    """The support size: the end of the deepest drop that the steps after it confirm as the end of the support.
    A drop is the residual's fall over the last :data:`CLIFF_STEPS` selections up to that end, below
    ``threshold`` (exact data drops by 10⁵ in one step; a float32 update near its rounding floor over two or three:
    0.11, 0.30, 0.35, as its last inputs sink towards the noise); the end is a step that still removed a real
    share (ratio at most ``after``), followed by two that remove only noise (ratios above ``after``), or the
    residual spent exactly. A drop at the very end of the fit, or one followed by further drops, is the dimension
    running out (any d atoms span ℝ^d), not a support."""
    return _confirmed(fit.ratios, fit.residual, threshold, after)


def _confirmed(ratios: list[float], residual: float, threshold: float, after: float) -> int | None:
    best: tuple[float, int] | None = None
    for edge in range(1, len(ratios) + 1):
        drop = _drop_ending(ratios, edge, residual, after)
        if drop is not None and drop < threshold and (best is None or drop < best[0]):
            best = (drop, edge)
    return best[1] if best is not None else None


def _drop_ending(ratios: list[float], edge: int, residual: float, after: float) -> float | None:
    """The residual's fall over the selections up to ``edge`` when ``edge`` can end a support (its step removed a
    real share, and the two after it only noise, or the residual was spent there), else None."""
    if ratios[edge - 1] > after:
        return None
    if edge == len(ratios) and residual <= 1e-12:
        return 0.0
    later = ratios[edge:edge + 2]
    if len(later) < 2 or min(later) <= after:
        return None
    return math.prod(ratios[max(0, edge - CLIFF_STEPS):edge])


def ormp_somp(y: torch.Tensor, dictionary: Dictionary, max_atoms: int, stop_at_cliff: bool = True,
              known: Sequence[int] = (), threshold: float = CLIFF) -> SparseFit:
    """Order-recursive simultaneous OMP of ``y`` [d, L] over ``dictionary``: at each step the atom a that removes the
    most residual energy, ‖Z_a‖² / p_a (Z = DᵀR its correlations with the residual, p_a its energy outside the span
    of those selected), up to ``max_atoms`` selections (and at most d − 1 with the known ones), stopping after a
    confirmed cliff (:func:`confirmed_cliff` at ``threshold``) when ``stop_at_cliff``. ``known`` atoms (in the
    support for sure, such as the positions every batch uses) are selected first and are not part of ``order`` or
    ``ratios``. float64 throughout; memory O(|D|·L + d·(L + max_atoms) + chunk·d)."""
    d = y.shape[0]
    if dictionary.dim != d:
        raise GleakError(f"the dictionary's atoms have {dictionary.dim} dimensions, the measurement {d}")
    y = dictionary.prepare(y.double())
    total = float(y.norm())
    if total == 0.0:
        return SparseFit(order=[], ratios=[], scores=[], size=0, residual=0.0)
    # compress: the scores depend on Y only through YYᵀ, so Y's left singular vectors scaled by its singular values
    # carry everything, in at most d columns
    u, s, _ = torch.linalg.svd(y, full_matrices=False)
    keep = s > 1e-12 * s[0]
    resid = u[:, keep] * s[keep]
    z = torch.empty(dictionary.size, resid.shape[1], dtype=torch.float64)
    for first, part in dictionary.products(resid, "sparse fit: correlations, atoms"):
        z[first:first + len(part)] = part
    energy = torch.ones(dictionary.size, dtype=torch.float64)
    chosen = torch.zeros(dictionary.size, dtype=torch.bool)
    basis = torch.empty(d, 0, dtype=torch.float64)

    def take(j: int, label: str) -> bool:
        """Add atom j to the span: the residual, the correlations and the energies by one rank-one step."""
        nonlocal basis, resid
        chosen[j] = True
        atom = dictionary.atom(j)
        q = atom - basis @ (basis.T @ atom)
        q = q - basis @ (basis.T @ q)  # once more: float64 keeps the basis orthonormal to ~1e-15
        norm = float(q.norm())
        if norm < math.sqrt(SPENT):
            return False
        q = q / norm
        basis = torch.cat([basis, q[:, None]], 1)
        rho = q @ resid
        resid = resid - torch.outer(q, rho)
        for first, inner in dictionary.products(q[:, None], label):
            alpha = inner[:, 0]
            rows = slice(first, first + len(alpha))
            z[rows] -= torch.outer(alpha, rho)
            energy[rows] -= alpha.square()
        return True

    for k, j in enumerate(known):
        take(j, f"sparse fit: known atom {k + 1}/{len(known)}, atoms")
    order: list[int] = []
    ratios: list[float] = []
    scores: list[float] = []
    before = float(resid.norm())
    left = before / total  # the share of ‖Y‖ the known atoms leave
    steps = max(0, min(max_atoms, d - 1 - basis.shape[1]))
    for step in range(steps):
        gain = z.square().sum(1) / energy.clamp_min(1e-12)
        gain[chosen | (energy < SPENT)] = -math.inf
        j = int(torch.argmax(gain))
        if not math.isfinite(float(gain[j])):
            break
        if not take(j, f"sparse fit: step {step + 1}/{steps}, atoms"):
            continue
        order.append(j)
        scores.append(float(gain[j]))
        after = float(resid.norm())
        ratios.append(after / before if before > 0 else 0.0)
        before = after
        if stop_at_cliff and after <= 1e-12 * total:
            break
        if stop_at_cliff and len(ratios) > 2:
            # only the step two back can have become the end of a support with this one
            drop = _drop_ending(ratios, len(ratios) - 2, 1.0, AFTER_CLIFF)
            if drop is not None and drop < threshold:
                break  # two steps past a cliff, and the ratios are back near 1 (confirmed_cliff)
    rest = (z.square().sum(1) / energy.clamp_min(1e-12)).div_(total ** 2)
    rest[chosen] = 0.0
    size = _confirmed(ratios, before / total, threshold, AFTER_CLIFF)
    return SparseFit(order=order, ratios=ratios, scores=scores, size=size, residual=before / total,
                     diagnostics={"columns": float(resid.shape[1]), "known": float(len(known)), "left": left},
                     rest=rest)


def leave_one_out(y: torch.Tensor, atoms: torch.Tensor) -> torch.Tensor:
    """Each selected atom's own share of ‖Y‖²: how much the least-squares residual of Y on ``atoms`` [k, d] grows
    when that atom alone is dropped, ‖c_a‖² / [(UᵀU)⁻¹]_aa (METHODS-sparse §3.10 item 1). [k] float64."""
    y = y.double()
    u = atoms.double().T
    gram_inv = torch.linalg.pinv(u.T @ u, hermitian=True)
    coef = gram_inv @ (u.T @ y)
    total = float(y.square().sum()) or 1.0
    share: torch.Tensor = coef.square().sum(1) / gram_inv.diagonal().clamp_min(1e-300) / total
    return share
