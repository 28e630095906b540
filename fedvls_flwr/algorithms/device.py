"""Which device a process computes on, said out loud: what it is called, how much GPU memory
a round took at its peak, and bit-for-bit reproducible CUDA when asked for.

A GPU can go unused without a word: Ray hides every GPU from a simulated client that asked
for none (it sets ``CUDA_VISIBLE_DEVICES=""``), so ``device = "auto"`` quietly trains on the
CPU. Every reply therefore names its device (:func:`describe_device`), and the server
compares them with its own before round 1 (:func:`gpu_left_unused`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from fedvls_flwr.config.run_config import RunConfig, model_name

#: cuBLAS needs a fixed workspace to be deterministic (NVIDIA's cuBLAS docs, "Results reproducibility");
#: every process of the app has it from its first import of the package (fedvls_flwr/__init__.py).
CUBLAS_WORKSPACE = ":4096:8"

#: The models whose client step was measured faster on a GPU with bfloat16 autocast (``amp``), and
#: with the channels-last memory format, than without, at the paper's batch of 64 with CUDA graphs
#: (``bench/gpu_step.py``; the figures and the GPU are in docs/performance.md, "On a GPU"). What the
#: settings' "auto" turns on; "true" / "false" decide for every model.
#: Measured on an NVIDIA H200 (2026-11-29, torch 2.11; two calls): ResNet-18's client 12,516 /
#: 11,767 img/s graphed, 16,033 / 15,014 with channels-last, 20,146 / 17,345 with both, and its
#: rounds on the in-process engine faster too. MobileNetV2's graphed step was faster with
#: channels-last alone (10,966 / 10,078 against 7,980 / 7,624) but bfloat16 slower without it
#: and within 1-7% with it, and in the engine a channels-last MobileNetV2 took 42 s for its first
#: round and 7.7 s a steady round on 4 workers (1.3 s without; docs/performance.md has a guess
#: why): it stays as it was until that is understood. The FedLC CNN and the MLP were slower
#: with either.
AMP_FASTER: frozenset[str] = frozenset({"resnet18"})
CHANNELS_LAST_FASTER: frozenset[str] = frozenset({"resnet18"})


def switch(value: object, model: str, measured_faster: frozenset[str]) -> bool:
    """A setting of ``AUTO_SWITCH`` ("auto", "true", "false"; booleans as written in Python) for
    ``model``: "auto" is on for the models in ``measured_faster``."""
    if value in (True, "true"):
        return True
    if value in (False, "false"):
        return False
    if value == "auto":
        return model in measured_faster
    raise ValueError(f"expected 'auto', 'true' or 'false', got {value!r}")


def use_amp(cfg: RunConfig, device: torch.device | None = None) -> bool:
    """Whether ``cfg.amp`` asks for bfloat16 autocast for its model ("auto": on ``device`` =
    CUDA, for the models in :data:`AMP_FASTER`; "true" is passed on even for a CPU, where the
    training loop says once that it is ignored)."""
    if cfg.amp == "auto" and (device is None or device.type != "cuda"):
        return False
    return switch(cfg.amp, model_name(cfg), AMP_FASTER)


def use_channels_last(cfg: RunConfig, device: torch.device) -> bool:
    """Whether the conv nets' tensors are kept channels-last: on CUDA only (see ``cfg.channels_last``)."""
    return device.type == "cuda" and switch(cfg.channels_last, model_name(cfg), CHANNELS_LAST_FASTER)


def describe_device(device: torch.device) -> str:
    """``cuda:0 (NVIDIA H100 80GB HBM3)``, or ``cpu`` - with why, on a machine that has an
    NVIDIA driver: ``cpu (CUDA_VISIBLE_DEVICES='')`` is Ray's sign of a client that was given
    no GPU."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip() and _has_nvidia_driver():
        return "cpu (CUDA_VISIBLE_DEVICES='')"
    return "cpu"


def _has_nvidia_driver() -> bool:
    """An NVIDIA driver is loaded on this machine (whether or not this process may see a GPU)."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def sees_cuda(description: str) -> bool:
    return description.startswith("cuda")


