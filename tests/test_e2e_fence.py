"""The fence in front of the SuperLink, end to end on 127.0.0.1 (nginx, real SuperLink and
SuperNodes, TLS and SuperNode authentication).

Flower 1.41's Control API has no authentication: anyone who reaches the SuperLink's port
with the (public) CA certificate can register nodes, list runs and start runs. Behind the
fence, a SuperNode host's credentials (the CA certificate and its own SuperNode key) get
none of that - `flwr supernode register`, `flwr list` and `flwr run` all fail and leave no
trace in the SuperLink - while the operator, through the operator link with its client
certificate, registers the real nodes and runs a whole multi-round run, its SuperNodes
connecting through the fence. The second test is the launcher's default path with
node-local folders and federated evaluation (exit status 0).
"""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from fedvls_flwr.app.results import read_rounds
from fedvls_flwr.deploy import cli as deploy
from fedvls_flwr.deploy.certs import make_certificates
from fedvls_flwr.deploy.fence import start_fence
from fedvls_flwr.ops.flower_cli import BIN_DIR, flower_env
from fedvls_flwr.ops.launch import LocalSuperLink
from tests.processes import leftovers
from tests.runs import check_results, deployment_run_config
from tests.tiny_data import DIGITS, write_digit_folder

pytestmark = pytest.mark.e2e

REFUSED = "no valid operator client certificate"


def site_home(root: Path, fence_address: str, ca_cert: Path) -> Path:
    """What a SuperNode host has: the CA certificate, a connection to the fence's address."""
    root.mkdir(parents=True)
    (root / "config.toml").write_text(
        f'[superlink]\ndefault = "lab"\n\n[superlink.lab]\naddress = "{fence_address}"\n'
        f'root-certificates = "{ca_cert}"\n'
    )
    return root


def tls_context(ca_cert: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def site_flwr(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN_DIR / "flwr"), *args], env=flower_env(home), capture_output=True, text=True,
                          timeout=180)


