"""How many client workers a run gets, and on which device: the federation config read the way
Flower's Ray simulation reads it, so that one config means the same on both engines.

Flower sizes its pool of Ray actors from ``client-resources-num-cpus`` and
``client-resources-num-gpus`` (``flwr/simulation/ray_transport/ray_actor.py``,
``pool_size_from_resources``): as many actors as the machine's CPUs hold at ``num-cpus`` each
and, when ``num-gpus`` > 0, as many as its GPUs hold at that share each (Ray packs fractions
of one GPU: 0.25 puts four actors on every GPU); an actor that asks for no GPU is given none
(Ray sets ``CUDA_VISIBLE_DEVICES=""``) and computes with ``OMP_NUM_THREADS = num-cpus``. The
in-process engine's workers (:mod:`fedvls_flwr.ops.client_pool`) are sized by the same rules,
capped at the number of nodes (a worker without a node has nothing to do), by
:func:`plan_workers`, a pure function of a :class:`Machine` and the config.

A sweep that runs several runs at once (``fedvls sweep --parallel N``) first splits the machine
into N shares (:func:`share_machine`), and each run is sized inside its share.

Standard library only: ``fedvls check`` and the sweep call it without loading torch.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Machine", "WorkerPlan", "detect_machine", "plan_workers", "resource_problem", "room_for_runs",
           "share_machine"]

#: Flower's defaults for a simulated client (``client-resources-num-cpus`` and ``-num-gpus``).
FLOWER_DEFAULT_CLIENT_CPUS = 2.0
FLOWER_DEFAULT_CLIENT_GPUS = 0.0
#: Float slack when counting how many shares fit (1 / 0.1 must give 10).
_EPS = 1e-9


@dataclass(frozen=True)
class Machine:
    """What a run may use: ``cores`` CPU cores and, per GPU, (its index among the GPUs this
    process sees, the part of it the run may fill: 1.0 the whole GPU)."""

    cores: float
    gpus: tuple[tuple[int, float], ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

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
        process, as before there were workers (nothing to start, nothing to hide)."""
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


def plan_workers(machine: Machine, num_cpus: float, num_gpus: float, nodes: int, *, torch_threads: int = 0,
                 most: int | None = None) -> WorkerPlan:
    """The client workers for ``nodes`` nodes at ``num_cpus`` CPUs and ``num_gpus`` GPUs each:
    min(cores / num-cpus, the GPU slots when num-gpus > 0, nodes, ``most``), at least one
    (a config the machine cannot serve is :func:`resource_problem`'s to refuse first). Threads:
    the run's ``torch-threads`` when > 0, else num-cpus (Ray's ``OMP_NUM_THREADS``)."""
    limits = {"cores": math.floor(machine.cores / num_cpus + _EPS) if num_cpus > 0 else nodes, "nodes": nodes}
    slots = gpu_slots(machine, num_gpus)
    if num_gpus > 0:
        limits["GPU share"] = len(slots)
    if most is not None:
        limits["asked"] = most
    count = max(1, min(limits.values()))
    devices = tuple(slots[:count]) if num_gpus > 0 and slots else ((),) * count
    omp_threads = max(1, int(num_cpus))
    threads = torch_threads if torch_threads > 0 else omp_threads
    bound = min(limits, key=lambda k: limits[k])
    why = {"cores": f" ({machine.cores:g} cores / client-resources-num-cpus={num_cpus:g})",
           "nodes": f" (one per node: {nodes} nodes)",
           "GPU share": f" ({machine.gpu_count} GPU(s) / client-resources-num-gpus={num_gpus:g})",
           "asked": " (as asked)"}[bound]
    return WorkerPlan(devices, threads, omp_threads, gpu_free_machine=not machine.gpus, why=why)


def resource_problem(num_cpus: float, num_gpus: float, machine: Machine, *, where: str = "this machine") -> str | None:
    """Why no client can start on ``machine`` with these client resources (and how to fix it),
    or None. The same rules refuse a config for ``fedvls run``, ``fedvls sweep`` and
    ``fedvls check``; under ``flwr run .`` Ray would fail later ("The ActorPool is empty")."""
    if num_cpus <= 0 or not math.isfinite(num_cpus):
        return f"client-resources-num-cpus = {num_cpus:g} must be a number > 0 (the CPUs each client gets), e.g. 1"
    if num_gpus < 0 or not math.isfinite(num_gpus):
        return f"client-resources-num-gpus = {num_gpus:g} must be >= 0 (the share of a GPU each client gets), e.g. 0.25"
    if num_cpus > machine.cores + _EPS:
        return (f"client-resources-num-cpus = {num_cpus:g} but {where} has {machine.cores:g} core(s): no client "
                f"could start. Fix: client-resources-num-cpus={max(1, int(machine.cores))} or less")
    if num_gpus > 1 + _EPS and abs(num_gpus - round(num_gpus)) > _EPS:
        return (f"client-resources-num-gpus = {num_gpus:g}: a client takes a share of one GPU (at most 1, e.g. "
                "0.25: four clients per GPU) or whole GPUs (2, 3, ...), as Ray places them")
    if num_gpus > 0 and not machine.gpus:
        return (f"client-resources-num-gpus = {num_gpus:g} asks for a GPU share per client, but {where} has no GPU "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!s}). Fix: "
                "client-resources-num-gpus=0 to train on the CPU, or run on a machine with a GPU")
    if num_gpus > 0 and not gpu_slots(machine, num_gpus):
        return (f"client-resources-num-gpus = {num_gpus:g} but {where} has {machine.describe()}: no client fits. "
                f"Fix: client-resources-num-gpus={min(1.0, max((s for _, s in machine.gpus), default=1.0)):g} or less")
    return None


def room_for_runs(machine: Machine, num_cpus: float, num_gpus: float) -> int:
    """How many runs at once give each at least one client worker (0: not even one run)."""
    room = math.floor(machine.cores / num_cpus + _EPS) if num_cpus > 0 else 0
    if num_gpus > 0:
        room = min(room, len(gpu_slots(machine, num_gpus)))
    return room


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
def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, less a cgroup's CPU quota (a
    container's ``--cpus``), as Ray counts them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def visible_gpu_count() -> int:
    """The GPUs this process may use: torch's count where torch is already loaded, else
    ``CUDA_VISIBLE_DEVICES`` when set, else the NVIDIA device files (no torch import: a sweep
    or ``fedvls check`` pays nothing for it)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return int(torch.cuda.device_count())
        except Exception:  # noqa: BLE001 - a broken CUDA setup: no GPU for us
            return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = sorted(p.name for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
    if visible is not None:
        entries = []
        for entry in visible.split(","):
            if not entry.strip() or entry.strip().startswith("-"):
                break  # CUDA stops at the first invalid entry
            entries.append(entry)
        return len(entries) if devices or Path("/proc/driver/nvidia").exists() else 0
    return len(devices)


def detect_machine(federation: Mapping[str, Any] | None = None) -> Machine:
    """This machine as the simulation would see it: its cores and GPUs, or what Ray's
    ``init-args-num-cpus`` / ``init-args-num-gpus`` in ``federation`` give Ray instead (Ray
    takes them as they are; GPUs no more than there are)."""
    federation = federation or {}
    cores: float = usable_cores()
    gpus = visible_gpu_count()
    if isinstance(federation.get("init-args-num-cpus"), (int, float)):
        cores = float(federation["init-args-num-cpus"])
    if isinstance(federation.get("init-args-num-gpus"), (int, float)):
        gpus = min(gpus, int(federation["init-args-num-gpus"]))
    return Machine(cores, tuple((i, 1.0) for i in range(gpus)))


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
