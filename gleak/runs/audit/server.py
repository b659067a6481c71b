"""The audit's check of the global model itself: the structures a malicious server plants (``gleak check-model``'s
weight tests, :mod:`gleak.tamper.structure`), as findings on each capture made with that model — critical for a
trap, medium for an outlier. Each model is checked once per cache (a run reuses one model for many captures)."""

from __future__ import annotations

from gleak.lru import BoundedLRU
from gleak.models import LoadedModel
from gleak.report.model import Finding
from gleak.tamper.structure import Hit, check_views
from gleak.tamper.views import layer_views

SEVERITY = {"trap": "critical", "suspicious": "medium"}
CHECKS_KEPT = 64  # models whose check results an audit keeps (a few hundred bytes each)


class ModelChecks(BoundedLRU[str, list[Hit]]):
    """The weight tests' results by the weights' hash, least recently used dropped past ``max_entries``: a run's
    captures share their round's model, which is checked once."""

    def __init__(self, max_entries: int = CHECKS_KEPT) -> None:
        super().__init__(max_entries)

    def hits(self, loaded: LoadedModel) -> list[Hit]:
        """The weight tests on ``loaded``, from the cache when its hash was checked before."""
        key = loaded.weights_sha256
        found = self.get(key) if key else None
        if found is None:
            found = check_views(layer_views(loaded.module))
            if key:
                self.put(key, found)
        return found


def server_findings(loaded: LoadedModel, capture: str, model: str, checks: ModelChecks | None) -> list[Finding]:
    """One finding per structure found in the global model ``model`` that ``capture`` was made with."""
    return [Finding(rule=h.rule, severity=SEVERITY[h.tier], capture=capture,  # type: ignore[arg-type]
                    title=f"the global model {model} looks crafted by the server: {h.title}", measured=h.measured,
                    metric=h.metric, threshold=h.threshold, attack="check-model",
                    detail=f"layer {h.layer}; honest models: {h.null}. Do not train on this model (gleak "
                           "check-model; docs/methods/server.md)")
            for h in (checks or ModelChecks()).hits(loaded)]
