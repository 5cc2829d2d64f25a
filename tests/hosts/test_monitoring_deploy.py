"""End to end on the booted test host: deploy.yml installs the exporter next to the SGLang
(simulator) unit and a real Prometheus (Debian's package) on the monitoring host, which is
the same machine ``ddt-th1``; Prometheus scrapes both targets, evaluates the rules, and
``ddtree_accept_length`` is visible through its query API. A second run changes nothing (the
session's shared ``deployed`` fixture).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.parse

import pytest
from hostutil import HOST, REPO_ROOT, TEST_INVENTORY, VENV_BIN, recap, ssh

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


def test_a_first_start_with_a_changed_config_keeps_prometheus_running(deployed):
    """A first deploy starts Prometheus and then reloads it for the new config a moment later.
    Debian's unit reloads with ``kill -HUP $MAINPID``, and a SIGHUP before Prometheus installs
    its handler stops it for good (Go exits on it; systemd counts that as a clean stop, so
    ``Restart=on-failure`` does nothing): CI lost Prometheus this way on a loaded machine. The
    handler must wait for /-/ready before it reloads. Here the window is made wide and certain:
    a drop-in starts Prometheus through ``sh -c 'sleep 3; exec prometheus'`` (a SIGHUP in those
    3 s stops the unit as one before Prometheus's handler would), Prometheus is stopped and its
    rules file changed, as on a first deploy."""
    addr = deployed["address"]
    dropin = "/etc/systemd/system/prometheus.service.d/zz-test-slow-start.conf"
    slow = "[Service]\nExecStart=\nExecStart=/bin/sh -c 'sleep 3; exec /usr/bin/prometheus $ARGS'\n"
    assert ssh(addr, f"mkdir -p {shlex.quote(dropin.rsplit('/', 1)[0])} && printf {shlex.quote(slow)} >{dropin} && "
                     "systemctl daemon-reload && systemctl stop prometheus.service && "
                     "echo '# changed' >> /etc/prometheus/ddtree-rules.yml").returncode == 0
    try:
        r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(TEST_INVENTORY), "-l", "monitoring",
                            "playbooks/monitoring.yml"], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert recap(r.stdout)["changed"] >= 2, r.stdout[-3000:]  # the rules file and the start
        time.sleep(1)
        assert ssh(addr, "systemctl is-active prometheus.service").stdout.strip() == "active"
    finally:
        ssh(addr, f"rm -f {dropin} && systemctl daemon-reload && systemctl restart prometheus.service")
