"""The check a client runs on a received global model before it trains (framework-free; the Flower mod and the
NVFlare filter call it): gleak check-model's weight tests (:mod:`gleak.tamper.structure`) on the received tensors,
read into the client's own model when it is given (keys and shapes compared first), else as bare matrices."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from gleak.tamper.structure import Hit, architecture_hits, check_views
from gleak.tamper.views import layer_views, tensor_views

Mode = Literal["refuse", "warn", "off"]
MODES: tuple[Mode, ...] = ("refuse", "warn", "off")


@dataclass(frozen=True)
class GuardVerdict:
    """What the guard found: the structures, and whether the round is refused under ``mode``."""

    hits: list[Hit] = field(default_factory=list)
    refused: bool = False

    @property
    def traps(self) -> list[Hit]:
        return [h for h in self.hits if h.tier == "trap"]

    def line(self) -> str:
        """One short line, with no data: the first trap (or outlier) and how many more."""
        worst = self.traps or self.hits
        if not worst:
            return "gleak: model checked: no trap structure found"
        h = worst[0]
        more = f" (+{len(worst) - 1} more)" if len(worst) > 1 else ""
        verb = "refused" if self.refused else ("flagged" if self.traps else "suspicious")
        return (f"gleak: model {verb}: {h.rule} layer {h.layer} ({h.metric} {h.measured:g}, threshold "
                f"{h.threshold:g}){more}")


def check_state(state: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> list[Hit]:
    """The weight tests on received tensors; with the client's ``model``, its keys and shapes first, then its
    layers (so that orientation, e.g. GPT-2's Conv1D, is known)."""
    if model is None:
        return check_views(tensor_views(dict(state)))
    hits = architecture_hits(state, model.state_dict(), "the client's model")
    if hits:
        return hits + check_views(tensor_views(dict(state)))
    received = copy.deepcopy(model)
    received.load_state_dict(dict(state), strict=True)
    return check_views(layer_views(received))


def guard(state: Mapping[str, torch.Tensor], mode: Mode = "refuse", model: nn.Module | None = None,
          refuse_suspicious: bool = False) -> GuardVerdict:
    """Check ``state`` and decide: under ``refuse`` a trap (or, with ``refuse_suspicious``, any finding) refuses
    the round; ``warn`` never refuses; ``off`` checks nothing."""
    if mode == "off":
        return GuardVerdict()
    hits = check_state(state, model)
    bad = [h for h in hits if h.tier == "trap" or refuse_suspicious]
    return GuardVerdict(hits=hits, refused=mode == "refuse" and bool(bad))
