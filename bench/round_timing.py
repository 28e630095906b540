"""bench/bench_round.py's timing and memory: the steady-state round, a process tree's peak memory
sampled from /proc, and py-spy samples summed by where they were taken."""

from __future__ import annotations

import os
import statistics
import sys
import threading
from pathlib import Path
from typing import Any


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

