"""A federated client simulated on real data: one FedSGD gradient or m local steps, written as a capture.

Batches follow the papers' protocols (docs/methods/fl-updates.md#simulate): every local step draws a fresh
batch (Chen & Vikalo, ICML 2024, §3.2.2); batch labels are ``uniform`` (each label uniform over the classes
present), ``unique`` (B distinct classes), ``unbalanced`` (Wainakh et al., PoPETs 2022 — preprint §6.1: 50 %
one class, 25 % a second, 25 % uniform), ``dirichlet`` (Chen & Vikalo, ICML 2024, §4.1 / App. B.5:
the client is one of 10 whose per-class shares are Dir(α), so its class weights are Beta(α, 9α) draws and
its labels are drawn i.i.d. from them, the same weights for all its local steps) or ``explicit``. Mixup mixes
each example with one of a different class, x = r·x_a + (1 − r)·x_b and y = r·e_a + (1 − r)·e_b, with r fixed
or drawn from U(0, 1) (Wang, Liang & He, ICLR 2024, §4.3). The same seed gives bit-for-bit the same capture
on the same machine.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from gleak.capture import OPTIMIZERS, Capture, Truth, capture_gradients, capture_update
from gleak.data.images import Dataset
from gleak.defenses import Defense, apply_defenses
from gleak.defenses.dpsgd import DpSgdOptions, dp_train, epsilon, resolve
from gleak.errors import GleakError
from gleak.losses import LossSpec, client_loss, soft_targets

SCHEMES = ("fedsgd", "fedavg", "fedprox")
COMPOSITIONS = ("uniform", "unique", "unbalanced", "dirichlet", "explicit")
DIRICHLET_CLIENTS = 10
MAX_HELD_VALUES = 1 << 28  # input values (float32: 1 GiB) a simulation keeps for its m·B examples


@dataclass(kw_only=True, frozen=True)
class ClientConfig:
    """What the client does. ``scheme='fedsgd'`` shares one gradient; the others share θ_local − θ_global."""

    batch_size: int = 8
    local_steps: int = 1
    scheme: str = "fedsgd"
    learning_rate: float = 0.01
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    mu: float = 0.0
    loss: LossSpec = field(default_factory=LossSpec)
    mixup: bool = False
    mixup_ratio: float | None = None
    composition: str = "uniform"
    labels: tuple[int, ...] | None = None
    dirichlet_alpha: float = 0.5
    train_mode: bool = True
    seed: int = 0
    defenses: tuple[Defense, ...] = ()  # applied by the client: DP-SGD while it trains, the others to what it sends

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise GleakError(f"unknown FL scheme '{self.scheme}'; simulate supports {', '.join(SCHEMES)}")
        if self.optimizer not in OPTIMIZERS:
            raise GleakError(f"unknown optimizer '{self.optimizer}'; choose one of {', '.join(OPTIMIZERS)}")
        if self.composition not in COMPOSITIONS:
            raise GleakError(f"unknown batch composition '{self.composition}'; choose {', '.join(COMPOSITIONS)}")
        if self.batch_size < 1 or self.local_steps < 1:
            raise GleakError("batch size and local steps must be ≥ 1")
        if self.scheme == "fedsgd" and self.local_steps != 1:
            raise GleakError("FedSGD shares one gradient: use --local-steps 1, or --scheme fedavg for local steps")
        if self.scheme == "fedprox" and self.mu <= 0:
            raise GleakError("FedProx needs a proximal weight --mu > 0")
        if self.learning_rate <= 0:
            raise GleakError("learning rate must be > 0")
        if self.dirichlet_alpha <= 0:
            raise GleakError(f"the Dirichlet concentration must be > 0, got {self.dirichlet_alpha}")
        if self.mixup_ratio is not None and not 0 <= self.mixup_ratio <= 1:
            raise GleakError(f"mixup ratio must be in [0, 1], got {self.mixup_ratio}")
        if self.composition == "explicit":
            if not self.labels:
                raise GleakError("composition 'explicit' needs --labels")
            if len(self.labels) not in (self.batch_size, self.batch_size * self.local_steps):
                raise GleakError(f"--labels gives {len(self.labels)} labels; expected B = {self.batch_size} "
                                 f"or m·B = {self.batch_size * self.local_steps}")

    @property
    def kind(self) -> str:
        return "gradient" if self.scheme == "fedsgd" else "update"


@dataclass
class _Batch:
    inputs: torch.Tensor
    targets: torch.Tensor  # int64 [B] or float [B, C] (mixup)


class _Sampler:
    """Draws batches of the requested label composition from a dataset with its own generator."""

    def __init__(self, data: Dataset, config: ClientConfig, num_classes: int) -> None:
        self.data = data
        self.config = config
        self.num_classes = num_classes
        self.by_class = data.indices_by_class()
        self.present = torch.tensor(sorted(self.by_class))
        if int(self.present.max()) >= num_classes:
            raise GleakError(f"the data has label {int(self.present.max())} but the model has {num_classes} classes")
        self.gen = torch.Generator().manual_seed(config.seed)
        if config.composition == "unique" and config.batch_size > len(self.present):
            raise GleakError(f"a unique-label batch of {config.batch_size} needs that many classes; "
                             f"the data has {len(self.present)}")
        if config.composition == "dirichlet":
            rng = np.random.default_rng(config.seed)
            a = config.dirichlet_alpha
            g1 = rng.gamma(a, size=len(self.present))
            g2 = rng.gamma((DIRICHLET_CLIENTS - 1) * a, size=len(self.present))
            weights = g1 / (g1 + g2)
            self.class_weights = torch.from_numpy(weights / weights.sum())
        if config.composition == "explicit":
            missing = sorted({c for c in config.labels or () if c not in self.by_class})
            if missing:
                raise GleakError(f"--labels names classes with no examples in the data: {missing}")

    def _choice(self, n: int, pool: torch.Tensor) -> torch.Tensor:
        return pool[torch.randint(len(pool), (n,), generator=self.gen)]

    def labels(self, step: int) -> torch.Tensor:
        cfg, b = self.config, self.config.batch_size
        if cfg.composition == "uniform":
            return self._choice(b, self.present)
        if cfg.composition == "dirichlet":
            picks = torch.multinomial(self.class_weights, b, replacement=True, generator=self.gen)
            return self.present[picks]
        if cfg.composition == "unique":
            return self.present[torch.randperm(len(self.present), generator=self.gen)[:b]]
        if cfg.composition == "unbalanced":
            order = self.present[torch.randperm(len(self.present), generator=self.gen)]
            first, second = order[0], order[1 % len(order)]
            n1, n2 = b // 2, b // 4
            rest = self._choice(b - n1 - n2, self.present)
            labels = torch.cat([first.repeat(n1), second.repeat(n2), rest])
            return labels[torch.randperm(b, generator=self.gen)]
        given = torch.tensor(cfg.labels, dtype=torch.long)
        return given if len(given) == b else given[step * b:(step + 1) * b]

    def example(self, label: int) -> int:
        pool = self.by_class[label]
        return int(pool[torch.randint(len(pool), (1,), generator=self.gen)])

    def batch(self, step: int) -> _Batch:
        labels = self.labels(step)
        idx = [self.example(int(c)) for c in labels]
        inputs, _ = self.data.batch(idx)
        if not self.config.mixup:
            return _Batch(inputs, labels.long())
        if len(self.present) < 2:
            raise GleakError("mixup needs at least two classes in the data")
        partners, ratios = [], []
        for c in labels.tolist():
            others = self.present[self.present != c]
            partners.append(int(self._choice(1, others)))
            ratios.append(self.config.mixup_ratio if self.config.mixup_ratio is not None
                          else float(torch.rand((), generator=self.gen)))
        other_inputs, _ = self.data.batch([self.example(p) for p in partners])
        r = torch.tensor(ratios, dtype=inputs.dtype)
        mixed = r.view(-1, 1, 1, 1) * inputs + (1 - r.view(-1, 1, 1, 1)) * other_inputs
        y = r.view(-1, 1) * soft_targets(labels, self.num_classes) + (1 - r.view(-1, 1)) * soft_targets(
            torch.tensor(partners), self.num_classes)
        return _Batch(mixed, y)


def local_optimizer(params: list[nn.Parameter], cfg: ClientConfig) -> torch.optim.Optimizer:
    """The client's local optimizer (SGD, with momentum or Nesterov, or Adam) over ``params``, as ``cfg`` asks."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    momentum = cfg.momentum if cfg.optimizer in ("sgdm", "nag") else 0.0
    return torch.optim.SGD(params, lr=cfg.learning_rate, momentum=momentum, nesterov=cfg.optimizer == "nag",
                           weight_decay=cfg.weight_decay)


