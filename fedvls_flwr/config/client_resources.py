"""What a simulated client asks of a machine, and how many clients a machine (or each node of a
Ray cluster) can run at once: the rule Flower 1.41's Ray simulation sizes its pool of client
actors by, in one place, from the federation's keys (``flwr run --federation-config``,
``fedvls run --federation-config``, a preset's ``federation``). Standard library only.

Flower's rule (``flwr/simulation/ray_transport/ray_actor.py``, ``pool_size_from_resources``): on
each Ray node, ``floor(node CPUs / client-resources-num-cpus)`` clients, and when
``client-resources-num-gpus`` > 0 at most ``floor(node GPUs / client-resources-num-gpus)`` - a
node without GPUs runs none; summed over the nodes. A sum of 0 is Flower's "ActorPool is empty",
which it raises only once the run has started and the ServerApp waits in round 1. The callers:

* ``fedvls check`` and ``fedvls run`` refuse such a federation before anything starts, and the
  ServerApp of a Ray simulation before round 1 (:func:`room_problem`);
* the in-process engine sizes its client workers by the same rule
  (:func:`fedvls_flwr.ops.resources.plan_workers` asks :func:`node_limits`, and refuses through
  :func:`room_problem`) - one rule, one answer.

The machine is seen as the Ray that a simulation starts on it would see it: its CPU count and
its NVIDIA GPUs (``CUDA_VISIBLE_DEVICES`` when set, as Ray reads it), unless
``init-args-num-cpus`` / ``init-args-num-gpus`` declare other numbers to that Ray. A cluster's
nodes (``RAY_ADDRESS``) are read from the cluster itself (:mod:`fedvls_flwr.app.ray_address`).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Flower 1.41's client resources when the federation gives none (``RayBackend``).
DEFAULT_CLIENT_CPUS = 2.0
DEFAULT_CLIENT_GPUS = 0.0


@dataclass(frozen=True)
class NodeRoom:
    """What one machine (or one Ray node) offers the simulated clients."""

    cpus: float
    gpus: float
    name: str = "this machine"


def client_ask(federation: Mapping[str, Any]) -> tuple[float, float]:
    """(CPUs, GPUs) each simulated client asks for: ``client-resources-num-cpus`` /
    ``client-resources-num-gpus``, else Flower's defaults (2, 0)."""
    cpus = federation.get("client-resources-num-cpus", DEFAULT_CLIENT_CPUS)
    gpus = federation.get("client-resources-num-gpus", DEFAULT_CLIENT_GPUS)
    return float(cpus), float(gpus)


def node_limits(node: NodeRoom, cpus: float, gpus: float) -> dict[str, int]:
    """The clients asking ``cpus`` CPUs and ``gpus`` GPUs each that ``node`` holds, per resource
    (Flower's rule above): ``{"CPUs": floor(node CPUs / cpus)}`` and, when ``gpus`` > 0,
    ``"GPUs": floor(node GPUs / gpus)`` (0 on a node without GPUs). The smallest is the node's count."""
    limits = {"CPUs": int(node.cpus / cpus) if cpus > 0 else 0}
    if gpus > 0:
        limits["GPUs"] = int(node.gpus / gpus) if node.gpus > 0 else 0
    return limits


def clients_at_once(federation: Mapping[str, Any], nodes: Sequence[NodeRoom]) -> int:
    """How many simulated clients ``nodes`` run at once under ``federation`` (Flower's rule above)."""
    cpus, gpus = client_ask(federation)
    return sum(min(node_limits(node, cpus, gpus).values()) for node in nodes)


