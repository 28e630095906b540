"""The client's side of a round: received weights + config in, trained weights + metrics out."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedvls_flwr.algorithms.device import describe_device, peak_gpu_memory, set_deterministic, use_amp
from fedvls_flwr.algorithms.downlink import Received
from fedvls_flwr.algorithms.parts import ClientState, RunContext
from fedvls_flwr.algorithms.rounds import ClientRound, build_protocol
from fedvls_flwr.algorithms.run_model import build_loaded, build_run_model
from fedvls_flwr.algorithms.training import evaluate, resolve_device, to_device
from fedvls_flwr.app import keys
from fedvls_flwr.app.events import CLIENT_DATA, emit
from fedvls_flwr.app.messages import MetricValue, array_values, arrays_in, config_in, has_record, integer, names_of, numpy_record
from fedvls_flwr.config.registry import site_shares
from fedvls_flwr.config.run_config import RunConfig, parse_run_config
from fedvls_flwr.data.node_config import parse_node_config
from fedvls_flwr.data.node_data import dataset_for, node_client_data


def local_test_per_class(cfg: RunConfig, model: torch.nn.Module, device: torch.device) -> list[float]:
    bundle = dataset_for(cfg)
    res = evaluate(
        model, bundle.test_x, bundle.test_y, bundle.num_classes, device=device,
        batch_size=cfg.eval_batch_size, mean=bundle.mean, std=bundle.std,
    )
    return [float(a) for a in res.per_class_accuracy]


def torch_state_dict(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """An ArrayRecord as tensors (what ``ArrayRecord.to_torch_state_dict`` gives, read faster:
    :func:`fedvls_flwr.app.messages.array_values`)."""
    return {key: torch.from_numpy(array_values(arr)) for key, arr in record.items()}


#: The tensors this process read from node states, by the ``Array`` they came from: (a weak
#: reference to that Array, the tensor, the tensor's version then), least recently used first.
#: A node's kept record that did not change between its rounds holds the same Arrays, and
#: reading them again would copy them. At most STATE_READS_BYTES are kept (beyond, the oldest
#: are read again when asked): many nodes' large states must not double a process's memory.
_READ: OrderedDict[int, tuple[weakref.ref, torch.Tensor, int]] = OrderedDict()
STATE_READS_BYTES = 512 * 2**20
_read_bytes = 0


def _forget_read(key: int) -> None:
    global _read_bytes
    gone = _READ.pop(key, None)
    if gone is not None:
        _read_bytes -= gone[1].nbytes


def _read_state_array(arr: Array) -> torch.Tensor:
    """``arr``'s values as a tensor: the one read before when ``arr`` is the same Array and the
    tensor was not changed in place since, else a new one (its own copy)."""
    global _read_bytes
    key = id(arr)
    hit = _READ.get(key)
    if hit is not None and hit[0]() is arr and hit[1]._version == hit[2]:
        _READ.move_to_end(key)
        return hit[1]
    _forget_read(key)
    tensor = torch.from_numpy(array_values(arr))
    if tensor.nbytes <= STATE_READS_BYTES:
        _READ[key] = (weakref.ref(arr, lambda _gone: _forget_read(key)), tensor, tensor._version)
        _read_bytes += tensor.nbytes
        while _read_bytes > STATE_READS_BYTES:
            _forget_read(next(iter(_READ)))
    return tensor


def load_client_state(record: RecordDict | None) -> ClientState:
    """What this node's parts kept in its previous rounds (empty the first time, or without a
    record): one ArrayRecord per kind of part in the node's ``Context.state``."""
    state = ClientState()
    if record is None:
        return state
    for name in names_of(record, ArrayRecord):
        if name.startswith(keys.CLIENT_STATE):
            kind = name[len(keys.CLIENT_STATE):]
            values = {key: _read_state_array(arr) for key, arr in arrays_in(record, name).items()}
            state.keep(kind, values)
            state.loaded[kind] = {key: (t, t._version) for key, t in values.items()}
    return state


def save_client_state(record: RecordDict, state: ClientState) -> None:
    """``state`` into the node's ``Context.state``, in place of what it held: a kind whose part
    keeps nothing now has its record removed, and a kind whose part kept the values it was given
    (the same tensors, not changed in place) keeps its record as it is - FedConcat's frozen
    encoders, which cost more to encode again than a head round's training."""
    for name in [n for n in names_of(record, ArrayRecord) if n.startswith(keys.CLIENT_STATE)]:
        if name[len(keys.CLIENT_STATE):] not in state.kept:
            del record[name]
    for kind, kept in state.kept.items():
        name = keys.CLIENT_STATE + kind
        if has_record(record, name, ArrayRecord) and _as_loaded(kept, state.loaded.get(kind)):
            continue
        record[name] = numpy_record({k: v.detach().contiguous().cpu().numpy() for k, v in kept.items()})


