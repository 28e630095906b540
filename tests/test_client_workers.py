"""The in-process engine's client workers: how many, on which device (the federation config read
as Flower's Ray simulation reads it), and the pool's plumbing with real worker processes - a
node's state across workers, a client that raises, a worker that is killed, the arrays a round
shares sent once per worker. End to end (whole runs, equality with Ray): test_e2e_inprocess.py
and test_e2e_client_workers.py."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.supercore.run import Run

from fedvls_flwr.config.client_resources import NodeRoom, clients_at_once, room_problem, this_machine
from fedvls_flwr.ops.client_pool import ClientPool, ClientWorkersFailed
from fedvls_flwr.ops.client_worker import decode_records, encode_records, run_client
from fedvls_flwr.ops.inprocess import InProcessGrid
from fedvls_flwr.ops.resources import (
    Machine,
    WorkerPlan,
    cuda_visible_devices,
    plan_workers,
    resource_problem,
    room_for_runs,
    share_machine,
)

pytestmark = pytest.mark.usefixtures("run_identity")


def gpus(count: int, share: float = 1.0) -> tuple[tuple[int, float], ...]:
    return tuple((i, share) for i in range(count))


# ---- the device assignment ------------------------------------------------------------------
def test_cpu_workers_are_the_cores_over_num_cpus_at_most_one_per_node():
    plan = plan_workers(Machine(2), 1, 0, 10)
    assert plan.devices == ((), ()) and plan.threads == 1 and not plan.in_this_process
    assert plan.describe().startswith("2 workers: 2 on the CPU, 1 thread each")
    assert plan_workers(Machine(16), 2, 0, 10).workers == 8
    assert plan_workers(Machine(16), 1, 0, 3).workers == 3  # no worker without a node
    assert plan_workers(Machine(16), 1, 0, 10, most=4).workers == 4
    assert plan_workers(Machine(2), 0.5, 0, 10).workers == 4  # fractional CPUs, as Ray packs them


def test_one_worker_without_a_gpu_to_hide_runs_in_this_process():
    alone = plan_workers(Machine(2), 2, 0, 10)
    assert alone.workers == 1 and alone.in_this_process
    assert alone.describe().startswith("1 worker: the clients run one after another in this process, 2 threads each")
    # on a GPU machine a client that asks for no GPU must not see it: a process of its own
    hidden = plan_workers(Machine(2, gpus(1)), 2, 0, 10)
    assert hidden.workers == 1 and hidden.devices == ((),) and not hidden.in_this_process
    # a lone worker given the GPU too: a client that breaks its CUDA context must not take the
    # server's process (its evaluation, the next clients) with it - a worker is replaced
    for alone_on_gpu in (plan_workers(Machine(16, gpus(1)), 1, 1.0, 4), plan_workers(Machine(16, gpus(1)), 1, 0.25, 1)):
        assert alone_on_gpu.devices == ((0,),) and not alone_on_gpu.in_this_process


def test_threads_are_num_cpus_unless_torch_threads_says_otherwise():
    assert (plan_workers(Machine(8), 2, 0, 4).threads, plan_workers(Machine(8), 2, 0, 4).omp_threads) == (2, 2)
    set_ = plan_workers(Machine(8), 2, 0, 4, torch_threads=1)
    assert (set_.threads, set_.omp_threads) == (1, 2)
    assert plan_workers(Machine(8), 0.5, 0, 4).omp_threads == 1


def test_gpu_fractions_pack_per_gpu_and_spread_over_every_gpu():
    one = plan_workers(Machine(16, gpus(1)), 1, 0.25, 4)
    assert one.devices == ((0,),) * 4 and one.describe().startswith("4 workers: 4 on cuda:0, 1 thread each")
    two = plan_workers(Machine(16, gpus(2)), 1, 0.25, 10)
    assert two.devices == ((0,), (1,)) * 4 and "4 on cuda:0, 4 on cuda:1" in two.describe()
    # fewer workers than slots: still every GPU, in turn
    assert plan_workers(Machine(16, gpus(2)), 1, 0.25, 3).devices == ((0,), (1,), (0,))
    # a fraction's slots per GPU: floor(1 / fraction), exactly (0.1 -> 10, not 9)
    for fraction, per_gpu in ((0.1, 10), (0.2, 5), (0.3, 3), (0.4, 2), (0.5, 2), (0.6, 1), (1.0, 1)):
        assert plan_workers(Machine(64, gpus(3)), 1, fraction, 100).workers == 3 * per_gpu, fraction
    # whole GPUs per client take whole GPUs, together
    assert plan_workers(Machine(16, gpus(4)), 1, 2, 10).devices == ((0, 1), (2, 3))
    assert "2 on cuda:0+cuda:1" not in plan_workers(Machine(16, gpus(4)), 1, 2, 10).describe()
    # the cores still bound it
    assert plan_workers(Machine(4, gpus(1)), 2, 0.25, 10).devices == ((0,), (0,))


@pytest.mark.parametrize("cores, gpu_count, num_cpus, num_gpus", [
    (2, 0, 1, 0), (2, 0, 2, 0), (16, 0, 3, 0), (16, 1, 1, 0.25), (16, 1, 2, 0.25), (16, 2, 1, 0.5),
    (8, 4, 1, 1), (64, 2, 1, 0.1), (16, 1, 1, 0), (4, 2, 1, 0.2), (32, 4, 2, 2),
])
def test_the_worker_count_is_the_ray_simulations_actor_count(monkeypatch, cores, gpu_count, num_cpus, num_gpus):
    """Flower's own sizing (pool_size_from_resources, on a one-node Ray reporting these
    resources) gives as many actors as the plan gives workers (with nodes to spare)."""
    ray = pytest.importorskip("ray")
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    resources = {"CPU": cores, **({"GPU": gpu_count} if gpu_count else {})}
    monkeypatch.setattr(ray, "nodes", lambda: [{"Resources": resources}])
    flower = pool_size_from_resources({"num_cpus": num_cpus, "num_gpus": num_gpus})
    assert plan_workers(Machine(cores, gpus(gpu_count)), num_cpus, num_gpus, 1000).workers == flower


def test_gpus_torch_cannot_use_are_not_planned_and_the_plan_says_why(monkeypatch):
    """The device files and CUDA_VISIBLE_DEVICES can show more GPUs than torch can use (an index
    past the last GPU, a CPU-only torch on a GPU machine): a process that has torch plans with
    torch's count (workers on a GPU that is not there would fail at their first message, or
    train on the CPU under a line that says cuda) and says so in the plan and in a refusal."""
    import sys

    import torch

    from fedvls_flwr.ops.resources import detect_machine

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    machine = detect_machine()
    assert machine.gpus == ((0, 1.0),)
    assert "torch in this process sees 1 of the 4 GPU(s)" in machine.note and "'0,1,2,3'" in machine.note
    plan = plan_workers(machine, 1, 0.25, 10)
    assert set(plan.devices) == {(0,)} and machine.note in plan.describe()

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    machine = detect_machine()
    assert machine.gpus == ()
    problem = resource_problem(1, 0.25, machine)
    assert problem is not None and "has no GPU" in problem and "sees 0 of the 4 GPU(s)" in problem
    assert resource_problem(1, 0, machine) is None  # CPU clients: nothing to say

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # torch agrees: nothing to say
    assert detect_machine().gpus == gpus(4) and detect_machine().note == ""
    monkeypatch.delitem(sys.modules, "torch")  # fedvls check, the sweep's planner: no torch loaded
    assert detect_machine().gpus == gpus(4)


def test_a_config_the_machine_cannot_serve_is_refused_with_the_fix():
    assert resource_problem(1, 0, Machine(2)) is None
    assert resource_problem(1, 0.25, Machine(2, gpus(1))) is None
    no_gpu = resource_problem(1, 0.25, Machine(2))
    assert no_gpu is not None and "this machine has no GPU" in no_gpu
    assert "Leave client-resources-num-gpus out (or 0) to train on the CPU" in no_gpu
    too_many = resource_problem(4, 0, Machine(2))
    assert too_many is not None and "more CPUs per client than this machine has (2)" in too_many
    assert "Give at most client-resources-num-cpus=2" in too_many
    odd = resource_problem(1, 1.5, Machine(8, gpus(4)))
    assert odd is not None and "whole GPUs" in odd
    two = resource_problem(1, 2, Machine(8, gpus(1)))
    assert two is not None and "more GPUs per client than this machine has on one node (1)" in two
    assert resource_problem(0, 0, Machine(2)) is not None


ASKS = list(itertools.product((1, 2, 3, 64), (0.0, 0.1, 0.25, 0.4, 0.5, 1.0, 2.0)))


@pytest.mark.parametrize("cores, gpu_count", [(2, 0), (16, 1), (16, 2), (64, 3), (4, 4)])
def test_the_worker_plan_and_fedvls_checks_rule_are_one_count(cores, gpu_count):
    """One rule: the workers are config/client_resources.py's clients_at_once (what ``fedvls
    check`` and flwr run's ServerApp refuse a federation by when it is 0), less only the GPU
    places a fraction cannot span (0.4 on two GPUs: Flower counts 5, two fit on each GPU); the
    engine refuses exactly where the check does."""
    machine = Machine(cores, gpus(gpu_count))
    for num_cpus, num_gpus in ASKS:
        federation = {"client-resources-num-cpus": num_cpus, "client-resources-num-gpus": num_gpus}
        count = clients_at_once(federation, [NodeRoom(cores, gpu_count)])
        checked = room_problem(federation, [this_machine(federation, cpus=cores, gpus=gpu_count)])
        refused = resource_problem(num_cpus, num_gpus, machine)
        assert (checked is None) == (refused is None) == (count > 0), (num_cpus, num_gpus)
        if count == 0:
            continue
        workers = plan_workers(machine, num_cpus, num_gpus, 1000).workers
        if num_gpus == 0 or num_gpus >= 1 or (1 / num_gpus).is_integer():
            assert workers == count, (num_cpus, num_gpus)
        else:
            assert workers == min(count, gpu_count * math.floor(1 / num_gpus)), (num_cpus, num_gpus)


@pytest.mark.parametrize("cores, num_cpus", [(2, 1), (2, 2), (2, 3), (6, 4), (8, 3)])
def test_fedvls_check_and_fedvls_run_refuse_and_size_alike_from_the_command_line(cores, num_cpus, monkeypatch,
                                                                                   capsys):
    """The same federation through the commands: ``fedvls check`` refuses it exactly when the
    in-process engine's start-up does, and otherwise the engine plans Flower's count of workers."""
    from fedvls_flwr.experiments.check import main as check_main
    from fedvls_flwr.experiments.run import engine_federation, machine_for
    from fedvls_flwr.ops.inprocess import client_plan

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    federation = {"num-supernodes": 100, "init-args-num-cpus": cores, "client-resources-num-cpus": num_cpus}
    text = " ".join(f"{k}={v}" for k, v in federation.items())
    checked = check_main(["--no-data", "--federation-config", text])
    capsys.readouterr()
    try:
        engine = engine_federation(dict(federation), [])
    except ValueError:
        engine = None
    assert (checked == 0) == (engine is not None)
    if engine is not None:
        plan = client_plan({}, 100, num_cpus, 0.0, machine_for(engine))
        assert plan.workers == clients_at_once(federation, [NodeRoom(cores, 0)]) == cores // num_cpus


def test_parallel_runs_share_cores_and_gpus():
    assert [m.cores for m in share_machine(Machine(2), 2)] == [1, 1]
    halves = share_machine(Machine(16, gpus(1)), 2)
    assert [m.gpus for m in halves] == [((0, 0.5),), ((0, 0.5),)] and halves[0].cores == 8
    assert [plan_workers(m, 1, 0.25, 10).workers for m in halves] == [2, 2]  # 4 clients on the GPU in all
    assert [m.gpus for m in share_machine(Machine(16, gpus(3)), 2)] == [((0, 1.0),), ((1, 1.0), (2, 1.0))]
    assert [m.gpus for m in share_machine(Machine(16, gpus(2)), 4)] == [((0, 0.5),), ((1, 0.5),)] * 2
    assert room_for_runs(Machine(2), 1, 0) == 2 and room_for_runs(Machine(16, gpus(1)), 1, 0.25) == 4
    assert room_for_runs(Machine(2), 4, 0) == 0
    # the room is what the shares hold: each run keeps at least one worker
    for parallel in range(1, room_for_runs(Machine(16, gpus(2)), 2, 0.25) + 1):
        assert all(plan_workers(m, 2, 0.25, 10).workers >= 1 and not resource_problem(2, 0.25, m)
                   for m in share_machine(Machine(16, gpus(2)), parallel))


def test_a_worker_sees_its_own_gpus_and_none_when_it_asked_for_none():
    assert cuda_visible_devices(()) == ""
    assert cuda_visible_devices((1,)) == "1"
    assert cuda_visible_devices((0, 1)) == "0,1"
    assert cuda_visible_devices((1,), "3,5") == "5"  # the parent's own numbering
    assert cuda_visible_devices((0,), "GPU-abc,GPU-def") == "GPU-abc"


# ---- records on the wire ----------------------------------------------------------------------
def test_records_survive_the_wire_in_order_with_arrays_sent_by_number():
    arrays = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)),
                          "n": Array(np.array(7, dtype=np.int64))})  # a 0-d array (BatchNorm's counter)
    content = RecordDict({"b-config": ConfigRecord({"x": 1, "s": "t", "l": [1.5, 2.0], "f": True, "raw": b"\x00"}),
                          "a-arrays": arrays, "m": MetricRecord({"q": 0.5, "v": [1, 2]})})
    blobs: list[bytes] = []

    def number(data: bytes) -> int:
        blobs.append(data)
        return len(blobs) - 1

    back = decode_records(encode_records(content, number), blobs.__getitem__)
    assert list(back.keys()) == list(content.keys())
    assert dict(back.config_records["b-config"]) == dict(content.config_records["b-config"])
    assert dict(back.metric_records["m"]) == dict(content.metric_records["m"])
    for key, array in arrays.items():
        got = back.array_records["a-arrays"][key]
        assert (got.dtype, got.shape, got.stype, got.data) == (array.dtype, array.shape, array.stype, array.data)
        assert np.array_equal(got.numpy(), array.numpy())


# ---- the pool, with real worker processes --------------------------------------------------------
def pool_grid(workers: int, nodes: int = 3, app: str = "tests.worker_apps:app") -> tuple[InProcessGrid, ClientPool]:
    from tests import worker_apps

    pool = ClientPool(WorkerPlan(((),) * workers, threads=1, omp_threads=1, gpu_free_machine=False), app)
    grid = InProcessGrid(worker_apps.app, Run.create_empty(11), {}, nodes, pool=pool)
    return grid, pool


def train_round(grid: InProcessGrid, do: dict[int, str] | None = None, size: int = 4) -> dict[int, Message]:
    """One message to every node, all sharing one RecordDict (as the strategy sends them); the
    replies by partition."""
    do = do or {}
    shared = RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(size, dtype=np.float32))}),
                         "config": ConfigRecord({"do": "count"})})
    by_partition = {int(c.node_config["partition-id"]): n for n, c in grid.contexts.items()}
    messages = []
    for partition, node in sorted(by_partition.items()):
        content = shared if partition not in do else RecordDict(
            {"arrays": shared.array_records["arrays"], "config": ConfigRecord({"do": do[partition]})})
        messages.append(Message(content, dst_node_id=node, message_type="train"))
    replies = list(grid.send_and_receive(messages, timeout=120))
    assert len(replies) == len(messages)
    destination = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
    node_partition = {n: p for p, n in by_partition.items()}
    return {node_partition[destination[r.metadata.reply_to_message_id]]: r for r in replies}


def counts(grid: InProcessGrid) -> dict[int, int]:
    return {int(c.node_config["partition-id"]): int(c.state.config_records["seen"]["count"])
            for c in grid.contexts.values() if "seen" in c.state.config_records}


def test_a_nodes_state_persists_across_its_messages_whichever_worker_takes_them():
    grid, pool = pool_grid(workers=2, nodes=5)
    with pool:
        pool.wait_started()
        pids = set()
        for rnd in range(1, 5):
            replies = train_round(grid, dict.fromkeys(range(5), "slow") if rnd == 1 else None)  # both workers serve
            assert {p: int(r.content.metric_records["metrics"]["count"]) for p, r in replies.items()} == \
                dict.fromkeys(range(5), rnd)
            pids |= {int(r.content.metric_records["metrics"]["pid"]) for r in replies.values()}
            assert all(r.metadata.message_id and not r.has_error() for r in replies.values())
        assert counts(grid) == dict.fromkeys(range(5), 4)  # the parent holds every node's state
        assert len(pids) == 2 and pids == set(pool.pids())  # both workers served, none in this process
        history = next(iter(grid.contexts.values())).state.array_records["history"]["last"].numpy()
        assert history.tolist() == [4, 4, 4]


class Colour(str):
    pass


@pytest.mark.parametrize("workers", [0, 1], ids=["in-this-process", "a-worker"])
def test_a_message_and_its_reply_carry_what_flowers_wire_gives_with_or_without_workers(workers):
    """The ClientApp sees numpy scalars as floats, a str subclass as a str, a list typed by its
    first value; the server gets the reply's numpy scalar as a float; a bad value put into a list
    after its check is refused at the push - as under ``flwr run``, on either engine path."""
    from tests import worker_apps

    if workers:
        grid, pool = pool_grid(workers=workers, nodes=1)
    else:
        grid, pool = InProcessGrid(worker_apps.app, Run.create_empty(11), {}, 1), None
    node = next(iter(grid.contexts))
    with pool if pool is not None else contextlib.nullcontext():
        config = ConfigRecord({"f": np.float64(0.5), "l": [1, True], "s": Colour("x"), "p": [0.5, 1.5]})
        replies = list(grid.send_and_receive(
            [Message(RecordDict({"config": config}), dst_node_id=node, message_type="query")], timeout=120))
        assert len(replies) == 1 and not replies[0].has_error()
        assert list(replies[0].content.config_records["seen"]["types"]) == [
            "f:float", "l:list int,int", "s:str", "p:list float,float"]
        half = replies[0].content.metric_records["metrics"]["half"]
        assert type(half) is float and half == 0.5
        bad = ConfigRecord({"l": [1, 2]})
        bad["l"].append("x")  # Flower checks a value when it is set, not a list changed later
        with pytest.raises(TypeError):
            grid.push_messages([Message(RecordDict({"config": bad}), dst_node_id=node, message_type="query")])


@pytest.mark.parametrize("workers", [0, 1], ids=["in-this-process", "a-worker"])
def test_the_servers_random_generators_never_see_what_its_clients_draw(workers):
    """Clients that draw from the global generators (Python's, numpy's, torch's) leave the
    server's process's generators as they were, also when they run in that process; the messages
    one process serves draw from its generators in turn, round after round, as a Ray actor's
    messages do (the same numbers for every client, or every round, would be no process's
    behaviour)."""
    import random

    import torch

    from tests import worker_apps

    if workers:
        grid, pool = pool_grid(workers=workers, nodes=3)
    else:
        grid, pool = InProcessGrid(worker_apps.app, Run.create_empty(11), {}, 3), None
    drawn = []
    with pool if pool is not None else contextlib.nullcontext():
        for _round in range(2):
            before = random.getstate(), np.random.get_state(), torch.get_rng_state()
            replies = train_round(grid, dict.fromkeys(range(3), "draw"))
            after = random.getstate(), np.random.get_state(), torch.get_rng_state()
            assert after[0] == before[0]
            assert all(np.array_equal(a, b) for a, b in zip(after[1], before[1]))
            assert torch.equal(after[2], before[2])
            drawn += [list(r.content.metric_records["metrics"]["drawn"]) for _, r in sorted(replies.items())]
    for generator in range(3):  # Python's, numpy's, torch's: each message of both rounds drew a number of its own
        assert len({d[generator] for d in drawn}) == 6, drawn


class FakeCuda:
    """torch.cuda's generator functions on a machine without a GPU, put in torch.cuda's place:
    per device a generator state (its seed, the draws so far), made when CUDA opens from the
    seed ``manual_seed_all`` last asked for (as torch.manual_seed asks, lazily); ``fail_reads``:
    reading a state fails as after a CUDA error."""

    def __init__(self, devices: int = 2) -> None:
        self.devices, self.opened, self.fail_reads = devices, False, False
        self.states: dict[int, tuple[int, int]] = {}
        self.queued_seed = 2**40 + 1  # torch's: a nondeterministic one, when nothing asked

    def is_initialized(self) -> bool:
        return self.opened

    def device_count(self) -> int:
        return self.devices

    def draw(self, device: int = 0) -> tuple[int, int]:
        """A client's draw on the GPU (the first one opens CUDA)."""
        if not self.opened:
            self.opened = True
            self.states = dict.fromkeys(range(self.devices), (self.queued_seed, 0))
        seed, drawn = self.states[device]
        self.states[device] = (seed, drawn + 1)
        return seed, drawn

    def get_rng_state(self, device: int = 0) -> tuple[int, int]:
        if self.fail_reads:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.states[device]

    def set_rng_state(self, state: tuple[int, int], device: int = 0) -> None:
        self.states[device] = state

    def manual_seed_all(self, seed: int) -> None:
        if self.opened:
            self.states = dict.fromkeys(range(self.devices), (int(seed), 0))
        else:
            self.queued_seed = int(seed)


@pytest.fixture
def fake_cuda(monkeypatch):
    import torch

    fake = FakeCuda()
    for name in ("is_initialized", "device_count", "get_rng_state", "set_rng_state", "manual_seed_all"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def cpu_generators():
    import random

    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def assert_same_cpu_generators(after, before):
    import torch

    assert after[0] == before[0]
    assert all(np.array_equal(a, b) for a, b in zip(after[1], before[1]))
    assert torch.equal(after[2], before[2])


def clients_draw():
    import random

    import torch

    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_cuda_a_round_opens_leaves_the_servers_generators_as_torch_would_have_made_them(fake_cuda):
    """The server had not opened CUDA, a client does: the server's CUDA generators are not where
    the clients' draws took them, but as torch makes them for the server, from the seed its
    torch.manual_seed asked for; the clients' go on from round to round."""
    import torch

    from fedvls_flwr.ops.client_worker import ClientGenerators, generators_apart

    fake_cuda.queued_seed = torch.initial_seed()  # as torch.manual_seed (or torch.seed) leaves it
    clients = ClientGenerators()
    with generators_apart(clients):
        first = [fake_cuda.draw(0), fake_cuda.draw(1), fake_cuda.draw(0)]
    assert first == [(torch.initial_seed(), 0), (torch.initial_seed(), 0), (torch.initial_seed(), 1)]
    assert fake_cuda.states == dict.fromkeys(range(2), (torch.initial_seed(), 0))
    server_draw = fake_cuda.draw(0)
    with generators_apart(clients):
        assert fake_cuda.draw(0) == (torch.initial_seed(), 2)  # the clients' own sequence goes on
    assert fake_cuda.states == {0: (torch.initial_seed(), 1), 1: (torch.initial_seed(), 0)}
    assert server_draw == (torch.initial_seed(), 0)


def test_a_cuda_seed_a_client_asks_for_before_cuda_opens_is_not_the_servers(fake_cuda):
    import torch

    from fedvls_flwr.ops.client_worker import ClientGenerators, generators_apart

    fake_cuda.queued_seed = torch.initial_seed()
    with generators_apart(ClientGenerators()):
        fake_cuda.manual_seed_all(99)  # a client's torch.manual_seed(99), CUDA not open yet
    assert fake_cuda.draw(0) == (torch.initial_seed(), 0)  # the server opens CUDA later


@pytest.mark.parametrize("clients_raise", [True, False], ids=["clients-raise", "clients-return"])
def test_a_cuda_error_on_the_way_out_leaves_the_server_its_generators_and_hides_no_error(fake_cuda, clients_raise):
    """Reading the clients' CUDA generators fails (a CUDA error): the server's generators are
    back all the same; the clients' error is the one raised, else the CUDA error."""
    from fedvls_flwr.ops.client_worker import ClientGenerators, generators_apart

    fake_cuda.draw(0)  # the server has opened CUDA
    server_cuda = dict(fake_cuda.states)
    clients = ClientGenerators()
    before = cpu_generators()
    expected = ValueError if clients_raise else RuntimeError
    with pytest.raises(expected) as raised, generators_apart(clients):
        clients_draw()
        fake_cuda.draw(0)
        fake_cuda.fail_reads = True
        if clients_raise:
            raise ValueError("the client's own error")
    assert ("the client's own error" if clients_raise else "CUDA error") in str(raised.value)
    assert_same_cpu_generators(cpu_generators(), before)
    assert fake_cuda.states == server_cuda
    # the clients' CPU generators were kept: the next round's clients go on from them
    fake_cuda.fail_reads = False
    with generators_apart(clients):
        again = clients_draw()
    assert again != clients_draw()


def test_one_nodes_messages_run_one_after_another():
    grid, pool = pool_grid(workers=3, nodes=1)
    node = next(iter(grid.contexts))
    with pool:
        messages = [Message(RecordDict({"config": ConfigRecord({"do": "count"})}), dst_node_id=node,
                            message_type="train") for _ in range(4)]
        replies = list(grid.send_and_receive(messages, timeout=120))
    assert sorted(int(r.content.metric_records["metrics"]["count"]) for r in replies) == [1, 2, 3, 4]
    assert counts(grid) == {0: 4}


def test_a_client_that_raises_gives_the_same_error_reply_as_in_this_process_and_keeps_its_state():
    from tests import worker_apps

    grid, pool = pool_grid(workers=2)
    with pool:
        train_round(grid)
        replies = train_round(grid, do={1: "raise"})
        third = train_round(grid)
    failed = replies[1]
    assert failed.has_error() and failed.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    # the same reply the ClientApp gives when it runs in this process
    context = next(c for c in grid.contexts.values() if c.node_config["partition-id"] == 1)
    here, returned = run_client(worker_apps.app, Message(RecordDict({"config": ConfigRecord({"do": "raise"})}),
                                                         dst_node_id=context.node_id, message_type="train"),
                                context, threads=1)
    assert not returned and here.error.code == failed.error.code
    assert here.error.reason == failed.error.reason.replace("count 2", "count 3")
    assert "asked to raise at count 2" in failed.error.reason
    # its state stayed as it was before the message that raised: the third round counts 2, the others 3
    assert {p: int(r.content.metric_records["metrics"]["count"]) for p, r in third.items()} == {0: 3, 1: 2, 2: 3}


def test_a_killed_worker_fails_only_the_message_it_held_and_is_started_again():
    grid, pool = pool_grid(workers=2, nodes=4)
    with pool:
        pool.wait_started()
        train_round(grid)
        before = set(pool.pids())
        replies = train_round(grid, do={2: "die"})
        pool.wait_started()  # the new worker
        after = set(pool.pids())
        third = train_round(grid)
    died = replies[2]
    assert died.has_error() and died.error.code == ErrorCode.CLIENT_APP_CRASHED
    assert "killed by SIGKILL" in died.error.reason and "started again" in died.error.reason
    assert all(not r.has_error() for p, r in replies.items() if p != 2)
    assert len(pool.crashes) == 1 and len(after) == 2 and len(before & after) == 1  # one new worker
    # the node's state is the one before the killed message; everyone else counted on
    assert {p: int(r.content.metric_records["metrics"]["count"]) for p, r in third.items()} == {0: 3, 1: 3, 2: 2, 3: 3}
    assert signal.SIGKILL.name in pool.crashes[0]


def test_a_worker_killed_while_idle_fails_no_message_and_is_started_again():
    """Killed between two rounds (the out-of-memory killer, a kept pool between two runs): the
    next message handed to it goes back to the queue, a fresh worker runs it, and no message
    fails (before, the message that met the dead worker failed as if it had crashed it)."""
    grid, pool = pool_grid(workers=1, nodes=2)
    with pool:
        pool.wait_started()
        train_round(grid)
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        replies = train_round(grid)
        assert pool.pids() and pool.pids() != [pid]
    assert all(not r.has_error() for r in replies.values())
    assert counts(grid) == {0: 2, 1: 2}
    assert len(pool.crashes) == 1 and "before it took this train message" in pool.crashes[0]


def test_a_reply_the_server_refuses_fails_the_run_as_without_workers_and_the_pool_goes_on():
    """A ClientApp that puts a value Flower refuses into its reply (after the record's own
    check): the server raises Flower's TypeError, as it does when the client runs in its own
    process - not a round that waits for the reply until its timeout (the pool's thread ended
    on that error before) - and the pool still serves the next run."""
    from tests import worker_apps

    alone = InProcessGrid(worker_apps.app, Run.create_empty(11), {}, 2)
    with pytest.raises(TypeError, match="MetricRecord"):
        train_round(alone, do={0: "refused"})
    grid, pool = pool_grid(workers=1, nodes=2)
    with pool:
        with pytest.raises(TypeError, match="same valid type|MetricRecord"):
            train_round(grid, do={0: "refused"})
        pool.forget()  # the run ended
        replies = train_round(grid)
        assert pool.alive and all(thread.is_alive() for thread in pool._threads)
    assert all(not r.has_error() for r in replies.values())


def test_an_error_in_the_pools_own_thread_fails_the_message_and_replaces_the_worker():
    """Whatever goes wrong in this process while it serves a worker, the message that worker
    held gets an error reply and a fresh worker takes the next ones: no message is left
    without an answer and no node stays busy for the rest of the run."""
    grid, pool = pool_grid(workers=1, nodes=2)
    receive = pool._receive
    broken = []

    def receive_once_broken(slot, task):
        if not broken:
            broken.append(task)
            raise RuntimeError("a planted error")
        return receive(slot, task)

    pool._receive = receive_once_broken  # type: ignore[method-assign]
    with pool:
        pool.wait_started()
        first = set(pool.pids())
        replies = train_round(grid)
        pool.wait_started()
        again = train_round(grid)
        assert set(pool.pids()).isdisjoint(first)
    failed = [r for r in replies.values() if r.has_error()]
    assert len(failed) == 1 and failed[0].error.code == ErrorCode.CLIENT_APP_CRASHED
    assert "RuntimeError: a planted error" in failed[0].error.reason
    assert all(not r.has_error() for r in again.values())
    assert sorted(counts(grid).values()) == [1, 2]  # the failed message's node kept its state


def test_an_error_after_a_message_was_handed_over_gives_it_one_reply():
    """The server's bookkeeping fails just after a message went to its worker (planted): the
    message fails once, with that error, and is not run again by the fresh worker (it was held
    twice before: one crash reply, then a second reply for the same message)."""
    grid, pool = pool_grid(workers=1, nodes=1)
    spent, calls = pool._spent, []

    def spent_once_broken(seconds):
        calls.append(seconds)
        if len(calls) == 1:
            raise RuntimeError("a planted error after the hand-over")
        return spent(seconds)

    pool._spent = spent_once_broken  # type: ignore[method-assign]
    with pool:
        pool.wait_started()
        (node,) = grid.contexts
        (sent,) = grid.push_messages([Message(RecordDict({"config": ConfigRecord({"do": "count"})}), dst_node_id=node,
                                              message_type="train")])
        (first,) = pool.collect([sent], wait=60)
        pool.wait_started()
        time.sleep(1.0)  # room for the fresh worker to run it again, as it did
        again = pool.collect([sent])
    assert first.has_error() and "a planted error after the hand-over" in first.error.reason
    assert again == [] and counts(grid) == {}


def test_a_message_of_an_ended_run_is_not_run_again_when_its_worker_is_replaced(tmp_path, monkeypatch):
    """A kept pool: the run ends (forget) while a worker holds its messages - one running, one
    queued behind it; when that worker dies, the queued one is dropped, not run by the fresh
    worker at the start of the next run (its reply would be thrown away)."""
    from tests.worker_apps import LINGERING_ENV

    marker = tmp_path / "lingering"
    monkeypatch.setenv(LINGERING_ENV, str(marker))
    grid, pool = pool_grid(workers=1, nodes=3)
    with pool:
        pool.wait_started()
        nodes = sorted(grid.contexts, key=lambda n: int(grid.contexts[n].node_config["partition-id"]))
        grid.push_messages([Message(RecordDict({"config": ConfigRecord({"do": do})}), dst_node_id=node,
                                    message_type="train") for node, do in zip(nodes, ["linger", "count", "count"])])
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text() and len(pool.slots[0].held) == 2):
            assert time.monotonic() < deadline, "the worker never took the first two messages"
            time.sleep(0.02)
        pool.forget()
        os.kill(int(marker.read_text()), signal.SIGKILL)
        pool.wait_started()
        time.sleep(0.5)  # room for the fresh worker to run what it was (wrongly) given
        assert pool._pending == [] and not pool.slots[0].held
    assert counts(grid) == {}  # nothing of the ended run ran


@pytest.mark.parametrize("slowed", ["encoding the node's state", "sending the arrays"])
def test_closing_while_a_message_is_handed_over_stops_the_worker_before_it_runs_it(tmp_path, monkeypatch, slowed):
    """close() (a stopped run) while a message is on its way to a worker - being prepared, or
    being sent: the message is not handed over, or its worker counts as busy and is terminated;
    either way the client never runs while close() waits for it (before, a worker looked idle
    until the message was all sent: the client ran, and close() waited 15 s for it)."""
    import threading

    from fedvls_flwr.ops import client_pool
    from fedvls_flwr.ops.client_worker import Bulk
    from tests.worker_apps import LINGERING_ENV

    marker = tmp_path / "lingering"
    monkeypatch.setenv(LINGERING_ENV, str(marker))
    on_its_way = threading.Event()

    def slowed_down(real):
        def slow(*args, **kwargs):
            if threading.current_thread().name.startswith("fedvls-client-worker"):  # the pool's, not submit's
                on_its_way.set()
                time.sleep(1.5)
            return real(*args, **kwargs)
        return slow

    if slowed == "sending the arrays":
        monkeypatch.setattr(Bulk, "send_rest", slowed_down(Bulk.send_rest))
    else:
        monkeypatch.setattr(client_pool, "encode_records", slowed_down(client_pool.encode_records))
    grid, pool = pool_grid(workers=1, nodes=1)
    pool.wait_started()
    (node,) = grid.contexts
    shared = RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(4, dtype=np.float32))}),
                         "config": ConfigRecord({"do": "linger"})})
    grid.push_messages([Message(shared, dst_node_id=node, message_type="train")])
    assert on_its_way.wait(60)
    pool.close()
    time.sleep(0.5)
    assert not marker.exists()  # the client never ran
    assert not pool.pids()


