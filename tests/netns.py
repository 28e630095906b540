"""Separate hosts on one machine: Linux network namespaces joined by a bridge.

Every host is a network namespace with loopback up and one interface ``eth0`` on a private
/24; the bridge lives in a namespace of its own (the "switch"), so nothing is added to the
machine's own network and no packet leaves the namespaces made here. Names start with
``fvt-<tag>-`` (the tag holds the PID of the test process that made them), which is how
:func:`remove_leftovers` finds what an earlier, failed or killed run left behind: namespaces
whose PID is gone, and the processes still running inside them.

Needs root and ``ip`` (iproute2): :func:`unavailable` says why not, for the skip.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "fvt-"
SUBNET = "10.231.7"          # private; used only inside these namespaces
NAME = re.compile(rf"^{PREFIX}(\d+)-(\w+)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed (exit {res.returncode}): {res.stderr.strip()}")
    return res


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2): network namespaces cannot be made"
    if os.geteuid() != 0:
        return "not root: `ip netns add` needs root (CAP_SYS_ADMIN) to make network namespaces"
    probe = f"{PREFIX}{os.getpid()}-probe"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"`ip netns add` fails here: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def pids_in(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_inside(namespace: str, timeout: float = 10.0) -> None:
    """Stop every process running in ``namespace`` (all of them were started here, into it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_in(namespace):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while pids_in(namespace) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not pids_in(namespace):
            return


def delete(namespace: str) -> None:
    kill_inside(namespace)
    _ip("netns", "del", namespace, check=False)


def remove_leftovers() -> list[str]:
    """Namespaces of ours whose test process is gone (a failed or killed run): their
    processes stopped, the namespaces (and with them their veths and bridge) deleted."""
    removed = []
    for name in namespaces():
        m = NAME.match(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            delete(name)
            removed.append(name)
    return removed


@dataclass
class Network:
    """Hosts on ``SUBNET``.0/24: ``hosts`` maps a short host name to its last address byte."""

    hosts: dict[str, int]
    tag: str = field(default_factory=lambda: str(os.getpid()))
    switch: str = "sw"    # the bridge's namespace: another name for a second network of one process
    made: list[str] = field(default_factory=list)

    def ns(self, host: str) -> str:
        return f"{PREFIX}{self.tag}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts[host]}"

    def create(self) -> Network:
        switch = self.ns(self.switch)
        try:
            self._add(switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.hosts):
                ns = self.ns(host)
                self._add(ns)
                _ip("-n", ns, "link", "set", "lo", "up")   # the SuperExec dials 127.0.0.1
                _ip("-n", switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def _add(self, name: str) -> None:
        _ip("netns", "add", name)
        self.made.append(name)

    def add_address(self, host: str, last: int) -> str:
        """A second address on ``host``'s interface."""
        addr = f"{SUBNET}.{last}"
        _ip("-n", self.ns(host), "addr", "add", f"{addr}/24", "dev", "eth0")
        return addr

    def prefix(self, host: str) -> list[str]:
        """Run a command on ``host``: ``[*prefix, cmd...]``."""
        return ["ip", "netns", "exec", self.ns(host)]

    def run(self, host: str, cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 60.0,
            ) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(host), *cmd], env=env, capture_output=True, text=True, timeout=timeout)

    def wait_for_port(self, host: str, address: str, port: int, timeout: float = 60.0,
                      proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
        """Until something listens at ``address:port`` as seen from ``host`` (bounded)."""
        probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=1).close()"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run(host, [sys.executable, "-c", probe], timeout=10).returncode == 0:
                return
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.3)
        tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"nothing listens at {address}:{port} on {host} after {timeout:.0f} s\n{tail}")

    def remove(self) -> None:
        for name in reversed(self.made):
            delete(name)
        self.made.clear()

    def left(self) -> list[str]:
        """Our namespaces that still exist."""
        return [n for n in namespaces() if n.startswith(f"{PREFIX}{self.tag}-")]
