"""Separate hosts, proven: docs/deployment.md sections 3-6 followed on four network namespaces.

The SuperLink host (SuperLink on 127.0.0.1, the fence on the public address), two site hosts
with their own data, Flower homes and keys, and the operator's machine, each its own network
namespace on a private /24 (:mod:`tests.netns`). Only the files the docs say to move are
copied to each host's folder. Every process runs with ``ip netns exec <host>``, with the ports
and command lines of the docs. Checked: a 3-round run with TLS, SuperNode authentication and
the fence completes; the fence's log shows each site's own address and the operator's; a
SuperNode dialling an address that is not in the server certificate, one with an unregistered
key and one dialling a port that nothing serves each fail as the docs say; and everything made
(processes, namespaces, their veths and bridge) is gone at the end.

Skipped with the reason where namespaces cannot be made (not root, no ``ip``), except where
``FEDVLS_REQUIRE_NETNS=1`` (CI sets it): there that fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.deploy.certs import make_certificates
from fedvls_flwr.deploy.fence import standalone_config
from fedvls_flwr.ops.flower_cli import BIN_DIR, flower_env, node_config_arg, run_config_arg
from fedvls_flwr.ops.launch import PROJECT_DIR
from fedvls_flwr.ops.processes import stop_process
from tests import netns
from tests.nginx import find_or_skip, skip_or_fail
from tests.processes import leftovers
from tests.tiny_data import DIGITS, write_digit_folder

pytestmark = pytest.mark.e2e

HOSTS = {"superlink": 1, "site-a": 2, "site-b": 3, "operator": 4}
FENCE, SUPERLINK_PORT = 9093, 9092      # the docs' ports: each host has its own network
ROUNDS = 3


def _skip_or_fail() -> str:
    """nginx's path; skipped (or, under CI's FEDVLS_REQUIRE_*, failed) without it or namespaces."""
    nginx = find_or_skip()
    reason = netns.unavailable()
    if reason is not None:
        skip_or_fail(reason, "FEDVLS_REQUIRE_NETNS")
    return nginx


@dataclass
class Deployment:
    net: netns.Network
    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    runtime_ports: dict[str, int] = field(default_factory=dict)

    def folder(self, host: str) -> Path:
        return self.root / host

    def spawn(self, host: str, cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with open(log, "ab") as handle:
            proc = subprocess.Popen([*self.net.prefix(host), *cmd], env=env, stdout=handle,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def env(self, host: str, **extra: str) -> dict[str, str]:
        return flower_env(self.folder(host) / "flwr", FEDVLS_CACHE_DIR=str(self.folder(host) / "cache"), **extra)

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """A ``flwr`` command on the operator's machine."""
        return self.net.run("operator", [str(BIN_DIR / "flwr"), *args], env=self.env("operator"), timeout=timeout)

    def supernode(self, site: str, key: Path, superlink: str, partition: int, *, max_retries: int | None = None,
                  log: str = "supernode.log") -> subprocess.Popen:
        """``flower-supernode`` on a site host, as section 4 writes it; a second one on the
        same host gets its own Runtime API port (``--port``), as section 4 says."""
        home = self.folder(site)
        self.runtime_ports[site] = self.runtime_ports.get(site, 9093) + 1
        cmd = [str(BIN_DIR / "flower-supernode"), "--superlink", superlink,
               "--root-certificates", str(home / "certs" / "ca.pem"), "--auth-supernode-private-key", str(key),
               "--node-config", node_config_arg({"dataset": "folder", "data-dir": str(home / "data"),
                                                 "classes": DIGITS, "partition-id": partition, "test-fraction": 0.2})]
        if self.runtime_ports[site] != 9094:
            cmd += ["--port", str(self.runtime_ports[site])]
        if max_retries is not None:
            cmd += ["--max-retries", str(max_retries)]
        return self.spawn(site, cmd, home / log, self.env(site, FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.1"))


def _copy(files: list[Path], to: Path) -> None:
    to.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, to / f.name)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    nginx = _skip_or_fail()
    removed = netns.remove_leftovers()
    if removed:
        print(f"removed leftovers of an earlier run: {removed}")
    root = tmp_path_factory.mktemp("hosts")
    net = netns.Network(HOSTS).create()
    d = Deployment(net, root)
    try:
        _set_up(d, nginx)
        yield d
    finally:
        for proc in reversed(d.procs):
            stop_process(proc)
        net.remove()
    assert net.left() == [], f"namespaces left: {net.left()}"
    assert leftovers([p.pid for p in d.procs], root) == []


def _set_up(d: Deployment, nginx: str) -> None:
    """Sections 3 and 4: keys and certificates to where they belong, then the processes."""
    sl, public = d.folder("superlink"), d.net.address("superlink")
    made = make_certificates(d.root / "ca-machine", [public], ["site-a", "site-b", "intruder"])
    ca = made.tls.ca_cert
    _copy([ca, made.tls.server_cert, made.tls.server_key], sl / "certs")
    _copy([ca, made.operator_cert, made.operator_key], d.folder("operator") / "certs")
    _copy([made.supernode_keys[s][1] for s in ("site-a", "site-b", "intruder")], d.folder("operator") / "keys")
    for site, classes in (("site-a", [0, 1, 2, 3, 4, 5]), ("site-b", [4, 5, 6, 7, 8, 9])):
        _copy([ca, made.supernode_keys[site][0]], d.folder(site) / "certs")
        write_digit_folder(d.folder(site) / "data", classes)
    _copy([ca, made.supernode_keys["intruder"][0]], d.folder("site-b") / "certs")

    # --- the SuperLink host: the SuperLink on 127.0.0.1, then the fence on every interface
    log = sl / "superlink.log"
    proc = d.spawn("superlink", [
        str(BIN_DIR / "flower-superlink"), "--host", "127.0.0.1", "--port", str(SUPERLINK_PORT),
        "--ssl-ca-certfile", str(sl / "certs" / "ca.pem"), "--ssl-certfile", str(sl / "certs" / "server.pem"),
        "--ssl-keyfile", str(sl / "certs" / "server.key"), "--enable-supernode-auth",
        "--database", str(sl / "state.db"), "--disable-runtime-dependency-installation",
    ], log, d.env("superlink"))
    d.net.wait_for_port("superlink", "127.0.0.1", SUPERLINK_PORT, 60, proc, log)
    res = subprocess.run([sys.executable, "-m", "fedvls_flwr", "deploy", "fence-config", "--listen", f"0.0.0.0:{FENCE}",
                          "--superlink-port", str(SUPERLINK_PORT), "--certs", str(sl / "certs")],
                         capture_output=True, text=True, timeout=60, check=True)
    fence = sl / "fence"
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (fence / "tmp" / sub).mkdir(parents=True, exist_ok=True)
    # the printed server block as is, its logs in this host's folder instead of /var/log/nginx
    block = res.stdout.replace("/var/log/nginx/fedvls-fence.", f"{fence}/")
    (fence / "nginx.conf").write_text(standalone_config(fence, block))
    proc = d.spawn("superlink", [nginx, "-p", str(fence), "-e", str(fence / "error.log"), "-c", str(fence / "nginx.conf")],
                   fence / "nginx.out", d.env("superlink"))
    d.net.wait_for_port("site-a", public, FENCE, 30, proc, fence / "nginx.out")

    # --- the operator's machine: the operator link, the connection of section 4, registrations
    op = d.folder("operator")
    log = op / "operator-link.log"
    proc = d.spawn("operator", [
        sys.executable, "-m", "fedvls_flwr", "deploy", "operator-link", "--superlink", f"{public}:{FENCE}",
        "--ca", str(op / "certs" / "ca.pem"), "--cert", str(op / "certs" / "operator.pem"),
        "--key", str(op / "certs" / "operator.key"), "--listen", f"127.0.0.1:{FENCE}",
    ], log, d.env("operator"))
    d.net.wait_for_port("operator", "127.0.0.1", FENCE, 60, proc, log)
    (op / "flwr").mkdir(parents=True, exist_ok=True)
    (op / "flwr" / "config.toml").write_text(
        '[superlink]\ndefault = "lab"\n\n[superlink.lab]\naddress = "127.0.0.1:9093"\ninsecure = true\n')
    for site in ("site-a", "site-b"):
        res = d.flwr("supernode", "register", str(op / "keys" / f"supernode-{site}.pub"), "lab", "--name", site)
        assert res.returncode == 0, res.stdout + res.stderr


def _online(d: Deployment, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = d.flwr("supernode", "list", "lab", "--format", "json")
        nodes = json.loads(res.stdout).get("nodes", []) if res.stdout.strip().startswith("{") else []
        if sum(n.get("status") == "online" for n in nodes) >= count:
            return
        time.sleep(1)
    raise AssertionError(f"fewer than {count} SuperNodes online after {timeout:.0f} s: {res.stdout}{res.stderr}")


def test_three_rounds_across_hosts_with_tls_auth_and_the_fence(deployment: Deployment):
    d = deployment
    public = f"{d.net.address('superlink')}:{FENCE}"
    for i, site in enumerate(("site-a", "site-b")):
        d.supernode(site, d.folder(site) / "certs" / f"supernode-{site}", public, i)
    _online(d, 2)
    out = d.folder("superlink") / "runs"
    config = {"dataset": "digits", "method": "fedvls", "num-server-rounds": ROUNDS, "local-epochs": 1,
              "output-dir": str(out), "run-name": "netns", "min-nodes": 2, "evaluation": "federated",
              "round-timeout": 300.0}
    t0 = time.monotonic()
    res = d.flwr("run", str(PROJECT_DIR), "lab", "--stream", "--run-config", run_config_arg(config), timeout=900)
    seconds = time.monotonic() - t0
    runs = json.loads(d.flwr("list", "lab", "--format", "json").stdout)["runs"]
    assert [r["status"] for r in runs] == ["finished:completed"], res.stdout[-4000:] + res.stderr[-2000:]
    rounds = read_rounds(out / "netns")
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1))
    for r in rounds[1:]:
        assert r["clients_accepted"] == 2 and r["evaluation"] == "federated" and r["eval_nodes"] == 2
    print(f"{ROUNDS} rounds across namespaces in {seconds:.1f} s; accuracy by round: "
          f"{[round(r['accuracy'], 4) for r in rounds]}")

    # The fence saw every host at its own address: the sites on the Fleet API, the operator
    # (with its client certificate) on the Control API.
    access = (d.folder("superlink") / "fence" / "access.log").read_text().splitlines()
    for site in ("site-a", "site-b"):
        mine = [line for line in access if line.startswith(d.net.address(site) + " ")]
        assert any("/v1/fleet/push-messages" in line and '" 200 ' in line for line in mine), site
        assert not any("/v1/control/" in line for line in mine), site
    ops = [line for line in access if line.startswith(d.net.address("operator") + " ")]
    assert any("start-run" in line and 'client_cert=SUCCESS "CN=operator"' in line for line in ops)
    assert not any(line.startswith("127.0.0.1 ") for line in access)
    print("fence log, one line per host:")
    for host in ("site-a", "site-b", "operator"):
        print("  " + next(line for line in access if line.startswith(d.net.address(host) + " ")))


