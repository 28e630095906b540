"""The server optimizers (:mod:`fedvls_flwr.algorithms.server_optim`): FedAvg, FedExP, FedAvgM,
FedAdam, FedYogi and FedAdagrad - their specs, torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.config.settings import Setting, between, greater
from fedvls_flwr.config.spec import Part

_IMPL = "fedvls_flwr.algorithms.server_optim"

FEDEXP_EPS = Setting("fedexp-eps", 0.01, "FedExP epsilon in the server step size", **greater(0))
FEDEXP_EVAL = Setting(
    "fedexp-eval", "last", "FedExP: evaluate the last global model, or the average of the last two (the paper)",
    choices=("last", "average-last-two"), label={"average-last-two": "(avg of last 2)"},
)
FEDAVGM_LR = Setting("fedavgm-lr", 1.0, "FedAvgM server learning rate (Flower's default)", **greater(0))
FEDAVGM_MOMENTUM = Setting("fedavgm-momentum", 0.0, "FedAvgM server momentum (Flower's default)",
                           **between(0, 1, high_open=True))


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


AVERAGE = Part("fedavg", "FedAvg", f"{_IMPL}:Average")
FEDEXP = Part("fedexp", "FedExP", f"{_IMPL}:FedExP", (FEDEXP_EPS, FEDEXP_EVAL))
FEDAVGM = Part("fedavgm", "FedAvgM", f"{_IMPL}:FedAvgM", (FEDAVGM_LR, FEDAVGM_MOMENTUM))
FEDADAM = Part("fedadam", "FedAdam", f"{_IMPL}:FedAdam", _adaptive("fedadam", 0.1))
FEDYOGI = Part("fedyogi", "FedYogi", f"{_IMPL}:FedYogi", _adaptive("fedyogi", 0.01))
FEDADAGRAD = Part("fedadagrad", "FedAdagrad", f"{_IMPL}:FedAdagrad", _adaptive("fedadagrad", 0.1, beta1=False))