def test_a_message_of_an_ended_run_that_could_not_wait_in_a_socket_is_not_run_again():
    """The run ends (forget) while a message is being made ready to wait behind a worker's
    current one, and it turns out too big to wait there (its node's state is large): it is
    dropped, not put back at the head of the queue for the next run's workers to run."""
    grid, pool = pool_grid(workers=1, nodes=4)
    nodes = sorted(grid.contexts, key=lambda n: int(grid.contexts[n].node_config["partition-id"]))
    grid.contexts[nodes[1]].state["big"] = ConfigRecord({"text": "x" * 70_000})  # its header cannot wait
    send, held_up = pool._send, []

    def send_late(slot, task, queued):
        if queued and not held_up:
            held_up.append(task)
            time.sleep(1.0)  # the main thread ends the run meanwhile
        return send(slot, task, queued)

    pool._send = send_late  # type: ignore[method-assign]
    with pool:
        pool.wait_started()
        grid.push_messages([Message(RecordDict({"config": ConfigRecord({"do": do})}), dst_node_id=node,
                                    message_type="train") for node, do in zip(nodes, ["slow", "count", "count", "count"])])
        deadline = time.monotonic() + 60
        while not held_up:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pool.forget()
        time.sleep(2.5)  # the running message ends; a message put back would run now
        assert pool._pending == []
    assert int(held_up[0].context.node_config["partition-id"]) == 1
    assert 1 not in counts(grid)  # the ended run's message never ran


