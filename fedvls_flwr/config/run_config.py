"""Run configuration: every setting of an experiment, typed and validated once.

The Flower run config (``[tool.flwr.app.config]`` plus ``--run-config`` overrides)
arrives as a flat dict of kebab-case keys. :func:`parse_run_config` turns it into a
frozen :class:`RunConfig` or raises :class:`ConfigError` naming the key, the value and
what is allowed - before Ray, a SuperLink or a dataset spends any time.

Each setting is declared once, as a :class:`~fedvls_flwr.config.settings.Setting`: the general
ones in :mod:`fedvls_flwr.config.general`, each part's own in its spec (``algorithms/**/*_spec.py``,
listed by :mod:`fedvls_flwr.config.registry`).
:class:`RunConfig`'s typed fields (one per key, ``foo-bar`` -> ``foo_bar``), pyproject's
``[tool.flwr.app.config]`` and docs/configuration.md are generated from those declarations
(``fedvls config --write``; tests fail when one is stale). Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedvls_flwr.config.catalogue import DATASETS, DEFAULT_MODELS, IMAGE_DATASETS, MODELS, MODELS_WITHOUT_ENCODER, resolved_model
from fedvls_flwr.config.fields import RunConfigFields
from fedvls_flwr.config.general import GENERAL_SETTINGS
from fedvls_flwr.config.registry import method_settings, run_parts
from fedvls_flwr.config.settings import ConfigError, Setting, closest
from fedvls_flwr.config.spec import Selection

__all__ = [
    "ConfigError", "RunConfig", "SETTINGS", "GENERAL_SETTINGS", "IMAGE_DATASETS", "DATASETS", "MODELS",
    "DEFAULT_MODELS", "parse_run_config", "validate", "resolve_path", "model_name",
]

#: Every setting: the general ones, then each method's own.
SETTINGS: tuple[Setting, ...] = GENERAL_SETTINGS + method_settings()
_BY_KEY = {s.key: s for s in SETTINGS}
assert len(_BY_KEY) == len(SETTINGS), "a run-config key is declared twice"
_FIELDS = [f.name for f in dataclasses.fields(RunConfigFields)]
if _FIELDS != [s.name for s in SETTINGS]:  # a setting declared (or removed) since fields.py was generated
    raise ImportError(
        "fedvls_flwr/config/fields.py does not match the declared settings "
        f"(not generated: {sorted({s.key for s in SETTINGS} - {f.replace('_', '-') for f in _FIELDS})}; "
        f"no longer declared: {sorted({f.replace('_', '-') for f in _FIELDS} - {s.key for s in SETTINGS})}): "
        "run `fedvls config --write` (or `python -m fedvls_flwr config --write`) to regenerate it"
    )


class RunConfig(RunConfigFields):
    """All run settings, typed and validated by :func:`parse_run_config`. Attribute ``foo_bar``
    is run-config key ``foo-bar``; the fields come from the declarations (:data:`SETTINGS`)."""

    def to_flower(self) -> dict[str, Any]:
        """The config as kebab-case keys with plain values (for ConfigRecord / JSON): a new dict
        each time, built once per config (it is frozen; a client asks for it every message)."""
        flower = self.__dict__.get("_flower")
        if flower is None:
            flower = {s.key: getattr(self, s.name) for s in SETTINGS}
            object.__setattr__(self, "_flower", flower)
        return dict(flower)

    def resolved_data_dir(self) -> Path:
        return resolve_path(self.data_dir)

    def resolved_output_dir(self) -> Path:
        return resolve_path(self.output_dir)

    def default_run_name(self) -> str:
        skew = {
            "dirichlet": f"dir{self.dirichlet_beta:g}",
            "shards": f"shards{self.shards_per_client}",
            "noniid-labeldir": f"labeldir{self.shards_per_client}",
            "iid": "iid",
        }[self.partition]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{self.dataset}-{self.method}-{skew}-s{self.seed}-{stamp}"

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


def resolve_path(value: str) -> Path:
    """Absolute paths as given; ``~`` expanded; relative paths against ``$FEDVLS_BASE_DIR``.

    Flower starts the ServerApp and ClientApps in processes whose working directory is
    the SuperLink's/SuperNode's, not the user's shell, so a bare relative path would land
    somewhere surprising. ``$FEDVLS_BASE_DIR`` defaults to the home directory.
    """
    path = Path(os.path.expanduser(value))
    if path.is_absolute():
        return path
    base = Path(os.path.expanduser(os.environ.get("FEDVLS_BASE_DIR", "~")))
    return (base / path).resolve()


def model_name(cfg: RunConfig) -> str:
    """The model a run trains: ``model``, or the paper's model for the dataset when ``auto``."""
    return resolved_model(cfg.model, cfg.dataset)


