"""The GPU path end to end, in real Flower runs and on the in-process engine, with one summary.

    python bench/gpu_check.py            # on a machine with CUDA (bench/gpu_check.sh runs it)
    python bench/gpu_check.py --cpu      # the same plumbing on the CPU, small, to check the script

On generated data read through the project's real loaders (no download):

* MobileNetV2 on CIFAR-10-format data (5 x 1,000 training images, augmentation on), 4
  simulated clients in Flower's Ray simulation (``flwr run``; one Ray head for both runs),
  FedAvg and FedVLS, ``--rounds`` rounds each: each client asks Ray for a quarter of the GPU
  (``client-resources-num-gpus = 0.25``), so four train at once on one GPU;
* the FedLC paper's CNN on Fashion-MNIST-format IDX files (12,000 training images), 4
  simulated clients on the in-process engine (``fedvls run``: the apps in one process, on
  the GPU), FedAvg and FedVLS, and the same work in the plain PyTorch loop
  (``bench/reference_loop.py``) on the same GPU: the FedVLS / FedAvg round ratio of the app
  next to the plain loop's, and the in-process round against the plain loop's;
* a real deployment: SuperLink and 2 SuperNodes on 127.0.0.1 (``fedvls deploy local``),
  2 rounds of the CNN with ``device = "cuda"``.

Every run must have every reply accepted and every client on CUDA (the device each reply
names); the summary gives the steady seconds per round (median of rounds 2..R), training
images per second, the largest peak GPU memory a client reported, and the ratios.
``--budget`` seconds (default 230: one GPU lease of 4 minutes with room for the unit tests)
bound the whole script: a step that would start after the budget is said as skipped, never
cut off half-way.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.budget import Budget  # noqa: E402
from bench.cifar_shim import cifar_env  # noqa: E402
from fedvls_flwr.app.results import read_rounds  # noqa: E402
from fedvls_flwr.ops.flower_cli import flower_env  # noqa: E402
from fedvls_flwr.ops.launch import LocalSuperLink  # noqa: E402
from fedvls_flwr.ops.ray_cluster import RayHead  # noqa: E402
from tests.tiny_data import write_idx_dataset, write_tiny_cifar10  # noqa: E402


def summarize_rounds(name: str, status: str, rounds: list[dict], want_cuda: bool) -> dict:
    """The figures of one run's rounds.jsonl (round 0 excluded)."""
    accepted = all(r["clients_accepted"] == r["clients_sampled"] and not r["failures"] for r in rounds)
    devices = sorted({d for r in rounds for d in r.get("devices", {})})
    on_cuda = bool(devices) and all(d.startswith("cuda") for d in devices)
    steady = statistics.median(r["seconds"] for r in rounds[1:]) if len(rounds) > 1 else rounds[0]["seconds"]
    peaks = [r["peak_gpu_mb"] for r in rounds if r.get("peak_gpu_mb") is not None]
    return {"name": name, "status": status, "steady_round_s": steady, "first_round_s": rounds[0]["seconds"],
            "accuracy": rounds[-1]["accuracy"], "all_replies_accepted": accepted, "devices": devices,
            "ok": accepted and (on_cuda or not want_cuda), "peak_gpu_mb": max(peaks, default=None)}


def run_workload(link, name, run_config, federation, out, timeout, want_cuda) -> dict:
    outcome = link.wait(link.submit(run_config=run_config, federation_config=federation), timeout=timeout)
    if not outcome.completed:
        return {"name": name, "status": outcome.status, "ok": False, "log": outcome.log[-2000:]}
    return summarize_rounds(name, outcome.status, read_rounds(out / run_config["run-name"])[1:], want_cuda)


