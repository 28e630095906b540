"""FedAvg's local objective (plain cross-entropy, :class:`~fedvls_flwr.algorithms.objectives.base.FedAvgObjective`),
and the setting every objective with a teacher shares: its spec, torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.config.settings import Setting
from fedvls_flwr.config.spec import Part

#: The mode of the frozen global model an objective distils from (``Objective.teacher_mode``);
#: listed by every objective that reads a teacher's logits.
TEACHER_MODE = Setting(
    "teacher-mode", "eval", "mode of the frozen global model used as teacher ('train' = the FedVLS code)",
    choices=("eval", "train"), label={"train": "(teacher train)"},
)

FEDAVG = Part("fedavg", "FedAvg", "fedvls_flwr.algorithms.objectives.base:FedAvgObjective")
