"""The yardstick: a plain PyTorch federated loop in one process, no Flower.

It does the same work as the app - the project's data loading
(:func:`fedvls_flwr.data.datasets.load_dataset`), partitioning
(:func:`fedvls_flwr.data.partition.partition_indices`), models
(:func:`fedvls_flwr.models.build_model`) and objectives
(:func:`fedvls_flwr.algorithms.objectives.build_objective`) - but trains and aggregates with its
own, deliberately plain loop: clients one after the other, then a sample-weighted
average, then the global model on the test set.

It reproduces the app's randomness, so that on a small configuration it reaches the
app's accuracy round for round (``tests/test_bench_equivalence.py``):

* initial model: ``torch.manual_seed(seed)`` then ``build_model`` (as the server does);
* client ``i`` in round ``r`` shuffles with a CPU ``torch.Generator`` seeded with
  ``SeedSequence([seed, r, i]).generate_state(1)[0]``, one ``randperm`` per epoch;
* a fresh SGD optimizer per client and round (momentum does not carry over);
* the teacher is a frozen copy of the received global model; when its output does not
  change from epoch to epoch (``eval`` teacher mode, or a model without BatchNorm or
  dropout) what the loss needs of it (``Objective.prepare_teacher``) is computed once
  per round (chunks of ``eval-batch-size``), otherwise on every batch;
* the per-step loss is the objective's hot path, ``Objective.loss_terms`` (the same
  computation as the app; the term bookkeeping the app does for its metrics is left out);
* aggregation: ``sum_i (n_i / sum_j n_j) w_i`` over all clients, accumulated in float64
  and cast back to each array's dtype (integer buffers rounded).

Two ways to feed batches:

* ``index`` (default): batches are index slices of the client's tensors;
* ``dataloader``: the idiomatic ``DataLoader(TensorDataset(x, y[, teacher_rows]),
  batch_size, sampler=<this epoch's permutation>)``: the same batch order as ``index``
  (one ``randperm`` per epoch from the client's generator), but per-sample indexing and
  ``default_collate`` stacking instead of one gather per batch. That data path is the
  only difference between the two variants.

Command line (prints one JSON object; ``--json`` also writes it to a file)::

    python bench/reference_loop.py --method fedvls --dataset mnist10k \\
        --data-dir ../shared/data --clients 10 --rounds 20 --local-epochs 5 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_T_PROCESS = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from fedvls_flwr.algorithms.objectives import build_objective  # noqa: E402
from fedvls_flwr.algorithms.training import mode_dependent  # noqa: E402
from fedvls_flwr.config.registry import method_params  # noqa: E402
from fedvls_flwr.config.run_config import SETTINGS, RunConfig, parse_run_config  # noqa: E402
from fedvls_flwr.data.datasets import load_dataset  # noqa: E402
from fedvls_flwr.data.partition import partition_indices  # noqa: E402
from fedvls_flwr.models import build_model, default_model  # noqa: E402

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (PROJECT_DIR / ".." / "shared" / "data").resolve()


#: The benchmark's workload where it differs from the app's defaults: the paper's MNIST
#: protocol on mnist10k, 20 rounds.
BENCH_SETTINGS = {"dataset": "mnist10k", "data-dir": str(DEFAULT_DATA_DIR), "num-server-rounds": 20}
LOADERS = ("index", "dataloader")


@dataclass(frozen=True)
class RefConfig:
    """One experiment: the app's own validated run config (so the loop reads every setting
    the app reads, under the same names and rules) plus how the loop itself runs.
    ``cfg.lr`` etc. read the run config."""

    run: RunConfig
    num_clients: int = 10  # the app's num-supernodes (full participation)
    threads: int = 1
    loader: str = "index"  # "index" | "dataloader"

    def __post_init__(self) -> None:
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")

    def __getattr__(self, name: str) -> Any:
        if name == "run":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.run, name)

    @classmethod
    def make(cls, *, num_clients: int = 10, threads: int = 1, loader: str = "index", **settings: Any) -> RefConfig:
        """Settings as keyword arguments (``dirichlet_beta=0.5``) over the bench defaults."""
        overrides = {key.replace("_", "-"): value for key, value in settings.items()}
        return cls(parse_run_config({**BENCH_SETTINGS, **overrides}), num_clients, threads, loader)

    def replace(self, **changes: Any) -> RefConfig:
        own = {k: changes.pop(k) for k in ("num_clients", "threads", "loader") if k in changes}
        run = parse_run_config({**self.run.to_flower(), **{k.replace("_", "-"): v for k, v in changes.items()}})
        return dataclasses.replace(self, run=run, **own)

    def run_config(self) -> dict[str, Any]:
        """The app's run config that describes the same experiment."""
        return self.run.to_flower()


