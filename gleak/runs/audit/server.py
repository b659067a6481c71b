"""The audit's check of the global model itself: the structures a malicious server plants (``gleak check-model``'s
weight tests, :mod:`gleak.tamper.structure`), as findings on each capture made with that model — critical for a
trap, medium for an outlier. Each model is checked once per cache (a run reuses one model for many captures)."""

from __future__ import annotations

from collections import OrderedDict

from gleak.models import LoadedModel
from gleak.report.model import Finding
from gleak.tamper.structure import Hit, check_views
from gleak.tamper.views import layer_views

SEVERITY = {"trap": "critical", "suspicious": "medium"}
CHECKS_KEPT = 64  # models whose check results an audit keeps (a few hundred bytes each)


class ModelChecks:
    """The weight tests' results by the weights' hash, least recently used dropped past ``max_entries``: a run's
    captures share their round's model, which is checked once."""

    def __init__(self, max_entries: int = CHECKS_KEPT) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, list[Hit]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def hits(self, loaded: LoadedModel) -> list[Hit]:
        """The weight tests on ``loaded``, from the cache when its hash was checked before."""
        key = loaded.weights_sha256
        if key and key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        found = check_views(list(layer_views(loaded.module)))
        if key:
            self._entries[key] = found
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return found


def server_findings(loaded: LoadedModel, capture: str, model: str, checks: ModelChecks | None) -> list[Finding]:
    """One finding per structure found in the global model ``model`` that ``capture`` was made with."""
    return [Finding(rule=h.rule, severity=SEVERITY[h.tier], capture=capture,  # type: ignore[arg-type]
                    title=f"the global model {model} looks crafted by the server: {h.title}", measured=h.measured,
                    metric=h.metric, threshold=h.threshold, attack="check-model",
                    detail=f"layer {h.layer}; honest models: {h.null}. Do not train on this model (gleak "
                           "check-model; docs/methods/server.md)")
            for h in (checks or ModelChecks()).hits(loaded)]
