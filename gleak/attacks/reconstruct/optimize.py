"""The optimisation loops: L-BFGS (DLG) and Adam on the signed gradient (Inverting Gradients).

Both start from N(0, 1) dummies (seeded per restart), keep the best iterate by objective value, stop a
restart whose objective turns NaN/Inf, and return the best restart. The Adam loop follows Geiping et al.
2020 §4 / inversefed: step decay ×0.1 at 3/8, 5/8 and 7/8 of the iterations, inputs projected back into the
valid pixel box after every step, and optionally the signed gradient (``x.grad.sign_()``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gleak.attacks.reconstruct.base import Progress


@dataclass
class Solution:
    inputs: torch.Tensor
    loss: float
    restart: int
    iterations_run: int
    losses: list[float]  # best objective of each restart


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
    best: Solution | None = None
    finals = []
    total_iters = 0
    for r in range(restarts):
        x = _start(shape, gen, device)
        _project(x, box)
        opt = torch.optim.Adam([x], lr=lr)
        milestones = sorted({max(1, int(iterations * f)) for f in (3 / 8, 5 / 8, 7 / 8)})
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        run_best, run_x = float("inf"), x.detach().clone()
        for it in range(iterations):
            opt.zero_grad(set_to_none=True)
            loss = objective(x)
            value = float(loss.detach())
            if not torch.isfinite(loss):
                break
            if value < run_best:
                run_best, run_x = value, x.detach().clone()
            (grad,) = torch.autograd.grad(loss, x)
            x.grad = grad.sign() if signed else grad
            opt.step()
            sched.step()
            _project(x, box)
            total_iters += 1
            if progress is not None:
                progress(r, it + 1, iterations, run_best)
        finals.append(run_best)
        if best is None or run_best < best.loss:
            best = Solution(run_x, run_best, r, 0, [])
    assert best is not None
    best.iterations_run, best.losses = total_iters, finals
    return best


def lbfgs(objective: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], iterations: int,
          restarts: int, lr: float, gen: torch.Generator, device: torch.device,
          progress: Progress | None = None) -> Solution:
    """DLG's optimiser: L-BFGS, ≤ 20 evaluations per outer iteration, with a strong-Wolfe line search.

    DLG's code runs L-BFGS without a line search; with seed 000's feature term that overshoots into the
    saturated region of sigmoid networks (the loss jumps ×7 and the gradient vanishes), so gleak always
    searches the step length."""
    best: Solution | None = None
    finals = []
    total_iters = 0
    for r in range(restarts):
        x = _start(shape, gen, device)
        opt = torch.optim.LBFGS([x], lr=lr, line_search_fn="strong_wolfe")
        run_best, run_x = float("inf"), x.detach().clone()
        state = {"bad": False}

        def closure(x: torch.Tensor = x, opt: torch.optim.LBFGS = opt, state: dict = state) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = objective(x)
            if not torch.isfinite(loss):
                state["bad"] = True
                return loss.detach()  # L-BFGS then stops on its own
            (x.grad,) = torch.autograd.grad(loss, x)
            return loss.detach()

        for it in range(iterations):
            before = x.detach().clone()
            loss = opt.step(closure)
            value = float(loss) if loss is not None else float("nan")
            if state["bad"] or value != value:
                break
            if value < run_best:
                run_best, run_x = value, before
            total_iters += 1
            if progress is not None:
                progress(r, it + 1, iterations, run_best)
            if value == 0.0:
                break
        # the final iterate has not been scored yet (the objective differentiates, so no torch.no_grad here)
        final = float(objective(x).detach()) if not state["bad"] else float("inf")
        if final < run_best:
            run_best, run_x = final, x.detach().clone()
        finals.append(run_best)
        if best is None or run_best < best.loss:
            best = Solution(run_x, run_best, r, 0, [])
    assert best is not None
    best.iterations_run, best.losses = total_iters, finals
    return best
