"""The reference loop's networks, each written from its paper's description.

* ``mlp``: the FedVLS authors' MNIST network, 784-200-200-C with ReLU (input flattened; 64
  inputs for the 8x8 digits);
* ``logreg``: multinomial logistic regression, one linear layer on the flattened input;
* ``cnn``: the FedLC paper's CNN for MNIST (its appendix Table 8): conv 5x5 to 10 channels,
  2x2 max-pool, ReLU, conv 5x5 to 20, 2x2 max-pool, ReLU, fully connected to 50, ReLU, to C;
* ``mobilenetv2``: MobileNetV2 (Sandler et al. 2018) as CIFAR code adapts it (the FedVLS authors'
  copy of it): a 3x3 stride-1 stem of 32 channels; inverted residual blocks (1x1 expansion,
  3x3 depthwise, 1x1 linear projection, each with BatchNorm, ReLU after the first two) with the
  settings (t, c, n, s) = (1,16,1,1), (6,24,2,1), (6,32,3,2), (6,64,4,2), (6,96,3,1),
  (6,160,3,2), (6,320,1,1), a stride-1 block adding its input (through a 1x1 conv + BN when the
  width changes), a stride-2 block adding nothing; a 1x1 conv to 1280 + BN + ReLU; global
  average pooling; a linear head;
* ``resnet18`` / ``resnet32``: He et al. 2016's ResNets as CIFAR code builds them (3x3 stride-1
  stem, no max-pool; basic blocks of two 3x3 convs with BatchNorm; global average pooling): 18 =
  [2, 2, 2, 2] blocks of 64/128/256/512 channels with 1x1 conv + BN shortcuts where the shape
  changes; 32 = [5, 5, 5] blocks of 16/32/64 with the paper's parameter-free shortcut (option A:
  every second pixel, new channels zero-padded on both sides); the first block of every stage
  after the first has stride 2;
* ``resnet18-imagenet``: torchvision's ResNet-18 (its own definition), as the FedVLS authors'
  code instantiates it;
* MOON's network (Li, He, Song, CVPR 2021, their ``ModelFedCon``): the base network up to its
  representation h, then Linear(d, d), ReLU, Linear(d, out_dim) = z, and the classifier
  Linear(out_dim, C) on z.

Every network names its layers so that its ``state_dict`` has the same keys as the network of
the same name in the app: the differential test loads the app's initial weights by key, so both
sides start equal. ``features(x)`` is the classifier's input (the representation FedMR, FedDecorr
and FedConcat read); ``classifier`` the final linear layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("mlp", "logreg", "cnn", "mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32")


class MLP(nn.Sequential):
    def __init__(self, inputs: int, classes: int, head: bool = True, width: int = 200) -> None:
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()]
        super().__init__(*layers, *([nn.Linear(width, classes)] if head else []))
        self.width = width

    def features(self, x: torch.Tensor) -> torch.Tensor:
        for layer in list(self)[:5]:
            x = layer(x)
        return x

    @property
    def classifier(self) -> nn.Linear:
        return self[5]


class LogReg(nn.Sequential):
    def __init__(self, inputs: int, classes: int, head: bool = True) -> None:
        super().__init__(nn.Flatten(), *([nn.Linear(inputs, classes)] if head else []))
        self.width = inputs

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self[0](x)

    @property
    def classifier(self) -> nn.Linear:
        return self[1]


class CNN(nn.Module):
    def __init__(self, shape: tuple[int, ...], classes: int, head: bool = True) -> None:
        super().__init__()
        channels, height, width = shape
        self.conv1 = nn.Conv2d(channels, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        side = lambda n: ((n - 4) // 2 - 4) // 2  # noqa: E731 - two valid 5x5 convs, each pooled by 2
        self.fc1 = nn.Linear(20 * side(height) * side(width), 50)
        self.width = 50
        if head:
            self.fc2 = nn.Linear(50, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), kernel_size=2))
        x = F.relu(F.max_pool2d(self.conv2(x), kernel_size=2))
        return F.relu(self.fc1(x.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.features(x))

    @property
    def classifier(self) -> nn.Linear:
        return self.fc2


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([nn.ReLU()] if relu else []))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, t: int, stride: int) -> None:
        super().__init__()
        hidden = cin * t
        self.expand = conv_bn(cin, hidden, 1)
        self.depthwise = conv_bn(hidden, hidden, 3, stride=stride, groups=hidden)
        self.project = conv_bn(hidden, cout, 1, relu=False)
        self.has_shortcut = stride == 1
        if stride == 1 and cin != cout:
            self.shortcut = conv_bn(cin, cout, 1, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(self.depthwise(self.expand(x)))
        if not self.has_shortcut:
            return out
        return out + (self.shortcut(x) if hasattr(self, "shortcut") else x)


class MobileNetV2(nn.Module):
    BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, channels: int, classes: int, head: bool = True) -> None:
        super().__init__()
        self.stem = conv_bn(channels, 32, 3)
        blocks, width = [], 32
        for t, c, n, s in self.BLOCKS:
            for i in range(n):
                blocks.append(InvertedResidual(width, c, t, s if i == 0 else 1))
                width = c
        self.blocks = nn.Sequential(*blocks)
        self.head_conv = conv_bn(width, 1280, 1)
        self.width = 1280
        if head:
            self.fc = nn.Linear(1280, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.head_conv(self.blocks(self.stem(x))), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

    @property
    def classifier(self) -> nn.Linear:
        return self.fc


class ZeroPadShortcut(nn.Module):
    """He et al. 2016, option A: x[:, :, ::s, ::s] with the new channels zero, half on each side."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride, self.before, self.after = stride, (cout - cin) // 2, cout - cin - (cout - cin) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        n, _, h, w = x.shape
        return torch.cat([x.new_zeros(n, self.before, h, w), x, x.new_zeros(n, self.after, h, w)], dim=1)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, option_a: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        changes = stride != 1 or cin != cout
        self.shortcut = (ZeroPadShortcut(cin, cout, stride) if option_a else conv_bn(cin, cout, 1, stride, relu=False)) \
            if changes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...], widths: tuple[int, ...], channels: int, classes: int,
                 option_a: bool, head: bool = True) -> None:
        super().__init__()
        self.stem = conv_bn(channels, widths[0], 3)
        stages, width = [], widths[0]
        for stage, (n, w) in enumerate(zip(blocks, widths)):
            stages.append(nn.Sequential(*[BasicBlock(width if i == 0 else w, w, 2 if stage > 0 and i == 0 else 1,
                                                     option_a) for i in range(n)]))
            width = w
        self.stages = nn.Sequential(*stages)
        self.width = width
        if head:
            self.fc = nn.Linear(width, classes)
        for m in self.modules():  # He et al. 2015's initialisation of the convolutions (fan out)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

    @property
    def classifier(self) -> nn.Linear:
        return self.fc


