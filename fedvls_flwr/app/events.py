"""Structured events: one JSON line per phase of a round, written to Flower's log (so they
reach the ServerApp's and each SuperNode's output) and read back by
``fedvls deploy breakdown`` - no tool parses our human-readable log sentences.

A line is ``EVENT_PREFIX + {"event": KIND, "t": <unix time>, ...fields}``; Flower may put its
own level and timestamp in front of it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

EVENT_PREFIX = "fedvls-event "
#: The kinds written: the server's round start (messages about to go out) and end (the round
#: evaluated and its files handed to the thread that writes them, beside the next round), and a
#: client's local data being ready (``seconds`` it took).
ROUND_START, ROUND_END, CLIENT_DATA = "round-start", "round-end", "client-data"

_logger = logging.getLogger("flwr")


def emit(kind: str, **fields: Any) -> None:
    """At DEBUG level: the breakdown reads logs taken with ``FLWR_LOG_LEVEL=DEBUG`` (``deploy
    local --debug-logs``), and a user's ``flwr run --stream`` is spared a JSON line per phase.
    Built only when a handler would show it: Flower's logger itself is at DEBUG whatever its
    console shows, and a line per client costs a FedConcat head round about a millisecond."""
    if _shown(logging.DEBUG):
        _logger.debug("%s%s", EVENT_PREFIX, json.dumps({"event": kind, "t": time.time(), **fields}))


def _shown(level: int) -> bool:
    """Whether a record of ``level`` from Flower's logger reaches a handler that takes it (the
    walk ``Logger.callHandlers`` makes; a handler's own filters may still drop it)."""
    if not _logger.isEnabledFor(level):
        return False
    logger: logging.Logger | None = _logger
    any_handler = False
    while logger is not None:
        for handler in logger.handlers:
            any_handler = True
            if level >= handler.level:
                return True
        if not logger.propagate:
            break
        logger = logger.parent
    last = logging.lastResort
    return not any_handler and last is not None and level >= last.level


def parse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events among ``lines`` (any other line is skipped; a damaged event line too)."""
    for line in lines:
        _, marker, payload = line.partition(EVENT_PREFIX)
        if not marker:
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event and "t" in event:
            yield event
