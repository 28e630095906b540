"""FedMR's local objective (:mod:`fedvls_flwr.algorithms.objectives.fedmr`): its spec, torch-free
(:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.config.settings import Setting, at_least
from fedvls_flwr.config.spec import Part

FEDMR_DECO = Setting("fedmr-deco", 4.0, "FedMR intra-class decorrelation weight (deco; 4 in the FedVLS paper)",
                     **at_least(0))

FEDMR = Part("fedmr", "FedMR", "fedvls_flwr.algorithms.objectives.fedmr:FedMRObjective", (FEDMR_DECO,))
