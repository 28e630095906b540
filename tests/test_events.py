"""The structured events (app/events.py): a line reaches every handler that shows DEBUG, and is
not even built when none does (Flower's own logger stays at DEBUG whatever its console shows)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fedvls_flwr.app import events


class Built(logging.Filter):
    """Counts the records made on Flower's logger (a logger's filters see each one)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True


@pytest.fixture
def flower_logger(monkeypatch):
    """Flower's logger with only the handlers a test gives it; the root's handlers are taken off
    in the test's body (:func:`bare_root`), where pytest has put its own."""
    logger = logging.getLogger("flwr")
    monkeypatch.setattr(logger, "handlers", [])
    level = logger.level
    logger.setLevel(logging.DEBUG)  # as Flower sets it (setLevel: the loggers' level caches cleared)
    built = Built()
    logger.addFilter(built)
    yield logger, built
    logger.removeFilter(built)
    logger.setLevel(level)


@contextmanager
def bare_root(*handlers: logging.Handler) -> Iterator[None]:
    root = logging.getLogger()
    kept, root.handlers = root.handlers, list(handlers)
    try:
        yield
    finally:
        root.handlers = kept


def test_an_event_is_not_built_when_no_handler_shows_debug(flower_logger):
    logger, built = flower_logger
    shown = io.StringIO()
    logger.addHandler(console := logging.StreamHandler(shown))
    console.setLevel(logging.INFO)  # Flower's console at its default level
    with bare_root():
        events.emit(events.ROUND_START, round=3)
        assert built.records == [] and shown.getvalue() == ""
        logger.info("a plain line")
    assert len(built.records) == 1 and "a plain line" in shown.getvalue()


@pytest.mark.parametrize("where", ["flower", "root"])
def test_an_event_reaches_a_handler_that_shows_debug(flower_logger, monkeypatch, where):
    logger, built = flower_logger
    shown = io.StringIO()
    quiet, loud = logging.StreamHandler(io.StringIO()), logging.StreamHandler(shown)
    quiet.setLevel(logging.INFO)
    loud.setLevel(logging.DEBUG)
    logger.addHandler(quiet)
    if where == "flower":
        logger.addHandler(loud)
    with bare_root(*([loud] if where == "root" else [])):
        events.emit(events.CLIENT_DATA, seconds=0.5, partition=2)
    (event,) = events.parse_events(shown.getvalue().splitlines())
    assert event["event"] == events.CLIENT_DATA and event["partition"] == 2 and len(built.records) == 1


def test_a_logger_that_does_not_propagate_hides_the_roots_handlers(flower_logger, monkeypatch):
    logger, built = flower_logger
    shown = io.StringIO()
    monkeypatch.setattr(logger, "propagate", False)
    with bare_root(logging.StreamHandler(shown)):
        events.emit(events.ROUND_END, round=1)
    assert shown.getvalue() == "" and built.records == []
