"""The fence's tests need nginx (a Debian package; .ci/run installs it), and the namespace
test also Linux network namespaces (netns.py).

Without them a test is skipped with the reason, except where CI sets ``FEDVLS_REQUIRE_NGINX=1``
(or ``FEDVLS_REQUIRE_NETNS=1``): there it fails instead of hiding what is missing.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from fedvls_flwr.deploy.fence import INSTALL_HINT, find_nginx


def skip_or_fail(reason: str, required_by: str) -> NoReturn:
    """Skip the test for ``reason``; fail it where the environment variable ``required_by`` is 1."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{required_by}=1 but {reason}")
    pytest.skip(reason)


def find_or_skip() -> str:
    """nginx's path (the fixture ``nginx`` in conftest.py)."""
    found = find_nginx()
    if found is None:
        skip_or_fail(INSTALL_HINT, "FEDVLS_REQUIRE_NGINX")
    return found
