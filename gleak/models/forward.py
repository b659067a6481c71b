"""Run a model and return its last-layer inputs h and its logits z, for every kind of model gleak loads.

* Ordinary modules: a forward hook on the last layer reads its input.
* torch.export programs: the graph applies the last layer's weight with an aten op and never calls the layer
  as a module, so a hook on it would never fire. :func:`expose_last_layer` routes the input of that op through
  a pass-through :class:`LastLayerTap` at the layer's path (holding the same parameters, so names, state dict
  and gradients are unchanged), where hooks do fire. Programs exported for a fixed batch size b run on groups of
  exactly b rows (vectorised over the groups with torch.func.vmap), the last group padded and the padding
  dropped; :func:`batch_problem` says when a caller's whole batch cannot run in one forward.
* TorchScript archives: hooks are unsupported, so callers get a reason instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gleak.errors import GleakError, shorten
from gleak.models.lastlayer import LastLayer, _main_output, _op_name

CHUNK = 1024
TORCHSCRIPT_REASON = ("TorchScript archives do not expose the last layer's input (they support no hooks); load the "
                      "weights with --arch, or a torch.export .pt2, instead")
_TRANSPOSES = frozenset({"t", "permute", "transpose", "numpy_T"})


class LastLayerTap(nn.Module):
    """Stands in for the last layer's (otherwise never called) module inside an exported program: it returns its
    input unchanged, so forward hooks on it see the last layer's input."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h


def forward_problem(model: nn.Module, layer: LastLayer) -> str | None:
    """Why the last-layer inputs of ``model`` cannot be read (None when they can).

    An exported program is prepared in place first (:func:`expose_last_layer`)."""
    if isinstance(model, torch.jit.ScriptModule):
        return TORCHSCRIPT_REASON
    if isinstance(model, torch.fx.GraphModule):
        return expose_last_layer(model, layer)
    try:
        model.get_submodule(layer.name)
    except AttributeError:
        return f"needs to hook the last layer '{layer.name}', which this model does not expose as a module"
    return None


def expose_last_layer(gm: torch.fx.GraphModule, layer: LastLayer) -> str | None:
    """Make hooks on ``gm.get_submodule(layer.name)`` see the last layer's input; the reason it cannot, or None.

    Idempotent; a graph that already calls the layer as a module (torch.fx tracing) is left as it is."""
    graph = gm.graph
    if any(n.op == "call_module" and n.target == layer.name for n in graph.nodes):
        return None
    if not layer.name:
        return "the last layer's weight sits at the top of the exported program, so its input cannot be observed"
    found = _linear_consumer(graph, layer.weight_key)
    if found is None:
        return (f"the exported program does not apply the last layer's weight '{layer.weight_key}' in a linear "
                "op, so its input cannot be read")
    consumer, feature = found
    parent_name, _, child = layer.name.rpartition(".")
    try:
        parent = gm.get_submodule(parent_name)
        stub = parent.get_submodule(child)
    except AttributeError:
        return f"the exported program has no module '{layer.name}' holding the last layer's weight"
    tap = LastLayerTap()
    for name, param in stub.named_parameters(recurse=False):
        tap.register_parameter(name, param)
    for name, buf in stub.named_buffers(recurse=False):
        tap.register_buffer(name, buf)
    for name, sub in stub.named_children():
        tap.add_module(name, sub)
    setattr(parent, child, tap)
    with graph.inserting_before(consumer):
        node = graph.call_module(layer.name, (feature,))
    node.meta = {k: v for k, v in feature.meta.items() if k in ("val", "tensor_meta")}
    consumer.replace_input_with(feature, node)
    gm.recompile()
    return None


def _arg(node: torch.fx.Node, index: int, name: str) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