@contextlib.contextmanager
def peak_gpu_memory(device: torch.device) -> Iterator[list[float]]:
    """Yields a one-element list that holds, on exit, the peak GPU memory (MiB) allocated by
    tensors during the block (``torch.cuda.max_memory_allocated``), or stays empty on a CPU."""
    out: list[float] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        yield out
    finally:
        if device.type == "cuda":
            out.append(torch.cuda.max_memory_allocated(device) / 2**20)


#: What ``set_deterministic(True)`` found before it changed torch's settings (None: it did not,
#: or they were put back): torch's flags.
_before_deterministic: tuple[bool, bool, bool, str, str] | None = None


def _torch_determinism() -> tuple[bool, bool, bool, str, str]:
    return (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.conv.fp32_precision)  # type: ignore[attr-defined]


def set_deterministic(enabled: bool) -> None:
    """``deterministic = true``: deterministic CUDA kernels (PyTorch's deterministic mode: an op
    with no deterministic kernel raises, naming itself), no cuDNN autotuning and no TF32, so a
    GPU run reproduces bit for bit. Off: what an earlier ``true`` in this process changed is put
    back - a process that serves run after run (a kept client worker, a sweep worker) would
    otherwise train a ``deterministic = false`` run after a ``true`` one slower and with other
    numbers than a fresh process; torch is left alone otherwise. A CPU run here is deterministic
    either way."""
    global _before_deterministic
    if not enabled:
        if _before_deterministic is not None:
            algorithms, cudnn_deterministic, benchmark, matmul, conv = _before_deterministic
            torch.use_deterministic_algorithms(algorithms)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_deterministic, benchmark
            torch.backends.cuda.matmul.fp32_precision = matmul
            torch.backends.cudnn.conv.fp32_precision = conv  # type: ignore[attr-defined]
            _before_deterministic = None
        return
    if _before_deterministic is None:
        _before_deterministic = _torch_determinism()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # removed since the import: too late after cuBLAS
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # full float32 in matmuls and convolutions (cuDNN's default for convolutions is TF32)
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class DeviceProblem:
    """What :func:`gpu_left_unused` found: an error (the run cannot work as configured) or a warning."""

    error: bool
    message: str


def gpu_left_unused(
    requested: str, server_sees_cuda: bool, client_devices: dict[str, str], simulation: bool
) -> DeviceProblem | None:
    """Before round 1: clients that will not train on a GPU although one is wanted.

    ``client_devices``: node name -> what :func:`describe_device` said there. ``device =
    "cuda"`` with a client that sees none is an error (it would fail in round 1); ``"auto"``
    with clients on the CPU while the server process sees a GPU is a warning - the GPU is
    there, the federation gave the clients none.
    """
    on_cpu = sorted(name for name, d in client_devices.items() if not sees_cuda(d))
    if requested == "cpu" or not on_cpu or (requested == "auto" and not server_sees_cuda):
        return None
    if simulation:
        fix = ("give each simulated client a share of the GPU: flwr run . --federation-config "
               "\"num-supernodes=N client-resources-num-cpus=1 client-resources-num-gpus=0.25\" "
               "(Ray hides the GPU from clients that ask for none)")
        if not server_sees_cuda:
            fix = "this machine has no CUDA device that torch can use; use device='auto' or 'cpu'"
    else:
        fix = ("make a GPU visible to the ClientApp on those nodes: set CUDA_VISIBLE_DEVICES (or leave it unset) "
               "in the environment of flower-supernode (subprocess isolation) or of flwr-superexec (process "
               "isolation) - the ClientApp inherits that process's environment")
    what = f"{len(on_cpu)} of {len(client_devices)} clients see no CUDA device ({', '.join(on_cpu[:4])}"
    what += ", ..." if len(on_cpu) > 4 else ""
    what += f": {client_devices[on_cpu[0]]})"
    if requested == "cuda":
        return DeviceProblem(True, f"device = 'cuda' but {what}; every such client would fail in round 1. Fix: {fix}")
    return DeviceProblem(False, f"device = 'auto' and the server sees a GPU, but {what}: they train on the CPU. "
                                f"Fix: {fix}")
