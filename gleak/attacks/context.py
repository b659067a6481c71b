"""The Context every attack reads: built once from model + capture (+ aux data), never from files.

It holds the last-layer view (W, b, ∇W, ∇b, C, d), the training facts the capture records (B, m, loss),
and a *gradient view*: for a gradient capture the mean-reduced gradient itself; for a one-step update the
gradient recovered as ∇ = −Δ/η (minus weight decay) — the sign flip that tools reading updates as
gradients get wrong. Model forwards on auxiliary or dummy data are cached here and shared by attacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gleak.attacks.base import Requirements
from gleak.capture import Capture, ModelCheck, check_model_hash, validate_against_model
from gleak.data import Dataset
from gleak.errors import GleakError, shorten
from gleak.io import tensors_sha256
from gleak.losses import LossSpec
from gleak.models import LastLayer, LoadedModel, find_last_layer, forward, guess_last_layer

CHUNK = 1024


@dataclass
class Context:
    capture: Capture
    layer: LastLayer
    model: nn.Module | None
    num_classes: int
    batch_size: int | None
    local_steps: int
    loss: LossSpec
    aux: Dataset | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    input_shape: tuple[int, ...] | None = None
    grad_weight: torch.Tensor | None = None  # float64 [C, d] gradient view
    grad_bias: torch.Tensor | None = None  # float64 [C]
    gradient_note: str | None = None
    no_gradient_reason: str | None = None
    no_forward_reason: str | None = None
    no_batch_forward_reason: str | None = None  # the model cannot run the client's whole batch in one forward
    model_check: ModelCheck | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return self.capture.kind

    @property
    def total_examples(self) -> int | None:
        """Labels behind the contribution: B for a gradient, m·B for an m-step update."""
        return None if self.batch_size is None else self.batch_size * self.local_steps

    # ------------------------------------------------------------------------------- requirements
    def check_requirements(self, req: Requirements) -> str | None:
        if self.kind not in req.kinds:
            return f"needs a capture of kind {' or '.join(sorted(req.kinds))}, this one is a {self.kind}"
        if req.gradient_view and self.grad_weight is None:
            return self.no_gradient_reason or "no gradient available"
        if req.needs_batch_size and self.batch_size is None:
            return "needs the batch size: the capture has no gleak.batch_size (pass --batch-size)"
        if req.single_sample and self.batch_size != 1:
            return f"single-sample attack, this batch has B = {self.batch_size}"
        if req.needs_bias and self.layer.bias_key is None:
            return f"needs a bias in the last layer; '{self.layer.name}' has none"
        if req.needs_bias and req.gradient_view and self.grad_bias is None:
            return f"needs the bias gradient '{self.layer.bias_key}', which the capture lacks"
        if req.needs_model and self.model is None:
            return "needs the global model (--model)"
        if (req.needs_model_forward or req.needs_aux) and self.no_forward_reason:
            return self.no_forward_reason
        if req.needs_batch_forward and self.no_batch_forward_reason:
            return self.no_batch_forward_reason
        if req.needs_aux and self.aux is None:
            return "needs auxiliary labelled data (--aux)"
        return None

    def soft_warnings(self, req: Requirements) -> list[str]:
        out = []
        if req.needs_nonneg_features:
            low = self.feature_min()
            if low is not None and low < -1e-6:
                out.append(f"assumes non-negative last-layer inputs (ReLU/sigmoid); this model's go down to "
                           f"{low:.3g} — results are unreliable")
        if req.gradient_view and self.gradient_note:
            out.append(self.gradient_note)
        return out

    # ------------------------------------------------------------------------------- model forwards
    def features_and_logits(self, inputs: torch.Tensor,
                            model: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Last-layer inputs h [N, d] and logits z [N, C] (eval mode, no grad, chunked), on the CPU.

        ``model`` defaults to the global model; another module of the same architecture (RLU's end model) works."""
        if self.model is None or self.no_forward_reason:
            raise GleakError(self.no_forward_reason or "needs the model (--model)")
        return forward.features_and_logits(model if model is not None else self.model, self.layer, inputs,
                                           self.device, CHUNK)

    def aux_forward(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, logits, labels) of the whole auxiliary set, computed once."""
        if "aux" not in self._cache:
            if self.aux is None:
                raise GleakError("needs auxiliary labelled data (--aux)")
            inputs, labels = self.aux.batch(range(len(self.aux)))
            h, z = self.features_and_logits(inputs)
            self._cache["aux"] = (h, z, labels)
        return self._cache["aux"]

    def predicted_class(self) -> int | None:
        """The model's prediction when a zero gradient says it already outputs the label with probability 1
        (seed 000 App. B.3): its most frequent class on the auxiliary data, else on a blank input."""
        if self.model is None or self.no_forward_reason:
            return None
        if self.aux is not None:
            logits = self.aux_forward()[1]
        else:
            logits = self.features_and_logits(self.dummy_inputs(1, "zeros", torch.Generator()))[1]
        return int(torch.bincount(logits.argmax(1), minlength=self.num_classes).argmax())

    def dummy_inputs(self, n: int, kind: str, gen: torch.Generator) -> torch.Tensor:
        """Dummy images (LLG*): 'zeros', 'ones' or 'random' U(0, 1) pixels, normalised like the data."""
        if self.input_shape is None:
            raise GleakError("needs the input shape (gleak.input_shape in the capture or a zoo model)")
        shape = (n, *self.input_shape)
        pixels = {"zeros": lambda: torch.zeros(shape), "ones": lambda: torch.ones(shape),
                  "random": lambda: torch.rand(shape, generator=gen)}[kind]()
        rng = self.pixel_range()
        return (pixels - rng[0]) / rng[1] if rng is not None else pixels

    def parameter_gradients(self) -> tuple[list[nn.Parameter], list[torch.Tensor]]:
        """The model's trainable parameters and, for each, the capture's tensor as one mean-reduced step's
        gradient (float32, on the device) — what gradient-matching reconstruction matches."""
        if self.model is None or self.no_forward_reason:
            raise GleakError(self.no_forward_reason or "needs the model (--model)")
        transform, reason = gradient_transform(self.capture, self.batch_size, self.loss)
        if transform is None:
            raise GleakError(reason or "no gradient available")
        params, grads, missing = [], [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            tensor = self.capture.tensors.get(name)
            if tensor is None:
                missing.append(name)
                continue
            params.append(param)
            grads.append(transform.apply(tensor, param.detach().cpu()).float().to(self.device))
        if missing:
            raise GleakError(f"the capture lacks the gradients of {len(missing)} model parameters "
                             f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''})")
        return params, grads

    def pixel_range(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mean, std) shaped [1, C, 1, 1] that map model inputs back to pixels, when the capture records them."""
        mean, std = self.capture.get("gleak.data.mean"), self.capture.get("gleak.data.std")
        if not mean or not std or self.input_shape is None or len(self.input_shape) != 3:
            return None
        if len(mean) != self.input_shape[0] or len(std) != self.input_shape[0]:
            return None
        return torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)

    def feature_min(self) -> float | None:
        """Smallest last-layer input seen on aux data (or random dummy images); None when no forward works."""
        if "feature_min" not in self._cache:
            value = None
            if self.model is not None and not self.no_forward_reason:
                try:
                    if self.aux is not None:
                        h = self.aux_forward()[0]
                    else:
                        probe = self.dummy_inputs(64, "random", torch.Generator().manual_seed(0))
                        h = self.features_and_logits(probe)[0]
                    value = float(h.min())
                except GleakError:
                    value = None
            self._cache["feature_min"] = value
        return self._cache["feature_min"]


