"""Batched training augmentation for image batches that live on the training device.

The paper's CIFAR/TinyImageNet training pipeline is, per image::

    RandomCrop(H, padding=4) -> RandomHorizontalFlip() -> AutoAugment(CIFAR10 policy)
    -> ToTensor() -> Normalize(mean, std)

The classic way runs it on PIL images, one sample at a time, in DataLoader workers
(``bench/reference_transform.py`` builds exactly that pipeline, to benchmark against).
Here the data stay whole uint8 tensors ``(N, C, H, W)`` (see :mod:`fedvls_flwr.data.datasets`) and
:class:`BatchTransform` augments a *batch* at once, on whatever device the batch lives (the
GPU when training there), with per-sample randomness.

Random crop and flip
    One zero-padded copy of the batch and one gather with per-sample offsets (uniform in
    ``0..2*padding``, as ``RandomCrop``) and per-sample flips (probability 1/2); the flip
    is folded into the gather's column index.

AutoAugment, per sample
    Each image draws its own sub-policy, coins and signs, and the batch is processed by
    operation type (:mod:`fedvls_flwr.data.autoaugment`).

Randomness
    With a CPU ``generator`` (or none: torch's default CPU generator) every random decision
    (offsets, flips, sub-policies, coins, signs) is drawn on the CPU and moved to the batch's
    device, and the images of each AutoAugment operation are processed as one group. With a
    generator on the batch's device (the training loop's choice on a GPU) the decisions are
    drawn there and the fixed-shape kernels run (:func:`random_crop_flip_fixed`,
    :meth:`~fedvls_flwr.data.autoaugment.BatchAutoAugment.apply_fixed`): nothing is read back
    to the host, so the whole transform can be captured in a CUDA graph and costs a fixed,
    small number of kernels per batch. Both give the same distribution, and a seeded
    generator the same images on every run.

Normalisation
    ``x.float() / 255``, then ``(x - mean) / std`` per channel: the same float32
    operations as ``ToTensor`` + ``Normalize``.  A float input batch is taken to be in
    [0, 1] already (it is rounded to uint8 levels before AutoAugment when augmenting).
    ``mean=None`` marks data that are stored already normalised (the MNIST-like sets):
    the transform is then the identity and returns its input unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as nnf

from fedvls_flwr.data.autoaugment import BatchAutoAugment

__all__ = ["BatchTransform", "make_batch_transform", "normalize", "random_crop_flip", "random_crop_flip_fixed"]


# ----------------------------------------------------------------------------- crop / flip / normalise


def random_crop_flip(
    x: torch.Tensor, padding: int = 4, flip: bool = True, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-image random crop of the input size from the zero-padded batch, and per-image
    horizontal flip with probability 1/2 (``RandomCrop(H, padding)`` + ``RandomHorizontalFlip``)."""
    n, c, h, w = x.shape
    oy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    ox = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    rows = oy.unsqueeze(1) + torch.arange(h)
    cols = ox.unsqueeze(1) + torch.arange(w)
    if flip:
        flips = torch.rand(n, generator=generator) < 0.5
        cols = torch.where(flips.unsqueeze(1), cols.flip(1), cols)
    dev = x.device
    rows = rows.to(dev, non_blocking=True)
    cols = cols.to(dev, non_blocking=True)
    padded = nnf.pad(x, (padding, padding, padding, padding)) if padding else x
    # Gather rows, then columns: two cheap index_select-like gathers.
    wp = padded.shape[-1]
    out = padded.gather(2, rows.view(n, 1, h, 1).expand(n, c, h, wp))
    out = out.gather(3, cols.view(n, 1, 1, w).expand(n, c, h, w))
    return out


def random_crop_flip_fixed(x: torch.Tensor, padding: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """:func:`random_crop_flip` with its draws taken on ``generator``'s device (``x``'s), in
    fixed shapes and without a host synchronisation (capturable in a CUDA graph)."""
    n, c, h, w = x.shape
    dev = x.device
    oy = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator, device=dev)
    ox = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator, device=dev)
    rows = oy + torch.arange(h, device=dev)
    cols = ox + torch.arange(w, device=dev)
    if flip:
        flips = torch.rand(n, 1, generator=generator, device=dev) < 0.5
        cols = torch.where(flips, cols.flip(1), cols)
    padded = nnf.pad(x, (padding, padding, padding, padding)) if padding else x
    out = padded.gather(2, rows.view(n, 1, h, 1).expand(n, c, h, padded.shape[-1]))
    return out.gather(3, cols.view(n, 1, 1, w).expand(n, c, h, w))


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same GPU when the current device is 0 (a generator made
    for ``cuda`` says ``cuda``, a tensor there says ``cuda:0``)."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


def normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 -> ``x / 255``; float taken as [0, 1]; then ``(x - mean) / std`` in float32."""
    if x.dtype == torch.uint8:
        x = x.to(torch.float32).div_(255)
    else:
        x = x.to(torch.float32, copy=True)
    return x.sub_(mean).div_(std)


@dataclass
class BatchTransform:
    """Callable: uint8 (or [0, 1] float) batch ``(N, C, H, W)`` -> float32 normalised batch
    on the same device.  Built by :func:`make_batch_transform`.

    With ``mean=None`` it is the identity (returns its input, the same object).
    """

    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    train: bool = False
    augment: bool = False
    generator: torch.Generator | None = None
    padding: int = 4
    flip: bool = True
    autoaugment: str = "batched"  # "batched" | "torchvision" | "none"
    group_size: int = 1
    _aa: BatchAutoAugment | None = field(default=None, init=False, repr=False)
    _tv_aa: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, init=False, repr=False)
    _stats: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must both be given or both be None")
        if self.mean is not None and self.std is not None and len(self.mean) != len(self.std):
            raise ValueError("mean and std must have the same length")
        if self.autoaugment not in ("batched", "torchvision", "none"):
            raise ValueError(f"autoaugment must be 'batched', 'torchvision' or 'none', got {self.autoaugment!r}")
        if self.group_size < 1:
            raise ValueError("group_size must be >= 1")
        if self.on_device and self.autoaugment != "batched":
            raise ValueError("a generator on a GPU draws for the batched AutoAugment only (autoaugment='batched')")
        if self.autoaugment == "batched" and self.augments:  # its tables: only where it augments
            self._aa = BatchAutoAugment()

    @property
    def on_device(self) -> bool:
        """The draws are taken on the generator's (and the batch's) device, in fixed shapes."""
        return self.generator is not None and self.generator.device.type != "cpu"

    @property
    def augments(self) -> bool:
        return self.mean is not None and self.train and self.augment

    def _mean_std(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._stats:
            m = torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
            s = torch.tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
            self._stats[device] = (m, s)
        return self._stats[device]

    def _autoaugment(self, x: torch.Tensor) -> torch.Tensor:
        if self._aa is not None:
            return self._aa(x, self.generator)
        if self.autoaugment == "torchvision":
            if self._tv_aa is None:
                from torchvision.transforms import v2

                self._tv_aa = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
            augment = self._tv_aa
            return torch.cat([augment(chunk) for chunk in x.split(self.group_size)])
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean is None:
            return x
        if self.augments:
            if x.dtype != torch.uint8:
                x = x.mul(255).round_().clamp_(0, 255).to(torch.uint8)
            if self.on_device:
                assert self.generator is not None and self._aa is not None
                if not same_device(x.device, self.generator.device):
                    raise ValueError(f"the batch is on {x.device}, the generator on {self.generator.device}")
                x = random_crop_flip_fixed(x, self.padding, self.flip, self.generator)
                x = self._aa.apply_fixed(x, *self._aa.sample_fixed(x.shape[0], self.generator, x.device))
            else:
                x = random_crop_flip(x, self.padding, self.flip, self.generator)
                x = self._autoaugment(x)
        mean, std = self._mean_std(x.device)
        return normalize(x, mean, std)


def make_batch_transform(
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
    *,
    train: bool,
    augment: bool,
    generator: torch.Generator | None = None,
    autoaugment: str = "batched",
    group_size: int = 1,
) -> BatchTransform:
    """The batch transform for training (``train=True, augment=True``: crop + flip +
    AutoAugment + normalise) or evaluation (normalise only).  ``mean=None``: identity.
    ``generator``: a CPU generator (the draws on the CPU), or one on the GPU that holds the
    batches (the fixed-shape path, see the module docstring)."""
    return BatchTransform(
        mean=tuple(mean) if mean is not None else None,
        std=tuple(std) if std is not None else None,
        train=train,
        augment=augment,
        generator=generator,
        autoaugment=autoaugment,
        group_size=group_size,
    )