def _linear_consumer(graph: torch.fx.Graph, weight_key: str) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """The last op applying the weight ``weight_key`` as a linear layer, and that op's input node."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    found: list[tuple[torch.fx.Node, Any]] = []
    for weight in graph.nodes:
        if weight.op != "get_attr" or weight.target != weight_key:
            continue
        for user in weight.users:
            if user.op != "call_function":
                continue
            op = _op_name(user.target)
            if op == "linear" and _arg(user, 1, "weight") is weight:
                found.append((user, _arg(user, 0, "input")))
            elif op in _TRANSPOSES and user.args and user.args[0] is weight:
                for product in user.users:
                    op2 = _op_name(product.target) if product.op == "call_function" else ""
                    if op2 == "addmm" and _arg(product, 2, "mat2") is user:
                        found.append((product, _arg(product, 1, "mat1")))
                    elif op2 in ("mm", "matmul") and _arg(product, 1, "other") is user:
                        found.append((product, _arg(product, 0, "input")))
    found = [(c, f) for c, f in found if isinstance(f, torch.fx.Node)]
    return max(found, key=lambda cf: order[cf[0]]) if found else None


def batch_bounds(model: nn.Module) -> tuple[int, int | None]:
    """Smallest and largest batch ``model`` runs: an exported program's constraint on its input's first
    dimension (exactly n for a static export), else (1, None)."""
    if not isinstance(model, torch.fx.GraphModule):
        return 1, None
    for node in model.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            return 1, None
        size = val.shape[0]
        if isinstance(size, int):
            return size, size
        ranges = getattr(model, "range_constraints", None) or {}
        bounds = ranges.get(getattr(getattr(size, "node", None), "expr", None))
        if bounds is None:
            return 1, None
        return max(_finite_int(bounds.lower) or 1, 1), _finite_int(bounds.upper)
    return 1, None


def _finite_int(value: Any) -> int | None:
    """A sympy bound as an int; None for (int) infinity."""
    if isinstance(value, int) or getattr(value, "is_Integer", False):
        return int(value)
    return None


def batch_problem(model: nn.Module, batch_size: int | None) -> str | None:
    """Why ``model`` cannot run all ``batch_size`` examples in one forward pass (None when it can or B is
    unknown)."""
    low, high = batch_bounds(model)
    if batch_size is None or (low <= batch_size and (high is None or batch_size <= high)):
        return None
    if low == high:
        runs = f"exactly {low}"
    elif high is None:
        runs = f"at least {low}"
    else:
        runs = f"{low} to {high}"
    return (f"runs the whole batch (B = {batch_size}) through the model at once, but this exported program "
            f"takes batches of {runs} example{'s' if high != 1 else ''}; export it with a dynamic batch "
            "dimension (dynamic_shapes) or load its weights with --arch")


def features_and_logits(model: nn.Module, layer: LastLayer, inputs: torch.Tensor,
                        device: torch.device | str = "cpu",
                        chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-layer inputs h [N, d] and logits z [N, C] of ``inputs`` (no grad, chunked), on the CPU.

    Raises GleakError when the model kind does not allow it or the layer does not run exactly once."""
    problem = forward_problem(model, layer)
    if problem:
        raise GleakError(problem)
    if not len(inputs):
        raise GleakError("no inputs to run the model on")
    low, high = batch_bounds(model)
    fixed = low if low == high else None
    if fixed is not None:
        step = max(fixed, chunk // fixed * fixed)
    else:
        step = max(1, min(chunk, high) if high is not None else chunk)
    seen: list[torch.Tensor] = []

    def hook(_m: nn.Module, args: tuple[Any, ...], _out: Any) -> None:
        seen.append(args[0].detach())

    feats: list[torch.Tensor] = []
    logits: list[torch.Tensor] = []
    handle = model.get_submodule(layer.name).register_forward_hook(hook)
    try:
        with torch.no_grad():
            for start in range(0, len(inputs), step):
                x = inputs[start:start + step].to(device)
                try:
                    if fixed is not None:
                        h, z = _run_groups(model, layer, x, fixed, seen)
                    else:
                        h, z = _run_once(model, layer, _pad(x, low), seen)
                except GleakError:
                    raise
                except Exception as exc:  # a guard or shape check of the model itself
                    why = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
                    raise GleakError(f"the model failed on inputs of shape {list(x.shape)}: "
                                     f"{type(exc).__name__}: {shorten(why, 160)}") from None
                feats.append(h[:len(x)].cpu())
                logits.append(z[:len(x)].cpu())
    finally:
        handle.remove()
    return torch.cat(feats), torch.cat(logits)


def _pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``size`` rows."""
    return x if len(x) >= size else torch.cat([x, x.new_zeros((size - len(x), *x.shape[1:]))])


def _run_once(model: nn.Module, layer: LastLayer, x: torch.Tensor,
              seen: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    seen.clear()
    z = _main_output(model(x))
    if len(seen) != 1:
        raise GleakError(f"the last layer '{layer.name}' ran {len(seen)} times in one forward pass; "
                         "its input cannot be read")
    if z is None:
        raise GleakError("the model's output is not a tensor of logits")
    return seen[0].flatten(1), z.detach()


def _run_groups(model: nn.Module, layer: LastLayer, x: torch.Tensor, size: int,
                seen: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a fixed-batch program on ``x`` in groups of exactly ``size`` rows (the last one padded): vectorised
    over the groups with torch.func.vmap, where every call still sees ``size`` rows, else one group at a time."""
    groups = -(-len(x) // size)
    xg = _pad(x, groups * size).reshape(groups, size, *x.shape[1:])
    try:
        h, z = torch.func.vmap(lambda g: _run_once(model, layer, g, seen))(xg)
    except GleakError:
        raise
    except Exception:  # an op without a batching rule: plain loop
        parts = [_run_once(model, layer, g, seen) for g in xg]
        h, z = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    return h.flatten(0, 1), z.flatten(0, 1)
