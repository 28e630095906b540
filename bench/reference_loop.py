"""The yardstick: a plain PyTorch federated loop in one process, sharing nothing with the app.

It does the app's work from the documented rules and the methods' sources, importing nothing of
the package (``tests/test_differential.py`` fails if it does): it reads the data files itself
and partitions them (:mod:`bench.reference_data`), builds its networks from their own definitions
(:mod:`bench.reference_models`), writes every objective out from its paper or its authors' code
(:mod:`bench.reference_objectives`), every local step, server optimizer and FedConcat's stages
from theirs (:mod:`bench.reference_parts`), and keeps its own table of settings and defaults
(:mod:`bench.reference_settings`). Its loop is deliberately plain: the sampled clients one after
the other, then the server's update, then the global model on the test set.

``tests/test_differential.py`` holds it against the app for every registered part and every
setting; ``bench/bench_round.py`` times it against the app.

What it draws at random it draws as docs/running.md ("What a seed fixes") documents, so that it
computes the app's numbers round for round:

* initial model: ``torch.manual_seed(seed)`` then the network; the differential test instead
  hands it the app's initial weights (``run(..., initial=...)``), loaded by state-dict key;
* the round's clients: :func:`bench.reference_parts.sampled_partitions`;
* client ``i`` in round ``r`` shuffles with a CPU ``torch.Generator`` seeded with
  ``SeedSequence([seed, r, i]).generate_state(1)[0]``, one ``randperm`` per epoch (FedConcat's
  head rounds: one ``randperm``, ``fedconcat-head-steps`` batches of it);
* FedConcat's new head: :func:`bench.reference_parts.new_head`.

Local training (:mod:`bench.reference_training`): consecutive slices of ``batch-size`` of each
epoch's order; a fresh or carried SGD; the teacher a frozen copy of the received model, run on
every batch.

Two ways to feed batches: ``index`` (default; index slices of the client's tensors) and
``dataloader`` (``DataLoader(TensorDataset(x, y), batch_sampler=<this epoch's batches>)``: the
same batches, per-sample indexing and ``default_collate`` stacking instead of one gather).

Command line (prints one JSON object; ``--json`` also writes it to a file). Every setting of the
reference's table is an option (``--method fedvls``) or a ``--set KEY=VALUE``::

    python bench/reference_loop.py --method fedvls --dataset mnist10k \\
        --data-dir ../shared/data --clients 10 --rounds 20 --local-epochs 5 --threads 1
    python bench/reference_loop.py --dataset mnist10k --clients 10 --rounds 6 \\
        --set protocol=fedconcat --set fedconcat-encoder-rounds=2 --set method=fedavg

The JSON's ``rounds`` hold each round's wall seconds (``seconds``: training, the server's
update, evaluation); ``steady_round_seconds`` is the median of rounds 2..R, and with
FedConcat ``stages`` gives each stage's rounds and the median of its rounds after the first.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_T_PROCESS = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench import reference_data as data  # noqa: E402
from bench import reference_models as models  # noqa: E402
from bench.reference_objectives import OBJECTIVES  # noqa: E402
from bench.reference_parts import (  # noqa: E402
    LOCAL_STEPS,
    SERVER_STEPS,
    FedGFServer,
    ServerStep,
    cluster_assignment,
    encoder_rounds,
    new_head,
    sampled_partitions,
    weighted_average,
)
from bench.reference_settings import (  # noqa: E402
    BENCH_SETTINGS,
    DEFAULT_DATA_DIR,
    LOADERS,
    PARTS,
    NotCovered,
    RefConfig,
    defaults,
)
from bench.reference_training import (  # noqa: E402
    Client,
    Concatenated,
    Inputs,
    batch_seed,
    evaluate,
    load_numpy,
    to_numpy,
    train_client,
    train_head,
)

__all__ = ["RefConfig", "run", "IMPLEMENTATIONS", "NotCovered", "DEFAULT_DATA_DIR", "BENCH_SETTINGS", "cli_args"]


# --------------------------------------------------------------------------- the protocols


@dataclass
class Setup:
    """What every protocol's rounds work with."""

    cfg: RefConfig
    clients: list[Client]
    num_classes: int
    initial: dict[str, np.ndarray]
    inputs: Inputs
    device: torch.device


