"""Seconds per round: the app under `flwr run` vs a plain PyTorch loop doing the same work.

    python bench/bench_round.py                       # mnist10k, 10 clients, 20 rounds, 3 reps
    python bench/bench_round.py --quick               # 3 rounds x 1 epoch, 1 rep: checks the plumbing
    python bench/bench_round.py --rounds 20 --reps 3 --methods fedavg,fedvls --profile

For every repetition and method it runs, each in a fresh process:

* ``plain-1t`` / ``plain-2t``: ``bench/reference_loop.py`` (one process, the clients
  trained one after the other, then averaged and evaluated) with 1 and 2 torch threads;
* ``dataloader-1t``: the same loop fed by an idiomatic ``DataLoader(TensorDataset)``;
* ``app``: a real ``flwr run`` simulation of this project on a SuperLink the benchmark
  starts (private ``FLWR_HOME``, free port) with ``num-supernodes = clients`` and
  ``client-resources-num-cpus = 1`` (two Ray actors on a 2-core machine).

All four do the same work (same partition, initial model, batch order, objective, epochs;
``tests/test_bench_equivalence.py`` checks that they reach the same accuracy).

Figures (medians over the repetitions):

* steady-state seconds per round: the median of rounds 2..N (the app's own per-round
  ``seconds`` from ``rounds.jsonl``: sending, client training, aggregation, evaluation of
  the global model; the plain loop times the same three steps);
* start-up: time from launch (subprocess start / ``flwr run`` submission) to the end of
  round 1, minus one steady-state round. Round 1 of the app also starts Ray, the actors
  and the ClientApp imports, so "submit -> round 1 starts" alone would miss most of it.
  Also reported: submit -> the initial model's evaluation is written (the ServerApp is up,
  round 1 starts), and the ``flwr run`` command's own duration;
* total wall time: launch -> ``summary.json`` written (app) / process exit (plain loop);
* peak memory: ``ru_maxrss`` of the plain-loop process; for the app, the SuperLink's whole
  process tree (SuperLink, SuperExec, flwr-simulation with the ServerApp, Ray's
  processes, the actors) sampled from /proc every second: summed RSS (counts shared
  pages once per process, so an upper bound) and summed PSS (shared pages split).

``--profile`` adds, per method, one extra app run (not in the table) sampled with py-spy
(``--py-spy``, if available) across the simulation process and its children, and a
cProfile of the app's ``train_round`` called in-process, to show where a round's time goes.

Writes ``bench.json`` (every raw figure) and ``bench.md`` (the tables) to ``--output-dir``.
Timings are only meaningful on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_DIR))

from bench.reference_loop import DEFAULT_DATA_DIR, RefConfig, cli_args  # noqa: E402
from fedvls_flwr.app.launch import LocalSuperLink  # noqa: E402
from fedvls_flwr.app.results import ROUNDS_FILE, SUMMARY_FILE, read_rounds  # noqa: E402
from fedvls_flwr.config.run_config import model_name  # noqa: E402

REFERENCE = PROJECT_DIR / "bench" / "reference_loop.py"
VARIANTS = ("plain-1t", "plain-2t", "dataloader-1t", "app")
# Not run by default: the app while `flwr list` is polled every second, as
# fedvls_flwr.app.launch.LocalSuperLink.wait does (the sweep and the tests wait that way).
EXTRA_VARIANTS = ("app-polled",)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def steady(round_seconds: list[float]) -> float:
    """Median seconds of rounds 2..N (round 1 alone if there is only one)."""
    return median(round_seconds[1:]) if len(round_seconds) > 1 else round_seconds[0]


# --------------------------------------------------------------------------- memory of a process tree


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmd)
    return out


def descendants(root: int) -> dict[int, str]:
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return found


def _memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in kB from /proc/<pid>/smaps_rollup (0, 0 if gone)."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


def role(cmd: str) -> str:
    if "ClientAppActor" in cmd:
        return "actors"
    if "flwr-simulation" in cmd:
        return "simulation"
    if "flower-superlink" in cmd or "flower-superexec" in cmd:
        return "superlink"
    return "ray-other"


class TreeSampler(threading.Thread):
    """Peak summed RSS/PSS of a process tree, sampled every ``interval`` seconds."""

    def __init__(self, root: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.stop_event = threading.Event()
        self.peak_rss = self.peak_pss = 0
        self.peak_by_role: dict[str, int] = {}
        self.peak_processes = 0
        self.samples = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            tree = descendants(self.root)
            tot_rss = tot_pss = 0
            by_role: dict[str, int] = {}
            for pid, cmd in tree.items():
                rss, pss = _memory_kb(pid)
                tot_rss += rss
                tot_pss += pss
                by_role[role(cmd)] = by_role.get(role(cmd), 0) + rss
            self.peak_rss = max(self.peak_rss, tot_rss)
            self.peak_pss = max(self.peak_pss, tot_pss)
            for k, v in by_role.items():
                self.peak_by_role[k] = max(self.peak_by_role.get(k, 0), v)
            self.peak_processes = max(self.peak_processes, len(tree))
            self.samples += 1
            self.stop_event.wait(self.interval)

    def result(self) -> dict[str, Any]:
        mb = 1024.0
        return {
            "peak_tree_rss_mb": self.peak_rss / mb,
            "peak_tree_pss_mb": self.peak_pss / mb,
            "peak_rss_mb_by_role": {k: v / mb for k, v in sorted(self.peak_by_role.items())},
            "peak_processes": self.peak_processes,
            "samples": self.samples,
        }


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


# --------------------------------------------------------------------------- profiling


def categorize_py_spy(raw: Path) -> dict[str, Any]:
    """Sum py-spy raw (collapsed) samples into coarse categories per process kind.

    With ``--subprocesses`` every stack starts with one ``process PID:"cmdline"`` frame per
    level of the process tree. Samples whose stack has no Python frame (threads py-spy
    sees as active but that run native code only, e.g. Ray's C++ threads) are counted
    apart and left out of the shares."""
    cats: dict[str, int] = {}
    total = native_only = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        py = ";".join(f for f in frames if not f.startswith("process "))
        last = procs[-1] if procs else ""
        if "ClientAppActor" in last:
            proc = "actor"
        elif "flwr-simulation" in last:
            proc = "simulation process"
        else:
            proc = "Ray daemons"
        if not py:
            native_only += n
            continue
        total += n
        if "train_local (fedvls_flwr/algorithms/training.py" in py:
            what = "training (train_local)"
        elif "train_round (fedvls_flwr/app/client.py" in py:
            what = "ClientApp body outside train_local (config, data, state dict <-> ArrayRecord)"
        elif "aggregate_train" in py:
            what = "server: aggregation + reply checks"
        elif "evaluate_global" in py:
            what = "server: evaluation of the global model"
        elif "on_round_end" in py or "append_round" in py:
            what = "server: result writing"
        elif "serde" in py or "pickle" in py or "inflate" in py or "deflate" in py:
            what = "(de)serialisation"
        elif "flwr/" in py:
            what = "Flower runtime (queues, link state, grid polling, logging, ClientApp wrapper)"
        elif "ray/" in py:
            what = "Ray (worker loop incl. waiting for tasks, dispatch, object transfer)"
        else:
            what = "other"
        key = f"{proc}: {what}"
        cats[key] = cats.get(key, 0) + n
    share = {k: v / total for k, v in sorted(cats.items(), key=lambda kv: -kv[1])} if total else {}
    return {"samples": total, "native_only_samples": native_only, "share": share}


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

    from fedvls_flwr.app import protocol
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
        protocol.ARRAYS: arrays,
        protocol.CONFIG: ConfigRecord({**run_cfg.to_flower(), protocol.SERVER_ROUND: 2}),
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


# --------------------------------------------------------------------------- tables


def fmt(x, digits=2, suffix=""):
    return "n/a" if x is None else f"{x:.{digits}f}{suffix}"


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def makespan(times: list[float], workers: int = 2) -> float:
    """Finish time of ``times`` handed in order to the first free of ``workers``."""
    free = [0.0] * workers
    for t in times:
        i = free.index(min(free))
        free[i] += t
    return max(free)


def build_tables(results: dict[str, dict[str, list[dict]]], meta: dict[str, Any]) -> str:
    methods = list(results)
    all_variants = VARIANTS + EXTRA_VARIANTS
    med = {m: {v: {} for v in all_variants} for m in methods}
    for m in methods:
        for v in all_variants:
            runs = results[m].get(v, [])
            for key in ("steady_round_s", "startup_s", "total_s", "round1_s", "peak_rss_mb", "peak_tree_rss_mb",
                        "peak_tree_pss_mb", "cli_s", "to_first_round_s", "train_s_per_round",
                        "aggregate_s_per_round", "eval_s_per_round", "clientapp_s_total"):
                med[m][v][key] = median([r.get(key) for r in runs])
    lines = []
    add = lines.append
    add("# Seconds per round: app vs plain loop\n")
    add(f"{meta['workload']}  \n{meta['machine']}  \nrepetitions: {meta['reps']}; figures are medians over them "
        f"(range in brackets); steady state = median of rounds 2..{meta['rounds']}.\n")
    add("## Steady-state seconds per round\n")
    add("| method | plain loop, 1 thread | plain loop, 2 threads | DataLoader loop, 1 thread "
        "| app (`flwr run`, 2 actors x 1 thread) | app / plain 1t | app / plain 2t | DataLoader / plain 1t |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in methods:
        r = results[m]
        add(f"| {m} | {spread([x['steady_round_s'] for x in r.get('plain-1t', [])])} "
            f"| {spread([x['steady_round_s'] for x in r.get('plain-2t', [])])} "
            f"| {spread([x['steady_round_s'] for x in r.get('dataloader-1t', [])])} "
            f"| {spread([x['steady_round_s'] for x in r.get('app', [])])} "
            f"| {fmt(ratio(med[m]['app']['steady_round_s'], med[m]['plain-1t']['steady_round_s']))} "
            f"| {fmt(ratio(med[m]['app']['steady_round_s'], med[m]['plain-2t']['steady_round_s']))} "
            f"| {fmt(ratio(med[m]['dataloader-1t']['steady_round_s'], med[m]['plain-1t']['steady_round_s']))} |")
    if "fedavg" in methods and len(methods) > 1:
        add("\n## Each method vs FedAvg (steady-state seconds per round)\n")
        add("| method | plain 1t | plain 2t | DataLoader 1t | app |")
        add("| --- | --- | --- | --- | --- |")
        for m in methods:
            if m == "fedavg":
                continue
            cells = [fmt(ratio(med[m][v]["steady_round_s"], med["fedavg"][v]["steady_round_s"]), 2, "x") for v in VARIANTS]
            add(f"| {m} / fedavg | " + " | ".join(cells) + " |")
    if any(results[m].get("app-polled") for m in methods):
        add("\n## The app while `flwr list` is polled every second (as `LocalSuperLink.wait` does)\n")
        add("| method | app s/round | app s/round, `flwr list` every 1 s | ratio |")
        add("| --- | --- | --- | --- |")
        for m in methods:
            a, p = med[m]["app"]["steady_round_s"], med[m]["app-polled"]["steady_round_s"]
            add(f"| {m} | {fmt(a)} | {fmt(p)} | {fmt(ratio(p, a))} |")
    add("\n## Start-up and total wall time (seconds)\n")
    add("Start-up = launch (process start, or `flwr run` submission) to the end of round 1, minus one "
        "steady-state round. \"submit -> round 1 starts\" = until the ServerApp has written the initial "
        "model's evaluation (Ray and the actors start after that, inside round 1).\n")
    add("| method | plain 1t total | plain 1t start-up | app total | app start-up | app `flwr run` command "
        "| app submit -> round 1 starts | app round 1 | app steady round |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in methods:
        p, a = med[m]["plain-1t"], med[m]["app"]
        add(f"| {m} | {fmt(p['total_s'], 1)} | {fmt(p['startup_s'], 1)} | {fmt(a['total_s'], 1)} | {fmt(a['startup_s'], 1)} "
            f"| {fmt(a['cli_s'], 1)} | {fmt(a['to_first_round_s'], 1)} | {fmt(a['round1_s'], 1)} | {fmt(a['steady_round_s'])} |")
    add("\n## Peak memory (MB)\n")
    add("Plain loop: `ru_maxrss` of its process. App: the SuperLink's process tree sampled every second "
        "(summed RSS counts shared library pages once per process; PSS splits them).\n")
    add("| method | plain 1t RSS | plain 2t RSS | DataLoader 1t RSS | app tree RSS | app tree PSS | app: actors RSS "
        "| app: flwr-simulation (ServerApp) RSS | app: Ray's other processes RSS | app: SuperLink + SuperExec RSS |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in methods:
        app_runs = results[m].get("app", [])
        by_role = lambda k, runs=app_runs: median([r.get("peak_rss_mb_by_role", {}).get(k) for r in runs])
        add(f"| {m} | {fmt(med[m]['plain-1t']['peak_rss_mb'], 0)} | {fmt(med[m]['plain-2t']['peak_rss_mb'], 0)} "
            f"| {fmt(med[m]['dataloader-1t']['peak_rss_mb'], 0)} | {fmt(med[m]['app']['peak_tree_rss_mb'], 0)} "
            f"| {fmt(med[m]['app']['peak_tree_pss_mb'], 0)} | {fmt(by_role('actors'), 0)} | {fmt(by_role('simulation'), 0)} "
            f"| {fmt(by_role('ray-other'), 0)} | {fmt(by_role('superlink'), 0)} |")
    add("\n## Where the app's round goes (seconds per steady-state round)\n")
    add("Plain-loop parts from the 1-thread loop. \"Ideal 2-worker round\" = the clients' 1-thread training "
        "times handed to 2 workers (the app's 2 actors) in partition order, or largest client first (the order "
        "the app's server sends its messages in), plus aggregation and evaluation: what the app would take with "
        "zero framework cost. Whole-run columns: the plain loop's client "
        "training summed over all rounds vs Flower's own ClientApp accounting (`flwr list`: clientapp-seconds, "
        "every message from the worker thread's hand-off to the actor until the reply is back, round 1's actor "
        "warm-up included).\n")
    add("| method | client training (sum) | ideal 2-worker round, partition order | ideal, largest first "
        "| aggregation | evaluation | app round | app - ideal (largest first) "
        "| whole run: plain-loop client training | whole run: app ClientApp time |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in methods:
        runs = results[m].get("plain-1t", [])
        if not runs:
            continue
        spans, lpt = [], []
        for r in runs:
            rounds_ = r["client_seconds"][1:] or r["client_seconds"]
            extra = r["aggregate_s_per_round"] + r["eval_s_per_round"]
            spans.append(median([makespan(cs) for cs in rounds_]) + extra)
            lpt.append(median([makespan(sorted(cs, reverse=True)) for cs in rounds_]) + extra)
        ideal, ideal_lpt = median(spans), median(lpt)
        a = med[m]["app"]
        ca = a.get("clientapp_s_total")
        plain_train_total = median([sum(sum(cs) for cs in r["client_seconds"]) for r in runs])
        add(f"| {m} | {fmt(med[m]['plain-1t']['train_s_per_round'])} | {fmt(ideal)} | {fmt(ideal_lpt)} "
            f"| {fmt(med[m]['plain-1t']['aggregate_s_per_round'], 3)} | {fmt(med[m]['plain-1t']['eval_s_per_round'], 3)} "
            f"| {fmt(a['steady_round_s'])} | {fmt(None if a['steady_round_s'] is None else a['steady_round_s'] - ideal_lpt)} "
            f"| {fmt(plain_train_total, 1)} | {fmt(ca, 1)} |")
    add("\n## Accuracy (same work)\n")
    add("| method | " + " | ".join(VARIANTS) + " |")
    add("| --- |" + " --- |" * len(VARIANTS))
    for m in methods:
        cells = []
        for v in VARIANTS:
            runs = results[m].get(v, [])
            cells.append("n/a" if not runs else " / ".join(f"{100 * r['accuracy'][-1]:.2f}" for r in runs))
        add(f"| {m} | " + " | ".join(cells) + " |")
    add("\n(final-round test accuracy in %, one figure per repetition)")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def machine_line() -> str:
    import platform

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    import torch

    return (f"machine: {os.cpu_count()} CPUs ({cpu}){mem}, Python {platform.python_version()}, "
            f"torch {torch.__version__}, flwr {_flwr_version()}")


def _flwr_version() -> str:
    try:
        from importlib.metadata import version

        return version("flwr")
    except Exception:  # noqa: BLE001
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/bench_round.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--methods", default="fedavg,fedvls")
    parser.add_argument("--quick", action="store_true", help="3 rounds x 1 local epoch, 1 repetition (a plumbing check)")
    parser.add_argument("--dataset", default="mnist10k")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR), help="default: <project>/../shared/data")
    parser.add_argument("--model", default="auto", help="the app's model key (auto, mlp, cnn, ...)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dirichlet-beta", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {','.join(VARIANTS + EXTRA_VARIANTS)} (app-polled: the app "
                             "while `flwr list` is polled every second, as LocalSuperLink.wait does)")
    parser.add_argument("--output-dir", help="where bench.json / bench.md go (default: a new temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per app run")
    parser.add_argument("--no-memory", action="store_true", help="do not sample the app's process tree")
    parser.add_argument("--profile", action="store_true", help="py-spy one extra app run per method + cProfile train_round")
    parser.add_argument("--py-spy", default=shutil.which("py-spy"), help="path of py-spy (for --profile)")
    parser.add_argument("--py-spy-seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.reps, args.local_epochs = 3, 1, 1
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS) - set(EXTRA_VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS + EXTRA_VARIANTS}")

    out_dir = Path(args.output_dir or tempfile.mkdtemp(prefix="fedvls-bench-")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fedvls-bench-work-"))
    base = RefConfig.make(
        dataset=args.dataset, data_dir=str(Path(args.data_dir).expanduser().resolve()), num_clients=args.clients,
        num_server_rounds=args.rounds, local_epochs=args.local_epochs, batch_size=args.batch_size,
        dirichlet_beta=args.dirichlet_beta, seed=args.seed, model=args.model,
    )
    meta = {
        "workload": (f"workload: {args.dataset} ({model_name(base.run)}), {args.clients} clients, "
                     f"Dirichlet {args.dirichlet_beta}, "
                     f"{args.local_epochs} local epochs, batch {args.batch_size}, {args.rounds} rounds, seed {args.seed}, "
                     f"SGD lr {base.lr} momentum {base.momentum} weight decay {base.weight_decay}"),
        "machine": machine_line(),
        "rounds": args.rounds,
        "reps": args.reps,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    log(f"{meta['workload']}; results in {out_dir}")
    results: dict[str, dict[str, list[dict]]] = {m: {v: [] for v in variants} for m in methods}
    profiles: dict[str, Any] = {}
    link = None
    try:
        if any(v.startswith("app") for v in variants) or args.profile:
            link = LocalSuperLink(work / "flwr-home").start()
        for rep in range(1, args.reps + 1):
            for m in methods:
                cfg = base.replace(method=m)
                for v in variants:
                    t0 = time.perf_counter()
                    if v.startswith("app"):
                        res = run_app(link, cfg, work / "runs", f"{m}-{v}-rep{rep}", timeout=args.timeout,
                                      memory=not args.no_memory, poll_flwr_ls=1.0 if v == "app-polled" else 0.0)
                    else:
                        threads = 2 if v.endswith("2t") else 1
                        loader = "dataloader" if v.startswith("dataloader") else "index"
                        res = run_plain(cfg.replace(threads=threads, loader=loader), work, f"{m}-{v}-rep{rep}")
                    results[m][v].append(res)
                    log(f"rep {rep} {m:8s} {v:14s} steady {res['steady_round_s']:.3f} s/round, "
                        f"start-up {fmt(res['startup_s'], 1)} s, total {res['total_s']:.1f} s, "
                        f"final accuracy {res['accuracy'][-1]:.4f}  ({time.perf_counter() - t0:.0f}s)")
        if args.profile:
            for m in methods:
                cfg = base.replace(method=m)
                log(f"profiling {m}: cProfile of train_round in-process")
                prof = profile_client_round(cfg)
                if args.py_spy:
                    raw = out_dir / f"py-spy-{m}.txt"
                    log(f"profiling {m}: py-spy on an extra app run ({args.py_spy_seconds:.0f}s from round 2)")
                    extra = run_app(link, cfg, work / "runs", f"{m}-profile", timeout=args.timeout, memory=False,
                                    py_spy=args.py_spy, py_spy_seconds=args.py_spy_seconds, py_spy_out=raw)
                    prof["py_spy_run_steady_round_s"] = extra["steady_round_s"]
                    if raw.exists():
                        prof["py_spy"] = categorize_py_spy(raw)
                profiles[m] = prof
    finally:
        if link is not None:
            link.stop()
    table = build_tables(results, meta)
    if profiles:
        table += "\n## Profiles\n"
        for m, prof in profiles.items():
            table += (f"\n### {m}\n\nClientApp body (`train_round`) in-process, all {args.clients} clients: "
                      f"{prof['train_round_s_sum']:.2f} s (per client: "
                      + ", ".join(f"{t:.2f}" for t in prof["train_round_s"])
                      + f"); pickle round trip of train message + reply: {1000 * prof['pickle_roundtrip_s_per_client']:.2f} ms "
                      f"per client ({prof['message_bytes'] / 1e6:.2f} MB in, {prof['reply_bytes'] / 1e6:.2f} MB out).\n")
            if "py_spy" in prof:
                table += (f"\npy-spy at 100 Hz over the simulation process and its children: "
                          f"{prof['py_spy']['samples']} samples with a Python stack "
                          f"({prof['py_spy']['native_only_samples']} more with none, left out); that run's steady round: "
                          f"{prof['py_spy_run_steady_round_s']:.2f} s\n\n| where | share of samples |\n| --- | --- |\n")
                for k, v in prof["py_spy"]["share"].items():
                    table += f"| {k} | {100 * v:.1f}% |\n"
            table += (f"\n<details><summary>cProfile, biggest client</summary>\n\n```\n"
                      f"{prof['cprofile_biggest_client']}\n```\n</details>\n")
    (out_dir / "bench.md").write_text(table)
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "results": results, "profiles": profiles}, indent=1))
    print(table)
    log(f"wrote {out_dir / 'bench.md'} and {out_dir / 'bench.json'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