def _as_loaded(kept: Mapping[str, torch.Tensor], loaded: Mapping[str, tuple[torch.Tensor, int]] | None) -> bool:
    """Whether ``kept`` is what was ``loaded``: the same names, each tensor the loaded one (or a
    view of all of it: ``detach()``) and not changed in place since (its version counter, which
    views share, is where it was)."""
    if loaded is None or list(kept) != list(loaded):
        return False
    for key, tensor in kept.items():
        before, version = loaded[key]
        if tensor.device.type != "cpu" or tensor.dtype != before.dtype or tensor.shape != before.shape \
                or tensor.stride() != before.stride() or tensor.data_ptr() != before.data_ptr() \
                or tensor._version != version:
            return False
    return True


def received_downlink(content: RecordDict, device: torch.device) -> Received:
    """What the run's parts sent besides the weights (algorithms/downlink.py); empty if nothing."""
    received = Received()
    if has_record(content, keys.DOWNLINK, ArrayRecord):
        received.arrays = {k: to_device(v, device) for k, v in
                           torch_state_dict(arrays_in(content, keys.DOWNLINK)).items()}
    if has_record(content, keys.DOWNLINK_VALUES, ConfigRecord):
        received.values = {k: float(v) for k, v in config_in(content, keys.DOWNLINK_VALUES).items()}  # type: ignore[arg-type]
    return received


