"""The Context every attack reads: built once from model + capture (+ aux data), never from files.

It holds the last-layer view (W, b, ∇W, ∇b, C, d), the training facts the capture records (B, m, loss),
and a *gradient view*: for a gradient capture the mean-reduced gradient itself; for a one-step update the
gradient recovered as ∇ = −Δ/η (minus weight decay) — the sign flip that tools reading updates as
gradients get wrong. Model forwards on auxiliary or dummy data are cached here and shared by attacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from gleak.attacks.requirements import Requirements
from gleak.attacks.tokens.adapters import lora_factors
from gleak.attacks.tokens.view import POSITION_NAMES, TextModelSpec, TokenView, is_lora_only, token_view
from gleak.capture import Capture, ModelCheck, check_model_hash, validate_against_model
from gleak.data.images import Dataset
from gleak.errors import GleakError, shorten
from gleak.io import tensors_sha256
from gleak.losses import LossSpec
from gleak.models import LastLayer, LoadedModel, find_last_layer, forward, guess_last_layer
from gleak.models.modes import batch_norm_layers, batch_statistics, fixed_mode_reason
from gleak.timebox import Deadline

CHUNK = 1024
NOT_TEXT = "needs a language model's capture (token batches); this capture is not one"
DUMMY_CHUNK_BYTES = 128 * 2**20  # dummy images drawn and run at once (LLG*)
INPUT_CHUNK_BYTES = 128 * 2**20  # inputs fetched and run at once (auxiliary data, any forward)


@dataclass(kw_only=True)
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
    batch_stats: bool = False  # BatchNorm normalises with batch statistics, as in the client's train-mode step
    mode_note: str | None = None  # which mode the model runs in, and why (shown in every report)
    no_batch_forward_reason: str | None = None  # the model cannot run the client's whole batch in one forward
    model_check: ModelCheck | None = None
    max_memory: int | None = None  # bytes an attack may add; one that needs more is skipped (--max-memory)
    text_model: TextModelSpec | None = None  # a language model's capture: what the token attacks read
    deadline: Deadline | None = None  # when the attacks on this context must stop (gleak.timebox; run_attack)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return self.capture.kind

    def model_mode(self) -> dict[str, Any] | None:
        """Which mode the model runs in, as reports record it (None without a model)."""
        if self.mode_note is None:
            return None
        return {"batch_statistics": self.batch_stats, "note": self.mode_note}

    @property
    def total_examples(self) -> int | None:
        """Labels behind the contribution: B for a gradient, m·B for an m-step update."""
        return None if self.batch_size is None else self.batch_size * self.local_steps

    # ------------------------------------------------------------------------------- required inputs
    # An attack's Requirements (checked before it runs) guarantee what it reads; these return the value with its
    # Optional narrowed, or raise the same one-line GleakError check_requirements would give.
    def require_grad_weight(self) -> torch.Tensor:
        """The gradient view ∇W [C, d] (float64)."""
        if self.grad_weight is None:
            raise GleakError(self.no_gradient_reason or "needs the last layer's weight gradient")
        return self.grad_weight

    def require_grad_bias(self) -> torch.Tensor:
        """The gradient view ∇b [C] (float64)."""
        if self.grad_bias is None:
            raise GleakError(f"needs the last layer's bias gradient '{self.layer.bias_key}', which the capture lacks")
        return self.grad_bias

    def require_bias(self) -> torch.Tensor:
        """The last layer's bias b [C] (the parameter, not its gradient)."""
        if self.layer.bias is None:
            raise GleakError(f"needs a bias in the last layer; '{self.layer.name}' has none")
        return self.layer.bias

    def require_model(self) -> nn.Module:
        if self.model is None:
            raise GleakError("needs the global model (--model)")
        return self.model

    def require_batch_size(self) -> int:
        if self.batch_size is None:
            raise GleakError("needs the batch size: the capture has no gleak.batch_size (pass --batch-size)")
        return self.batch_size

    def aux_problem(self, aux: Dataset) -> str | None:
        """Why ``aux`` cannot serve this capture's model (input shape, classes), or None: the checks
        :func:`build_context` makes."""
        return aux_problem(aux, self.input_shape, self.num_classes)

    def with_aux(self, aux: Dataset, forward_cache: dict[str, Any] | None = None) -> Context:
        """This context with ``aux`` attached (checked as :func:`build_context` checks it). ``forward_cache``
        (kept by the caller) shares the model's forwards of ``aux`` between contexts of the same model weights,
        aux data and forward mode; by default this context gets a fresh one."""
        problem = self.aux_problem(aux)
        if problem:
            raise GleakError(problem)
        return replace(self, aux=aux, _cache={} if forward_cache is None else forward_cache)

    def sharing(self, what: str, *, fraction: float | None = None, seconds: float | None = None) -> Context:
        """This context with a share of its deadline for ``what`` (:meth:`gleak.timebox.Deadline.share`; the same
        cached forwards); itself when it has no deadline."""
        if self.deadline is None:
            return self
        return replace(self, deadline=self.deadline.share(what, fraction=fraction, seconds=seconds))

    def require_aux(self) -> Dataset:
        if self.aux is None:
            raise GleakError("needs auxiliary labelled data (--aux)")
        return self.aux

    def require_input_shape(self) -> tuple[int, ...]:
        if self.input_shape is None:
            raise GleakError("needs the input shape (gleak.input_shape in the capture, or a zoo model)")
        return self.input_shape

    def require_tokens(self) -> TokenView:
        """The token attacks' view of a text capture (:func:`gleak.attacks.tokens.view.token_view`), found once."""
        if self.text_model is None:
            raise GleakError(NOT_TEXT)
        if "tokens" not in self._cache:
            self._cache["tokens"] = token_view(self.capture.tensors, self.text_model)
        view: TokenView = self._cache["tokens"]
        return view

    # ------------------------------------------------------------------------------- requirements
    def check_requirements(self, req: Requirements) -> str | None:
        if req.needs_text and self.text_model is None:
            return NOT_TEXT
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
        """Last-layer inputs h [N, d] and logits z [N, C] (no grad, chunked), on the CPU, in the client's mode.

        ``model`` defaults to the global model; another module of the same architecture (RLU's end model) works.
        When the client trained with BatchNorm in train mode (:attr:`batch_stats`), the inputs are run in shuffled
        batches of exactly the client's B (the last one filled up with examples from the start), so that every
        example is normalised by the statistics of a batch like the client's, not by running averages."""
        return self._forward(lambda idx: inputs[idx], len(inputs), model)

    def _forward(self, fetch: Callable[[torch.Tensor], torch.Tensor], n: int,
                 model: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`features_and_logits` of the ``n`` inputs ``fetch(indices)`` returns, fetched and run a chunk at a
        time (about :data:`INPUT_CHUNK_BYTES` of inputs) and written into the outputs in place, so that neither all
        the inputs nor a second copy of the outputs is ever held."""
        if self.model is None or self.no_forward_reason:
            raise GleakError(self.no_forward_reason or "needs the model (--model)")
        model = model if model is not None else self.model
        if n == 0:
            return forward.features_and_logits(model, self.layer, fetch(torch.arange(0)), self.device, CHUNK)
        per_input = 4 * int(torch.Size(self.input_shape).numel()) if self.input_shape else 4096
        rows = max(1, INPUT_CHUNK_BYTES // per_input)
        out_h: torch.Tensor | None = None
        out_z: torch.Tensor | None = None

        def store(where: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> None:
            nonlocal out_h, out_z
            if out_h is None or out_z is None:
                out_h = torch.empty((n, *h.shape[1:]), dtype=h.dtype)
                out_z = torch.empty((n, *z.shape[1:]), dtype=z.dtype)
            out_h[where], out_z[where] = h, z

        if not self.batch_stats or not self.batch_size:
            step = max(CHUNK, rows // CHUNK * CHUNK) if rows >= CHUNK else rows
            for first in range(0, n, step):
                where = torch.arange(first, min(n, first + step))
                h, z = forward.features_and_logits(model, self.layer, fetch(where), self.device, min(CHUNK, step))
                store(where, h, z)
        else:  # shuffled batches of exactly the client's B, the last one filled up from the start
            b = self.batch_size
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
            padded = torch.cat([order, order.repeat(-(-b // n))[: (-n) % b]]) if n % b else order
            with batch_statistics(model):
                for first in range(0, len(padded), b):
                    h, z = forward.features_and_logits(model, self.layer, fetch(padded[first:first + b]),
                                                       self.device, b)
                    keep = min(b, n - first)  # the rows past n repeat examples already stored
                    if keep > 0:
                        store(padded[first:first + keep], h[:keep], z[:keep])
        assert out_h is not None and out_z is not None
        return out_h, out_z

    def aux_forward_bytes(self) -> int:
        """Memory the auxiliary forward will take (features and logits of every aux example, float32); 0 when it
        is already held."""
        if self.aux is None or "aux" in self._cache:
            return 0
        inputs = 4 * len(self.aux) * int(torch.Size(self.input_shape or (1,)).numel())
        return 4 * len(self.aux) * (self.layer.feature_dim + self.num_classes) + min(inputs, INPUT_CHUNK_BYTES)

    def aux_forward(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, logits, labels) of the whole auxiliary set, computed once."""
        if "aux" not in self._cache:
            if self.aux is None:
                raise GleakError("needs auxiliary labelled data (--aux)")
            aux = self.aux
            h, z = self._forward(lambda idx: aux.batch(idx)[0], len(aux))
            self._cache["aux"] = (h, z, aux.labels.clone())
        cached: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = self._cache["aux"]
        return cached

    def predicted_class(self) -> int | None:
        """The model's prediction when a zero gradient says it already outputs the label with probability 1
        (Wang, Liang & He, ICLR 2024, App. B.3): its most frequent class on the auxiliary data, else on a blank
        input."""
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

    def dummy_forward(self, n: int, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Σ_k h_nk [n] (float64) and logits [n, C] of ``n`` dummy images (:meth:`dummy_inputs`), without ever
        holding all the images or their features: drawn and run in chunks of about :data:`DUMMY_CHUNK_BYTES` when
        they are larger than that (one draw otherwise, so that small runs keep their random stream)."""
        shape = self.require_input_shape()
        per_image = 4 * int(torch.Size(shape).numel())
        if n * per_image <= DUMMY_CHUNK_BYTES:
            h, z = self.features_and_logits(self.dummy_inputs(n, kind, gen))
            return h.double().sum(1), z
        step = max(1, DUMMY_CHUNK_BYTES // per_image)
        if self.batch_stats and self.batch_size:  # BatchNorm on batch statistics: whole client batches per chunk
            step = max(self.batch_size, step // self.batch_size * self.batch_size)
        sums, logits = [], []
        for first in range(0, n, step):
            h, z = self.features_and_logits(self.dummy_inputs(min(step, n - first), kind, gen))
            sums.append(h.double().sum(1))
            logits.append(z)
        return torch.cat(sums), torch.cat(logits)

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
        feature_min: float | None = self._cache["feature_min"]
        return feature_min


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
        scale = lr * (1 + capture.value("gleak.momentum")) if optimizer == "nag" else lr
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


def aux_problem(aux: Dataset, input_shape: tuple[int, ...] | None, num_classes: int) -> str | None:
    """Why auxiliary data ``aux`` cannot serve a model with ``input_shape`` and ``num_classes``, or None."""
    if input_shape is not None and tuple(aux.input_shape) != tuple(input_shape):
        return f"auxiliary data has inputs {list(aux.input_shape)}, the model expects {list(input_shape)}"
    try:
        aux.check_classes(num_classes)
    except GleakError as e:
        return str(e)
    return None


def build_context(capture: Capture, model: LoadedModel | None = None, aux: Dataset | None = None,
                  device: torch.device | str = "cpu", seed: int = 0, fc_layer: str | None = None,
                  batch_size: int | None = None, loss: LossSpec | None = None,
                  allow_model_mismatch: bool = False, max_memory: int | None = None) -> Context:
    """Validate model vs capture, find the last layer, form the gradient view; attacks then read only this.

    A model whose weights differ from the capture's ``gleak.model.sha256`` is refused unless
    ``allow_model_mismatch`` (the result is recorded in ``Context.model_check``). A language model's capture
    (``gleak.modality`` text) gets :func:`build_text_context`."""
    if capture.get("gleak.modality") == "text":
        if model is None:
            raise GleakError("a language model's capture needs its model: --model DIR (the Hugging Face folder)")
        return build_text_context(capture, model, seed=seed, allow_model_mismatch=allow_model_mismatch,
                                  max_memory=max_memory)
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
        layer = guess_last_layer(capture.tensors, override=fc_layer, num_classes=capture.num_classes)
        no_forward = "needs the model (--model)"
    recorded = capture.num_classes
    if recorded is not None and recorded != layer.num_classes:
        raise GleakError(f"the capture records gleak.num_classes = {recorded}, but the last layer "
                         f"'{layer.name}' has {layer.num_classes} outputs: a different model, or a wrong "
                         "--fc-layer")
    problem = aux_problem(aux, input_shape, layer.num_classes) if aux is not None else None
    if problem:
        raise GleakError(problem)
    history = capture.get("gleak.fl.history")
    if history is not None and len(history) != layer.num_classes:
        raise GleakError(f"metadata key 'gleak.fl.history' has {len(history)} values; the last layer has "
                         f"{layer.num_classes} classes (one history term per bias entry)")
    b = batch_size or capture.batch_size
    no_batch = forward.batch_problem(module, b) if module is not None and not no_forward else None
    batch_stats, mode_note = _client_mode(capture, module)
    loss = loss or LossSpec.from_metadata(capture.meta)
    gw, gb, note, reason = _gradient_view(capture, layer, b, loss)
    return Context(capture=capture, layer=layer, model=module, num_classes=layer.num_classes, batch_size=b,
                   local_steps=capture.local_steps, loss=loss, aux=aux, device=device, seed=seed,
                   input_shape=tuple(input_shape) if input_shape else None, grad_weight=gw, grad_bias=gb,
                   gradient_note=note, no_gradient_reason=reason, no_forward_reason=no_forward,
                   no_batch_forward_reason=no_batch, model_check=model_check, batch_stats=batch_stats,
                   mode_note=mode_note, max_memory=max_memory)


def _client_mode(capture: Capture, module: nn.Module | None) -> tuple[bool, str | None]:
    """Whether attacks run BatchNorm with batch statistics (the client's train mode), and the note that says so.

    ``gleak.model.train_mode`` is honoured; a capture without it is read as train mode, as clients train."""
    if module is None:
        return False, None
    layers = batch_norm_layers(module)
    recorded = capture.get("gleak.model.train_mode")
    train = True if recorded is None else bool(recorded)
    source = "as the capture records" if recorded is not None else "gleak.model.train_mode not recorded: assumed"
    if not layers:
        fixed = fixed_mode_reason(module)
        if train and fixed:
            return False, f"train mode requested ({source}), but {fixed}; BatchNorm uses its running averages"
        return False, (f"{'train' if train else 'eval'} mode ({source}); no BatchNorm layers, so both modes give "
                       "the same forward pass (dropout off)")
    if not train:
        return False, f"eval mode ({source}): BatchNorm uses its running averages"
    return True, (f"train mode ({source}): BatchNorm uses the statistics of each batch of B = "
                  f"{capture.batch_size or '?'}; dropout off")


def _meta_int(capture: Capture, model: LoadedModel, key: str) -> int | None:
    """An integer the capture records, else the one the model folder describes (None when neither does)."""
    value = capture.get(key)
    if value is None:
        value = model.metadata.get(key)
    return None if value is None else int(value)


def build_text_context(capture: Capture, model: LoadedModel, *, seed: int = 0, allow_model_mismatch: bool = False,
                       max_memory: int | None = None) -> Context:
    """The context of a language model's capture: the model checked against it (tensor names and shapes, the
    weights' hash), and the plain description the token attacks read (:class:`TextModelSpec`). The label view is
    the output layer (the LM head, or the embedding it is tied to) without a gradient view: the image-classifier
    label attacks report that they do not apply."""
    if model.metadata.get("gleak.modality") != "text":
        raise GleakError(f"this is a language model's capture, but the model ({model.source}) is not a Hugging Face "
                         "model folder: give --model DIR, the folder the capture was made with")
    if is_lora_only(capture.tensors):
        lora_factors(capture.tensors, model.module)  # each adapted module exists in the base model, shapes fit
    else:
        validate_against_model(capture, model.module)
    model_check = check_model_hash(capture, model.weights_sha256 or tensors_sha256(model.module.state_dict()),
                                   allow_model_mismatch)
    task = str(capture.get("gleak.task") or model.metadata.get("gleak.task") or "causal_lm")
    embeddings: Any = model.module.get_input_embeddings()  # type: ignore[operator]
    vocab, hidden = int(embeddings.weight.shape[0]), int(embeddings.weight.shape[1])
    names = [name for name, _ in model.module.named_parameters()]
    learned_positions = any(n.endswith(POSITION_NAMES) for n in names)  # the names token_view looks for
    lr = capture.get("gleak.learning_rate")
    spec = TextModelSpec(
        model_type=str(model.metadata.get("gleak.model_type", "?")), vocab_size=vocab, hidden_size=hidden,
        tie_word_embeddings=model.metadata.get("gleak.tie_word_embeddings") == "true",
        n_positions=_meta_int(capture, model, "gleak.max_positions") if learned_positions else None,
        pad_token_id=_meta_int(capture, model, "gleak.pad_token_id"),
        bos_token_id=_meta_int(capture, model, "gleak.bos_token_id"),
        eos_token_id=_meta_int(capture, model, "gleak.eos_token_id"),
        task="sequence_classification" if task == "sequence_classification" else "causal_lm",
        kind="update" if capture.kind == "update" else "gradient", local_steps=capture.local_steps,
        learning_rate=None if lr is None else float(lr), batch_size=capture.batch_size,
        max_length=_meta_int(capture, model, "gleak.max_length"))
    head: Any = model.module.get_output_embeddings() if task == "causal_lm" else None  # type: ignore[operator]
    weight = (head.weight if head is not None else embeddings.weight).detach()
    layer = LastLayer(name="lm_head", weight_key="lm_head.weight", bias_key=None, weight=weight, bias=None,
                      grad_weight=None, grad_bias=None, num_classes=int(weight.shape[0]), feature_dim=hidden,
                      reason="a language model's output layer (the token attacks read the capture's tensors)")
    return Context(capture=capture, layer=layer, model=model.module, num_classes=int(weight.shape[0]),
                   batch_size=capture.batch_size, local_steps=capture.local_steps,
                   loss=LossSpec(), seed=seed, model_check=model_check, max_memory=max_memory, text_model=spec,
                   no_gradient_reason="a language model's capture: the label attacks of image classifiers do not "
                                      "apply (the token attacks do: gleak labels runs them)",
                   no_forward_reason="a language model's capture")
