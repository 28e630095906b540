"""The network a run trains: the model zoo's network for the dataset, wrapped in what the run's
parts declare in their specs (``Part.wraps_model``: MOON's projection head). Server and clients
build it the same way."""

from __future__ import annotations

from torch import nn

from fedvls_flwr.config.registry import run_parts
from fedvls_flwr.config.run_config import RunConfig, model_name
from fedvls_flwr.models import build_model


def build_run_model(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``model`` (``auto`` resolved) for inputs ``input_shape``, wrapped by every part of the
    run that wraps the network, in the order of the kinds."""
    model = build_model(model_name(cfg), input_shape, num_classes)
    values = cfg.to_flower()
    for part in run_parts(values).values():
        wrap = part.load_model_wrapper()
        if wrap is not None:
            model = wrap(model, part.own_settings(values), num_classes)
    return model