def test_a_worker_whose_gpu_context_broke_fails_only_its_message_and_is_replaced():
    """A device-side assert or an illegal memory access leaves a process's CUDA context failing
    every later CUDA call: the worker that met one answers its message with that failure, ends,
    and a fresh worker serves the next messages - the one queued behind it too - where it would
    have failed every message it served for the rest of the run. (Simulated on the CPU: the test
    app raises as such an error does and makes the worker's check of its context say it broke.)
    A client that merely raises keeps its worker."""
    grid, pool = pool_grid(workers=1, nodes=3)
    with pool:
        pool.wait_started()
        first = set(pool.pids())
        # the first round: no node's state holds arrays yet, so node 1's message is queued behind node 0's
        replies = train_round(grid, do={0: "poison"})
        pool.wait_started()
        after = set(pool.pids())
        raised = train_round(grid, do={0: "raise"})
        assert set(pool.pids()) == after  # an ordinary failure: the same worker goes on
        third = train_round(grid)
    assert raised[0].has_error() and not raised[1].has_error()
    broke = replies[0]
    assert broke.has_error() and broke.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "illegal memory access" in broke.error.reason
    assert not replies[1].has_error() and not replies[2].has_error()
    served = {int(r.content.metric_records["metrics"]["pid"]) for r in (replies[1], replies[2])}
    assert served == after and not after & first  # the fresh worker served the rest of the round
    assert len(pool.crashes) == 1 and "GPU context broke" in pool.crashes[0] and "illegal memory access" in pool.crashes[0]
    # node 0's state is the one before the two messages that failed; the others counted on
    assert {p: int(r.content.metric_records["metrics"]["count"]) for p, r in third.items()} == {0: 1, 1: 3, 2: 3}


