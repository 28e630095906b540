"""bench/bench_round.py's workloads: the plain loop (bench/reference_loop.py) in its own process,
the app as a real ``flwr run`` timed from the outside, and the ClientApp body profiled in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_DIR))

from bench.reference_loop import RefConfig, cli_args  # noqa: E402
from bench.round_timing import TreeSampler, descendants, median, steady  # noqa: E402
from fedvls_flwr.app.results import ROUNDS_FILE, SUMMARY_FILE, read_rounds  # noqa: E402
from fedvls_flwr.ops.launch import LocalSuperLink  # noqa: E402

REFERENCE = PROJECT_DIR / "bench" / "reference_loop.py"
VARIANTS = ("plain-1t", "plain-2t", "dataloader-1t", "app")
# Not run by default: the app while `flwr list` is polled every second, as
# fedvls_flwr.ops.launch.LocalSuperLink.wait does (the sweep and the tests wait that way).
EXTRA_VARIANTS = ("app-polled",)


# --------------------------------------------------------------------------- the plain loop


def run_plain(cfg: RefConfig, work: Path, tag: str) -> dict[str, Any]:
    out = work / f"{tag}.json"
    args = [sys.executable, str(REFERENCE), "--json", str(out), *cli_args(cfg)]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=PROJECT_DIR)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"reference loop failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    rounds = res["rounds"][1:]
    secs = [r["seconds"] for r in rounds]
    st = steady(secs)
    return {
        "steady_round_s": st,
        "round1_s": secs[0],
        "round_seconds": secs,
        "total_s": wall,
        # launch -> end of round 1, minus one steady round (same definition as the app)
        "startup_s": wall - sum(secs[1:]) - st,
        "train_s_per_round": median([r["train_seconds"] for r in rounds[1:]] or [rounds[0]["train_seconds"]]),
        "aggregate_s_per_round": median([r["aggregate_seconds"] for r in rounds]),
        "eval_s_per_round": median([r["eval_seconds"] for r in rounds]),
        "client_seconds": [r["client_seconds"] for r in rounds],
        "peak_rss_mb": res["peak_rss_mb"],
        "accuracy": [r["accuracy"] for r in res["rounds"]],
        "client_sizes": res["client_sizes"],
        "torch_threads": res["torch_threads"],
    }


# --------------------------------------------------------------------------- the app


def app_overrides(cfg: RefConfig, out_dir: Path, name: str) -> dict[str, Any]:
    return {
        **cfg.run_config(),
        "output-dir": str(out_dir),
        "run-name": name,
        "device": "cpu",
        "torch-threads": 1,
        "min-nodes": cfg.num_clients,
    }


def ls_run(link: LocalSuperLink, run_id: int) -> dict[str, Any]:
    res = link.flwr("list", "--run-id", str(run_id), "--format", "json")
    try:
        runs = json.loads(res.stdout).get("runs", [])
    except ValueError:
        return {}
    return runs[0] if runs else {}


def _simulation_pid(link: LocalSuperLink) -> int | None:
    for pid, cmd in descendants(link.processes[0].pid).items():
        if "flwr-simulation" in cmd:
            return pid
    return None


def run_app(
    link: LocalSuperLink, cfg: RefConfig, out_dir: Path, name: str, *, timeout: float,
    memory: bool = True, py_spy: str | None = None, py_spy_seconds: float = 0.0, py_spy_out: Path | None = None,
    poll_flwr_ls: float = 0.0,
) -> dict[str, Any]:
    """One ``flwr run`` of the app, timed from the outside. Progress is read from the run
    folder (a stat every 50 ms); ``flwr list`` (a ~1 CPU-second CLI start) is asked only every
    15 s, unless ``poll_flwr_ls`` > 0 asks it that often (to measure what such polling costs)."""
    run_dir = out_dir / name
    rounds_path, summary_path = run_dir / ROUNDS_FILE, run_dir / SUMMARY_FILE
    sampler = TreeSampler(link.processes[0].pid) if memory else None
    if sampler:
        sampler.start()
    spy = None
    t_submit = time.time()
    run_id = link.submit(
        run_config=app_overrides(cfg, out_dir, name),
        federation_config={"num-supernodes": cfg.num_clients, "client-resources-num-cpus": 1},
    )
    cli_s = time.time() - t_submit
    seen: dict[int, float] = {}  # number of lines in rounds.jsonl -> when that version was written
    last_mtime = None
    next_status = time.time() + 15.0  # `flwr list` costs ~1 CPU-second: ask rarely
    poller_stop = threading.Event()
    if poll_flwr_ls > 0:  # a second waiter that polls like LocalSuperLink.wait (own thread)
        def poll() -> None:
            while not poller_stop.is_set():
                link.status(run_id)
                poller_stop.wait(poll_flwr_ls)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
    status = "running"
    while True:
        try:
            st = os.stat(rounds_path)
            if st.st_mtime_ns != last_mtime:
                last_mtime = st.st_mtime_ns
                n = len([line for line in rounds_path.read_text().splitlines() if line.strip()])
                seen.setdefault(n, st.st_mtime)
        except FileNotFoundError:
            pass
        if py_spy and spy is None and 3 in seen:  # round 2 is running: steady state
            pid = _simulation_pid(link)
            if pid is not None:
                spy = subprocess.Popen(
                    [py_spy, "record", "--pid", str(pid), "--subprocesses", "--rate", "100",
                     "--duration", str(int(py_spy_seconds)), "--format", "raw", "--output", str(py_spy_out),
                     "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
        if summary_path.exists():
            break
        if time.time() > next_status:
            status = link.status(run_id)
            if status.startswith("finished"):
                break
            next_status = time.time() + 15.0
        if time.time() - t_submit > timeout:
            link.flwr("stop", str(run_id), link.connection)
            status = "timeout"
            break
        time.sleep(0.05)
    t_seen_end = time.time()
    poller_stop.set()
    if spy is not None:
        try:
            spy.wait(timeout=py_spy_seconds + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
    # the ServerApp returns right after writing summary.json; wait for the final status
    while status != "timeout" and not status.startswith("finished"):
        status = link.status(run_id)
        if time.time() - t_seen_end > 120:
            break
        time.sleep(0.5)
    if sampler:
        sampler.stop_event.set()
        sampler.join()
    info = ls_run(link, run_id)
    if status != "finished:completed" or not summary_path.exists():
        raise RuntimeError(f"app run {name} ended {status}:\n{link.logs(run_id)[-4000:]}")

    rounds = read_rounds(run_dir)
    secs = [r["seconds"] for r in rounds if r["round"] >= 1]
    st = steady(secs)
    summary_mtime = summary_path.stat().st_mtime
    round1_end = seen.get(2)
    return {
        "run_id": run_id,
        "steady_round_s": st,
        "round1_s": secs[0],
        "round_seconds": secs,
        "total_s": summary_mtime - t_submit,
        "cli_s": cli_s,
        "to_first_round_s": (seen[1] - t_submit) if 1 in seen else None,
        "round1_end_s": (round1_end - t_submit) if round1_end else None,
        "startup_s": (round1_end - t_submit - st) if round1_end else None,
        "server_wall_s": json.loads(summary_path.read_text()).get("wall_seconds"),
        "accuracy": [r["accuracy"] for r in rounds],
        "flwr_ls": info,
        "clientapp_s_total": (info.get("compute-time") or {}).get("clientapp-seconds"),
        **(sampler.result() if sampler else {}),
    }



def profile_client_round(cfg: RefConfig, top: int = 25) -> dict[str, Any]:
    """Time the app's ClientApp body (``train_round``) in-process for every client, plus a
    pickle round trip of the train message's content and the reply (the records Ray
    ships between the simulation process and an actor), and cProfile the largest client."""
    import cProfile
    import io
    import pickle
    import pstats

    import torch
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from fedvls_flwr.app import keys
    from fedvls_flwr.app.client import train_round
    from fedvls_flwr.config.run_config import model_name, parse_run_config
    from fedvls_flwr.data.node_data import client_data, dataset_for
    from fedvls_flwr.models import build_model

    run_cfg = parse_run_config({**cfg.run_config(), "device": "cpu", "torch-threads": 1})
    bundle = dataset_for(run_cfg)
    torch.manual_seed(run_cfg.seed)
    model = build_model(model_name(run_cfg), tuple(bundle.input_shape), bundle.num_classes)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    content = RecordDict({
        keys.ARRAYS: arrays,
        keys.CONFIG: ConfigRecord({**run_cfg.to_flower(), keys.SERVER_ROUND: 2}),
    })
    n = cfg.num_clients
    sizes = [int(client_data(run_cfg, i, n).y.shape[0]) for i in range(n)]  # warms the caches
    per_client = []
    for i in range(n):
        t0 = time.perf_counter()
        train_round(content, {"partition-id": i, "num-partitions": n})
        per_client.append(time.perf_counter() - t0)
    reply = train_round(content, {"partition-id": 0, "num-partitions": n})
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        blob_in = pickle.dumps(content)
        pickle.loads(blob_in)
        blob_out = pickle.dumps(reply)
        pickle.loads(blob_out)
    pickle_s = (time.perf_counter() - t0) / reps
    biggest = max(range(n), key=lambda i: sizes[i])
    prof = cProfile.Profile()
    prof.enable()
    train_round(content, {"partition-id": biggest, "num-partitions": n})
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return {
        "client_sizes": sizes,
        "train_round_s": per_client,
        "train_round_s_sum": sum(per_client),
        "pickle_roundtrip_s_per_client": pickle_s,
        "message_bytes": len(blob_in),
        "reply_bytes": len(blob_out),
        "cprofile_biggest_client": buf.getvalue(),
    }

