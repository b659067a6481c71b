"""RLU (Chen & Vikalo, ICML 2024): label counts from model *updates* of one or many local steps.

The paper's version, not the released code's closed form (docs/methods/label-recovery.md#rlu lists the
differences; docs/methods/fl-updates.md#multi-step how updates are read):

1. Per true class n, logits of the auxiliary examples under the global model give μ_n, Σ_n
   (Assumption 3.1); Monte Carlo over q ~ N(μ_n, Σ_n) gives the erroneous confidences S_{n,j} (Eq. 8).
2. Eq. 9 / 16: E[Δb_j] = (η/B) Σ_τ ρ^(τ) (N_j Σ_{n≠j} S_{j,n} − Σ_{n≠j} N_n S_{n,j}) − h_j, so with
   z = N/(m·B): A z = (Δb + h)/(η·Σ_τ ρ^(τ)), A_jj = Σ_{n≠j} S_{j,n}, A_jn = −S_{n,j} (orientation from Eq. 9).
   Solved as min ‖Az − u‖² s.t. z ≥ 0, Σz = 1 exactly by an active-set method; counts rounded to sum to m·B.
3. m > 1 (Alg. 1, 2): A is averaged over the start model and the end model θ + Δθ for a crude estimate,
   then the posterior search simulates the m steps (Eq. 12–13) and moves m labels from the class whose
   simulated logit drift overshoots most to the one that undershoots most, T = 5 times. Fixes and choices:
   the drift is compared per class (the reference code compares a vector with one scalar), centred (softmax
   ignores a common shift) and with the scale of ‖ē‖² fitted once at the crude estimate; a move of m labels
   is kept only when the mismatch along it accounts for at least one whole move (least-squares step ≥ 1),
   otherwise the search stops — without these guards the search made the crude estimate worse in our
   measurements; ē comes from a least-squares
   fit ΔW_j ≈ Δb_j·ē over all classes instead of one class's ratio, which is unstable for small Δb_j.
4. FL schemes through ρ^(τ) and h (Table 1): SGD, momentum, Nesterov, FedProx μ and weight decay (as the
   exact linear recurrence of the bias), and Scaffold / FedDyn / FedDC when the capture carries the
   history term h in ``gleak.fl.history`` (the Table-1 h_j of the last-layer bias).
5. m = 1 refinement (ours, not in the paper): Eq. 9 is exact for one step, B·u_j = N_j − Σ_n p_nj, and
   Σ_n p_nj is what Eq. 8 replaces by its class average. With a trained model the per-example confidences
   spread widely, so that sum misses its mean by about one count per class, and inverting A amplifies it by
   1/(1 − S_jj). We therefore keep the LS estimate only as a start and refine it by generalised least
   squares (GLS): the bias equations plus the weight equations projected on the logit directions,
   B·u_W·Wᵀ = Σ_n (y_n − p_n)(z_n − b)ᵀ (the ∇W of Eq. 14 read through W), have mean Σ_c N_c μ_c and
   covariance Σ_c N_c Σ_c, with μ_c, Σ_c the per-class mean and covariance of −∂ℓ/∂z ⊗ [1, z − b] on the
   auxiliary data (empirical, no Gaussian Monte Carlo). One redundant class row is dropped (the rows sum to
   0), the covariance is fixed at the LS counts, and moves of one count between classes are made while the
   Gaussian log-likelihood grows. No prior on the batch composition is used. Only for C ≤ 20 classes
   (C covariances of side (C − 1)(C + 1)); larger C keep the LS estimate.
6. Large heads (ours; docs/methods/label-recovery.md#large-heads): S is built one class at a time; beyond
   C = 100 each Σ_n is a low-rank factor of at most 32 centred examples with draws seeded per class, and fewer
   Monte Carlo samples per class keep one evaluation of S bounded; beyond C = 1024 only the classes with the
   largest u_j are unknowns (``candidates``). Nothing of size C × C × C or C × M × C is built.
A FedSGD gradient is the m = 1 case with u = −∇b.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Attack, LabelOutput, RunInputs
from gleak.attacks.context import Context
from gleak.attacks.labels.counts import candidate_classes, candidate_count, logit_grads, round_counts
from gleak.attacks.labels.simplex import simplex_least_squares as solve_on_simplex
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import register
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError

# the defaults of RLUOptions
MC_SAMPLES = 2000
SEARCH_ITERATIONS = 5  # T in the main text
HISTORY_SCHEMES = ("scaffold", "feddyn", "feddc")
MAX_SIMULATED_STEPS = 100  # the posterior search simulates at most this many (macro-)steps of the m local steps
GLS_MAX_CLASSES = 20  # the m = 1 GLS refinement keeps a ((C − 1)(C + 1))² covariance per class
GLS_RIDGE = 0.1  # ridge on the GLS covariance, as a fraction of the mean per-class variance × B/C
# Bounded memory and time at ImageNet-sized heads (docs/methods/label-recovery.md#rlu, "large C"):
FULL_COVARIANCE_MAX_C = 100  # up to this C, every class's full C × C covariance (Cholesky), as the paper writes it
FACTOR_MAX_RANK = 32  # beyond it, Σ_n = F Fᵀ from at most this many centred examples of class n (exact when fewer)
MC_WORK = 2 * 10**8  # Monte Carlo softmax evaluations (samples × rows × C) per evaluation of S
MC_MIN_SAMPLES = 64  # never fewer Monte Carlo samples per class than this


class RLUOptions(AttackOptions):
    mc_samples: int = Field(MC_SAMPLES, ge=10, le=10**6,
                            description="Monte Carlo samples per class for the erroneous confidences (Eq. 8)")
    search_iterations: int = Field(SEARCH_ITERATIONS, ge=0, le=10_000,
                                   description="T: moves of m labels the posterior search tries (m > 1, Alg. 2)")
    max_simulated_steps: int = Field(MAX_SIMULATED_STEPS, ge=1, le=100_000,
                                     description="the posterior search simulates at most this many (macro-)steps "
                                     "of the m local steps")
    gls_max_classes: int = Field(GLS_MAX_CLASSES, ge=0, le=40,
                                 description="m = 1: GLS refinement of the LS counts only for C ≤ this (0: off; "
                                 "memory grows as C⁵)")
    gls_ridge: float = Field(GLS_RIDGE, gt=0, le=1e6, description="ridge on the GLS covariance, as a fraction of the "
                             "mean per-class variance × B/C")
    candidates: int | None = Field(None, ge=1, le=10**6, description="classes solved for (the ones the update points "
                                   "to most); auto: all up to C = 1024, else 4·m·B (at least 1024)")


def rho_and_history(ctx: Context, b0: torch.Tensor) -> tuple[np.ndarray, torch.Tensor, list[str]]:
    """ρ^(τ) for τ = 1..m and the history/decay term h of Eq. 16 for the capture's optimizer and scheme.

    Outside the history schemes h is linear in the start parameter, so passing the last-layer weight W₀
    instead of b₀ gives the same term for ΔW."""
    cap, m = ctx.capture, ctx.local_steps
    if ctx.kind == "gradient":
        return np.ones(1), torch.zeros_like(b0), []
    lr = _learning_rate(ctx)
    optimizer = cap.get("gleak.optimizer", "sgd")
    scheme = cap.get("gleak.fl.scheme", "fedavg")
    wd = cap.get("gleak.weight_decay", 0.0)
    tau = np.arange(1, m + 1)
    notes: list[str] = []
    h = torch.zeros_like(b0)
    if scheme in HISTORY_SCHEMES:
        lam = cap.get("gleak.fl.alpha", 0.0) if scheme != "scaffold" else 0.0
        rho = (1 - lam * lr) ** (m - tau)
        h = torch.tensor(cap.get("gleak.fl.history"), dtype=torch.float64)
        return rho, h, [f"{scheme}: ρ = (1 − {lam:g}·η)^(m−τ), history term from gleak.fl.history"]
    if optimizer in ("sgdm", "nag"):
        gamma = cap.value("gleak.momentum")
        shift = 1 if optimizer == "sgdm" else 2
        rho = (1 - gamma ** (m + shift - tau)) / (1 - gamma)
        if wd or scheme == "fedprox":
            notes.append("momentum combined with weight decay or FedProx is approximated by momentum alone")
        return rho, h, notes
    # plain SGD with FedProx μ and weight decay: b_{τ+1} = a·b_τ + c·b_0 − η·g_τ
    mu = cap.get("gleak.fl.mu", 0.0) if scheme == "fedprox" else 0.0
    a, c = 1 - lr * (mu + wd), lr * mu
    rho = a ** (m - tau)
    geometric = sum(a**k for k in range(m))
    h = -((a**m - 1) + c * geometric) * b0.double()
    return rho, h, notes


def _learning_rate(ctx: Context) -> float:
    """η of an update (RLU.not_applicable has checked that the capture records it)."""
    lr = ctx.capture.learning_rate
    if lr is None:
        raise GleakError("needs the client learning rate (gleak.learning_rate) to read the update")
    return lr


def _update_tensor(tensor: torch.Tensor | None, what: str) -> torch.Tensor:
    """The capture's own last-layer update Δ (not the gradient view), which RLU reads for updates."""
    if tensor is None:
        raise GleakError(f"the capture lacks the last-layer {what} update")
    return tensor


