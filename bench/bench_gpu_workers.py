"""The in-process engine's client workers on a GPU: a round's clients at once against one worker
and against Flower's Ray simulation, on the same machine, in one invocation.

    python bench/bench_gpu_workers.py --out gpu-workers.json             # a machine with CUDA (~2-3 min on an H100)
    python bench/bench_gpu_workers.py --out gpu-workers.json --skip-ray  # without the Ray simulation
    python bench/bench_gpu_workers.py --cpu --out /tmp/rehearsal.json    # tiny sizes on the CPU: the script itself
    python bench/bench_gpu_workers.py --out gpu-op-by-op.json --set cuda-graphs=false  # the client step op by op

Workloads (FedAvg, 1 local epoch, batch 64, augmentation and bfloat16 amp as in
bench/gpu_check.py, CIFAR-10-format data generated with tests/tiny_data.py and read through
the project's real loader):

* MobileNetV2 and ResNet-18, 4 clients at ``client-resources-num-gpus = 0.25`` on 5,000
  training images (``train-pool-size``; bench/gpu_check.py's 5 x 1,000): a steady round
  (median of rounds 2..R, the app's own ``seconds`` of rounds.jsonl: the clients' training,
  the transfers, aggregation, the server's evaluation) on the in-process engine with its
  workers (4 on the GPU), with one worker (``workers = 1``: the clients one after another on
  the GPU), and under ``flwr run`` (a local SuperLink, the Ray simulation with 4 actors at
  0.25 GPU, one Ray head for both models);
* ResNet-18, 10 clients on one GPU at ``client-resources-num-gpus`` 0.25 and 0.1 (4 and 10
  workers) on all 25,000 generated images: training images per second in a steady round.

Training images per second = the round's training images / its seconds. Each run must have
every reply accepted and every client on CUDA (``ok``). Prints one table at the end and
writes every figure to ``--out`` (JSON). ``--budget`` seconds bound the whole script: a step
that would start after it is said as skipped, never cut off half-way.

What it expects of the machine: Python with torch (CUDA build), torchvision, flwr (and ray,
unless ``--skip-ray``) importable by ``sys.executable`` - a virtual environment or packages on
``PYTHONPATH`` (e.g. ``pip install --target``) - and, for the Ray part, Flower's console
scripts (``flower-superlink``, ``flower-superexec``, ``flwr``) beside ``sys.executable``, on
``PATH``, or in the ``bin`` folder of a ``--target`` install (found in that order). Run it from
the repository root (it imports ``fedvls_flwr`` and ``tests`` from there). No network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.budget import Budget  # noqa: E402
from bench.cifar_shim import cifar_env  # noqa: E402
from fedvls_flwr.app.results import read_rounds  # noqa: E402
from tests.tiny_data import write_tiny_cifar10  # noqa: E402


def summarize(name: str, run_dir: Path, images: int, want_cuda: bool, extra: dict[str, Any] | None = None) -> dict:
    rounds = read_rounds(run_dir)[1:]
    steady = statistics.median(r["seconds"] for r in rounds[1:]) if len(rounds) > 1 else rounds[0]["seconds"]
    devices = sorted({d for r in rounds for d in r.get("devices", {})})
    accepted = all(r["clients_accepted"] == r["clients_sampled"] and not r["failures"] for r in rounds)
    on_cuda = bool(devices) and all(d.startswith("cuda") for d in devices)
    return {"name": name, "steady_round_s": steady, "first_round_s": rounds[0]["seconds"],
            "images_per_s": images / steady, "devices": devices, "ok": accepted and (on_cuda or not want_cuda),
            "peak_gpu_mb": max((r["peak_gpu_mb"] for r in rounds if r.get("peak_gpu_mb") is not None), default=None),
            "accuracy": [r["accuracy"] for r in rounds], **(extra or {})}


def in_process(name: str, config: dict, nodes: int, gpus: float, workers: int | None, images: int,
               want_cuda: bool) -> dict:
    from fedvls_flwr.ops.inprocess import run_in_process

    t0 = time.perf_counter()
    try:
        done = run_in_process(config, nodes, client_cpus=1, client_gpus=gpus, workers=workers)
    except Exception as err:  # noqa: BLE001 - reported in the table
        return {"name": name, "ok": False, "error": f"{type(err).__name__}: {err}"}
    return summarize(name, done.run_dir, images, want_cuda,
                     {"workers": done.workers, "wall_s": time.perf_counter() - t0,
                      "transport_s": done.extra.get("transport_seconds")})


def with_ray(link: Any, name: str, config: dict, nodes: int, gpus: float, images: int, want_cuda: bool,
             timeout: float) -> dict:
    t0 = time.perf_counter()
    outcome = link.wait(link.submit(run_config=config, federation_config={
        "num-supernodes": nodes, "client-resources-num-cpus": 1, "client-resources-num-gpus": gpus}), timeout=timeout)
    if not outcome.completed:
        return {"name": name, "ok": False, "error": outcome.status, "log": outcome.log[-2000:]}
    return summarize(name, Path(config["output-dir"]) / config["run-name"], images, want_cuda,
                     {"workers": f"Ray: {nodes} clients at {gpus:g} GPU", "wall_s": time.perf_counter() - t0})


def table(results: list[dict], device: str, machine: str | None = None, cores: int | None = None) -> str:
    """The table of ``results`` measured on ``device`` (host ``machine`` with ``cores``: this one's by default)."""
    machine, cores = machine or platform.node(), cores or os.cpu_count()
    lines = [f"GPU workers bench on {device} ({machine}, {cores} cores); steady round = median "
             "of rounds 2..R", "",
             "| workload | engine | steady s/round | training img/s | vs Ray | vs 1 worker | workers | ok |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    by = {(r.get("workload"), r.get("engine")): r for r in results}
    for r in results:
        if "steady_round_s" not in r:
            lines.append(f"| {r.get('workload')} | {r.get('engine')} | - | - | - | - | {r.get('error', '')[:80]} | False |")
            continue
        ray, one = by.get((r["workload"], "Ray simulation")), by.get((r["workload"], "in-process, 1 worker"))
        vs_ray = f"{r['steady_round_s'] / ray['steady_round_s']:.2f}x" if ray and "steady_round_s" in ray else "-"
        vs_one = f"{r['steady_round_s'] / one['steady_round_s']:.2f}x" if one and "steady_round_s" in one else "-"
        lines.append(f"| {r['workload']} | {r['engine']} | {r['steady_round_s']:.3f} | {r['images_per_s']:,.0f} | "
                     f"{vs_ray} | {vs_one} | {r.get('workers', '')} | {r['ok']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="no GPU: tiny sizes on the CPU, to rehearse the script")
    ap.add_argument("--skip-ray", action="store_true", help="leave out the Ray simulation")
    ap.add_argument("--rounds", type=int, help="rounds per run (default: 3; --cpu: 2)")
    ap.add_argument("--budget", type=float, help="seconds for the whole script (default: 170; --cpu: 900)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per Ray run (at most what the budget has left)")
    ap.add_argument("--out", type=Path, help="every figure as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the generated data and run folders")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a run-config setting for every run, e.g. cuda-graphs=false (the client step op by op, "
                         "without CUDA graphs); repeatable")
    args = ap.parse_args()
    from fedvls_flwr.config.args import parse_run_config_args

    settings = parse_run_config_args([" ".join(args.set)]) if args.set else {}
    args.rounds = args.rounds or (2 if args.cpu else 3)
    budget = Budget(args.budget or (900.0 if args.cpu else 170.0))
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device visible to torch: use --cpu to rehearse the script")
        return 2
    want_cuda = not args.cpu
    device = "CPU (--cpu rehearsal)" if args.cpu else torch.cuda.get_device_name(0)
    work = Path(tempfile.mkdtemp(prefix="fedvls-gpu-workers-"))
    try:  # the work folder goes whatever happens (--keep: it stays, named)
        out, data = work / "runs", work / "data"
        per_batch, pool4 = (16, 40) if args.cpu else (5000, 5000)  # 5 training batches; the 4-client runs' subsample
        os.environ.update(cifar_env(work / "shim", write_tiny_cifar10(data, per_batch=per_batch,
                                                                      n_test=20 if args.cpu else 1000)))
        gpus4, gpus10 = (0.0, (0.0,)) if args.cpu else (0.25, (0.25, 0.1))
        base = {"dataset": "cifar10", "data-dir": str(data), "method": "fedavg", "local-epochs": 1,
                "batch-size": 8 if args.cpu else 64,
                "augment": True, "amp": not args.cpu, "partition": "iid" if args.cpu else "dirichlet", "dirichlet-beta": 0.5,
                "num-server-rounds": args.rounds, "device": "cpu" if args.cpu else "cuda", "output-dir": str(out),
                **settings}
        if settings:
            device += "; every run with " + ", ".join(f"{k}={v}" for k, v in settings.items())
        four = {**base, "train-pool-size": pool4}
        models = ["mobilenetv2", "resnet18"]
        results: list[dict] = []

        def record(res: dict, workload: str, engine: str) -> None:
            res.update(workload=workload, engine=engine)
            results.append(res)
            print(json.dumps(res), flush=True)
            if args.out:  # after every row: a step cut off by its time limit keeps what it measured
                args.out.write_text(json.dumps({"device": device, "machine": platform.node(), "cores": os.cpu_count(),
                                                "rounds": args.rounds, "settings": settings, "results": results},
                                               indent=1))

        def four_clients(model: str) -> str:
            return f"{model}, 4 clients at {gpus4:g} GPU, {pool4:,} images"

        # the workers first (one pool of 4 for the 4-client runs and the 10 clients at 0.25), then one worker
        for model in models:
            if budget.allows(f"in-process workers, {model}", 25):
                record(in_process(four_clients(model), {**four, "model": model, "run-name": f"{model}-workers"}, 4, gpus4,
                                  None, pool4, want_cuda), four_clients(model), "in-process, workers")
        for share in gpus10:
            workload = f"resnet18, 10 clients at {share:g} GPU, {5 * per_batch:,} images"
            if budget.allows(f"in-process workers, {workload}", 35):
                record(in_process(workload, {**base, "model": "resnet18", "run-name": f"resnet18-10-{share:g}"}, 10,
                                  share, None, 5 * per_batch, want_cuda), workload, "in-process, workers")
        for model in models:
            if budget.allows(f"in-process 1 worker, {model}", 30):
                record(in_process(four_clients(model), {**four, "model": model, "run-name": f"{model}-one"}, 4, gpus4,
                                  1, pool4, want_cuda), four_clients(model), "in-process, 1 worker")
        from fedvls_flwr.ops.inprocess import close_kept_pool

        close_kept_pool()  # the GPU to Ray
        if not args.skip_ray and budget.allows("Ray simulations", 60):
            from fedvls_flwr.ops.flower_cli import flower_env
            from fedvls_flwr.ops.launch import LocalSuperLink
            from fedvls_flwr.ops.ray_cluster import RayHead

            env = {k: os.environ[k] for k in ("FEDVLS_BENCH_CIFAR_MD5", "PYTHONPATH")}
            home = work / "flwr-home"  # one SuperLink; one Ray head on 127.0.0.1 that both runs join
            with RayHead(env=flower_env(home, **env)) as head, \
                    LocalSuperLink(home, env_extra={**env, "RAY_ADDRESS": head.address}) as link:
                for model in models:
                    if budget.allows(f"Ray simulation, {model}", 30):
                        record(with_ray(link, four_clients(model), {**four, "model": model, "run-name": f"{model}-ray"},
                                        4, gpus4, pool4, want_cuda, min(args.timeout, budget.left())),
                               four_clients(model), "Ray simulation")
        print()
        print(table(results, device))
        return 0 if results and all(r.get("ok") for r in results) else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"\nkept: {work}")


if __name__ == "__main__":
    raise SystemExit(main())