def _metadata(cfg: ClientConfig, data: Dataset, num_classes: int) -> dict[str, Any]:
    meta = {
        "gleak.batch_size": cfg.batch_size, "gleak.num_examples": cfg.batch_size * cfg.local_steps,
        "gleak.local_steps": cfg.local_steps, "gleak.learning_rate": cfg.learning_rate,
        "gleak.optimizer": cfg.optimizer, "gleak.weight_decay": cfg.weight_decay,
        "gleak.fl.scheme": cfg.scheme, "gleak.num_classes": num_classes,
        "gleak.input_shape": list(data.input_shape), "gleak.data.mean": list(data.mean),
        "gleak.data.std": list(data.std), "gleak.model.train_mode": cfg.train_mode,
        "gleak.batch.composition": (f"dirichlet({cfg.dirichlet_alpha:g})" if cfg.composition == "dirichlet"
                                    else cfg.composition), "gleak.seed": cfg.seed,
        "gleak.mixup": {"ratio": cfg.mixup_ratio} if cfg.mixup else None,
        **cfg.loss.metadata(),
    }
    if cfg.optimizer in ("sgdm", "nag"):
        meta["gleak.momentum"] = cfg.momentum
    if cfg.scheme == "fedprox":
        meta["gleak.fl.mu"] = cfg.mu
    return {k: v for k, v in meta.items() if v is not None}