@dataclass(frozen=True)
class GradientTransform:
    """How a capture's tensors become one mean-reduced step's gradient: ∇ = (−Δ/scale − wd·θ) / divisor for a
    one-step update, ∇ = tensor / divisor for a gradient (divisor = B for a sum-reduced loss, else 1)."""

    update_scale: float | None
    weight_decay: float
    divisor: int
    note: str | None

    def apply(self, tensor: torch.Tensor, param: torch.Tensor | None) -> torch.Tensor:
        g = tensor.double()
        if self.update_scale is not None:
            g = -g / self.update_scale
            if self.weight_decay and param is not None:
                g = g - self.weight_decay * param.double()
        return g / self.divisor if self.divisor != 1 else g


def gradient_transform(capture: Capture, batch_size: int | None,
                       loss: LossSpec) -> tuple[GradientTransform | None, str | None]:
    """The transform to a one-step gradient, or None and the one-line reason it does not exist."""
    scale, wd, notes = None, 0.0, []
    if capture.kind == "update":
        steps, lr = capture.local_steps, capture.learning_rate
        optimizer = capture.get("gleak.optimizer", "sgd")
        if steps > 1:
            return None, (f"needs one step's gradient; this update has {steps} local steps "
                          "(attacks for multi-step updates, such as rlu, apply)")
        if not lr:
            return None, "this update records no gleak.learning_rate, so −Δ/η cannot be formed"
        if optimizer == "adam":
            return None, "a one-step Adam update is a normalised sign, not a scaled gradient"
        scale = lr * (1 + capture.get("gleak.momentum", 0.0)) if optimizer == "nag" else lr
        wd = capture.get("gleak.weight_decay", 0.0)
        notes.append(f"update read as a gradient: ∇ = −Δ/{scale:g}" + (f" − {wd:g}·θ" if wd else ""))
    divisor = 1
    if loss.reduction == "sum":
        if not batch_size:
            return None, "sum-reduced gradient with unknown batch size"
        divisor = batch_size
        notes.append(f"sum-reduced loss: divided by B = {batch_size}")
    return GradientTransform(scale, wd, divisor, "; ".join(notes) or None), None


