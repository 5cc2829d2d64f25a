"""scripts/test.sh runs pytest on two workers (pytest-xdist ``--dist loadgroup``); the host tests
must all run in one of them, in order: they share the machine-wide test hosts and the session's
deploy of ``ddt-th1``. xdist's grouping has silently stopped working before (pytest 9.2 with
xdist 3.8: pytest-dev/pytest-xdist#1386), after which two workers deployed to one host at once and
apt's lock failed the deploy. This runs the real suite's grouping (tests/conftest.py, pyproject's
settings) on real host tests, which skip here (no ``DDTREE_TESTHOSTS``), beside other tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO


def test_host_tests_run_in_one_worker_and_the_rest_spread():
    pytest.importorskip("xdist")
    env = {k: v for k, v in os.environ.items() if k not in ("DDTREE_TESTHOSTS", "PYTEST_XDIST_WORKER")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                        "-v", "tests/hosts/test_testhost.py", "tests/hosts/test_fleet_host.py",
                        "tests/test_docs_links.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ran = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] \w+ (\S+)", r.stdout, re.M)
    hosts = [(w, t) for w, t in ran if t.startswith("tests/hosts/")]
    others = [(w, t) for w, t in ran if not t.startswith("tests/hosts/")]
    assert len(hosts) >= 6 and len(others) >= 6, r.stdout[-3000:]
    assert len({w for w, _ in hosts}) == 1, hosts  # one worker for every host test
    assert all(t.endswith("@hosts") for _, t in hosts), hosts  # xdist read the group
    assert len({w for w, _ in ran}) == 2, ran  # the rest did spread


@pytest.mark.parametrize("slow", [False, True])
def test_slow_scenarios_skip_unless_asked(slow):
    """Without ``--slow`` a slow scenario is skipped and says how to run it; with it, it runs (here it
    then skips for want of booted hosts, the host tests' own reason)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DDTREE_TESTHOSTS", "PYTEST_XDIST_WORKER")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                        *(["--slow"] if slow else []), "tests/hosts/test_sweep_host.py"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert ("runs with scripts/test.sh --slow (CI)" in r.stdout) is not slow, r.stdout
    assert ("host tests run under scripts/test.sh" in r.stdout) is slow, r.stdout
