"""Check a run config before submitting it, starting nothing.

    python -m fedvls_flwr check --run-config "method='fedvls' dataset='mnist10k' data-dir='...'"
    python -m fedvls_flwr check --run-config conf/fedvls-authors.toml --num-supernodes 10

`flwr run` hands the run to a SuperLink before any code of this app sees the config,
and in simulation Flower starts Ray next to the ServerApp; the ServerApp validates
first thing, but a typo there still costs the run's start-up (measured in
docs/performance.md), and some mistakes never reach it: Flower's ``--run-config``
parser silently drops ``lr=``, a bare ``lr`` or the ``momentum`` of ``"lr=0.1
momentum"``, and an unknown key fails at the SuperLink with only "Invalid run
configuration". This command applies the same checks in a few seconds: the
``--run-config`` syntax (every item ``key=value``), every key (type, range, allowed
values; unknown keys with a did-you-mean), the dataset's files and labels, and - with
the number of SuperNodes of the simulation - whether the partition can be drawn (shards
that fit the pool, Dirichlet clients of at least ``min-partition-size``). On this
machine it also checks that ``device = 'cuda'`` has a CUDA device, that ``output-dir``
can be created and written, that the run folder of ``run-name`` is free (or, with
``resume = true``, can be resumed) and that the package ``tracking`` needs is installed;
``--for-other-machine`` skips these four for a config meant for another machine.

With ``RAY_ADDRESS`` set (a simulation meant to join a running Ray cluster, docs/ray-cluster.md)
it checks that something answers there and that ``--federation-config`` holds no setting
``ray.init`` refuses when joining a cluster (``init-args-num-cpus``, ``init-args-num-gpus``).
And it checks that the simulated clients fit where they would run (this machine, or that
cluster's nodes): a ``client-resources-num-gpus`` share where there is no GPU, or more
``client-resources-num-cpus`` than a node has, would leave Ray without a single client.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedvls_flwr.algorithms.sampling import clients_per_round
from fedvls_flwr.app.ray_address import check_cluster_settings, simulation_room_problem
from fedvls_flwr.app.tracking import check_tracking
from fedvls_flwr.config.args import parse_run_config_args
from fedvls_flwr.config.federation_config import check_federation_config
from fedvls_flwr.config.registry import run_parts
from fedvls_flwr.config.run_config import ConfigError, RunConfig, model_name, parse_run_config
from fedvls_flwr.config.unmeant import rounds_warning
from fedvls_flwr.config.unread import check_given_settings_apply

if TYPE_CHECKING:
    from fedvls_flwr.data.bundle import DatasetBundle

PROJECT_DIR = Path(__file__).resolve().parents[2]


def project_defaults(app_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the app's pyproject.toml (what `flwr run` starts from); for
    an installed package, which has no pyproject.toml beside it, the declared defaults that
    table is generated from (``fedvls config --write``), as the in-process engine fuses them."""
    import tomllib

    pyproject = Path(app_dir) / "pyproject.toml"
    if not pyproject.is_file():
        return RunConfig().to_flower()
    return dict(tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"])


def check_output_dir(cfg: RunConfig, *, new_ok: bool = False) -> None:
    """``output-dir`` can be created and written on this machine, and the run folder of
    ``run-name`` is free (``resume = false``) or can be resumed (``resume = true``: it must
    exist, unless ``new_ok`` - a sweep resumes the runs it started and starts the others),
    and no run is going on in it now (its lock, :class:`~fedvls_flwr.app.results.RunFolderLock`)."""
    out = cfg.resolved_output_dir()
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == out else f"cannot be created: {existing} is a file, not a folder"
        raise ConfigError(f"run config 'output-dir' = {cfg.output_dir!r}: {out} {where}; choose another output-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"run config 'output-dir' = {cfg.output_dir!r}: {existing} is not writable by this user; "
            "choose another output-dir"
        )
    if not cfg.run_name:
        return
    from fedvls_flwr.app.results import (
        already_finished,
        busy_message,
        holds_run,
        lock_holder,
        missing_run_folder,
        read_resume_point,
    )

    run_dir = out / cfg.run_name
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run config 'run-name' = {cfg.run_name!r}: {run_dir} is a file; choose another run-name")
    if cfg.resume and not new_ok and (missing := missing_run_folder(run_dir)):
        raise ConfigError(missing)
    if (holder := lock_holder(run_dir)) is not None:  # a run going on in it now (the ServerApp holds its lock)
        raise ConfigError(busy_message(run_dir, holder, resume=cfg.resume))
    if not holds_run(run_dir):
        return
    if not cfg.resume:
        raise ConfigError(
            f"run folder {run_dir} already holds a run; set resume=true to continue it "
            "or choose another run-name / output-dir"
        )
    point = read_resume_point(run_dir, cfg.to_flower())  # RunFolderError: which file, what to do
    for note in point.notes:
        print(f"note: resume: {note}", file=sys.stderr)
    if (done := already_finished(run_dir, point.round, cfg.num_server_rounds, cfg.tracking)) is not None:
        print(f"note: {done}", file=sys.stderr)


def check_cuda(cfg: RunConfig) -> None:
    for key, value in (("device", cfg.device), ("server-device", cfg.server_device)):
        if value == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    f"run config '{key}' = 'cuda' but this machine has no CUDA device: use {key}='auto' "
                    "(CUDA where present) or 'cpu'; if the config is meant for other machines (GPU "
                    "SuperNodes), check it with --for-other-machine"
                )


