"""Start, use and stop Flower processes we own (by PID): SuperLink, SuperNodes, `flwr run`.

`flwr run` with the default `local` connection starts a detached SuperLink that outlives
the command and keeps the environment it was started with. Tests, sweeps and benchmarks
instead start their own SuperLink in a private ``FLWR_HOME`` on free ports, submit runs to
it, read the run's final status with ``flwr list`` (``flwr run`` exits 0 even when the run
failed) and stop every process they started, whole process groups included.

Deployment mode (no ``--simulation``): :meth:`LocalSuperLink.start_supernode` starts real
``flower-supernode`` processes on 127.0.0.1 (each with its own Runtime API port, its own
``FLWR_HOME`` and its own ``--node-config``), optionally over TLS (``TlsFiles``) and with
SuperNode authentication (keys registered with :meth:`LocalSuperLink.register_supernode`,
i.e. ``flwr supernode register``), optionally behind the nginx fence
(:func:`fedvls_flwr.deploy.fence.start_fence`). Every port comes from an
optional ``port_range``. :mod:`fedvls_flwr.deploy.local` is the one-machine deployment built on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedvls_flwr.ops.flower_cli import (
    BIN_DIR,
    RUN_ID,
    SUPEREXEC_POLL_ENV,
    SUPEREXEC_POLL_SECONDS,
    RunOutcome,
    TlsFiles,
    flower_env,
    last_json,
    node_config_arg,
    run_config_arg,
)
from fedvls_flwr.ops.processes import (
    die_with_parent,
    free_port,
    stop_process,
    wait_for_port,
)

PROJECT_DIR = Path(__file__).resolve().parents[2]



@dataclass
class LocalSuperLink:
    """A SuperLink on 127.0.0.1 in a private FLWR_HOME; a context manager that stops it.

    Flower 1.41 serves the Fleet, Control and Runtime APIs over HTTP on one port.
    :func:`fedvls_flwr.deploy.fence.start_fence` puts nginx in front of it (see :mod:`fedvls_flwr.deploy.fence`): SuperNodes
    then dial the fence, and this object's ``flwr`` commands go through the operator link
    with the operator's client certificate, as an operator's would.

    ``port_range``: every port this object opens (SuperLink, SuperNodes' Runtime APIs,
    fence, operator link) comes from this inclusive range.
    """

    home: Path
    simulation: bool = True
    extra_args: list[str] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = 0
    port_range: tuple[int, int] | None = None
    connection: str = "fedvls"
    processes: list[subprocess.Popen] = field(default_factory=list)
    started_pids: list[int] = field(default_factory=list)  # every PID ever spawned here
    tls: TlsFiles | None = field(default=None, init=False)
    insecure: bool = field(default=True, init=False)
    fence_port: int | None = field(default=None, init=False)      # what SuperNodes dial when fenced
    control_port: int | None = field(default=None, init=False)    # the operator link, when fenced
    ports: set[int] = field(default_factory=set, init=False)      # handed out by new_port()

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or self.new_port()
        self.ports.add(self.port)
        self.env = flower_env(self.home, **self.env_extra)
        self._reaper_stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def new_port(self) -> int:
        """A free port (from ``port_range`` when set) not handed out before by this object."""
        port = free_port(self.port_range, self.ports)
        self.ports.add(port)
        return port

    # ---- lifecycle ------------------------------------------------------------
    def start(
        self, insecure: bool = True, timeout: float = 60.0, *,
        tls: TlsFiles | None = None, supernode_auth: bool = False,
    ) -> LocalSuperLink:
        """Start the SuperLink; ``tls`` serves every API over TLS (``insecure`` is then
        ignored), ``supernode_auth`` only admits SuperNodes whose public key was registered."""
        if tls is not None:
            insecure = False
        elif not insecure:
            raise ValueError("insecure=False needs tls=TlsFiles(...) (see fedvls deploy certs)")
        self.tls = tls
        self.insecure = insecure
        cmd = [
            str(BIN_DIR / "flower-superlink"),
            "--isolation", "subprocess",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.home / "state.db"),
            "--disable-runtime-dependency-installation",
            *self.extra_args,
        ]
        if tls is None:
            cmd.append("--insecure")
        else:
            cmd += [
                "--ssl-ca-certfile", str(tls.ca_cert),
                "--ssl-certfile", str(tls.server_cert),
                "--ssl-keyfile", str(tls.server_key),
            ]
        if supernode_auth:
            cmd.append("--enable-supernode-auth")
        if self.simulation:
            cmd.append("--simulation")
        log = self.home / "superlink.log"
        proc = self.spawn(cmd, log)
        try:
            wait_for_port(self.port, timeout, proc, log)
        except BaseException:
            self.stop()
            raise
        self.write_connection(insecure=insecure, root_certificates=None if tls is None else tls.ca_cert)
        return self

    def spawn(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` in its own process group (so its children can be stopped too)."""
        handle = open(log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        preexec = die_with_parent if sys.platform.startswith("linux") else None
        try:
            proc = subprocess.Popen(
                cmd, env=env or self.env, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=preexec,
            )
        finally:
            handle.close()
        self.processes.append(proc)
        self.started_pids.append(proc.pid)
        self._start_reaper()
        return proc

    def _start_reaper(self) -> None:
        """Reap children that exit while we run (e.g. a SuperNode killed by an operator).

        Flower's SuperExec and flwr-clientapp watch their parent with ``os.kill(pid, 0)``,
        which succeeds for a zombie: an unreaped dead SuperNode would keep its SuperExec
        and a running ClientApp alive (docs/deployment.md, "A SuperNode killed").
        """
        if self._reaper is not None and self._reaper.is_alive():
            return
        self._reaper_stop.clear()

        def reap() -> None:
            while not self._reaper_stop.wait(0.5):
                for proc in list(self.processes):
                    proc.poll()

        self._reaper = threading.Thread(target=reap, name="fedvls-reaper", daemon=True)
        self._reaper.start()

    def write_connection(
        self, insecure: bool = True, root_certificates: Path | None = None, port: int | None = None,
    ) -> None:
        lines = [
            "[superlink]", f'default = "{self.connection}"', "",
            f"[superlink.{self.connection}]", f'address = "127.0.0.1:{port or self.port}"',
        ]
        if insecure:
            lines.append("insecure = true")
        if root_certificates is not None:
            lines.append(f'root-certificates = "{root_certificates}"')
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def fleet_address(self) -> str:
        """What SuperNodes dial: the fence when there is one, else the SuperLink itself."""
        return f"127.0.0.1:{self.fence_port or self.port}"

    def start_supernode(
        self,
        name: str,
        node_config: dict[str, Any] | None = None,
        *,
        private_key: Path | None = None,
        port: int = 0,
        max_retries: int | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        """Start a ``flower-supernode`` connected to this SuperLink (deployment mode).

        Each SuperNode gets its own Runtime API port (``--port``; the ClientApp processes
        it starts talk to it there), its own ``FLWR_HOME`` (``<home>/<name>``, where Flower
        unpacks the app) and its log at ``<home>/<name>.log``. It dials the fence when there
        is one (:meth:`start_fence`), else the SuperLink. TLS follows the SuperLink:
        ``--root-certificates <CA>`` when it serves TLS, ``--insecure`` otherwise.
        ``private_key``: an OpenSSH EC private key for SuperNode authentication.
        """
        cmd, env = self.supernode_command(
            name, node_config, private_key=private_key, port=port, max_retries=max_retries, env_extra=env_extra,
        )
        return self.spawn(cmd, self.home / f"{name}.log", env=env)

    def supernode_command(
        self,
        name: str,
        node_config: dict[str, Any] | None = None,
        *,
        private_key: Path | None = None,
        port: int = 0,
        max_retries: int | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment :meth:`start_supernode` uses."""
        node_home = self.home / name
        node_home.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(BIN_DIR / "flower-supernode"),
            "--superlink", self.fleet_address,
            "--host", "127.0.0.1", "--port", str(port or self.new_port()),
        ]
        if node_config:
            cmd += ["--node-config", node_config_arg(node_config)]
        if self.tls is not None:
            cmd += ["--root-certificates", str(self.tls.ca_cert)]
        else:
            cmd.append("--insecure")
        if private_key is not None:
            cmd += ["--auth-supernode-private-key", str(private_key)]
        if max_retries is not None:
            cmd += ["--max-retries", str(max_retries)]
        env = flower_env(node_home, **{**self.env_extra, **(env_extra or {})})
        env.setdefault(SUPEREXEC_POLL_ENV, SUPEREXEC_POLL_SECONDS)  # unless the caller set it
        return cmd, env

    def register_supernode(self, public_key: Path, name: str | None = None) -> int:
        """``flwr supernode register``: admit the holder of ``public_key``; returns its node id."""
        args = ["supernode", "register", str(public_key), self.connection, "--format", "json"]
        if name:
            args += ["--name", name]
        res = self.flwr(*args)
        try:
            return int(last_json(res.stdout)["node-id"])
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(
                f"flwr supernode register {public_key} failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}"
            ) from None

    def supernodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list`` as a list of dicts (node id, status, ...)."""
        res = self.flwr("supernode", "list", self.connection, "--format", "json")
        try:
            payload = last_json(res.stdout)
        except ValueError:
            raise RuntimeError(f"flwr supernode list failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}") from None
        return list(payload.get("nodes", []))

    def stop(self) -> None:
        self._reaper_stop.set()
        for proc in reversed(self.processes):
            stop_process(proc)
        self.processes.clear()

    def alive(self) -> list[int]:
        """PIDs of started processes that are still running."""
        return [p.pid for p in self.processes if p.poll() is None]

    def __enter__(self) -> LocalSuperLink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- runs ----------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN_DIR / "flwr"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def submit(
        self, app_dir: Path = PROJECT_DIR, run_config: dict[str, Any] | None = None,
        federation_config: dict[str, Any] | None = None,
    ) -> int:
        args = ["run", str(app_dir), self.connection, "--format", "json"]
        if run_config:
            args += ["--run-config", run_config_arg(run_config)]
        if federation_config:
            args += ["--federation-config", run_config_arg(federation_config)]
        res = self.flwr(*args)
        try:
            payload = json.loads(res.stdout)
            return int(payload["run-id"])
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"flwr run failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}") from None

    def run_streaming(
        self, app_dir: Path = PROJECT_DIR, run_config: dict[str, Any] | str | None = None,
        log: Path | None = None, timeout: float = 3600.0, echo: bool = True,
    ) -> RunOutcome:
        """``flwr run <app> <connection> --stream``: blocks while the run streams its logs
        (to ``log`` and, with ``echo``, to this process's stdout), then reads the run's final
        status with ``flwr list`` (``flwr run`` exits 0 even when the run failed)."""
        args = [str(BIN_DIR / "flwr"), "run", str(app_dir), self.connection, "--stream"]
        if run_config:
            args += ["--run-config", run_config if isinstance(run_config, str) else run_config_arg(run_config)]
        log = log or self.home / "flwr-run.log"
        t0 = time.monotonic()
        proc = self.spawn(args, log)
        run_id = None
        with open(log, "rb") as reader:
            while True:
                chunk = reader.read()
                if chunk:
                    text = chunk.decode(errors="replace")
                    if echo:
                        sys.stdout.write(text)
                        sys.stdout.flush()
                    if run_id is None and (m := RUN_ID.search(log.read_text(errors="replace"))):
                        run_id = int(m.group(1))
                    continue
                if proc.poll() is not None:
                    break
                if time.monotonic() - t0 > timeout:
                    if run_id is not None:
                        self.flwr("stop", str(run_id), self.connection)
                    stop_process(proc)
                    break
                time.sleep(0.2)
        self.processes.remove(proc)
        stop_process(proc)
        if run_id is None:
            raise RuntimeError(f"flwr run did not start a run (exit {proc.returncode}):\n{log.read_text()[-4000:]}")
        # The stream ends when the run finishes; the status can lag a moment behind.
        outcome = self.wait(run_id, timeout=60.0, poll=0.5, read_log=False)  # the streamed log is the run's
        outcome.seconds = time.monotonic() - t0
        outcome.log = log.read_text(errors="replace")
        return outcome

    def status(self, run_id: int) -> str:
        res = self.flwr("list", "--run-id", str(run_id), "--format", "json")
        payload = json.loads(res.stdout)
        runs = payload.get("runs", [])
        return runs[0]["status"] if runs else "unknown"

    def wait(self, run_id: int, timeout: float = 600.0, poll: float = 1.0, read_log: bool = True) -> RunOutcome:
        t0 = time.monotonic()
        while True:
            status = self.status(run_id)
            if status.startswith("finished"):
                return RunOutcome(run_id, status, time.monotonic() - t0, self.settled_logs(run_id) if read_log else "")
            if time.monotonic() - t0 > timeout:
                self.flwr("stop", str(run_id), self.connection)
                return RunOutcome(run_id, f"timeout:{status}", time.monotonic() - t0, self.logs(run_id))
            time.sleep(poll)

    def logs(self, run_id: int) -> str:
        return "".join(self._read_log(run_id))

    def _read_log(self, run_id: int) -> tuple[str, str]:
        """(the run's log, what the ``flwr`` command itself said: with FLWR_LOG_LEVEL=DEBUG,
        timestamped lines of its own on every call)."""
        res = self.flwr("log", str(run_id), self.connection, "--show", timeout=60)
        return res.stdout, res.stderr

    def settled_logs(self, run_id: int, pause: float = 0.5, tries: int = 4) -> str:
        """A finished run's whole log: Flower reports a run finished after waiting at most a
        second for its last log upload, so on a busy SuperLink the last lines (the last round, a
        refusal at start-up) may come later; read until two reads of the run's log agree."""
        run_log, said = self._read_log(run_id)
        for _ in range(tries):
            time.sleep(pause)
            again, said = self._read_log(run_id)
            if again == run_log:
                break
            run_log = again
        return run_log + said
