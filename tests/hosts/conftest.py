"""Fixtures for tests against the booted systemd test hosts (``scripts/testhost.sh``)."""

from __future__ import annotations

import os

import pytest
from hostutil import HOST, KEY, deploy, up_hosts


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


@pytest.fixture(scope="session")
def deployed(hosts):
    """deploy.yml run twice on ddt-th1 (inventory/test), once per session: shared by
    test_deploy.py and test_monitoring_deploy.py, which run first (alphabetical order)."""
    assert HOST in hosts, f"{HOST} is not up: {hosts}"
    first, t1 = deploy()
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-2000:]
    second, t2 = deploy()
    print(f"\ndeploy: first run {t1:.1f} s, second run {t2:.1f} s")
    return {"address": hosts[HOST], "first": first, "second": second}
