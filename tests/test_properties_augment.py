"""The training augmentation's random crop and flip draw what docs/datasets-and-models.md says,
image by image: torchvision's ``RandomCrop(H, padding=4)`` then ``RandomHorizontalFlip()`` - a
crop of the zero-padded image at an offset uniform in 0..8 on each axis, mirrored with
probability 1/2 - each image its own draw from the round's generator.

Images whose every pixel holds its own value show which crop and flip each output is; over 2,000
images per example the flip rate and each offset's frequency must lie within 5.5 standard
deviations of what those probabilities give (a false alarm about once in 10^7 examples; a flip
probability of 0.4 instead of 0.5 is 9 deviations off)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedvls_flwr.data.augment import random_crop_flip
from tests.hypothesis_profiles import examples

FAST = examples(12)
PAD = 4
IMAGES = 2000
LIMIT = 5.5  # standard deviations


def windows(image: np.ndarray) -> dict[bytes, tuple[int, int, bool]]:
    """Every (offset y, offset x, flipped) crop of the zero-padded ``image`` (C, H, W), by its bytes."""
    c, h, w = image.shape
    padded = np.pad(image, ((0, 0), (PAD, PAD), (PAD, PAD)))
    out = {}
    for oy in range(2 * PAD + 1):
        for ox in range(2 * PAD + 1):
            crop = padded[:, oy:oy + h, ox:ox + w]
            for flipped, view in ((False, crop), (True, crop[:, :, ::-1])):
                out[np.ascontiguousarray(view).tobytes()] = (oy, ox, flipped)
    return out


def within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= LIMIT * (n * p * (1 - p)) ** 0.5


@FAST
@given(seed=st.integers(0, 2**32 - 1), size=st.sampled_from([(8, 8), (10, 12), (32, 32)]))
def test_every_image_draws_its_own_uniform_crop_and_fair_flip(seed, size):
    h, w = size
    # every pixel its own pair of values in 1..255 (the padding is 0): a crop names its offset
    index = np.arange(h * w).reshape(h, w)
    image = np.stack([index % 255 + 1, index // 255 + 1]).astype(np.uint8)
    batch = torch.from_numpy(np.broadcast_to(image, (IMAGES, *image.shape)).copy())
    out = random_crop_flip(batch, padding=PAD, flip=True, generator=torch.Generator().manual_seed(seed)).numpy()
    assert out.shape == batch.shape and out.dtype == np.uint8
    known = windows(image)
    drawn = [known.get(np.ascontiguousarray(o).tobytes()) for o in out]
    assert None not in drawn, "an output is no crop of the zero-padded image at offsets 0..8, flipped or not"
    flips = sum(f for _, _, f in drawn)
    assert within(flips, IMAGES, 0.5), f"{flips} of {IMAGES} images flipped"
    for axis, name in ((0, "vertical"), (1, "horizontal")):
        counts = np.bincount([d[axis] for d in drawn], minlength=2 * PAD + 1)
        assert all(within(int(c), IMAGES, 1 / (2 * PAD + 1)) for c in counts), f"{name} offsets drawn {counts.tolist()}"
