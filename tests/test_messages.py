"""Reading an Array's values without np.load gives exactly what Flower's ``Array.numpy()`` gives."""

import numpy as np
import pytest
from flwr.app import Array

from fedvls_flwr.app.messages import array_values

CASES = {
    "0-d float": np.zeros(()),
    "0-d int64 (BatchNorm's num_batches_tracked)": np.array(7, np.int64),
    "float32 matrix": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32),
    "empty float16": np.zeros((0, 3), np.float16),
    "bool": np.array([True, False, True]),
    "float64 3-d": np.random.default_rng(1).random((2, 3, 4)),
    "fortran order": np.asfortranarray(np.random.default_rng(2).random((3, 4))),
    "big-endian": np.arange(12, dtype=">f4").reshape(3, 4),
    "a strided view": np.random.default_rng(3).random((3, 4))[:, ::2],
    "uint8 image": np.random.default_rng(4).integers(0, 255, (2, 3, 8, 8), dtype=np.uint8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_array_values_equal_flowers_own_decoding(name):
    arr = Array(np.asarray(CASES[name]))
    ours, flowers = array_values(arr), arr.numpy()
    assert ours.dtype == flowers.dtype and ours.shape == flowers.shape
    assert np.array_equal(ours, flowers) and ours.flags.writeable
    ours[...] = 0 if ours.size else ours  # a copy: the message's bytes are never written
    assert np.array_equal(arr.numpy(), flowers)
