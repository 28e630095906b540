"""Which Ray cluster a simulation joins (``RAY_ADDRESS``) and whether it can: checks the
ServerApp runs before round 1 and ``fedvls check`` runs before anything starts.

Flower 1.41's Ray backend calls ``ray.init(runtime_env=..., **init_args)`` when Ray is not yet
initialised in the simulation's process, with no address: Ray's own rules pick the cluster
(``RAY_ADDRESS``, else the address file ``<temp dir>/ray_current_cluster``, else a new local
one). No Ray import here.
"""

from __future__ import annotations

import os
import socket
from contextlib import closing
from typing import Any

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
