"""Model zoo: the networks of the FedVLS paper and its ablations (plain PyTorch).

Names (:data:`MODELS`)
----------------------
``mlp``
    The paper's MNIST network (official code: 784-200-200-C with ReLU):
    ``Flatten -> Linear(in, 200) -> ReLU -> Linear(200, 200) -> ReLU -> Linear(200, C)``
    with ``in = prod(input_shape)`` (784 for MNIST, 64 for the 8x8 ``digits`` set).
``logreg``
    Multinomial logistic regression, ``Flatten -> Linear(in, C)`` (the 60-feature
    Synthetic(alpha, beta) benchmark of the FedLC paper).
``cnn``
    The small CNN of the FedLC paper for MNIST / Fashion-MNIST (its appendix Table 8):
    ``Conv(1->10, 5x5) -> max-pool 2 -> ReLU -> Conv(10->20, 5x5) -> max-pool 2 -> ReLU
    -> Linear(320, 50) -> ReLU -> Linear(50, C)`` (no padding, no BatchNorm, no dropout;
    ReLU after every layer but the last, and ReLU commutes with max-pooling). The first
    linear layer's width follows the input: 320 = 20 x 4 x 4 for 28x28 inputs; any
    ``(C_in, H, W)`` with H, W >= 16 works (e.g. CIFAR's 3x32x32: 500).
``mobilenetv2``
    The CIFAR adaptation of MobileNetV2 that the FedVLS authors (and CCVR before them)
    use: 3x3 stride-1 stem with 32 channels, the standard inverted-residual settings
    ``(t, c, n, s)`` = (1,16,1,1), (6,24,2,**1**), (6,32,3,2), (6,64,4,2), (6,96,3,1),
    (6,160,3,2), (6,320,1,1) -- the first stride-2 stage (c=24) runs at stride 1 -- then a
    1x1 conv to 1280 channels, global average pooling (adaptive, so 32x32 and 64x64
    inputs both work) and a C-way linear head.  As in that widely used CIFAR code
    (and the authors' copy of it), every block has the 1x1 expansion conv (also for
    t=1), and a stride-1 block whose width changes gets a 1x1 conv + BN projection
    shortcut; stride-2 blocks have no shortcut.  Spatial size after the blocks: 4x4 for
    32x32 inputs, 8x8 for 64x64.
``resnet18``
    CIFAR-style ResNet-18: 3x3 stride-1 stem with 64 channels, no max-pool, BasicBlocks
    [2, 2, 2, 2] with widths 64/128/256/512 (1x1 conv + BN projection shortcuts where
    the shape changes), global average pooling, linear head.
``resnet18-imagenet``
    ``torchvision.models.resnet18(weights=None, num_classes=C)`` unchanged (7x7 stride-2
    stem + max-pool: a 32x32 input is 1x1 after the last stage).  This is what the FedVLS
    authors' code instantiates for its ResNet-18 rows.
``resnet32``
    CIFAR ResNet-32 (He et al. 2016, section 4.2): 3x3 stem with 16 channels, three
    stages of 5 BasicBlocks with widths 16/32/64 (the first block of stages 2 and 3 has
    stride 2), global average pooling, linear head.  The shortcuts are parameter-free
    ("option A": subsample and zero-pad the new channels), as in that paper and in the
    FedVLS authors' ``resnetcifar.py``.

All convolutional nets but ``cnn`` use BatchNorm (its running statistics are part of the state that
FedAvg averages).

Parameter counts (trainable parameters, :func:`count_parameters`; measured, and checked
by ``tests/test_models.py``).  CIFAR-10 = ``(3, 32, 32)``, 10 classes; CIFAR-100 =
``(3, 32, 32)``, 100 classes; the MLP rows use MNIST ``(1, 28, 28)``.  The conv nets'
counts do not depend on the input size (global pooling); TinyImageNet (200 classes)
adds ``(200 - 100) * (d + 1)`` to the CIFAR-100 count, ``d`` the feature width
(1280 for MobileNetV2, 512 for ResNet-18, 64 for ResNet-32).

=====================  ==============  ===============
model                  10 classes      100 classes
=====================  ==============  ===============
``mlp`` (784 inputs)   199,210         217,300
``cnn`` (1x28x28)      21,840          26,430
``mobilenetv2``        2,296,922       2,412,212
``resnet18``           11,173,962      11,220,132
``resnet18-imagenet``  11,181,642      11,227,812
``resnet32``           464,154         470,004
=====================  ==============  ===============

(``logreg`` on 60 features: 610 for 10 classes; ``mlp`` on ``digits``: 55,210.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedvls_flwr.config.run_config import DEFAULT_MODELS, MODELS

__all__ = [
    "MODELS", "default_model", "build_model", "count_parameters", "classifier_of",
    "ProjectionModel", "FeatureTap",
]


def default_model(dataset: str) -> str:
    """The paper's model for ``dataset`` (what ``model = "auto"`` resolves to)."""
    try:
        return DEFAULT_MODELS[dataset]
    except KeyError:
        raise ValueError(
            f"no default model for dataset {dataset!r}; known datasets: {', '.join(DEFAULT_MODELS)}"
        ) from None


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (BatchNorm running statistics not included)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- MLP / logreg


