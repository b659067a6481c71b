"""Running a model in the mode the client trained in: BatchNorm with batch statistics, without side effects.

A client computes its gradient with the model in train mode, where BatchNorm normalises with the statistics
of the batch itself, not with the running averages. An attack that runs the model in eval mode matches a
different function: on a ResNet-18 train-mode capture the gradient-matching objective at the *true* images
was a cosine distance of 0.93 instead of 0. :func:`batch_statistics` switches only the normalisation layers
(dropout stays off: its random masks cannot be reproduced, and eval-mode dropout is their expectation), and
keeps the running averages untouched, so the global model is the same after an attack as before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

NORMALISATIONS = (nn.modules.batchnorm._BatchNorm,)  # BatchNorm1d/2d/3d, SyncBatchNorm, LazyBatchNorm


def batch_norm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The layers whose output depends on the batch in train mode."""
    if isinstance(model, torch.jit.ScriptModule | torch.fx.GraphModule):
        return []  # their graphs fixed the mode when they were traced or exported
    return [m for m in model.modules() if isinstance(m, NORMALISATIONS)]


def fixed_mode_reason(model: nn.Module) -> str | None:
    """Why a program cannot be switched to batch statistics (TorchScript / torch.export fix the mode), or None."""
    if isinstance(model, torch.jit.ScriptModule):
        return "a TorchScript archive keeps the mode it was traced in"
    if isinstance(model, torch.fx.GraphModule):
        graph_text = " ".join(str(n.target) for n in model.graph.nodes if n.op == "call_function")
        if "batch_norm" in graph_text:
            return "a torch.export program keeps the mode it was exported in"
    return None


@contextmanager
def batch_statistics(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, BatchNorm layers normalise with the current batch's statistics and do not update
    their running averages (``track_running_stats`` off, which also leaves ``num_batches_tracked`` alone)."""
    layers = batch_norm_layers(model) if enabled else []
    saved = [(m, m.training, m.track_running_stats) for m in layers]
    try:
        for m in layers:
            m.training = True
            m.track_running_stats = False
        yield
    finally:
        for m, training, track in saved:
            m.training = training
            m.track_running_stats = track
