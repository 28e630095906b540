"""How many client workers a run gets, and on which device: the federation config read the way
Flower's Ray simulation reads it, so that one config means the same on both engines.

How many clients a machine runs at once is Flower's rule (``pool_size_from_resources``), kept in
one place for every caller: :func:`fedvls_flwr.config.client_resources.clients_at_once` (which
``fedvls check`` and a run's start-up refusal use too). This module adds what only the in-process
engine needs: which GPU each worker gets (Ray packs fractions of one GPU: 0.25 puts four actors on
every GPU, and a fraction never spans two GPUs, so the GPU places may be fewer than Flower's
count: 0.4 on two GPUs is 4 places, not 5), the cap at the number of nodes (a worker without a
node has nothing to do), the threads (an actor that asks for no GPU is given none, Ray sets
``CUDA_VISIBLE_DEVICES=""``, and computes with ``OMP_NUM_THREADS = num-cpus``): :func:`plan_workers`,
a pure function of a :class:`Machine` and the config.

A sweep that runs several runs at once (``fedvls sweep --parallel N``) first splits the machine
into N shares (:func:`share_machine`), and each run is sized inside its share.

Standard library only: ``fedvls check`` and the sweep call it without loading torch.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedvls_flwr.config.client_resources import (
    DEFAULT_CLIENT_CPUS,
    DEFAULT_CLIENT_GPUS,
    NodeRoom,
    node_limits,
    room_problem,
    this_machine,
    visible_gpus,
)

__all__ = ["Machine", "WorkerPlan", "detect_machine", "plan_workers", "resource_problem", "room_for_runs",
           "share_machine"]

#: Flower's defaults for a simulated client (``client-resources-num-cpus`` and ``-num-gpus``).
FLOWER_DEFAULT_CLIENT_CPUS = DEFAULT_CLIENT_CPUS
FLOWER_DEFAULT_CLIENT_GPUS = DEFAULT_CLIENT_GPUS
#: Float slack when counting how many shares fit (1 / 0.1 must give 10).
_EPS = 1e-9


@dataclass(frozen=True)
class Machine:
    """What a run may use: ``cores`` CPU cores and, per GPU, (its index among the GPUs this
    process sees, the part of it the run may fill: 1.0 the whole GPU)."""

    cores: float
    gpus: tuple[tuple[int, float], ...] = ()
    #: Why the machine has fewer GPUs than it shows (:func:`detect_machine`); said with its plan.
    note: str = field(default="", compare=False)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def room(self) -> NodeRoom:
        """This machine (or share) as one Ray node: its cores and its GPUs, parts of one summed."""
        return NodeRoom(float(self.cores), float(sum(share for _, share in self.gpus)))

    def describe(self) -> str:
        cores = f"{self.cores:g} core{'s' if self.cores != 1 else ''}"
        if not self.gpus:
            return f"{cores}, no GPU"
        parts = [f"cuda:{i}" if share >= 1 - _EPS else f"{share:.3g} of cuda:{i}" for i, share in self.gpus]
        return f"{cores}, {', '.join(parts)}"


@dataclass(frozen=True)
class WorkerPlan:
    """The client workers of one run: each worker's GPUs (indices of :attr:`Machine.gpus`; empty:
    none, the worker sees no GPU), the torch threads a client computes with (``threads``: the
    run's ``torch-threads`` when > 0, which the ClientApp sets itself) and the process's own
    (``omp_threads``: num-cpus, Ray's ``OMP_NUM_THREADS`` for an actor)."""

    devices: tuple[tuple[int, ...], ...]
    threads: int
    omp_threads: int = 1
    #: The machine has no GPU to hide: a lone worker may be this process itself (no start-up).
    gpu_free_machine: bool = True
    why: str = field(default="", compare=False)

    @property
    def workers(self) -> int:
        return len(self.devices)

    @property
    def in_this_process(self) -> bool:
        """One worker on a machine with no GPU: the clients run one after another in the calling
        process, as before there were workers (nothing to start, nothing to hide). On a GPU
        machine even one worker is a process of its own, though it costs a ResNet-18 client about
        30 ms of transport on a GPU host: a client that breaks its CUDA context (a device-side
        assert, an illegal memory access) breaks every later CUDA call in its process, and only a
        worker can be replaced (the server's evaluation and the next clients then go on)."""
        return self.workers == 1 and self.gpu_free_machine

    def describe(self) -> str:
        """The one line a run prints: '4 workers: 4 on cuda:0, 1 thread each'."""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''} each"
        if self.in_this_process:
            return f"1 worker: the clients run one after another in this process, {threads}{self.why}"
        counts: dict[str, int] = {}
        for gpus in self.devices:
            name = "+".join(f"cuda:{g}" for g in gpus) if gpus else "the CPU"
            counts[name] = counts.get(name, 0) + 1
        where = ", ".join(f"{n} on {name}" for name, n in counts.items())
        plural = "s" if self.workers != 1 else ""
        return f"{self.workers} worker{plural}: {where}, {threads}{self.why}"


def gpu_slots(machine: Machine, num_gpus: float) -> list[tuple[int, ...]]:
    """Every place a client asking for ``num_gpus`` fits, spread over the GPUs (the first slot
    of each GPU, then the second of each, ...), as Ray packs fractional GPUs: a fraction <= 1
    stays on one GPU, whole numbers take whole GPUs."""
    if num_gpus <= 0:
        return []
    if num_gpus <= 1 + _EPS:
        per_gpu = [(index, math.floor(share / num_gpus + _EPS)) for index, share in machine.gpus]
        deepest = max((n for _, n in per_gpu), default=0)
        return [(index,) for depth in range(deepest) for index, n in per_gpu if depth < n]
    whole = [index for index, share in machine.gpus if share >= 1 - _EPS]
    size = round(num_gpus)
    return [tuple(whole[i:i + size]) for i in range(0, len(whole) - size + 1, size)]


def _limits(machine: Machine, num_cpus: float, num_gpus: float) -> dict[str, int]:
    """What bounds the clients ``machine`` runs at once: Flower's count per resource
    (:func:`~fedvls_flwr.config.client_resources.node_limits`, the machine as one Ray node) and,
    with a GPU share, the places Ray can put one (:func:`gpu_slots`)."""
    limits = node_limits(machine.room(), num_cpus, num_gpus)
    if num_gpus > 0:
        limits["GPU places"] = len(gpu_slots(machine, num_gpus))
    return limits


def plan_workers(machine: Machine, num_cpus: float, num_gpus: float, nodes: int, *, torch_threads: int = 0,
                 most: int | None = None) -> WorkerPlan:
    """The client workers for ``nodes`` nodes at ``num_cpus`` CPUs and ``num_gpus`` GPUs each:
    Flower's count of clients at once on ``machine`` (:func:`_limits`), at most ``nodes`` and
    ``most``, at least one (a config the machine cannot serve is :func:`resource_problem`'s to
    refuse first). Threads: the run's ``torch-threads`` when > 0, else num-cpus (Ray's
    ``OMP_NUM_THREADS``)."""
    limits = {**_limits(machine, num_cpus, num_gpus), "nodes": nodes}
    if most is not None:
        limits["asked"] = most
    count = max(1, min(limits.values()))
    slots = gpu_slots(machine, num_gpus)
    devices = tuple(slots[:count]) if num_gpus > 0 and slots else ((),) * count
    omp_threads = max(1, int(num_cpus))
    threads = torch_threads if torch_threads > 0 else omp_threads
    bound = min(limits, key=lambda k: limits[k])
    why = {"CPUs": f" ({machine.cores:g} cores / client-resources-num-cpus={num_cpus:g})",
           "GPUs": f" ({machine.room().gpus:g} GPU(s) / client-resources-num-gpus={num_gpus:g})",
           "GPU places": f" ({machine.gpu_count} GPU(s) at client-resources-num-gpus={num_gpus:g} each)",
           "nodes": f" (one per node: {nodes} nodes)",
           "asked": " (as asked)"}[bound]
    if machine.note:
        why += f"; {machine.note}"
    return WorkerPlan(devices, threads, omp_threads, gpu_free_machine=not machine.gpus, why=why)


def resource_problem(num_cpus: float, num_gpus: float, machine: Machine, *, where: str = "this machine") -> str | None:
    """Why no client can start on ``machine`` with these client resources (and how to fix it),
    or None: the refusal ``fedvls check`` and ``flwr run``'s ServerApp give
    (:func:`~fedvls_flwr.config.client_resources.room_problem`, Flower's count of 0), then what
    only the in-process engine cannot place (a share of a GPU above 1 that is not whole GPUs).
    ``fedvls run``, ``fedvls sweep`` and :func:`fedvls_flwr.ops.inprocess.client_plan` ask it."""
    if num_cpus <= 0 or not math.isfinite(num_cpus):
        return (f"--federation-config client-resources-num-cpus = {num_cpus:g} must be a number > 0 (the CPUs each "
                "client gets), e.g. 1")
    if num_gpus < 0 or not math.isfinite(num_gpus):
        return (f"--federation-config client-resources-num-gpus = {num_gpus:g} must be >= 0 (the share of a GPU each "
                "client gets), e.g. 0.25")
    federation = {"client-resources-num-cpus": num_cpus, "client-resources-num-gpus": num_gpus}
    if (problem := room_problem(federation, [machine.room()], where, engine="inprocess")) is not None:
        return f"{problem} ({machine.note})" if machine.note and num_gpus > 0 else problem
    if num_gpus > 1 + _EPS and abs(num_gpus - round(num_gpus)) > _EPS:
        return (f"--federation-config client-resources-num-gpus = {num_gpus:g}: the in-process engine gives a client "
                "a share of one GPU (at most 1, e.g. 0.25: four clients per GPU) or whole GPUs (2, 3, ...). Give one "
                "of those")
    if num_gpus > 0 and not gpu_slots(machine, num_gpus):
        return (f"--federation-config client-resources-num-gpus = {num_gpus:g} but {where} has {machine.describe()}: "
                "no client fits on one GPU. Give "
                f"client-resources-num-gpus={min(1.0, max((s for _, s in machine.gpus), default=1.0)):g} or less")
    return None


def room_for_runs(machine: Machine, num_cpus: float, num_gpus: float) -> int:
    """How many runs at once give each at least one client worker (0: not even one run): the
    clients ``machine`` runs at once, as :func:`plan_workers` counts them."""
    return min(_limits(machine, num_cpus, num_gpus).values())


def share_machine(machine: Machine, parallel: int) -> list[Machine]:
    """``machine`` split for ``parallel`` runs at once: each run an equal whole number of cores;
    whole GPUs where there are at least as many GPUs as runs, else each run a GPU it shares
    with ceil(runs / GPUs) - 1 others (its capacity that fraction). The shares' GPU indices are
    the machine's."""
    if parallel < 1:
        raise ValueError(f"parallel = {parallel}: at least one run")
    cores = max(1, math.floor(machine.cores / parallel + _EPS)) if machine.cores >= 1 else machine.cores
    gpus = list(machine.gpus)
    shares = []
    for run in range(parallel):
        if not gpus:
            mine: tuple[tuple[int, float], ...] = ()
        elif len(gpus) >= parallel:
            lo, hi = run * len(gpus) // parallel, (run + 1) * len(gpus) // parallel
            mine = tuple(gpus[lo:hi])
        else:
            per_gpu = math.ceil(parallel / len(gpus))
            index, capacity = gpus[run % len(gpus)]
            mine = ((index, capacity / per_gpu),)
        shares.append(Machine(cores, mine))
    return shares


# ---- this machine -------------------------------------------------------------------------
def detect_machine(federation: Mapping[str, Any] | None = None) -> Machine:
    """This machine as the simulation would see it
    (:func:`~fedvls_flwr.config.client_resources.this_machine`: its cores and GPUs, or what
    Ray's ``init-args-num-cpus`` / ``init-args-num-gpus`` in ``federation`` declare), with no
    more GPUs than there are (a worker cannot use a GPU that is only declared)."""
    room = this_machine(federation or {})
    shown = visible_gpus()
    gpus = min(int(room.gpus), shown)
    note = ""
    if gpus > 0 and (usable := torch_gpus()) is not None and usable < gpus:
        note = (f"torch in this process sees {usable} of the {shown} GPU(s) this machine shows "
                f"(CUDA_VISIBLE_DEVICES={_shown_env()}): a CPU-only build of torch, an index past the last GPU in "
                "CUDA_VISIBLE_DEVICES, or a driver torch cannot use; the run plans with "
                f"{usable} GPU(s)")
        gpus = usable
    return Machine(room.cpus, tuple((i, 1.0) for i in range(gpus)), note)


def torch_gpus() -> int | None:
    """The CUDA devices torch sees, when this process has imported torch already (None when it
    has not: ``fedvls check`` and the sweep's planner stay without it). ``device_count`` asks
    NVML first, as CUDA_VISIBLE_DEVICES trims it, and opens no CUDA context."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - a broken CUDA install: the device files' count stands
        return None


def _shown_env() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "unset" if value is None else repr(value)


def cuda_visible_devices(gpus: tuple[int, ...], parent: str | None = None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker given ``gpus`` (indices of the GPUs its parent
    sees): the parent's own entries for them (``parent``: its ``CUDA_VISIBLE_DEVICES``), and
    "" for none, as Ray gives an actor that asked for no GPU."""
    if not gpus:
        return ""
    if parent is None or not parent.strip():
        return ",".join(str(g) for g in gpus)
    entries = [e.strip() for e in parent.split(",")]
    return ",".join(entries[g] for g in gpus)
