"""The calibrated selector: per capture, the label attack that does best on batches simulated like it.

Which attack recovers labels best depends on the model and the setting (on the trained LeNet-5s of
``bench/labels.py --suite trained`` the best attack changes between zlg-plus, llg-plus, posterior and rlu from cell
to cell, and in 45 of 168 cells even the best is below chance). This attack calibrates every applicable label
attack on contributions simulated from the auxiliary data with the capture's settings
(:mod:`gleak.attacks.labels.confidence`), keeps those that beat chance there, and returns the counts of the one
with the highest expected iAcc. When none beats chance it does not guess: it fails with the reason, so it is never
worse than chance where the simulation can tell. Runs only when named (``-a calibrated``): the calibration costs
K simulated contributions × every attack, about 5 s for a B = 32 LeNet-5 gradient at K = 24.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from gleak.attacks.base import Attack, LabelOutput, Requirements, attacks_for, register, run_attack
from gleak.attacks.context import Context
from gleak.attacks.labels.confidence import SIMULATIONS, best_informative, calibrate
from gleak.attacks.options import AttackOptions
from gleak.errors import GleakError

# calibrations kept between captures of one process (same model weights and settings: computed once)
_CACHE: dict[tuple[Any, ...], Any] = {}


class CalibratedOptions(AttackOptions):
    simulations: int = Field(SIMULATIONS, ge=4, le=1000, description="contributions simulated from the aux data "
                             "to measure every attack")


@register
class Calibrated(Attack):
    name = "calibrated"
    paper = ("gleak's selector: each attack measured on contributions simulated like the capture's; split-conformal "
             "intervals (Lei et al., JASA 2018)")
    summary = "the attack with the best iAcc on batches simulated like this one; refuses when none beats chance"
    requires = Requirements(gradient_view=False, needs_model_forward=True, needs_aux=True)
    default: ClassVar[bool] = False
    Options = CalibratedOptions

    def run(self, ctx: Context) -> LabelOutput:
        candidates = [a for a in attacks_for("labels")
                      if a.name not in (self.name, "softlabel") and a.not_applicable(ctx) is None]
        if not candidates:
            raise GleakError("no other label attack applies to this capture")
        simulations = int(self.options.simulations)  # type: ignore[attr-defined]
        calibrated, why = calibrate(ctx, candidates, simulations=simulations, seed=ctx.seed, cache=_CACHE)
        if why:
            raise GleakError(why)
        informative = {n: c for n, c in calibrated.items() if c.informative}
        ranked = sorted(calibrated.items(), key=lambda kv: -kv[1].expected_iacc)
        summary = {n: round(c.expected_iacc, 4) for n, c in ranked}
        if not informative:
            best_name, best = ranked[0] if ranked else ("none", None)
            detail = (f"best {best_name} at iAcc {best.expected_iacc:.3f} vs chance {best.chance_iacc:.3f}"
                      if best is not None else "no attack ran on the simulated batches")
            raise GleakError(f"no label attack beats chance on {simulations} batches simulated like this one "
                             f"({detail}): the labels are not recoverable here by these attacks")
        name = best_informative({n: c.to_json() for n, c in informative.items()})
        assert name is not None
        chosen = next(a for a in candidates if a.name == name)
        result = run_attack(chosen, ctx)
        if result.status != "ok":
            raise GleakError(f"the chosen attack {name} did not finish: {result.reason}")
        conf = informative[name]
        return LabelOutput(counts=result.labels.counts, warnings=list(result.warnings), diagnostics={
            "chosen": name, "expected_iacc": round(conf.expected_iacc, 4), "chance_iacc": round(conf.chance_iacc, 4),
            "half_width": conf.half_width, "worst_margin_over_chance": round(conf.worst_margin, 4),
            "expected_iacc_by_attack": summary})
