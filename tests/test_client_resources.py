"""The clients a machine can run at once (config/client_resources.py) against Flower's own rule,
and the federations that no client could run on, refused by `fedvls check`, `fedvls run` and the
ServerApp of a Ray simulation before round 1."""

from __future__ import annotations

import itertools
import threading

import pytest

from fedvls_flwr.app.ray_address import simulation_federation
from fedvls_flwr.config.client_resources import NodeRoom, clients_at_once, room_problem, this_machine, visible_gpus
from fedvls_flwr.config.run_config import ConfigError
from fedvls_flwr.experiments.check import main as check_main
from fedvls_flwr.experiments.run import ENGINE_FEDERATION, engine_federation
from fedvls_flwr.ops.resources import Machine

CPUS = (0.5, 1, 2, 3, 64)
GPUS = (0.0, 0.25, 0.5, 1, 2)
NODES = ([(2, 0)], [(2, 1)], [(8, 2)], [(2, 0), (4, 1)], [(16, 4), (0, 0), (1, 0.5)])


def flower_pool_size(federation, nodes, monkeypatch) -> int:
    """Flower 1.41's own count (``pool_size_from_resources``) over fake Ray nodes; its "ActorPool
    is empty" ValueError is a pool of 0."""
    import ray
    from flwr.simulation.ray_transport import ray_actor

    monkeypatch.setattr(ray, "nodes", lambda: [{"Resources": {"CPU": c, "GPU": g} if g else {"CPU": c}}
                                               for c, g in nodes])
    resources = {"num_cpus": federation["client-resources-num-cpus"], "num_gpus": federation["client-resources-num-gpus"]}
    try:
        return ray_actor.pool_size_from_resources(resources)
    except ValueError:
        return 0


@pytest.mark.parametrize("nodes", NODES, ids=str)
def test_clients_at_once_is_flowers_pool_size(nodes, monkeypatch):
    for cpus, gpus in itertools.product(CPUS, GPUS):
        federation = {"client-resources-num-cpus": cpus, "client-resources-num-gpus": gpus}
        ours = clients_at_once(federation, [NodeRoom(c, g) for c, g in nodes])
        assert ours == flower_pool_size(federation, nodes, monkeypatch), (cpus, gpus)
        assert (room_problem(federation, [NodeRoom(c, g) for c, g in nodes]) is None) == (ours > 0)


def test_flowers_defaults_are_two_cpus_and_no_gpu():
    assert clients_at_once({}, [NodeRoom(4, 0)]) == 2
    assert clients_at_once({}, [NodeRoom(1, 0)]) == 0


def test_visible_gpus_reads_cuda_visible_devices_else_the_device_files(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):
        (dev / name).touch()
    assert visible_gpus({}, dev) == 2
    assert visible_gpus({}, tmp_path / "none") == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, dev) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}, dev) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, dev) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, dev) == 0
    bin_dir = tmp_path / "bin"  # no device files (WSL, some containers): nvidia-smi's list, where installed
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n")
    smi.chmod(0o755)
    assert visible_gpus({"PATH": str(bin_dir)}, tmp_path / "none") == 2
    assert visible_gpus({"PATH": str(tmp_path / "empty")}, tmp_path / "none") == 0


def test_the_ray_a_simulation_starts_here_counts_what_init_args_declare():
    assert this_machine({}, cpus=2, gpus=0) == NodeRoom(2, 0)
    assert this_machine({"init-args-num-cpus": 8, "init-args-num-gpus": 1}, cpus=2, gpus=0) == NodeRoom(8, 1)


def test_the_refusals_say_what_is_wrong_and_the_fix():
    gpu = room_problem({"client-resources-num-cpus": 1, "client-resources-num-gpus": 0.25}, [NodeRoom(2, 0)])
    assert gpu is not None and "client-resources-num-gpus = 0.25" in gpu and "this machine has no GPU" in gpu
    assert "ActorPool is empty" in gpu and "Leave client-resources-num-gpus out (or 0)" in gpu
    cpu = room_problem({"client-resources-num-cpus": 64}, [NodeRoom(2, 0)])
    assert cpu is not None and "this machine has (2)" in cpu and "client-resources-num-cpus=2" in cpu
    cluster = room_problem({"client-resources-num-gpus": 2}, [NodeRoom(8, 1, "a"), NodeRoom(8, 1, "b")],
                           "the Ray cluster at 10.0.0.1:6379")
    assert cluster is not None and "(per node: 1, 1)" in cluster and "client-resources-num-gpus=1" in cluster


NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("federation, refused", [
    ("num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.25", "this machine has no GPU"),
    ("num-supernodes=4 client-resources-num-cpus=4096", "asks more CPUs per client than this machine has"),
    ("num-supernodes=4 client-resources-num-cpus=1 client-resources-num-gpus=0.25 init-args-num-gpus=1", None),
    ("num-supernodes=4 client-resources-num-cpus=1", None),
])
def test_check_refuses_clients_this_machine_cannot_run(federation, refused, monkeypatch, capsys):
    for key, value in NO_GPU.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = check_main(["--no-data", "--federation-config", federation])
    err = capsys.readouterr().err
    assert code == (2 if refused else 0), err
    if refused:
        assert refused in err
    assert check_main(["--no-data", "--for-other-machine", "--federation-config", federation]) == 0


def test_fedvls_run_takes_what_flwr_run_takes_and_refuses_what_it_cannot_start():
    machine = Machine(2)
    notes: list[str] = []
    got = engine_federation({"num-supernodes": 4, "client-resources-num-cpus": 1}, notes, machine)
    assert got == {**ENGINE_FEDERATION, "num-supernodes": 4, "client-resources-num-cpus": 1} and notes == []
    with pytest.raises(ConfigError, match="'client-resources-num-cpus' = 0.5: must be an integer >= 1"):
        engine_federation({"client-resources-num-cpus": 0.5}, [], machine)
    with pytest.raises(ConfigError, match="more CPUs per client than this machine has \\(2\\).*fedvls run refuses"):
        engine_federation({"client-resources-num-cpus": 64}, [], machine)
    with pytest.raises(ConfigError, match="this machine has no GPU"):
        engine_federation({"client-resources-num-gpus": 0.25}, [], machine)
    notes = []  # a GPU share is the engine's too: it sizes the client workers
    got = engine_federation({"client-resources-num-gpus": 0.25}, notes, Machine(2, ((0, 1.0),)))
    assert got["client-resources-num-gpus"] == 0.25 and notes == []
    engine_federation({"init-args-log-to-driver": True}, notes, machine)
    assert any("init-args-log-to-driver is a setting of Ray's logging" in n for n in notes)


def _main_loop(backend_config_stream: str, out: list) -> None:
    """Stands for Flower's simulation runtime: its main thread holds the backend config while the
    ServerApp runs in a thread of its own."""
    worker = threading.Thread(target=lambda: out.append(simulation_federation()))
    worker.start()
    worker.join()


def test_the_serverapp_reads_its_simulations_federation_from_flowers_runtime():
    got: list = []
    _main_loop('{"client_resources": {"num_cpus": 1, "num_gpus": 0.25}, "init_args": {"num_gpus": 0}, '
               '"actor": {"tensorflow": 0}}', got)
    assert got == [{"client-resources-num-cpus": 1, "client-resources-num-gpus": 0.25, "init-args-num-gpus": 0}]
    assert simulation_federation() is None  # no simulation runtime in this process
