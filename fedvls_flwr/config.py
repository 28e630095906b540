"""Run configuration: every setting of an experiment, typed and validated once.

The Flower run config (``[tool.flwr.app.config]`` plus ``--run-config`` overrides)
arrives as a flat dict of kebab-case keys. :func:`parse_run_config` turns it into a
frozen :class:`RunConfig` or raises :class:`ConfigError` naming the key, the value and
what is allowed - before Ray, a SuperLink or a dataset spends any time.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

METHODS = ("fedavg", "fedlc", "fedntd", "fedvls", "fedvls-paper")
DATASETS = ("digits", "mnist", "mnist10k", "fmnist", "cifar10", "cifar100", "tinyimagenet", "synthetic")
PARTITIONS = ("dirichlet", "shards", "iid")
MODELS = ("auto", "mlp", "logreg", "cnn", "mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32")
DEVICES = ("auto", "cpu", "cuda")
TEACHER_MODES = ("eval", "train")
EVALUATIONS = ("auto", "server", "federated")
FEDLC_FORMS = ("standard", "paper")


class ConfigError(ValueError):
    """A run-config value that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True)
class RunConfig:
    """All run settings. Field ``foo_bar`` is run-config key ``foo-bar``."""

    # experiment
    method: str = "fedvls"
    dataset: str = "digits"
    data_dir: str = "~/fedvls-data"
    download: bool = False
    partition: str = "dirichlet"
    dirichlet_beta: float = 0.05
    shards_per_client: int = 2
    min_partition_size: int = 10
    seed: int = 0
    model: str = "auto"
    # > 0: train on a stratified, fixed-seed subsample of this many images of the dataset's
    # training pool (the same images for every method and seed; data.subsample_pool).
    train_pool_size: int = 0
    # dataset = "synthetic": the FedProx/LEAF Synthetic(alpha, beta) generator with
    # synthetic-clients clients (must equal the number of SuperNodes / partitions).
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    synthetic_clients: int = 100
    # federation
    num_server_rounds: int = 30
    fraction_train: float = 1.0
    min_nodes: int = 2
    round_timeout: float = 3600.0
    min_fit_fraction: float = 0.5
    round_retries: int = 1
    # local training
    local_epochs: int = 5
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    device: str = "auto"
    torch_threads: int = 1
    eval_batch_size: int = 1024
    # Where the global model is evaluated: "server" (the run dataset's test split on the
    # server), "federated" (each node's local held-out split, node config test-fraction,
    # weighted by size), "auto" = server when the server has the test split, else federated.
    evaluation: str = "auto"
    # Training-time augmentation (random crop pad 4 + horizontal flip + per-sample
    # AutoAugment CIFAR10 policy, see augment.py). Applies only to the uint8 image
    # datasets (cifar10, cifar100, tinyimagenet: bundles with mean/std); the MNIST-like
    # sets are stored normalised and are never augmented, whatever this says.
    augment: bool = True
    # Mixed precision: torch.autocast with bfloat16 (no GradScaler needed) around the
    # forward passes and the objective, on CUDA only. On a CPU device it is accepted and
    # ignored (logged once per process), so one preset can serve CPU and GPU machines.
    amp: bool = False
    # objectives
    lambda_dis: float = 0.1
    logit_weight: float = 0.005
    paper_logit_weight: float = 1.0
    use_dis: bool = True
    use_logit: bool = True
    fedlc_tau: float = 0.5
    fedlc_form: str = "standard"
    fedntd_beta: float = 1.0
    fedntd_tau: float = 1.0
    teacher_mode: str = "eval"
    # results
    output_dir: str = "~/fedvls-runs"
    run_name: str = ""
    resume: bool = False
    local_eval: bool = False

    # ---- derived views -------------------------------------------------
    def to_flower(self) -> dict[str, Any]:
        """The config as kebab-case keys with plain values (for ConfigRecord / JSON)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}

    def resolved_data_dir(self) -> Path:
        return resolve_path(self.data_dir)

    def resolved_output_dir(self) -> Path:
        return resolve_path(self.output_dir)

    def default_run_name(self) -> str:
        skew = {
            "dirichlet": f"dir{self.dirichlet_beta:g}",
            "shards": f"shards{self.shards_per_client}",
            "iid": "iid",
        }[self.partition]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{self.dataset}-{self.method}-{skew}-s{self.seed}-{stamp}"

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)


def resolve_path(value: str) -> Path:
    """Absolute paths as given; ``~`` expanded; relative paths against ``$FEDVLS_BASE_DIR``.

    Flower starts the ServerApp and ClientApps in processes whose working directory is
    the SuperLink's/SuperNode's, not the user's shell, so a bare relative path would land
    somewhere surprising. ``$FEDVLS_BASE_DIR`` defaults to the home directory.
    """
    path = Path(os.path.expanduser(value))
    if path.is_absolute():
        return path
    base = Path(os.path.expanduser(os.environ.get("FEDVLS_BASE_DIR", "~")))
    return (base / path).resolve()


_FIELD_TYPES = {f.name: f.type for f in fields(RunConfig)}


def _coerce(key: str, field_name: str, value: Any, default: Any) -> Any:
    expected = type(default)
    if expected is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"run config '{key}' = {value!r}: expected true or false")
    if expected is int:
        # float.is_integer() is False for inf and nan (int(inf) would raise OverflowError)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()
        ):
            raise ConfigError(f"run config '{key}' = {value!r}: expected an integer")
        return int(value)
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"run config '{key}' = {value!r}: expected a number")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"run config '{key}' = {value!r}: expected a string")
    return value


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"run config '{key}' = {value!r} is not allowed; choose one of: {', '.join(allowed)}"
        )


def _check(condition: bool, key: str, value: Any, rule: str) -> None:
    if not condition:
        raise ConfigError(f"run config '{key}' = {value!r}: must be {rule}")


def parse_run_config(raw: dict[str, Any], *, strict: bool = True) -> RunConfig:
    """Validate a Flower run config (kebab-case keys) into a :class:`RunConfig`.

    ``strict`` rejects unknown keys (a typo such as ``lamda-dis`` would otherwise be
    silently ignored); the per-round ConfigRecord adds ``server-round`` and is parsed
    with ``strict=False``.
    """
    defaults = RunConfig()
    values: dict[str, Any] = {}
    known = {name.replace("_", "-"): name for name in _FIELD_TYPES}
    for key, value in raw.items():
        if key not in known:
            if strict:
                hint = did_you_mean(key, known)
                if key in FEDERATION_ONLY:
                    hint = (f" ('{key}' is a federation setting: flwr run ... "
                            f"--federation-config \"{key}=...\", not --run-config)")
                raise ConfigError(
                    f"unknown run config key '{key}'{hint}; known keys: {', '.join(sorted(known))}"
                )
            continue
        name = known[key]
        values[name] = _coerce(key, name, value, getattr(defaults, name))
    cfg = dataclasses.replace(defaults, **values)
    validate(cfg)
    return cfg


# Names people reach for that are not keys of this app: what to write instead.
SYNONYMS = {
    "learning-rate": "lr", "rounds": "num-server-rounds", "num-rounds": "num-server-rounds",
    "epochs": "local-epochs", "wd": "weight-decay", "beta": "dirichlet-beta", "alpha": "dirichlet-beta",
}
FEDERATION_ONLY = ("num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus")


def did_you_mean(key: str, known) -> str:
    """`` (did you mean 'x'?)`` for the known key closest to ``key`` (hyphens/underscores
    and case ignored first, then a few synonyms, then difflib's similarity), or ``""``."""
    known = list(known)
    flat = key.replace("-", "").replace("_", "").lower()
    close = [k for k in known if k.replace("-", "").replace("_", "").lower() == flat]
    if not close and SYNONYMS.get(key.replace("_", "-").lower()) in known:
        close = [SYNONYMS[key.replace("_", "-").lower()]]
    close = close or difflib.get_close_matches(key.replace("_", "-").lower(), known, n=1, cutoff=0.7)
    return f" (did you mean '{close[0]}'?)" if close else ""


def validate(cfg: RunConfig) -> None:
    """Range and choice checks that need no data and no Flower."""
    # Every float setting must be finite: no rate, weight, temperature, Dirichlet or
    # Synthetic parameter or fraction means anything at inf/nan. round-timeout too: "wait
    # forever" is not a useful setting (a vanished node would hang the run; Flower's
    # messages expire after 12 h anyway), and JSON result files cannot store infinity.
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"run config '{f.name.replace('_', '-')}' = {value!r}: must be a finite number")
    _check(cfg.seed >= 0, "seed", cfg.seed, ">= 0 (an integer; the partition and sampling draw from it)")
    _choice("method", cfg.method, METHODS)
    _choice("dataset", cfg.dataset, DATASETS)
    _choice("partition", cfg.partition, PARTITIONS)
    _choice("model", cfg.model, MODELS)
    _choice("device", cfg.device, DEVICES)
    _choice("teacher-mode", cfg.teacher_mode, TEACHER_MODES)
    _choice("fedlc-form", cfg.fedlc_form, FEDLC_FORMS)
    _choice("evaluation", cfg.evaluation, EVALUATIONS)
    _check(cfg.dirichlet_beta > 0, "dirichlet-beta", cfg.dirichlet_beta, "> 0 (e.g. 0.5, 0.1, 0.05)")
    _check(cfg.synthetic_alpha >= 0, "synthetic-alpha", cfg.synthetic_alpha, ">= 0")
    _check(cfg.synthetic_beta >= 0, "synthetic-beta", cfg.synthetic_beta, ">= 0")
    _check(cfg.synthetic_clients >= 1, "synthetic-clients", cfg.synthetic_clients, ">= 1")
    _check(cfg.train_pool_size >= 0, "train-pool-size", cfg.train_pool_size, ">= 0 (0 = the whole training pool)")
    if cfg.train_pool_size and cfg.dataset == "synthetic":
        raise ConfigError(
            "run config 'train-pool-size' subsamples an image dataset's training pool; dataset "
            "synthetic generates its clients (set synthetic-clients instead, or train-pool-size = 0)"
        )
    _check(cfg.shards_per_client >= 1, "shards-per-client", cfg.shards_per_client, ">= 1")
    _check(cfg.min_partition_size >= 1, "min-partition-size", cfg.min_partition_size, ">= 1")
    _check(cfg.num_server_rounds >= 1, "num-server-rounds", cfg.num_server_rounds, ">= 1")
    _check(0 < cfg.fraction_train <= 1, "fraction-train", cfg.fraction_train, "in (0, 1]")
    _check(cfg.min_nodes >= 1, "min-nodes", cfg.min_nodes, ">= 1")
    _check(cfg.round_timeout > 0, "round-timeout", cfg.round_timeout, "> 0 seconds")
    _check(0 <= cfg.min_fit_fraction <= 1, "min-fit-fraction", cfg.min_fit_fraction, "in [0, 1]")
    _check(cfg.round_retries >= 0, "round-retries", cfg.round_retries, ">= 0")
    _check(cfg.local_epochs >= 1, "local-epochs", cfg.local_epochs, ">= 1")
    _check(cfg.batch_size >= 1, "batch-size", cfg.batch_size, ">= 1")
    _check(cfg.eval_batch_size >= 1, "eval-batch-size", cfg.eval_batch_size, ">= 1")
    _check(cfg.lr > 0, "lr", cfg.lr, "> 0")
    _check(0 <= cfg.momentum < 1, "momentum", cfg.momentum, "in [0, 1)")
    _check(cfg.weight_decay >= 0, "weight-decay", cfg.weight_decay, ">= 0")
    _check(cfg.torch_threads >= 0, "torch-threads", cfg.torch_threads, ">= 0 (0 keeps torch's default)")
    _check(cfg.lambda_dis >= 0, "lambda-dis", cfg.lambda_dis, ">= 0")
    _check(cfg.logit_weight >= 0, "logit-weight", cfg.logit_weight, ">= 0")
    _check(cfg.paper_logit_weight >= 0, "paper-logit-weight", cfg.paper_logit_weight, ">= 0")
    _check(cfg.fedlc_tau >= 0, "fedlc-tau", cfg.fedlc_tau, ">= 0")
    _check(cfg.fedntd_beta >= 0, "fedntd-beta", cfg.fedntd_beta, ">= 0")
    _check(cfg.fedntd_tau > 0, "fedntd-tau", cfg.fedntd_tau, "> 0")
    _check(cfg.output_dir.strip() != "", "output-dir", cfg.output_dir, "a non-empty path")
    if cfg.resume and not cfg.run_name:
        raise ConfigError(
            "run config 'resume' = true needs 'run-name' set to the folder of the run to continue "
            "(the default name carries a timestamp and is never found again)"
        )
    if cfg.run_name:
        _check("/" not in cfg.run_name and cfg.run_name not in (".", ".."),
               "run-name", cfg.run_name, "a plain folder name (no '/')")