def _dp_train(local: nn.Module, batches: list[_Batch], config: ClientConfig, options: DpSgdOptions,
              device: torch.device, gradient_only: bool) -> dict[str, torch.Tensor] | None:
    """DP-SGD over the client's batches (:func:`gleak.defenses.dpsgd.dp_train`) with ``options`` resolved
    (:func:`gleak.defenses.dpsgd.resolve`); FedProx's proximal term and mixup are not supported with it."""
    if config.scheme == "fedprox":
        raise GleakError("dpsgd with FedProx is not supported: use --scheme fedavg or fedsgd")
    pairs = [(b.inputs.to(device), b.targets.to(device)) for b in batches]
    return dp_train(local, pairs, lambda params: local_optimizer(params, config),
                    lambda logits, targets: client_loss(logits, targets, config.loss), options,
                    config.loss.reduction, config.seed, gradient_only)


def simulate_client(model: nn.Module, data: Dataset, config: ClientConfig,
                    device: torch.device | str = "cpu") -> tuple[Capture, Truth]:
    """Run the client on ``data`` starting from ``model`` (left unchanged); return capture and truth."""
    device = torch.device(device)
    if config.batch_size > len(data):
        raise GleakError(f"a batch of {config.batch_size} examples needs at least that many; the data has {len(data)}")
    held = config.batch_size * config.local_steps * math.prod(data.input_shape)
    if held > MAX_HELD_VALUES:
        raise GleakError(f"{config.local_steps} steps × B = {config.batch_size} hold {held:,} input values "
                         f"(the capture's ground truth keeps every example); at most {MAX_HELD_VALUES:,} are allowed")
    global_model = copy.deepcopy(model).to(device)
    try:
        with torch.no_grad():
            probe = global_model.eval()(data.batch([0])[0].to(device))
    except Exception as exc:
        why = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise GleakError(f"the model cannot run on the data's inputs {list(data.input_shape)}: {why[:160]}") from None
    if probe.dim() != 2:
        raise GleakError(f"the model's output has shape {list(probe.shape)}; expected [N, classes]")
    num_classes = int(probe.shape[1])
    sampler = _Sampler(data, config, num_classes)
    torch.manual_seed(config.seed)  # dropout and other stochastic layers
    meta = _metadata(config, data, num_classes)
    batches = [sampler.batch(step) for step in range(config.local_steps)]

    training = [d for d in config.defenses if d.training]
    if len(training) > 1:
        raise GleakError("give one training-time defense (dpsgd) at most")
    dp = training[0] if training else None
    dp_options: DpSgdOptions | None = None
    rate = 1.0
    if dp is not None:  # z as given, or picked for a target ε at this client's q and steps, before training
        given: DpSgdOptions = dp.options  # type: ignore[assignment]
        rate = given.sample_rate or min(1.0, config.batch_size / len(data))
        dp_options = resolve(given, rate, config.local_steps)
    if config.kind == "gradient":
        global_model.train(config.train_mode)
        b = batches[0]
        capture = capture_gradients(global_model, b.inputs.to(device), b.targets.to(device), config.loss, meta)
        if dp_options is not None:
            local = copy.deepcopy(global_model).train(config.train_mode)
            capture.tensors.update(_dp_train(local, batches, config, dp_options, device, gradient_only=True) or {})
    elif dp_options is not None:
        local = copy.deepcopy(global_model).train(config.train_mode)
        _dp_train(local, batches, config, dp_options, device, gradient_only=False)
        buffers = [n for n, _ in local.named_buffers()]
        capture = capture_update(global_model.state_dict(), local.state_dict(), config.learning_rate,
                                 config.local_steps, config.batch_size, buffers,
                                 {"gleak.kind": "update", **meta})
        capture.tensors = {k: v.cpu() for k, v in capture.tensors.items()}
    else:
        local = copy.deepcopy(global_model).train(config.train_mode)
        anchor = [p.detach().clone() for p in global_model.parameters()]
        opt = local_optimizer(list(local.parameters()), config)
        for b in batches:
            opt.zero_grad(set_to_none=True)
            loss = client_loss(local(b.inputs.to(device)), b.targets.to(device), config.loss)
            if config.scheme == "fedprox":
                prox = sum(((p - a) ** 2).sum() for p, a in zip(local.parameters(), anchor, strict=True))
                loss = loss + config.mu / 2 * prox
            torch.autograd.backward(loss)  # loss.backward(), typed
            opt.step()
        buffers = [n for n, _ in local.named_buffers()]
        capture = capture_update(global_model.state_dict(), local.state_dict(), config.learning_rate,
                                 config.local_steps, config.batch_size, buffers,
                                 {"gleak.kind": "update", **meta})
        capture.tensors = {k: v.cpu() for k, v in capture.tensors.items()}
    if dp is not None and dp_options is not None:
        capture.meta.update(epsilon(dp_options, rate, config.local_steps))
        capture.meta["gleak.defense"] = [{**dp.record(config.seed), "sample_rate": rate}]
    contribution = [d for d in config.defenses if not d.training]
    if contribution:
        capture = apply_defenses(capture, contribution, config.seed)
    soft = config.mixup or config.loss.label_smoothing > 0
    targets = [soft_targets(b.targets, num_classes, config.loss.label_smoothing) if soft else b.targets
               for b in batches]
    truth = Truth(labels=torch.cat(targets).cpu(), inputs=torch.cat([b.inputs for b in batches]).cpu(),
                  meta={"gleak.data.mean": list(data.mean), "gleak.data.std": list(data.std),
                        "gleak.num_classes": num_classes, "gleak.batch_size": config.batch_size,
                        "gleak.local_steps": config.local_steps})
    return capture, truth
