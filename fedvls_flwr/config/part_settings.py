"""Settings a user gave for a part the run does not select (``fedconcat-assignment`` without
``protocol='fedconcat'``, ``fedgf-c`` with ``local-optimizer='sgd'``): the part never reads
them, so the run would go on as if they had not been given. Torch-free.

Checked on what a user types (``fedvls check``, ``deploy local``), not on a whole run config:
a preset's ``base`` holds every method's settings on purpose (the paper's table of
hyperparameters), each run reading those of its own parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedvls_flwr.config.registry import owners, run_parts
from fedvls_flwr.config.settings import ConfigError


def check_given_settings_apply(given: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first key of ``given`` (the user's own settings) that
    only parts ``values`` (the whole run config) does not select read."""
    selected = {kind: part.name for kind, part in run_parts(values).items()}
    for key, value in given.items():
        readers = owners(key)
        if not readers or any(selected[kind] == name for kind, name in readers):
            continue
        by_kind: dict[str, list[str]] = {}
        for kind, name in readers:
            by_kind.setdefault(kind, []).append(f"'{name}'")
        parts = " or ".join(f"{kind} {_either(names)}" for kind, names in by_kind.items())
        this_run = ", ".join(f"{kind} = '{selected[kind]}'" for kind in by_kind)
        kind, name = readers[0]
        raise ConfigError(
            f"run config '{key}' = {value!r} is a setting of {parts}, but this run has {this_run}: it would be "
            f"ignored. Select the part ({kind}='{name}'), or leave {key} out")


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
