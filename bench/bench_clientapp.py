"""What one deployment message costs inside a fresh ``flwr-clientapp`` process, by phase.

In deployment, Flower 1.41 starts a new ``flwr-clientapp`` process for every message. This
benchmark replays that process's work in a fresh Python process per repetition, timing:

* ``flower runtime``: importing what ``flwr-clientapp`` imports before it loads our app
  (Flower's cost);
* ``import torch`` and ``import client_app``: loading our ClientApp - torch (its first
  import), then the rest (this package, flwr.app and flwr.serverapp parts it uses);
* ``message``: the train handler on one message (global weights + round config), the
  node's data coming from the on-disk cache as in every round after the first (written
  beforehand by this script); of it ``data`` (node_client_data) and ``model`` (building
  the model); the rest is loading the weights, local training and the reply record;
* and, with ``--imports``, which modules the message imports lazily (``-X importtime``).

    .venv/bin/python bench/bench_clientapp.py --reps 7                # medians of 7 processes
    .venv/bin/python bench/bench_clientapp.py --reps 1 --imports      # + lazily imported modules

CPU seconds (``time.process_time``) are printed next to wall seconds: on a loaded machine
the wall seconds grow with the load, the CPU seconds much less. The processes run with
Python's default bytecode caching (``PYTHONDONTWRITEBYTECODE`` is removed for them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
T = {}
def mark(name, t0, c0):
    T[name] = (time.perf_counter() - t0, time.process_time() - c0)
t0, c0 = time.perf_counter(), time.process_time()
import flwr.supernode.cli.flwr_clientapp, flwr.supernode.runtime.run_clientapp  # Flower's runtime
mark("flower runtime", t0, c0)
sys.path.insert(0, sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
import torch  # the first thing client_app imports (through fedvls_flwr.app.client)
mark("import torch", t0, c0)
t0, c0 = time.perf_counter(), time.process_time()
import client_app
mark("import client_app", t0, c0)

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from fedvls_flwr.app import client as client_module
from fedvls_flwr.app import keys
from fedvls_flwr.config.run_config import parse_run_config

# The message as Flower hands it over: the global weights and the round's config.
cfg = parse_run_config(json.loads(sys.argv[2]))
node_config = json.loads(sys.argv[3])
with np.load(sys.argv[4]) as arrays:
    weights = ArrayRecord({k: Array(np.array(arrays[k])) for k in arrays.files})
content = RecordDict({keys.ARRAYS: weights, keys.CONFIG: ConfigRecord({**cfg.to_flower(), "server-round": 2})})

# Split the message: wrap the two steps train_round calls first.
orig_data, orig_build = client_module.node_client_data, client_module.build_run_model
def timed_data(*a, **k):
    t0, c0 = time.perf_counter(), time.process_time(); out = orig_data(*a, **k); mark("data", t0, c0); return out
def timed_build(*a, **k):
    t0, c0 = time.perf_counter(), time.process_time(); out = orig_build(*a, **k); mark("model", t0, c0); return out
client_module.node_client_data, client_module.build_run_model = timed_data, timed_build
t0, c0 = time.perf_counter(), time.process_time()
reply = client_module.train_round(content, node_config)
mark("message", t0, c0)
print("RESULT " + json.dumps(T))
"""

PHASES = ("flower runtime", "import torch", "import client_app", "message", "data", "model")


def prepare(cfg: dict, node_config: dict, folder: Path) -> Path:
    """Write the node's data cache (as round 1 does) and the global weights, in this process."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch

    from fedvls_flwr.algorithms.run_model import build_run_model
    from fedvls_flwr.app.client import node_client_data
    from fedvls_flwr.config.run_config import parse_run_config

    run_cfg = parse_run_config(cfg)
    data = node_client_data(run_cfg, node_config)
    torch.manual_seed(0)
    model = build_run_model(run_cfg, tuple(data.x.shape[1:]), data.num_classes)
    weights = folder / "weights.npz"
    np.savez(weights, **{k: v.numpy() for k, v in model.state_dict().items()})
    return weights


def run_once(cfg: dict, node_config: dict, weights: Path, importtime: bool = False) -> tuple[dict, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # Python's default: compiled modules are cached
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", CHILD, str(ROOT),
           json.dumps(cfg), json.dumps(node_config), str(weights)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    line = next((out for out in res.stdout.splitlines() if out.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"benchmark process failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):]), res.stderr


def lazy_imports(stderr: str, top: int = 15) -> list[tuple[float, str]]:
    """Modules first imported after ``import client_app`` finished (i.e. during the message)."""
    rows = [line for line in stderr.splitlines() if line.startswith("import time:")]
    names = [r.split("|")[-1].rstrip() for r in rows]
    end = max(i for i, n in enumerate(names) if n.strip() == "client_app")
    out = []
    for row in rows[end + 1:]:
        _, cumulative, name = row.split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        if depth <= 2:
            out.append((int(cumulative) / 1e6, name.strip()))
    return sorted(out, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--imports", action="store_true", help="also list modules imported during the message")
    parser.add_argument("--run-config", default='{"dataset": "digits", "method": "fedvls", "local-epochs": 1, '
                                               '"dirichlet-beta": 0.5, "seed": 0}')
    parser.add_argument("--json", type=Path, help="write the raw timings here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-clientapp-") as tmp:  # the timings are the result
        cache = Path(tmp)
        cfg = json.loads(args.run_config)
        node_config = {"partition-id": 0, "num-partitions": 2, "cache-dir": str(cache)}
        weights = prepare(cfg, node_config, cache)
        runs = [run_once(cfg, node_config, weights)[0] for _ in range(args.reps)]
        print(f"{args.reps} fresh processes, load average {os.getloadavg()[0]:.1f}; medians (min-max), seconds")
        print(f"{'phase':<20} {'wall':>18} {'cpu':>18}")
        for phase in PHASES:
            wall = [r[phase][0] for r in runs]
            cpu = [r[phase][1] for r in runs]
            print(f"{phase:<20} {statistics.median(wall):>6.3f} ({min(wall):.2f}-{max(wall):.2f}) "
                  f"{statistics.median(cpu):>6.3f} ({min(cpu):.2f}-{max(cpu):.2f})")
        if args.imports:
            _, stderr = run_once(cfg, node_config, weights, importtime=True)
            print("\nmodules imported during the message (cumulative seconds, -X importtime):")
            for seconds, name in lazy_imports(stderr):
                print(f"  {seconds:7.3f}  {name}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
