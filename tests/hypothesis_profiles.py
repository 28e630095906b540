"""Hypothesis profiles for the property tests (tests/test_properties_*.py).

* ``ci`` (the default): derandomized - every run of the suite draws the same examples, so CI's
  verdict is reproducible - and each test's own number of examples;
* ``thorough``: fresh random examples on every run, 20 times as many; for a search beyond what CI
  covers (minutes, not seconds)::

      .venv/bin/python -m pytest -q -p no:xdist --hypothesis-profile=thorough tests/test_properties_*.py

  A failure prints the ``@reproduce_failure`` blob that replays it.

tests/conftest.py registers both and loads ``ci``; ``--hypothesis-profile`` (Hypothesis' pytest
plugin) chooses another before the test modules are imported, and :func:`examples` reads it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 100
THOROUGH_EXAMPLES = 20 * CI_EXAMPLES
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]}


def register() -> None:
    settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, **_COMMON)
    settings.register_profile("thorough", max_examples=THOROUGH_EXAMPLES, derandomize=False, print_blob=True,
                              **_COMMON)


def examples(n: int) -> settings:
    """A property test's settings: ``n`` examples under ``ci``, scaled as the loaded profile's
    ``max_examples`` is to ``ci``'s (20 n under ``thorough``); the rest from the profile."""
    return settings(max_examples=max(1, n * settings.default.max_examples // CI_EXAMPLES))
