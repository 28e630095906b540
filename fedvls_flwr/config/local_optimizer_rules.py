"""What a local optimizer needs of the rest of a run config: FedGF's adaptive c needs its
threshold T_D, which has no default. Registered with the part (``Part.rules``); torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedvls_flwr.config.registry import Selection


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
