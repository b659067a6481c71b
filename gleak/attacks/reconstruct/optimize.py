"""The optimisation loops: L-BFGS (DLG) and Adam (Inverting Gradients).

Both start from N(0, 1) dummies (seeded per restart), keep the best iterate by objective value, stop a
restart whose objective turns NaN/Inf, and return the best restart. The Adam loop follows Geiping et al.
(NeurIPS 2020) §4 / inversefed: step decay ×0.1 at 3/8, 5/8 and 7/8 of the iterations, inputs projected back
into the valid pixel box after every step, and optionally the signed gradient (``x.grad.sign_()``).
Notes: docs/methods/reconstruction.md#optimisers.

Both count objective evaluations (each with its gradient) besides iterations: an Adam iteration is one
evaluation; an L-BFGS step is up to 20 inner iterations with a line search, up to 25 evaluations. torch's
L-BFGS ends a step on absolute tolerances (change 1e-9, gradient 1e-7) that are large next to
gradient-matching objectives of ~1e-6, so gleak scales the change tolerance to the objective and drops the
gradient one (see :func:`lbfgs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gleak.timebox import Forecast, checkpoint

# progress(restart, iteration, iterations, best loss so far)
Progress = Callable[[int, int, int, float], None]
# one restart: best loss, its inputs, iterations run, objective evaluations
Run = tuple[float, torch.Tensor, int, int]

# an L-BFGS step ends early once the objective changes by less than this fraction of itself (float32's
# resolution: smaller changes are rounding, not progress)
RELATIVE_CHANGE = float(torch.finfo(torch.float32).eps)


@dataclass
class Solution:
    """The best restart's inputs and objective, with the work that all restarts did."""

    inputs: torch.Tensor
    loss: float
    restart: int
    iterations_run: int  # over all restarts (Adam steps or L-BFGS outer steps)
    losses: list[float]  # best objective of each restart
    evaluations_run: int = 0  # objective evaluations (each with its gradient) over all restarts


def _best_of(restarts: int, run: Callable[[int], Run]) -> Solution:
    """Run every restart and keep the one with the lowest objective."""
    runs = [run(r) for r in range(restarts)]
    r = min(range(restarts), key=lambda i: runs[i][0])
    return Solution(runs[r][1], runs[r][0], r, sum(run[2] for run in runs), [run[0] for run in runs],
                    sum(run[3] for run in runs))


def _start(shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(device).requires_grad_(True)


def _project(x: torch.Tensor, box: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    if box is not None:
        with torch.no_grad():
            x.copy_(torch.maximum(torch.minimum(x, box[1]), box[0]))


def adam(objective: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], iterations: int,
         restarts: int, lr: float, gen: torch.Generator, device: torch.device,
         box: tuple[torch.Tensor, torch.Tensor] | None, signed: bool = False,
         progress: Progress | None = None) -> Solution:
    """Inverting Gradients' optimiser: Adam (on sign(∇x L) when ``signed``), step schedule, box projection."""
    milestones = sorted({max(1, int(iterations * f)) for f in (3 / 8, 5 / 8, 7 / 8)})
    forecast = Forecast(restarts * iterations)  # under a deadline: stops at once when the steps cannot fit

    def run(r: int) -> Run:
        x = _start(shape, gen, device)
        _project(x, box)
        opt = torch.optim.Adam([x], lr=lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        best, best_x, done = float("inf"), x.detach().clone(), 0
        for it in range(iterations):
            checkpoint(f"restart {r + 1}/{restarts}, step {it}/{iterations}")  # gleak.timebox: the deadline
            loss = objective(x)
            if not torch.isfinite(loss):
                break
            if float(loss.detach()) < best:
                best, best_x = float(loss.detach()), x.detach().clone()
            (grad,) = torch.autograd.grad(loss, x)
            x.grad = grad.sign() if signed else grad
            opt.step()
            sched.step()
            _project(x, box)
            done = it + 1
            forecast.check(r * iterations + done)
            if progress is not None:
                progress(r, done, iterations, best)
        evaluations = done + (done < iterations)  # a run cut short still evaluated its non-finite loss
        return best, best_x, done, evaluations

    return _best_of(restarts, run)


def lbfgs(objective: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], iterations: int,
          restarts: int, lr: float, gen: torch.Generator, device: torch.device,
          progress: Progress | None = None) -> Solution:
    """DLG's optimiser: L-BFGS with a strong-Wolfe line search; an iteration is one ``step`` (≤ 20 inner
    iterations, ≤ 25 evaluations).

    DLG's code runs L-BFGS without a line search; with Wang, Liang & He's feature term that overshoots into the
    saturated region of sigmoid networks (the loss jumps ×7 and the gradient vanishes), so gleak always
    searches the step length.

    torch's absolute tolerances end a step after one or two evaluations once the objective is ~1e-6 (its
    change is then below 1e-9, its gradient below 1e-7), so a run of "100 steps" can do a tenth of the work
    and stop short of the optimum. Here the gradient tolerance is off (an exactly zero gradient still ends a
    step) and the change tolerance is :data:`RELATIVE_CHANGE` times the objective at the start of each step
    (0 during the first)."""

    def run(r: int) -> Run:
        x = _start(shape, gen, device)
        opt = torch.optim.LBFGS([x], lr=lr, line_search_fn="strong_wolfe", tolerance_grad=0.0,
                                tolerance_change=0.0)
        bad = False
        evaluations = 0

        def closure() -> torch.Tensor:
            nonlocal bad, evaluations
            evaluations += 1
            opt.zero_grad(set_to_none=True)
            loss = objective(x)
            if not torch.isfinite(loss):
                bad = True  # L-BFGS then stops on its own
            else:
                (x.grad,) = torch.autograd.grad(loss, x)
            return loss.detach()

        best, best_x, done = float("inf"), x.detach().clone(), 0
        for it in range(iterations):
            checkpoint(f"restart {r + 1}/{restarts}, step {it}/{iterations}")  # gleak.timebox: the deadline
            before = x.detach().clone()
            # the objective at ``before``; torch leaves LBFGS.step unannotated
            value = float(opt.step(closure))  # type: ignore[no-untyped-call]
            if bad or value != value:
                break
            if value < best:
                best, best_x = value, before
            done = it + 1
            if progress is not None:
                progress(r, done, iterations, best)
            if value == 0.0:
                break
            opt.param_groups[0]["tolerance_change"] = RELATIVE_CHANGE * abs(value)
        # the final iterate has not been scored yet (the objective differentiates, so no torch.no_grad here)
        final = float("inf")
        if not bad:
            final = float(objective(x).detach())
            evaluations += 1
        if final < best:
            best, best_x = final, x.detach().clone()
        return best, best_x, done, evaluations

    return _best_of(restarts, run)
