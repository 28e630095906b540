"""Strict ``key=value`` strings: what ``--run-config`` / ``--node-config`` / ``--set`` accept.

Flower's own parser (``flwr.common.config.parse_config_args``, used by ``flwr run
--run-config`` and ``flower-supernode --node-config``) collects ``key=value`` items with a
regular expression and silently drops every piece of text that does not match: ``lr=``,
a bare ``lr``, the ``momentum`` of ``"lr=0.1 momentum"`` or ``lr = 0.1`` (spaces around
``=``) vanish and the run uses the default. :func:`parse_run_config_args` accepts exactly
what Flower accepts and gives the same dict, but rejects every such item naming it. The
check command, the sweep's ``--set`` and the deployment launcher use it; Flower itself does
not, so ``python -m fedvls_flwr check`` is the way to catch these before ``flwr run``.

No Flower import: a rejected item costs a fraction of a second.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedvls_flwr.config.run_config import ConfigError

# Flower 1.41's item pattern (flwr/common/config.py, parse_config_args), kept identical so
# that an accepted string means here what it means to `flwr run`; tests compare the two.
ITEM = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")


def _bad_fragment(fragment: str, option: str, previous: str | None) -> ConfigError:
    if fragment.startswith("="):
        why = "has no key before '=' (write key=value, no spaces around '=')"
    elif fragment.endswith("="):
        key = fragment[:-1]
        why = (f"has no value: write {key}=VALUE (strings in quotes: {key}='text'), "
               f"or leave {key} out to keep its default")
    elif "=" not in fragment:
        why = (f"is not key=value: write {fragment}=VALUE (no spaces around '='), "
               "or remove it")
    else:
        why = "cannot be read as key=value (quote values holding spaces: key='a b')"
    after = f" after {previous!r}" if previous else ""
    flower = ("" if option not in ("--run-config", "--node-config") else
              f" (Flower's own {option} parser would drop it silently and use the default.)")
    return ConfigError(f"{option}: {fragment!r}{after} {why}.{flower}")


def split_items(text: str, option: str = "--run-config") -> list[tuple[str, str]]:
    """``"k1=v1 k2='a b'"`` -> ``[("k1", "v1"), ("k2", "'a b'")]`` (values as written).

    Raises :class:`ConfigError` naming the first piece of ``text`` that Flower's parser
    would drop (an item without a value or without ``=``, text glued to a quoted value)
    and a key given twice (Flower: a bare "invalid format" error).
    """
    items: list[tuple[str, str]] = []
    pos = 0
    previous = None
    for match in ITEM.finditer(text):
        gap = text[pos:match.start()]
        if gap.strip():
            raise _bad_fragment(gap.split()[0], option, previous)
        items.append((match.group(1), match.group(2)))
        previous = match.group(0)
        pos = match.end()
    rest = text[pos:]
    if rest.strip():
        raise _bad_fragment(rest.split()[0], option, previous)
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise ConfigError(f"{option}: {key!r} is given twice in {text!r}; give it once")
        seen.add(key)
    return items


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables -> dotted keys, as Flower's ``flatten_dict`` does."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


def _value_kind(key: str, option: str) -> tuple[type, str] | None:
    """(type, what the key takes) of a key the option knows, for the message on a value that is
    not TOML: a number wants no quotes, a string wants them."""
    if option == "--federation-config":
        from fedvls_flwr.config.federation_config import SIMULATION_KEYS

        if key in SIMULATION_KEYS:
            kind, rule, meaning = SIMULATION_KEYS[key]
            return kind, f"{rule} ({meaning})"
        return None
    from fedvls_flwr.config.run_config import RunConfig

    default = RunConfig().to_flower().get(key)
    if default is None:
        return None
    kind = type(default)
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "a string in quotes"}
    return kind, words.get(kind, kind.__name__)


def _toml_value(key: str, value: str, option: str) -> Any:
    try:
        return tomllib.loads(f"{key} = {value}")
    except tomllib.TOMLDecodeError as err:
        known = _value_kind(key, option)
        if known is not None and known[0] is not str:
            example = {bool: "true", int: "10", float: "0.01"}.get(known[0], "1")
            raise ConfigError(f"{option}: {key}={value}: '{key}' takes {known[1]}, e.g. {key}={example}") from None
        hint = f" (a string needs quotes: {key}='{value}')" if value[:1] not in "'\"" else ""
        raise ConfigError(
            f"{option}: {key}={value} is not a TOML key=value item{hint}: {err}; values are "
            "numbers (0.1, 3), true/false or quoted strings"
        ) from None


def parse_run_config_args(args: list[str] | None, option: str = "--run-config") -> dict[str, Any]:
    """The overrides of one or more ``--run-config`` arguments, as ``flwr run`` reads them
    (``key=value`` strings, or a single ``.toml`` file), or ConfigError; a key given in two
    arguments is refused as one given twice in one (``flwr run`` would keep the last)."""
    if not args:
        return {}
    if len(args) == 1 and args[0].endswith(".toml"):
        path = Path(args[0]).expanduser()
        try:
            return _flatten(tomllib.loads(path.read_text()))
        except FileNotFoundError:
            raise ConfigError(f"{option}: the file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{option}: cannot read {path}: {err}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{option}: {path} is not valid TOML: {err}") from None
    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}  # key -> the argument that gave it
    for text in args:
        if not text:
            continue
        if text.endswith(".toml"):
            raise ConfigError(f"{option}: a .toml file ({text}) cannot be combined with other --run-config values")
        items = split_items(text, option)
        _once(items, text, given, option)
        tree: dict[str, Any] = {}
        for key, value in items:
            _merge(tree, _toml_value(key, value, option))
        overrides.update(tree)
    return _flatten(overrides)


def _merge(tree: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = value


def parse_items(args: list[str], option: str, value: Callable[[str, str], Any]) -> dict[str, Any]:
    """``key=value`` items of several arguments (each may hold several), values read by
    ``value(key, text)``: the sweep's ``--set`` / ``--only`` (YAML values)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for text in args:
        items = split_items(text, option)
        _once(items, text, given, option)
        for key, raw in items:
            out[key] = value(key, raw)
    return out


def _once(items: list[tuple[str, str]], text: str, given: dict[str, str], option: str) -> None:
    """A key given again in another argument of the same option is refused, as within one: which
    value was meant cannot be told (``flwr run`` would keep the last silently)."""
    for key, raw in items:
        if key in given:
            raise ConfigError(f"{option}: {key!r} is given twice ({given[key]!r}, then {f'{key}={raw}'!r} in "
                              f"{text!r}); give it once")
    for key, raw in items:
        given[key] = f"{key}={raw}"


def seconds(text: str) -> float:
    """An argparse type for a time limit: a finite number of seconds > 0 (a negative one would
    let a command start Ray and a SuperLink, then stop every run at once)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 3600)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds > 0 (e.g. 3600 for an hour)")
    return value
