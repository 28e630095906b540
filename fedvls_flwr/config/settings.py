"""One run-config setting, declared once: its key, default, meaning and the rule it obeys.

Every setting of the app (the general ones in :mod:`fedvls_flwr.config.run_config`, each method's own
in its spec, :class:`fedvls_flwr.config.spec.Part`) is a :class:`Setting`. Parsing, type coercion, range and
choice checks, the pyproject defaults and the report labels all read these declarations,
so a setting is written down in exactly one place. Torch-free and Flower-free.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A run-config value that cannot work; the message says which and how to fix it."""


#: Values people write for a choice that the app spells otherwise (not a near spelling: "gpu" is one
#: letter from "cpu", but means "cuda").
VALUE_SYNONYMS = {"gpu": "cuda"}


def _flat(word: str) -> str:
    return word.replace("-", "").replace("_", "").lower()


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbours that turn ``a`` into
    ``b`` (the optimal string alignment distance: ``fminst`` is 1 from ``fmnist``)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def closest(word: str, known: Iterable[str], synonyms: Mapping[str, str] | None = None) -> str | None:
    """The entry of ``known`` a user most likely meant by ``word``, or None.

    In this order: the same word but for case, hyphens and underscores (``FedVLS`` ->
    ``fedvls``); a synonym (``synonyms``: what people reach for -> the name here); the
    fewest edits (:func:`edit_distance`, at most a third of the word, first declared on a
    tie); a close spelling by :mod:`difflib` (ratio >= 0.7). Every "did you mean" of the app
    - unknown run-config keys, a value outside a setting's choices, preset keys - comes from here.
    """
    known = [str(k) for k in known]
    flat = _flat(word)
    same = [k for k in known if _flat(k) == flat]
    if same:
        return same[0]
    synonym = (synonyms or {}).get(word.replace("_", "-").lower())
    if synonym in known:
        return synonym
    limit = max(1, min(3, len(flat) // 3))
    by_edits = sorted((edit_distance(flat, _flat(k)), i) for i, k in enumerate(known))
    if by_edits and by_edits[0][0] <= limit:
        return known[by_edits[0][1]]
    close = difflib.get_close_matches(word.replace("_", "-").lower(), known, n=1, cutoff=0.7)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str], synonyms: Mapping[str, str] | None = None) -> str:
    """`` (did you mean 'x'?)`` for :func:`closest`, or ``""`` when nothing is close."""
    match = closest(word, known, synonyms)
    return f" (did you mean '{match}'?)" if match is not None else ""


@dataclass(frozen=True)
class Setting:
    """A run-config key.

    Parameters
    ----------
    key
        The run-config key (kebab-case, as users type it); the attribute of
        :class:`~fedvls_flwr.config.run_config.RunConfig` is :attr:`name` (snake_case).
    default
        The default; its type is the setting's type (bool, int, float or str).
    help
        What the setting means, in a line (docs/configuration.md is generated from it).
    check
        A predicate on the coerced value; ``rule`` says in words what it enforces.
    choices
        For string settings: the allowed values (a callable for choices that are only
        known once every module is imported, e.g. the registered methods).
    allow_inf
        Floats must be finite unless this is set (e.g. a timeout may be infinite).
    label
        Report labels: value -> a fragment added to the method's label when a run used
        that value (e.g. ``{False: "−L_dis"}`` for ``use-dis``).
    """

    key: str
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    allow_inf: bool = False
    label: Mapping[Any, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.key.replace("-", "_")

    @property
    def kind(self) -> type:
        return type(self.default)

    def allowed(self) -> tuple[str, ...]:
        return self.choices() if callable(self.choices) else self.choices

    def coerce(self, value: Any) -> Any:
        """``value`` as this setting's type, or :class:`ConfigError` (ints pass as floats,
        "true"/"false" strings as booleans - the forms TOML and YAML users write)."""
        kind = self.kind
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise ConfigError(f"run config '{self.key}' = {value!r}: expected true or false")
        if kind is int:
            # float.is_integer() is False for inf and nan (int(inf) would raise OverflowError)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()
            ):
                raise ConfigError(f"run config '{self.key}' = {value!r}: expected an integer")
            return int(value)
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"run config '{self.key}' = {value!r}: expected a number")
            return float(value)
        if isinstance(value, bool) and {"true", "false"} <= set(self.allowed()):
            return "true" if value else "false"  # a switch with an "auto" besides true / false
        if not isinstance(value, str):
            raise ConfigError(f"run config '{self.key}' = {value!r}: expected a string")
        return value

    def validate(self, value: Any) -> None:
        """Raise :class:`ConfigError` naming the key, the value and the rule it breaks."""
        allowed = self.allowed()
        if allowed and value not in allowed:
            raise ConfigError(
                f"run config '{self.key}' = {value!r} is not allowed{did_you_mean(str(value), allowed, VALUE_SYNONYMS)}; "
                f"choose one of: {', '.join(allowed)}"
            )
        if isinstance(value, float) and not self.allow_inf and not math.isfinite(value):
            raise ConfigError(f"run config '{self.key}' = {value!r}: must be a finite number")
        if self.check is not None and not self.check(value):
            raise ConfigError(f"run config '{self.key}' = {value!r}: must be {self.rule}")


def toml_value(value: Any) -> str:
    """A Python value as a TOML literal (what ``--run-config`` and pyproject hold)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        import json

        return json.dumps(value)  # a TOML basic string
    return repr(value)


# Rule builders: the predicate and the words for it, kept together (``hint`` is appended
# to the words, e.g. typical values).
def _rule(words: str, hint: str) -> str:
    return f"{words} ({hint})" if hint else words


def greater(bound: float, hint: str = "") -> dict[str, Any]:
    return {"check": lambda v: v > bound, "rule": _rule(f"> {bound:g}", hint)}


def at_least(bound: float, hint: str = "") -> dict[str, Any]:
    return {"check": lambda v: v >= bound, "rule": _rule(f">= {bound:g}", hint)}


def between(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False, hint: str = ""
) -> dict[str, Any]:
    def check(v: float) -> bool:
        return (low < v if low_open else low <= v) and (v < high if high_open else v <= high)

    words = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return {"check": check, "rule": _rule(words, hint)}
