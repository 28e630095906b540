"""What a part of a run declares about itself, torch-free: its :class:`Part` (the spec).

A run combines four parts, one of each kind: ``method`` (the local objective),
``local-optimizer``, ``server-optimizer`` and ``protocol`` (the shape of the federation). Each
part's spec is written once, beside its implementation (``algorithms/<module>_spec.py`` for
``algorithms/<module>.py``): its label, its own settings with their defaults and bounds, what it
needs of the rest of a run (``rules``), which of its settings a mode leaves unread (``unread``),
what it wraps the network in (``wraps_model``), what it shares and sends. The registry
(:mod:`fedvls_flwr.config.registry`) only lists the specs; everything else - validation, the
generated RunConfig fields and docs, report labels, the building of a part - reads them here.

A spec names its implementation by import path (``"module:attr"``), loaded only where it runs,
so nothing here imports torch: the ServerApp validates a run config before it imports torch,
and reports are read on machines without a GPU stack.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fedvls_flwr.config.settings import Setting

__all__ = ["EveryValueLabel", "FederationRule", "Part", "Rule", "SITE_STATISTICS", "Selection", "Unread"]

#: Per-site statistics a part may declare in ``Part.shares``, with what they reveal (docs).
SITE_STATISTICS: dict[str, str] = {
    "class-counts": "the site's number of training samples of every class (its label distribution)",
}


@dataclass(frozen=True)
class Selection:
    """What a part's rules may know of a run besides its values: the parts it combines (kind ->
    part) and the model it trains (``auto`` resolved)."""

    parts: Mapping[str, Part]
    model: str
    model_has_encoder: bool


#: What a part needs of the rest of a run config: a message saying what is wrong and how to fix it, or None.
Rule = Callable[[Mapping[str, Any], Selection], str | None]
#: What a part needs of the federation's size (the number of nodes): a message, or None.
FederationRule = Callable[[Mapping[str, Any], int], str | None]
#: The part's own settings that a run (its whole config) selects the part but does not read,
#: key -> (why nothing reads it, how to make it count): FedGF's threshold with a fixed c.
Unread = Callable[[Mapping[str, Any]], dict[str, tuple[str, str]]]


class EveryValueLabel(Mapping[Any, str]):
    """A label fragment for every value of a setting (``"K={}"`` -> ``K=4``), so tables tell
    the settings' values apart without listing them."""

    def __init__(self, template: str) -> None:
        self.template = template

    def __contains__(self, value: object) -> bool:
        return True

    def __getitem__(self, value: Any) -> str:
        return self.template.format(value)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Part:
    """One part of a run, as it declares itself: a local objective, a local or server optimizer,
    or a protocol.

    Parameters
    ----------
    name
        The run-config value that selects it (``method = "fedvls"``, ``server-optimizer = "fedexp"``).
    label
        How tables and plots name it.
    impl
        ``"module:attr"`` of its implementation: an ``Objective``, ``LocalOptimizer``,
        ``ServerOptimizer`` or ``RoundProtocol`` subclass (:mod:`fedvls_flwr.algorithms.build`
        checks which), built from :meth:`own_settings` and the context of its kind.
    settings
        Its own run-config keys; the implementation receives exactly these (kebab-case keys).
        A setting shared by several parts is one object listed by each of them.
    shares
        The per-site statistics the server needs from every site for this part (names from
        :data:`SITE_STATISTICS`). A site's reply carries only what the run's parts declare
        here: FedAvg, FedLC, FedNTD and FedVLS declare nothing, so no label distribution
        leaves a site for them.
    server
        ``"module:attr"`` of the part's server-side companion, for a client part that needs
        state kept on the server and sent with the weights (FedGF's perturbed global point and
        coefficient c); ``None`` for the parts that need none. Its interface:
        :class:`fedvls_flwr.algorithms.parts.ServerCompanion`.
    sends
        What the part adds to the server's messages besides the global weights, in words (the
        docs' table of what each part sends and shares is generated from it); empty for the
        parts that add nothing.
    rules
        What the part needs of the rest of a run config (its values, and the :class:`Selection`:
        the other parts, the model): a message saying what is wrong and how to fix it, or None
        (checked with every run config, before anything runs).
    federation_rules
        What the part needs of the federation's size (the number of nodes, one partition
        each): a message or None; checked where the size is known (``fedvls check
        --num-supernodes``, a sweep's federation, the deploy tools), before anything runs.
    unread
        Which of its own settings a run that selects it does not read in the mode its values
        choose (FedGF's threshold with a fixed c): a user who sets one is told it would be
        ignored, and a resumed run is not "another run" for it (:mod:`fedvls_flwr.config.unread`).
    wraps_model
        ``"module:attr"`` of a function ``(network, own settings, num_classes) -> network`` that
        wraps the model zoo's network in what the part needs (MOON's projection head); server
        and clients build the run's network through it (:mod:`fedvls_flwr.algorithms.run_model`).

    What an objective needs of the training loop (a teacher, features, state kept between
    rounds) is said by its implementation class, not repeated here.
    """

    name: str
    label: str
    impl: str
    settings: tuple[Setting, ...] = ()
    shares: tuple[str, ...] = ()
    server: str | None = None
    sends: str = ""
    rules: Rule | None = None
    federation_rules: FederationRule | None = None
    unread: Unread | None = None
    wraps_model: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.shares) - set(SITE_STATISTICS))
        if unknown:
            raise ValueError(f"part {self.name!r} shares unknown site statistics {unknown}; known: {sorted(SITE_STATISTICS)}")
        if self.server is not None and not self.sends:
            raise ValueError(f"part {self.name!r} has a server companion: declare what it sends (Part.sends)")
        keys = [s.key for s in self.settings]
        if len(set(keys)) != len(keys):
            raise ValueError(f"part {self.name!r} lists a setting twice: {keys}")

    def load(self) -> Any:
        """The implementation (imported on first use: torch stays out of the config layer)."""
        return _load(self.impl)

    def load_server(self) -> Any:
        """The server-side companion class, or None (imported on first use)."""
        return None if self.server is None else _load(self.server)

    def load_model_wrapper(self) -> Any:
        """The function that wraps the run's network (``wraps_model``), or None."""
        return None if self.wraps_model is None else _load(self.wraps_model)

    def defaults(self) -> dict[str, Any]:
        return {s.key: s.default for s in self.settings}

    def own_settings(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """This part's own settings out of ``values`` (a whole run config, or only some of the
        part's keys): coerced, checked against their rules, defaults for the missing ones. The
        one way a part reads a setting, on the server and on a client alike."""
        settings = self.defaults()
        for setting in self.settings:
            if setting.key in values:
                settings[setting.key] = setting.coerce(values[setting.key])
                setting.validate(settings[setting.key])
        return settings

    def variant_label(self, values: Mapping[str, Any]) -> str:
        """The label plus a fragment for every setting whose value has one (``FedVLS −L_dis``)."""
        parts = [self.label]
        for s in self.settings:
            value = values.get(s.key, s.default)
            if value in s.label:
                parts.append(s.label[value])
        return " ".join(parts)

    def variant_flags(self, values: Mapping[str, Any]) -> tuple[bool, ...]:
        """Which label fragments apply, in settings order (orders the variants of a part)."""
        return tuple(values.get(s.key, s.default) in s.label for s in self.settings if s.label)
