"""The method registry: every local objective with its label, its own run-config keys and
what it needs - declared once, torch-free.

The ServerApp validates a run config before it imports torch, and reports and presets are
read on machines without a GPU stack, so nothing here imports torch: each method names its
objective class by import path (``module:Class``), loaded only when a client trains.

Adding a method is one objective class (with its loop-reference test) plus one
:class:`Method` entry below. Config validation (the ``method`` choices and the method's
keys), :func:`fedvls_flwr.objectives.build_objective`, report labels and ordering, and the
test that pyproject's defaults match the declarations all read :data:`METHODS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .settings import Setting, at_least, greater

# --------------------------------------------------------------------------- method settings
# A setting used by several methods is one object listed by each of them.

LAMBDA_DIS = Setting(
    "lambda-dis", 0.1, "FedVLS vacant-class distillation weight (0.5 for CIFAR-100/TinyImageNet in the paper)",
    **at_least(0),
)
LOGIT_WEIGHT = Setting("logit-weight", 0.005, "weight of the bounded logit suppression in fedvls", **at_least(0))
PAPER_LOGIT_WEIGHT = Setting(
    "paper-logit-weight", 1.0, "weight of the paper's (unbounded) logit suppression in fedvls-paper", **at_least(0)
)
USE_DIS = Setting("use-dis", True, "FedVLS: keep the vacant-class distillation term (Table 5 ablation)",
                  label={False: "−L_dis"})
USE_LOGIT = Setting("use-logit", True, "FedVLS: keep the logit suppression term (Table 5 ablation)",
                    label={False: "−L_logit"})
FEDLC_TAU = Setting("fedlc-tau", 0.5, "FedLC margin scale tau (margin tau * n_c^(-1/4))", **at_least(0))
FEDLC_FORM = Setting(
    "fedlc-form", "standard", "FedLC softmax: 'standard' keeps the label in the denominator, 'paper' drops it",
    choices=("standard", "paper"), label={"paper": "(paper form)"},
)
FEDNTD_BETA = Setting("fedntd-beta", 1.0, "FedNTD distillation weight beta", **at_least(0))
FEDNTD_TAU = Setting("fedntd-tau", 1.0, "FedNTD temperature tau", **greater(0))
TEACHER_MODE = Setting(
    "teacher-mode", "eval", "mode of the frozen global model used as teacher ('train' = the FedVLS code)",
    choices=("eval", "train"), label={"train": "(teacher train)"},
)


@dataclass(frozen=True)
class Method:
    """A local training objective.

    Parameters
    ----------
    name
        The run-config value of ``method``.
    label
        How tables and plots name it.
    objective
        ``"module:Class"`` of its objective (a :class:`fedvls_flwr.objectives.Objective`).
    settings
        Its own run-config keys; the objective receives exactly these (kebab-case keys).
    uses_teacher
        Its loss reads the received global model's outputs (with its default settings and
        a client missing at least two classes).
    client_state
        It keeps state on a client from one round to the next.
    """

    name: str
    label: str
    objective: str
    settings: tuple[Setting, ...] = ()
    uses_teacher: bool = False
    client_state: bool = False

    def defaults(self) -> dict[str, Any]:
        return {s.key: s.default for s in self.settings}

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """This method's settings out of a whole run config (kebab-case keys)."""
        return {s.key: values[s.key] for s in self.settings}

    def variant_label(self, values: Mapping[str, Any]) -> str:
        """The label plus a fragment for every setting whose value has one (``FedVLS −L_dis``)."""
        parts = [self.label]
        for s in self.settings:
            value = values.get(s.key, s.default)
            if value in s.label:
                parts.append(s.label[value])
        return " ".join(parts)

    def variant_flags(self, values: Mapping[str, Any]) -> tuple[bool, ...]:
        """Which label fragments apply, in settings order (orders the variants of a method)."""
        return tuple(values.get(s.key, s.default) in s.label for s in self.settings if s.label)


_OBJECTIVES = "fedvls_flwr.objectives"

#: Every method, in the order tables and plots show them.
METHODS: tuple[Method, ...] = (
    Method("fedavg", "FedAvg", f"{_OBJECTIVES}:FedAvgObjective"),
    Method("fedlc", "FedLC", f"{_OBJECTIVES}:FedLCObjective", (FEDLC_TAU, FEDLC_FORM)),
    Method("fedntd", "FedNTD", f"{_OBJECTIVES}:FedNTDObjective", (FEDNTD_BETA, FEDNTD_TAU, TEACHER_MODE),
           uses_teacher=True),
    Method("fedvls", "FedVLS", f"{_OBJECTIVES}:FedVLSObjective",
           (LAMBDA_DIS, LOGIT_WEIGHT, USE_DIS, USE_LOGIT, TEACHER_MODE), uses_teacher=True),
    Method("fedvls-paper", "FedVLS (paper form)", f"{_OBJECTIVES}:FedVLSPaperObjective",
           (LAMBDA_DIS, PAPER_LOGIT_WEIGHT, USE_DIS, USE_LOGIT, TEACHER_MODE), uses_teacher=True),
)

_BY_NAME = {m.name: m for m in METHODS}


def method_names() -> tuple[str, ...]:
    return tuple(m.name for m in METHODS)


def get_method(name: str) -> Method:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(method_names())}") from None


def method_settings() -> tuple[Setting, ...]:
    """Every method's settings, each once, in registry order."""
    seen: dict[str, Setting] = {}
    for m in METHODS:
        for s in m.settings:
            if seen.setdefault(s.key, s) is not s:
                raise AssertionError(f"setting {s.key!r} is declared twice with different definitions")
    return tuple(seen.values())


def owners(key: str) -> tuple[str, ...]:
    """The methods that read run-config ``key`` (empty for a general setting)."""
    return tuple(m.name for m in METHODS if any(s.key == key for s in m.settings))


def method_params(config: Any) -> dict[str, Any]:
    """The settings the run's method reads, from a validated run config (the one way an
    objective gets its parameters)."""
    values = config.to_flower()
    return get_method(values["method"]).params(values)
