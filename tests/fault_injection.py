"""Fault injection for the reliability tests, as a Flower ClientApp mod (test-only).

:func:`fault_app` writes a copy of the app whose ClientApp is the project's own handlers
wrapped in :func:`inject_faults` (the production ClientApp has no test hook); submit runs to
that folder. :func:`fault_client_app` is the same ClientApp for the in-process engine
(``run_in_process(..., client_app=...)``), which reads ``FEDVLS_INJECT_FAULT`` from this
process's environment. ``FEDVLS_INJECT_FAULT`` in the Flower processes' environment lists entries
``kind:partition:round`` separated by commas: ``raise`` makes that partition's training raise
in that round, ``nan`` makes it reply with NaN weights, ``kill`` kills the process that trains
it (SIGKILL, as the kernel's out-of-memory killer does) - once per entry when
``FEDVLS_INJECT_FAULT_ONCE`` names a folder (a marker file there says it happened), so that a
retried round goes through; only for the in-process engine's client workers. ``hold`` makes that
partition's training wait ``HOLD_SECONDS`` first: a test that kills a run after round R is saved
holds round R + 1 (partition ``*``: every partition), so the kill lands while R + 1 trains
however fast or slow the machine is, and a run that is not killed fails on its round timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message

from fedvls_flwr.app import keys

FAULT_ENV = "FEDVLS_INJECT_FAULT"
ONCE_ENV = "FEDVLS_INJECT_FAULT_ONCE"
#: How long a ``hold`` waits: longer than any test waits for a kill.
HOLD_SECONDS = 600.0
PROJECT_DIR = Path(__file__).resolve().parents[1]
FAULT_CLIENT_APP = '''"""Test-only ClientApp: the project's handlers, with the fault-injection mod first."""
from flwr.clientapp import ClientApp

from fault_injection import inject_faults

from fedvls_flwr.app import client_app as production
from fedvls_flwr.app.supernode_guard import guard_supernode

app = ClientApp(mods=[inject_faults, guard_supernode])
app.train()(production.train)
app.evaluate()(production.evaluate)
app.query()(production.query)
'''


def fault_app(folder: Path) -> Path:
    """An app folder: the project's entry points and pyproject, the ClientApp component
    pointing at a test ClientApp that adds :func:`inject_faults` (the package itself comes
    from the installed project)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("server_app.py", "client_app.py", "LICENSE", "README.md"):
        if (PROJECT_DIR / name).exists():
            shutil.copy(PROJECT_DIR / name, folder / name)
    shutil.copy(Path(__file__), folder / "fault_injection.py")
    (folder / "fault_client_app.py").write_text(FAULT_CLIENT_APP)
    pyproject = (PROJECT_DIR / "pyproject.toml").read_text()
    assert 'clientapp = "client_app:app"' in pyproject
    (folder / "pyproject.toml").write_text(pyproject.replace('clientapp = "client_app:app"',
                                                            'clientapp = "fault_client_app:app"'))
    return folder


def fault_client_app():
    """The project's ClientApp handlers behind :func:`inject_faults`, for the in-process engine."""
    from flwr.clientapp import ClientApp

    from fedvls_flwr.app import client_app as production

    app = ClientApp(mods=[inject_faults])
    app.train()(production.train)
    app.evaluate()(production.evaluate)
    app.query()(production.query)
    return app


def planned_fault(partition_id: int, server_round: int) -> str | None:
    for entry in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, pid, rnd = entry.split(":")
        if pid in ("*", str(partition_id)) and int(rnd) == server_round:
            return kind
    return None


def inject_faults(msg: Message, context: Context, call_next) -> Message:
    if msg.metadata.message_type != "train":
        return call_next(msg, context)
    partition_id = int(context.node_config.get("partition-id", -1))
    server_round = int(msg.content[keys.CONFIG][keys.SERVER_ROUND])
    fault = planned_fault(partition_id, server_round)
    if fault == "raise":
        raise RuntimeError(f"injected fault: partition {partition_id} raises in round {server_round}")
    if fault == "kill" and _first_time(f"kill-{partition_id}-{server_round}"):
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hold":
        time.sleep(HOLD_SECONDS)
    reply = call_next(msg, context)
    if fault == "nan":
        arrays = reply.content[keys.ARRAYS]
        reply.content[keys.ARRAYS] = ArrayRecord({
            key: Array(np.full_like(arr.numpy(), np.nan) if arr.numpy().dtype.kind == "f" else arr.numpy())
            for key, arr in arrays.items()
        })
    return reply


def _first_time(name: str) -> bool:
    """True the first time ``name`` is asked for under ``FEDVLS_INJECT_FAULT_ONCE``; always
    True without it."""
    folder = os.environ.get(ONCE_ENV)
    if not folder:
        return True
    try:
        (Path(folder) / name).open("x").close()
    except FileExistsError:
        return False
    return True
