"""bench/bench_round.py's report: the tables of bench.md (the figures as medians over the
repetitions), the profiles' section, and the machine line."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from bench.round_timing import median
from bench.round_workloads import EXTRA_VARIANTS, VARIANTS

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


def profile_tables(profiles: dict[str, Any], clients: int) -> str:
    """The "Profiles" section of bench.md (empty without profiles)."""
    table = ""
    if profiles:
        table += "\n## Profiles\n"
        for m, prof in profiles.items():
            table += (f"\n### {m}\n\nClientApp body (`train_round`) in-process, all {clients} clients: "
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
    return table


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