def imagenet_resnet18(channels: int, classes: int, head: bool = True) -> nn.Module:
    import torchvision

    class ImageNetResNet18(torchvision.models.ResNet):
        def features(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return torch.flatten(self.avgpool(x), 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.features(x))

        @property
        def classifier(self) -> nn.Linear:
            return self.fc

    model = ImageNetResNet18(torchvision.models.resnet.BasicBlock, [2, 2, 2, 2], num_classes=classes)
    if channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, stride=2, padding=3, bias=False)
    model.width = 512
    if not head:
        del model.fc
    return model


class Projected(nn.Module):
    """MOON's network: base representation -> Linear(d, d) -> ReLU -> Linear(d, dim) = z -> classifier."""

    def __init__(self, base: nn.Module, dim: int, classes: int) -> None:
        super().__init__()
        self.base = base
        width = int(base.width)
        self.projection = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, dim))
        self.classifier = nn.Linear(dim, classes)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, z)."""
        z = self.features(x)
        return self.classifier(z), z

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.base.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)[0]


def build(name: str, shape: tuple[int, ...], classes: int, head: bool = True) -> nn.Module:
    """Network ``name`` for inputs of ``shape`` (C, H, W) and ``classes`` outputs (``head=False``:
    without its classifier, as MOON's base)."""
    inputs = math.prod(shape)
    if name == "mlp":
        return MLP(inputs, classes, head)
    if name == "logreg":
        return LogReg(inputs, classes, head)
    if name == "cnn":
        return CNN(shape, classes, head)
    if name == "mobilenetv2":
        return MobileNetV2(shape[0], classes, head)
    if name == "resnet18":
        return CifarResNet((2, 2, 2, 2), (64, 128, 256, 512), shape[0], classes, option_a=False, head=head)
    if name == "resnet32":
        return CifarResNet((5, 5, 5), (16, 32, 64), shape[0], classes, option_a=True, head=head)
    if name == "resnet18-imagenet":
        return imagenet_resnet18(shape[0], classes, head)
    raise ValueError(f"the reference loop has no model {name!r}")


def build_for(name: str, shape: tuple[int, ...], classes: int, projection_dim: int | None) -> nn.Module:
    """The run's network: MOON's (``projection_dim`` given) or the plain one."""
    if projection_dim is None:
        return build(name, shape, classes)
    return Projected(build(name, shape, classes, head=False), projection_dim, classes)


def classifier_of(model: nn.Module) -> nn.Linear:
    return model.classifier  # type: ignore[return-value]


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def mode_dependent(model: nn.Module) -> bool:
    """Whether the model computes differently in train mode (BatchNorm, dropout)."""
    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    return any(isinstance(m, kinds) for m in model.modules())
