"""The client's step on a GPU: CUDA graphs, the augmentation's cost, amp and channels-last, by measurement.

    python bench/gpu_step.py --out gpu-step.json                  # on a GPU (about 2 minutes on an H100)
    python bench/gpu_step.py --quick --no-round --out step.json   # shorter, without the engine round
    python bench/gpu_step.py --cpu --out /tmp/gpu-step.json       # rehearsal on a CPU: tiny sizes

What it measures, on CIFAR-shaped uint8 data (3x32x32, 10 classes) for ResNet-18 and MobileNetV2
with the app's training transform (crop + flip + AutoAugment + normalise), and on MNIST-shaped
normalised data (1x28x28) for the FedLC paper's CNN and the paper's MLP (no augmentation):

* the app's client (``train_local``: FedAvg, batch 64, momentum SGD, one local epoch over
  ``--images`` images held on the CPU as a client's data are, copied to the GPU each round)
  in images per second: launched op by op (``cuda-graphs = false``) and as CUDA graphs, the
  latter also with bfloat16 autocast (``amp``), channels-last and both; each timed round
  follows a round that warmed the process up (the graphs captured, cuDNN's choices made);
* FedVLS against FedAvg, graphed (ResNet-18; a client holding 3 of the 10 classes, so the
  teacher's forward pass and all three terms run): the time ratio of their rounds;
* the augmentation of a batch of 64 on the GPU, ms: the grouped path with its draws on the
  CPU (what the app ran before), the fixed-shape path with its draws on the GPU, launched op
  by op and replayed as a graph, crop + flip only, normalise only;
* a round of 4 clients (ResNet-18, CIFAR-format files, 1 local epoch) on the in-process engine
  (``fedvls run``) against the same 4 clients' ``train_local`` time (needs flwr; ``--no-round``
  skips it, and it is skipped, saying so, where flwr cannot be imported).

``--cpu`` runs everything small on the CPU (no graphs: the graphed variants run the same
static-buffer path eagerly), to check the script. Prints one table at the end and writes every
figure as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fedvls_flwr.algorithms import graphed  # noqa: E402
from fedvls_flwr.algorithms.downlink import Received  # noqa: E402
from fedvls_flwr.algorithms.parts import ClientState  # noqa: E402
from fedvls_flwr.algorithms.training import train_local  # noqa: E402
from fedvls_flwr.config.run_config import RunConfig, parse_run_config  # noqa: E402
from fedvls_flwr.data.augment import make_batch_transform, random_crop_flip_fixed  # noqa: E402
from fedvls_flwr.data.node_data import ClientData  # noqa: E402
from fedvls_flwr.models import build_model  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
#: model -> (input shape, augmented uint8 images?)
MODELS = {"resnet18": ((3, 32, 32), True), "mobilenetv2": ((3, 32, 32), True),
          "cnn": ((1, 28, 28), False), "mlp": ((1, 28, 28), False)}
#: the variants of the client measured per model: (label, run-config settings)
VARIANTS = (("eager", {"cuda-graphs": False, "amp": "false", "channels-last": "false"}),
            ("graphed", {"cuda-graphs": True, "amp": "false", "channels-last": "false"}),
            ("graphed + amp", {"cuda-graphs": True, "amp": "true", "channels-last": "false"}),
            ("graphed + channels-last", {"cuda-graphs": True, "amp": "false", "channels-last": "true"}),
            ("graphed + amp + channels-last", {"cuda-graphs": True, "amp": "true", "channels-last": "true"}))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def client_data(model: str, n: int, classes: tuple[int, ...] = tuple(range(10)), size: int | None = None) -> ClientData:
    shape, images = MODELS[model]
    if size is not None:
        shape = (shape[0], size, size)
    g = torch.Generator().manual_seed(0)
    y = torch.tensor(classes)[torch.randint(len(classes), (n,), generator=g)]
    if images:
        x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
        return ClientData(x, y, 10, MEAN, STD)
    return ClientData(torch.randn(n, *shape, generator=g), y, 10, None, None)


def config(model: str, device: torch.device, **settings: Any) -> RunConfig:
    dataset = "cifar10" if MODELS[model][1] else "fmnist"
    return parse_run_config({"dataset": dataset, "model": model, "batch-size": 64, "local-epochs": 1,
                             "lr": 0.01, "device": device.type, "method": "fedavg", **settings})


def client_round_seconds(model_name: str, data: ClientData, cfg: RunConfig, device: torch.device,
                         reps: int) -> float:
    """Seconds of the fastest of ``reps`` rounds of one client after a warm-up round (the same
    kept trainer, a new model loaded with the same weights every round)."""
    torch.manual_seed(0)
    start = build_model(model_name, tuple(data.x.shape[1:]), 10).state_dict()

    def one_round() -> float:
        model = build_model(model_name, tuple(data.x.shape[1:]), 10)
        model.load_state_dict(start)
        sync(device)
        t0 = time.perf_counter()
        if device.type == "cpu" and cfg.cuda_graphs:  # the rehearsal: the graphed path's static buffers, eagerly
            graphed.train_graphed(model, data, cfg, device=device, generator=torch.Generator().manual_seed(1),
                                  state=ClientState(), received=Received(), capture=False)
        else:
            train_local(model, data, cfg, device=device, generator=torch.Generator().manual_seed(1))
        sync(device)
        return time.perf_counter() - t0

    one_round()  # warm-up: graphs captured, kernels chosen
    return min(one_round() for _ in range(reps))


def per_batch_ms(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median milliseconds of ``fn`` over 5 timings of ``reps`` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / reps * 1e3)
    return statistics.median(times)


def augmentation(device: torch.device, batch: int, reps: int) -> dict[str, float]:
    """ms per batch of the training transform, old and new (see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)
    cpu_draws = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(0))
    out = {"grouped, CPU draws (before)": per_batch_ms(lambda: cpu_draws(x), device, reps)}
    gen = torch.Generator(device=device).manual_seed(0)
    fixed = make_batch_transform(MEAN, STD, train=True, augment=True, generator=gen)
    if not fixed.on_device:  # the CPU rehearsal: the fixed-shape kernels on CPU draws
        aa = fixed._aa
        assert aa is not None

        def fixed_on_cpu() -> torch.Tensor:
            y = random_crop_flip_fixed(x, 4, True, gen)
            return aa.apply_fixed(y, *aa.sample_fixed(batch, gen))

        out["fixed shapes, device draws, eager"] = per_batch_ms(fixed_on_cpu, device, reps)
    else:
        out["fixed shapes, device draws, eager"] = per_batch_ms(lambda: fixed(x), device, reps)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(gen)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fixed(x)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            fixed(x)
        out["fixed shapes, in a CUDA graph"] = per_batch_ms(graph.replay, device, reps)
    out["crop + flip only"] = per_batch_ms(lambda: random_crop_flip_fixed(x, 4, True, gen), device, reps)
    plain = make_batch_transform(MEAN, STD, train=False, augment=False)
    out["normalise only"] = per_batch_ms(lambda: plain(x), device, reps)
    return out


