"""FedGF (:mod:`fedvls_flwr.algorithms.fedgf`), a local optimizer with a server companion: its
spec, its rule and the settings its c-mode leaves unread, torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedvls_flwr.algorithms.local_optim_spec import SAM_RHO
from fedvls_flwr.config.settings import Setting, at_least, between
from fedvls_flwr.config.spec import Part, Selection

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


def fedgf_rules(values: Mapping[str, Any], selection: Selection) -> str | None:
    """FedGF's adaptive mode compares the divergence D with T_D, whose scale depends on the
    model, the data, the learning rate and the local steps: a value chosen on one setting
    (1.5 on digits) sits below round 1's D on another (about 1.6 on mnist10k at Dirichlet
    0.05), c jumps to 1 and training diverges. The authors' code has no default either."""
    if values["fedgf-c-mode"] != "adaptive" or float(values["fedgf-threshold"]) > 0:
        return None
    return ("run config 'fedgf-threshold' is unset (0) but fedgf-c-mode = 'adaptive' needs T_D > 0. It has no "
            "default: D's scale depends on the model, data, learning rate and local steps (1.5, fit to digits, lies "
            "below round 1's D of about 1.6 on mnist10k at Dirichlet 0.05, so c jumped to 1 and training "
            "diverged). Run with fedgf-c-mode='fixed' first: rounds.jsonl records D as fedgf_divergence every "
            "round; set fedgf-threshold inside their range (e.g. their median)")


def fedgf_unread(values: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """FedGF's settings its c-mode does not read: the threshold and window with a fixed c,
    the fixed c in the adaptive mode (key -> why, how to make it count)."""
    if values["fedgf-c-mode"] == "adaptive":
        return {"fedgf-c": ("read only with fedgf-c-mode = 'fixed' (this run: 'adaptive')", "set fedgf-c-mode='fixed'")}
    why = "read only with fedgf-c-mode = 'adaptive' (this run: 'fixed')"
    return {key: (why, "set fedgf-c-mode='adaptive'") for key in ("fedgf-threshold", "fedgf-window")}


FEDGF = Part(
    "fedgf", "FedGF", "fedvls_flwr.algorithms.fedgf:FedGFStep",
    (SAM_RHO, FEDGF_RHO_G, FEDGF_C, FEDGF_C_MODE, FEDGF_THRESHOLD, FEDGF_WINDOW),
    server="fedvls_flwr.algorithms.fedgf:FedGFServer", rules=fedgf_rules, unread=fedgf_unread,
    sends="from round 2: the perturbed global model w_g (a second copy of the weights) and the coefficient c",
)
