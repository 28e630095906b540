"""Deployment helpers: certificates and keys, the fence, and a one-machine launcher.

Commands (see docs/deployment.md for the step-by-step guide on separate machines)::

    # a one-machine trial: CA, SuperLink certificate (SAN: the hosts + 127.0.0.1, localhost),
    # an operator client certificate and SuperNode key pairs, all in one folder
    python -m fedvls_flwr.deploy certs OUT_DIR --host 10.0.0.5 [--host superlink.lab.org] --nodes 2

    # SuperLink on 127.0.0.1 behind the nginx fence, N SuperNodes dialing the fence (TLS,
    # SuperNode authentication and fence unless --no-fence / --insecure), our flwr
    # commands through the operator link, `flwr run . <connection> --stream`, the run's
    # final status, then every process it started is stopped (also on Ctrl-C, SIGTERM, failures)
    python -m fedvls_flwr.deploy local --nodes 2 --run-config "num-server-rounds=3"

    # where a round's seconds went, from the timestamped logs of `local --debug-logs`
    python -m fedvls_flwr.deploy breakdown WORKDIR

    # on a SuperLink host: the nginx server block of the fence
    python -m fedvls_flwr.deploy fence-config --listen 0.0.0.0:9093 --superlink-port 9092 --certs DIR

    # on the operator's machine: a local port for `flwr` that presents the client certificate
    python -m fedvls_flwr.deploy operator-link --superlink 10.0.0.5:9093 --ca ca.pem --cert op.pem --key op.key

The certificates are made with the ``cryptography`` package (a Flower dependency): an EC
P-256 CA, a server certificate whose subjectAltName lists every ``--host`` (IP addresses
as IP entries, names as DNS entries), ``clientAuth`` certificates for operators, and EC
P-384 SuperNode keys in OpenSSH format, the format ``flwr supernode register`` and
``flower-supernode --auth-supernode-private-key`` read. Private keys are written with
mode 0600.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import ipaddress
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click import ClickException

from .check import check_run_config
from .config_args import parse_run_config_args
from .fence import FenceError, require_nginx, serve_operator_link, server_block
from .launch import PROJECT_DIR, LocalSuperLink, RunOutcome, TlsFiles, parse_port_range

__all__ = ["make_certificates", "make_supernode_key", "CertificateSet", "run_local", "main"]


# ---------------------------------------------------------------------------
# certificates and keys


@dataclass(frozen=True)
class CertificateSet:
    tls: TlsFiles
    ca_key: Path
    supernode_keys: dict[str, tuple[Path, Path]]  # name -> (private key, public key)
    operator_cert: Path | None = None  # the client certificate the fence admits to the Control API
    operator_key: Path | None = None


# The SuperLink behind the fence listens on 127.0.0.1: its own SuperExec dials that IP and
# nginx verifies it under the name localhost, so the server certificate always lists both.
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)


def _san_entries(hosts: list[str]):
    from cryptography import x509

    entries = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return entries


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _leaf_certificate(ca_key, ca_cert, subject: str, public_key, *, server_hosts: list[str] | None, days: int):
    """A certificate signed by the CA: for a TLS server (subjectAltName = ``server_hosts``,
    serverAuth) when ``server_hosts`` is given, else for a TLS client (clientAuth)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=server_hosts is not None,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server_hosts is not None else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            ),
            critical=False,
        )
    )
    if server_hosts is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san_entries(server_hosts)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_certificates(
    out_dir: Path, hosts: list[str], nodes: list[str] | None = None, days: int = 365,
    operators: list[str] | None = None,
) -> CertificateSet:
    """Everything in one folder, for a trial on one machine (on separate machines each key
    is made on its own host: docs/deployment.md, section 3).

    Writes ``ca.pem``/``ca.key``, ``server.pem``/``server.key`` (subjectAltName = ``hosts``
    plus 127.0.0.1 and localhost, for the fence), per name in ``nodes`` a SuperNode key pair
    ``supernode-<name>`` + ``.pub``, and per name in ``operators`` (default: one,
    ``operator``) a client certificate ``<name>.pem`` + ``<name>.key`` that the fence
    admits to the Control API.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if not hosts:
        raise ValueError("give at least one --host (the address SuperNodes and users dial)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedvls-flwr CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    san = list(dict.fromkeys([*hosts, *LOOPBACK_NAMES]))
    server_cert = _leaf_certificate(ca_key, ca_cert, hosts[0], server_key.public_key(), server_hosts=san, days=days)

    tls = TlsFiles.in_dir(out)
    pem = serialization.Encoding.PEM
    _write(tls.ca_cert, ca_cert.public_bytes(pem))
    _write(out / "ca.key", _pem_key(ca_key), private=True)
    _write(tls.server_cert, server_cert.public_bytes(pem))
    _write(tls.server_key, _pem_key(server_key), private=True)
    keys = {name: make_supernode_key(out / f"supernode-{name}") for name in (nodes or [])}
    operator_files = []
    for name in operators if operators is not None else ["operator"]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf_certificate(ca_key, ca_cert, name, key.public_key(), server_hosts=None, days=days)
        _write(out / f"{name}.pem", cert.public_bytes(pem))
        _write(out / f"{name}.key", _pem_key(key), private=True)
        operator_files.append((out / f"{name}.pem", out / f"{name}.key"))
    first = operator_files[0] if operator_files else (None, None)
    return CertificateSet(tls, out / "ca.key", keys, *first)


def make_supernode_key(path: Path) -> tuple[Path, Path]:
    """An EC P-384 key pair in OpenSSH format: ``path`` (private, 0600) and ``path.pub``.

    Same as ``ssh-keygen -t ecdsa -b 384 -N "" -f path``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path = Path(path)
    _write(
        path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
        private=True,
    )
    pub = path.with_name(path.name + ".pub")
    _write(pub, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return path, pub


# ---------------------------------------------------------------------------
# the local launcher


class _Terminated(BaseException):
    """SIGTERM/SIGHUP received: unwind (and stop everything) like Ctrl-C does."""


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise _Terminated(signum)


def parse_config_string(text: str | None, option: str = "--run-config") -> dict[str, Any]:
    """``"k1=v1 k2='s'"`` (the ``--run-config``/``--node-config`` syntax) -> dict.

    Strict: an item Flower's parser would silently drop (``lr=``, a bare ``lr``) is a
    ConfigError naming it (fedvls_flwr.config_args).
    """
    if not text:
        return {}
    return parse_run_config_args([text], option=option)


def node_configs(
    nodes: int, node_data: list[str] | None, node_dataset: str, classes: str | None,
    node_config: list[str] | None, test_fraction: float | None = None,
) -> list[dict[str, Any]]:
    """One node config per SuperNode: raw ``--node-config`` strings, node-local folders
    (``--node-data``) or, by default, the partition form ``partition-id=i num-partitions=N``;
    ``test_fraction`` (not with raw strings) adds ``test-fraction`` to every node."""
    extra = {} if test_fraction is None else {"test-fraction": float(test_fraction)}
    if node_config:
        if len(node_config) != nodes:
            raise SystemExit(f"--node-config given {len(node_config)} times for --nodes {nodes}; give one per node")
        return [parse_config_string(text, "--node-config") for text in node_config]
    if node_data:
        configs = []
        for i, directory in enumerate(node_data):
            config: dict[str, Any] = {
                "dataset": node_dataset, "data-dir": str(Path(directory).expanduser().resolve()), "partition-id": i,
            }
            if classes:
                config["classes"] = classes
            configs.append({**config, **extra})
        return configs
    return [{"partition-id": i, "num-partitions": nodes, **extra} for i in range(nodes)]


def run_local(
    nodes: int = 2,
    *,
    secure: bool = True,
    auth: bool = True,
    fence: bool | None = None,
    run_config: dict[str, Any] | None = None,
    configs: list[dict[str, Any]] | None = None,
    workdir: Path | None = None,
    app_dir: Path = PROJECT_DIR,
    timeout: float = 3600.0,
    echo: bool = True,
    env_extra: dict[str, str] | None = None,
    port_range: tuple[int, int] | None = None,
) -> tuple[RunOutcome, Path, list[int]]:
    """SuperLink + ``nodes`` SuperNodes on 127.0.0.1, one streamed run, everything stopped.

    ``fence`` (default: whenever ``secure``): nginx in front of the SuperLink passes only
    the Fleet API to SuperNodes; our ``flwr`` commands reach the Control API through the
    operator link with the operator's client certificate (:mod:`fedvls_flwr.fence`).
    Returns (outcome, run folder, PIDs of every process started - all stopped by then).
    """
    if auth and not secure:
        raise ValueError("SuperNode authentication needs TLS: drop --insecure or add --no-auth")
    if fence is None:
        fence = secure
    if fence and not secure:
        raise ValueError("the fence needs TLS: drop --insecure or add --no-fence")
    if fence:
        require_nginx()  # before anything starts
    workdir = Path(workdir or tempfile.mkdtemp(prefix="fedvls-deploy-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    configs = configs or [{"partition-id": i, "num-partitions": nodes} for i in range(nodes)]
    names = [f"node-{i}" for i in range(len(configs))]
    run_config = {
        "output-dir": str(workdir / "runs"),
        "run-name": "deploy",
        "min-nodes": len(configs),
        **(run_config or {}),
    }
    run_dir = Path(os.path.expanduser(str(run_config["output-dir"]))) / str(run_config["run-name"])

    say = print if echo else (lambda *a, **k: None)
    link = LocalSuperLink(
        workdir / "flwr", simulation=False, env_extra=dict(env_extra or {}), port_range=port_range,
    )
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in previous:
        # SIGINT explicitly too: a launcher started in the background inherits it ignored.
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else _raise_terminated)
    try:
        certs = None
        if secure:
            certs = make_certificates(workdir / "certs", ["127.0.0.1", "localhost"], names if auth else [])
            say(f"[deploy] certificates and keys in {workdir / 'certs'}")
        link.start(insecure=not secure, tls=certs.tls if certs else None, supernode_auth=auth)
        say(f"[deploy] SuperLink on {link.address} ({'TLS' if secure else 'INSECURE'}"
            f"{', SuperNode authentication' if auth else ''}); logs in {link.home}")
        if fence:
            link.start_fence(certs.operator_cert, certs.operator_key)
            say(f"[deploy] fence (nginx) on {link.fleet_address}: Fleet API for SuperNodes, Control API only "
                f"with the operator certificate; operator link on 127.0.0.1:{link.control_port}; "
                f"logs in {link.home / 'fence'}")
        for name, config in zip(names, configs):
            key = None
            if auth:
                private, public = certs.supernode_keys[name]
                node_id = link.register_supernode(public, name=name)
                say(f"[deploy] registered {name} (node id {node_id})")
                key = private
            proc = link.start_supernode(name, config, private_key=key)
            say(f"[deploy] {name}: pid {proc.pid}, dials {link.fleet_address}, node config {config}")
        time.sleep(1.0)
        dead = [(n, p.returncode) for n, p in zip(names, link.processes[-len(names):]) if p.poll() is not None]
        if dead:
            raise RuntimeError(f"SuperNode(s) exited at start: {dead}; see the logs in {link.home}")
        say(f"[deploy] flwr run {app_dir} {link.connection} --stream")
        outcome = link.run_streaming(app_dir, run_config, log=workdir / "flwr-run.log", timeout=timeout, echo=echo)
        return outcome, run_dir, list(link.started_pids)
    finally:
        link.stop()
        started = link.started_pids
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say(f"[deploy] stopped every process started ({len(started)} process trees)")


def evaluation_warning(run_config: dict[str, Any], configs: list[dict[str, Any]], app_dir: Path = PROJECT_DIR) -> str | None:
    """Why this run would evaluate nothing, or None.

    With ``evaluation = "federated"`` the accuracy comes only from nodes holding a local
    test split (node config ``test-fraction`` > 0); without one, every round says
    ``accuracy n/a``. Said before anything starts.
    """
    cfg = check_run_config(run_config, data=False, app_dir=app_dir)
    if cfg.evaluation != "federated":
        return None
    if any(float(c.get("test-fraction", 0) or 0) > 0 for c in configs):
        return None
    return (
        "evaluation='federated' but no node holds a local test split (node config test-fraction, "
        "default 0): this run evaluates nothing and every round reports accuracy n/a. "
        "Give the nodes one (e.g. --test-fraction 0.2) or let the server evaluate (evaluation='auto')"
    )


def _site(failure: dict[str, Any]) -> str:
    """A failed node as the operator knows it: its site's partition id, else Flower's node id."""
    if failure.get("partition_id") is not None:
        return f"site {failure['partition_id']} (node {failure.get('node')})"
    return f"node {failure.get('node')}"


def _report(outcome: RunOutcome, run_dir: Path) -> None:
    print(f"[deploy] run {outcome.run_id}: {outcome.status} after {outcome.seconds:.1f}s")
    rounds_file = run_dir / "rounds.jsonl"
    if not rounds_file.is_file():
        print(f"[deploy] no results in {run_dir}")
        return
    rounds = [json.loads(line) for line in rounds_file.read_text().splitlines() if line.strip()]
    for r in rounds[1:]:
        accuracy = r.get("accuracy")
        shown = "n/a (nothing evaluated)" if accuracy is None else f"{accuracy:.4f}"
        print(
            f"[deploy] round {r['round']}: accuracy {shown}, "
            f"clients {r.get('clients_accepted')}/{r.get('clients_sampled')}, {r.get('seconds') or 0.0:.2f}s"
        )
        for failure in r.get("failures", []):
            print(f"[deploy]   {_site(failure)}: {failure.get('reason')}")
    print(f"[deploy] results in {run_dir}")


# ---------------------------------------------------------------------------
# where the seconds of a round go (from FLWR_LOG_LEVEL=DEBUG logs, which carry timestamps)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = re.compile(r"^(DEBUG|INFO|WARNING|ERROR)\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\s*:\s*(.*)$")
_DATA = re.compile(r"node data: .* in (\d+\.\d+)s")
_ROUND_START = re.compile(r"round (\d+): training on")
_ROUND_END = re.compile(r"round (\d+)/\d+: accuracy")
PHASES = ("pull", "process start", "task + app unpack", "imports", "data", "training", "reply", "server")


def _stamped(path: Path) -> list[tuple[float, str]]:
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        m = _STAMP.match(_ANSI.sub("", raw).strip())
        if m:
            t = _dt.datetime.strptime(m.group(2), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((t, m.group(3)))
    return out


def _node_messages(path: Path) -> list[dict[str, float]]:
    """Per message a SuperNode handled: timestamps of its steps (Flower 1.41 log lines)."""
    messages, cur = [], None
    for t, text in _stamped(path):
        if text.startswith("Receiving:"):
            cur = {"recv": t}
        elif cur is None:
            continue
        elif text.startswith("Start `flwr-clientapp` process"):
            cur["proc"] = t
        elif "Start `ClientApp` Loading" in text:
            cur["load"] = t
        elif (m := _DATA.search(text)) and "data_end" not in cur:
            cur["data_end"], cur["data"] = t, float(m.group(1))
        elif text.startswith("Runtime.PushMessages"):
            cur["push"] = t
        elif text.startswith("Sent successfully"):
            cur["sent"] = t
            messages.append(cur)
            cur = None
    return messages


class BreakdownInputError(ValueError):
    """The folder lacks the logs ``breakdown`` reads; the message says which and how to make them."""


def breakdown(workdir: Path) -> dict[str, Any]:
    """Mean seconds per phase of a round, from a ``local --debug-logs`` work folder.

    pull: round start -> the SuperNode pulled the message (it polls every 3 s);
    process start: -> ``flwr-clientapp`` running (SuperExec's 1 s task poll, a new Python
    process, Flower's runtime imports); task + app unpack: -> the ClientApp module starts
    loading; imports: -> our code starts preparing data (``import client_app``: torch,
    flwr.app, the package); data: as logged by node_data; training: -> reply pushed (model
    build, local epochs, serialisation); reply: -> the SuperNode sent it (0.5 s poll +
    upload); server: last reply -> round logged (the ServerApp polls every 3 s, then
    aggregates and evaluates). Node phases are averaged over nodes; they run in parallel.
    """
    home = Path(workdir) / "flwr"
    run_log = Path(workdir) / "flwr-run.log"
    node_logs = sorted(home.glob("node-*.log"))
    missing = [str(p) for p in (run_log,) if not p.is_file()] + ([] if node_logs else [f"{home}/node-*.log"])
    if missing:
        raise BreakdownInputError(
            f"breakdown needs the work folder of `deploy local --debug-logs`; {workdir} lacks "
            f"{' and '.join(missing)}. For a deployment started by hand, start every process with "
            "FLWR_LOG_LEVEL=DEBUG (timestamped lines), save the output of `flwr run . <connection> --stream` "
            "as WORKDIR/flwr-run.log and each SuperNode's output as WORKDIR/flwr/node-<i>.log"
        )
    starts, ends = {}, {}
    for t, text in _stamped(run_log):
        if m := _ROUND_START.search(text):
            starts[int(m.group(1))] = t
        elif m := _ROUND_END.search(text):
            ends[int(m.group(1))] = t
    nodes = {p.stem: _node_messages(p) for p in node_logs}
    rounds = []
    for r in sorted(set(starts) & set(ends)):
        t0, t1 = starts[r], ends[r]
        msgs = [m for ms in nodes.values() for m in ms if t0 <= m["recv"] <= t1 and "sent" in m]
        if not msgs:
            continue
        per: dict[str, list[float]] = {k: [] for k in PHASES}
        for m in msgs:
            if not {"proc", "load", "push"} <= set(m):
                continue
            data_start = m.get("data_end", m["load"]) - m.get("data", 0.0)
            per["pull"].append(m["recv"] - t0)
            per["process start"].append(m["proc"] - m["recv"])
            per["task + app unpack"].append(m["load"] - m["proc"])
            per["imports"].append(data_start - m["load"])
            per["data"].append(m.get("data", float("nan")))
            per["training"].append(m["push"] - m.get("data_end", data_start))
            per["reply"].append(m["sent"] - m["push"])
        per["server"].append(t1 - max(m["sent"] for m in msgs))
        rounds.append({"round": r, "seconds": t1 - t0, **{k: statistics.fmean(v) if v else float("nan") for k, v in per.items()}})
    return {"rounds": rounds}


def _print_breakdown(result: dict[str, Any]) -> None:
    rounds = result["rounds"]
    if not rounds:
        print("no complete round found: the logs carry no timestamped round lines "
              "(run `local` with --debug-logs, i.e. FLWR_LOG_LEVEL=DEBUG everywhere)")
        return
    header = f"{'round':>5} {'seconds':>8} " + " ".join(f"{p:>17}" for p in PHASES)
    print(header)
    for r in rounds:
        print(f"{r['round']:>5} {r['seconds']:>8.2f} " + " ".join(f"{r[p]:>17.2f}" for p in PHASES))
    mean = {k: statistics.fmean(r[k] for r in rounds) for k in ("seconds", *PHASES)}
    print(f"{'mean':>5} {mean['seconds']:>8.2f} " + " ".join(f"{mean[p]:>17.2f}" for p in PHASES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedvls_flwr.deploy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("certs", help="a CA, a SuperLink certificate, an operator client certificate and "
                                     "SuperNode key pairs, all in one folder (for a trial on one machine)")
    c.add_argument("out_dir", type=Path)
    c.add_argument("--host", action="append", required=True,
                   help="IP address or DNS name SuperNodes and users dial to reach the SuperLink (repeat)")
    c.add_argument("--nodes", type=int, default=0, help="make this many SuperNode key pairs (node-0, node-1, ...)")
    c.add_argument("--node", action="append", default=[], help="make a SuperNode key pair with this name (repeat)")
    c.add_argument("--operator", action="append", default=[],
                   help="make an operator client certificate NAME.pem/NAME.key (repeat; default: one named operator)")
    c.add_argument("--days", type=int, default=365, help="validity of the certificates")

    loc = sub.add_parser("local", help="SuperLink + N SuperNodes on 127.0.0.1, one streamed run, then stop all")
    loc.add_argument("--nodes", type=int, default=2)
    loc.add_argument("--insecure", action="store_true",
                     help="no TLS, no SuperNode authentication, no fence (explicit opt-out)")
    loc.add_argument("--tls", action="store_true", help="TLS with generated certificates (the default)")
    loc.add_argument("--auth", action="store_true", help="SuperNode authentication (the default with TLS)")
    loc.add_argument("--no-auth", action="store_true", help="TLS without SuperNode authentication")
    loc.add_argument("--no-fence", action="store_true",
                     help="no nginx fence: SuperNodes and flwr reach the SuperLink's one port directly "
                          "(the Control API is then open to every SuperNode host)")
    loc.add_argument("--port-range", metavar="LO-HI",
                     help="take every port opened here (SuperLink, fence, operator link, SuperNodes) from LO-HI")
    loc.add_argument("--run-config", default="", help="run config overrides, as for flwr run --run-config")
    loc.add_argument("--node-data", nargs="+", metavar="DIR",
                     help="node-local data: one folder per SuperNode (sets --nodes)")
    loc.add_argument("--node-dataset", default="folder",
                     help="dataset of the --node-data folders: 'folder' (class subfolders) or a dataset name")
    loc.add_argument("--classes", help="comma-separated class names fixing label ids (folder data)")
    loc.add_argument("--test-fraction", type=float, metavar="F",
                     help="each node holds out this stratified fraction of its data as a local test split "
                          "(node config test-fraction; needed for evaluation='federated')")
    loc.add_argument("--node-config", action="append", metavar="STR",
                     help="a SuperNode's raw --node-config (repeat once per node; overrides the above)")
    loc.add_argument("--workdir", type=Path, help="certificates, Flower homes and logs (default: a new temp folder)")
    loc.add_argument("--app", type=Path, default=PROJECT_DIR, help="the Flower app folder (default: this project)")
    loc.add_argument("--timeout", type=float, default=3600.0, help="stop the run after this many seconds")
    loc.add_argument("--debug-logs", action="store_true",
                     help="FLWR_LOG_LEVEL=DEBUG everywhere (timestamped logs, for `breakdown`)")

    b = sub.add_parser("breakdown", help="seconds per round and per phase, from a `local --debug-logs` work folder")
    b.add_argument("workdir", type=Path)
    b.add_argument("--json", action="store_true")

    f = sub.add_parser("fence-config", help="print the nginx server block of the fence for a SuperLink host")
    f.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="the public address SuperNodes and operators dial, e.g. 0.0.0.0:9093")
    f.add_argument("--superlink-port", type=int, required=True,
                   help="the port of the SuperLink, started with --host 127.0.0.1 --port PORT")
    f.add_argument("--certs", type=Path, required=True,
                   help="folder holding ca.pem, server.pem and server.key (absolute paths are written)")

    o = sub.add_parser("operator-link", help="on the operator's machine: a local port for `flwr` that reaches "
                                             "the fence's Control API with the operator's client certificate")
    o.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the fence's public address")
    o.add_argument("--ca", type=Path, required=True, help="the CA certificate (ca.pem)")
    o.add_argument("--cert", type=Path, required=True, help="the operator's client certificate")
    o.add_argument("--key", type=Path, required=True, help="the operator's private key")
    o.add_argument("--listen", default="127.0.0.1:9093", metavar="HOST:PORT",
                   help="where `flwr` connects (default 127.0.0.1:9093; keep it on 127.0.0.1)")
    args = parser.parse_args(argv)

    if args.command == "breakdown":
        try:
            result = breakdown(args.workdir)
        except BreakdownInputError as err:
            print(f"[deploy] {err}", file=sys.stderr)
            return 2
        print(json.dumps(result, indent=2)) if args.json else _print_breakdown(result)
        return 0

    if args.command == "certs":
        names = [*args.node, *(f"node-{i}" for i in range(args.nodes))]
        made = make_certificates(args.out_dir, args.host, names, days=args.days, operators=args.operator or None)
        print(f"CA certificate:      {made.tls.ca_cert}   (copy to every SuperNode and user machine)")
        print(f"CA key:              {made.ca_key}   (keep offline; only needed to sign more certificates)")
        print(f"SuperLink cert/key:  {made.tls.server_cert} {made.tls.server_key}   "
              f"(SAN: {', '.join(dict.fromkeys([*args.host, '127.0.0.1', 'localhost']))})")
        for name in args.operator or ["operator"]:
            print(f"Operator {name}: {args.out_dir / (name + '.pem')} {args.out_dir / (name + '.key')} "
                  "(client certificate for the Control API behind the fence; to the operator only)")
        for name, (private, public) in made.supernode_keys.items():
            print(f"SuperNode {name}: private {private} (to that SuperNode only), public {public} (flwr supernode register)")
        return 0

    if args.command == "fence-config":
        certs = TlsFiles.in_dir(args.certs.expanduser().resolve())
        missing = [str(p) for p in (certs.ca_cert, certs.server_cert, certs.server_key) if not p.is_file()]
        if missing:
            print(f"[deploy] fence-config: not found: {', '.join(missing)}", file=sys.stderr)
            return 2
        print(server_block(
            listen=args.listen, superlink_port=args.superlink_port, server_cert=certs.server_cert,
            server_key=certs.server_key, ca_cert=certs.ca_cert,
        ), end="")
        return 0

    if args.command == "operator-link":
        try:
            serve_operator_link(args.superlink, args.ca, args.cert, args.key, args.listen)
        except FenceError as err:
            print(f"[deploy] {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 0
        return 0

    if args.insecure and (args.tls or args.auth):
        parser.error("--insecure contradicts --tls/--auth")
    nodes = len(args.node_data) if args.node_data else args.nodes
    if nodes < 1:
        parser.error("--nodes must be >= 1")
    if args.node_data and args.node_dataset == "folder" and not args.classes:
        parser.error("--node-data with folder data needs --classes 'name0,name1,...' (fixes the label ids)")
    if args.node_config and args.test_fraction is not None:
        parser.error("--test-fraction does not apply to raw --node-config strings: put test-fraction=F in each")
    fence = not (args.insecure or args.no_fence)
    # node_data loads torch (seconds); imported here so that `operator-link`, `certs` and
    # `fence-config` run on an operator's machine with Flower alone
    from .node_data import parse_node_config

    try:  # a bad value costs nothing: checked before any process starts
        port_range = parse_port_range(args.port_range)
        configs = node_configs(nodes, args.node_data, args.node_dataset, args.classes, args.node_config,
                               test_fraction=args.test_fraction)
        run_config = parse_config_string(args.run_config)
        check_run_config(run_config, data=False, app_dir=args.app)
        for config in configs:
            parse_node_config(config)
        if fence:
            require_nginx()
    except (ValueError, ClickException, FenceError) as err:
        print(f"[deploy] nothing started: {getattr(err, 'message', err)}", file=sys.stderr)
        return 2
    if warning := evaluation_warning(run_config, configs, app_dir=args.app):
        print(f"[deploy] WARNING: {warning}", file=sys.stderr)
    try:
        outcome, run_dir, _ = run_local(
            nodes, secure=not args.insecure, auth=not (args.insecure or args.no_auth), fence=fence,
            run_config=run_config, configs=configs,
            workdir=args.workdir, app_dir=args.app, timeout=args.timeout,
            env_extra={"FLWR_LOG_LEVEL": "DEBUG"} if args.debug_logs else None,
            port_range=port_range,
        )
    except KeyboardInterrupt:
        print("[deploy] interrupted", file=sys.stderr)
        return 130
    except _Terminated as sig:
        print(f"[deploy] terminated by signal {sig.args[0]}", file=sys.stderr)
        return 128 + int(sig.args[0])
    except Exception as err:  # noqa: BLE001 - reported, processes already stopped
        print(f"[deploy] failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    _report(outcome, run_dir)
    if warning:
        print(f"[deploy] WARNING: {warning}", file=sys.stderr)
    return 0 if outcome.completed else 1


if __name__ == "__main__":
    sys.exit(main())
