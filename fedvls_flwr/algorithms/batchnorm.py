"""BatchNorm and small batches: how a client's data is cut into batches, and which models
collapse the dataset's images to a 1x1 feature map before a BatchNorm layer.

In train mode a BatchNorm layer normalises each channel with the mean and variance of the
current batch, over the batch's samples and the feature map's positions. Two things make
those statistics degenerate:

* **A tiny last batch.** A client with ``n`` samples gets ``n % batch-size`` samples in its
  last batch of every epoch. One sample at a 1x1 map is an error in PyTorch ("Expected more
  than 1 value per channel when training"); two samples give each channel the outputs -1
  and +1 whatever the input, and a gradient scaled by up to ``1/sqrt(eps)``: measured on
  ``mobilenetv2`` with ``digits`` (a client of 290 samples, batch 32), the one step on the
  last batch of 2 took the largest weight from 1.1 to 1.0e6, and the averaged global model
  was destroyed. So for a model with BatchNorm a last batch smaller than half a batch joins
  the batch before it (:func:`batch_bounds`): every step sees at least ``batch-size / 2``
  samples (or the whole client, if it holds fewer), and every sample is still used once
  per epoch. Models without BatchNorm keep the plain slicing (bit-identical results).
* **A 1x1 map.** A model whose feature map shrinks to 1x1 for the dataset's input size
  (``resnet18-imagenet`` on 28x28 or 32x32 images, ``mobilenetv2`` on 8x8 ``digits``)
  normalises those channels over one value per sample. With batches of at least half the
  batch size this trains (measured: the same ``mobilenetv2`` clients with last batches of
  5, 8 and 14 samples trained normally), so it is a warning at start-up
  (:func:`feature_map_problem`); with ``batch-size = 1`` every step would fail, so that is
  refused.

A client with fewer than 2 samples cannot form a batch of 2 and fails with
:class:`TooFewSamplesError` (its reply counts as a failed client of the round).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedvls_flwr.config.run_config import ConfigError

#: The fewest samples a BatchNorm model trains on in one step (when the client has them).
MIN_BATCHNORM_SAMPLES = 2


class TooFewSamplesError(ValueError):
    """A BatchNorm model cannot train on a client with fewer than 2 samples."""


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def batch_bounds(n: int, batch_size: int, *, batchnorm: bool) -> list[tuple[int, int]]:
    """``(start, stop)`` of each batch of an epoch over ``n`` shuffled samples.

    Without BatchNorm: consecutive slices of ``batch_size`` (the last one may be shorter).
    With BatchNorm: the same, except that a last batch of fewer than ``batch_size / 2``
    samples joins the one before it (a batch of up to ``1.5 * batch_size``); raises
    :class:`TooFewSamplesError` when ``n < 2``.
    """
    if batchnorm and n < MIN_BATCHNORM_SAMPLES:
        raise TooFewSamplesError(
            f"this client holds {n} training sample(s): a model with BatchNorm normalises by the "
            f"statistics of each batch and cannot train on fewer than {MIN_BATCHNORM_SAMPLES} samples; "
            "give every client at least 2 samples (e.g. min-partition-size >= 2) or use a model "
            "without BatchNorm (mlp, cnn, logreg)"
        )
    bounds = [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    if batchnorm and len(bounds) > 1 and 2 * (bounds[-1][1] - bounds[-1][0]) < batch_size:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


@torch.no_grad()
def smallest_batchnorm_map(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The smallest feature map (spatial shape; ``()`` for a BatchNorm1d on vectors) that a
    BatchNorm layer of ``model`` sees for one input of ``input_shape``; None without BatchNorm.
    ``model`` is left as it was (one input in eval mode: nothing is updated)."""
    shapes: list[tuple[int, ...]] = []

    def keep(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        shapes.append(tuple(inputs[0].shape[2:]))

    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return None
    handles = [m.register_forward_pre_hook(keep) for m in layers]
    was_training = model.training
    try:
        model.eval()  # running statistics: a batch of one is allowed and nothing is updated
        model(torch.zeros(1, *input_shape, device=next(model.parameters()).device))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return min(shapes, key=lambda s: (math.prod(s), s))


def imagenet_resnet18_smallest_map(input_shape: tuple[int, ...]) -> tuple[int, int]:
    """The smallest map a BatchNorm layer of ``resnet18-imagenet`` sees, without importing
    torchvision (about 1.7 s of CPU, too much for ``check``): its 7x7 stride-2 stem, the
    max-pool and the stride-2 first blocks of stages 2-4 each halve the map, rounding up,
    and the last stage is the smallest. tests/test_batchnorm.py checks it against the model."""
    height, width = input_shape[-2:]
    for _ in range(5):
        height, width = (height + 1) // 2, (width + 1) // 2
    return height, width


def feature_map_problem(
    smallest: tuple[int, ...] | None, model_name: str, input_shape: tuple[int, ...], batch_size: int
) -> str | None:
    """A warning when the smallest map a BatchNorm layer of the model sees (``smallest``, see
    :func:`smallest_batchnorm_map`; None: no BatchNorm) for inputs of ``input_shape`` is 1x1
    (one value per sample); None otherwise. Raises ConfigError when that map would fail every
    step (``batch_size < 2``)."""
    if smallest is None or math.prod(smallest) > 1:
        return None
    size = "x".join(str(s) for s in input_shape)
    where = f"model {model_name!r} reduces {size} inputs to a 1x1 feature map before some of its BatchNorm layers"
    if batch_size < MIN_BATCHNORM_SAMPLES:
        raise ConfigError(
            f"run config 'batch-size' = {batch_size}: {where}, which cannot train on batches of one "
            "sample; use batch-size >= 2 or a model that keeps a larger map (resnet18, resnet32)"
        )
    return (
        f"{where}: there each channel is normalised over the batch's samples alone (one value per "
        "sample). It trains (a short last batch joins the one before it, see docs/datasets-and-models.md, "
        "'BatchNorm and the last batch'), but with noisier batch statistics than on larger images; "
        "mobilenetv2, resnet18 and resnet32 keep a 4x4 or larger map on 32x32 inputs"
    )
