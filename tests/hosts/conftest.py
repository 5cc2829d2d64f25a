"""Fixtures for tests against the booted systemd test hosts (``scripts/testhost.sh``)."""

from __future__ import annotations

import os

import pytest
from hostutil import KEY, up_hosts


@pytest.fixture(scope="session")
def hosts() -> dict[str, str]:
    # Test hosts are machine-wide: another checkout may have them up. Only a run that
    # booted them itself (scripts/test.sh sets DDTREE_TESTHOSTS=1) may use them.
    if os.environ.get("DDTREE_TESTHOSTS") != "1":
        pytest.skip("host tests run under scripts/test.sh (DDTREE_TESTHOSTS=1), which boots the test hosts")
    found = up_hosts() if KEY.exists() else {}
    if not found:
        reason = "test hosts are down: run `scripts/testhost.sh up` (as root) first"
        if os.environ.get("DDTREE_TESTHOSTS") == "1":
            pytest.fail(f"DDTREE_TESTHOSTS=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return found