def _gradient_view(capture: Capture, layer: LastLayer, batch_size: int | None,
                   loss: LossSpec) -> tuple[torch.Tensor | None, torch.Tensor | None, str | None, str | None]:
    """(∇W, ∇b, note, reason-if-none) as one mean-reduced step's gradient."""
    if layer.grad_weight is None:
        return None, None, None, "the capture has no last-layer tensor"
    transform, reason = gradient_transform(capture, batch_size, loss)
    if transform is None:
        return None, None, None, reason
    gw = transform.apply(layer.grad_weight, layer.weight)
    gb = transform.apply(layer.grad_bias, layer.bias) if layer.grad_bias is not None else None
    return gw, gb, transform.note, None


def probe_input_shape(module: nn.Module, shape: tuple[int, ...]) -> None:
    """The capture's ``gleak.input_shape`` must be an input the model runs on: one forward of one example.

    Programs with a fixed graph (TorchScript, torch.export) are left to their own loaders' checks."""
    if isinstance(module, torch.jit.ScriptModule | torch.fx.GraphModule):
        return
    first = next(iter(module.parameters()), None)
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad():
            module(torch.zeros((1, *shape), dtype=dtype, device=first.device if first is not None else "cpu"))
    except Exception as exc:
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise GleakError(f"the model cannot run on the capture's gleak.input_shape {list(shape)}: "
                         f"{shorten(why, 160)}") from None
    finally:
        for m, mode in modes.items():
            m.training = mode


def build_context(capture: Capture, model: LoadedModel | None = None, aux: Dataset | None = None,
                  device: torch.device | str = "cpu", seed: int = 0, fc_layer: str | None = None,
                  batch_size: int | None = None, loss: LossSpec | None = None,
                  allow_model_mismatch: bool = False) -> Context:
    """Validate model vs capture, find the last layer, form the gradient view; attacks then read only this.

    A model whose weights differ from the capture's ``gleak.model.sha256`` is refused unless
    ``allow_model_mismatch`` (the result is recorded in ``Context.model_check``)."""
    device = torch.device(device)
    module = None
    no_forward = None
    model_check = None
    input_shape = capture.input_shape
    if model is not None:
        validate_against_model(capture, model.module)
        model_check = check_model_hash(capture, model.weights_sha256 or tensors_sha256(model.module.state_dict()),
                                       allow_model_mismatch)
        if input_shape is not None and capture.input_shape is not None:
            probe_input_shape(model.module, input_shape)
        input_shape = input_shape or model.input_shape
        layer = find_last_layer(model.module, capture.tensors, input_shape=input_shape, override=fc_layer)
        module = model.module.to(device).eval()
        no_forward = forward.forward_problem(module, layer)
    else:
        layer = guess_last_layer(capture.tensors, override=fc_layer)
        no_forward = "needs the model (--model)"
    if aux is not None and input_shape is not None and tuple(aux.input_shape) != tuple(input_shape):
        raise GleakError(f"auxiliary data has inputs {list(aux.input_shape)}, the model expects {list(input_shape)}")
    if aux is not None:
        aux.check_classes(layer.num_classes)
    history = capture.get("gleak.fl.history")
    if history is not None and len(history) != layer.num_classes:
        raise GleakError(f"metadata key 'gleak.fl.history' has {len(history)} values; the last layer has "
                         f"{layer.num_classes} classes (one history term per bias entry)")
    b = batch_size or capture.batch_size
    no_batch = forward.batch_problem(module, b) if module is not None and not no_forward else None
    loss = loss or LossSpec.from_metadata(capture.meta)
    gw, gb, note, reason = _gradient_view(capture, layer, b, loss)
    return Context(capture=capture, layer=layer, model=module, num_classes=layer.num_classes, batch_size=b,
                   local_steps=capture.local_steps, loss=loss, aux=aux, device=device, seed=seed,
                   input_shape=tuple(input_shape) if input_shape else None, grad_weight=gw, grad_bias=gb,
                   gradient_note=note, no_gradient_reason=reason, no_forward_reason=no_forward,
                   no_batch_forward_reason=no_batch, model_check=model_check)
