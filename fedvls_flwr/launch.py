"""Start, use and stop Flower processes we own (by PID): SuperLink, SuperNodes, `flwr run`.

`flwr run` with the default `local` connection starts a detached SuperLink that outlives
the command and keeps the environment it was started with. Tests, sweeps and benchmarks
instead start their own SuperLink in a private ``FLWR_HOME`` on free ports, submit runs to
it, read the run's final status with ``flwr ls`` (``flwr run`` exits 0 even when the run
failed) and stop every process they started, whole process groups included.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN_DIR = Path(sys.executable).parent
PROJECT_DIR = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_env(flwr_home: Path, **extra: str) -> dict[str, str]:
    """Environment for every Flower process: private home, offline, quiet."""
    env = os.environ.copy()
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        RAY_DEDUP_LOGS="0",
        RAY_TMPDIR=env.get("RAY_TMPDIR", "/tmp"),
        PYTHONUNBUFFERED="1",
    )
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    return repr(value)


def run_config_arg(overrides: dict[str, Any]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in overrides.items())


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left."""
    if proc.poll() is not None:
        _kill_group(proc.pid, signal.SIGKILL)
        return
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with code {proc.returncode} before port {port} opened\n{tail}")
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")


@dataclass
class RunOutcome:
    run_id: int
    status: str          # e.g. "finished:completed", "finished:failed"
    seconds: float
    log: str = ""

    @property
    def completed(self) -> bool:
        return self.status == "finished:completed"


@dataclass
class LocalSuperLink:
    """A SuperLink on 127.0.0.1 in a private FLWR_HOME; a context manager that stops it.

    Flower 1.41 serves the Fleet, Control and Runtime APIs over HTTP on one port.
    """

    home: Path
    simulation: bool = True
    extra_args: list[str] = field(default_factory=list)
    env_extra: dict[str, str] = field(default_factory=dict)
    port: int = 0
    connection: str = "fedvls"
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.env = flower_env(self.home, **self.env_extra)

    # ---- lifecycle ------------------------------------------------------------
    def start(self, insecure: bool = True, timeout: float = 60.0) -> "LocalSuperLink":
        cmd = [
            str(BIN_DIR / "flower-superlink"),
            "--isolation", "subprocess",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.home / "state.db"),
            "--disable-runtime-dependency-installation",
            *self.extra_args,
        ]
        if insecure:
            cmd.append("--insecure")
        if self.simulation:
            cmd.append("--simulation")
        log = self.home / "superlink.log"
        proc = self.spawn(cmd, log)
        try:
            wait_for_port(self.port, timeout, proc, log)
        except BaseException:
            self.stop()
            raise
        self.write_connection(insecure=insecure)
        return self

    def spawn(self, cmd: list[str], log: Path) -> subprocess.Popen:
        """Start ``cmd`` in its own process group (so its children can be stopped too)."""
        handle = open(log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(cmd, env=self.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        handle.close()
        self.processes.append(proc)
        return proc

    def write_connection(self, insecure: bool = True, root_certificates: Path | None = None) -> None:
        lines = [
            "[superlink]", f'default = "{self.connection}"', "",
            f"[superlink.{self.connection}]", f'address = "127.0.0.1:{self.port}"',
        ]
        if insecure:
            lines.append("insecure = true")
        if root_certificates is not None:
            lines.append(f'root-certificates = "{root_certificates}"')
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def stop(self) -> None:
        for proc in reversed(self.processes):
            stop_process(proc)
        self.processes.clear()

    def __enter__(self) -> "LocalSuperLink":
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

    def status(self, run_id: int) -> str:
        res = self.flwr("ls", "--run-id", str(run_id), "--format", "json")
        payload = json.loads(res.stdout)
        runs = payload.get("runs", [])
        return runs[0]["status"] if runs else "unknown"

    def wait(self, run_id: int, timeout: float = 600.0, poll: float = 1.0) -> RunOutcome:
        t0 = time.monotonic()
        while True:
            status = self.status(run_id)
            if status.startswith("finished"):
                return RunOutcome(run_id, status, time.monotonic() - t0, self.logs(run_id))
            if time.monotonic() - t0 > timeout:
                self.flwr("stop", str(run_id), self.connection)
                return RunOutcome(run_id, f"timeout:{status}", time.monotonic() - t0, self.logs(run_id))
            time.sleep(poll)

    def logs(self, run_id: int) -> str:
        res = self.flwr("log", str(run_id), self.connection, "--show", timeout=60)
        return res.stdout + res.stderr
