"""The registry of methods: every local objective, local optimizer and server optimizer,
with its label, its own run-config keys and what it needs - declared once, torch-free.

A run combines four parts: ``method`` (the local objective), ``local-optimizer``,
``server-optimizer`` and ``protocol`` (the shape of the federation: one global model, or
FedConcat's stages). Each registered :class:`Part` names its implementation by import
path (``module:attr``), loaded only where it runs, so nothing here imports torch: the
ServerApp validates a run config before it imports torch, and reports are read on
machines without a GPU stack.

Adding a method is one implementation class (with its loop-reference test) plus one
:class:`Part` entry below. Config validation (the choices and the part's keys),
:func:`fedvls_flwr.algorithms.objectives.build_objective`, report labels and ordering, and the test
that pyproject's defaults match the declarations all read these tuples.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fedvls_flwr.config.local_optimizer_rules import fedgf_rules
from fedvls_flwr.config.protocol_rules import fedconcat_federation_rules, fedconcat_needs_shares, fedconcat_rules
from fedvls_flwr.config.settings import Setting, at_least, between, greater

# --------------------------------------------------------------------------- settings
# A setting used by several parts is one object listed by each of them.

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
FEDPROX_MU = Setting("fedprox-mu", 0.01, "FedProx proximal weight mu: + (mu/2) ||w - w_global||^2", **at_least(0))
MOON_MU = Setting("moon-mu", 0.01, "MOON model-contrastive loss weight mu", **at_least(0))
MOON_TAU = Setting("moon-tau", 0.5, "MOON temperature tau of the cosine similarities", **greater(0))
MOON_DIM = Setting("moon-projection-dim", 256, "MOON projection head output size", **at_least(1))
FEDRS_ALPHA = Setting(
    "fedrs-alpha", 0.7, "FedRS: logits of the classes a client does not hold are scaled by alpha",
    **between(0, 1, low_open=True),
)
FEDRS_FORM = Setting(
    "fedrs-form", "binary", "FedRS scaling: 'binary' (absent classes x alpha) or 'proportional' (the authors' code)",
    choices=("binary", "proportional"), label={"proportional": "(proportional)"},
)
FEDLMD_BETA = Setting("fedlmd-beta", 0.1, "FedLMD distillation weight beta", **at_least(0))
FEDLMD_TAU = Setting("fedlmd-tau", 1.0, "FedLMD temperature", **greater(0))
FEDMR_DECO = Setting("fedmr-deco", 4.0, "FedMR intra-class decorrelation weight (deco; 4 in the FedVLS paper)",
                     **at_least(0))
FEDDECORR_BETA = Setting("feddecorr-beta", 0.1, "FedDecorr decorrelation weight", **at_least(0))
SAM_RHO = Setting("sam-rho", 0.1, "FedSAM and FedGF client perturbation radius rho", **greater(0))
FEDGF_RHO_G = Setting("fedgf-rho-g", 0.1, "FedGF: distance rho_g of the perturbed global model from the global model",
                      **at_least(0))
FEDGF_C = Setting("fedgf-c", 0.3, "FedGF: weight c of the perturbed global model in the SAM point (fixed mode)",
                  **between(0, 1))
FEDGF_C_MODE = Setting(
    "fedgf-c-mode", "fixed", "FedGF: 'fixed' (c = fedgf-c) or 'adaptive' (the authors' code: from the divergence D)",
    choices=("fixed", "adaptive"), label={"adaptive": "(adaptive c)"},
)
FEDGF_THRESHOLD = Setting(
    "fedgf-threshold", 0.0,
    "FedGF adaptive c: threshold T_D on D = mean_k ||w_global - w_k||; no default: required with fedgf-c-mode='adaptive'",
    **at_least(0, "0 = unset"),
)
FEDGF_WINDOW = Setting("fedgf-window", 30, "FedGF adaptive c: window W of rounds (the authors' script: 30)",
                       **at_least(1))
FEDEXP_EPS = Setting("fedexp-eps", 0.01, "FedExP epsilon in the server step size", **greater(0))
FEDEXP_EVAL = Setting(
    "fedexp-eval", "last", "FedExP: evaluate the last global model, or the average of the last two (the paper)",
    choices=("last", "average-last-two"), label={"average-last-two": "(avg of last 2)"},
)
FEDAVGM_LR = Setting("fedavgm-lr", 1.0, "FedAvgM server learning rate (Flower's default)", **greater(0))
FEDAVGM_MOMENTUM = Setting("fedavgm-momentum", 0.0, "FedAvgM server momentum (Flower's default)",
                           **between(0, 1, high_open=True))


class EveryValueLabel(Mapping[Any, str]):
    """A label fragment for every value of a setting (``"K={}"`` -> ``K=4``), so tables tell
    the settings' values apart without listing them."""

    def __init__(self, template: str) -> None:
        self.template = template

    def __contains__(self, value: object) -> bool:
        return True

    def __getitem__(self, value: Any) -> str:
        return self.template.format(value)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True


