"""The test hosts booted by ``scripts/testhost.sh up`` are real, offline systemd machines."""

from __future__ import annotations

import pytest
from hostutil import ssh

pytestmark = pytest.mark.hosts


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
