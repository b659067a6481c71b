"""Find the model's last fully-connected layer (the one whose gradient reveals labels and features)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gleak.errors import GleakError
from gleak.io import FC_LAYER_HINT


@dataclass(frozen=True)
class LastLayer:
    """The final linear layer ``logits = W h + b`` and, when a capture was given, its gradient slices."""

    name: str
    weight_key: str
    bias_key: str | None
    weight: torch.Tensor
    bias: torch.Tensor | None
    grad_weight: torch.Tensor | None
    grad_bias: torch.Tensor | None
    num_classes: int
    feature_dim: int
    reason: str


@dataclass(frozen=True)
class _Choice:
    weight_key: str
    bias_key: str | None
    reason: str


class _NotFound(Exception):
    """Tracing could not attribute the output to a linear layer; carries a short explanation."""


def find_last_layer(
    model: nn.Module | Any,
    tensors: Mapping[str, torch.Tensor] | None = None,
    input_shape: Sequence[int] | None = None,
    override: str | None = None,
) -> LastLayer:
    """Locate the last fully-connected layer of ``model`` and slice ``tensors`` (a gradient capture) for it.

    ``model`` is an nn.Module (ordinary, TorchScript, or a torch.export module) or an ExportedProgram.
    """
    state = _state_dict(model)
    try:
        traced: _Choice | None = _trace(model, state, input_shape)
        why = ""
    except _NotFound as exc:
        traced, why = None, str(exc)
    if override is not None:
        choice = _override_choice(state, override)
        if traced is not None and traced.weight_key != choice.weight_key:
            raise GleakError(
                f"--fc-layer {override!r} is not the layer that produces the model's output (the logits): "
                f"that is '{traced.weight_key}'; the attacks read the last layer's gradient, so only it can be chosen"
            )
        if traced is None:
            choice = _Choice(choice.weight_key, choice.bias_key, f"{choice.reason} (not verified: {why})")
    else:
        choice = traced if traced is not None else _fallback(state, tensors, why)
    return _build(state, choice, tensors)


def guess_last_layer(tensors: Mapping[str, torch.Tensor], override: str | None = None,
                     num_classes: int | None = None) -> LastLayer:
    """Best guess from a capture alone (no model): the last 2-D ``.weight`` with a matching bias; with
    ``num_classes`` (the capture's ``gleak.num_classes``), only weights with that many rows, if any.

    Names are ordered naturally (``layer10`` after ``layer2``) because safetensors files store them sorted.
    Without a model, ``weight``/``bias`` of the result hold the captured tensors themselves.
    """
    state = {k: tensors[k] for k in sorted(tensors, key=_natural_key)}
    if override is not None:
        choice = _override_choice(state, override)
    else:
        why = "no --model given, so this is a guess from the capture's tensor names"
        rows = {k: v for k, v in state.items() if k.endswith("weight") and v.dim() == 2 and v.shape[0] == num_classes}
        if rows:  # other 2-D weights cannot be the logits layer
            state_for_guess = {k: v for k, v in state.items() if k in rows or not k.endswith("weight")}
            choice = _fallback(state_for_guess, None, f"{why} and gleak.num_classes = {num_classes}")
        else:
            choice = _fallback(state, None, why)
    return _build(state, choice, state)


def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


# --------------------------------------------------------------------------- helpers


def _state_dict(model: Any) -> dict[str, torch.Tensor]:
    if isinstance(model, torch.export.ExportedProgram):
        return {**dict(model.constants), **dict(model.state_dict)}
    if not isinstance(model, nn.Module):
        raise GleakError(f"expected a torch.nn.Module or torch.export program, got {type(model).__name__}")
    return dict(model.state_dict(keep_vars=True))


def _weight_candidates(state: Mapping[str, torch.Tensor]) -> list[str]:
    return [k for k, v in state.items() if k.endswith("weight") and v.dim() == 2]


def _bias_for(state: Mapping[str, torch.Tensor], weight_key: str) -> str | None:
    if not weight_key.endswith(".weight") and weight_key != "weight":
        return None
    key = weight_key[: -len("weight")] + "bias"
    bias = state.get(key)
    if bias is not None and tuple(bias.shape) == (state[weight_key].shape[0],):
        return key
    return None


def _override_choice(state: Mapping[str, torch.Tensor], override: str) -> _Choice:
    name = override.strip()
    for key in (name, f"{name}.weight" if name else "weight"):
        tensor = state.get(key)
        if tensor is not None and tensor.dim() == 2:
            return _Choice(key, _bias_for(state, key), f"--fc-layer override selected '{key}'")
    candidates = _weight_candidates(state)
    listed = ", ".join(candidates[-12:]) if candidates else "none"
    more = f" (last 12 of {len(candidates)})" if len(candidates) > 12 else ""
    raise GleakError(f"--fc-layer {override!r} is not a 2-D weight of the model; 2-D weights{more}: {listed}")


def _fallback(
    state: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor] | None, why: str
) -> _Choice:
    orders: list[list[str]] = []
    if tensors is not None:
        orders.append([k for k in tensors if k in state])
    orders.append(list(state))
    for order in orders:
        weights = [k for k in order if k.endswith(".weight") and state[k].dim() == 2]
        with_bias = [k for k in weights if _bias_for(state, k) is not None]
        if with_bias:
            key = with_bias[-1]
            return _Choice(
                key, _bias_for(state, key), f"fallback: last 2-D weight with a matching bias ('{key}'); {why}"
            )
        if weights:
            key = weights[-1]
            return _Choice(key, None, f"fallback: last 2-D weight ('{key}', no matching bias); {why}")
    raise GleakError(
        f"the model has no 2-D '.weight' tensor, so it has no fully-connected last layer ({why})"
    )


def _build(
    state: Mapping[str, torch.Tensor], choice: _Choice, tensors: Mapping[str, torch.Tensor] | None
) -> LastLayer:
    weight = state[choice.weight_key].detach()
    bias = state[choice.bias_key].detach() if choice.bias_key else None
    grad_weight = grad_bias = None
    if tensors is not None:
        grad_weight = tensors.get(choice.weight_key)
        if grad_weight is None:
            raise GleakError(
                f"the capture has no tensor '{choice.weight_key}' (last layer weight, model shape "
                f"{list(weight.shape)}); {FC_LAYER_HINT}"
            )
        if tuple(grad_weight.shape) != tuple(weight.shape):
            raise GleakError(
                f"capture tensor '{choice.weight_key}' has shape {list(grad_weight.shape)} "
                f"but the model's weight has shape {list(weight.shape)}; {FC_LAYER_HINT}"
            )
        if choice.bias_key is not None and bias is not None:
            grad_bias = tensors.get(choice.bias_key)
            if grad_bias is not None and tuple(grad_bias.shape) != tuple(bias.shape):
                raise GleakError(
                    f"capture tensor '{choice.bias_key}' has shape {list(grad_bias.shape)} "
                    f"but the model's bias has shape {list(bias.shape)}; {FC_LAYER_HINT}"
                )
    name = choice.weight_key.removesuffix("weight").removesuffix(".")
    return LastLayer(
        name=name,
        weight_key=choice.weight_key,
        bias_key=choice.bias_key,
        weight=weight,
        bias=bias,
        grad_weight=grad_weight,
        grad_bias=grad_bias,
        num_classes=int(weight.shape[0]),
        feature_dim=int(weight.shape[1]),
        reason=choice.reason,
    )


# --------------------------------------------------------------------------- tracing


def _trace(model: Any, state: Mapping[str, torch.Tensor], input_shape: Sequence[int] | None) -> _Choice:
    if isinstance(model, torch.export.ExportedProgram):
        return _walk_fx(model.graph, state, model.graph_signature, "the exported program's graph")
    if isinstance(model, torch.jit.ScriptModule):
        return _walk_torchscript(model, state)
    has_linear = any(isinstance(m, nn.Linear) for m in model.modules())
    if not has_linear and isinstance(model, torch.fx.GraphModule):
        return _walk_fx(model.graph, state, None, "the exported module's graph")
    if input_shape is None:
        raise _NotFound("tracing needs an input shape")
    if not has_linear:
        raise _NotFound("the model has no nn.Linear module")
    return _trace_hooks(model, state, tuple(int(d) for d in input_shape))


def _main_output(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        out = out.get("logits", next(iter(out.values()), None))
        return out if isinstance(out, torch.Tensor) else None
    if isinstance(out, (tuple, list)) and out:
        return _main_output(out[0])
    if hasattr(out, "logits"):
        return _main_output(out.logits)
    return None


def _trace_hooks(model: nn.Module, state: Mapping[str, torch.Tensor], shape: tuple[int, ...]) -> _Choice:
    names = {
        m: n
        for n, m in model.named_modules()
        if m is not model
        and not isinstance(m, torch.jit.ScriptModule)  # they refuse hooks
        and (isinstance(m, nn.Linear) or not any(m.children()))
    }
    seen: list[tuple[str, nn.Module, torch.Tensor]] = []  # leaf modules in call order with their outputs

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            seen.append((names[module], module, output))

    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((1, *shape), generator=generator).to(device=device, dtype=dtype)
    modes = {m: m.training for m in model.modules()}
    handles = []
    try:
        handles = [m.register_forward_hook(hook) for m in names]
        model.eval()
        with torch.no_grad():
            out = model(x)
    except Exception as exc:
        raise _NotFound(
            f"the traced forward pass with input {list(shape)} failed ({type(exc).__name__})"
        ) from None
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    y = _main_output(out)
    if y is None:
        raise _NotFound("the model output is not a tensor")
    linear_calls = [i for i, (_, m, _) in enumerate(seen) if isinstance(m, nn.Linear)]
    index = _match_output([seen[i][2] for i in linear_calls], y)
    if index is None:
        raise _NotFound("the traced model output is not produced by an nn.Linear")
    call = linear_calls[index]
    name = seen[call][0]
    key = f"{name}.weight" if name else "weight"
    if key not in state or state[key].dim() != 2:
        raise _NotFound(f"Linear '{name}' has no plain 2-D '{key}' in the state dict")
    after = [type(m).__name__ for _, m, o in seen[call + 1 :] if _match_output([o], y) is not None]
    through = f" (through {'/'.join(dict.fromkeys(after))})" if after else ""
    return _Choice(
        key,
        _bias_for(state, key),
        f"traced a forward pass: the output of Linear '{name}' is the model output{through}",
    )


def _match_output(outputs: Sequence[torch.Tensor], y: torch.Tensor) -> int | None:
    """Index of the last output that is ``y``: same object, same memory, or else equal values."""
    tests: tuple[Callable[[torch.Tensor], bool], ...] = (
        lambda o: o is y,
        lambda o: o.numel() == y.numel() and o.numel() > 0 and o.data_ptr() == y.data_ptr(),
        lambda o: o.shape == y.shape and torch.equal(o, y),
    )
    for same in tests:
        for i in range(len(outputs) - 1, -1, -1):
            if same(outputs[i]):
                return i
    return None


# --------------------------------------------------------------------------- torch.export graphs

_FX_PASS = {
    "dropout",
    "feature_dropout",
    "alpha_dropout",
    "feature_alpha_dropout",
    "native_dropout",
    "clone",
    "alias",
    "detach",
    "contiguous",
    "lift_fresh_copy",
    "_to_copy",
    "to",
    "identity",
    "view_as",
}
_FX_TRANSPOSE = {"t", "permute", "transpose", "numpy_T"}


def _op_name(target: object) -> str:
    """'aten.linear.default' -> 'linear'; also handles plain Python callables."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        op: str = schema.name.split("::")[-1]
        return op
    name: str = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _walk_fx(graph: Any, state: Mapping[str, torch.Tensor], signature: Any, what: str) -> _Choice:
    output = next((n for n in graph.nodes if n.op == "output"), None)
    if output is None:
        raise _NotFound(f"{what} has no output")
    node = output.args[0]
    while isinstance(node, (tuple, list)) and node:
        node = node[0]
    steps = 0
    while steps < 100:
        steps += 1
        if not hasattr(node, "op") or node.op != "call_function":
            break
        op = _op_name(node.target)
        if op == "getitem":
            node = node.args[0]
            continue
        if op in _FX_PASS:
            node = node.args[0]
            continue
        if op == "linear":
            bias_arg = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
            return _fx_choice(node.args[1], bias_arg, False, state, signature, what)
        if op == "addmm":
            return _fx_choice(node.args[2], node.args[0], True, state, signature, what)
        if op in ("mm", "matmul"):
            return _fx_choice(node.args[1], None, True, state, signature, what)
        if op == "add" and len(node.args) == 2:
            a, b = node.args
            for prod, bias in ((a, b), (b, a)):
                if (
                    hasattr(prod, "op")
                    and prod.op == "call_function"
                    and _op_name(prod.target) in ("mm", "matmul")
                ):
                    return _fx_choice(prod.args[1], bias, True, state, signature, what)
        break
    raise _NotFound(f"{what} does not end in a linear layer")


def _fx_param(node: Any, state: Mapping[str, torch.Tensor], signature: Any) -> str | None:
    if not hasattr(node, "op"):
        return None
    key: str | None = None
    if node.op == "get_attr":
        key = str(node.target)
    elif node.op == "placeholder" and signature is not None:
        key = signature.inputs_to_parameters.get(node.name) or signature.inputs_to_buffers.get(node.name)
        if key is None:
            key = getattr(signature, "inputs_to_lifted_tensor_constants", {}).get(node.name)
    return key if key in state else None


def _fx_choice(
    weight_arg: Any,
    bias_arg: Any,
    transposed: bool,
    state: Mapping[str, torch.Tensor],
    signature: Any,
    what: str,
) -> _Choice:
    if transposed:
        if not (
            hasattr(weight_arg, "op")
            and weight_arg.op == "call_function"
            and _op_name(weight_arg.target) in _FX_TRANSPOSE
        ):
            raise _NotFound(f"{what} ends in a matrix product that is not a Linear layout")
        weight_arg = weight_arg.args[0]
    key = _fx_param(weight_arg, state, signature)
    if key is None or state[key].dim() != 2:
        raise _NotFound(f"{what} ends in a linear op whose weight is not a model parameter")
    bias_key = _fx_param(bias_arg, state, signature) if bias_arg is not None else None
    if bias_key is not None and tuple(state[bias_key].shape) != (state[key].shape[0],):
        bias_key = None
    return _Choice(key, bias_key, f"walked {what} back from its output to the linear op using '{key}'")


# --------------------------------------------------------------------------- TorchScript graphs

_TS_PASS = {
    "aten::dropout",
    "aten::feature_dropout",
    "aten::alpha_dropout",
    "aten::feature_alpha_dropout",
    "aten::clone",
    "aten::contiguous",
    "aten::detach",
    "aten::alias",
    "aten::to",
}


def _ts_attr_path(value: Any) -> str | None:
    """Follow a chain of prim::GetAttr back to ``self``: 'classifier.6.weight'."""
    parts: list[str] = []
    while True:
        node = value.node()
        if node.kind() != "prim::GetAttr":
            break
        parts.append(node.s("name"))
        value = node.inputsAt(0)
    if not parts or value.node().kind() != "prim::Param":
        return None
    return ".".join(reversed(parts))


def _ts_is_none(value: Any) -> bool:
    kind: str = value.type().kind()
    return kind == "NoneType"


def _walk_torchscript(model: Any, state: Mapping[str, torch.Tensor]) -> _Choice:
    what = "the TorchScript graph"
    try:
        graph = model.inlined_graph
    except Exception:
        raise _NotFound(f"{what} is not available") from None
    value = graph.return_node().inputsAt(0)
    for _ in range(100):
        node = value.node()
        kind = node.kind()
        if kind in ("prim::TupleConstruct", "prim::ListConstruct") or kind in _TS_PASS:
            value = node.inputsAt(0)
            continue
        weight_v = bias_v = None
        if kind == "aten::linear":
            weight_v, bias_v = node.inputsAt(1), node.inputsAt(2)
        elif kind == "aten::addmm":
            bias_v, weight_v = node.inputsAt(0), _ts_untranspose(node.inputsAt(2))
        elif kind in ("aten::mm", "aten::matmul"):
            weight_v = _ts_untranspose(node.inputsAt(1))
        elif kind == "aten::add":
            for prod, bias in ((node.inputsAt(0), node.inputsAt(1)), (node.inputsAt(1), node.inputsAt(0))):
                if prod.node().kind() in ("aten::mm", "aten::matmul"):
                    weight_v, bias_v = _ts_untranspose(prod.node().inputsAt(1)), bias
                    break
        if weight_v is None:
            break
        key = _ts_attr_path(weight_v)
        if key is None or key not in state or state[key].dim() != 2:
            break
        bias_key = None if bias_v is None or _ts_is_none(bias_v) else _ts_attr_path(bias_v)
        if bias_key is not None and (
            bias_key not in state or tuple(state[bias_key].shape) != (state[key].shape[0],)
        ):
            bias_key = None
        return _Choice(key, bias_key, f"walked {what} back from its output to the linear op using '{key}'")
    raise _NotFound(f"{what} does not end in a linear layer")


def _ts_untranspose(value: Any) -> Any:
    node = value.node()
    if node.kind() in ("aten::t", "aten::transpose", "aten::permute", "aten::numpy_T"):
        return node.inputsAt(0)
    return None
