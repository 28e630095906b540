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
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_DIR))

from bench.reference_loop import DEFAULT_DATA_DIR, RefConfig  # noqa: E402
from bench.round_report import build_tables, fmt, machine_line, profile_tables  # noqa: E402
from bench.round_timing import categorize_py_spy, log  # noqa: E402
from bench.round_workloads import EXTRA_VARIANTS, VARIANTS, profile_client_round, run_app, run_plain  # noqa: E402
from fedvls_flwr.ops.launch import LocalSuperLink  # noqa: E402


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
        "workload": (f"workload: {args.dataset} ({base.model_name}), {args.clients} clients, "
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
        shutil.rmtree(work, ignore_errors=True)  # the runs: the tables in out_dir are the results
    table = build_tables(results, meta) + profile_tables(profiles, args.clients)
    (out_dir / "bench.md").write_text(table)
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "results": results, "profiles": profiles}, indent=1))
    print(table)
    log(f"wrote {out_dir / 'bench.md'} and {out_dir / 'bench.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
