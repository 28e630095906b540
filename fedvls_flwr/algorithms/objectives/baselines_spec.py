"""The baselines' local objectives (:mod:`fedvls_flwr.algorithms.objectives.baselines`): FedProx,
MOON, FedRS, FedLMD, FedDecorr, FedLC and FedNTD - their specs, torch-free
(:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.algorithms.objectives.base_spec import TEACHER_MODE
from fedvls_flwr.config.settings import Setting, at_least, between, greater
from fedvls_flwr.config.spec import Part

_IMPL = "fedvls_flwr.algorithms.objectives.baselines"

FEDPROX_MU = Setting("fedprox-mu", 0.01, "FedProx proximal weight mu: + (mu/2) ||w - w_global||^2", **at_least(0))
FEDPROX = Part("fedprox", "FedProx", f"{_IMPL}:FedProxObjective", (FEDPROX_MU,))

MOON_MU = Setting("moon-mu", 0.01, "MOON model-contrastive loss weight mu", **at_least(0))
MOON_TAU = Setting("moon-tau", 0.5, "MOON temperature tau of the cosine similarities", **greater(0))
MOON_DIM = Setting("moon-projection-dim", 256, "MOON projection head output size", **at_least(1))
#: MOON's network carries a projection head between the features and the classifier
#: (``with_projection_head``); its previous local model is client state (``MOONObjective.keep``).
MOON = Part("moon", "MOON", f"{_IMPL}:MOONObjective", (MOON_MU, MOON_TAU, MOON_DIM),
            wraps_model=f"{_IMPL}:with_projection_head")

FEDRS_ALPHA = Setting(
    "fedrs-alpha", 0.7, "FedRS: logits of the classes a client does not hold are scaled by alpha",
    **between(0, 1, low_open=True),
)
FEDRS_FORM = Setting(
    "fedrs-form", "binary", "FedRS scaling: 'binary' (absent classes x alpha) or 'proportional' (the authors' code)",
    choices=("binary", "proportional"), label={"proportional": "(proportional)"},
)
FEDRS = Part("fedrs", "FedRS", f"{_IMPL}:FedRSObjective", (FEDRS_ALPHA, FEDRS_FORM))

FEDLMD_BETA = Setting("fedlmd-beta", 0.1, "FedLMD distillation weight beta", **at_least(0))
FEDLMD_TAU = Setting("fedlmd-tau", 1.0, "FedLMD temperature", **greater(0))
FEDLMD = Part("fedlmd", "FedLMD", f"{_IMPL}:FedLMDObjective", (FEDLMD_BETA, FEDLMD_TAU, TEACHER_MODE))

FEDDECORR_BETA = Setting("feddecorr-beta", 0.1, "FedDecorr decorrelation weight", **at_least(0))
FEDDECORR = Part("feddecorr", "FedDecorr", f"{_IMPL}:FedDecorrObjective", (FEDDECORR_BETA,))

FEDLC_TAU = Setting("fedlc-tau", 0.5, "FedLC margin scale tau (margin tau * n_c^(-1/4))", **at_least(0))
FEDLC_FORM = Setting(
    "fedlc-form", "standard", "FedLC softmax: 'standard' keeps the label in the denominator, 'paper' drops it",
    choices=("standard", "paper"), label={"paper": "(paper form)"},
)
FEDLC = Part("fedlc", "FedLC", f"{_IMPL}:FedLCObjective", (FEDLC_TAU, FEDLC_FORM))

FEDNTD_BETA = Setting("fedntd-beta", 1.0, "FedNTD distillation weight beta", **at_least(0))
FEDNTD_TAU = Setting("fedntd-tau", 1.0, "FedNTD temperature tau", **greater(0))
FEDNTD = Part("fedntd", "FedNTD", f"{_IMPL}:FedNTDObjective", (FEDNTD_BETA, FEDNTD_TAU, TEACHER_MODE))