# Names people reach for that are not keys of this app: what to write instead.
SYNONYMS = {
    "learning-rate": "lr", "rounds": "num-server-rounds", "num-rounds": "num-server-rounds",
    "epochs": "local-epochs", "wd": "weight-decay", "beta": "dirichlet-beta", "alpha": "dirichlet-beta",
}
#: Simulation settings that belong in ``flwr run --federation-config``, not the run config.
FEDERATION_KEYS = ("num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus",
                   # ray.init's arguments for a new one-machine Ray (docs/ray-cluster.md: two conflict with a cluster)
                   "init-args-num-cpus", "init-args-num-gpus", "init-args-logging-level", "init-args-log-to-driver")


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the entry of ``known`` closest to the key ``key``
    (:func:`fedvls_flwr.config.settings.closest`, with this app's synonyms), or ``""``."""
    match = closest(key, known, SYNONYMS)
    return f" (did you mean '{match}'?)" if match is not None else ""


def _did_you_mean(key: str) -> str:
    if key in FEDERATION_KEYS:
        return f" ('{key}' is a federation setting: flwr run ... --federation-config \"{key}=...\", not --run-config)"
    return did_you_mean(key, _BY_KEY)


def parse_run_config(raw: dict[str, Any], *, strict: bool = True) -> RunConfig:
    """Validate a Flower run config (kebab-case keys) into a :class:`RunConfig`.

    ``strict`` rejects unknown keys (a typo such as ``lamda-dis`` would otherwise be
    silently ignored); the per-round ConfigRecord adds ``server-round`` and is parsed
    with ``strict=False``. A client parses the same config with every message: the last
    few results are kept (RunConfig is frozen), so a message costs a lookup, not a validation.
    """
    try:
        # the type is part of the key: 1, 1.0 and True are equal (and hash alike) in Python
        key = (strict, tuple(sorted((k, type(v).__name__, v) for k, v in raw.items() if k in _BY_KEY or strict)))
        hash(key)
    except TypeError:  # an unhashable value (a list): validated as it comes
        return _parse_run_config(raw, strict=strict)
    return _parse_cached(key)


@functools.lru_cache(maxsize=16)
def _parse_cached(key: tuple[bool, tuple[tuple[str, str, Any], ...]]) -> RunConfig:
    strict, items = key
    return _parse_run_config({k: v for k, _, v in items}, strict=strict)


def _parse_run_config(raw: dict[str, Any], *, strict: bool = True) -> RunConfig:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        setting = _BY_KEY.get(key)
        if setting is None:
            if strict:
                raise ConfigError(
                    f"unknown run config key '{key}'{_did_you_mean(key)}; known keys: {', '.join(sorted(_BY_KEY))}"
                )
            continue
        values[setting.name] = setting.coerce(value)
    cfg = RunConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: RunConfig) -> None:
    """Every setting's own rule, then the rules that tie settings together."""
    for s in SETTINGS:
        s.validate(getattr(cfg, s.name))
    if cfg.train_pool_size and cfg.dataset == "synthetic":
        raise ConfigError(
            "run config 'train-pool-size' subsamples an image dataset's training pool; dataset "
            "synthetic generates its clients (set synthetic-clients instead, or train-pool-size = 0)"
        )
    values = cfg.to_flower()
    parts = run_parts(values)
    model = model_name(cfg)
    selection = Selection(parts=parts, model=model, model_has_encoder=model not in MODELS_WITHOUT_ENCODER)
    for part in parts.values():
        if part.rules is not None and (problem := part.rules(values, selection)) is not None:
            raise ConfigError(problem)
    if cfg.resume and not cfg.run_name:
        raise ConfigError(
            "run config 'resume' = true needs 'run-name' set to the folder of the run to continue "
            "(the default name carries a timestamp and is never found again)"
        )
