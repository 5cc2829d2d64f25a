from __future__ import annotations

import copy
from pathlib import Path

import pytest
from helpers import base_hostvars


@pytest.fixture
def hostvars() -> dict:
    return copy.deepcopy(base_hostvars())


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the slow host scenarios (marker 'slow'; CI runs them: .ci/run)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``scripts/test.sh`` runs ``-n 2 --dist loadgroup``) every test against
    the booted test hosts runs in one worker, in file order: the hosts are machine-wide and the
    host tests share session fixtures (one deploy of ``ddt-th1`` for test_deploy.py and
    test_monitoring_deploy.py). The other tests spread over the workers.

    Tests marked ``slow`` (the rolling upgrades over three hosts, the sweep through four deploys,
    an interrupted real-SGLang install: ~6 of the host worker's ~14 min) are skipped, and say so,
    unless ``--slow`` is given: the warm suite stays near 10 minutes, CI runs everything."""
    slow = config.getoption("--slow")
    hosts_dir = Path(__file__).parent / "hosts"
    for item in items:
        # A host test is marked `hosts` or lives in tests/hosts (whose fixtures boot-check the hosts:
        # a new file there that forgot its pytestmark used to escape the group). xdist joins every
        # xdist_group of a test into one name ("hosts_mine"), so a host test's own xdist_group is
        # dropped: it would run apart from the others.
        if item.get_closest_marker("hosts") or hosts_dir in Path(item.path).parents:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "xdist_group"]
            item.add_marker(pytest.mark.xdist_group("hosts"))
        if not slow and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.skip(reason="slow scenario: runs with scripts/test.sh --slow (CI)"))