def batch_seed(seed: int, server_round: int, client: int) -> int:
    """The seed of a client's batch-order generator in a round (as the app's client)."""
    return int(np.random.SeedSequence([seed, server_round, client]).generate_state(1)[0])


# --------------------------------------------------------------------------- local training


def train_client(model, x, y, num_classes: int, cfg: RefConfig, generator: torch.Generator) -> int:
    """Train ``model`` (holding the global weights) in place; returns the sample count."""
    counts = torch.bincount(y, minlength=num_classes)
    objective = build_objective(cfg.method, counts, method_params(cfg.run))

    teacher = None
    teacher_rows = None  # what the loss needs of the teacher, per sample (prepare_teacher)
    if objective.needs_teacher:
        teacher = copy.deepcopy(model)
        teacher.train(cfg.teacher_mode == "train")
        for p in teacher.parameters():
            p.requires_grad_(False)
        if cfg.teacher_mode == "eval" or not mode_dependent(teacher):
            with torch.no_grad():
                teacher_logits = torch.cat(
                    [teacher(x[i : i + cfg.eval_batch_size]) for i in range(0, len(x), cfg.eval_batch_size)]
                )
                teacher_rows = objective.prepare_teacher(teacher_logits, y)

    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    model.train()

    def step(xb, yb, tb):
        if tb is None and teacher is not None:
            with torch.no_grad():
                tb = objective.prepare_teacher(teacher(xb), yb)
        loss, _ = objective.loss_terms(model(xb), yb, tb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    n = len(y)
    if cfg.loader == "dataloader":
        tensors = (x, y) if teacher_rows is None else (x, y, teacher_rows)
        dataset = TensorDataset(*tensors)
        for _ in range(cfg.local_epochs):
            # The epoch's order as a sampler: one randperm per epoch from the client's
            # generator, like the app. (shuffle=True with generator=g would consume g for
            # the loader's base seed and for an extra randperm after every epoch: a
            # different order at the same cost.)
            order = torch.randperm(n, generator=generator).tolist()
            for batch in DataLoader(dataset, batch_size=cfg.batch_size, sampler=order):
                step(batch[0], batch[1], batch[2] if len(batch) == 3 else None)
    else:
        for _ in range(cfg.local_epochs):
            order = torch.randperm(n, generator=generator).to(x.device)
            for start in range(0, n, cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                step(x[idx], y[idx], None if teacher_rows is None else teacher_rows[idx])
    return n


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """sum_i (w_i / sum_j w_j) state_i, in float64, cast back to each tensor's dtype."""
    total = float(sum(weights))
    out = {}
    for key, ref in states[0].items():
        acc = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for state, w in zip(states, weights):
            acc += (w / total) * state[key].to(torch.float64)
        out[key] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    return out


@torch.no_grad()
def evaluate(model, x, y, batch_size: int) -> tuple[float, float]:
    """(top-1 accuracy, mean cross-entropy) of ``model`` on ``x``/``y``."""
    model.eval()
    correct = 0
    loss = 0.0
    for i in range(0, len(y), batch_size):
        logits = model(x[i : i + batch_size]).float()
        yb = y[i : i + batch_size]
        correct += int((logits.argmax(dim=1) == yb).sum())
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
    return correct / max(len(y), 1), loss / max(len(y), 1)


# --------------------------------------------------------------------------- the FL loop


def run(cfg: RefConfig, log=None) -> dict[str, Any]:
    """Run every round; returns per-round accuracy and timings."""
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    bundle = load_dataset(cfg.dataset, cfg.data_dir)
    if bundle.mean is not None:
        raise ValueError(
            f"dataset {cfg.dataset!r} is normalised per batch (uint8 storage); the reference "
            "loop covers the pre-normalised sets (digits, mnist, mnist10k)"
        )
    parts = partition_indices(
        bundle.train_y.numpy(), cfg.num_clients, cfg.partition, cfg.seed,
        dirichlet_beta=cfg.dirichlet_beta, shards_per_client=cfg.shards_per_client, min_size=cfg.min_partition_size,
    )
    # device = "cuda": every tensor lives on the GPU for the whole run (the app copies a
    # client's data there once per round); the CPU path is unchanged
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    clients = []
    for idx in parts:
        idx_t = torch.from_numpy(idx)
        clients.append((bundle.train_x[idx_t].to(device), bundle.train_y[idx_t].to(device)))
    test_x, test_y = bundle.test_x.to(device), bundle.test_y.to(device)

    name = default_model(cfg.dataset) if cfg.model == "auto" else cfg.model
    torch.manual_seed(cfg.seed)
    model = build_model(name, tuple(bundle.input_shape), bundle.num_classes).to(device)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc, loss = evaluate(model, test_x, test_y, cfg.eval_batch_size)
    rounds = [{"round": 0, "accuracy": acc, "loss": loss, "seconds": 0.0}]
    setup_seconds = time.perf_counter() - t0

    for r in range(1, cfg.num_server_rounds + 1):
        t_round = time.perf_counter()
        states, weights, client_seconds = [], [], []
        for i, (x, y) in enumerate(clients):
            t_client = time.perf_counter()
            model.load_state_dict(global_state)
            gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
            n = train_client(model, x, y, bundle.num_classes, cfg, gen)
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            weights.append(float(n))
            if device.type == "cuda":
                torch.cuda.synchronize()
            client_seconds.append(time.perf_counter() - t_client)
        t_agg = time.perf_counter()
        global_state = weighted_average(states, weights)
        t_eval = time.perf_counter()
        model.load_state_dict(global_state)
        acc, loss = evaluate(model, test_x, test_y, cfg.eval_batch_size)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        if not math.isfinite(loss):
            loss = None
        rounds.append({
            "round": r, "accuracy": acc, "loss": loss, "seconds": t_end - t_round,
            "train_seconds": t_agg - t_round, "aggregate_seconds": t_eval - t_agg, "eval_seconds": t_end - t_eval,
            "client_seconds": client_seconds,
        })
        if log is not None:
            log(f"round {r}/{cfg.num_server_rounds}: accuracy {acc:.4f}  {t_end - t_round:.2f}s")

    return {
        "config": {**cfg.run_config(), "num-clients": cfg.num_clients, "threads": cfg.threads, "loader": cfg.loader},
        "model": name,
        "client_sizes": [len(p) for p in parts],
        "rounds": rounds,
        "setup_seconds": setup_seconds,
        "loop_seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def cli_args(cfg: RefConfig) -> list[str]:
    """The command line that describes ``cfg`` (what bench_round.py runs this loop with)."""
    args = [f"--{key}={value}" for key, value in cfg.run_config().items()]
    return args + [f"--num-clients={cfg.num_clients}", f"--threads={cfg.threads}", f"--loader={cfg.loader}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    settings = parser.add_argument_group("run config (the app's keys; bench defaults: " + str(BENCH_SETTINGS) + ")")
    for s in SETTINGS:
        settings.add_argument(f"--{s.key}", type=_parse_bool if s.kind is bool else s.kind, default=None, help=s.help)
    parser.add_argument("--num-clients", "--clients", type=int, default=10, help="the app's num-supernodes")
    parser.add_argument("--rounds", type=int, default=None, help="alias of --num-server-rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--loader", choices=LOADERS, default="index")
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--verbose", action="store_true", help="log every round to stderr")
    args = parser.parse_args(argv)
    given = {s.key: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name) is not None}
    if args.rounds is not None:
        given["num-server-rounds"] = args.rounds
    cfg = RefConfig(parse_run_config({**BENCH_SETTINGS, **given}), args.num_clients, args.threads, args.loader)
    out_path, verbose = args.json, args.verbose
    result = run(cfg, log=(lambda m: print(m, file=sys.stderr)) if verbose else None)
    result["process_seconds"] = time.perf_counter() - _T_PROCESS  # imports included
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    text = json.dumps(result)
    if out_path:
        Path(out_path).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