class _ClassLogits:
    """Logits of the auxiliary data under one model, by true class (RLU Assumption 3.1): per-class means and
    covariance factors on demand, class by class — never the C × C × C of every covariance at once."""

    def __init__(self, logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> None:
        self.z, self.y, self.C = logits, labels, num_classes
        self.order = torch.argsort(labels, stable=True)
        self.count = torch.bincount(labels, minlength=num_classes)
        self.start = torch.cat([torch.zeros(1, dtype=torch.long), self.count.cumsum(0)])
        total = torch.zeros(num_classes, dtype=torch.float64)
        for first in range(0, len(logits), 4096):
            total += logits[first:first + 4096].double().sum(0)
        self.overall = total / max(len(logits), 1)

    def rows(self, n: int) -> torch.Tensor:
        """The logits of the auxiliary examples of class n, float64."""
        return self.z[self.order[int(self.start[n]):int(self.start[n + 1])]].double()

    def mean(self, n: int) -> torch.Tensor:
        return self.rows(n).mean(0) if int(self.count[n]) else self.overall

    def means(self, classes: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.mean(int(n)) for n in classes]) if len(classes) else torch.zeros(0, self.C)

    def mean_sum(self) -> torch.Tensor:
        """Σ_n μ_n over every class n (classes without examples count with the overall mean)."""
        weight = 1.0 / self.count.double().clamp_min(1)
        total = torch.zeros(self.C, dtype=torch.float64)
        for first in range(0, len(self.z), 4096):
            part = slice(first, first + 4096)
            total += (self.z[part].double() * weight[self.y[part]][:, None]).sum(0)
        return total + int((self.count == 0).sum()) * self.overall

    def has_spread(self, n: int) -> bool:
        """Whether class n has the two examples a covariance needs (else the overall spread stands for it)."""
        return int(self.count[n]) > 1


