"""Where an ordinary round's time goes on the in-process engine, phase by phase, client workers included.

    python bench/round_phases.py --cpu                  # a rehearsal: ResNet-18 on tiny CIFAR-format data
    python bench/round_phases.py --out phases.json      # on a GPU: 4 ResNet-18 clients, 5,000 images, 1 worker

``bench/gpu_step.py`` compares a round of 4 clients with their own training time; this says what
the rest is. Every phase is timed by a wrapper (``time.perf_counter`` around the app's own
functions, no profiler): the server's in this process, booked to the round they ran in; the
client's inside the process that runs the client (a client worker loads the ClientApp through
:func:`timed_client_app`, which installs the same wrappers there and appends one JSON line per
message to the file ``FEDVLS_ROUND_PHASES`` names). Each phase's figure is its median over the
steady rounds (the second on) of its sum over the round's clients. On a GPU the client phases
that launch work end when their last kernel is queued or when they wait for one; the local
training phase ends with a read of its loss (a synchronisation), so later phases do not carry its
kernels. ``bench/head_round_phases.py`` does the same for FedConcat's head rounds, one worker in
this process.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PHASES_FILE = "FEDVLS_ROUND_PHASES"
WHOLE = "the ClientApp's train_round, whole"
#: (module, attribute path, label): the client's phases, in the order a message runs them.
CLIENT_PHASES: tuple[tuple[str, str, str], ...] = (
    ("fedvls_flwr.app.client", "train_round", WHOLE),
    ("fedvls_flwr.app.client", "parse_run_config", "reading the run config"),
    ("fedvls_flwr.app.client", "node_client_data", "the node's data"),
    ("fedvls_flwr.app.client", "torch_state_dict", "received arrays to tensors"),
    ("fedvls_flwr.app.client", "load_client_state", "the node's kept state read"),
    ("fedvls_flwr.app.client", "build_protocol", "the protocol built"),
    ("fedvls_flwr.algorithms.rounds", "train_as_usual", "the client step: network built, trained, weights to the CPU"),
    ("fedvls_flwr.algorithms.rounds", "build_loaded", "the network built, holding the received weights"),
    ("fedvls_flwr.algorithms.rounds", "train_local", "local training (train_local)"),
    ("fedvls_flwr.app.client", "save_client_state", "the node's kept state saved"),
    ("fedvls_flwr.app.client", "numpy_record", "the reply's arrays encoded"),
)
REPLY_ENCODED = "the reply's arrays encoded"
#: the client phases inside the client step (shown indented under it)
INSIDE_STEP = frozenset({"the network built, holding the received weights", "local training (train_local)"})
SERVER_PHASES: tuple[tuple[str, str, str], ...] = (
    ("fedvls_flwr.app.strategy", "RunStrategy.configure_train", "server: the round's messages (configure_train)"),
    ("fedvls_flwr.app.strategy", "RunStrategy.aggregate_train", "server: replies checked and averaged"),
    ("fedvls_flwr.app.server", "ServerRun.evaluate_global", "server: the global model's evaluation"),
    ("fedvls_flwr.app.server", "ServerRun.finish_saving", "server: waiting for the round before's files"),
    ("fedvls_flwr.app.server", "ServerRun.save_round", "server: the round's files handed to their thread"),
    ("fedvls_flwr.app.server", "ServerRun._write_round", "their thread, beside the next round: the round's files"),
)

_INSTALLED: set[str] = set()


def wrap_phases(phases: Iterable[tuple[str, str, str]], book: Callable[[str, float], None]) -> None:
    """Replace each (module, attribute path, label)'s function by one that books its seconds."""
    import importlib

    for module_name, path, label in phases:
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = getattr(owner, name)

        def timed(*args: Any, _original: Callable = original, _label: str = label, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                book(_label, time.perf_counter() - t0)

        setattr(owner, name, timed)


def install_client_timers(out: Path) -> None:
    """Time the client's phases in this process; one JSON line per message appended to ``out``."""
    if "client" in _INSTALLED:
        return
    _INSTALLED.add("client")
    from fedvls_flwr.app import client, client_app, keys
    from fedvls_flwr.app.messages import config_in, integer

    spent: dict[str, float] = collections.defaultdict(float)
    saving = [0]  # inside the kept state's saving: its own encoding is that phase's, not the reply's

    def book(label: str, seconds: float) -> None:
        if label != REPLY_ENCODED or not saving[0]:
            spent[label] += seconds

    wrap_phases(CLIENT_PHASES[1:], book)
    save_state = client.save_client_state

    def saving_state(*args: Any, **kwargs: Any) -> Any:
        saving[0] += 1
        try:
            return save_state(*args, **kwargs)
        finally:
            saving[0] -= 1

    client.save_client_state = saving_state  # type: ignore[assignment]
    train_round = client.train_round

    def whole(content: Any, *args: Any, **kwargs: Any) -> Any:
        spent.clear()
        t0 = time.perf_counter()
        try:
            return train_round(content, *args, **kwargs)
        finally:
            line = {"round": integer(dict(config_in(content, keys.CONFIG).items()).get(keys.SERVER_ROUND, 0)),
                    "pid": os.getpid(), WHOLE: time.perf_counter() - t0, **spent}
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")

    client.train_round = client_app.train_round = whole  # type: ignore[assignment]  # the ClientApp imports it by name


def timed_client_app() -> Any:
    """The project's ClientApp with the client's phases timed (what a client worker loads by
    reference: ``bench.round_phases:timed_client_app``)."""
    install_client_timers(Path(os.environ[PHASES_FILE]))
    from fedvls_flwr.app.client_app import app

    return app


#: the server's phases of the run being measured, by (label, round)
_SERVER_SPENT: dict[tuple[str, int], float] = collections.defaultdict(float)


def install_server_timers() -> dict[tuple[str, int], float]:
    """Time the server's phases in this process; emptied, the dictionary they are booked in by
    (label, round) (the same one for every run: the wrappers are installed once)."""
    _SERVER_SPENT.clear()
    spent = _SERVER_SPENT
    if "server" in _INSTALLED:
        return spent
    _INSTALLED.add("server")
    current = track_rounds()
    wrap_phases(SERVER_PHASES, lambda label, s: spent.__setitem__((label, current[0]), spent[(label, current[0])] + s))
    return spent


def track_rounds() -> list[int]:
    """A one-item list holding the round the server is in (from its training step on: the
    evaluation and saving of a round follow it), kept up to date from now on in this process."""
    from fedvls_flwr.app.strategy import RunStrategy

    current = [0]
    train_round = RunStrategy._train_round

    def round_of(self: Any, grid: Any, server_round: int, arrays: Any) -> Any:
        current[0] = server_round
        return train_round(self, grid, server_round, arrays)

    RunStrategy._train_round = round_of  # type: ignore[method-assign]
    return current


def measure(settings: dict[str, Any], nodes: int, *, client_gpus: float, workers: int, work: Path) -> dict[str, Any]:
    """Run ``settings`` on the in-process engine with every phase timed; the per-round medians."""
    from fedvls_flwr.app.results import read_rounds
    from fedvls_flwr.ops.inprocess import run_in_process

    phases_file = work / "client-phases.jsonl"
    phases_file.unlink(missing_ok=True)
    os.environ[PHASES_FILE] = str(phases_file)  # before the workers start: they inherit it
    server = install_server_timers()
    run = run_in_process({**settings, "output-dir": str(work / "runs"), "run-name": "phases"}, nodes, client_cpus=1,
                         client_gpus=client_gpus, workers=workers, client_app="bench.round_phases:timed_client_app",
                         keep_pool=False)
    rounds = [r for r in read_rounds(run.run_dir) if r["round"] >= 1]
    steady = [r["round"] for r in rounds][1:] or [rounds[0]["round"]]
    client: dict[tuple[str, int], float] = collections.defaultdict(float)
    for line in phases_file.read_text().splitlines():
        record = json.loads(line)
        for label, seconds in record.items():
            if label not in ("round", "pid"):
                client[(label, record["round"])] += seconds
    per_round: dict[str, float] = {}
    for _, _, label in CLIENT_PHASES:
        per_round[label] = statistics.median(client.get((label, r), 0.0) for r in steady)
    for _, _, label in SERVER_PHASES:
        per_round[label] = statistics.median(server.get((label, r), 0.0) for r in steady)
    seconds = statistics.median(r["seconds"] for r in rounds if r["round"] in steady)
    transport = run.extra.get("transport_seconds")
    return {"per_round": per_round, "round_seconds": seconds, "rounds": len(rounds), "steady_rounds": steady,
            "nodes": nodes, "workers": run.workers,
            "transport_seconds_per_round": None if transport is None else transport / len(rounds)}


def markdown(result: dict[str, Any], title: str) -> str:
    per = result["per_round"]
    lines = [f"{title}: the round's median `seconds` {result['round_seconds'] * 1000:.0f} ms "
             f"({result['nodes']} clients, {result['workers']}; medians over rounds {result['steady_rounds']})", "",
             "| phase (each summed over the round's clients) | ms per round |", "| --- | ---: |"]
    for _, _, label in (*CLIENT_PHASES, *SERVER_PHASES):
        indent = "" if label == WHOLE or label.startswith(("server", "their")) else "&nbsp;&nbsp;&nbsp;&nbsp;"
        indent *= 2 if label in INSIDE_STEP else 1
        lines.append(f"| {indent}{label} | {per[label] * 1000:.1f} |")
    if result.get("transport_seconds_per_round") is not None:
        lines.append(f"| the pool's transport in this process (messages out, replies in) | "
                     f"{result['transport_seconds_per_round'] * 1000:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="on the CPU, tiny sizes (a rehearsal)")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, help="every figure as JSON")
    args = ap.parse_args()
    from bench.cifar_shim import cifar_env
    from tests.tiny_data import write_tiny_cifar10

    with tempfile.TemporaryDirectory(prefix="round-phases-") as tmp:
        work = Path(tmp)
        per_batch = 16 if args.cpu else 1000
        os.environ.update(cifar_env(work / "shim", write_tiny_cifar10(work / "data", per_batch=per_batch,
                                                                      n_test=per_batch)))
        settings = {"dataset": "cifar10", "model": args.model, "data-dir": str(work / "data"), "method": "fedavg",
                    "num-server-rounds": args.rounds, "local-epochs": 1, "partition": "dirichlet",
                    "dirichlet-beta": 0.5, "min-nodes": 4, "device": "cpu" if args.cpu else "cuda",
                    **({"batch-size": 8} if args.cpu else {})}
        result = measure(settings, 4, client_gpus=0.0 if args.cpu else 1.0, workers=1, work=work)
    title = f"{args.model}, {'CPU rehearsal' if args.cpu else 'GPU'}"
    print(markdown(result, title))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
