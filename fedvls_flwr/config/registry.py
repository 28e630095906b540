"""The registry: the parts a run may select, listed by kind - nothing else is declared here.

Each part declares itself in its spec (:class:`~fedvls_flwr.config.spec.Part`), written beside
its implementation (``fedvls_flwr/algorithms/**/<module>_spec.py``, torch-free); this module
lists the specs in the order tables and plots show them and answers questions about the lists
(which part a run selects, who reads a setting, a run's label). Config validation, the
generated RunConfig fields, pyproject's defaults and docs/configuration.md, the builders of
:mod:`fedvls_flwr.algorithms.build` and the report labels all read these lists;
``tests/test_methods.py`` fails for a spec module whose parts are not listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedvls_flwr.algorithms import fedconcat_spec, fedgf_spec, local_optim_spec, rounds_spec, server_optim_spec
from fedvls_flwr.algorithms.objectives import base_spec, baselines_spec, fedmr_spec, fedvls_spec
from fedvls_flwr.config.settings import Setting
from fedvls_flwr.config.spec import SITE_STATISTICS, Part, Selection

__all__ = [
    "KINDS", "LOCAL_OPTIMIZERS", "METHODS", "PROTOCOLS", "SERVER_KINDS", "SERVER_OPTIMIZERS", "SITE_STATISTICS",
    "Part", "Selection", "all_parts", "combination_label", "get_method", "get_part", "method_names",
    "method_settings", "owners", "part_names", "run_parts", "site_shares",
]

#: Local objectives (run-config ``method``), in the order tables and plots show them.
METHODS: tuple[Part, ...] = (
    base_spec.FEDAVG,
    baselines_spec.FEDPROX,
    baselines_spec.MOON,
    baselines_spec.FEDRS,
    baselines_spec.FEDLMD,
    baselines_spec.FEDDECORR,
    fedmr_spec.FEDMR,
    baselines_spec.FEDLC,
    baselines_spec.FEDNTD,
    fedvls_spec.FEDVLS,
    fedvls_spec.FEDVLS_PAPER,
)

#: Local optimizers (run-config ``local-optimizer``): how a client turns gradients into steps.
LOCAL_OPTIMIZERS: tuple[Part, ...] = (local_optim_spec.SGD, local_optim_spec.SAM, fedgf_spec.FEDGF)

#: Server optimizers (run-config ``server-optimizer``): how the checked, sample-weighted
#: average of the clients' models becomes the next global model.
SERVER_OPTIMIZERS: tuple[Part, ...] = (
    server_optim_spec.AVERAGE,
    server_optim_spec.FEDEXP,
    server_optim_spec.FEDAVGM,
    server_optim_spec.FEDADAM,
    server_optim_spec.FEDYOGI,
    server_optim_spec.FEDADAGRAD,
)

#: Protocols (run-config ``protocol``): the shape of the federation - what the server keeps
#: between rounds, what each message carries and how the replies combine.
PROTOCOLS: tuple[Part, ...] = (rounds_spec.STANDARD, fedconcat_spec.FEDCONCAT)

#: The kinds whose implementation runs on the server (a :class:`fedvls_flwr.algorithms.parts.ServerPart`);
#: a part of the other kinds runs on the clients and may declare a server companion (``Part.server``).
SERVER_KINDS = ("server-optimizer", "protocol")

#: The run-config key that selects each kind of part, its registry and its default part.
KINDS: dict[str, tuple[tuple[Part, ...], str]] = {
    "method": (METHODS, "fedvls"),
    "local-optimizer": (LOCAL_OPTIMIZERS, "sgd"),
    "server-optimizer": (SERVER_OPTIMIZERS, "fedavg"),
    "protocol": (PROTOCOLS, "standard"),
}


def part_names(kind: str = "method") -> tuple[str, ...]:
    return tuple(p.name for p in KINDS[kind][0])


def method_names() -> tuple[str, ...]:
    return part_names("method")


def get_part(kind: str, name: str) -> Part:
    for part in KINDS[kind][0]:
        if part.name == name:
            return part
    raise ValueError(f"unknown {kind} {name!r}; choose one of: {', '.join(part_names(kind))}")


def get_method(name: str) -> Part:
    return get_part("method", name)


def all_parts() -> tuple[Part, ...]:
    return tuple(p for parts, _ in KINDS.values() for p in parts)


def method_settings() -> tuple[Setting, ...]:
    """Every part's settings, each once, in registry order."""
    seen: dict[str, Setting] = {}
    for part in all_parts():
        for s in part.settings:
            if seen.setdefault(s.key, s) is not s:
                raise AssertionError(f"setting {s.key!r} is declared twice with different definitions")
    return tuple(seen.values())


def owners(key: str) -> tuple[tuple[str, str], ...]:
    """(kind, part name) of every part that reads run-config ``key`` (empty for a general setting)."""
    return tuple(
        (kind, p.name) for kind, (parts, _) in KINDS.items() for p in parts if any(s.key == key for s in p.settings)
    )


def run_parts(values: Mapping[str, Any]) -> dict[str, Part]:
    """kind -> the part a run config selects (the default part where the key is absent)."""
    return {kind: get_part(kind, str(values.get(kind, default))) for kind, (_, default) in KINDS.items()}


def site_shares(values: Mapping[str, Any]) -> frozenset[str]:
    """The per-site statistics a run's parts need on the server (the union of their ``shares``)."""
    return frozenset(s for part in run_parts(values).values() for s in part.shares)


def combination_label(values: Mapping[str, Any], typed: bool = True) -> str:
    """A run's parts, naming only those that differ from the defaults: "FedVLS",
    "FedVLS + FedSAM + FedExP", "FedSAM" (FedAvg's objective with SAM steps), "FedExP"."""
    labels = []
    for kind, part in run_parts(values).items():
        default = KINDS[kind][1]
        if kind == "method" or part.name != default:
            labels.append(part.variant_label(values))
    if len(labels) > 1 and str(values.get("method", "fedvls")) == "fedavg" and labels[0] == "FedAvg":
        labels = labels[1:]  # FedAvg's plain objective with another part reads as that part
    return " + ".join(labels)