@pytest.mark.parametrize("transport", ["memfd", "named", "socket"])
def test_the_arrays_a_round_shares_go_to_each_worker_once(monkeypatch, tmp_path, transport):
    """Through anonymous shared memory (memfd, handed over the socket), a named file (a system
    without memfd), or through the connection (neither, or no room): each worker is sent the
    round's model once, however many of its messages it runs, and every reply comes back whole.
    No name is left behind; with memfd none is ever made."""
    from fedvls_flwr.ops import client_worker

    if transport == "memfd" and not hasattr(os, "memfd_create"):
        pytest.skip("this system has no memfd_create")
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(client_worker, "SHM_DIR", shm if transport != "socket" else tmp_path / "no-such-folder")
    if transport != "memfd":  # memfd: as the engine runs by default where the system has it
        monkeypatch.setattr(client_worker, "USE_MEMFD", False)
    named: list[str] = []
    create = client_worker.Bulk.create

    def noting(self, size, name):
        path = create(self, size, name)
        named.append(str(path))
        return path

    monkeypatch.setattr(client_worker.Bulk, "create", noting)
    sent: list[int] = []
    put = client_worker.Bulk.put

    def counting(self, blobs):
        sent.extend(len(b) for b in blobs)
        return put(self, blobs)

    monkeypatch.setattr(client_worker.Bulk, "put", counting)
    grid, pool = pool_grid(workers=2, nodes=6)
    size = 1_000_000  # 4 MB of float32: the only large byte string a message carries
    with pool:
        pool.wait_started()
        for _ in range(2):
            replies = train_round(grid, size=size)
            assert all(np.array_equal(r.content.array_records["arrays"]["w"].numpy(), np.ones(size, np.float32))
                       for r in replies.values())
        used = [s.bulk is not None and s.bulk.map is not None for s in pool.slots]
    large = [n for n in sent if n >= 4 * size]
    assert 2 <= len(large) <= 2 * 2, large  # each round: once per worker that took a message, not once per message
    assert any(used) == (transport != "socket")
    made = {"memfd": lambda p: p == client_worker.MEMFD_PATH, "named": lambda p: p.startswith(str(shm)),
            "socket": lambda p: p == "None"}[transport]
    assert named and all(made(p) for p in named), named
    assert list(shm.iterdir()) == []  # nothing left behind
    assert not list(Path("/dev/shm").glob(f"fedvls-{os.getpid()}-*"))


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="this system has no memfd_create")
def test_handing_over_the_shared_file_keeps_the_connection_blocking_under_a_default_socket_timeout(monkeypatch):
    """An app may call socket.setdefaulttimeout (before a download). multiprocessing's
    send_handle / recv_handle make a socket object on the connection's descriptor, which then
    turned it non-blocking on both sides: the worker's next read failed (BlockingIOError) and
    the worker ended; the parent's took a healthy worker for gone. Both ends stay blocking, and
    the file handed over is the one made (its bytes read on the other side)."""
    import socket
    from multiprocessing.connection import Connection

    from fedvls_flwr.ops import client_worker

    ours, theirs = socket.socketpair()
    parent, worker = Connection(ours.detach()), Connection(theirs.detach())
    saved = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5.0)
    try:
        sending, receiving = client_worker.Bulk(parent), client_worker.Bulk(worker)
        path = sending.create(1 << 20, "fedvls-test")
        assert path == client_worker.MEMFD_PATH
        sending.put([b"abc"])
        sending.send_file()
        receiving.attach(path, 1 << 20)
        assert receiving.take([(0, 3)]) == [b"abc"]
        assert os.get_blocking(parent.fileno()) and os.get_blocking(worker.fileno())
        parent.send_bytes(b"next")  # what the worker reads next
        assert worker.recv_bytes() == b"next"
    finally:
        socket.setdefaulttimeout(saved)
        for bulk in (sending, receiving):
            bulk.close()
        parent.close()
        worker.close()