def _ended(proc: subprocess.Popen, timeout: float) -> tuple[int | None, float]:
    t0 = time.monotonic()
    try:
        return proc.wait(timeout=timeout), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - t0


def test_an_address_the_certificate_does_not_list_fails_and_openssl_verify_ip_says_so(deployment: Deployment):
    d = deployment
    other = d.net.add_address("superlink", 9)  # the same host and fence, an address not in server.pem
    site = d.folder("site-a")
    proc = d.supernode("site-a", site / "certs" / "supernode-site-a", f"{other}:{FENCE}", 0, log="wrong-address.log")
    code, seconds = _ended(proc, 120)
    log = (site / "wrong-address.log").read_text()
    assert code == 1, log[-3000:]
    assert "CERTIFICATE_VERIFY_FAILED" in log and "IP address mismatch" in log, log[-3000:]
    # section 6's check: without -verify_ip it passes for this address; with it, it names the cause
    base = ["openssl", "s_client", "-connect", f"{other}:{FENCE}", "-CAfile", str(site / "certs" / "ca.pem"),
            "-verify_return_error"]
    plain = d.net.run("site-a", base, timeout=30)
    named = d.net.run("site-a", [*base, "-verify_ip", other], timeout=30)
    right = d.net.run("site-a", [*base[:3], f"{d.net.address('superlink')}:{FENCE}", *base[4:], "-verify_ip",
                                 d.net.address("superlink")], timeout=30)
    assert "Verify return code: 0 (ok)" in plain.stdout
    assert "Verify return code: 64 (IP address mismatch)" in named.stdout + named.stderr
    assert "Verify return code: 0 (ok)" in right.stdout
    print(f"wrong address: SuperNode exit {code} after {seconds:.1f} s; "
          f"{next(line for line in log.splitlines() if 'IP address mismatch' in line).strip()[:200]}")