def check_model(cfg: RunConfig, bundle: DatasetBundle | None, warn: list[str]) -> bool:
    """The model for the dataset's input size, as the ServerApp checks it before any round:
    a BatchNorm layer at a 1x1 feature map is a warning (added to ``warn``), with ``batch-size``
    1 an error. Returns whether the model has BatchNorm."""
    if cfg.dataset == "synthetic":
        return False  # vectors: only mlp / logreg apply
    from fedvls_flwr.algorithms.batchnorm import (
        feature_map_problem,
        imagenet_resnet18_smallest_map,
        smallest_batchnorm_map,
    )
    from fedvls_flwr.data.datasets import image_format
    from fedvls_flwr.models import build_model

    shape = tuple(bundle.input_shape) if bundle is not None else tuple(image_format(cfg.dataset).shape)
    name = model_name(cfg)
    if name == "resnet18-imagenet":  # the same answer without importing torchvision
        smallest: tuple[int, ...] | None = imagenet_resnet18_smallest_map(shape)
    else:  # one image through the model (on "meta" the first call would cost 1.3 s of imports)
        smallest = smallest_batchnorm_map(build_model(name, shape, 2), shape)
    note = feature_map_problem(smallest, name, shape, cfg.batch_size)
    if note:
        warn.append(f"warning: {note}")
    return smallest is not None


#: A federation size to judge fraction-train by when check is not told one (the largest here).
TYPICAL_MAX_NODES = 100


def check_federation(cfg: RunConfig, num_supernodes: int) -> None:
    """A run on ``num_supernodes`` nodes can start: ``min-nodes`` is waited for before the
    first round, and more than the federation has never come; and every part of the run
    gets what it needs of the federation's size (``Part.federation_rules``)."""
    if cfg.min_nodes > num_supernodes:
        raise ConfigError(
            f"run config 'min-nodes' = {cfg.min_nodes} but the federation has {num_supernodes} SuperNode(s) "
            f"(num-supernodes): the first round would never start; lower min-nodes to at most "
            f"{num_supernodes}, or use {cfg.min_nodes} nodes or more"
        )
    values = cfg.to_flower()
    for part in run_parts(values).values():
        if part.federation_rules is not None and (problem := part.federation_rules(values, num_supernodes)):
            raise ConfigError(problem)


def warnings_for(cfg: RunConfig, num_supernodes: int | None, pool_size: int | None) -> list[str]:
    """What is allowed but almost surely not meant: a run that would not end, rounds of one client."""
    said = []
    if (rounds := rounds_warning(cfg, pool_size)) is not None:
        said.append(f"warning: {rounds}")
    nodes = num_supernodes or TYPICAL_MAX_NODES
    if clients_per_round(cfg.fraction_train, nodes) < 2 and nodes >= 2:
        federation = (f"of {nodes} nodes" if num_supernodes else f"on any federation up to {nodes} nodes")
        said.append(f"note: fraction-train = {cfg.fraction_train:g} samples 1 client per round {federation} "
                    "(at least one is always trained): every round's global model is one client's local "
                    f"model, nothing is averaged; fraction-train >= {2 / nodes:.3g} samples 2")
    return said


