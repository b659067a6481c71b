"""The model-hash check: whether the model given is the one a capture was made with (``gleak.model.sha256``).

One type for the whole program: :func:`gleak.capture.check_model_hash` makes it, the attacks' ``Context`` holds it
and the reports (:mod:`gleak.report.model`, ``model_check``) record it as it is. It sits in the capture layer, the
lowest that needs it, in a module of its own that imports neither torch nor the rest of gleak, so that the report
models stay importable without torch; :mod:`gleak.capture` and :mod:`gleak.report.model` re-export it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class ModelCheck(BaseModel):
    """Whether the model given is the one the capture was made with (``gleak.model.sha256``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["match", "not_recorded", "mismatch_allowed"]
    recorded_sha256: str | None
    model_sha256: str
