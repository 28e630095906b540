"""The GPU path that can be checked without a GPU: what a client says about its device, the
server's verdict before round 1, the query that asks the nodes, and determinism settings."""

import os
import time

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.metadata import Metadata

from fedvls_flwr.algorithms import device as device_module
from fedvls_flwr.algorithms.device import describe_device, gpu_left_unused, peak_gpu_memory, set_deterministic
from fedvls_flwr.app import keys
from fedvls_flwr.app.client import query_round
from fedvls_flwr.app.strategy import RunStrategy
from fedvls_flwr.config.run_config import RunConfig
from tests.fake_grid import FakeGridBase

H100 = "cuda:0 (NVIDIA H100 80GB HBM3)"
RAY_CPU = "cpu (CUDA_VISIBLE_DEVICES='')"

pytestmark = pytest.mark.usefixtures("run_identity")  # Flower's message ids need a run identity


@pytest.mark.parametrize(
    ("requested", "server_cuda", "clients", "simulation", "verdict", "words"),
    [
        ("auto", True, {"a": H100, "b": H100}, True, None, ""),
        ("auto", False, {"a": "cpu", "b": "cpu"}, True, None, ""),  # a CPU machine: nothing to say
        ("cpu", True, {"a": RAY_CPU}, True, None, ""),
        ("auto", True, {"a": RAY_CPU, "b": RAY_CPU}, True, "warning", "client-resources-num-gpus=0.25"),
        ("auto", True, {"a": H100, "b": RAY_CPU}, True, "warning", "1 of 2 clients"),
        ("cuda", True, {"a": RAY_CPU}, True, "error", "client-resources-num-gpus=0.25"),
        ("cuda", False, {"a": "cpu"}, True, "error", "this machine has no CUDA device"),
        ("cuda", False, {"a": "cpu", "b": H100}, False, "error", "CUDA_VISIBLE_DEVICES"),
        ("auto", True, {"a": "cpu"}, False, "warning", "flwr-superexec"),
    ],
)
def test_gpu_left_unused_verdicts(requested, server_cuda, clients, simulation, verdict, words):
    problem = gpu_left_unused(requested, server_cuda, clients, simulation)
    if verdict is None:
        assert problem is None
        return
    assert problem is not None and problem.error == (verdict == "error")
    assert words in problem.message and "Fix:" in problem.message


@pytest.mark.parametrize("driver", [True, False])
def test_a_cpu_client_says_why_it_sees_no_cuda_where_a_gpu_exists(monkeypatch, driver):
    monkeypatch.setattr(device_module, "_has_nvidia_driver", lambda: driver)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert describe_device(torch.device("cpu")) == (RAY_CPU if driver else "cpu")  # no GPU: nothing hidden
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert describe_device(torch.device("cpu")) == "cpu"


def test_peak_gpu_memory_is_empty_on_a_cpu():
    with peak_gpu_memory(torch.device("cpu")) as peak:
        torch.ones(1000).sum()
    assert peak == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_gpu_memory_counts_a_rounds_allocations_on_cuda():
    device = torch.device("cuda")
    with peak_gpu_memory(device) as peak:
        x = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
        del x
    assert peak[0] >= 64


def test_query_reply_names_the_device_and_the_partition():
    reply = query_round(RecordDict(), {"partition-id": 3, "num-partitions": 4})
    assert reply[keys.METRICS][keys.PARTITION_ID] == 3
    device = reply.config_records[keys.CLIENT_INFO][keys.DEVICE]
    assert device.startswith("cuda") == torch.cuda.is_available()


class QueryGrid(FakeGridBase):
    def __init__(self, devices):
        super().__init__(devices)
        self.devices, self.types = devices, []

    def answer(self, messages):
        self.types += [m.metadata.message_type for m in messages]
        out = []
        for m in messages:
            node = m.metadata.dst_node_id
            meta = Metadata(run_id=1, message_id=f"r{node}", src_node_id=node, dst_node_id=0,
                            reply_to_message_id=m.metadata.message_id, group_id="0", created_at=time.time(),
                            ttl=60.0, message_type=m.metadata.message_type)
            content = RecordDict({keys.METRICS: MetricRecord({keys.PARTITION_ID: node - 10}),
                                  keys.CLIENT_INFO: ConfigRecord({keys.DEVICE: self.devices[node]})})
            out.append(Message(content, metadata=meta))
        return out


