"""Built-in model zoo: the small networks used throughout the gradient-leakage literature."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gleak.errors import GleakError

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "selu": nn.SELU,
    "silu": nn.SiLU,
}
INITS = ("default", "uniform")


# --------------------------------------------------------------------------- argument checks


def _activation(name: Any) -> nn.Module:
    if not isinstance(name, str) or name.lower() not in ACTIVATIONS:
        raise GleakError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name.lower()]()


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise GleakError(f"{what} must be a positive integer, got {value!r}")
    return value


def _int_tuple(value: Any, what: str, length: int | None = None) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise GleakError(f"{what} must be a list of positive integers, got {value!r}")
    items = tuple(_positive_int(v, f"every entry of {what}") for v in value)
    if not items:
        raise GleakError(f"{what} must not be empty")
    if length is not None and len(items) != length:
        raise GleakError(f"{what} must have exactly {length} entries, got {len(items)}: {list(items)}")
    return items


def _check_init(init: object) -> str:
    if not isinstance(init, str) or init not in INITS:
        raise GleakError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
    return init


def _image_model_args(num_classes: Any, in_channels: Any, image_size: Any, init: Any) -> tuple[int, int, int, str]:
    """Validate the arguments every convolutional zoo model shares."""
    return (_positive_int(num_classes, "num_classes"), _positive_int(in_channels, "in_channels"),
            _positive_int(image_size, "image_size"), _check_init(init))


def uniform_init_(module: nn.Module, bound: float = 0.5) -> nn.Module:
    """Draw every parameter from U(-bound, bound), as the original DLG/iDLG code does."""
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-bound, bound)
    return module


# --------------------------------------------------------------------------- models


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) with a configurable activation."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        activation: str = "relu",
        init: str = "default",
    ) -> None:
        super().__init__()
        num_classes, in_channels, image_size, init = _image_model_args(num_classes, in_channels, image_size, init)
        padding = 2 if image_size == 28 else 0
        side = ((image_size + 2 * padding - 4) // 2 - 4) // 2
        if side < 1:
            raise GleakError(f"image_size {image_size} is too small for lenet (needs at least 16)")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=padding),
            _activation(activation),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            _activation(activation),
            nn.MaxPool2d(2),
        )
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.act1 = _activation(activation)
        self.fc2 = nn.Linear(120, 84)
        self.act2 = _activation(activation)
        self.fc3 = nn.Linear(84, num_classes)
        if init == "uniform":
            uniform_init_(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(self.features(x))
        x = self.act1(self.fc1(x))
        x = self.act2(self.fc2(x))
        logits: torch.Tensor = self.fc3(x)
        return logits


class IDLGConvNet(nn.Module):
    """The sigmoid CNN used by DLG/iDLG/LLG: three 5x5 convolutions and one linear layer."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        activation: str = "sigmoid",
        init: str = "uniform",
    ) -> None:
        super().__init__()
        num_classes, in_channels, image_size, init = _image_model_args(num_classes, in_channels, image_size, init)
        side = math.ceil(math.ceil(image_size / 2) / 2)
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 12, kernel_size=5, stride=2, padding=2),
            _activation(activation),
            nn.Conv2d(12, 12, kernel_size=5, stride=2, padding=2),
            _activation(activation),
            nn.Conv2d(12, 12, kernel_size=5, stride=1, padding=2),
            _activation(activation),
        )
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(12 * side * side, num_classes)
        if init == "uniform":
            uniform_init_(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.flatten(self.body(x)))
        return logits


class FCN4(nn.Module):
    """Bias-free four-layer ReLU network (the setting of exact label/input recovery analyses)."""

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 28, 28),
        hidden: Sequence[int] = (1024, 256, 64),
    ) -> None:
        super().__init__()
        num_classes = _positive_int(num_classes, "num_classes")
        shape = _int_tuple(input_shape, "input_shape")
        h1, h2, h3 = _int_tuple(hidden, "hidden", length=3)
        self.flatten = nn.Flatten()
        self.layers = nn.Sequential(
            nn.Linear(math.prod(shape), h1, bias=False),
            nn.ReLU(),
            nn.Linear(h1, h2, bias=False),
            nn.ReLU(),
            nn.Linear(h2, h3, bias=False),
            nn.ReLU(),
        )
        self.fc = nn.Linear(h3, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.layers(self.flatten(x)))
        return logits


class MLP(nn.Module):
    """Small fully-connected network with biases."""

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 28, 28),
        hidden: Sequence[int] = (300, 300),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        num_classes = _positive_int(num_classes, "num_classes")
        shape = _int_tuple(input_shape, "input_shape")
        widths = _int_tuple(hidden, "hidden")
        layers: list[nn.Module] = [nn.Flatten()]
        previous = math.prod(shape)
        for width in widths:
            layers += [nn.Linear(previous, width), _activation(activation)]
            previous = width
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(previous, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.body(x))
        return logits


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 conv + BN projection when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        activated: torch.Tensor = self.relu(out + self.shortcut(x))
        return activated


class ResNetCIFAR(nn.Module):
    """CIFAR ResNet of He et al. (2016, section 4.2): depth 6n+2, stages of 16/32/64 channels."""

    def __init__(
        self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, depth: int = 20
    ) -> None:
        super().__init__()
        num_classes = _positive_int(num_classes, "num_classes")
        in_channels = _positive_int(in_channels, "in_channels")
        _positive_int(image_size, "image_size")  # global pooling makes any size work
        depth = _positive_int(depth, "depth")
        if depth < 8 or (depth - 2) % 6:
            raise GleakError(
                f"resnet-cifar depth must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110), got {depth}"
            )
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        stages: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        logits: torch.Tensor = self.fc(self.flatten(self.pool(x)))
        return logits


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ZooEntry:
    """One built-in architecture: how to build it and which input it expects."""

    name: str
    factory: Callable[..., nn.Module]
    description: str
    paper: str
    input_shape: Callable[[Mapping[str, Any]], tuple[int, ...]]

    def defaults(self) -> dict[str, Any]:
        """The factory's keyword arguments and their default values."""
        params = inspect.signature(self.factory).parameters
        return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