def test_site_credentials_cannot_use_the_control_api_the_operator_can(tmp_path, nginx, node_env):
    certs = make_certificates(tmp_path / "certs", ["127.0.0.1"], ["a", "b", "rogue", "intruder"])
    link = LocalSuperLink(tmp_path / "flwr", simulation=False, env_extra=node_env)
    try:
        link.start(tls=certs.tls, supernode_auth=True)
        start_fence(link, certs.operator_cert, certs.operator_key)
        fence = f"127.0.0.1:{link.fence_port}"
        site = site_home(tmp_path / "site", fence, certs.tls.ca_cert)

        # A SuperNode host: the CA certificate (public) and its own SuperNode key.
        attempts = {
            "register": site_flwr(site, "supernode", "register", str(certs.supernode_keys["rogue"][1]), "lab"),
            "list": site_flwr(site, "list", "lab"),
            "list --format json": site_flwr(site, "list", "lab", "--format", "json"),
            "supernode list": site_flwr(site, "supernode", "list", "lab"),
            "run": site_flwr(site, "run", str(Path(__file__).resolve().parents[1]), "lab"),
        }
        for what, res in attempts.items():
            # `--format json` exits 0 even for an error and says "success": false instead.
            failed = res.returncode != 0 or json.loads(res.stdout).get("success") is False
            assert failed, f"site `flwr {what}` succeeded:\n{res.stdout}\n{res.stderr}"
            assert REFUSED in res.stdout + res.stderr, f"`flwr {what}`:\n{res.stdout}\n{res.stderr}"

        # Below the CLI: the Runtime API and the docs are not served at all, and neither a
        # certificate from another CA nor the SuperLink's own serverAuth certificate opens
        # the Control API.
        other = make_certificates(tmp_path / "other-ca", ["127.0.0.1"])
        with httpx.Client(verify=tls_context(certs.tls.ca_cert)) as plain:
            assert plain.post(f"https://{fence}/v1/runtime/acquire-task").status_code == 403
            assert plain.get(f"https://{fence}/docs").status_code == 403
            assert plain.post(f"https://{fence}/v1/control/list-runs").status_code == 403
        for cert, key in ((other.operator_cert, other.operator_key), (certs.tls.server_cert, certs.tls.server_key)):
            with httpx.Client(verify=tls_context(certs.tls.ca_cert, cert, key)) as client:
                assert client.post(f"https://{fence}/v1/control/list-runs").status_code in (400, 403), cert

        # The operator, through the operator link with its client certificate.
        registered = {name: link.register_supernode(certs.supernode_keys[name][1], name=name) for name in ("a", "b")}
        # An unregistered key is refused through the fence too, and the SuperNode exits 1.
        intruder = link.start_supernode("intruder", {"partition-id": 0, "num-partitions": 2},
                                        private_key=certs.supernode_keys["intruder"][0], max_retries=1)
        assert intruder.wait(timeout=180) == 1
        for i, name in enumerate(("a", "b")):
            link.start_supernode(name, {"partition-id": i, "num-partitions": 2},
                                 private_key=certs.supernode_keys[name][0])
        outcome = link.run_streaming(run_config=deployment_run_config(tmp_path / "runs", 2), timeout=900, echo=False)
        nodes = {int(n["node-id"]) for n in link.supernodes()}
        runs = json.loads(link.flwr("list", "--format", "json").stdout)["runs"]
    finally:
        link.stop()
    assert outcome.completed, f"run ended {outcome.status}\n{outcome.log[-4000:]}"
    assert nodes == set(registered.values())            # the site registered nothing
    assert [int(r["run-id"]) for r in runs] == [outcome.run_id]  # and started nothing
    check_results(tmp_path / "runs" / "e2e", accepted=2)
    assert leftovers(link.started_pids, tmp_path) == []
    # The fence's access log records who asked for what.
    access = (link.home / "fence" / "access.log").read_text().splitlines()
    refused = [line for line in access if "/v1/control/" in line and '" 403 ' in line]
    assert any("register-node" in line for line in refused) and any("start-run" in line for line in refused)
    assert any("/v1/fleet/pull-messages" in line and '" 200 ' in line for line in access)
    assert any('client_cert=SUCCESS "CN=operator"' in line and "start-run" in line for line in access)


def test_launcher_default_fence_node_local_data_federated_evaluation(tmp_path, nginx, node_env, capsys, monkeypatch):
    monkeypatch.setenv("FEDVLS_CACHE_DIR", node_env["FEDVLS_CACHE_DIR"])
    write_digit_folder(tmp_path / "site-a", [0, 1, 2, 3, 4, 5])
    write_digit_folder(tmp_path / "site-b", [4, 5, 6, 7, 8, 9])
    work = tmp_path / "work"
    code = deploy.main([
        "local", "--node-data", str(tmp_path / "site-a"), str(tmp_path / "site-b"), "--classes", DIGITS,
        "--test-fraction", "0.2", "--workdir", str(work), "--timeout", "900",
        "--run-config", "num-server-rounds=2 local-epochs=1 evaluation='federated' round-timeout=300.0",
    ])
    out = capsys.readouterr()
    assert code == 0, out.out[-4000:] + out.err[-2000:]
    assert "fence (nginx) on 127.0.0.1:" in out.out
    assert "WARNING" not in out.err  # every node holds a test split
    assert "finished:completed" in out.out
    rounds = read_rounds(work / "runs" / "deploy")
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds:
        assert r["evaluation"] == "federated" and r["eval_nodes"] == 2 and r["eval_examples"] == 60
        assert 0.0 <= r["accuracy"] <= 1.0
    assert f"round 2: accuracy {rounds[2]['accuracy']:.4f}, clients 2/2" in out.out
    # The SuperNodes reached the SuperLink through the fence.
    access = (work / "flwr" / "fence" / "access.log").read_text()
    assert "/v1/fleet/push-messages" in access and 'client_cert=SUCCESS "CN=operator"' in access