def _mlp(in_features: int, num_classes: int, hidden: int = 200) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, num_classes),
    )


def _logreg(in_features: int, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


# --------------------------------------------------------------------------- FedLC's CNN


class SmallCNN(nn.Module):
    """Two 5x5 conv layers (10 and 20 channels) with max-pooling, then 50 -> C."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        if min(height, width) < 16:
            raise ValueError(f"model 'cnn' needs images of at least 16x16, got {height}x{width}")
        self.conv1 = nn.Conv2d(channels, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        h, w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(20 * h * w, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


# --------------------------------------------------------------------------- MobileNetV2


class _InvertedResidual(nn.Module):
    """1x1 expansion -> 3x3 depthwise (stride s) -> 1x1 linear projection (+ shortcut)."""

    def __init__(self, in_ch: int, out_ch: int, expansion: int, stride: int) -> None:
        super().__init__()
        hidden = in_ch * expansion
        self.stride = stride
        self.expand = nn.Sequential(
            nn.Conv2d(in_ch, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU(inplace=True)
        )
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(inplace=True),
        )
        self.project = nn.Sequential(nn.Conv2d(hidden, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch))
        self.shortcut: nn.Module | None = None
        if stride == 1:
            if in_ch == out_ch:
                self.shortcut = nn.Identity()
            else:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(in_ch, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(self.depthwise(self.expand(x)))
        if self.shortcut is not None:
            out = out + self.shortcut(x)
        return out


class MobileNetV2Cifar(nn.Module):
    # (expansion t, output channels c, repeats n, first stride s)
    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 1),  # stride 2 in the ImageNet network; 1 for 32x32 inputs
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
        )
        blocks = []
        ch = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                blocks.append(_InvertedResidual(ch, c, t, s if i == 0 else 1))
                ch = c
        self.blocks = nn.Sequential(*blocks)
        self.head_conv = nn.Sequential(
            nn.Conv2d(ch, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU(inplace=True)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head_conv(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


# --------------------------------------------------------------------------- CIFAR ResNets


class _PadShortcut(nn.Module):
    """Parameter-free shortcut ("option A" of He et al. 2016 for CIFAR): take every
    ``stride``-th pixel and zero-pad the new channels (split evenly on both sides)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        extra = out_ch - in_ch
        self.pad = (extra // 2, extra - extra // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad[0], self.pad[1]))


class _BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int, shortcut: str = "B") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut: nn.Module = nn.Identity()
        if (stride != 1 or in_ch != out_ch) and shortcut == "A":
            self.shortcut = _PadShortcut(in_ch, out_ch, stride)
        elif stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class CifarResNet(nn.Module):
    """3x3 stride-1 stem (no max-pool), stages of BasicBlocks, global pool, linear head.

    ``shortcut``: "B" = 1x1 conv + BN projection where the shape changes (ResNet-18),
    "A" = parameter-free subsample + zero-pad (CIFAR ResNet-20/32/...).
    """

    def __init__(
        self,
        blocks_per_stage: tuple[int, ...],
        widths: tuple[int, ...],
        num_classes: int,
        in_channels: int = 3,
        shortcut: str = "B",
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages = []
        ch = widths[0]
        for stage, (n, w) in enumerate(zip(blocks_per_stage, widths)):
            layers = []
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                layers.append(_BasicBlock(ch, w, stride, shortcut))
                ch = w
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


# --------------------------------------------------------------------------- features, MOON's projection head


def classifier_of(model: nn.Module) -> nn.Linear:
    """The final linear layer (its input is the model's representation, its output the logits)."""
    last: object
    if isinstance(model, nn.Sequential):
        last = model[-1]
    else:
        last = getattr(model, "fc2", None) or getattr(model, "fc", None) or getattr(model, "classifier", None)
    if not isinstance(last, nn.Linear):
        raise TypeError(f"{type(model).__name__} has no final nn.Linear classifier")
    return last


class FeatureTap:
    """Captures the input of a model's classifier on every forward pass (the penultimate
    representation), without changing the model or its state_dict."""

    def __init__(self, model: nn.Module) -> None:
        self.features: torch.Tensor | None = None
        self._handle = classifier_of(model).register_forward_pre_hook(self._keep)

    def _keep(self, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self.features = inputs[0]

    def take(self) -> torch.Tensor | None:
        """The last forward pass's features, no longer held here: kept, they would keep that
        step's autograd graph alive into the next step (on CUDA, PyTorch warns that such a node's
        stream no longer matches when a kept trainer's step is captured)."""
        features, self.features = self.features, None
        return features

    def remove(self) -> None:
        self._handle.remove()


class ProjectionModel(nn.Module):
    """MOON's network (Li, He, Song, CVPR 2021; their ``ModelFedCon``): the base network's
    representation h -> Linear(d, d) -> ReLU -> Linear(d, out_dim) = z, the projection
    the contrastive loss compares, and the classifier Linear(out_dim, C) on z."""

    def __init__(self, base: nn.Module, out_dim: int, num_classes: int) -> None:
        super().__init__()
        head = classifier_of(base)
        width = head.in_features
        if isinstance(base, nn.Sequential):
            base[-1] = nn.Identity()
        else:
            for name in ("fc2", "fc", "classifier"):
                if getattr(base, name, None) is head:
                    setattr(base, name, nn.Identity())
                    break
        self.base = base
        self.projection = nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True), nn.Linear(width, out_dim))
        self.classifier = nn.Linear(out_dim, num_classes)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, projection z)."""
        z = self.projection(self.base(x))
        return self.classifier(z), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)[0]


# --------------------------------------------------------------------------- factory


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Instantiate model ``name`` for inputs of shape ``input_shape`` (no batch dim).

    ``"auto"`` is not accepted here: resolve it with :func:`default_model` first.
    """
    input_shape = tuple(int(s) for s in input_shape)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if name == "mlp":
        return _mlp(math.prod(input_shape), num_classes)
    if name == "logreg":
        return _logreg(math.prod(input_shape), num_classes)
    if name in ("cnn", "mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32"):
        if len(input_shape) != 3:
            raise ValueError(f"model {name!r} needs (C, H, W) inputs, got input_shape={input_shape}")
        in_ch = input_shape[0]
        if name == "cnn":
            return SmallCNN(input_shape, num_classes)
        if name == "mobilenetv2":
            return MobileNetV2Cifar(num_classes, in_ch)
        if name == "resnet18":
            return CifarResNet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, in_ch)
        if name == "resnet32":
            return CifarResNet((5, 5, 5), (16, 32, 64), num_classes, in_ch, shortcut="A")
        import torchvision

        model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
        if in_ch != 3:
            model.conv1 = nn.Conv2d(in_ch, 64, 7, stride=2, padding=3, bias=False)
        return model
    raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
