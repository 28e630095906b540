"""A Ray cluster we own, by PID: a head (and workers) started with ``ray start --block`` on
127.0.0.1, every port chosen here, its own ``--temp-dir``. A sweep joins it by giving its
SuperLink ``RAY_ADDRESS`` (docs/ray-cluster.md; the checks of an address are in
:mod:`fedvls_flwr.app.ray_address`).

No Ray import here: ``ray`` is the CLI next to this interpreter (or on PATH). The processes are stopped by
PID (:func:`fedvls_flwr.ops.processes.stop_process`), never with ``ray stop``, which stops every
Ray cluster of this user on the machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedvls_flwr.ops.flower_cli import console_scripts
from fedvls_flwr.ops.processes import descendants, die_with_parent, free_port, stop_process

RAY_BIN = console_scripts("ray", "ray") / "ray"
#: What ``ray start`` prints once its node serves.
STARTED = "Ray runtime started."


class RayClusterError(RuntimeError):
    """A Ray cluster could not be started, or one named by ``RAY_ADDRESS`` cannot be used."""


def ray_missing() -> str | None:
    """Why Flower's Ray simulation cannot run from this Python - Ray is not installed, or its import
    fails (the line Python ends with) - or None. Asked of a fresh interpreter (about a second):
    importing Ray here would load it into a process that only launches others."""
    try:
        done = subprocess.run([sys.executable, "-c", "import ray"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        return f"Ray cannot be imported here ({err})"
    if done.returncode == 0:
        return None
    last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), f"exit {done.returncode}")
    return f"Ray cannot be imported here ({last.strip()})"


def short_temp_dir(prefix: str = "fvray") -> Path:
    """A new folder for one node's ``--temp-dir``: short, because Ray puts Unix sockets in it
    (at most 107 characters a path)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@dataclass
class RayNode:
    """One ``ray start --block`` process (and the Ray processes below it)."""

    proc: subprocess.Popen
    temp_dir: Path
    log: Path
    ports: dict[str, int]
    head: bool
    owns_temp_dir: bool = True

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid, *descendants(self.proc.pid)]

    def stop(self) -> None:
        stop_process(self.proc, timeout=10.0)
        if self.owns_temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _node_ports(head: bool, taken: set[int], workers: int) -> dict[str, Any]:
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-grpc-port",
             "dashboard-agent-listen-port", "metrics-export-port", "runtime-env-agent-port"]
    if head:
        names += ["port", "ray-client-server-port"]
    ports: dict[str, Any] = {}
    for name in names:
        ports[name] = free_port(None, taken)
        taken.add(ports[name])
    worker_ports = []
    for _ in range(workers):
        worker_ports.append(free_port(None, taken))
        taken.add(worker_ports[-1])
    ports["worker-port-list"] = ",".join(map(str, worker_ports))
    return ports


def ray_start_command(
    *, head: bool, ports: dict[str, Any], temp_dir: Path, num_cpus: float | None = None,
    num_gpus: float | None = None, resources: str | None = None, address: str | None = None,
) -> list[str]:
    """``ray start --block`` for a node on 127.0.0.1 with every port given."""
    cmd = [str(RAY_BIN), "start", "--block", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
           "--disable-usage-stats"]
    if head:
        cmd += ["--head", "--include-dashboard=false"]
    else:
        cmd += [f"--address={address}"]
    cmd += [f"--{name}={value}" for name, value in ports.items()]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus:g}")
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus:g}")
    if resources:
        cmd.append(f"--resources={resources}")
    return cmd


def start_ray_node(
    *, address: str | None = None, num_cpus: float | None = None, num_gpus: float | None = None,
    resources: str | None = None, temp_dir: Path | None = None, log: Path | None = None,
    env: dict[str, str] | None = None, taken: set[int] | None = None, workers: int | None = None,
    timeout: float = 90.0,
) -> RayNode:
    """Start a Ray head (no ``address``) or a worker joining ``address``, on 127.0.0.1, and wait until
    it serves (the head: its GCS port answers; a worker: its raylet's port answers).

    ``workers``: ports for this many Ray worker processes (actors, tasks, drivers) on the node;
    default: two per CPU of the node (``num_cpus``, else this machine's) plus 16.
    The head's address is ``127.0.0.1:<ports['port']>``.
    """
    head = address is None
    owns = temp_dir is None
    temp_dir = short_temp_dir() if temp_dir is None else Path(temp_dir)
    temp_dir.mkdir(parents=True, exist_ok=True)
    if workers is None:
        workers = 2 * int(num_cpus if num_cpus is not None else (os.cpu_count() or 1)) + 16
    ports = _node_ports(head, set() if taken is None else taken, workers)
    cmd = ray_start_command(head=head, ports=ports, temp_dir=temp_dir, num_cpus=num_cpus, num_gpus=num_gpus,
                            resources=resources, address=address)
    log = log or temp_dir / "ray-start.log"
    run_env = dict(os.environ if env is None else env)
    run_env.pop("RAY_ADDRESS", None)  # a head must not look for another cluster
    run_env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    preexec = die_with_parent if sys.platform.startswith("linux") else None
    with open(log, "ab") as handle:
        proc = subprocess.Popen(cmd, env=run_env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=preexec)
    node = RayNode(proc, temp_dir, log, {k: v for k, v in ports.items() if isinstance(v, int)}, head, owns)
    wait_on = ports["port"] if head else ports["node-manager-port"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = log.read_text(errors="replace")[-3000:]
            node.stop()
            raise RayClusterError(f"ray start exited with code {proc.returncode}:\n{said}")
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.settimeout(0.5)
            # "Ray runtime started." comes once the node has registered with the cluster
            if sock.connect_ex(("127.0.0.1", wait_on)) == 0 and STARTED in log.read_text(errors="replace"):
                return node
        time.sleep(0.3)
    said = log.read_text(errors="replace")[-3000:]
    node.stop()
    raise RayClusterError(f"ray start: nothing answered on 127.0.0.1:{wait_on} within {timeout:.0f}s:\n{said}")


@dataclass
class RayHead:
    """A one-machine Ray head for a sweep: a context manager that stops it (by PID) on exit."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    env: dict[str, str] | None = None
    node: RayNode | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        assert self.node is not None, "RayHead not started"
        return f"127.0.0.1:{self.node.ports['port']}"

    def __enter__(self) -> RayHead:
        self.node = start_ray_node(num_cpus=self.num_cpus, num_gpus=self.num_gpus, env=self.env)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.node is not None:
            self.node.stop()
