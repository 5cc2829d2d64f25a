"""The test hosts booted by ``scripts/testhost.sh up`` are real, offline systemd machines.

These tests expect the hosts to be up already. When they are down they are skipped,
unless ``DDTREE_TESTHOSTS=1`` is set (as in CI after ``testhost.sh up``): then they fail.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.hosts

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "testhost.sh"
KEY = REPO_ROOT / ".state" / "ssh" / "id_ed25519"
SSH_OPTS = [
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=5",
    "-o", "IdentitiesOnly=yes",
]


def _up_hosts() -> dict[str, str]:
    """Host name -> address for every host that `testhost.sh status` reports as up."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), "status"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    hosts = {}
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "up":
            hosts[fields[0]] = fields[2]
    return hosts


@pytest.fixture(scope="module")
def hosts() -> dict[str, str]:
    found = _up_hosts() if KEY.exists() else {}
    if not found:
        reason = "test hosts are down: run `scripts/testhost.sh up` (as root) first"
        if os.environ.get("DDTREE_TESTHOSTS") == "1":
            pytest.fail(f"DDTREE_TESTHOSTS=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def ssh(address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", *SSH_OPTS, "-i", str(KEY), f"root@{address}", command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


def test_pid1_is_systemd(hosts: dict[str, str]) -> None:
    for name, address in hosts.items():
        out = ssh(address, "cat /proc/1/comm")
        assert out.returncode == 0, f"{name}: ssh failed: {out.stderr}"
        assert out.stdout.strip() == "systemd", f"{name}: PID 1 is {out.stdout.strip()!r}"


def test_system_is_running(hosts: dict[str, str]) -> None:
    for name, address in hosts.items():
        out = ssh(address, "systemctl is-system-running --wait")
        state = out.stdout.strip()
        if state not in {"running", "degraded"}:
            failed = ssh(address, "systemctl --failed --no-legend --plain").stdout
            pytest.fail(f"{name}: system state {state!r}; failed units:\n{failed}")


def test_hostname_matches_inventory_name(hosts: dict[str, str]) -> None:
    for name, address in hosts.items():
        assert ssh(address, "hostname").stdout.strip() == name


def test_no_default_route(hosts: dict[str, str]) -> None:
    """Like many GPU hosts, the test hosts cannot reach the internet."""
    for name, address in hosts.items():
        out = ssh(address, "ip -4 route show default; ip -6 route show default")
        assert out.returncode == 0, f"{name}: ssh failed: {out.stderr}"
        assert out.stdout.strip() == "", f"{name} has a default route: {out.stdout!r}"


def test_transient_unit_starts(hosts: dict[str, str]) -> None:
    """systemd can start units (what every role relies on)."""
    for name, address in hosts.items():
        out = ssh(
            address,
            "systemd-run --quiet --wait --collect --unit=ddt-selftest-$$ /bin/true"
            " && command -v systemd-analyze",
        )
        assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"
