"""gleak inside FL frameworks: write captures where the updates are made, and audit them where they arrive.

* :mod:`gleak.integrations.recorder` — the framework-free part: one capture (and optionally its ground truth
  and the round's global model) per client per round, written atomically, never raising into training.
* :mod:`gleak.integrations.guard` — framework-free too: the check a client runs on a received global model before
  training (a malicious server's structures, ``gleak check-model``), which the Flower mod and NVFlare filter call.
* :mod:`gleak.integrations.flower` — a Flower client mod and a server-side strategy wrapper, and the guard mod
  (``gleak[flower]``).
* :mod:`gleak.integrations.nvflare` — NVFlare DXO filters for task results and task data, and the guard filter
  (``gleak[nvflare]``).

The framework modules import their framework at import time; importing this package imports neither.
"""

from gleak.integrations.recorder import CaptureRecorder, ClientRecord

__all__ = ["CaptureRecorder", "ClientRecord"]
