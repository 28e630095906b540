"""Check a run config before submitting it, starting nothing.

    python -m fedvls_flwr.check --run-config "method='fedvls' dataset='mnist10k' data-dir='...'"
    python -m fedvls_flwr.check --run-config conf/fedvls-authors.toml --num-supernodes 10

`flwr run` hands the run to a SuperLink before any code of this app sees the config,
and in simulation Flower starts Ray next to the ServerApp; the ServerApp validates
first thing, but a typo there still costs the run's start-up (measured in
docs/performance.md). This command applies the same checks in a second or two: every
key (type, range, allowed values; unknown keys), the dataset's files, and - with the
number of SuperNodes of the simulation - whether the partition can be drawn (shards
that fit the pool, Dirichlet clients of at least ``min-partition-size``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .config import ConfigError, RunConfig, parse_run_config

PROJECT_DIR = Path(__file__).resolve().parents[1]


def project_defaults(app_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the app's pyproject.toml (what `flwr run` starts from)."""
    import tomllib

    return dict(tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def check_run_config(
    overrides: dict[str, Any], num_supernodes: int | None = None, data: bool = True, app_dir: Path = PROJECT_DIR,
) -> RunConfig:
    """The validated config, or an exception whose message says what is wrong.

    Raises ConfigError (a key), DatasetNotFoundError (the data) or PartitionError /
    NodeDataError (the partition for ``num_supernodes`` nodes).
    """
    cfg = parse_run_config({**project_defaults(app_dir), **overrides})
    if not data:
        return cfg
    from .node_data import dataset_for, partitions_for

    dataset_for(cfg)
    if num_supernodes is None:
        return cfg
    if cfg.dataset != "synthetic":
        partitions_for(cfg, num_supernodes)
    elif num_supernodes != cfg.synthetic_clients:
        raise ConfigError(
            f"run config 'synthetic-clients' = {cfg.synthetic_clients}: dataset synthetic has one "
            f"generated client per node, so it must equal num-supernodes = {num_supernodes}"
        )
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedvls_flwr.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", action="append", default=[], metavar="STR_OR_TOML",
                        help="as for flwr run: 'key=value ...' or a .toml file (repeatable)")
    parser.add_argument("--num-supernodes", type=int, help="simulated nodes (checks the partition)")
    parser.add_argument("--no-data", action="store_true", help="check the keys only, not the dataset")
    args = parser.parse_args(argv)
    from click import ClickException
    from flwr.common.config import parse_config_args

    try:
        overrides = dict(parse_config_args(args.run_config)) if args.run_config else {}
        cfg = check_run_config(overrides, args.num_supernodes, data=not args.no_data)
    except ClickException as err:  # the key=value syntax itself
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:  # ConfigError, PartitionError, NodeDataError, DatasetNotFoundError
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"ok: {cfg.method} on {cfg.dataset} ({cfg.partition}), {cfg.num_server_rounds} rounds x "
          f"{cfg.local_epochs} local epochs" + ("" if args.no_data else "; data found"))
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("note: device = 'cuda' but this machine has no CUDA device; fine only if the "
                  "SuperNodes' machines have one", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