def in_process(name: str, run_config: dict, out: Path, want_cuda: bool) -> dict:
    """The same apps on the in-process engine (``fedvls run``), 4 nodes, each client a quarter
    of the GPU (its client workers: 4 on the GPU; none asked for, they would see no GPU)."""
    from fedvls_flwr.ops.inprocess import run_in_process

    try:
        run_in_process(run_config, 4, client_cpus=1, client_gpus=0.25 if want_cuda else 0.0)
    except Exception as err:  # noqa: BLE001 - reported in the summary
        return {"name": name, "status": f"failed: {err}", "ok": False}
    return summarize_rounds(name, "completed", read_rounds(out / run_config["run-name"])[1:], want_cuda)


def plain_loop(settings: dict, rounds: int) -> float:
    """Steady seconds per round of the plain PyTorch loop doing the same work in one process."""
    from bench.reference_loop import RefConfig, run

    res = run(RefConfig.make(num_clients=4, threads=0, **{**settings, "num-server-rounds": rounds}))
    return statistics.median(r["seconds"] for r in res["rounds"][2:]) if rounds > 1 else res["rounds"][1]["seconds"]


def deployment_round(run_config: dict, work: Path, timeout: float, want_cuda: bool) -> dict:
    """``fedvls deploy local``: a SuperLink and 2 SuperNodes on 127.0.0.1, plain TCP (the
    fence and TLS are checked by the test suite), 2 rounds."""
    cmd = [sys.executable, "-m", "fedvls_flwr", "deploy", "local", "--nodes", "2", "--insecure", "--no-fence",
           "--workdir", str(work / "deploy"), "--timeout", str(timeout),
           "--run-config", " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120)
    run_dir = Path(run_config["output-dir"]) / run_config["run-name"]
    if proc.returncode != 0 or not (run_dir / "rounds.jsonl").exists():
        return {"name": "deployment, 2 SuperNodes", "status": f"exit {proc.returncode}", "ok": False,
                "log": (proc.stdout + proc.stderr)[-2000:]}
    return summarize_rounds("deployment, 2 SuperNodes, cnn / fmnist-format, fedvls", "finished:completed",
                            read_rounds(run_dir)[1:], want_cuda)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="no GPU: small sizes, to check the script itself")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--budget", type=float, default=230.0, help="seconds for the whole script (default: %(default)g)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data and run folders")
    ap.add_argument("--skip-deployment", action="store_true")
    args = ap.parse_args()
    budget = Budget(args.budget)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing to check on a GPU (use --cpu to check the script)")
        return 2
    want_cuda = not args.cpu
    work = Path(tempfile.mkdtemp(prefix="fedvls-gpu-check-"))
    try:  # the work folder goes whatever happens (--keep: it stays, named)
        data, out = work / "data", work / "runs"
        per_batch = 50 if args.cpu else 1000
        sums = write_tiny_cifar10(data, per_batch=per_batch, n_test=200 if args.cpu else 1000)
        n_fmnist = 800 if args.cpu else 12000
        write_idx_dataset(data / "FashionMNIST" / "raw", n_train=n_fmnist, n_test=400 if args.cpu else 2000)
        env = cifar_env(work / "shim", sums)  # every process accepts the generated CIFAR files
        federation = {"num-supernodes": 4, "client-resources-num-cpus": 1,
                      "client-resources-num-gpus": 0 if args.cpu else 0.25}
        base = {"data-dir": str(data), "output-dir": str(out), "num-server-rounds": args.rounds, "local-epochs": 1,
                "partition": "dirichlet", "dirichlet-beta": 0.5, "device": "cpu" if args.cpu else "cuda",
                "amp": not args.cpu, "min-nodes": 4}
        results = []
        mobilenet = {"dataset": "cifar10", "model": "mobilenetv2", "augment": True}
        home = work / "flwr-home"
        if budget.allows("Ray simulations (MobileNetV2)", 60):
            with RayHead(env={**flower_env(home), **env}) as head, \
                    LocalSuperLink(home, env_extra={**env, "RAY_ADDRESS": head.address}) as link:
                for method in ("fedavg", "fedvls"):
                    if not budget.allows(f"Ray simulation, mobilenetv2, {method}", 30):
                        continue
                    res = run_workload(link, f"mobilenetv2 / cifar10-format, {method} (Ray simulation)",
                                       {**base, **mobilenet, "method": method, "run-name": f"mobilenetv2-{method}"},
                                       federation, out, args.timeout, want_cuda)
                    res["images_per_s"] = 5 * per_batch / res["steady_round_s"] if "steady_round_s" in res else None
                    results.append(res)
                    print(json.dumps(res), flush=True)
        cnn = {k: v for k, v in base.items() if k not in ("output-dir", "min-nodes")} | {"dataset": "fmnist", "model": "cnn"}
        os.environ.update(env)  # the in-process engine reads the generated data in this process
        for method in ("fedavg", "fedvls"):
            if not budget.allows(f"in-process, cnn, {method}", 15):
                continue
            res = in_process(f"cnn / fmnist-format, {method} (in-process engine)",
                             {**cnn, "method": method, "output-dir": str(out), "run-name": f"cnn-{method}"}, out, want_cuda)
            res["images_per_s"] = n_fmnist / res["steady_round_s"] if "steady_round_s" in res else None
            results.append(res)
            print(json.dumps(res), flush=True)
        plain = {}
        for method in ("fedavg", "fedvls"):
            if budget.allows(f"plain loop, cnn, {method}", 10):
                plain[method] = plain_loop({**cnn, "method": method, "amp": False}, args.rounds)
                print(json.dumps({"plain loop, cnn / fmnist-format": method, "steady_round_s": plain[method]}), flush=True)
        if not args.skip_deployment and budget.allows("deployment, 2 SuperNodes", 60):
            deployed = deployment_round({**cnn, "method": "fedvls", "num-server-rounds": 2, "min-nodes": 2,
                                         "output-dir": str(out), "run-name": "deployment"}, work, args.timeout, want_cuda)
            results.append(deployed)
            print(json.dumps(deployed), flush=True)

        device = "CPU (--cpu)" if args.cpu else torch.cuda.get_device_name(0)
        print(f"\nGPU check on {device}: {args.rounds} rounds, 4 simulated clients (Ray: "
              f"{federation['client-resources-num-gpus']} GPU each), 1 local epoch\n")
        print("| workload | status | steady s/round | training img/s | peak GPU MiB (a client) | clients on | ok "
              "| FedVLS / FedAvg |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for i, res in enumerate(results):
            ratio = ""
            if i in (1, 3) and "steady_round_s" in res and "steady_round_s" in results[i - 1]:
                ratio = f"{res['steady_round_s'] / results[i - 1]['steady_round_s']:.2f}x"
            if "steady_round_s" in res:
                peak = "-" if res.get("peak_gpu_mb") is None else f"{res['peak_gpu_mb']:,.0f}"
                img = "-" if res.get("images_per_s") is None else f"{res['images_per_s']:,.0f}"
                print(f"| {res['name']} | {res['status']} | {res['steady_round_s']:.2f} | {img} | {peak} "
                      f"| {', '.join(res['devices'])} | {res['ok']} | {ratio} |")
            else:
                print(f"| {res['name']} | {res['status']} | - | - | - | - | False | |")
        if len(plain) == 2:
            print(f"| plain PyTorch loop, cnn / fmnist-format, same device | - | FedAvg {plain['fedavg']:.2f}, "
                  f"FedVLS {plain['fedvls']:.2f} | - | - | {device} | - | {plain['fedvls'] / plain['fedavg']:.2f}x |")
            engine = {r["name"].split(", ")[1].split(" ")[0]: r["steady_round_s"] for r in results
                      if "in-process" in r["name"] and "steady_round_s" in r}
            for method, seconds in engine.items():
                print(f"\nin-process engine / plain loop, cnn, {method}: {seconds / plain[method]:.2f}x")
        return 0 if results and all(r.get("ok") for r in results) else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"\nkept: {work}")


if __name__ == "__main__":
    raise SystemExit(main())
