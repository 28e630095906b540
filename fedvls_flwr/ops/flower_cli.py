"""How we drive Flower's command-line tools: their environment (private home, offline, quiet),
``--run-config``/``--node-config`` strings, TLS file layout, JSON output and a run's outcome."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedvls_flwr.config.settings import toml_value


def console_scripts(name: str, package: str) -> Path:
    """The folder of ``package``'s console script ``name``: beside this interpreter (a virtual
    environment), else on ``PATH``, else the ``bin`` folder of a ``pip install --target`` that
    holds the package (on ``PYTHONPATH``); beside this interpreter when none has it (the error
    then names that path)."""
    here = Path(sys.executable).parent
    if (here / name).exists():
        return here
    if found := shutil.which(name):
        return Path(found).parent
    spec = importlib.util.find_spec(package)  # found, not imported
    if spec is not None and spec.origin is not None and (target := Path(spec.origin).parents[1] / "bin" / name).exists():
        return target.parent
    return here


#: Where Flower's console scripts (flower-superlink, flwr, ...) are.
BIN_DIR = console_scripts("flower-superlink", "flwr")


# A SuperNode's SuperExec asks it for a new task every FLWR_SUPEREXEC_TASK_POLL_INTERVAL
# seconds (Flower's default 1.0) before it starts the task's flwr-clientapp: on average
# half of that is added to every message. 0.1 s costs about 2 CPU-seconds per minute per
# SuperNode in idle polling (measured; docs/performance.md, deployment section).
SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"


SUPEREXEC_POLL_SECONDS = "0.1"


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


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS: the CA that signed the SuperLink's certificate, and that certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> TlsFiles:
        """The layout ``python -m fedvls_flwr deploy certs DIR`` writes."""
        directory = Path(directory)
        return cls(directory / "ca.pem", directory / "server.pem", directory / "server.key")


def node_config_arg(node_config: dict[str, Any]) -> str:
    """A dict as the value of ``flower-supernode --node-config`` (TOML values)."""
    return run_config_arg(node_config)


def run_config_arg(overrides: dict[str, Any]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in overrides.items())


RUN_ID = re.compile(r"Successfully started run (\d+)")


def last_json(text: str) -> dict[str, Any]:
    """The JSON object a ``flwr ... --format json`` command printed (after any log lines)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the output")
    return json.JSONDecoder().raw_decode(text[start:])[0]


@dataclass
class RunOutcome:
    run_id: int
    status: str          # e.g. "finished:completed", "finished:failed"
    seconds: float
    log: str = ""

    @property
    def completed(self) -> bool:
        return self.status == "finished:completed"
