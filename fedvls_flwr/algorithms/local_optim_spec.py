"""The local optimizers SGD and FedSAM (:mod:`fedvls_flwr.algorithms.local_optim`): their specs,
torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.config.settings import Setting, greater
from fedvls_flwr.config.spec import Part

#: SAM's perturbation radius, listed by FedSAM and FedGF (whose client step is SAM's at its core).
SAM_RHO = Setting("sam-rho", 0.1, "FedSAM and FedGF client perturbation radius rho", **greater(0))

_IMPL = "fedvls_flwr.algorithms.local_optim"
SGD = Part("sgd", "SGD", f"{_IMPL}:SGDStep")
SAM = Part("sam", "FedSAM", f"{_IMPL}:SAMStep", (SAM_RHO,))