def test_an_unregistered_key_fails_with_failed_to_activate(deployment: Deployment):
    d = deployment
    site = d.folder("site-b")
    proc = d.supernode("site-b", site / "certs" / "supernode-intruder", f"{d.net.address('superlink')}:{FENCE}", 7,
                       max_retries=1, log="unregistered.log")
    code, seconds = _ended(proc, 120)
    log = (site / "unregistered.log").read_text()
    assert code == 1, log[-3000:]
    assert "Failed to activate SuperNode" in log, log[-3000:]
    print(f"unregistered key: SuperNode exit {code} after {seconds:.1f} s; "
          f"{next(line for line in log.splitlines() if 'Failed to activate' in line).strip()[:200]}")


def test_a_port_nothing_serves_retries_until_max_retries_and_the_probe_names_it(deployment: Deployment):
    """The SuperLink's own port, as on one machine: bound to 127.0.0.1 on its host, refused
    from a site. Without --max-retries the SuperNode retries for ever; with it, it exits."""
    d = deployment
    site = d.folder("site-a")
    target = f"{d.net.address('superlink')}:{SUPERLINK_PORT}"
    proc = d.supernode("site-a", site / "certs" / "supernode-site-a", target, 0, max_retries=2, log="wrong-port.log")
    code, seconds = _ended(proc, 180)
    log = (site / "wrong-port.log").read_text()
    assert code is not None and code != 0, log[-3000:]
    assert "Connection attempt failed" in log, log[-3000:]
    # only once the retries are used up does Flower's log name the cause
    assert "Giving up reconnection" in log and "[Errno 111] Connection refused" in log, log[-3000:]
    # section 6's probe from the site host tells "nothing listens" from "dropped" and from TLS
    probe = d.net.run("site-a", ["timeout", "5", "openssl", "s_client", "-connect", target], timeout=30)
    assert "Connection refused" in probe.stdout + probe.stderr, probe.stdout + probe.stderr
    print(f"wrong port with --max-retries 2: exit {code} after {seconds:.1f} s; probe: "
          f"{next(line for line in (probe.stdout + probe.stderr).splitlines() if 'refused' in line).strip()}")


def test_leftovers_of_a_killed_run_are_found_by_prefix_and_removed():
    """A run killed before its teardown leaves namespaces (and processes in them) behind:
    the next run removes those whose test process is gone, and nothing else."""
    _skip_or_fail()
    gone = subprocess.Popen(["true"])
    gone.wait()                                   # a PID that no longer runs: the "killed run"
    dead = netns.Network({"h": 1}, tag=str(gone.pid))
    live = netns.Network({"h2": 1}, tag=str(os.getpid()), switch="sw2")   # this run's: kept
    try:
        dead.create()
        sleeper = subprocess.Popen([*dead.prefix("h"), "sleep", "300"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        live.create()
        removed = netns.remove_leftovers()
        # every namespace of the killed run (another killed suite's on this machine may go too)
        assert set(dead.made) <= set(removed) and not set(live.made) & set(removed)
        assert dead.left() == [] and sleeper.wait(timeout=30) is not None
        assert set(live.made) <= set(netns.namespaces())   # a live run's namespaces are kept
    finally:
        mine = [*live.made, *dead.made]
        live.remove()
        dead.remove()
    assert mine and not set(mine) & set(netns.namespaces())
