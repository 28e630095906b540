"""What every loader returns: a dataset held in memory, and the error for a missing one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedvls_flwr.data.errors import DatasetNotFoundError

__all__ = ["DatasetBundle", "DatasetNotFoundError", "ImageFormat"]


@dataclass(frozen=True, eq=False)
class DatasetBundle:
    """A dataset held in memory: the training pool and the server's test set.

    ``eq=False``: bundles compare by identity (comparing tensors field by field is
    ambiguous); the dataclass is still frozen.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...]
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])

    def train_class_counts(self) -> np.ndarray:
        return np.bincount(self.train_y.numpy(), minlength=self.num_classes)

    def test_class_counts(self) -> np.ndarray:
        return np.bincount(self.test_y.numpy(), minlength=self.num_classes)




@dataclass(frozen=True)
class ImageFormat:
    """How dataset ``name`` holds its images, so images from elsewhere can match it.

    ``normalised``: stored float32 as ``(pixel / 255 - mean) / std`` (the grayscale sets;
    the bundle's ``mean``/``std`` are then ``None``); otherwise stored uint8 and
    ``mean``/``std`` (per channel, [0, 1] units) are applied per batch by the training code.
    """

    name: str
    shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int
    normalised: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]



def check_bundle(b: DatasetBundle, root: Path | None = None) -> None:
    """Internal consistency of a freshly built bundle (cheap). Labels outside the classes
    come from the files (damaged, or another dataset's): DatasetNotFoundError."""
    for split, x, y in (("train", b.train_x, b.train_y), ("test", b.test_x, b.test_y)):
        if x.shape[0] != y.shape[0]:
            raise AssertionError(f"{b.name}: {split} has {x.shape[0]} images but {y.shape[0]} labels")
        if tuple(x.shape[1:]) != b.input_shape:
            raise AssertionError(f"{b.name}: {split} images have shape {tuple(x.shape[1:])}, expected {b.input_shape}")
        if y.dtype != torch.int64:
            raise AssertionError(f"{b.name}: {split} labels are {y.dtype}, expected int64")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= b.num_classes):
            bad = int(((y < 0) | (y >= b.num_classes)).sum())
            where = f" read from {root}" if root is not None else ""
            raise DatasetNotFoundError(
                f"{b.name}: the {split} split{where} has labels {int(y.min())}..{int(y.max())}, {bad} of them "
                f"outside the {b.num_classes} classes 0..{b.num_classes - 1}: the dataset's label files "
                f"there are damaged or are not {b.name}'s. Replace them with intact copies (or point "
                "data-dir elsewhere)."
            )
    if len(b.class_names) != b.num_classes:
        raise AssertionError(f"{b.name}: {len(b.class_names)} class names for {b.num_classes} classes")


def normalise_gray(x_uint8: np.ndarray, mean: float, std: float) -> torch.Tensor:
    """uint8 (N, H, W) -> float32 (N, 1, H, W), ``(x / 255 - mean) / std``."""
    x = torch.from_numpy(np.array(x_uint8, dtype=np.uint8, order="C")).to(torch.float32).div_(255.0)
    x.sub_(mean).div_(std)
    return x.unsqueeze(1).contiguous()


def as_labels(y: object) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y), dtype=torch.int64).clone()