def test_memfd_refused_falls_back_to_a_named_file(monkeypatch, tmp_path):
    """memfd_create present but refused (an old kernel: ENOSYS; a seccomp filter: EPERM): a
    named file, not the socket for the rest of the run."""
    from fedvls_flwr.ops import client_worker

    def refused(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(client_worker, "USE_MEMFD", True)
    monkeypatch.setattr(client_worker.os, "memfd_create", refused, raising=False)
    monkeypatch.setattr(client_worker, "SHM_DIR", tmp_path)
    bulk = client_worker.Bulk(None)  # type: ignore[arg-type]
    try:
        assert bulk.create(1 << 16, "fedvls-test") == str(tmp_path / "fedvls-test") and bulk.map is not None
    finally:
        bulk.close()


PARENT_KILLED_MID_ROUND = """
import sys
sys.path.insert(0, {root!r})
from tests.runs import flower_run_identity
from tests.test_client_workers import pool_grid, train_round

from fedvls_flwr.ops import client_worker

client_worker.USE_MEMFD = False  # a named file (systems without memfd): the one that could be left behind
with flower_run_identity():
    grid, pool = pool_grid(workers=1, nodes=1)
    with pool:
        pool.wait_started()
        train_round(grid, do={{0: "linger"}}, size=1_000_000)
"""


def test_a_parent_killed_mid_round_leaves_nothing_in_dev_shm(tmp_path):
    """Where the shared memory is a named file (no memfd), it is the worker's to unlink once
    mapped: SIGKILL to the parent while its worker trains (no clean-up of its own can run; the
    worker ends with it) leaves no file behind. (An anonymous file has no name to leave.)"""
    import subprocess
    import sys
    import time

    from tests.worker_apps import LINGERING_ENV

    marker = tmp_path / "lingering"
    root = str(Path(__file__).resolve().parents[1])
    parent = subprocess.Popen([sys.executable, "-c", PARENT_KILLED_MID_ROUND.format(root=root)],
                              env={**os.environ, LINGERING_ENV: str(marker)})
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()) and parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists() and parent.poll() is None, "the worker never reached the lingering message"
        parent.kill()
        parent.wait(timeout=30)
        assert not list(Path("/dev/shm").glob(f"fedvls-{parent.pid}-*"))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        if marker.exists() and marker.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
        for leftover in Path("/dev/shm").glob(f"fedvls-{parent.pid}-*"):
            leftover.unlink(missing_ok=True)


