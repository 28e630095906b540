"""Which Ray cluster a simulation joins (``RAY_ADDRESS``) and whether it can: checks the
ServerApp runs before round 1 and ``fedvls check`` runs before anything starts.

Flower 1.41's Ray backend calls ``ray.init(runtime_env=..., **init_args)`` when Ray is not yet
initialised in the simulation's process, with no address: Ray's own rules pick the cluster
(``RAY_ADDRESS``, else the address file ``<temp dir>/ray_current_cluster``, else a new local
one). Ray is imported only to ask a named cluster for its nodes (:func:`cluster_nodes`), and
whether the simulation's clients fit where they will run is :func:`simulation_room_problem`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Mapping
from contextlib import closing
from typing import Any

from fedvls_flwr.config.client_resources import NodeRoom, room_problem, this_machine

#: Federation settings (``flwr run --federation-config``) that become ``ray.init`` arguments
#: for a new cluster. ``ray.init`` refuses num_cpus / num_gpus when it joins a running cluster
#: ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided"):
#: that cluster's nodes were given their resources by ``ray start``.
CONFLICTS_WITH_CLUSTER = {
    "init-args-num-cpus": "--num-cpus",
    "init-args-num-gpus": "--num-gpus",
}
#: ``RAY_ADDRESS`` values that mean "no existing cluster".
LOCAL_ADDRESSES = ("", "local")


def ray_address() -> str | None:
    """The cluster ``RAY_ADDRESS`` names (``host:port``, ``ray://`` prefix kept), or None."""
    value = os.environ.get("RAY_ADDRESS", "").strip()
    return None if value in LOCAL_ADDRESSES else value


def _host_port(address: str) -> tuple[str, int] | None:
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_ray_address(address: str, timeout: float = 2.0) -> str | None:
    """Why ``RAY_ADDRESS`` = ``address`` cannot be joined (not ``host:port``, nothing answers
    there within ``timeout`` s), with the fix; None when something listens there."""
    fix = ("start the cluster's head first (ray start --head --node-ip-address=<IP> --port=<PORT> ..., "
           "docs/ray-cluster.md), or unset RAY_ADDRESS to let each run start its own local Ray")
    where = _host_port(address)
    if where is None:
        return f"RAY_ADDRESS = {address!r} is not host:port (e.g. 127.0.0.1:6379); {fix}"
    if address.startswith("ray://"):
        return (f"RAY_ADDRESS = {address!r} is a Ray Client address: Flower's simulation connects as a driver "
                "on a node of the cluster, so use the head's GCS address host:port (ray start --port), not ray://")
    try:
        with closing(socket.create_connection(where, timeout=timeout)):
            return None
    except OSError as err:
        return f"RAY_ADDRESS = {address!r}: nothing answers at {where[0]}:{where[1]} ({err}); {fix}"


def federation_conflicts(federation: dict[str, Any], address: str | None) -> list[str]:
    """The federation settings that a run joining the cluster at ``address`` cannot have, each
    with its fix; none when no cluster is named."""
    if address is None:
        return []
    return [
        f"federation setting '{key}' = {federation[key]!r} conflicts with RAY_ADDRESS = {address!r}: "
        f"ray.init refuses it when joining a running cluster (its nodes got their resources from "
        f"ray start {flag}); remove {key} from the federation, or unset RAY_ADDRESS to start a new local Ray"
        for key, flag in CONFLICTS_WITH_CLUSTER.items() if federation.get(key) is not None
    ]


def check_cluster_settings(federation: dict[str, Any]) -> list[str]:
    """Every problem of joining the cluster ``RAY_ADDRESS`` names with ``federation``."""
    address = ray_address()
    if address is None:
        return []
    problems = federation_conflicts(federation, address)
    if (unreachable := check_ray_address(address)) is not None:
        problems.append(unreachable)
    return problems


def cluster_nodes(address: str, timeout: float = 5.0) -> list[NodeRoom] | None:
    """The live nodes of the Ray cluster at ``address`` with their CPUs and GPUs, asked of its GCS
    (what ``ray status`` reads; no driver joins the cluster, about 0.3 s); None when it cannot be
    asked (Ray not installed, nothing answers)."""
    try:
        # The package first, then its extension: in a simulation Flower's runtime imports Ray in
        # another thread while the ServerApp asks here. Importing ``ray._raylet`` alone would load
        # the extension beside a half-run ``ray/__init__``; the two threads then wait on each
        # other's import locks, and Python breaks that deadlock by handing Flower's thread a
        # half-initialised ``ray._raylet`` ("cannot import name 'ObjectID' ... partially
        # initialized module"): the simulation dies. ``import ray`` waits for the package instead.
        import ray  # noqa: F401
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Ray's own client of the cluster's metadata service

        info = GcsClient(address=address.split("://", 1)[-1]).get_all_node_info(timeout=timeout)
    except Exception:  # noqa: BLE001 - cannot ask: the run itself will say what is wrong
        return None
    nodes = []
    for node in info.values():
        if node.state != 0:  # GcsNodeInfo.ALIVE
            continue
        resources = dict(node.resources_total)
        nodes.append(NodeRoom(float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0)),
                              name=f"node {node.node_manager_address}"))
    return nodes or None


def simulation_room_problem(federation: Mapping[str, Any], cpus: int | None = None,
                            gpus: int | None = None) -> str | None:
    """Why no client of a Ray simulation with ``federation`` can start where it runs - the cluster
    ``RAY_ADDRESS`` names, else a Ray started on this machine (``cpus`` / ``gpus``: this machine's,
    when not read from it) - with the fix (:func:`fedvls_flwr.config.client_resources.room_problem`);
    None when one can, or when a named cluster cannot be asked (:func:`check_ray_address` says that)."""
    address = ray_address()
    if address is None:
        return room_problem(federation, [this_machine(federation, cpus, gpus)], "this machine")
    nodes = cluster_nodes(address)
    if nodes is None:
        return None
    return room_problem(federation, nodes, f"the Ray cluster at {address}")


#: The functions of Flower 1.41's simulation runtime (``flwr/simulation/run_simulation.py``) whose
#: local ``backend_config_stream`` holds the simulation's backend config as JSON.
_RUNTIME_FRAMES = ("_main_loop", "_run_simulation")


def simulation_federation() -> dict[str, Any] | None:
    """The federation settings of the Flower simulation this process runs, as
    ``--federation-config`` keys (``client-resources-num-cpus``, ``init-args-num-gpus``, ...); None
    outside one, or where they cannot be read.

    Flower 1.41 gives them to its simulation runtime only, not to the ServerApp: they are the
    runtime's backend config, which its main thread holds (as JSON, ``backend_config_stream``)
    for the whole run while the ServerApp runs in a thread of its own. They are read from that
    frame; a Flower that keeps them elsewhere yields None (and the check is skipped, as before)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if frame.f_code.co_name in _RUNTIME_FRAMES and isinstance(frame.f_locals.get("backend_config_stream"), str):
            try:
                backend = json.loads(frame.f_locals["backend_config_stream"])
            except ValueError:
                return None
            break
        frame = frame.f_back
    else:
        return None
    federation: dict[str, Any] = {}
    for group in ("client_resources", "init_args"):
        for key, value in (backend.get(group) or {}).items():
            federation[f"{group}_{key}".replace("_", "-")] = value
    return federation
