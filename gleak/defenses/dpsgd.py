"""DP-SGD at training time, through Opacus (Yousefpour et al., 2021): per-example gradients from Opacus's
``GradSampleModule``, clipping to C and Gaussian noise of σ = z·C from its ``DPOptimizer``, and ε from its
accountants for the given δ, sample rate and steps (Abadi et al., CCS 2016). gleak writes none of this maths
itself: :func:`dp_train` only drives Opacus over the client's batches; :func:`epsilon` asks Opacus's accountants
(RDP, and PRV where it can answer) for the privacy spent; :func:`resolve` aims at a target ε (``dpsgd:epsilon=E``)
by asking Opacus's ``get_noise_multiplier`` for the noise multiplier of the client's q and steps."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from gleak.defenses.base import Defense, DefenseOptions, register
from gleak.errors import GleakError, shorten

EPSILON_TOLERANCE = 0.01  # dpsgd:epsilon=E: Opacus's bisection stops within 1 % of E (epsilon_tolerance = 0.01·E)


class DpSgdOptions(DefenseOptions):
    noise_multiplier: float = Field(1.0, gt=0, description="z: noise std over the clipping bound (σ = z·C); not "
                                    "with epsilon")
    epsilon: float | None = Field(None, gt=0, description="a target ε instead of z: Opacus's get_noise_multiplier "
                                  "picks z for the client's q and steps (recorded ε ≤ target, within 1 %); sweep it "
                                  "with dpsgd:epsilon=0.5,1,2")
    max_grad_norm: float = Field(1.0, gt=0, description="C: each example's gradient is clipped to this L2 norm")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of the (ε, δ) guarantee")
    sample_rate: float | None = Field(None, gt=0, le=1, description="q for the accountant: B over the client's "
                                      "data size when not given")
    accountant: Literal["rdp", "prv"] = Field("rdp", description="the accountant whose ε is gleak.dp.epsilon (the "
                                              "other is recorded too where it can answer)")

    @model_validator(mode="after")
    def _one_noise_setting(self) -> DpSgdOptions:
        if self.epsilon is not None and "noise_multiplier" in self.model_fields_set:
            raise ValueError("give epsilon (a target ε: gleak picks z) or noise_multiplier (z), not both")
        return self


@register
class DpSgd(Defense):
    name = "dpsgd"
    summary = "DP-SGD while the client trains (Opacus): per-example clipping to C, Gaussian noise z·C, ε accounted"
    source = "Abadi et al. (CCS 2016), through Opacus's GradSampleModule, DPOptimizer and accountants"
    strength = "noise_multiplier"
    training = True
    kind = "training"
    also_sweeps = ("epsilon",)  # dpsgd:epsilon=0.5,1,2 sweeps the target ε instead of z
    Options: ClassVar[type[DefenseOptions]] = DpSgdOptions
    options: DpSgdOptions

    def record(self, seed: int) -> dict[str, Any]:
        """Aimed at a target ε, z is left out (the z picked is gleak.dp.noise_multiplier): rebuilt from the record,
        the defense aims at the same ε again."""
        out = super().record(seed)
        if self.options.epsilon is not None:
            out.pop("noise_multiplier", None)
        return out


def _opacus() -> Any:
    try:
        import opacus
    except ImportError:
        raise GleakError("dpsgd needs Opacus (pip install opacus)") from None
    return opacus


def check_model(model: nn.Module) -> None:
    """Opacus's own validator: a layer it cannot compute per-example gradients for (BatchNorm mixes the examples
    of a batch) is one line naming it and Opacus's fix."""
    _opacus()
    from opacus.validators import ModuleValidator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = ModuleValidator.validate(model, strict=False)
    if not errors:
        return
    norms = [(n, type(m).__name__) for n, m in model.named_modules()
             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        name, kind = norms[0]
        raise GleakError(f"Opacus cannot run DP-SGD on this model: layer '{name}' ({kind}) mixes the examples of a "
                         f"batch, so per-example gradients do not exist ({len(norms)} BatchNorm layer(s)); replace "
                         "BatchNorm by GroupNorm (Opacus's fix: opacus.validators.ModuleValidator.fix(model)) and "
                         "train that model")
    first = " ".join(str(errors[0]).split()).split(". ")[0]
    raise GleakError(f"Opacus cannot run DP-SGD on this model: {shorten(first, 200)}"
                     + (f" ({len(errors)} problems)" if len(errors) > 1 else ""))


def _generator(model: nn.Module, seed: int) -> torch.Generator:
    """The seeded generator of DP-SGD's noise, on the model's device (Opacus draws the noise where the parameters
    are: a CPU generator fails for a model on CUDA)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return torch.Generator(device=device).manual_seed(seed)


def _release(wrapped: Any) -> None:
    """Take Opacus's hooks and per-example attributes off the model again, with its public API: ``cleanup`` from
    Opacus 1.6, ``remove_hooks`` and ``del_grad_sample`` before."""
    cleanup = getattr(wrapped, "cleanup", None)
    if callable(cleanup):
        cleanup()
        return
    wrapped.remove_hooks()
    wrapped.del_grad_sample()


def dp_train(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
             make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], options: DpSgdOptions,
             reduction: str, seed: int, gradient_only: bool) -> dict[str, torch.Tensor] | None:
    """Train ``model`` in place on ``batches`` with DP-SGD. With ``gradient_only`` (FedSGD), take one step's
    privatised gradient instead (returned by parameter name; the model is not stepped)."""
    _opacus()
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    check_model(model)
    expected = int(batches[0][0].shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's notices about secure RNG and hooks
        wrapped = GradSampleModule(model, loss_reduction=reduction)
        optimizer = DPOptimizer(make_optimizer(list(model.parameters())), noise_multiplier=options.noise_multiplier,
                                max_grad_norm=options.max_grad_norm, expected_batch_size=expected,
                                loss_reduction=reduction, generator=_generator(model, seed))
        try:
            for inputs, targets in batches:
                optimizer.zero_grad(set_to_none=True)
                torch.autograd.backward(loss_fn(wrapped(inputs), targets))  # loss.backward(), typed
                if gradient_only:
                    optimizer.pre_step()  # clip per example, add the noise, average: p.grad is what is shared
                    return {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().clone()
                            for n, p in model.named_parameters()}
                optimizer.step()
        finally:
            _release(wrapped)
    return None


def noise_multiplier_for(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                         accountant: str = "rdp") -> float:
    """The noise multiplier z that spends at most ``target_epsilon`` at ``delta`` over ``steps`` steps at sample
    rate ``sample_rate``: Opacus's own ``get_noise_multiplier`` (its bisection, to within
    :data:`EPSILON_TOLERANCE` of the target)."""
    _opacus()
    from opacus.accountants.utils import get_noise_multiplier

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                              sample_rate=sample_rate, steps=steps, accountant=accountant,
                                              epsilon_tolerance=EPSILON_TOLERANCE * target_epsilon))
    except ValueError as e:  # "The privacy budget is too low."
        raise GleakError(f"--defense dpsgd:epsilon={target_epsilon:g}: Opacus finds no noise multiplier for it at "
                         f"δ = {delta:g}, q = {sample_rate:g}, {steps} step(s) ({shorten(str(e), 80)}); aim at a "
                         "larger ε") from None


def resolve(options: DpSgdOptions, sample_rate: float, steps: int) -> DpSgdOptions:
    """``options`` with the noise multiplier DP-SGD runs with: as given, or — aimed at ``epsilon`` — the one
    :func:`noise_multiplier_for` picks for this q and these steps (``epsilon`` kept: it is the target)."""
    if options.epsilon is None:
        return options
    z = noise_multiplier_for(options.epsilon, options.delta, sample_rate, steps, options.accountant)
    return options.model_copy(update={"noise_multiplier": z})


def epsilon(options: DpSgdOptions, sample_rate: float, steps: int) -> dict[str, Any]:
    """ε for (z, q, steps, δ) from Opacus's RDP accountant, and its PRV accountant where it can answer; the keys
    gleak.dp.* record, so that anyone can recompute them (with a target ε, ``gleak.dp.target_epsilon`` too;
    ``options`` as :func:`resolve` gives them)."""
    _opacus()
    from opacus.accountants import PRVAccountant, RDPAccountant

    out: dict[str, Any] = {"gleak.dp.delta": options.delta, "gleak.dp.noise_multiplier": options.noise_multiplier,
                           "gleak.dp.max_grad_norm": options.max_grad_norm, "gleak.dp.sample_rate": sample_rate,
                           "gleak.dp.steps": steps, "gleak.dp.accountant": options.accountant}
    if options.epsilon is not None:
        out["gleak.dp.target_epsilon"] = options.epsilon
    values: dict[str, float | None] = {}
    for name, cls in (("rdp", RDPAccountant), ("prv", PRVAccountant)):
        accountant = cls()
        accountant.history = [(options.noise_multiplier, sample_rate, steps)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values[name] = float(accountant.get_epsilon(delta=options.delta))
        except Exception:  # PRV cannot bound every setting (e.g. z = 0 or tiny δ): RDP still answers
            values[name] = None
    chosen = values.get(options.accountant)
    if chosen is None:
        raise GleakError(f"Opacus's {options.accountant.upper()} accountant cannot give ε for z = "
                         f"{options.noise_multiplier:g}, q = {sample_rate:g}, {steps} steps, δ = {options.delta:g}")
    out["gleak.dp.epsilon"] = chosen
    if values.get("rdp") is not None:
        out["gleak.dp.epsilon_rdp"] = values["rdp"]
    if values.get("prv") is not None:
        out["gleak.dp.epsilon_prv"] = values["prv"]
    return out
