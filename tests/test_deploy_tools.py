"""The deployment launcher and its tools without starting Flower: port ranges, node configs,
the start-up warning for a run that evaluates nothing, the report, `breakdown` on a folder
without logs, the fence's nginx configuration and certificates, the operator link's
start-up check, and the ClientApp's SuperNode guard."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from fedvls_flwr.app.supernode_guard import exit_with_supernode, is_gone, supernode_of_this_process
from fedvls_flwr.deploy import cli as deploy
from fedvls_flwr.deploy.breakdown import BreakdownInputError, breakdown
from fedvls_flwr.deploy.certs import make_certificates
from fedvls_flwr.deploy.fence import (
    CONTROL_PREFIX,
    FLEET_PREFIX,
    FenceError,
    check_nginx_config,
    check_operator_link,
    client_context,
    serve_operator_link,
    server_block,
    write_standalone_config,
)
from fedvls_flwr.deploy.local import evaluation_warning, node_configs
from fedvls_flwr.deploy.local import report as _report
from fedvls_flwr.ops.flower_cli import RunOutcome
from fedvls_flwr.ops.launch import LocalSuperLink
from fedvls_flwr.ops.processes import PortRangeError, free_port, parse_port_range

# ---------------------------------------------------------------------------
# ports


def _free_range(width: int = 20) -> tuple[int, int]:
    """A range of ports, different per test process (not probed: for tests that bind none)."""
    lo = 30000 + (os.getpid() % 200) * 50
    return lo, lo + width - 1


def test_port_range_parsing_says_what_is_wrong():
    assert parse_port_range("20000-20099") == (20000, 20099)
    assert parse_port_range(None) is None and parse_port_range("") is None
    for bad, message in (("20000", "expected LO-HI"), ("a-b", "expected LO-HI"), ("2000-1000", "LO <= HI"),
                         ("80-90", "1024 <= LO")):
        with pytest.raises(ValueError, match=message):
            parse_port_range(bad)


def test_ports_come_from_the_range_skip_busy_and_handed_out_ones(tmp_path):
    with closing(socket.socket()) as busy:
        busy.bind(("127.0.0.1", 0))  # the range starts at a port the system gave this socket: busy for sure
        busy.listen()
        lo = busy.getsockname()[1]
        hi = lo + 19
        first = free_port((lo, hi))
        assert lo < first <= hi  # lo is in use
        assert free_port((lo, hi), {first}) not in (lo, first)
    link = LocalSuperLink(tmp_path, simulation=False, port_range=(lo, hi))
    ports = {link.port, *(link.new_port() for _ in range(5))}
    assert len(ports) == 6 and all(lo <= p <= hi for p in ports)


def test_an_exhausted_range_says_how_to_fix_it():
    lo, _ = _free_range()
    with pytest.raises(PortRangeError, match="widen --port-range"):
        free_port((lo, lo + 1), {lo, lo + 1})


def test_bad_port_range_starts_nothing(capsys):
    assert deploy.main(["local", "--port-range", "9000"]) == 2
    assert "nothing started: --port-range '9000': expected LO-HI" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# node configs and the evaluation warning


def test_test_fraction_reaches_every_node_config(tmp_path):
    local = node_configs(2, [str(tmp_path / "a"), str(tmp_path / "b")], "folder", "x,y", None, test_fraction=0.2)
    assert [c["test-fraction"] for c in local] == [0.2, 0.2]
    parts = node_configs(3, None, "folder", None, None, test_fraction=0.1)
    assert parts == [{"partition-id": i, "num-partitions": 3, "test-fraction": 0.1} for i in range(3)]
    assert "test-fraction" not in node_configs(2, None, "folder", None, None)[0]


def test_test_fraction_with_raw_node_configs_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        deploy.main(["local", "--nodes", "1", "--node-config", "partition-id=0 num-partitions=1",
                     "--test-fraction", "0.2"])
    assert exit_.value.code == 2
    assert "put test-fraction=F in each" in capsys.readouterr().err


def test_bad_test_fraction_starts_nothing(capsys):
    assert deploy.main(["local", "--nodes", "1", "--test-fraction", "1.5", "--no-fence"]) == 2
    assert "test-fraction=1.5: must be in [0, 1)" in capsys.readouterr().err


def test_federated_evaluation_without_test_splits_is_named():
    configs = [{"partition-id": 0, "num-partitions": 2}, {"partition-id": 1, "num-partitions": 2}]
    warning = evaluation_warning({"evaluation": "federated"}, configs)
    assert warning and "evaluates nothing" in warning and "--test-fraction" in warning
    assert evaluation_warning({"evaluation": "federated"}, [{**configs[0], "test-fraction": 0.2}, configs[1]]) is None
    assert evaluation_warning({}, configs) is None  # evaluation=auto: the server evaluates


def _completed_run(tmp_path: Path, rounds: list[dict]) -> tuple[RunOutcome, Path]:
    run_dir = tmp_path / "runs" / "deploy"
    run_dir.mkdir(parents=True)
    (run_dir / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    return RunOutcome(7, "finished:completed", 12.0), run_dir


NOTHING_EVALUATED = [
    {"round": 0, "accuracy": None, "seconds": 0.0},
    {"round": 1, "accuracy": None, "clients_accepted": 2, "clients_sampled": 3, "seconds": 3.5,
     "failures": [{"node": "834", "partition_id": 2, "reason": "folder dataset not found"},
                  {"node": "91", "reason": "no reply before round-timeout"}]},
]


def test_report_of_a_run_that_evaluated_nothing_names_sites(tmp_path, capsys):
    _report(*_completed_run(tmp_path, NOTHING_EVALUATED))
    out = capsys.readouterr().out
    assert "round 1: accuracy n/a (nothing evaluated), clients 2/3, 3.50s" in out
    assert "site 2 (node 834): folder dataset not found" in out
    assert "node 91: no reply before round-timeout" in out  # no partition id: Flower's node id


def test_launcher_warns_before_the_run_and_exits_0_for_a_completed_run(tmp_path, capsys, monkeypatch):
    said_before_start = []

    def fake_run_local(nodes, **kwargs):
        said_before_start.append(capsys.readouterr().err)
        outcome, run_dir = _completed_run(tmp_path, NOTHING_EVALUATED)
        return outcome, run_dir, []

    monkeypatch.setattr(deploy, "run_local", fake_run_local)
    code = deploy.main(["local", "--nodes", "2", "--no-fence", "--run-config", "evaluation='federated'"])
    assert code == 0
    assert "WARNING: evaluation='federated' but no node holds a local test split" in said_before_start[0]
    assert "accuracy n/a" in capsys.readouterr().out


def test_breakdown_of_a_folder_without_logs_says_what_it_needs(tmp_path, capsys):
    with pytest.raises(BreakdownInputError, match="flwr-run.log"):
        breakdown(tmp_path)
    assert deploy.main(["breakdown", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--debug-logs" in err and "FLWR_LOG_LEVEL=DEBUG" in err and "node-<i>.log" in err


# ---------------------------------------------------------------------------
# the fence: certificates and nginx configuration


def test_certificates_for_the_fence(tmp_path):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    made = make_certificates(tmp_path, ["10.0.0.5"], ["site-a"])
    server = x509.load_pem_x509_certificate(made.tls.server_cert.read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5", "127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    operator = x509.load_pem_x509_certificate(made.operator_cert.read_bytes())
    assert list(operator.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert oct(made.operator_key.stat().st_mode & 0o777) == "0o600"
    # OpenSSL (as nginx uses it) accepts the operator's certificate as a TLS client and
    # refuses the SuperLink's own (serverAuth only).
    verify = subprocess.run(
        ["openssl", "verify", "-purpose", "sslclient", "-CAfile", str(made.tls.ca_cert),
         str(made.operator_cert), str(made.tls.server_cert)],
        capture_output=True, text=True,
    )
    assert f"{made.operator_cert}: OK" in verify.stdout
    assert "unsuitable certificate purpose" in verify.stderr


def _openssl_verify(ca: Path, *certs: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", "verify", "-CAfile", str(ca), *map(str, certs)], capture_output=True, text=True)


def test_certs_on_a_folder_with_a_ca_sign_with_it_and_keep_what_is_there(tmp_path, capsys):
    """A second `deploy certs` on the same folder (a new site) must not replace the CA: every
    certificate handed out before keeps verifying against ca.pem."""
    out = tmp_path / "certs"
    assert deploy.main(["certs", str(out), "--host", "127.0.0.1", "--nodes", "1"]) == 0
    before = {name: (out / name).read_bytes() for name in ("ca.pem", "ca.key", "server.pem", "operator.pem")}
    handed_out = tmp_path / "operator-copy.pem"
    handed_out.write_bytes(before["operator.pem"])
    capsys.readouterr()

    assert deploy.main(["certs", str(out), "--host", "127.0.0.1", "--node", "site-3"]) == 0
    said = capsys.readouterr().out
    assert "already holds a CA: signing with it" in said and "SuperNode site-3" in said
    assert {name: (out / name).read_bytes() for name in before} == before
    assert (out / "supernode-site-3").is_file() and (out / "supernode-site-3.pub").is_file()
    verified = _openssl_verify(out / "ca.pem", handed_out, out / "server.pem")
    assert verified.returncode == 0, verified.stderr

    # a new host: the same CA signs the server's key again, for the old and the new names
    made = make_certificates(out, ["10.0.0.9"], operators=["alice"])
    assert made.tls.server_key in made.kept and made.tls.server_cert not in made.kept
    from fedvls_flwr.deploy.certs import san_hosts

    assert {"10.0.0.9", "127.0.0.1", "localhost"} <= set(san_hosts(made.tls.server_cert))
    verified = _openssl_verify(out / "ca.pem", handed_out, out / "server.pem", out / "alice.pem")
    assert verified.returncode == 0, verified.stderr
    assert (out / "ca.key").read_bytes() == before["ca.key"]


@pytest.mark.parametrize("missing", ["ca.key", "ca.pem"])
def test_certs_refuse_half_a_ca_and_write_nothing(tmp_path, capsys, missing):
    out = tmp_path / "certs"
    make_certificates(out, ["127.0.0.1"])
    (out / missing).unlink()
    files = sorted(p.name for p in out.iterdir())
    assert deploy.main(["certs", str(out), "--host", "127.0.0.1", "--node", "site-3"]) == 2
    err = capsys.readouterr().err
    assert "nothing written" in err and f"but not {missing}" in err and "put" in err.lower()
    assert sorted(p.name for p in out.iterdir()) == files


def test_fence_routes_fleet_guards_control_and_denies_the_rest(tmp_path):
    block = server_block(listen="0.0.0.0:9093", superlink_port=9092, server_cert=tmp_path / "s.pem",
                         server_key=tmp_path / "s.key", ca_cert=tmp_path / "ca.pem")
    assert "server 127.0.0.1:9092;" in block and "listen 0.0.0.0:9093 ssl;" in block
    assert "ssl_verify_client optional;" in block
    fleet = block[block.index(f"location {FLEET_PREFIX}"):]
    assert fleet.split("}")[0].strip().endswith("proxy_pass https://fedvls_superlink_9092;")
    control = block[block.index(f"location {CONTROL_PREFIX}"):block.index("location / {")]
    assert "if ($ssl_client_verify != SUCCESS)" in control and "return 403" in control
    rest = block[block.index("location / {"):]
    assert "return 403" in rest and "proxy_pass" not in rest


def test_nginx_accepts_the_generated_configuration(tmp_path, nginx):
    made = make_certificates(tmp_path / "certs", ["127.0.0.1"])
    conf = write_standalone_config(
        tmp_path / "fence", listen="127.0.0.1:9093", superlink_port=9092, server_cert=made.tls.server_cert,
        server_key=made.tls.server_key, ca_cert=made.tls.ca_cert,
    )
    check_nginx_config(nginx, conf)
    (tmp_path / "broken.pem").write_text("not a certificate")
    broken = write_standalone_config(
        tmp_path / "broken", listen="127.0.0.1:9093", superlink_port=9092, server_cert=tmp_path / "broken.pem",
        server_key=made.tls.server_key, ca_cert=made.tls.ca_cert,
    )
    with pytest.raises(FenceError, match="nginx rejected"):
        check_nginx_config(nginx, broken)


def test_fence_config_command(tmp_path, capsys):
    make_certificates(tmp_path, ["10.0.0.5"])
    assert deploy.main(["fence-config", "--listen", "0.0.0.0:9093", "--superlink-port", "9092",
                        "--certs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"ssl_certificate {tmp_path / 'server.pem'};" in out and "location /v1/fleet/" in out
    assert deploy.main(["fence-config", "--listen", "0.0.0.0:9093", "--superlink-port", "9092",
                        "--certs", str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err


def _server_cert_by_openssl(folder: Path, san: str) -> None:
    """ca.pem, server.pem and server.key made with openssl as docs/deployment.md section 3
    says, with ``san`` as the server certificate's subjectAltName."""
    folder.mkdir(parents=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
    openssl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=fedvls-flwr CA",
            "-out", "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "server.key")
    openssl("req", "-new", "-key", "server.key", "-subj", "/CN=10.0.0.5", "-out", "server.csr")
    (folder / "server.ext").write_text(f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
                                       "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-sha256", "-extfile", "server.ext", "-out", "server.pem")


def test_fence_config_refuses_a_server_certificate_without_the_loopback_names(tmp_path, capsys, monkeypatch):
    """Without IP:127.0.0.1 and DNS:localhost the SuperExec dies at start and nginx answers
    502 to everything; fence-config names the missing entries and the fix instead."""
    monkeypatch.setattr(deploy, "DEBIAN_DEFAULT_SITE", tmp_path / "no-default-site")
    args = ["fence-config", "--listen", "0.0.0.0:9093", "--superlink-port", "9092", "--certs"]
    _server_cert_by_openssl(tmp_path / "public-only", "IP:10.0.0.5,DNS:superlink.lab.example")
    assert deploy.main([*args, str(tmp_path / "public-only")]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # nothing for `| sudo tee` to write
    assert "does not list IP:127.0.0.1 and DNS:localhost in its subjectAltName" in out.err
    assert "502 Bad Gateway" in out.err and "IP:127.0.0.1,DNS:localhost" in out.err
    _server_cert_by_openssl(tmp_path / "no-localhost", "IP:10.0.0.5,IP:127.0.0.1")
    assert deploy.main([*args, str(tmp_path / "no-localhost")]) == 2
    assert "does not list DNS:localhost in" in capsys.readouterr().err
    _server_cert_by_openssl(tmp_path / "as-documented", "IP:10.0.0.5,DNS:superlink.lab.example,IP:127.0.0.1,DNS:localhost")
    assert deploy.main([*args, str(tmp_path / "as-documented")]) == 0
    out = capsys.readouterr()
    assert "location /v1/fleet/" in out.out and out.err == ""


def test_fence_config_warns_of_debians_default_site(tmp_path, capsys, monkeypatch):
    """Debian's nginx enables a default site on :80 of every interface: a second open port."""
    make_certificates(tmp_path / "certs", ["10.0.0.5"])
    default = tmp_path / "sites-enabled" / "default"
    default.parent.mkdir()
    default.write_text("server { listen 80 default_server; }\n")
    monkeypatch.setattr(deploy, "DEBIAN_DEFAULT_SITE", default)
    args = ["fence-config", "--listen", "0.0.0.0:9093", "--superlink-port", "9092", "--certs", str(tmp_path / "certs")]
    assert deploy.main(args) == 0
    out = capsys.readouterr()
    assert "location /v1/fleet/" in out.out
    assert f"nginx's default site {default} is enabled" in out.err and f"sudo rm {default}" in out.err
    default.unlink()
    assert deploy.main(args) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------
# the operator link: fails at start-up, with the reason, instead of on every flwr command


def _tls_server(cert: Path, key: Path) -> tuple[int, threading.Event]:
    """A one-connection-at-a-time TLS server on 127.0.0.1 (handshake only)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.2)
    done = threading.Event()

    def serve():
        with sock:
            while not done.is_set():
                try:
                    conn, _ = sock.accept()
                except OSError:
                    continue
                try:
                    with ctx.wrap_socket(conn, server_side=True):
                        pass
                except (OSError, ssl.SSLError):
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1], done


def test_operator_link_checks_the_fence_at_start_up(tmp_path):
    ours = make_certificates(tmp_path / "ours", ["127.0.0.1"])
    other = make_certificates(tmp_path / "other", ["127.0.0.1"])
    port, done = _tls_server(ours.tls.server_cert, ours.tls.server_key)
    try:
        check_operator_link("127.0.0.1", port, client_context(ours.tls.ca_cert, ours.operator_cert, ours.operator_key))
        wrong_ca = client_context(other.tls.ca_cert, ours.operator_cert, ours.operator_key)
        with pytest.raises(FenceError, match="does not verify against the CA"):
            check_operator_link("127.0.0.1", port, wrong_ca)
    finally:
        done.set()
    with pytest.raises(FenceError, match="cannot reach the fence"):
        check_operator_link("127.0.0.1", free_port(), client_context(ours.tls.ca_cert, ours.operator_cert,
                                                                      ours.operator_key))
    with pytest.raises(FenceError, match="do not form a certificate"):
        client_context(ours.tls.ca_cert, ours.operator_cert, other.operator_key)
    with pytest.raises(FenceError, match="not found"):
        client_context(ours.tls.ca_cert, tmp_path / "missing.pem", ours.operator_key)


def test_operator_link_names_a_bad_ca_a_server_certificate_and_a_taken_port(tmp_path):
    ours = make_certificates(tmp_path / "ours", ["127.0.0.1"])
    not_a_cert = tmp_path / "ca.pem"
    not_a_cert.write_text("this is not a certificate\n")
    with pytest.raises(FenceError, match="holds no PEM certificate"):
        client_context(not_a_cert, ours.operator_cert, ours.operator_key)
    # the SuperLink's own certificate: nginx would answer 400 to every request it makes
    with pytest.raises(FenceError, match="not a client certificate.*serverAuth"):
        client_context(ours.tls.ca_cert, ours.tls.server_cert, ours.tls.server_key)
    port, done = _tls_server(ours.tls.server_cert, ours.tls.server_key)
    try:
        with closing(socket.socket()) as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            listen = f"127.0.0.1:{taken.getsockname()[1]}"
            with pytest.raises(FenceError, match="cannot listen on .*another --listen port"):
                serve_operator_link(f"127.0.0.1:{port}", ours.tls.ca_cert, ours.operator_cert,
                                    ours.operator_key, listen, log=lambda *a, **k: None)
    finally:
        done.set()


def test_the_operators_tools_do_not_load_torch():
    """The operator's machine needs Flower and a checkout, not PyTorch (docs/deployment.md)."""
    code = "import sys, fedvls_flwr.deploy.cli; print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------
# the ClientApp's SuperNode guard


def test_guard_is_inert_outside_a_supernode_tree():
    assert supernode_of_this_process() is None
    assert exit_with_supernode() is False


def test_a_zombie_counts_as_gone_although_kill_0_succeeds():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not is_gone(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not is_gone(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_gone(child.pid)   # a zombie: dead, not yet reaped
        os.kill(child.pid, 0)       # what Flower 1.41's parent watch relies on: no error
    finally:
        child.wait()
    assert is_gone(child.pid)


def test_sweep_takes_a_port_range_and_checks_it(capsys):
    from fedvls_flwr.experiments import sweep

    assert sweep.main(["conf/fedlc-synthetic.yaml", "--port-range", "20000:20010", "--dry-run"]) == 2
    assert "--port-range '20000:20010': expected LO-HI" in capsys.readouterr().err
    assert sweep.main(["conf/fedlc-synthetic.yaml", "--port-range", "20000-20010", "--dry-run"]) == 0


def test_supernodes_poll_for_tasks_every_tenth_of_a_second_unless_told(tmp_path, monkeypatch):
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    link = LocalSuperLink(tmp_path, simulation=False)
    _, env = link.supernode_command("a", {"partition-id": 0, "num-partitions": 1})
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.1"
    _, env = link.supernode_command("b", env_extra={"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "1.0"})
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "1.0"
    cmd, _ = link.supernode_command("c")
    assert cmd[cmd.index("--superlink") + 1] == link.address  # no fence: the SuperLink itself


def test_deploy_local_help_says_what_nodes_are_and_a_bad_timeout_starts_nothing(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        deploy.main(["local", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--nodes N SuperNodes to start, each training on partition i" in help_text
    assert "stop the run after this many seconds (default: 3600)" in help_text
    monkeypatch.setattr(LocalSuperLink, "start", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(SystemExit) as exited:
        deploy.main(["local", "--insecure", "--timeout", "-5"])
    assert exited.value.code == 2 and "argument --timeout: -5: give a number of seconds > 0" in capsys.readouterr().err


def test_a_finished_runs_log_is_read_until_its_last_lines_have_come(tmp_path, monkeypatch):
    """Flower says a run finished after waiting at most a second for its last log upload: the
    outcome's log is read again until two reads agree, so a late last line is not lost."""
    link = LocalSuperLink(tmp_path, simulation=False)
    uploads = iter(["round 1\n", "round 1\nround 2\n", "round 1\nround 2\nround 3/3: accuracy 0.9\n"])
    seen: list[str] = []

    def read_log(run_id: int) -> tuple[str, str]:
        seen.append(next(uploads, seen[-1] if seen else ""))
        return seen[-1], f"{len(seen)}: the flwr command's own DEBUG line\n"  # different on every call

    monkeypatch.setattr(link, "status", lambda run_id: "finished:completed")
    monkeypatch.setattr(link, "_read_log", read_log)
    monkeypatch.setattr(link, "settled_logs", functools.partial(link.settled_logs, pause=0.0))
    outcome = link.wait(7)
    assert outcome.completed and "round 3/3: accuracy 0.9\n" in outcome.log
    assert len(seen) == 4  # three reads that grew, one that agreed (the command's own lines aside)


def test_the_launcher_names_its_default_work_folder_before_anything_can_fail(tmp_path, monkeypatch, capsys):
    """The default work folder is kept (certificates, logs, results): a launch that fails at once
    (here: no free port in --port-range) still says where it is, not a folder in /tmp nobody was told of."""
    import tempfile

    from fedvls_flwr.deploy.local import run_local

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with closing(socket.socket()) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortRangeError):
            run_local(1, secure=False, auth=False, port_range=(port, port))
        made = list(tmp_path.iterdir())
        assert [p.name[:len("fedvls-deploy-")] for p in made] == ["fedvls-deploy-"]
        assert f"work folder {made[0].resolve()} (certificates, logs and results;" in capsys.readouterr().out
        # results sent elsewhere: the line does not promise them there
        with pytest.raises(PortRangeError):
            run_local(1, secure=False, auth=False, port_range=(port, port),
                      run_config={"output-dir": str(tmp_path / "elsewhere")})
        assert "(certificates and logs; kept afterwards)" in capsys.readouterr().out