class StandardLoop:
    """One global model: the sampled clients train it, the server averages their models (sample
    weighted) and steps with its optimizer; FedGF's server adds its perturbed point."""

    def __init__(self, setup: Setup) -> None:
        self.s = setup
        cfg = setup.cfg
        self.server: ServerStep = SERVER_STEPS[cfg.server_optimizer](cfg.params("server-optimizer"))
        self.fedgf = FedGFServer(cfg.params("local-optimizer")) if cfg.local_optimizer == "fedgf" else None
        self.global_state = setup.initial

    def stage(self, r: int) -> int | None:
        return None

    def round(self, r: int, sampled: list[int], model: nn.Module, record: dict[str, Any]):
        """Returns (the clients' seconds, when the server's part began, the model to evaluate)."""
        s, cfg = self.s, self.s.cfg
        point = self.fedgf.point() if self.fedgf is not None else None
        if self.fedgf is not None:
            record["fedgf_c"] = 0.0 if point is None else point.c
        replies, seconds = [], []
        for i in sampled:
            t_client = time.perf_counter()
            load_numpy(model, self.global_state)
            gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
            n = train_client(model, s.clients[i], s.num_classes, cfg, gen, s.inputs, point)
            replies.append((float(n), to_numpy(model)))
            if s.device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t_client)
        t_agg = time.perf_counter()
        average = weighted_average([a for _, a in replies], [n for n, _ in replies])
        new_state = self.server.step(r, self.global_state, average, replies)
        if self.fedgf is not None:
            self.fedgf.observe(self.global_state, new_state, replies)
            record["fedgf_divergence"] = self.fedgf.divergence
        if getattr(self.server, "step_size", None) is not None:
            record["server_step_size"] = self.server.step_size
        self.global_state = new_state
        load_numpy(model, self.server.evaluated(new_state))
        return seconds, t_agg, model

    def state(self) -> dict[str, np.ndarray]:
        return self.global_state


class FedConcatLoop:
    """FedConcat (Diao, Li, He, AAAI 2024; sjtudyq/FedConcat experiments.py): rounds 1..E FedAvg of
    a whole model inside each cluster (every cluster from the same initial weights), then the K
    encoders frozen side by side and a new head that every sampled client trains for
    ``fedconcat-head-steps`` batches, averaged unweighted; the concatenated model evaluated."""

    def __init__(self, setup: Setup) -> None:
        self.s = setup
        cfg = setup.cfg
        p = cfg.params("protocol")
        self.k = int(p["fedconcat-clusters"])
        self.head_steps = int(p["fedconcat-head-steps"])
        self.head_init = str(p["fedconcat-head-init"])
        self.encoder_rounds = encoder_rounds(cfg.num_server_rounds, int(p["fedconcat-encoder-rounds"]))
        counts = np.stack([torch.bincount(c.y, minlength=setup.num_classes).cpu().numpy()
                           for c in setup.clients]).astype(np.float64)
        self.assignment = cluster_assignment(str(p["fedconcat-assignment"]), counts, self.k, cfg.seed)
        self.clusters = [{k: v.copy() for k, v in setup.initial.items()} for _ in range(self.k)]
        self.encoders: list[nn.Module] = []
        self.head: dict[str, torch.Tensor] = {}

    def stage(self, r: int) -> int:
        return 1 if r <= self.encoder_rounds else 2

    def round(self, r: int, sampled: list[int], model: nn.Module, record: dict[str, Any]):
        s, cfg, seconds = self.s, self.s.cfg, []
        if self.stage(r) == 1:
            replies: dict[int, list[tuple[float, dict[str, np.ndarray]]]] = {}
            for i in sampled:
                t_client = time.perf_counter()
                cluster = self.assignment[i]
                load_numpy(model, self.clusters[cluster])
                gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
                n = train_client(model, s.clients[i], s.num_classes, cfg, gen, s.inputs)
                replies.setdefault(cluster, []).append((float(n), to_numpy(model)))
                seconds.append(time.perf_counter() - t_client)
            t_agg = time.perf_counter()
            for cluster, got in replies.items():
                self.clusters[cluster] = weighted_average([a for _, a in got], [n for n, _ in got])
            if r == self.encoder_rounds:
                self._freeze(model)
            return seconds, t_agg, None
        heads = []
        for i in sampled:
            t_client = time.perf_counter()
            gen = torch.Generator().manual_seed(batch_seed(cfg.seed, r, i))
            heads.append(train_head(self.encoders, self.head, s.clients[i], cfg, gen, self.head_steps, s.inputs))
            seconds.append(time.perf_counter() - t_client)
        t_agg = time.perf_counter()
        self.head = {k: torch.stack([h[k].double() for h in heads]).mean(dim=0).to(self.head[k].dtype)
                     for k in self.head}
        return seconds, t_agg, Concatenated(self.encoders, self.head)

    def _freeze(self, model: nn.Module) -> None:
        self.encoders = []
        for arrays in self.clusters:
            encoder = copy.deepcopy(model)
            load_numpy(encoder, arrays)
            encoder.requires_grad_(False)
            encoder.eval()
            self.encoders.append(encoder)
        classifier = models.classifier_of(model)
        prefix = next(name for name, m in model.named_modules() if m is classifier) + "."
        if self.head_init == "concat":  # the authors' CIFAR-100 / TinyImageNet start: [W_0 | ... | W_K-1], sum of b_k
            weight = torch.cat([torch.from_numpy(c[prefix + "weight"]) for c in self.clusters], dim=1)
            bias = torch.stack([torch.from_numpy(c[prefix + "bias"]).double() for c in self.clusters]).sum(dim=0)
        else:
            weight, bias = new_head(classifier.in_features * self.k, self.s.num_classes, self.s.cfg.seed)
        dtype = classifier.weight.dtype
        self.head = {"weight": weight.to(dtype).clone(), "bias": bias.to(dtype).clone()}

    def state(self) -> dict[str, np.ndarray]:
        """The protocol's state, named as the app's checkpoint names it (docs/methods.md, FedConcat)."""
        out: dict[str, np.ndarray] = {"fedconcat/assignment": np.asarray(self.assignment, np.int64)}
        if not self.head:
            for k, arrays in enumerate(self.clusters):
                out.update({f"cluster{k}/{name}": v for name, v in arrays.items()})
            return out
        for k, arrays in enumerate(self.clusters):
            out.update({f"encoder{k}/{name}": v for name, v in arrays.items()})
        out["head/weight"] = self.head["weight"].cpu().numpy()
        out["head/bias"] = self.head["bias"].cpu().numpy()
        return out


