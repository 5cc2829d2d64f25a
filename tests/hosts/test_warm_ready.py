"""Readiness gated on warmup, under systemd on the booted test host.

Proves: after ``deploy.yml`` the unit became active only after its own warmup covered every
batch size of the plan (warm marker written before ``ActiveEnterTimestamp``); health passes
with the deep check (drift) from the controller and on the host (warm marker); a server
killed mid-warmup fails the start — the unit never becomes active, the marker is gone, the
journal names the batch size, and ``Restart=on-failure`` schedules a restart.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from hostutil import HOST, VENV_BIN, deploy, ssh

pytestmark = pytest.mark.hosts

UNIT = "ddtree-sglang.service"
PLAN = "/etc/ddtree-ops/sglang/plan.json"
MARKER = "/run/ddtree-ops/sglang/warm.json"
DROPIN = f"/etc/systemd/system/{UNIT}.d"


@pytest.fixture(scope="module")
def host(hosts):
    assert HOST in hosts, f"{HOST} is not up: {hosts}"
    r, _ = deploy()
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    return hosts[HOST]


def _show(addr: str, *props: str) -> dict[str, str]:
    out = ssh(addr, f"systemctl show {' '.join('-p ' + p for p in props)} {UNIT}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_unit_became_active_only_after_its_warmup_covered_the_plan(host):
    plan = json.loads(ssh(host, f"cat {PLAN}").stdout)
    marker = ssh(host, f"cat {MARKER}")
    assert marker.returncode == 0, marker.stderr
    report = json.loads(marker.stdout)
    assert [r["batch_size"] for r in report["results"] if r["kind"] == "text"] == plan["plan"]["capture_bs"]
    props = _show(host, "ActiveState", "ActiveEnterTimestamp")
    assert props["ActiveState"] == "active"
    active_at = float(ssh(host, f"date -d '{props['ActiveEnterTimestamp']}' +%s.%N").stdout)
    assert report["finished_at"] <= active_at + 1.0, (report["finished_at"], active_at)  # s resolution of the stamp
    journal = ssh(host, f"journalctl -u {UNIT} -b --no-pager -o cat | tail -n 200").stdout
    assert "batch sizes [" in journal and "ok   warmup:" in journal


def test_health_with_deep_check_passes_on_the_deployed_host(host, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(ssh(host, f"cat {PLAN}").stdout)
    r = subprocess.run([str(VENV_BIN / "ddtree-ops"), "health", f"http://{host}:30000", "--plan", str(plan), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert set(checks) == {"reachable", "ready", "drift", "progress", "accept_length"}
    assert all(c["ok"] for c in checks.values()) and "match the deployed config" in checks["drift"]["detail"]
    # on the host, as an operator or a probe would run it: also the warm marker
    on_host = ssh(
        host, f"/opt/ddtree-ops/venv/bin/python -m ddtree_ops health --plan {PLAN} --warm-marker {MARKER} --json"
    )
    assert on_host.returncode == 0, on_host.stdout + on_host.stderr
    assert {c["name"] for c in json.loads(on_host.stdout)["checks"] if c["ok"]} >= {"ready", "warm", "drift"}


def test_server_killed_mid_warmup_fails_the_start(host):
    # slow the simulator's forward passes so the warmup takes ~15 s, then kill SGLang during it
    setup = (f"mkdir -p {DROPIN} && printf '[Service]\\nEnvironment=SGLANG_SIM_STEP_SECONDS=0.1\\nRestartSec=3\\n' "
             f"> {DROPIN}/slow.conf && systemctl daemon-reload && systemctl restart --no-block {UNIT}")
    assert ssh(host, setup).returncode == 0
    try:
        deadline = time.monotonic() + 60
        while "ddtree_ops warmup" not in ssh(host, "ps -eo args").stdout:
            assert time.monotonic() < deadline, "warmup never started"
            assert _show(host, "ActiveState")["ActiveState"] != "active"
            time.sleep(0.3)
        time.sleep(2.0)
        assert _show(host, "ActiveState")["ActiveState"] == "activating"
        assert ssh(host, f"test -e {MARKER}").returncode != 0          # not warm yet
        restarts = int(_show(host, "NRestarts")["NRestarts"])
        assert ssh(host, f"systemctl kill -s KILL --kill-whom=main {UNIT}").returncode == 0
        seen = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            p = _show(host, "ActiveState", "SubState", "NRestarts")
            seen.add((p["ActiveState"], p["SubState"]))
            if int(p["NRestarts"]) > restarts:
                break
            time.sleep(0.2)
        assert int(p["NRestarts"]) == restarts + 1, seen              # Restart=on-failure applied
        assert ("active", "running") not in seen, seen                # never active in between
        assert ssh(host, f"test -e {MARKER}").returncode != 0          # the new start is not warm either
        journal = ssh(host, f"journalctl -u {UNIT} -b --no-pager -o cat | tail -n 400").stdout
        assert "Main process exited, code=killed, status=9/KILL" in journal, journal[-3000:]
    finally:
        assert ssh(host, f"rm -rf {DROPIN} && systemctl daemon-reload && systemctl reset-failed {UNIT}; "
                         f"systemctl restart {UNIT}").returncode == 0
    assert _show(host, "ActiveState")["ActiveState"] == "active"
    assert ssh(host, f"test -s {MARKER}").returncode == 0
