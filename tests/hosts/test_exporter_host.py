"""The exporter on a booted test host: it follows a deploy that changes plan.json, and a
flood of idle connections to its port does not starve scrapes (the unit's LimitNOFILE fits
the listener's connection limit)."""

from __future__ import annotations

import re
import shlex
import time

import pytest
import yaml
from hostutil import TEST_INVENTORY, copy_test_inventory, deploy, ssh

from ddtree_ops.config.exporter_limits import NOFILE_LIMIT

pytestmark = pytest.mark.hosts
EXPORTER_UNIT = "ddtree-sglang-exporter.service"
METRICS = "http://127.0.0.1:19400/metrics"


def _metrics(addr: str) -> str:
    r = ssh(addr, f"curl -fsS --max-time 5 {METRICS}")
    return r.stdout if r.returncode == 0 else ""


def _wait_for(addr: str, pattern: str, deadline_s: float = 60) -> str:
    end = time.monotonic() + deadline_s
    text = ""
    while time.monotonic() < end:
        text = _metrics(addr)
        if re.search(pattern, text, re.M):
            return text
        time.sleep(1)
    raise AssertionError(f"{pattern!r} not in the exporter's metrics within {deadline_s} s:\n{text[-3000:]}")


@pytest.mark.slow
def test_exporter_follows_a_deploy_that_changes_the_budget(deployed, tmp_path):
    """deploy.yml with budget 16: the exporter (not restarted) reports budget 16 and no drift;
    deploying budget 32 again brings it back."""
    addr = deployed["address"]
    _wait_for(addr, r'^ddtree_deployment_info\{.*budget="32".*\} 1\.0$')
    pid = ssh(addr, f"systemctl show -p MainPID --value {EXPORTER_UNIT}").stdout.strip()
    inv = copy_test_inventory(tmp_path / "inv")
    gv = inv / "group_vars" / "testhosts.yml"
    doc = yaml.safe_load(gv.read_text())
    doc["ddtree_speculative"]["budget"] = 16
    gv.write_text(yaml.safe_dump(doc))
    try:
        r, took = deploy(inv)
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
        t0 = time.monotonic()
        text = _wait_for(addr, r'^ddtree_deployment_info\{.*budget="16".*\} 1\.0$')
        text = _wait_for(addr, r"^ddtree_config_drift\{.*\} 0\.0$")
        print(f"\nbudget 32 -> 16: deploy {took:.0f} s, exporter on the new plan {time.monotonic() - t0:.1f} s after")
        assert 'budget="32"' not in text
        assert ssh(addr, f"systemctl show -p MainPID --value {EXPORTER_UNIT}").stdout.strip() == pid  # reloaded
    finally:
        r, _ = deploy(TEST_INVENTORY)
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    _wait_for(addr, r'^ddtree_deployment_info\{.*budget="32".*\} 1\.0$')
    _wait_for(addr, r"^ddtree_config_drift\{.*\} 0\.0$")


FLOOD = """
import socket, time, urllib.request
flood = []
for _ in range(1100):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect(("127.0.0.1", 19400)); flood.append(s)
    except OSError:
        s.close()
ok = 0
for _ in range(5):
    try:
        with urllib.request.urlopen("http://127.0.0.1:19400/metrics", timeout=5) as r:
            ok += r.status == 200 and b"ddtree_up" in r.read()
    except OSError:
        pass
    time.sleep(0.3)
print(len(flood), ok)
"""


def test_exporter_answers_scrapes_under_an_idle_flood(deployed):
    """1,100 idle connections from the host to the exporter's port: scrapes still answer,
    the unit stays active with the LimitNOFILE it was rendered with."""
    addr = deployed["address"]
    _wait_for(addr, r"^ddtree_up\{.*\} 1\.0$")
    limit = ssh(addr, f"systemctl show -p LimitNOFILE --value {EXPORTER_UNIT}").stdout.strip()
    assert limit == str(NOFILE_LIMIT)
    r = ssh(addr, f"ulimit -n 4096; /opt/ddtree-ops/venv/bin/python -c {shlex.quote(FLOOD)}")
    assert r.returncode == 0, r.stderr
    connected, ok = (int(x) for x in r.stdout.split())
    print(f"\nidle flood on {addr}: {connected} connections, {ok} of 5 scrapes answered")
    assert connected > 1024 and ok == 5
    assert ssh(addr, f"systemctl is-active {EXPORTER_UNIT}").stdout.strip() == "active"
