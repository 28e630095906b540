"""The network a run trains: the model zoo's network for the dataset, wrapped in what the run's
parts declare in their specs (``Part.wraps_model``: MOON's projection head). Server and clients
build it the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
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


def build_loaded(factory: Callable[[], nn.Module], state: Mapping[str, torch.Tensor],
                 device: torch.device | str = "cpu", *, take: bool = False) -> nn.Module:
    """``factory()``'s network holding ``state`` (loaded strictly), on ``device`` (where the
    client trains: its storage is made there, and the state copied there once).

    A client builds a network only to overwrite every weight with the received ones, and
    initialising them is the costly part of building: with its 11 million random draws
    ResNet-18 took 62 ms to build on a 2-core CPU, 19 ms this way. So the network is built on
    the meta device (shapes, no storage), given uninitialised storage and filled from ``state``. That is right
    only when the load writes every tensor the network holds, one name to one tensor: where a buffer
    is kept out of the state dict, where two names share one tensor (tied weights), or where the
    network cannot be built on the meta device (a wrapper that reads a value while building), it is
    built and initialised as usual. Either way ``load_state_dict``
    refuses a state that lacks a key, has one in excess or a shape that differs, as before. The
    weights are the same; what differs is that this process's global random generator is not
    advanced by the initialisation, which nothing a client computes reads (its draws come from
    seeded generators of its own).

    ``take``: the caller hands ``state``'s tensors over - nothing reads or changes them after this
    call (a client's own copy of the received arrays) - so the network holds them as its own
    (``load_state_dict(assign=True)``, moved to ``device`` where they are elsewhere) instead of
    copying them into storage made for it: on a 2-core CPU, decoding a received ResNet-18 and
    building it went from 26 to 20 ms a client (from 42 to 20 under glibc's default allocator
    settings, where that storage is 45 MB of fresh pages). Where a tensor's dtype differs from
    the network's, the state is copied as without ``take``."""
    try:
        with torch.device("meta"):
            skeleton = factory()
    except Exception:  # noqa: BLE001 - built as usual below, where a real error is raised again
        skeleton = None
    own = skeleton.state_dict(keep_vars=True) if skeleton is not None else {}
    if skeleton is not None and _fully_given(skeleton, own):
        if take and _takes(own, state):
            skeleton.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=True, assign=True)
            return skeleton
        model = skeleton.to_empty(device=device)
    else:
        model = factory().to(device)
    model.load_state_dict(dict(state), strict=True)
    return model


def _fully_given(skeleton: nn.Module, own: Mapping[str, torch.Tensor]) -> bool:
    """Whether loading a state dict writes every tensor of ``skeleton`` (``own``: its state dict,
    tensors kept), i.e. no parameter or buffer is kept out of its state dict (a state with a
    missing, extra or misshapen key is refused by the strict load, whichever way the network was
    built), and each name is a tensor of its own: ``to_empty`` gives tied weights (one tensor
    under two names) a tensor each."""
    kept = {id(t) for t in own.values()}
    return len(kept) == len(own) and all(id(t) in kept for t in (*skeleton.parameters(), *skeleton.buffers()))


def _takes(own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a network whose state dict is ``own`` (one :func:`_fully_given` accepts) may hold
    ``state``'s tensors as they are: every given tensor of its tensor's dtype (assigning keeps the
    given dtype, where a load casts). A missing or extra key, or another shape, is left to the
    strict load to refuse."""
    return all(key not in own or own[key].dtype == value.dtype for key, value in state.items())
