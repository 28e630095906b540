"""A whole deployment on one machine (``fedvls deploy local``): SuperLink, fence, SuperNodes,
one streamed run, its report, and every process stopped afterwards."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from fedvls_flwr.config.args import parse_run_config_args
from fedvls_flwr.deploy.certs import make_certificates
from fedvls_flwr.deploy.fence import require_nginx, start_fence
from fedvls_flwr.experiments.check import check_run_config
from fedvls_flwr.ops.flower_cli import RunOutcome
from fedvls_flwr.ops.launch import PROJECT_DIR, LocalSuperLink


class Terminated(BaseException):
    """SIGTERM/SIGHUP received: unwind (and stop everything) like Ctrl-C does."""


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


def parse_config_string(text: str | None, option: str = "--run-config") -> dict[str, Any]:
    """``"k1=v1 k2='s'"`` (the ``--run-config``/``--node-config`` syntax) -> dict.

    Strict: an item Flower's parser would silently drop (``lr=``, a bare ``lr``) is a
    ConfigError naming it (fedvls_flwr.config.args).
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
    operator link with the operator's client certificate (:mod:`fedvls_flwr.deploy.fence`).
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
    made = workdir is None
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
    if made:  # kept afterwards, whatever happens next: said before anything can fail
        holds = "certificates, logs and results" if run_dir.resolve().is_relative_to(workdir) else "certificates and logs"
        say(f"[deploy] work folder {workdir} ({holds}; kept afterwards)")
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
            assert certs is not None and certs.operator_cert and certs.operator_key  # fence implies secure (above)
            start_fence(link, certs.operator_cert, certs.operator_key)
            say(f"[deploy] fence (nginx) on {link.fleet_address}: Fleet API for SuperNodes, Control API only "
                f"with the operator certificate; operator link on 127.0.0.1:{link.control_port}; "
                f"logs in {link.home / 'fence'}")
        for name, config in zip(names, configs):
            key = None
            if auth and certs is not None:
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


def report(outcome: RunOutcome, run_dir: Path) -> None:
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