class _Confidences:
    """Monte Carlo erroneous confidences S_{n,j} = E_{q ~ N(μ_n, Σ_n)} softmax(q)_j (Eq. 8) with fixed draws,
    for any rows n and means μ_n; only the rows asked for are computed, one class at a time.

    Up to :data:`FULL_COVARIANCE_MAX_C` classes, Σ_n is the full sample covariance (Cholesky, a small jitter) and
    the draws are shared by every class, as the paper writes Eq. 8. Beyond it Σ_n = F_n F_nᵀ with F_n the centred
    examples of class n / √(k − 1) — the same Gaussian when k ≤ :data:`FACTOR_MAX_RANK`, else a covariance
    estimated from that many of them — with draws seeded per class; and fewer samples per class when the
    evaluation would exceed :data:`MC_WORK`, never fewer than :data:`MC_MIN_SAMPLES`."""

    def __init__(self, stats: _ClassLogits, gen: torch.Generator, samples: int, rows: int) -> None:
        self.stats = stats
        C = stats.C
        self.full = C <= FULL_COVARIANCE_MAX_C
        self.samples = samples if self.full else max(MC_MIN_SAMPLES, min(samples, MC_WORK // max(rows * C, 1)))
        if self.full:
            self.draws = torch.randn(self.samples, C, generator=gen, dtype=torch.float64)
        else:
            self.seed = int(torch.randint(2**62, (1,), generator=gen))
        self._factors: dict[int, torch.Tensor] = {}

    def factor(self, n: int) -> torch.Tensor:
        """F with F Fᵀ = Σ_n: [C, C] (full) or [C, r] (low rank); classes with fewer than two examples share the
        factor of the overall spread (key −1), computed once."""
        if not self.stats.has_spread(n):
            n = -1
        if n not in self._factors:
            C = self.stats.C
            if n >= 0:
                x = self.stats.rows(n)
            elif self.full or len(self.stats.z) <= FACTOR_MAX_RANK:
                x = self.stats.z.double()
            else:  # the overall spread from a seeded subset of the examples, never all of them in float64
                pick = torch.randperm(len(self.stats.z), generator=torch.Generator().manual_seed(self.seed - 1))
                x = self.stats.z[pick[:FACTOR_MAX_RANK]].double()
            if self.full:
                cov = torch.cov(x.T) if len(x) > 1 else torch.zeros(C, C, dtype=torch.float64)
                sigma = cov + 1e-6 * (1 + cov.diagonal().mean().abs()) * torch.eye(C, dtype=torch.float64)
                try:
                    f = torch.linalg.cholesky(sigma)
                except RuntimeError:  # not positive definite: keep the variances only
                    f = torch.diag(sigma.diagonal().clamp_min(0).sqrt())
            else:
                if len(x) > FACTOR_MAX_RANK:
                    pick = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.seed + n))
                    x = x[pick[:FACTOR_MAX_RANK]]
                f = ((x - x.mean(0)).T / max(len(x) - 1, 1) ** 0.5) if len(x) > 1 else torch.zeros(C, 1,
                                                                                                    dtype=torch.float64)
            self._factors[n] = f
        return self._factors[n]

    def rows(self, classes: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        """S_{n,·} [len(classes), C] for each class n with mean ``means[i]``."""
        out = torch.empty(len(classes), self.stats.C, dtype=torch.float64)
        for i, n in enumerate(classes.tolist()):
            f = self.factor(n)
            if self.full:
                draws = self.draws
            else:
                draws = torch.randn(self.samples, f.shape[1], generator=torch.Generator().manual_seed(self.seed + n),
                                    dtype=torch.float64)
            out[i] = torch.softmax(means[i][None, :] + draws @ f.T, dim=1).mean(0)
        return out


def coefficient_columns(S: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """The columns of Eq. 9's A for the unknowns ``classes`` [K], from their rows of S [K, C] (overwritten): A_jn =
    −S_{n,j} and A_nn = Σ_{j≠n} S_{n,j}; [C, K]. With every class as an unknown this is the whole A."""
    k = torch.arange(len(classes))
    diagonal = S.sum(1) - S[k, classes]
    A = S.neg_().T  # in place: S is not needed again, and a [C, K] copy is the largest object of a large head
    A[classes, k] = diagonal
    return A


def update_statistics(logits: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor, ctx: Context,
                      with_weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean μ_c [C, D] and covariance Σ_c [C, D, D] of one example's share of the m = 1 equations.

    An example n adds f_n = −∂ℓ_n/∂z_n to B·u_b (Eq. 9 before taking expectations) and
    −∂ℓ_n/∂z_n ⊗ (z_n − b) to B·u_W·Wᵀ (∇W = Σ_n ∂ℓ_n/∂z_n h_nᵀ / B, read through W h_n = z_n − b).
    The last class row is dropped: for softmax losses the rows sum to zero, so it carries no information.
    """
    C = ctx.num_classes
    g = -logit_grads(logits, labels, ctx.loss)[:, : C - 1]  # [N, C − 1]
    if with_weight:
        weights = torch.cat([torch.ones(len(labels), 1, dtype=torch.float64), logits.double() - bias], 1)
        f = (g[:, :, None] * weights[:, None, :]).flatten(1)  # [N, (C − 1)(C + 1)]
    else:
        f = g
    D = f.shape[1]
    overall_mean = f.mean(0)
    overall_cov = torch.cov(f.T).reshape(D, D) if len(f) > 1 else torch.zeros(D, D, dtype=torch.float64)
    mean = torch.empty(C, D, dtype=torch.float64)
    cov = torch.empty(C, D, D, dtype=torch.float64)
    for c in range(C):
        fc = f[labels == c]
        mean[c] = fc.mean(0) if len(fc) else overall_mean
        cov[c] = torch.cov(fc.T).reshape(D, D) if len(fc) > 1 else overall_cov
    return mean, cov


def gls_counts(x: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor, start: torch.Tensor,
               ridge: float = GLS_RIDGE) -> tuple[torch.Tensor, int]:
    """Integer counts N (ΣN fixed by ``start``) maximising the Gaussian log-likelihood of x ~ N(Nᵀμ, V).

    V = Σ_c max(N̂_c, ½)·Σ_c at the start counts N̂, plus a ridge. Greedy ascent over moves of one count from
    class a to class b: with r = x − Nᵀμ, Q = V⁻¹, v = μQr and M = μQμᵀ the move changes −½ rᵀQr by
    v_b − v_a − ½(M_aa + M_bb − 2M_ab), so all C(C − 1) moves are scored at once.
    """
    C, B = mean.shape[0], int(start.sum())
    n = start.double().clone()
    V = torch.einsum("c,cij->ij", n.clamp_min(0.5), cov)
    V = V + ridge * (B / C) * torch.diag(cov.diagonal(dim1=1, dim2=2).mean(0).clamp_min(1e-12))
    L = torch.linalg.cholesky(V)
    Qmu = torch.cholesky_solve(mean.T.contiguous(), L)  # [D, C] = Q μᵀ
    M = mean @ Qmu
    moves = 0
    for _ in range(C * B):  # every accepted move raises the likelihood, so this bound is never reached
        v = (x - n @ mean) @ Qmu
        gain = v[None, :] - v[:, None] - 0.5 * (M.diagonal()[:, None] + M.diagonal()[None, :] - 2 * M)
        gain.fill_diagonal_(-torch.inf)
        gain[n < 1] = -torch.inf  # cannot take a count from an empty class
        best = int(gain.argmax())
        a, b = divmod(best, C)
        if not float(gain[a, b]) > 1e-12:
            break
        n[a] -= 1
        n[b] += 1
        moves += 1
    return n.round().long(), moves


def simplex_least_squares(A: torch.Tensor, u: torch.Tensor) -> np.ndarray:
    """min ‖Az − u‖² s.t. z ≥ 0, Σz = 1 (Eq. 10), solved exactly (:mod:`gleak.attacks.labels.simplex`);
    uniform proportions when A or u is not finite. A may hold only the unknowns' columns ([C, K])."""
    An, un = A.double().numpy(), u.double().numpy()
    if not (np.all(np.isfinite(An)) and np.all(np.isfinite(un))):
        return np.full(An.shape[1], 1 / An.shape[1])
    return solve_on_simplex(An, un)


def _expand(z: np.ndarray, classes: torch.Tensor, num_classes: int) -> np.ndarray:
    """Proportions of the unknowns ``classes`` as a vector over all classes (0 elsewhere)."""
    full = np.zeros(num_classes)
    full[classes.numpy()] = z
    return full


@register
class RLU(Attack):
    name = "rlu"
    paper = "Chen & Vikalo, Recovering Labels from Local Updates in Federated Learning, ICML 2024"
    summary = "label counts from one- or multi-step updates via simplex least squares on MC confidences"
    requires = Requirements(gradient_view=False, needs_bias=True, needs_aux=True, needs_model_forward=True)
    Options: ClassVar[type[AttackOptions]] = RLUOptions
    options: RLUOptions

    def not_applicable(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> str | None:
        reason = super().not_applicable(ctx, inputs)
        if reason or ctx.kind == "gradient":
            return reason
        cap = ctx.capture
        if not cap.learning_rate:
            return "needs the client learning rate (gleak.learning_rate) to read the update"
        if cap.get("gleak.optimizer", "sgd") == "adam":
            return "Adam updates are not covered by RLU's model (Table 1 lists SGD, momentum and Nesterov)"
        scheme = cap.get("gleak.fl.scheme", "fedavg")
        if scheme in HISTORY_SCHEMES and cap.get("gleak.fl.history") is None:
            return f"{scheme} needs the history term of Table 1 in gleak.fl.history, which the capture lacks"
        if ctx.layer.grad_bias is None:
            return "the capture lacks the last-layer bias update"
        mu = cap.get("gleak.fl.mu", 0.0) if scheme == "fedprox" else 0.0
        shrink = cap.learning_rate * (mu + cap.get("gleak.weight_decay", 0.0))
        if scheme not in HISTORY_SCHEMES and not shrink < 1:
            return (f"η·(μ + weight decay) = {shrink:.3g} ≥ 1: the recorded settings describe a client whose weights "
                    "would not stay bounded, so RLU's model of the update does not hold")
        return None

    memory_hint = "-O rlu.candidates"

    def memory_bytes(self, ctx: Context) -> int:
        C, examples = ctx.num_classes, (ctx.batch_size or 1) * ctx.local_steps
        K = candidate_count(C, examples, self.options.candidates)
        full = C <= FULL_COVARIANCE_MAX_C
        rank = C if full else FACTOR_MAX_RANK
        samples = self.options.mc_samples if full else max(MC_MIN_SAMPLES, min(self.options.mc_samples,
                                                                              MC_WORK // max(K * C, 1)))
        copies = 2 if ctx.local_steps > 1 else 1  # the end model's statistics too
        return 8 * (copies * (K * C * rank + 3 * K * C) + 2 * K * K + 3 * samples * C)

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        C, B, m = ctx.num_classes, ctx.require_batch_size(), ctx.local_steps
        gen = self.rng(ctx)
        warnings: list[str] = []
        if ctx.loss.name != "cross_entropy" or ctx.loss.label_smoothing or ctx.loss.temperature != 1:
            warnings.append("RLU's model assumes plain cross-entropy; the capture's loss settings differ")
        b0 = ctx.require_bias().double().cpu()
        rho, h, notes = rho_and_history(ctx, b0)
        warnings += notes
        if ctx.kind == "gradient":
            eta, delta_b = 1.0, -ctx.require_grad_bias().double()
        else:
            eta, delta_b = float(_learning_rate(ctx)), _update_tensor(ctx.layer.grad_bias, "bias").double().cpu()
        u = (delta_b + h) / (eta * float(rho.sum()))
        if ctx.loss.reduction == "sum" and ctx.kind == "update":  # the gradient view is already divided by B
            u = u / B
        _, z_start, y = ctx.aux_forward()
        o = self.options
        cand = candidate_classes(u, m * B, o.candidates)  # a class in the batch raises its u_j (Eq. 9)
        start = _ClassLogits(z_start, y, C)
        mc = _Confidences(start, gen, o.mc_samples, len(cand))
        A = coefficient_columns(mc.rows(cand, start.means(cand)), cand)
        diagnostics: dict[str, Any] = {"rho_sum": float(rho.sum()), "mc_samples": mc.samples,
                                       "candidates": len(cand)}
        if mc.samples < o.mc_samples:
            warnings.append(f"C = {C}: {mc.samples} Monte Carlo samples per class instead of {o.mc_samples}, to keep "
                            "the confidences' cost bounded (-O rlu.mc_samples sets the most)")
        if len(cand) < C:
            warnings.append(f"C = {C}: solved for the {len(cand)} classes the update points to most (-O "
                            "rlu.candidates); the others are taken as absent")
        if m == 1:
            z = _expand(simplex_least_squares(A, u), cand, C)
            counts = round_counts(z * B, B)
            defended = bool(ctx.capture.get("gleak.defense"))
            if o.gls_max_classes >= C and defended:  # its weight equations assume an exact update
                warnings.append("GLS refinement skipped: the capture records a defense (gleak.defense) whose noise or "
                                "sparsity its weight equations do not model; the paper's least squares on the bias "
                                "stand (bench/results/defenses.md)")
            elif o.gls_max_classes >= C:
                counts, diagnostics["gls_moves"] = self._refine(ctx, counts, u, rho, eta)
                diagnostics["ls_counts"] = round_counts(z * B, B)
        else:
            aux = ctx.require_aux()
            z_end = ctx.features_and_logits(aux.batch(range(len(aux)))[0], model=_end_model(ctx))[1]
            end = _ClassLogits(z_end, y, C)
            A_end = coefficient_columns(_Confidences(end, gen, o.mc_samples, len(cand)).rows(cand, end.means(cand)),
                                        cand)
            z = _expand(simplex_least_squares((A + A_end) / 2, u), cand, C)
            counts = round_counts(z * m * B, m * B)
            diagnostics["crude_counts"] = counts.clone()
            counts, moves = self._posterior_search(ctx, counts, start, end, mc, eta, rho, delta_b + h)
            diagnostics["search_moves"] = moves
            diagnostics["simulated_steps"] = min(m, o.max_simulated_steps)
        diagnostics["z"] = torch.from_numpy(z)
        return LabelOutput(counts, diagnostics=diagnostics, warnings=warnings)

    def _refine(self, ctx: Context, counts: torch.Tensor, u: torch.Tensor, rho: np.ndarray,
                eta: float) -> tuple[torch.Tensor, int]:
        """m = 1: GLS refinement of the LS counts on the bias and logit-projected weight equations (item 5)."""
        B, C = ctx.require_batch_size(), ctx.num_classes
        W0, b0 = ctx.layer.weight.double().cpu(), ctx.require_bias().double().cpu()
        scheme = ctx.capture.get("gleak.fl.scheme", "fedavg")
        u_W = None
        if ctx.kind == "gradient" and ctx.grad_weight is not None:
            u_W = -ctx.grad_weight.double().cpu()  # the gradient view is already mean-reduced
        elif ctx.kind == "update" and ctx.layer.grad_weight is not None and scheme not in HISTORY_SCHEMES:
            u_W = (ctx.layer.grad_weight.double().cpu() + rho_and_history(ctx, W0)[1]) / (eta * float(rho.sum()))
            if ctx.loss.reduction == "sum":
                u_W = u_W / B
        x = (B * u)[: C - 1, None]
        if u_W is not None:
            x = torch.cat([x, B * u_W[: C - 1] @ W0.T], 1)
        _, logits, labels = ctx.aux_forward()
        mean, cov = update_statistics(logits, labels, b0, ctx, with_weight=u_W is not None)
        return gls_counts(x.flatten(), mean, cov, counts, self.options.gls_ridge)

    def _posterior_search(self, ctx: Context, counts: torch.Tensor, start: _ClassLogits, end: _ClassLogits,
                          mc: _Confidences,
                          eta: float, rho: np.ndarray, db: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Alg. 2: simulate the m steps' logit drift for the counts and move m labels while it helps."""
        m, B = ctx.local_steps, ctx.require_batch_size()
        dW = _update_tensor(ctx.layer.grad_weight, "weight").double().cpu()
        e_bar = (db[:, None] * dW).sum(0) / (db @ db).clamp_min(1e-300)  # LS fit ΔW_j ≈ Δb_j·ē (Eq. 14)
        energy = float(e_bar @ e_bar)
        per_step = eta * float(rho.mean()) / B
        observed = end.mean_sum() - start.mean_sum()  # Σ_n μ_end[n, j] − Σ_n μ_start[n, j]
        C = ctx.num_classes

        # Beyond max_simulated_steps the m steps are simulated as that many macro-steps of m / K steps each (an
        # Euler step of the same drift; per-step shifts are small), so the cost stays bounded for long local runs.
        simulated = min(m, self.options.max_simulated_steps)
        per_simulated = per_step * m / simulated

        def drift(n: torch.Tensor) -> torch.Tensor:
            g = n.double() / m
            support = torch.nonzero(g > 0).flatten()  # only the classes in the batch move the bias (Eq. 12)
            base, gs = start.means(support), g[support]
            shift = torch.zeros(C, dtype=torch.float64)
            k = torch.arange(len(support))
            for _ in range(simulated):
                S = mc.rows(support, base + shift[None, :])
                own = S[k, support]
                out = torch.zeros(C, dtype=torch.float64)
                out[support] = gs * (S.sum(1) - own)  # g_j·Σ_{n≠j} S_{j,n}
                into = gs @ S
                into[support] -= gs * own  # Σ_{n≠j} g_n·S_{n,j}
                step_b = per_simulated * (out - into)  # Eq. 12
                shift = shift + step_b * energy  # Eq. 13, the same shift for every true class n
            d = C * shift  # Σ_n (μ_n + shift) − Σ_n μ_n
            return d - d.mean()  # softmax ignores a common shift of all logits

        target = observed - observed.mean()
        crude = drift(counts)
        # ‖ē‖² only approximates ē·e per example; fit its scale once, at the crude estimate
        scale = float((crude @ target) / (crude @ crude).clamp_min(1e-300)) if bool(crude.abs().sum() > 0) else 1.0
        scale = scale if scale > 0 else 1.0

        def mismatch(n: torch.Tensor) -> torch.Tensor:
            return scale * drift(n) - target

        diff = mismatch(counts)
        moves = 0
        for _ in range(self.options.search_iterations):
            over = torch.where((diff > 0) & (counts >= m), diff, torch.full_like(diff, -torch.inf))
            under = torch.where(diff < 0, diff, torch.full_like(diff, torch.inf))
            if not torch.isfinite(over.max()) or not torch.isfinite(under.min()):
                break
            trial = counts.clone()
            trial[int(over.argmax())] -= m
            trial[int(under.argmin())] += m
            new_diff = mismatch(trial)
            step = new_diff - diff  # what moving m labels changes in the simulated drift
            if float(-(diff @ step) / (step @ step).clamp_min(1e-300)) < 1.0:
                break  # the mismatch does not account for a whole move of m labels: keep the estimate
            counts, diff, moves = trial, new_diff, moves + 1
        return counts, moves


def _end_model(ctx: Context) -> torch.nn.Module:
    """θ_end = θ_global + Δθ (parameters and any buffers the capture carries)."""
    model = copy.deepcopy(ctx.require_model())
    state = model.state_dict()
    with torch.no_grad():
        for name, delta in ctx.capture.tensors.items():
            if name in state and state[name].dtype.is_floating_point:
                state[name].add_(delta.to(state[name].device, state[name].dtype))
    return model.eval()