def test_node_state_the_client_left_alone_is_not_sent_back(monkeypatch):
    """A large array in a node's state (FedConcat's frozen encoders) goes to the worker with each
    message, but comes back only when the ClientApp changed it; the node keeps it either way."""
    from fedvls_flwr.ops import client_worker

    received: list[int] = []
    take = client_worker.Bulk.take

    def counting(self, layout):
        received.extend(n for _, n in layout)
        return take(self, layout)

    monkeypatch.setattr(client_worker.Bulk, "take", counting)  # in this process: the replies' arrays
    grid, pool = pool_grid(workers=2, nodes=2)
    with pool:
        pool.wait_started()
        first = train_round(grid, do={0: "hold", 1: "hold"})
        back_first = sum(n for n in received if n >= 4_000_000)
        received.clear()
        for _ in range(2):
            train_round(grid, do={0: "hold", 1: "hold"})
        back_later = sum(n for n in received if n >= 4_000_000)
    assert all(not r.has_error() for r in first.values())
    assert 2 * 4_000_000 <= back_first < 2 * 4_001_000 and back_later == 0  # (each with its npy header)
    for context in grid.contexts.values():  # written in round 1 (count 1), kept since
        assert context.state.array_records["big"]["x"].numpy()[0] == 1.0
        assert int(context.state.config_records["seen"]["count"]) == 3