def visible_gpus(environ: Mapping[str, str] | None = None, dev: Path = Path("/dev")) -> int:
    """The NVIDIA GPUs this machine shows a process, read without torch: ``CUDA_VISIBLE_DEVICES``
    when set (as Ray reads it: ``""`` is none), else the device files ``/dev/nvidia0``,
    ``/dev/nvidia1``, ... that the driver creates per GPU, else (no such files: WSL, some
    containers) what ``nvidia-smi -L`` lists, where it is installed."""
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [x.strip() for x in listed.split(",") if x.strip()]
        return 0 if ids in ([], ["NoDevFiles"], ["-1"]) else len(ids)
    try:
        files = sum(1 for p in dev.iterdir() if p.name.startswith("nvidia") and p.name[6:].isdigit())
    except OSError:
        files = 0
    if files or (smi := shutil.which("nvidia-smi", path=environ.get("PATH"))) is None:
        return files
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def usable_cores() -> int:
    """The cores this process may run on, as Ray counts a node's CPUs: its CPU affinity (a
    container's or ``taskset``'s CPU set), less a cgroup's CPU quota (a container's ``--cpus``)."""
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


def this_machine(federation: Mapping[str, Any], cpus: int | None = None, gpus: int | None = None) -> NodeRoom:
    """This machine as the Ray a simulation starts here sees it: ``init-args-num-cpus`` /
    ``init-args-num-gpus`` when the federation declares them, else its CPUs
    (:func:`usable_cores`) and GPUs (:func:`visible_gpus`) (``cpus`` / ``gpus`` given: those)."""
    have_cpus = cpus if cpus is not None else usable_cores()
    have_gpus = gpus if gpus is not None else visible_gpus()
    return NodeRoom(float(federation.get("init-args-num-cpus", have_cpus)),
                    float(federation.get("init-args-num-gpus", have_gpus)))


def _per_node(nodes: Sequence[NodeRoom], what: str) -> str:
    """``" (per node: 2, 4)"`` for several nodes; nothing for one machine."""
    return "" if len(nodes) == 1 else f" (per node: {', '.join(f'{getattr(n, what):g}' for n in nodes)})"


def room_problem(federation: Mapping[str, Any], nodes: Sequence[NodeRoom], where: str = "this machine",
                 engine: str = "ray") -> str | None:
    """Why no simulated client of ``federation`` can run on ``nodes`` (``where`` names them: "this
    machine", "the Ray cluster at 10.0.0.5:6379"), with the fix; None when at least one can.

    ``engine``: ``"ray"`` (Flower's simulation: Ray would start no client) or ``"inprocess"``
    (``fedvls run``: a client's CPUs are its torch threads, a GPU share is not divided; refused
    all the same, so that a federation ``fedvls run`` takes also runs under ``flwr run``)."""
    cpus, gpus = client_ask(federation)
    if clients_at_once(federation, nodes) > 0:
        return None
    ray = ("Ray would start no client, and the run would stop after its start-up with Flower's \"ActorPool is "
           "empty\"")
    if engine == "inprocess":
        ray = "flwr run would start no client (Flower's \"ActorPool is empty\"), and fedvls run refuses it the same way"
    if gpus > 0 and not any(n.gpus > 0 for n in nodes):
        return (f"--federation-config client-resources-num-gpus = {gpus:g} gives every simulated client a share of "
                f"a GPU, but {where} has no GPU{_per_node(nodes, 'gpus')}: {ray}. Leave client-resources-num-gpus "
                "out (or 0) to train on the CPU, or run where there is a GPU")
    if gpus > 0 and not any(n.gpus >= gpus for n in nodes):
        most = max(n.gpus for n in nodes)
        return (f"--federation-config client-resources-num-gpus = {gpus:g} asks more GPUs per client than "
                f"{where} has on one node ({most:g}){_per_node(nodes, 'gpus')}: {ray}. Give at most "
                f"client-resources-num-gpus={most:g} (0.25: four clients share a GPU)")
    most = max((n.cpus for n in nodes), default=0.0)
    return (f"--federation-config client-resources-num-cpus = {cpus:g} asks more CPUs per client than {where} "
            f"has ({most:g}){_per_node(nodes, 'cpus')}: {ray}. Give at most client-resources-num-cpus={int(most)} "
            f"(1: {int(most)} clients at a time)")
