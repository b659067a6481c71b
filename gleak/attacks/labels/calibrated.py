"""The calibrated selector: per capture, the label attack that does best on batches simulated like it.

Which attack recovers labels best depends on the model and the setting (on the trained LeNet-5s of
``bench/labels.py --suite trained`` the best attack changes between zlg-plus, llg-plus, posterior and rlu from cell
to cell, and in 45 of 168 cells even the best is below chance). This attack calibrates every applicable label
attack on contributions simulated from the auxiliary data with the capture's settings
(:mod:`gleak.attacks.labels.confidence`), together with a ridge combination of all of them and the raw last-layer
statistics fitted on the same simulations (:mod:`gleak.attacks.labels.stacking`; option ``stack``), keeps the
candidates that beat chance there, and returns the counts of the one with the best worst-case margin over chance.
When none beats chance it does not guess: it abstains (status ``abstained``, no counts) with the reason — the best
candidate and its margin over chance on each composition of simulated batches — and that calibration in
``confidence``, so it is never worse than chance where the simulation can tell. An abstention is an answer, not an
error. Runs only when named (``-a calibrated``): the calibration costs K simulated contributions × every attack,
about 5 s for a B = 32 LeNet-5 gradient at K = 24.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from gleak.attacks.base import NO_INPUTS, Abstained, Attack, LabelOutput, RunInputs, run_attack
from gleak.attacks.context import Context
from gleak.attacks.labels.confidence import SIMULATIONS, CalibrationCache, Confidence, best_informative, calibrate
from gleak.attacks.labels.stacking import Stack
from gleak.attacks.options import AttackOptions
from gleak.attacks.registry import attacks_for, register
from gleak.attacks.requirements import Requirements
from gleak.errors import GleakError


class CalibratedOptions(AttackOptions):
    simulations: int = Field(SIMULATIONS, ge=4, le=1000, description="contributions simulated from the aux data "
                             "to measure every attack")
    stack: bool = Field(True, description="also fit and calibrate a ridge combination of the attacks and the raw "
                        "last-layer statistics on the simulated contributions (gleak.attacks.labels.stacking)")


@register
class Calibrated(Attack):
    name = "calibrated"
    paper = ("gleak's selector: each attack measured on contributions simulated like the capture's; split-conformal "
             "intervals (Lei et al., JASA 2018)")
    summary = "the attack with the best iAcc on batches simulated like this one; abstains when none beats chance"
    requires = Requirements(gradient_view=False, needs_model_forward=True, needs_aux=True,
                            needs_batch_forward=True)  # it trains simulated clients on batches of B
    default: ClassVar[bool] = False
    Options: ClassVar[type[AttackOptions]] = CalibratedOptions
    options: CalibratedOptions

    given: tuple[list[Attack], dict[str, Confidence]] | None = None  # set by :meth:`precalibrated`
    ran: dict[str, torch.Tensor] | None = None  # counts the candidates already gave on this capture
    # calibrations shared between captures, owned by the caller (an audit, a sweep, a host program) that sets it;
    # None: each run calibrates afresh (a cache of its own, dropped when the run ends)
    cache: CalibrationCache | None = None

    @classmethod
    def precalibrated(cls, candidates: list[Attack], calibrated: dict[str, Confidence], simulations: int,
                      ran: dict[str, torch.Tensor] | None = None) -> Calibrated:
        """A selector that answers from a calibration already made (the audit calibrates every label attack once,
        with the stacked combination, and asks this for the answer) instead of calibrating again, and from the
        candidates' counts on the capture in ``ran`` instead of running them again."""
        selector = cls()
        selector.configure({"simulations": max(simulations, 4)})
        selector.given, selector.ran = (candidates, calibrated), ran
        return selector

    def _counts(self, attack: Attack, ctx: Context) -> tuple[torch.Tensor | None, list[str], str | None]:
        """(counts, warnings, why not) of one candidate on the capture: what it already gave, or a run now."""
        if self.ran is not None and attack.name in self.ran:
            return self.ran[attack.name], [], None
        result = run_attack(attack, ctx)
        if result.status != "ok":
            return None, [], result.reason
        return result.labels.counts, list(result.warnings), None

    def run(self, ctx: Context, inputs: RunInputs = NO_INPUTS) -> LabelOutput:
        simulations = self.options.simulations
        if self.given is not None:
            candidates, calibrated = self.given
        else:
            candidates = [a for a in attacks_for("labels")
                          if a.name not in (self.name, "softlabel") and a.not_applicable(ctx) is None]
            if not candidates:
                raise GleakError("no other label attack applies to this capture")
            calibrated, why = calibrate(ctx, candidates, simulations=simulations, seed=ctx.seed,
                                        cache=self.cache if self.cache is not None else CalibrationCache(),
                                        stack=self.options.stack)
            if why:
                raise GleakError(why)
        if not calibrated:
            raise GleakError(f"no label attack ran on enough of the {simulations} batches simulated like this one to "
                             "be calibrated")
        informative = {n: c for n, c in calibrated.items() if c.informative}
        ranked = sorted(calibrated.items(), key=lambda kv: -kv[1].expected_iacc)
        summary = {n: round(c.expected_iacc, 4) for n, c in ranked}
        if not informative:
            raise self._abstain(calibrated, summary, simulations)
        name = best_informative({n: c.to_json() for n, c in informative.items()})
        assert name is not None
        conf = informative[name]
        if conf.stack is not None:
            counts, warnings = self._stacked(ctx, candidates, conf.stack)
        else:
            got, warnings, why = self._counts(next(a for a in candidates if a.name == name), ctx)
            if got is None:
                raise GleakError(f"the chosen attack {name} did not finish: {why}")
            counts = got
        fit = conf.fit(counts)
        unfit = conf.fit_warning(counts)
        return LabelOutput(counts=counts, warnings=warnings + ([unfit] if unfit else []), diagnostics={
            "chosen": name, "composition": conf.composition, "expected_iacc": round(conf.expected_iacc, 4),
            "chance_iacc": round(conf.chance_iacc, 4), "half_width": conf.half_width,
            "worst_margin_over_chance": round(conf.worst_margin, 4),
            "by_composition": conf.to_json().get("by_composition", {}), "expected_iacc_by_attack": summary,
            **({"fit": fit} if fit is not None else {})})

    @staticmethod
    def _abstain(calibrated: dict[str, Confidence], summary: dict[str, float], simulations: int) -> Abstained:
        """The answer when no candidate is informative: the best worst-case margin over chance, by composition."""
        name, best = max(calibrated.items(), key=lambda kv: kv[1].worst_margin)
        losing = [best.compositions[c].label if c in best.compositions else c
                  for c, m in best.by_composition.items() if not m.beats_chance]
        reason = (f"no label attack beats chance on both compositions of the {simulations} batches simulated like "
                  f"this one; the best, {name}, has a worst-case margin over chance of {best.worst_margin:+.3f} "
                  f"({best.describe()}; not clearly above chance on {' and '.join(losing) or 'either'}): the "
                  "labels are not recoverable here by these attacks, so no counts are given")
        return Abstained(reason, {"calibrated": True, "attack": name, **best.to_json(),
                                  "expected_iacc_by_attack": summary})

    def _stacked(self, ctx: Context, candidates: list[Attack], stack: Stack) -> tuple[torch.Tensor, list[str]]:
        """The fitted combination applied to this capture: every combined attack's counts on it, then the ridge."""
        found: dict[str, torch.Tensor] = {}
        missing = []
        for attack in candidates:
            if attack.name not in stack.names:
                continue
            got, _, _ = self._counts(attack, ctx)
            if got is not None:
                found[attack.name] = got
            else:
                missing.append(attack.name)
        warnings = ([f"stacked: {', '.join(missing)} did not run on this capture; the prior stands in for them"]
                    if missing else [])
        return stack.counts_for(ctx, found), warnings