def train_round(content: RecordDict, node_config: dict[str, Any], client_state: RecordDict | None = None, *,
                run_id: int | None = None) -> RecordDict:
    """One round of local training. ``client_state``: Flower's ``Context.state`` of this
    node, read and updated for the methods that keep state between rounds; ``run_id``: the
    run's (:func:`~fedvls_flwr.data.node_data.node_client_data`)."""
    config = dict(config_in(content, keys.CONFIG).items())  # items(): not Flower's checked lookup per key
    cfg = parse_run_config(config, strict=False)
    server_round = integer(config.get(keys.SERVER_ROUND, 0))
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    set_deterministic(cfg.deterministic)
    device = resolve_device(cfg.device)

    t_data = time.perf_counter()
    data = node_client_data(cfg, node_config, run_id=run_id)
    emit(CLIENT_DATA, seconds=time.perf_counter() - t_data, partition=data.partition_id)
    partition_id = data.partition_id
    received = torch_state_dict(arrays_in(content, keys.ARRAYS))

    def new_model() -> torch.nn.Module:
        return build_run_model(cfg, tuple(data.x.shape[1:]), data.num_classes)

    # Batch order depends on (seed, round, partition) only: reproducible on any node.
    seed = int(np.random.SeedSequence([cfg.seed, server_round, partition_id]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(seed)
    state = load_client_state(client_state)
    step = ClientRound(arrays=received, config=config, cfg=cfg, data=data, model_factory=new_model, device=device,
                       generator=generator, state=state, received=received_downlink(content, device),
                       arrays_owned=True)  # torch_state_dict's copies: read by nothing but this step
    protocol = build_protocol(cfg.to_flower(), RunContext(cfg))
    protocol.load_client_state(state.of("protocol"))
    with peak_gpu_memory(device) as peak_mb:
        outcome = protocol.client_train(step)
    state.keep("protocol", protocol.client_state())
    if client_state is not None:
        save_client_state(client_state, state)
    result = outcome.result
    metrics: dict[str, MetricValue] = {
        keys.NUM_EXAMPLES: result.num_examples,
        keys.TRAIN_LOSS: result.loss,
        keys.PARTITION_ID: partition_id,
        # the label distribution leaves the site only when the run asks for it (a diagnostic)
        **({keys.NUM_VACANT: result.num_vacant, keys.CLASS_COUNTS: result.class_counts}
           if cfg.share_class_counts else {}),
        **{keys.TRAIN_TERM_PREFIX + name: value for name, value in result.terms.items()},
        **({keys.PEAK_GPU_MB: peak_mb[0]} if peak_mb else {}),
    }
    if cfg.local_eval and outcome.model is not None:
        # The paper's local-update view: this client's updated model on the test set.
        metrics[keys.LOCAL_PER_CLASS_ACCURACY] = local_test_per_class(cfg, outcome.model, device)
    # C-ordered already (rounds.host_weights): the encoder's one-copy path
    weights = numpy_record({k: v.detach().cpu().numpy() for k, v in outcome.weights.items()})
    return RecordDict({
        keys.ARRAYS: weights, keys.METRICS: MetricRecord(metrics),
        keys.CLIENT_INFO: client_info(device),
    })


def where_it_runs() -> str:
    """The machine this client runs on: ``ray:<node id>`` inside a Ray actor (a simulation,
    possibly on a Ray cluster of several machines), else the host name (a SuperNode in a
    deployment). Ray is only asked when this process already imported and initialised it:
    a deployment's ClientApp does not load Ray for this."""
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            if ray.is_initialized():
                return f"ray:{ray.get_runtime_context().get_node_id()}"
        except Exception:  # noqa: BLE001 - a half-imported or shut-down Ray: say the host instead
            pass
    return socket.gethostname()


def client_info(device: torch.device) -> ConfigRecord:
    """What a reply says about the client: the device it used and the node it ran on."""
    return ConfigRecord({keys.DEVICE: describe_device(device), keys.NODE: where_it_runs()})


def evaluate_round(content: RecordDict, node_config: dict[str, Any], *, run_id: int | None = None) -> RecordDict:
    """Federated evaluation: the received global model on this node's local test split.

    Replies per-class correct/total counts so the server can pool them exactly; a node
    without a local test split (node config test-fraction = 0) replies num-examples 0.
    """
    cfg = parse_run_config(dict(config_in(content, keys.CONFIG)), strict=False)
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    set_deterministic(cfg.deterministic)
    data = node_client_data(cfg, node_config, run_id=run_id)
    metrics: dict[str, MetricValue] = {keys.NUM_EXAMPLES: 0, keys.PARTITION_ID: data.partition_id}
    if data.test_x is not None and data.test_y is not None and data.test_y.numel() > 0:
        device = resolve_device(cfg.device)
        model = build_loaded(lambda: build_run_model(cfg, tuple(data.x.shape[1:]), data.num_classes),
                             torch_state_dict(arrays_in(content, keys.ARRAYS)), device, take=True)
        res = evaluate(
            model, data.test_x, data.test_y, data.num_classes, device=device,
            batch_size=cfg.eval_batch_size, mean=data.mean, std=data.std, amp=use_amp(cfg, device),
        )
        total = torch.bincount(data.test_y, minlength=data.num_classes)
        correct = [0 if n == 0 else round(a * n) for a, n in zip(res.per_class_accuracy, total.tolist())]
        metrics.update({
            keys.NUM_EXAMPLES: res.num_examples,
            keys.LOSS_SUM: res.loss * res.num_examples,
            keys.CORRECT_PER_CLASS: correct,
            keys.TOTAL_PER_CLASS: [int(n) for n in total.tolist()],
        })
    return RecordDict({keys.METRICS: MetricRecord(metrics)})


def query_round(content: RecordDict, node_config: dict[str, Any], *, run_id: int | None = None) -> RecordDict:
    """Which partition / site this node is (from its node config; no data is loaded), so
    the server can sample by partition id, and which device it would train on, so the
    server can tell before round 1 that a GPU would go unused."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    metrics: dict[str, MetricValue] = {keys.PARTITION_ID: node_identity(node_config)}
    config = dict(config_in(content, keys.CONFIG)) if has_record(content, keys.CONFIG, ConfigRecord) else {}
    wanted = {w for w in str(config.get(keys.WANT_SHARES, "")).split(",") if w}
    if wanted:
        # only what the run's parts declare (Part.shares) leaves the site, whatever is asked
        cfg = parse_run_config(config, strict=False)
        if "class-counts" in wanted & site_shares(cfg.to_flower()):
            data = node_client_data(cfg, node_config, run_id=run_id)
            metrics[keys.CLASS_COUNTS] = [int(c) for c in torch.bincount(data.y, minlength=data.num_classes).tolist()]
    return RecordDict({
        keys.METRICS: MetricRecord(metrics),
        keys.CLIENT_INFO: client_info(device),
    })


def node_identity(node_config: dict[str, Any]) -> int:
    """The node's partition id (partition form), or its site's id (node-local form)."""
    return parse_node_config(node_config).partition_id


@contextlib.contextmanager
def naming_the_site(node_config: dict[str, Any]) -> Iterator[None]:
    """Prefix an error with the node's partition / site, so the server's record of a failed
    client says which site it was (Flower only knows its random node id)."""
    try:
        yield
    except Exception as err:
        try:
            who = f"partition {node_identity(node_config)}"
        except Exception:  # noqa: BLE001 - the node config itself is what failed
            raise err from None
        raise type(err)(f"[{who}] {err}") if _rebuildable(err) else RuntimeError(f"[{who}] {err}") from err


def _rebuildable(err: Exception) -> bool:
    try:
        type(err)("probe")
    except Exception:  # noqa: BLE001
        return False
    return True