#: Every part the reference writes out, by kind: its implementation (a local objective's
#: builder, a local step, a server step, a protocol's loop). The differential test's guard reads
#: it: a registered part without an entry here fails by name.
IMPLEMENTATIONS: dict[str, Mapping[str, Callable[..., Any]]] = {
    "method": OBJECTIVES,
    "local-optimizer": LOCAL_STEPS,
    "server-optimizer": SERVER_STEPS,
    "protocol": {"standard": StandardLoop, "fedconcat": FedConcatLoop},
}
assert {kind: set(v) for kind, v in IMPLEMENTATIONS.items()} == {kind: set(v) for kind, v in PARTS.items()}, \
    "every part of the settings table needs its implementation, and the other way round"


# --------------------------------------------------------------------------- the FL loop


def run(cfg: RefConfig, log: Callable[[str], None] | None = None, keep_arrays: bool = False,
        initial: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Run every round; returns per-round accuracy and timings (``keep_arrays``: and the final
    state under ``arrays``, named as the app's checkpoint names it). ``initial``: the starting
    weights by state-dict key (else the network's own initialisation after
    ``torch.manual_seed(seed)``)."""
    threads = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        return _run(cfg, log, keep_arrays, initial)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _check(cfg: RefConfig, loaded: data.Data) -> None:
    if cfg.amp is True or str(cfg.amp).lower() == "true":  # "auto" is off where the reference runs (a CPU)
        raise NotCovered("the reference loop runs float32 only: amp = false")
    if cfg.evaluation == "federated":
        raise NotCovered("the reference loop evaluates on the dataset's test split: evaluation = server or auto")
    if loaded.mean is not None and cfg.augment:
        raise NotCovered(f"dataset {cfg.dataset!r} is augmented per batch in the app with its own draws; the "
                         "reference loop covers it with augment = false")


def _run(cfg: RefConfig, log, keep_arrays: bool, initial: Mapping[str, np.ndarray] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    loaded = data.load(cfg.dataset, cfg.data_dir, cfg.train_pool_size)
    _check(cfg, loaded)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    parts = data.partition(loaded.train_y.numpy(), cfg.num_clients, cfg.partition, cfg.seed, beta=cfg.dirichlet_beta,
                           shards=cfg.shards_per_client, min_size=cfg.min_partition_size)
    # device = "cuda": every tensor lives on the GPU for the whole run; the CPU path is unchanged
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    clients = [Client(loaded.train_x[torch.from_numpy(idx)].to(device), loaded.train_y[torch.from_numpy(idx)].to(device))
               for idx in parts]
    test_x, test_y = loaded.test_x.to(device), loaded.test_y.to(device)
    num_classes = loaded.num_classes
    inputs = Inputs(loaded.mean, loaded.std)

    projection = int(cfg.moon_projection_dim) if cfg.method == "moon" else None
    torch.manual_seed(cfg.seed)
    model = models.build_for(cfg.model_name, loaded.input_shape, num_classes, projection)
    if initial is not None:
        load_numpy(model, initial)
    model.to(device)
    setup = Setup(cfg, clients, num_classes, to_numpy(model), inputs, device)
    protocol = IMPLEMENTATIONS["protocol"][cfg.protocol](setup)

    if cfg.protocol == "standard":
        acc, loss = evaluate(model, test_x, test_y, cfg.eval_batch_size, inputs)
        rounds: list[dict[str, Any]] = [{"round": 0, "accuracy": acc, "loss": loss, "seconds": 0.0}]
    else:
        rounds = [{"round": 0, "stage": 1, "accuracy": None, "loss": None, "seconds": 0.0}]
    setup_seconds = time.perf_counter() - t0

    for r in range(1, cfg.num_server_rounds + 1):
        t_round = time.perf_counter()
        sampled = sampled_partitions(cfg.num_clients, cfg.fraction_train, cfg.seed, r)
        record: dict[str, Any] = {"round": r}
        if (stage := protocol.stage(r)) is not None:
            record["stage"] = stage
        client_seconds, t_agg, evaluated = protocol.round(r, sampled, model, record)
        t_eval = time.perf_counter()
        acc, loss = (None, None) if evaluated is None else evaluate(evaluated, test_x, test_y, cfg.eval_batch_size,
                                                                     inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        if loss is not None and not math.isfinite(loss):
            loss = None
        record.update({
            "accuracy": acc, "loss": loss, "sampled_partitions": sampled, "seconds": t_end - t_round,
            "train_seconds": t_agg - t_round, "aggregate_seconds": t_eval - t_agg, "eval_seconds": t_end - t_eval,
            "client_seconds": client_seconds,
        })
        rounds.append(record)
        if log is not None:
            log(f"round {r}/{cfg.num_server_rounds}: accuracy {acc}  {t_end - t_round:.2f}s")

    out: dict[str, Any] = {
        "config": {**cfg.run_config(), "num-clients": cfg.num_clients, "threads": cfg.threads, "loader": cfg.loader},
        "model": cfg.model_name,
        "client_sizes": [len(p) for p in parts],
        "rounds": rounds,
        "steady_round_seconds": steady([r["seconds"] for r in rounds[1:]]),
        "setup_seconds": setup_seconds,
        "loop_seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if cfg.protocol == "fedconcat":
        out["stages"] = {
            str(stage): {"rounds": [r["round"] for r in rounds[1:] if r["stage"] == stage],
                         "steady_round_seconds": steady([r["seconds"] for r in rounds[1:] if r["stage"] == stage])}
            for stage in (1, 2)
        }
    if keep_arrays:
        out["arrays"] = protocol.state()
    return out


def steady(seconds: list[float]) -> float | None:
    """The median of the rounds after the first (the first alone when there is one)."""
    if not seconds:
        return None
    return statistics.median(seconds[1:] or seconds)


# --------------------------------------------------------------------------- command line


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _kind(value: Any) -> Callable[[str], Any]:
    return _parse_bool if isinstance(value, bool) else type(value)


def parse_set(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of a setting of the reference's table, the value read as its default's type."""
    key, sep, text = item.partition("=")
    table = defaults()
    if not sep or key not in table:
        raise argparse.ArgumentTypeError(f"--set {item!r}: expected KEY=VALUE with a setting of the reference's table")
    return key, _kind(table[key])(text)


def cli_args(cfg: RefConfig) -> list[str]:
    """The command line that describes ``cfg`` (what bench_round.py runs this loop with)."""
    args = [f"--{key}={value}" for key, value in cfg.run_config().items()]
    return args + [f"--num-clients={cfg.num_clients}", f"--threads={cfg.threads}", f"--loader={cfg.loader}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    table = defaults()
    settings = parser.add_argument_group("settings (the reference's table; bench defaults: " + str(BENCH_SETTINGS) + ")")
    for key, value in table.items():
        settings.add_argument(f"--{key}", dest=f"s:{key}", metavar=type(value).__name__.upper(), type=_kind(value),
                              default=None, help=f"default: {value!r}")
    parser.add_argument("--set", dest="set_items", metavar="KEY=VALUE", type=parse_set, action="append", default=[],
                        help="a setting (repeatable; wins over the options above)")
    parser.add_argument("--num-clients", "--clients", type=int, default=10, help="the app's num-supernodes")
    parser.add_argument("--rounds", type=int, default=None, help="alias of --num-server-rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--loader", choices=LOADERS, default="index")
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--verbose", action="store_true", help="log every round to stderr")
    args = parser.parse_args(argv)
    given = {key: getattr(args, f"s:{key}") for key in table if getattr(args, f"s:{key}") is not None}
    if args.rounds is not None:
        given["num-server-rounds"] = args.rounds
    given.update(dict(args.set_items))
    cfg = RefConfig.of({**BENCH_SETTINGS, **given}, num_clients=args.num_clients, threads=args.threads,
                       loader=args.loader)
    result = run(cfg, log=(lambda m: print(m, file=sys.stderr)) if args.verbose else None)
    result["process_seconds"] = time.perf_counter() - _T_PROCESS  # imports included
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    text = json.dumps(result)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
