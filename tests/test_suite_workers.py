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


def test_a_host_test_cannot_leave_the_hosts_group(tmp_path):
    """The suite's grouping hook (tests/conftest.py, copied as is) on stand-in tests: a file in
    tests/hosts without its ``hosts`` mark runs in the ``hosts`` group (before: wherever xdist put
    it, beside the other host tests), and so does a ``hosts``-marked test with an ``xdist_group`` of
    its own (xdist ran it in a group "hosts_mine", apart from the host tests)."""
    pytest.importorskip("xdist")
    import shutil

    tests = tmp_path / "tests"
    (tests / "hosts").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  hosts: host test\n  slow: slow\n")
    (tests / "hosts" / "test_unmarked.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('n', [1, 2])\ndef test_forgot_its_mark(n):\n    pass\n")
    (tests / "test_plain.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('n', range(6))\ndef test_plain(n):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DDTREE_TESTHOSTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v", "tests"]
    r = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ids = re.findall(r"PASSED (\S+)", r.stdout)
    assert sorted(i for i in ids if i.endswith("@hosts")) == [
        "tests/hosts/test_unmarked.py::test_forgot_its_mark[1]@hosts",
        "tests/hosts/test_unmarked.py::test_forgot_its_mark[2]@hosts"] and len(ids) == 8, ids
    (tests / "test_own_group.py").write_text(
        "import pytest\n\n\n@pytest.mark.xdist_group('mine')\n@pytest.mark.hosts\ndef test_own_group():\n    pass\n")
    r = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "tests/test_own_group.py::test_own_group@hosts" in re.findall(r"PASSED (\S+)", r.stdout), r.stdout[-2000:]
