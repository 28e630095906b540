"""Fixtures the test modules share (pytest finds them by name; no import needed).

Helpers that are plain functions live in modules beside this one: hypothesis_profiles.py (the
property tests' "ci" and "thorough" profiles), tiny_data.py (datasets written in their real
on-disk formats), runs.py (the digits run configs of the end-to-end
tests), processes.py (what a test left running), nginx.py and netns.py (what the fence's
tests need of the machine), fake_grid.py (a Grid without Flower processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.hypothesis_profiles import register

# The property tests' profiles (tests/hypothesis_profiles.py): "ci" here, before any test module
# is imported; Hypothesis' plugin loads another one after this when --hypothesis-profile names it.
register()
settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end modules first, in their file order; the unit tests after them. CI runs
    the suite on two workers (pytest-xdist, one module per worker at a time): the long
    modules start at once and the many short ones fill the end, so no worker sits idle
    while the other finishes a long module."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(scope="module")
def run_identity() -> Iterator[None]:
    """Flower's Message needs a run identity (run, node, task ids), as inside a real app.
    A module that builds messages asks for it with ``pytestmark = pytest.mark.usefixtures("run_identity")``."""
    from tests.runs import flower_run_identity

    with flower_run_identity():
        yield


@pytest.fixture
def fresh_dataset_cache() -> Iterator[None]:
    """The in-memory dataset cache emptied before and after the test."""
    from fedvls_flwr.data import datasets

    datasets.clear_cache()
    yield
    datasets.clear_cache()


@pytest.fixture
def nginx() -> str:
    """nginx's path; the test is skipped without it (failed under CI's FEDVLS_REQUIRE_NGINX=1)."""
    from tests.nginx import find_or_skip

    return find_or_skip()


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    """The environment a test's SuperNodes get: their data cache in the test's folder."""
    return {"FEDVLS_CACHE_DIR": str(tmp_path / "node-cache")}
