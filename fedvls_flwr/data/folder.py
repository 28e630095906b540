"""Node-local image folders (ImageFolder layout) read into a named dataset's representation,
so a site's own images fit the run's model: same size, channels and normalisation, label
ids fixed by a class list."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedvls_flwr.data.bundle import DatasetNotFoundError, ImageFormat
from fedvls_flwr.data.folder_tree import FOLDER_IMAGE_EXTENSIONS, folder_image_list

__all__ = ["FOLDER_IMAGE_EXTENSIONS", "FolderImages", "folder_image_list", "load_image_folder"]

@dataclass(frozen=True, eq=False)
class FolderImages:
    """Images of a folder tree in ``fmt``'s representation; ``y`` indexes ``class_names``."""

    x: torch.Tensor  # float32 (N, C, H, W) normalised, or uint8 (N, C, H, W)
    y: torch.Tensor  # int64 (N,)
    class_names: tuple[str, ...]
    files: tuple[str, ...]  # paths relative to the root, in the order of x
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


def _decode_folder_image(path: Path, size: tuple[int, int], mode: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as opened:
        im = opened.convert(mode)
        if im.size != (size[1], size[0]):
            im = im.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def load_image_folder(root: Path, classes: tuple[str, ...] | list[str], fmt: ImageFormat) -> FolderImages:
    """Read an ImageFolder-style tree into ``fmt``'s representation.

    Every image is converted to ``fmt``'s channels (``L`` for 1, ``RGB`` for 3) and
    resized (bilinear, aspect ratio not kept) to ``fmt``'s height x width, e.g. 8x8 for
    digits, 28x28 for MNIST, 32x32 for CIFAR, 64x64 for TinyImageNet. Grayscale formats
    are stored normalised float32 with ``fmt``'s statistics; RGB formats stay uint8 with
    ``fmt.mean``/``fmt.std`` returned for the training code to apply. Labels are indices
    into ``classes``.
    """
    root = Path(root)
    classes = tuple(classes)
    items = folder_image_list(root, classes)
    channels, height, width = fmt.shape
    if channels not in (1, 3):
        raise ValueError(f"folder dataset: {channels} channels are not supported (1 or 3)")
    mode = "L" if channels == 1 else "RGB"
    raw = np.empty((len(items), channels, height, width), dtype=np.uint8)

    def work(i: int) -> None:
        path = root / items[i][0]
        try:
            raw[i] = _decode_folder_image(path, (height, width), mode)
        except Exception as e:  # noqa: BLE001 - PIL raises many types for a bad file
            broken = " (a symbolic link that leads to no file)" if path.is_symlink() and not path.exists() else ""
            raise DatasetNotFoundError(
                f"folder dataset: cannot read image {path}{broken}: {type(e).__name__}: {e}; replace it with a "
                "readable image or remove it (files that are not images belong outside the class folders, "
                "or under a name without an image extension)"
            ) from e

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as ex:  # PIL releases the GIL while decoding
        list(ex.map(work, range(len(items))))
    y = torch.tensor([label for _, label in items], dtype=torch.int64)
    if fmt.normalised:
        x = torch.from_numpy(raw).to(torch.float32).div_(255.0)
        mean = torch.tensor(fmt.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(fmt.std, dtype=torch.float32).view(1, -1, 1, 1)
        x = x.sub_(mean).div_(std).contiguous()
        return FolderImages(x, y, classes, tuple(r for r, _ in items), None, None)
    return FolderImages(torch.from_numpy(raw), y, classes, tuple(r for r, _ in items), fmt.mean, fmt.std)


