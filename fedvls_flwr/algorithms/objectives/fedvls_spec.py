"""FedVLS's local objective and its paper form (:mod:`fedvls_flwr.algorithms.objectives.fedvls`):
their specs, torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.algorithms.objectives.base_spec import TEACHER_MODE
from fedvls_flwr.config.settings import Setting, at_least
from fedvls_flwr.config.spec import Part

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

_IMPL = "fedvls_flwr.algorithms.objectives.fedvls"
FEDVLS = Part("fedvls", "FedVLS", f"{_IMPL}:FedVLSObjective",
              (LAMBDA_DIS, LOGIT_WEIGHT, USE_DIS, USE_LOGIT, TEACHER_MODE))
FEDVLS_PAPER = Part("fedvls-paper", "FedVLS (paper form)", f"{_IMPL}:FedVLSPaperObjective",
                    (LAMBDA_DIS, PAPER_LOGIT_WEIGHT, USE_DIS, USE_LOGIT, TEACHER_MODE))