def test_the_strategy_asks_every_node_its_device_once_before_round_1():
    grid = QueryGrid({10: H100, 11: RAY_CPU})
    strategy = RunStrategy(RunConfig(min_nodes=2))
    devices = strategy.nodes.client_devices(grid)
    assert devices == {"node 10 (partition 0)": H100, "node 11 (partition 1)": RAY_CPU}
    assert grid.types == ["query", "query"]
    assert strategy.nodes.partitions == {10: 0, 11: 1}  # learnt on the way: no second query later
    problem = gpu_left_unused("auto", True, devices, simulation=True)
    assert problem is not None and "node 11 (partition 1)" in problem.message


def _determinism() -> tuple:
    return (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


@pytest.mark.parametrize("module", ["fedvls_flwr.app.client_app", "fedvls_flwr.app.server_app",
                                    "fedvls_flwr.ops.client_worker"])
@pytest.mark.parametrize("users_own", [None, ":16:8"])
def test_every_process_of_the_app_has_the_cublas_workspace_before_any_cuda_work(module, users_own):
    """torch reads CUBLAS_WORKSPACE_CONFIG once, at a process's first cuBLAS call: set when a
    deterministic run starts, it comes too late in a process that multiplied on a GPU before (a
    kept worker after a run without it; that run raises at its first matrix product on a GPU).
    So importing what a ClientApp, a ServerApp or a client worker runs sets it, torch loaded or
    not (a user's own value stands)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if users_own is not None:
        env["CUBLAS_WORKSPACE_CONFIG"] = users_own
    code = f"import os, {module}; print(os.environ.get('CUBLAS_WORKSPACE_CONFIG'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (users_own or device_module.CUBLAS_WORKSPACE)


def test_deterministic_false_leaves_torch_alone_and_true_sets_deterministic_kernels(monkeypatch):
    set_deterministic(False)  # what an earlier deterministic run in this test process left on, put back
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = _determinism()
    set_deterministic(False)
    assert _determinism() == before
    try:
        set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # removed since the import: set again
        set_deterministic(True)  # every message of such a run says so again
    finally:
        set_deterministic(False)
    assert _determinism()[:-1] == before[:-1]  # the variable stays: torch reads it once, at the first cuBLAS call


def test_a_run_without_deterministic_after_one_with_it_gets_torchs_settings_back(monkeypatch):
    """A process that serves run after run (a kept client worker, a sweep worker, the server):
    deterministic = false after true puts back what true changed (it stayed on: deterministic
    kernels, no TF32, no cuDNN autotuning - slower, and other numbers than a fresh process), and
    leaves settings a user made before alone."""
    set_deterministic(False)  # what an earlier deterministic run in this test process left on, put back
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own
    torch.backends.cudnn.benchmark = True
    try:
        before = _determinism()
        set_deterministic(True)
        assert _determinism() != before
        set_deterministic(False)
        assert _determinism() == before
        set_deterministic(False)
        assert _determinism() == before
    finally:
        torch.backends.cudnn.benchmark = False


@pytest.mark.parametrize(("method", "local_optimizer"), [("fedvls", "sgd"), ("moon", "sgd"), ("fedntd", "sam")])
def test_deterministic_training_on_the_cpu_is_unchanged(method, local_optimizer):
    """deterministic = true must not break a CPU run (PyTorch raises for an op without a
    deterministic kernel), and on a CPU it changes no number."""
    from fedvls_flwr.algorithms.run_model import build_run_model
    from fedvls_flwr.algorithms.training import train_local
    from fedvls_flwr.data.node_data import ClientData

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 4, (40,), generator=g)
    results = []
    for deterministic in (False, True):
        cfg = RunConfig(method=method, local_optimizer=local_optimizer, model="mlp", local_epochs=2, batch_size=16,
                        deterministic=deterministic)
        torch.manual_seed(0)
        model = build_run_model(cfg, (1, 8, 8), 4)
        try:
            set_deterministic(deterministic)
            train_local(model, ClientData(x, y, 4, None, None), cfg, device=torch.device("cpu"),
                        generator=torch.Generator().manual_seed(1))
        finally:
            set_deterministic(False)  # every setting it changed put back
        results.append(np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]))
    np.testing.assert_array_equal(results[0], results[1])


def test_auto_trains_on_cuda_exactly_when_torch_sees_a_gpu(monkeypatch):
    """device='auto' picks CUDA whenever torch sees a GPU (faked here: no GPU needed), the CPU
    otherwise; 'cuda' without a GPU is an error naming the fix; 'cpu' stays on the CPU."""
    from fedvls_flwr.algorithms.training import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="device = 'cuda' was requested but torch sees no CUDA device"):
        resolve_device("cuda")