class Imprinted(nn.Module):
    """A zoo model behind a malicious server's inserted block (Fowl et al., ICLR 2022, "Robbing the Fed"; Boenisch
    et al., EuroS&P 2023): Flatten → Linear(N, rows) → ReLU → Linear(rows, N), its output added to the input, then
    the model. Only the shape lives here: gleak.tamper.craft writes the weights that make it a trap. It exists so
    that gleak can simulate and check the attacks' published form, which changes the architecture."""

    def __init__(self, base: str = "lenet", base_kwargs: Mapping[str, Any] | None = None, rows: int = 64) -> None:
        super().__init__()
        if str(base).removeprefix("zoo:") == "imprinted":
            raise GleakError("an imprinted model cannot wrap another one")
        kwargs = dict(base_kwargs or {})
        self.shape = zoo_input_shape(base, **kwargs)
        size = math.prod(self.shape)
        self.block = nn.Sequential(nn.Flatten(), nn.Linear(size, _positive_int(rows, "rows")), nn.ReLU(),
                                   nn.Linear(int(rows), size))
        self.model = build_zoo_model(base, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x + self.block(x).view_as(x))
        return out


def _wrapped_shape(kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    return zoo_input_shape(str(kwargs.get("base", "lenet")), **dict(kwargs.get("base_kwargs") or {}))


def _image_shape(channels: int, size: int) -> Callable[[Mapping[str, Any]], tuple[int, ...]]:
    def shape(kwargs: Mapping[str, Any]) -> tuple[int, ...]:
        c, s = kwargs.get("in_channels", channels), kwargs.get("image_size", size)
        return (int(c), int(s), int(s))

    return shape


def _flat_shape(kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in kwargs.get("input_shape", (1, 28, 28)))


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            "lenet",
            LeNet5,
            "LeNet-5: two 5x5 convolutions with max pooling, then 120-84-C fully connected",
            "LeCun et al., Gradient-based learning applied to document recognition, Proc. IEEE 1998",
            _image_shape(1, 28),
        ),
        ZooEntry(
            "idlg-cnn",
            IDLGConvNet,
            "sigmoid CNN of DLG/iDLG/LLG: three 5x5 convolutions (12 channels) and one linear layer",
            "Zhao et al., iDLG: Improved Deep Leakage from Gradients, arXiv:2001.02610, 2020",
            _image_shape(1, 28),
        ),
        ZooEntry(
            "fcn4",
            FCN4,
            "bias-free 4-layer ReLU fully-connected network (1024-256-64-C by default)",
            "Wang, Liang & He, Eliminating Hard Label Constraints in Gradient Inversion, ICLR 2024 (§4.2)",
            _flat_shape,
        ),
        ZooEntry(
            "mlp",
            MLP,
            "small fully-connected network with biases (300-300-C by default)",
            "Ma et al., Instance-wise Batch Label Restoration via Gradients (iLRG, FCN-3 784-300-300-C), ICLR 2023",
            _flat_shape,
        ),
        ZooEntry(
            "resnet-cifar",
            ResNetCIFAR,
            "CIFAR ResNet (depth 6n+2, 16/32/64 channels, projection shortcuts)",
            "He et al., Deep Residual Learning for Image Recognition, CVPR 2016",
            _image_shape(3, 32),
        ),
        ZooEntry(
            "imprinted",
            Imprinted,
            "a zoo model (base, base_kwargs) behind an inserted block of `rows` neurons: a malicious server's "
            "imprint or trap-weight layer, as gleak simulate --server writes it",
            "Fowl et al., Robbing the Fed, ICLR 2022; Boenisch et al., When the Curious Abandon Honesty, EuroS&P 2023",
            _wrapped_shape,
        ),
    )
}


def _normalize_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """JSON gives lists where tuples are meant; turn them into tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}


def _entry(name: str) -> ZooEntry:
    key = name.removeprefix("zoo:")
    if key not in ZOO:
        raise GleakError(f"unknown zoo model {name!r}; built-in models: {', '.join(ZOO)}")
    return ZOO[key]


def zoo_input_shape(name: str, **kwargs: Any) -> tuple[int, ...]:
    """Default (C, H, W) input shape of a zoo model built with ``kwargs``."""
    entry = _entry(name)
    merged = {**entry.defaults(), **_normalize_kwargs(kwargs)}
    try:
        return entry.input_shape(merged)
    except (TypeError, ValueError) as exc:
        raise GleakError(f"cannot derive the input shape of {entry.name!r} from {kwargs}: {exc}") from None


def build_zoo_model(name: str, **kwargs: Any) -> nn.Module:
    """Build zoo model ``name`` (optionally prefixed ``zoo:``) with the given keyword arguments."""
    entry = _entry(name)
    allowed = entry.defaults()
    for key in kwargs:
        if key not in allowed:
            raise GleakError(
                f"{entry.name!r} does not accept the argument {key!r}; valid arguments: {', '.join(allowed)}"
            )
    try:
        return entry.factory(**_normalize_kwargs(kwargs))
    except GleakError:
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        raise GleakError(f"cannot build {entry.name!r} with {kwargs}: {exc}") from None
