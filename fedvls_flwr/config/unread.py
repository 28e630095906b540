"""The settings a run config holds but nothing in the run reads: those of parts it does not
select (``fedconcat-assignment`` without ``protocol='fedconcat'``, ``fedgf-c`` with
``local-optimizer='sgd'``) and those a selected part reads only in another mode (FedGF's
threshold with a fixed c: the part's ``unread`` hook, declared in its spec). Torch-free.

Two uses. A user who types one would see it ignored: :func:`check_given_settings_apply`
refuses it (``fedvls check``, ``deploy local``; not a preset's ``base``, which holds every
method's settings on purpose, each run reading those of its own parts). And they do not change
what a run computes: a resumed run and a sweep's finished run are compared without them, so
a new default of such a setting (FedGF's threshold) does not make a finished run "other".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedvls_flwr.config.registry import KINDS, run_parts
from fedvls_flwr.config.settings import ConfigError


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def unread_settings(values: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """key -> (why nothing reads it, how to make it count) for every setting of ``values`` (a
    whole run config) that the run's parts do not read."""
    selected = {kind: part.name for kind, part in run_parts(values).items()}
    readers: dict[str, dict[str, list[str]]] = {}
    for kind, (parts, _) in KINDS.items():
        for part in parts:
            for setting in part.settings:
                readers.setdefault(setting.key, {}).setdefault(kind, []).append(part.name)
    out: dict[str, tuple[str, str]] = {}
    for key, by_kind in readers.items():
        if any(selected[kind] in names for kind, names in by_kind.items()):
            continue
        owners = " or ".join(f"{kind} {_either([repr(n) for n in names])}" for kind, names in by_kind.items())
        this_run = ", ".join(f"{kind} = '{selected[kind]}'" for kind in by_kind)
        first_kind, first_names = next(iter(by_kind.items()))
        out[key] = (f"a setting of {owners}, but this run has {this_run}",
                    f"select the part ({first_kind}='{first_names[0]}')")
    for part in run_parts(values).values():  # a selected part's settings its mode does not read
        if part.unread is not None:
            out.update(part.unread(values))
    return out


def check_given_settings_apply(given: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first key of ``given`` (the user's own settings) that
    nothing in the run ``values`` (the whole run config) reads."""
    unread = unread_settings(values)
    for key, value in given.items():
        if key in unread:
            why, fix = unread[key]
            raise ConfigError(f"run config '{key}' = {value!r} is {why}: it would be ignored. {fix[0].upper()}"
                              f"{fix[1:]}, or leave {key} out")
