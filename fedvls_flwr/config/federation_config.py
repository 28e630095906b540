"""The keys of ``flwr run --federation-config`` for a simulation, checked where the app's
tools read them: Flower 1.41 refuses an unknown key only once ``flwr run`` has packed the
app ("Unknown simulation config field(s)", seconds later), and takes
``num-supernodes=0`` without a word. Torch-free and Flower-free.

The keys and their types are Flower's ``SimulationConfig`` message
(``flwr/proto/federation_config.proto``; ``flwr federation simulation-config --help``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedvls_flwr.config.settings import ConfigError, did_you_mean

#: key -> (type, what it must be, what it is)
SIMULATION_KEYS: dict[str, tuple[type, str, str]] = {
    "num-supernodes": (int, "an integer >= 1", "the number of simulated SuperNodes"),
    "client-resources-num-cpus": (int, "an integer >= 1", "CPUs Ray reserves for each ClientApp"),
    "client-resources-num-gpus": (float, "a number >= 0", "the share of a GPU each ClientApp gets, e.g. 0.25"),
    "backend": (str, "'ray'", "the simulation backend"),
    "verbose": (bool, "true or false", "verbose logs of the simulation runtime"),
    "init-args-num-cpus": (int, "an integer >= 1", "CPUs of a Ray the simulation starts itself"),
    "init-args-num-gpus": (int, "an integer >= 0", "GPUs of a Ray the simulation starts itself"),
    "init-args-logging-level": (str, "a logging level name", "Ray's logging level"),
    "init-args-log-to-driver": (bool, "true or false", "whether Ray forwards the ClientApps' output"),
}


def _fits(key: str, value: Any) -> bool:
    kind = SIMULATION_KEYS[key][0]
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        low = 0 if key == "init-args-num-gpus" else 1
        return isinstance(value, int) and value >= low
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    if key == "backend":
        return value == "ray"
    return isinstance(value, str) and value != ""


def check_federation_config(federation: Mapping[str, Any], run_keys: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` for a key Flower's simulation does not take, or a value it
    cannot use; ``run_keys`` (the run config's keys) names a run-config key given here."""
    for key, value in federation.items():
        if key not in SIMULATION_KEYS:
            if run_keys is not None and key in run_keys:
                raise ConfigError(f"--federation-config: {key!r} is a run-config key: give it in --run-config")
            raise ConfigError(
                f"--federation-config: unknown key {key!r}{did_you_mean(key, SIMULATION_KEYS)} (flwr run refuses "
                f"it only after packing the app); a simulation takes: {', '.join(SIMULATION_KEYS)}")
        if not _fits(key, value):
            _, rule, meaning = SIMULATION_KEYS[key]
            raise ConfigError(f"--federation-config: {key!r} = {value!r}: must be {rule} ({meaning})")