def check_run_config(
    overrides: dict[str, Any], num_supernodes: int | None = None, data: bool = True, app_dir: Path = PROJECT_DIR,
    this_machine: bool = False, warn: list[str] | None = None, typed: bool = False,
) -> RunConfig:
    """The validated config, or an exception whose message says what is wrong.

    ``typed``: ``overrides`` are what a user typed (not a preset's run), so each must be read
    by a part the run selects (:func:`~fedvls_flwr.config.unread.check_given_settings_apply`).

    Raises ConfigError (a key), DatasetNotFoundError (the data), PartitionError /
    NodeDataError (the partition for ``num_supernodes`` nodes), and with ``this_machine``
    ConfigError / RunFolderError for CUDA, the output folder and the run folder.
    ``warn`` (a list) receives what is allowed but looks unmeant (:func:`warnings_for`).
    """
    cfg = parse_run_config({**project_defaults(app_dir), **overrides})
    if typed:
        check_given_settings_apply(overrides, cfg.to_flower())
    if num_supernodes is not None:
        check_federation(cfg, num_supernodes)
    if this_machine:
        check_output_dir(cfg)
        check_cuda(cfg)
        check_tracking(cfg)
    if not data:
        if warn is not None:
            warn.extend(warnings_for(cfg, num_supernodes, None))
        return cfg  # the model's feature map is checked with the data (--no-data and the deploy tools load no torch)
    from fedvls_flwr.data.node_data import dataset_for, partitions_for

    bundle = dataset_for(cfg)
    said = warn if warn is not None else []
    said.extend(warnings_for(cfg, num_supernodes, len(bundle.train_y)))
    batchnorm = check_model(cfg, bundle, said)
    if num_supernodes is not None and cfg.dataset != "synthetic":
        tiny = [i for i, part in enumerate(partitions_for(cfg, num_supernodes)) if len(part) < 2]
        if batchnorm and tiny:
            said.append(f"warning: partition(s) {', '.join(map(str, tiny))} hold fewer than 2 samples: with the "
                        f"BatchNorm model {model_name(cfg)!r} their training fails in every round they are sampled "
                        "(see docs/datasets-and-models.md, 'BatchNorm and the last batch')")
    elif num_supernodes is not None and num_supernodes != cfg.synthetic_clients:
        raise ConfigError(
            f"run config 'synthetic-clients' = {cfg.synthetic_clients}: dataset synthetic has one "
            f"generated client per node, so it must equal num-supernodes = {num_supernodes}"
        )
    if warn is None:
        for line in said:
            print(line, file=sys.stderr)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedvls check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", action="append", default=[], metavar="STR_OR_TOML",
                        help="as for flwr run: 'key=value ...' or a .toml file (repeatable)")
    parser.add_argument("--num-supernodes", type=int, help="simulated nodes (checks the partition)")
    parser.add_argument("--federation-config", action="append", default=[], metavar="STR",
                        help="as for flwr run: 'num-supernodes=10 init-args-num-cpus=2 ...' (num-supernodes "
                             "checks the partition; with RAY_ADDRESS set, settings that a running Ray cluster "
                             "refuses are named)")
    parser.add_argument("--no-data", action="store_true", help="check the keys only, not the dataset")
    parser.add_argument("--for-other-machine", action="store_true",
                        help="the config is for another machine (e.g. GPU SuperNodes, a remote SuperLink): "
                             "skip this machine's checks (CUDA present, output-dir writable, run folder, tracking package)")
    args = parser.parse_args(argv)
    if args.num_supernodes is not None and args.num_supernodes < 1:
        parser.error("--num-supernodes must be >= 1")
    warnings: list[str] = []
    try:
        overrides = parse_run_config_args(args.run_config)
        federation = parse_run_config_args(args.federation_config, "--federation-config")
        check_federation_config(federation, RunConfig().to_flower())
        num_supernodes = args.num_supernodes
        if num_supernodes is None and federation.get("num-supernodes") is not None:
            num_supernodes = int(federation["num-supernodes"])
        if not args.for_other_machine and (problems := check_cluster_settings(federation)):
            raise ConfigError("; ".join(problems))  # before the data is loaded: a run would not start
        if not args.for_other_machine and (no_room := simulation_room_problem(federation)):
            raise ConfigError(no_room)  # a GPU share without a GPU, more CPUs per client than a node has
        cfg = check_run_config(overrides, num_supernodes, data=not args.no_data,
                               this_machine=not args.for_other_machine, warn=warnings, typed=True)
    except (ValueError, FileNotFoundError) as err:
        # ConfigError (syntax, keys), RunFolderError, PartitionError, NodeDataError, DatasetNotFoundError
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in warnings:
        print(line, file=sys.stderr)
    print(f"ok: {cfg.method} on {cfg.dataset} ({cfg.partition}), {cfg.num_server_rounds} rounds x "
          f"{cfg.local_epochs} local epochs" + ("" if args.no_data else "; data found"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
