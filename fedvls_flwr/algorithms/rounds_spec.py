"""The standard protocol (:class:`~fedvls_flwr.algorithms.rounds.StandardRounds`: one global model
that every sampled client trains): its spec, torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

from fedvls_flwr.config.spec import Part

STANDARD = Part("standard", "Standard", "fedvls_flwr.algorithms.rounds:StandardRounds")