FEDCONCAT_CLUSTERS = Setting("fedconcat-clusters", 2, "FedConcat: number of clusters K (2 or 4 in the FedVLS paper)",
                             label=EveryValueLabel("K={}"), **at_least(1))
FEDCONCAT_ENCODER_ROUNDS = Setting(
    "fedconcat-encoder-rounds", 0,
    "FedConcat: rounds of stage 1 (FedAvg inside each cluster); 0 = the authors' 1 : 20 split of num-server-rounds",
    **at_least(0, "0 = the 1 : 20 split"),
)
FEDCONCAT_HEAD_STEPS = Setting("fedconcat-head-steps", 3, "FedConcat stage 2: mini-batches per client and round on the head",
                               **at_least(1))
FEDCONCAT_HEAD_INIT = Setting(
    "fedconcat-head-init", "random",
    "FedConcat: the new head starts random, or from the clusters' heads side by side (the authors' CIFAR-100 start)",
    choices=("random", "concat"), label={"concat": "(head from clusters)"},
)
FEDCONCAT_ASSIGNMENT = Setting(
    "fedconcat-assignment", "",
    "FedConcat: the cluster of partition 0, 1, ... ('0,1,0,1'); empty = K-means over the sites' label distributions",
    check=lambda v: v == "" or re.fullmatch(r"\d+(,\d+)*", v.replace(" ", "")) is not None,
    rule="comma-separated cluster numbers, one per partition id, e.g. '0,1,0,1' (empty: K-means)",
)


def _adaptive(name: str, eta: float, beta1: bool = True) -> tuple[Setting, ...]:
    """eta, (beta1, beta2,) tau of Flower's adaptive server optimizers, at Flower's defaults."""
    out = [Setting(f"{name}-eta", eta, f"{name} server learning rate eta (Flower's default)", **greater(0))]
    if beta1:
        out += [
            Setting(f"{name}-beta1", 0.9, f"{name} first-moment decay (Flower's default)", **between(0, 1, high_open=True)),
            Setting(f"{name}-beta2", 0.99, f"{name} second-moment decay (Flower's default)",
                    **between(0, 1, high_open=True)),
        ]
    out.append(Setting(f"{name}-tau", 1e-3, f"{name} adaptivity tau (Flower's default)", **greater(0)))
    return tuple(out)


#: Per-site statistics a part may declare in ``Part.shares``, with what they reveal (docs).
SITE_STATISTICS: dict[str, str] = {
    "class-counts": "the site's number of training samples of every class (its label distribution)",
}


@dataclass(frozen=True)
class Selection:
    """What a part's rules may know of a run besides its values: the parts it combines (kind ->
    part) and the model it trains (``auto`` resolved)."""

    parts: Mapping[str, Part]
    model: str
    model_has_encoder: bool


