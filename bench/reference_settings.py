"""The reference loop's own table of settings and their defaults, and its experiment description.

The reference loop (:mod:`bench.reference_loop`) does the app's work from the documented rules
and imports nothing of the app (``tests/test_differential.py`` fails if it does). So it keeps
its own copy of every setting it reads, under the app's run-config names (so that one dict of
settings describes an experiment to both), with its own default written here, and where a
default comes from a paper, the authors' code or Flower, the comment names it. A default that
changes in the app and not here - or the other way round - shows up as a difference in the
differential test, which hands both sides only the settings a case names.

Three tables:

* :data:`GENERAL`: the run-wide settings the loop reads (data, partition, federation, local SGD);
* :data:`PARTS`: kind -> part -> its own settings with their defaults (the ``method``, the
  ``local-optimizer``, the ``server-optimizer`` and the ``protocol``); the implementation of
  every part is listed beside it in :data:`bench.reference_loop.IMPLEMENTATIONS`;
* :data:`NOT_MODELLED`: settings of the app that do not change what a run computes (where its
  files go, timeouts, diagnostics), accepted and ignored, each with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (PROJECT_DIR / ".." / "shared" / "data").resolve()

#: The run-wide settings and their defaults.
GENERAL: dict[str, Any] = {
    # ---- the experiment
    "method": "fedvls",
    "dataset": "digits",  # scikit-learn's digits: no download (README, "Datasets")
    "data-dir": "~/fedvls-data",
    "download": False,  # the reference never downloads: a missing file is an error
    "partition": "dirichlet",
    "dirichlet-beta": 0.05,  # the strongest skew of the FedVLS paper's Table 1 (0.5 / 0.1 / 0.05)
    "shards-per-client": 2,  # the FedVLS paper's Table 2: s = 2 for CIFAR-10
    "min-partition-size": 10,  # NIID-Bench's Dirichlet split redraws until every client has >= 10
    "seed": 0,
    "model": "auto",  # the paper's model for the dataset (DEFAULT_MODELS below)
    "train-pool-size": 0,  # 0: the whole training pool
    # ---- the federation
    "num-server-rounds": 30,
    "fraction-train": 1.0,  # the FedVLS paper's main tables: every client in every round (R = 1)
    "server-optimizer": "fedavg",
    "protocol": "standard",
    # ---- local training: the FedVLS paper's protocol (SGD, lr 0.01, momentum 0.9, batch 64,
    # weight decay 1e-5 for MNIST and CIFAR-10, 5 local epochs for MNIST)
    "local-epochs": 5,
    "batch-size": 64,
    "lr": 0.01,
    "momentum": 0.9,
    "weight-decay": 1e-5,
    "local-optimizer": "sgd",
    "optimizer-state": "fresh",  # a new optimizer every round: the FedVLS authors' client
    "augment": True,  # crop + flip + AutoAugment on the RGB sets (the reference supports augment = false only)
    # ---- hardware and evaluation
    "device": "auto",
    "deterministic": False,
    "torch-threads": 1,
    "eval-batch-size": 1024,
    "amp": False,  # the reference runs float32 only
    "evaluation": "auto",  # the reference evaluates the global model on the dataset's test split
}

#: kind -> part -> its settings and defaults. Sources: the FedVLS paper's appendix Table 10 for
#: the baselines it ran, else the method's own paper or its authors' code, and Flower 1.41's
#: strategies (``flwr/serverapp/strategy``) for the server optimizers it offers.
PARTS: dict[str, dict[str, dict[str, Any]]] = {
    "method": {
        "fedavg": {},
        "fedprox": {"fedprox-mu": 0.01},  # FedVLS Table 10
        # FedVLS Table 10 (mu, tau); MOON's ModelFedCon projects to out_dim = 256
        "moon": {"moon-mu": 0.01, "moon-tau": 0.5, "moon-projection-dim": 256},
        # FedVLS Table 10 (alpha); "binary" is the restricted softmax of the FedVLS and FedDecorr
        # baselines' code, "proportional" the FedRS authors' code
        "fedrs": {"fedrs-alpha": 0.7, "fedrs-form": "binary"},
        # FedVLS Table 10 (beta); the FedLMD authors' LMD_Loss runs T = 1; the FedNTD authors'
        # teacher (the same global-model distillation) runs in eval mode
        "fedlmd": {"fedlmd-beta": 0.1, "fedlmd-tau": 1.0, "teacher-mode": "eval"},
        "feddecorr": {"feddecorr-beta": 0.1},  # FedDecorr (Shi et al., ICLR 2023): beta = 0.1
        "fedmr": {"fedmr-deco": 4.0},  # FedVLS Table 10: deco = 4
        # FedVLS Table 10 (tau 0.5); "standard" keeps the label in the softmax (public code)
        "fedlc": {"fedlc-tau": 0.5, "fedlc-form": "standard"},
        "fedntd": {"fedntd-beta": 1.0, "fedntd-tau": 1.0, "teacher-mode": "eval"},  # the FedNTD authors' code
        # lambda 0.1 for MNIST / CIFAR-10 (FedVLS paper, section 5); the bounded logit term at
        # weight 0.005 (the FedVLS authors' code); the paper's eqs. 4-5 at weight 1
        "fedvls": {"lambda-dis": 0.1, "logit-weight": 0.005, "use-dis": True, "use-logit": True,
                   "teacher-mode": "eval"},
        "fedvls-paper": {"lambda-dis": 0.1, "paper-logit-weight": 1.0, "use-dis": True, "use-logit": True,
                         "teacher-mode": "eval"},
    },
    "local-optimizer": {
        "sgd": {},
        "sam": {"sam-rho": 0.1},  # FedVLS Table 10 (FedSAM rho = 0.1)
        # FedVLS Table 10 (rho = 0.1, c = 0.3); the FedGF authors' script: window W = 30; their
        # threshold T_D has no default (0 = unset: the adaptive mode needs one)
        "fedgf": {"sam-rho": 0.1, "fedgf-rho-g": 0.1, "fedgf-c": 0.3, "fedgf-c-mode": "fixed",
                  "fedgf-threshold": 0.0, "fedgf-window": 30},
    },
    "server-optimizer": {
        "fedavg": {},
        "fedexp": {"fedexp-eps": 0.01, "fedexp-eval": "last"},  # FedVLS Table 10 (FedEXP eps = 0.01)
        # Flower's FedAvgM: server_learning_rate = 1.0, server_momentum = 0.0
        "fedavgm": {"fedavgm-lr": 1.0, "fedavgm-momentum": 0.0},
        # Flower's FedAdam / FedYogi / FedAdagrad: eta 0.1 / 0.01 / 0.1, beta_1 0.9, beta_2 0.99, tau 1e-3
        "fedadam": {"fedadam-eta": 0.1, "fedadam-beta1": 0.9, "fedadam-beta2": 0.99, "fedadam-tau": 1e-3},
        "fedyogi": {"fedyogi-eta": 0.01, "fedyogi-beta1": 0.9, "fedyogi-beta2": 0.99, "fedyogi-tau": 1e-3},
        "fedadagrad": {"fedadagrad-eta": 0.1, "fedadagrad-tau": 1e-3},
    },
    "protocol": {
        "standard": {},
        # K = 2 (the FedVLS paper runs 2 and 4); 0 encoder rounds = the authors' run.sh split of
        # 50 encoder + 1000 classifier rounds (1 : 20); 3 head steps (sjtudyq/FedConcat
        # experiments.py); a new head, PyTorch's nn.Linear initialisation; "" = K-means
        "fedconcat": {"fedconcat-clusters": 2, "fedconcat-encoder-rounds": 0, "fedconcat-head-steps": 3,
                      "fedconcat-head-init": "random", "fedconcat-assignment": ""},
    },
}

#: The app's settings that do not change what a run computes, and why the reference ignores them.
NOT_MODELLED: dict[str, str] = {
    "min-nodes": "every simulated node is there from the start",
    "min-nodes-timeout": "a deployment's wait for nodes",
    "round-timeout": "no reply is ever late in one process",
    "min-fit-fraction": "no client fails here",
    "round-retries": "no round fails here",
    "server-device": "where the server evaluates (the reference evaluates where it trains)",
    # the app's GPU paths: the same arithmetic launched another way, ignored on a CPU (where the
    # differential test compares); on CUDA another kernel may round differently, not another formula
    "channels-last": "the conv nets' activations in NHWC on CUDA: a memory layout",
    "cuda-graphs": "each client's step captured once and replayed on CUDA: the same operations",
    "output-dir": "where the app writes its files",
    "run-name": "the app's run folder",
    "resume": "the reference runs every round in one go",
    "local-eval": "a diagnostic the clients report",
    "share-class-counts": "a diagnostic the clients report",
    "tracking": "an experiment tracker's log",
    "synthetic-alpha": "dataset 'synthetic' is not covered by the reference",
    "synthetic-beta": "dataset 'synthetic' is not covered by the reference",
    "synthetic-clients": "dataset 'synthetic' is not covered by the reference",
}

#: ``model = "auto"``: the FedVLS paper's networks (its MNIST net is a 3-layer MLP; CIFAR and
#: TinyImageNet use a CIFAR-style MobileNetV2).
DEFAULT_MODELS = {"digits": "mlp", "mnist": "mlp", "mnist10k": "mlp", "fmnist": "mlp",
                  "cifar10": "mobilenetv2", "cifar100": "mobilenetv2", "tinyimagenet": "mobilenetv2"}


def defaults() -> dict[str, Any]:
    """Every setting the reference reads, at its default (each part's own once)."""
    out = dict(GENERAL)
    for parts in PARTS.values():
        for settings in parts.values():
            for key, value in settings.items():
                if out.setdefault(key, value) != value:
                    raise AssertionError(f"{key} has two defaults in PARTS")
    return out


LOOP_KEYS = ("num_clients", "threads", "loader")
LOADERS = ("index", "dataloader")


@dataclass(frozen=True)
class RefConfig:
    """One experiment of the reference loop: every setting (run-config names, defaults filled
    in from the tables above), the number of clients (the app's num-supernodes) and how the
    loop itself runs. ``cfg.lr``, ``cfg.local_epochs``, ... read the settings."""

    values: Mapping[str, Any] = field(default_factory=defaults)
    num_clients: int = 10
    threads: int = 1
    loader: str = "index"  # "index" | "dataloader"

    def __post_init__(self) -> None:
        if self.loader not in LOADERS:
            raise ValueError(f"loader must be one of {LOADERS}, got {self.loader!r}")
        known = set(defaults())
        unknown = sorted(set(self.values) - known - set(NOT_MODELLED))
        if unknown:
            raise ValueError(f"the reference loop does not know the setting(s) {unknown}")
        for kind, parts in PARTS.items():
            if self.values[kind] not in parts:
                raise NotCovered(
                    f"the reference loop has no reference for {kind} '{self.values[kind]}': write it out from "
                    f"its formula (bench/reference_*.py) and add it to PARTS and IMPLEMENTATIONS")

    def __getattr__(self, name: str) -> Any:
        if name == "values":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        key = name.replace("_", "-")
        if key in self.values:
            return self.values[key]
        raise AttributeError(name)

    @classmethod
    def of(cls, settings: Mapping[str, Any], *, num_clients: int = 10, threads: int = 1,
           loader: str = "index") -> RefConfig:
        """``settings`` (run-config names) over the reference's own defaults; the app's settings
        that change nothing computed (:data:`NOT_MODELLED`) are dropped."""
        given = {k: v for k, v in settings.items() if k not in NOT_MODELLED}
        return cls({**defaults(), **given}, num_clients, threads, loader)

    @classmethod
    def make(cls, *, num_clients: int = 10, threads: int = 1, loader: str = "index", **settings: Any) -> RefConfig:
        """Settings as keyword arguments (``dirichlet_beta=0.5``) over the benchmark's workload."""
        overrides = {key.replace("_", "-"): value for key, value in settings.items()}
        return cls.of({**BENCH_SETTINGS, **overrides}, num_clients=num_clients, threads=threads, loader=loader)

    def replace(self, **changes: Any) -> RefConfig:
        own = {k: changes.pop(k) for k in LOOP_KEYS if k in changes}
        values = {**self.values, **{k.replace("_", "-"): v for k, v in changes.items()}}
        return dataclasses.replace(self, values=values, **own)

    def run_config(self) -> dict[str, Any]:
        """The app's run config that describes the same experiment (every setting, by name)."""
        return dict(self.values)

    def params(self, kind: str) -> dict[str, Any]:
        """The settings of the run's part of ``kind``."""
        return {key: self.values[key] for key in PARTS[kind][self.values[kind]]}

    @property
    def model_name(self) -> str:
        return DEFAULT_MODELS[self.dataset] if self.model == "auto" else str(self.model)


class NotCovered(ValueError):
    """A run selects a part or a dataset the reference loop has no reference for."""


#: The benchmark's workload where it differs from the defaults: the paper's MNIST protocol on
#: mnist10k, 20 rounds.
BENCH_SETTINGS = {"dataset": "mnist10k", "data-dir": str(DEFAULT_DATA_DIR), "num-server-rounds": 20}
