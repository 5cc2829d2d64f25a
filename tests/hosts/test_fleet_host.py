"""``ddtree-ops fleet status`` against the booted, deployed test host: the
deployed host shows up active, ready and warm, read over SSH with its key checked against a
known_hosts file written by ``ssh-keyscan``; a second inventory entry at an address where
nothing listens is reported down, without a hang. inventory/test turns Ansible's host-key
checking off, so fleet refuses to run without ``--known-hosts``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hostutil import HOST, KEY, REPO_ROOT, TEST_INVENTORY

pytestmark = pytest.mark.hosts

GONE = "ddt-gone"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inventory(root: Path) -> Path:
    """inventory/test (the deployment's variables) plus ``ddt-gone`` at 127.0.0.1:<closed port>."""
    inv = root / "inv"
    shutil.copytree(TEST_INVENTORY, inv)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    group = hosts["all"]["children"]["testhosts"]
    group["hosts"][GONE] = {"ansible_host": "127.0.0.1", "ansible_port": _closed_port()}
    group["vars"]["ansible_ssh_private_key_file"] = str(KEY)  # not next to inventory_dir
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def _fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_ops", "fleet", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_fleet_status_shows_the_deployed_host_and_reports_a_down_one(deployed, tmp_path):
    address = deployed["address"]
    inv = _inventory(tmp_path)
    refused = _fleet("status", "-i", str(inv))
    assert refused.returncode == 2 and "host-key checking off" in refused.stderr, refused.stdout + refused.stderr

    scan = subprocess.run(["ssh-keyscan", "-T", "5", address], capture_output=True, text=True, timeout=30)
    assert scan.stdout.strip(), scan.stderr
    known = tmp_path / "known_hosts"
    known.write_text(scan.stdout)
    t0 = time.monotonic()
    r = _fleet("status", "-i", str(inv), "--known-hosts", str(known), "--timeout", "30", "--json")
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr  # ddt-gone is down
    rows = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    th = rows[HOST]
    assert th["ok"], th
    assert (th["active_state"], th["ready"], th["warm"], th["drift"]) == ("active", True, True, "none"), th
    assert rows[GONE]["error"].startswith("down:") and not rows[GONE]["ok"], rows[GONE]
    assert took < 40, took
    print(f"\nfleet status of {HOST} + a down host: {took:.1f} s")

    table = _fleet("status", "-i", str(inv), "-l", HOST, "--known-hosts", str(known), "--timeout", "30")
    assert table.returncode == 0, table.stdout + table.stderr
    assert HOST in table.stdout and "active/running" in table.stdout