@dataclass(frozen=True)
class Part:
    """One registered part of a run: a local objective, local optimizer or server optimizer.

    Parameters
    ----------
    name
        The run-config value that selects it (``method = "fedvls"``, ``server-optimizer = "fedexp"``).
    label
        How tables and plots name it.
    impl
        ``"module:attr"`` of its implementation (for objectives a
        :class:`fedvls_flwr.algorithms.objectives.Objective` subclass).
    settings
        Its own run-config keys; the implementation receives exactly these (kebab-case keys).

    shares
        The per-site statistics the server needs from every site for this part (names from
        :data:`SITE_STATISTICS`). A site's reply carries only what the run's parts declare
        here: FedAvg, FedLC, FedNTD and FedVLS declare nothing, so no label distribution
        leaves a site for them.
    shares_needed
        Whether a run (its values) needs the declared ``shares`` at all; None: whenever the part
        runs. FedConcat needs its sites' label distributions only for K-means: with
        ``fedconcat-assignment`` given, nothing is asked of a site and nothing leaves it.
    server
        ``"module:attr"`` of the part's server-side companion, for a part that needs state
        kept on the server and sent with the weights (FedGF's perturbed global point and
        coefficient c); ``None`` for the parts that need none. Its interface:
        :class:`fedvls_flwr.algorithms.downlink.ServerCompanion`.
    sends
        What the part adds to the server's messages besides the global weights, in words (the
        docs' table of what each part sends and shares is generated from it); empty for the
        parts that add nothing.
    rules
        What the part needs of the rest of a run config (its values, and the :class:`Selection`:
        the other parts, the model): a message saying what is wrong and how to fix it, or None
        (checked with every run config, before anything runs).
    federation_rules
        What the part needs of the federation's size (the number of nodes, one partition
        each): a message or None; checked where the size is known (``fedvls check
        --num-supernodes``, a sweep's federation, the deploy tools), before anything runs.

    What a method needs of the training loop (a teacher, features, a projection head, state
    kept between rounds) is said once, by its implementation class (the hooks of
    :class:`fedvls_flwr.algorithms.objectives.base.Objective`), not repeated here.
    """

    name: str
    label: str
    impl: str
    settings: tuple[Setting, ...] = ()
    shares: tuple[str, ...] = ()
    shares_needed: Callable[[Mapping[str, Any]], bool] | None = None
    server: str | None = None
    sends: str = ""
    rules: Callable[[Mapping[str, Any], Selection], str | None] | None = None
    federation_rules: Callable[[Mapping[str, Any], int], str | None] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.shares) - set(SITE_STATISTICS))
        if unknown:
            raise ValueError(f"part {self.name!r} shares unknown site statistics {unknown}; known: {sorted(SITE_STATISTICS)}")
        if self.server is not None and not self.sends:
            raise ValueError(f"part {self.name!r} has a server companion: declare what it sends (Part.sends)")

    def load_server(self) -> Any:
        """The server-side companion class, or None (imported on first use)."""
        if self.server is None:
            return None
        module, _, attr = self.server.partition(":")
        return getattr(importlib.import_module(module), attr)

    def load(self) -> Any:
        """The implementation (imported on first use: torch stays out of the config layer)."""
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)

    def defaults(self) -> dict[str, Any]:
        return {s.key: s.default for s in self.settings}

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """This part's settings out of a whole run config (kebab-case keys)."""
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
        """Which label fragments apply, in settings order (orders the variants of a part)."""
        return tuple(values.get(s.key, s.default) in s.label for s in self.settings if s.label)


_OBJ = "fedvls_flwr.algorithms.objectives"
_BASE, _VLS, _BASELINES = f"{_OBJ}.base", f"{_OBJ}.fedvls", f"{_OBJ}.baselines"
_LOCAL = "fedvls_flwr.algorithms.local_optim"
_SERVER = "fedvls_flwr.algorithms.server_optim"

#: Local objectives (run-config ``method``), in the order tables and plots show them.
METHODS: tuple[Part, ...] = (
    Part("fedavg", "FedAvg", f"{_BASE}:FedAvgObjective"),
    Part("fedprox", "FedProx", f"{_BASELINES}:FedProxObjective", (FEDPROX_MU,)),
    Part("moon", "MOON", f"{_BASELINES}:MOONObjective", (MOON_MU, MOON_TAU, MOON_DIM)),
    Part("fedrs", "FedRS", f"{_BASELINES}:FedRSObjective", (FEDRS_ALPHA, FEDRS_FORM)),
    Part("fedlmd", "FedLMD", f"{_BASELINES}:FedLMDObjective", (FEDLMD_BETA, FEDLMD_TAU, TEACHER_MODE)),
    Part("feddecorr", "FedDecorr", f"{_BASELINES}:FedDecorrObjective", (FEDDECORR_BETA,)),
    Part("fedmr", "FedMR", f"{_OBJ}.fedmr:FedMRObjective", (FEDMR_DECO,)),
    Part("fedlc", "FedLC", f"{_BASELINES}:FedLCObjective", (FEDLC_TAU, FEDLC_FORM)),
    Part("fedntd", "FedNTD", f"{_BASELINES}:FedNTDObjective", (FEDNTD_BETA, FEDNTD_TAU, TEACHER_MODE)),
    Part("fedvls", "FedVLS", f"{_VLS}:FedVLSObjective",
         (LAMBDA_DIS, LOGIT_WEIGHT, USE_DIS, USE_LOGIT, TEACHER_MODE)),
    Part("fedvls-paper", "FedVLS (paper form)", f"{_VLS}:FedVLSPaperObjective",
         (LAMBDA_DIS, PAPER_LOGIT_WEIGHT, USE_DIS, USE_LOGIT, TEACHER_MODE)),
)