def test_a_worker_that_cannot_start_is_said_at_the_first_message():
    grid, pool = pool_grid(workers=2, app="tests.worker_apps:broken")
    with pool:
        with pytest.raises(ClientWorkersFailed, match="this ClientApp cannot be loaded"):
            pool.wait_started()
            train_round(grid)
        assert not pool.alive


def test_plan_and_pool_agree_on_this_machine():
    """The machine's own plan (2 cores here) gives workers that run; sized as described."""
    from fedvls_flwr.ops.resources import detect_machine

    machine = detect_machine()
    plan = plan_workers(machine, 1, 0, 4)
    assert plan.workers == min(4, math.floor(machine.cores)) and plan.describe().startswith(f"{plan.workers} worker")


def test_a_message_queued_behind_a_killed_one_never_started_and_runs_on_the_fresh_worker():
    grid, pool = pool_grid(workers=1, nodes=4)  # one worker: it holds the next message while it runs one
    with pool:
        pool.wait_started()
        replies = train_round(grid, do={0: "die"})
    assert replies[0].has_error() and replies[0].error.code == ErrorCode.CLIENT_APP_CRASHED
    assert all(not r.has_error() and int(r.content.metric_records["metrics"]["count"]) == 1
               for p, r in replies.items() if p != 0)
    assert len(pool.crashes) == 1


def test_console_scripts_are_found_beside_python_on_path_or_in_a_target_install(tmp_path, monkeypatch):
    """A GPU host may hold Flower in a ``pip install --target`` folder on PYTHONPATH: its scripts
    are in that folder's bin/, not beside the interpreter."""
    import sys

    from fedvls_flwr.ops.flower_cli import console_scripts

    target = tmp_path / "target"
    (target / "fakepkg").mkdir(parents=True)
    (target / "fakepkg" / "__init__.py").write_text("")
    (target / "bin").mkdir()
    (target / "bin" / "fake-script").write_text("#!/bin/sh\n")
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert console_scripts("fake-script", "fakepkg") == target / "bin"
    on_path = tmp_path / "on-path"
    on_path.mkdir()
    (on_path / "fake-script").write_text("#!/bin/sh\n")
    (on_path / "fake-script").chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    assert console_scripts("fake-script", "fakepkg") == on_path
    assert console_scripts(Path(sys.executable).name, "fakepkg") == Path(sys.executable).parent  # a venv first


