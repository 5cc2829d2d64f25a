"""End to end on the booted test host: deploy.yml installs the exporter next to the SGLang
(simulator) unit and a real Prometheus (Debian's package) on the monitoring host, which is
the same machine ``ddt-th1``; Prometheus scrapes both targets, evaluates the rules, and
``ddtree_accept_length`` is visible through its query API. A second run changes nothing (the
session's shared ``deployed`` fixture).
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.parse

import pytest
from hostutil import HOST, recap, ssh

pytestmark = pytest.mark.hosts
EXPORTER_UNIT = "ddtree-sglang-exporter.service"


def _get(addr: str, url: str) -> dict:
    r = ssh(addr, f"curl -fsS --max-time 5 {shlex.quote(url)}")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_second_run_changes_nothing(deployed):
    r = recap(deployed["second"].stdout)
    assert r["changed"] == 0 and r["failed"] == 0, deployed["second"].stdout[-4000:]


def test_exporter_active_and_unit_verifies(deployed):
    addr = deployed["address"]
    assert ssh(addr, f"systemctl is-active {EXPORTER_UNIT}").stdout.strip() == "active"
    assert ssh(addr, f"systemctl is-enabled {EXPORTER_UNIT}").stdout.strip() == "enabled"
    v = ssh(addr, f"systemd-analyze verify --man=no /etc/systemd/system/{EXPORTER_UNIT}")
    assert v.returncode == 0 and not v.stderr.strip(), v.stderr
    assert ssh(addr, "systemctl is-active prometheus.service").stdout.strip() == "active"
    assert ssh(addr, "systemctl is-enabled prometheus.service").stdout.strip() == "enabled"
    assert ssh(addr, "promtool check rules /etc/prometheus/ddtree-rules.yml").returncode == 0


def test_prometheus_scrapes_exporter_and_sees_accept_length(deployed):
    addr = deployed["address"]
    api = "http://127.0.0.1:9090/api/v1"
    deadline = time.monotonic() + 90
    health: dict = {}
    while time.monotonic() < deadline:
        targets = _get(addr, f"{api}/targets")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if health == {"sglang": "up", "ddtree_exporter": "up"}:
            break
        time.sleep(1)
    assert health == {"sglang": "up", "ddtree_exporter": "up"}, health
    q = urllib.parse.quote('ddtree_accept_length{host="ddt-th1"}')
    body = json.dumps({"text": ["a b c", "d e f"], "sampling_params": {"max_new_tokens": 64}})
    result: list = []
    while time.monotonic() < deadline and not result:
        # traffic, so that verify passes finish inside the exporter's window
        ssh(addr, f"curl -fsS --max-time 10 -H 'Content-Type: application/json' -d {shlex.quote(body)} "
                  "http://127.0.0.1:30000/generate >/dev/null")
        result = _get(addr, f"{api}/query?query={q}")["data"]["result"]
        time.sleep(1)
    assert result, "ddtree_accept_length never reached Prometheus"
    value = float(result[0]["value"][1])
    print(f"\nPrometheus on {HOST}: ddtree_accept_length = {value:.2f}")
    assert value > 1.5 and result[0]["metric"]["host_class"] == "b300"
    rules = _get(addr, f"{api}/rules")["data"]["groups"]
    names = {r["name"] for g in rules for r in g["rules"]}
    assert "DDTreeAcceptLengthCollapse" in names and "DDTreeServiceDown" in names