#: Local optimizers (run-config ``local-optimizer``): how a client turns gradients into steps.
LOCAL_OPTIMIZERS: tuple[Part, ...] = (
    Part("sgd", "SGD", f"{_LOCAL}:SGDStep"),
    Part("sam", "FedSAM", f"{_LOCAL}:SAMStep", (SAM_RHO,)),
    Part("fedgf", "FedGF", "fedvls_flwr.algorithms.fedgf:FedGFStep",
         (SAM_RHO, FEDGF_RHO_G, FEDGF_C, FEDGF_C_MODE, FEDGF_THRESHOLD, FEDGF_WINDOW),
         server="fedvls_flwr.algorithms.fedgf:FedGFServer", rules=fedgf_rules,
         sends="from round 2: the perturbed global model w_g (a second copy of the weights) and the coefficient c"),
)

#: Server optimizers (run-config ``server-optimizer``): how the checked, sample-weighted
#: average of the clients' models becomes the next global model.
SERVER_OPTIMIZERS: tuple[Part, ...] = (
    Part("fedavg", "FedAvg", f"{_SERVER}:Average"),
    Part("fedexp", "FedExP", f"{_SERVER}:FedExP", (FEDEXP_EPS, FEDEXP_EVAL)),
    Part("fedavgm", "FedAvgM", f"{_SERVER}:FedAvgM", (FEDAVGM_LR, FEDAVGM_MOMENTUM)),
    Part("fedadam", "FedAdam", f"{_SERVER}:FedAdam", _adaptive("fedadam", 0.1)),
    Part("fedyogi", "FedYogi", f"{_SERVER}:FedYogi", _adaptive("fedyogi", 0.01)),
    Part("fedadagrad", "FedAdagrad", f"{_SERVER}:FedAdagrad", _adaptive("fedadagrad", 0.1, beta1=False)),
)

_ROUNDS = "fedvls_flwr.algorithms.rounds"

#: Protocols (run-config ``protocol``): the shape of the federation - what the server keeps
#: between rounds, what each message carries and how the replies combine.
PROTOCOLS: tuple[Part, ...] = (
    Part("standard", "Standard", f"{_ROUNDS}:StandardRounds"),
    Part("fedconcat", "FedConcat", "fedvls_flwr.algorithms.fedconcat:FedConcat",
         (FEDCONCAT_CLUSTERS, FEDCONCAT_ENCODER_ROUNDS, FEDCONCAT_HEAD_STEPS, FEDCONCAT_HEAD_INIT, FEDCONCAT_ASSIGNMENT),
         shares=("class-counts",), shares_needed=fedconcat_needs_shares, rules=fedconcat_rules,
         federation_rules=fedconcat_federation_rules,
         sends="stage 1: the site's cluster model instead of one global model; stage 2: the K frozen encoders, "
               "once per node, then the head each round"),
)

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
    """The per-site statistics a run's parts need on the server (the union of their ``shares``,
    of the parts that need them with these values: ``Part.shares_needed``)."""
    return frozenset(s for part in run_parts(values).values()
                     if part.shares_needed is None or part.shares_needed(values) for s in part.shares)


def method_params(config: Any) -> dict[str, Any]:
    """The settings the run's method reads, from a validated run config (the one way an
    objective gets its parameters)."""
    values = config.to_flower()
    return get_method(values["method"]).params(values)


def part_params(config: Any, kind: str) -> dict[str, Any]:
    """The settings of the part of ``kind`` a validated run config selects."""
    values = config.to_flower()
    return get_part(kind, values[kind]).params(values)


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