def test_a_sweep_caps_parallel_at_the_machines_room_and_says_each_runs_share():
    from fedvls_flwr.experiments.preset import PresetError
    from fedvls_flwr.experiments.sweep import machine_shares

    said: list[str] = []
    parallel, shares = machine_shares([{"client-resources-num-cpus": 1}], 8, said.append, Machine(2))
    assert parallel == 2 and [m.cores for m in shares] == [1, 1]
    assert "--parallel 8: this machine (2 cores, no GPU) has room for 2 run(s) at once" in said[0]
    assert "2 run(s) at once, each with 1 core, no GPU" in said[-1] and "1 worker" in said[-1]
    said.clear()
    assert machine_shares([{"client-resources-num-cpus": 1}], 1, said.append, Machine(2))[0] == 1
    assert "2 workers: 2 on the CPU" in said[-1]
    said.clear()
    assert machine_shares([{}], 4, said.append, Machine(16, gpus(1)), runs=3)[0] == 3  # no more shares than runs
    said.clear()
    gpu = [{"client-resources-num-cpus": 1, "client-resources-num-gpus": 0.25}]
    parallel, shares = machine_shares(gpu, 2, said.append, Machine(16, gpus(1)))
    assert parallel == 2 and "each with 8 cores, 0.5 of cuda:0" in said[-1] and "2 workers: 2 on cuda:0" in said[-1]
    with pytest.raises(PresetError, match="this machine has no GPU.*client-resources-num-gpus out \\(or 0\\) to train on"):
        machine_shares(gpu, 1, said.append, Machine(2))


def test_ctrl_c_while_a_worker_starts_up_is_ignored_by_it_from_its_first_import():
    """Ctrl-C reaches the whole foreground group, the client workers too: a worker still
    importing flwr and numpy (the first second of `fedvls run`) printed a KeyboardInterrupt
    traceback under the run's one line, because it ignored SIGINT only once worker_main ran.
    Ctrl-C during the import (numpy already mapped) leaves it starting up to ready."""
    import socket
    import subprocess
    import sys
    import time
    from multiprocessing.connection import Connection

    from fedvls_flwr.ops.client_worker import WORKER_CODE

    ours, theirs = socket.socketpair()
    worker = subprocess.Popen([sys.executable, "-c", WORKER_CODE, str(theirs.fileno()), "1", "tests.worker_apps:app"],
                              pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    theirs.close()
    conn = Connection(ours.detach())
    try:
        deadline = time.monotonic() + 60
        while b"numpy" not in Path(f"/proc/{worker.pid}/maps").read_bytes():  # inside the import now
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.001)
        while not conn.poll(0.01):  # Ctrl-C, again and again, until it is ready (or gone)
            if worker.poll() is not None:
                break
            os.kill(worker.pid, signal.SIGINT)
            assert time.monotonic() < deadline
        said = conn.recv() if worker.poll() is None else None
    finally:
        conn.close()  # the worker ends when its parent's end closes
        try:
            _, err = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
    assert b"KeyboardInterrupt" not in err, err.decode()[-2000:]
    assert said is not None and said[0] == "ready", said


def test_a_sweeps_run_whose_worker_process_is_killed_is_said_to_be_kept(tmp_path):
    """A run-pool worker killed mid-run (SIGKILL, the out-of-memory killer): the sweep goes on to
    its next run, so its line for this one must say what happened and that nothing is lost -
    it said "the worker process ended (exit code -9)", neither the signal nor that the run's
    saved rounds are kept and resumed by the same command."""
    import multiprocessing

    from fedvls_flwr.ops.run_pool import Job, RunPool

    job = Job("r", {"dataset": "digits", "num-server-rounds": 2, "output-dir": str(tmp_path), "run-name": "r"}, 2, 1.0,
              tmp_path / "r" / "run.log", 120.0)
    with RunPool(workers=1) as pool:
        pool.submit(job)
        (worker,) = [p for p in multiprocessing.active_children() if p.name == "fedvls-run-worker"]
        os.kill(worker.pid, signal.SIGKILL)
        outcomes = []
        while not outcomes:
            outcomes += pool.wait(poll=0.5)
    (outcome,) = outcomes
    assert outcome.key == "r" and outcome.status == "failed"
    assert outcome.error == ("its worker process was killed by SIGKILL while it ran (killed, or out of memory?); what "
                             "it saved is kept and the sweep resumes it next time")


@pytest.mark.parametrize(("code", "said"), [(-9, "was killed by SIGKILL"), (143, "was stopped by SIGTERM"),
                                            (1, "ended (exit code 1)"), (None, "ended (exit code None)")])
def test_a_run_pool_worker_stopped_by_a_signal_is_said_so_whether_it_died_or_unwound(code, said):
    """`kill <pid>` - what a run's lock refusal advises - makes a run-pool worker unwind and exit
    with 128 + SIGTERM: that is said as the signal, not as an unexplained exit code 143."""
    from fedvls_flwr.ops.run_pool import _died

    assert _died(code).startswith(f"its worker process {said} while it ran")
    assert _died(code).endswith("; what it saved is kept and the sweep resumes it next time")


def test_a_reply_is_read_whole_however_late_while_its_worker_runs_the_next_message(monkeypatch):
    """A worker busy with one message has the next one waiting in its socket; it runs it as soon
    as its reply is sent, and writes that reply while this process may still be copying the first
    one out of their shared file (a loaded machine: a CI run with two suites at once gave a FedGF
    round another client's arrays under a reply's own metrics). Each reply must come back as its
    client made it, however late this side reads it."""
    from fedvls_flwr.ops import client_worker

    take = client_worker.Bulk.take

    def late(self, layout):  # this process only: the worker's own Bulk is in its own process
        if any(offset is not None for offset, _ in layout):
            time.sleep(0.3)  # the worker meanwhile runs the queued message and writes its reply
        return take(self, layout)

    monkeypatch.setattr(client_worker.Bulk, "take", late)
    grid, pool = pool_grid(workers=1, nodes=4)
    size = 1_000_000  # 4 MB replies: through the shared-memory file
    with pool:
        pool.wait_started()
        for _ in range(2):
            replies = train_round(grid, do={p: "own" for p in range(4)}, size=size)
            got = {p: np.unique(r.content.array_records["arrays"]["w"].numpy()).tolist() for p, r in replies.items()}
            assert got == {p: [float(p)] for p in range(4)}, got
        assert pool.slots[0].bulk is not None and pool.slots[0].bulk.map is not None  # it did go through the file


def test_no_room_for_a_bigger_shared_file_keeps_the_one_both_sides_have(monkeypatch):
    """/dev/shm full (Docker gives it 64 MiB) when replies outgrow the worker's file: the worker
    keeps its file and writes its replies there, so this side keeps it mapped too and reads them
    (it had let go of its map first, and the next reply's read failed its thread: no reply)."""
    from fedvls_flwr.ops import client_worker

    grid, pool = pool_grid(workers=1, nodes=2)
    with pool:
        pool.wait_started()
        train_round(grid, do={0: "own", 1: "own"}, size=1_000_000)
        slot = pool.slots[0]
        assert slot.bulk is not None and slot.bulk.map is not None
        monkeypatch.setattr(client_worker.os, "posix_fallocate", lambda *args: (_ for _ in ()).throw(OSError(28, "No space")))
        slot.reply_bytes = slot.bulk.size  # replies said to have grown: the next message asks for a bigger file
        for _ in range(2):
            replies = train_round(grid, do={0: "own", 1: "own"}, size=1_000_000)
            got = {p: np.unique(r.content.array_records["arrays"]["w"].numpy()).tolist() for p, r in replies.items()}
            assert got == {0: [0.0], 1: [1.0]}, got
        assert slot.shared_memory is False and slot.bulk.map is not None