def engine_round(device: torch.device, images_per_batch: int, work: Path) -> dict[str, Any]:
    """A round of 4 clients on the in-process engine against their own training time."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        return {"skipped": "flwr is not installed here: the in-process engine needs it"}
    from bench.cifar_shim import cifar_env
    from fedvls_flwr.app.results import read_rounds
    from fedvls_flwr.data.node_data import node_client_data
    from fedvls_flwr.ops.inprocess import run_in_process
    from tests.tiny_data import write_tiny_cifar10

    sums = write_tiny_cifar10(work / "data", per_batch=images_per_batch, n_test=images_per_batch)
    # generated files: this process and the client workers it starts accept their md5 sums
    os.environ.update(cifar_env(work / "shim", sums))
    settings = {"dataset": "cifar10", "model": "resnet18", "data-dir": str(work / "data"), "method": "fedavg",
                "num-server-rounds": 3, "local-epochs": 1, "partition": "dirichlet", "dirichlet-beta": 0.5,
                "min-nodes": 4, "device": device.type, "output-dir": str(work / "runs"), "run-name": "round"}
    # in turn: the round against its clients' summed training; on CUDA each client has the GPU
    # (client-resources-num-gpus 0, the default, gives the clients none, and the run is refused)
    run_in_process(settings, 4, client_cpus=1, client_gpus=1.0 if device.type == "cuda" else 0.0, workers=1)
    rounds = read_rounds(work / "runs" / "round")[1:]
    steady = statistics.median(r["seconds"] for r in rounds[1:])
    cfg = parse_run_config(settings)
    train_s = 0.0
    for partition in range(4):
        data = node_client_data(cfg, {"partition-id": partition, "num-partitions": 4})
        train_s += client_round_seconds("resnet18", data, cfg, device, reps=1)
    return {"round_s": steady, "clients_training_s": train_s, "ratio": steady / train_s,
            "images": 5 * images_per_batch}


def save(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


def table(results: dict[str, Any]) -> str:
    models = [m for m in MODELS if m in results["clients"]]
    lines = [f"| measurement ({results['device']}) | " + " | ".join(models) + " |",
             "| --- |" + " ---: |" * len(models)]
    for label, _ in VARIANTS:
        cells = []
        for m in models:
            v = results["clients"][m].get(label)
            failed = v is not None and v.get("captures", {}).get("failed", 0) > 0
            cells.append("-" if v is None else f"{v['images_per_s']:,.0f}" + (" (capture failed: eager)" if failed else ""))
        lines.append(f"| img/s, {label} | " + " | ".join(cells) + " |")
    speed = [results["clients"][m]["graphed"]["images_per_s"] / results["clients"][m]["eager"]["images_per_s"]
             for m in models]
    lines.append("| graphed / eager (speed) | " + " | ".join(f"{s:.2f}x" for s in speed) + " |")
    ratio = results.get("fedvls_over_fedavg")
    if ratio:
        lines.append("| FedVLS / FedAvg round time, graphed (eager) | " + " | ".join(
            f"{ratio['graphed']:.2f}x ({ratio['eager']:.2f}x)" if m == ratio["model"] else "-" for m in models) + " |")
    for label, ms in results["augmentation_ms"].items():
        lines.append(f"| augmentation ms / batch of {results['batch']}: {label} | "
                     + " | ".join(f"{ms:.3f}" if i == 0 else "-" for i in range(len(models))) + " |")
    rnd = results.get("round", {})
    if "ratio" in rnd:
        lines.append(f"| in-process round of 4 clients / their training (s) | {rnd['ratio']:.2f}x "
                     f"({rnd['round_s']:.2f} / {rnd['clients_training_s']:.2f})" + " | -" * (len(models) - 1) + " |")
    elif rnd:
        lines.append(f"| in-process round | not measured: {rnd['skipped']} |" + " - |" * (len(models) - 1))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="write every figure here (JSON)")
    ap.add_argument("--cpu", action="store_true", help="rehearsal on the CPU: tiny sizes, no graphs")
    ap.add_argument("--quick", action="store_true", help="fewer images and repetitions")
    ap.add_argument("--no-round", action="store_true", help="skip the in-process engine's round (needs flwr)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--images", type=int, default=None, help="images per client round (default 5120, quick 2048)")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("torch sees no CUDA device: nothing to measure here (--cpu rehearses the script)")
        return 2
    device = torch.device("cpu" if args.cpu else "cuda")
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    images = args.images or (128 if args.cpu else 2048 if args.quick else 5120)
    reps = 1 if args.cpu or args.quick else 2
    size = 16 if args.cpu else None  # CPU rehearsal: smaller CIFAR-shaped images
    t_start = time.perf_counter()
    results: dict[str, Any] = {
        "device": "CPU (--cpu rehearsal)" if args.cpu else torch.cuda.get_device_name(0),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "host": platform.node(),
        "images": images, "batch": 64, "quick": args.quick, "clients": {},
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    for m in models:
        data = client_data(m, images, size=size if MODELS[m][1] else None)
        results["clients"][m] = {}
        for label, settings in VARIANTS:
            conv = m != "mlp"
            if not conv and ("amp" in label or "channels" in label):
                continue  # the MLP: amp measured, channels-last means nothing
            if args.cpu and label not in ("eager", "graphed"):
                continue  # amp and channels-last are CUDA-only
            before = graphed.capture_counts()
            seconds = client_round_seconds(m, data, config(m, device, **settings), device, reps)
            after = graphed.capture_counts()
            captures = {k: after[k] - before[k] for k in after}  # on CUDA a graphed variant that captured nothing ran eagerly
            results["clients"][m][label] = {"seconds": seconds, "images_per_s": images / seconds, "captures": captures}
            print(json.dumps({"model": m, "variant": label, "images_per_s": round(images / seconds, 1),
                              "captures": captures}), flush=True)
        graphed.clear_trainers()
    if "resnet18" in models:
        vacant = client_data("resnet18", images, classes=(0, 1, 2), size=size)
        ratio: dict[str, Any] = {"model": "resnet18"}
        for label, graphs in (("graphed", True), ("eager", False)):
            base = {"cuda-graphs": graphs, "amp": "false", "channels-last": "false"}
            t_avg = client_round_seconds("resnet18", vacant, config("resnet18", device, **base), device, reps)
            t_vls = client_round_seconds("resnet18", vacant, config("resnet18", device, method="fedvls", **base),
                                         device, reps)
            ratio[label] = t_vls / t_avg
        results["fedvls_over_fedavg"] = ratio
        print(json.dumps({"fedvls_over_fedavg": ratio}), flush=True)
        graphed.clear_trainers()
    results["augmentation_ms"] = augmentation(device, 64, 5 if args.cpu else 50)
    print(json.dumps({"augmentation_ms": results["augmentation_ms"]}), flush=True)
    if not args.no_round:
        save(results, args.out)  # what was measured so far, whatever the round does
        with tempfile.TemporaryDirectory(prefix="gpu-step-") as work:
            try:
                results["round"] = engine_round(device, 40 if args.cpu else 1000, Path(work))
            except Exception as err:  # noqa: BLE001 - the tables above are measured: they are still written
                traceback.print_exc()
                results["round"] = {"skipped": f"the round failed: {type(err).__name__}: {err}", "failed": True}
        print(json.dumps({"round": results["round"]}), flush=True)
    results["seconds"] = time.perf_counter() - t_start
    save(results, args.out)
    print()
    print(table(results))
    print(f"\n{results['seconds']:.0f} s; every figure in {args.out}")
    return 1 if results.get("round", {}).get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
