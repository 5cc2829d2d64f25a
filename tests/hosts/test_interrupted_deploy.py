"""A deploy cut off around the release switch, then run again, must leave the host running the
current release; `fleet rollback` must run the release it switches to (one booted host, ddt-th1).

The deploy is SIGKILLed when the play reaches a task boundary around "Activate this release"
(before it, right after it, after the live links), with a change of a setting health's drift
compares (the DDTree budget, 16 <-> 32) and one it does not (an env var of the unit). The re-run
must restart the unit because the running unit is not the current release, although it changes no
file. Then `ddtree-ops fleet rollback` goes back to the release before (budget 32 -> 16 or back):
the unit must come up warm with the previous release's settings, and the line names it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hostutil import HOST, REPO_ROOT, VENV_BIN, copy_test_inventory, deploy, recap, ssh

pytestmark = [pytest.mark.hosts, pytest.mark.slow]  # one host, eight deploys: minutes on 2 cores

ROOT = "/etc/ddtree-ops/sglang/releases"
UNIT = "ddtree-sglang.service"
OPS = "/opt/ddtree-ops/venv/bin/ddtree-ops"
PLAN = "/etc/ddtree-ops/sglang/plan.json"
# kill when the play reaches this task: the boundary is right before it
BOUNDARIES = ["Activate this release", "Live paths follow the current release",
              "Restart when the running unit is not the current release"]


def _inventory(tmp: Path, budget: int, mark: str, nccl_port: int | None = None) -> Path:
    inv = tmp / f"inv-{budget}-{mark}"
    shutil.rmtree(inv, ignore_errors=True)  # the same settings asked for again (the rollback's inventory)
    copy_test_inventory(inv)
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    data["ddtree_speculative"]["budget"] = budget
    data["ddtree_service"]["env"] = {"DDTREE_TEST_MARK": mark}
    if nccl_port is not None:
        data["ddtree_server"]["nccl_port"] = nccl_port
    gv.write_text(yaml.safe_dump(data))
    return inv


def _killed_at(inv: Path, task: str) -> str:
    """deploy.yml SIGKILLed (its whole process group) when the play prints the start of ``task``."""
    p = subprocess.Popen([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "-l", HOST, "deploy.yml"],
                         cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    seen, end = [], time.monotonic() + 900
    try:
        for line in p.stdout:
            seen.append(line)
            if line.startswith(f"TASK [ddtree_service : {task}"):
                os.killpg(p.pid, signal.SIGKILL)
                break
            if time.monotonic() > end:
                break
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    out = "".join(seen)
    assert f"TASK [ddtree_service : {task}" in out, out[-4000:]
    return out


def _host(address: str) -> dict:
    r = ssh(address, f"{OPS} release list --root {ROOT} --json; echo @@; {OPS} release running --root {ROOT} "
                     f"--unit {UNIT} --json; echo @@; systemctl is-active {UNIT}; echo @@; "
                     f"tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value {UNIT})/environ "
                     "| grep ^DDTREE_TEST_MARK= || true; echo @@; "
                     f"{OPS} health http://127.0.0.1:30000 --plan {PLAN} --json; echo \"rc=$?\"")
    lst, run, active, env, health = r.stdout.split("@@")
    return {"list": json.loads(lst), "running": json.loads(run), "active": active.strip(), "env": env.strip(),
            "health": health}


def _journal(address: str) -> str:
    return ssh(address, f"journalctl --no-pager -n 30 -u {UNIT}").stdout


@pytest.fixture(scope="module")
def base(hosts, tmp_path_factory):
    assert HOST in hosts, hosts
    tmp = tmp_path_factory.mktemp("interrupted")
    r, t = deploy(_inventory(tmp, 32, "base"))
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    return {"tmp": tmp, "address": hosts[HOST]}


def test_a_stray_listener_on_the_rendezvous_port_stops_the_deploy_before_anything_changes(base):
    """A process on the new --nccl-port (a change health's drift does not compare) made the deploy
    fail after `current` switched, and the next restart crash-loop with EADDRINUSE."""
    address = base["address"]
    before = _host(address)
    pid = ssh(address, f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    stray = ssh(address, "nohup python3 -c 'import socket, time; s = socket.socket(); "
                         "s.bind((\"0.0.0.0\", 30200)); s.listen(); time.sleep(900)' >/dev/null 2>&1 & echo $!")
    try:
        for _ in range(50):  # listening before the deploy starts
            if ":30200 " in ssh(address, "ss -Htln").stdout:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the stray listener did not come up: {stray.stdout} {stray.stderr}")
        r, _ = deploy(_inventory(base["tmp"], 16, "stray", nccl_port=30200))
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "port 30200 is already in use" in out, out[-4000:]
        assert "ddtree_server.nccl_port" in out, out[-4000:]
        assert "Activate this release" not in out, out[-4000:]  # stopped before the role changed the host
        after = _host(address)
        assert after["list"]["current"] == before["list"]["current"] and after["active"] == "active", after
        assert ssh(address, f"systemctl show -p MainPID --value {UNIT}").stdout.strip() == pid
    finally:
        ssh(address, f"kill {int(stray.stdout.strip() or 0)} 2>/dev/null || true")


def test_a_deploy_killed_at_each_boundary_around_activation_is_repaired_by_running_it_again(base):
    address, budgets = base["address"], [16, 32, 16]
    for n, (task, budget) in enumerate(zip(BOUNDARIES, budgets, strict=True)):
        inv = _inventory(base["tmp"], budget, f"m{n}")
        before = _host(address)["list"]["current"]
        _killed_at(inv, task)
        r, t = deploy(inv)
        assert r.returncode == 0, f"{task}: " + r.stdout[-5000:] + _journal(address)
        h = _host(address)
        where = f"killed at {task!r} (budget {budget}), re-run in {t:.0f} s: {h} {_journal(address)[-2000:]}"
        assert h["list"]["current"] != before, where
        assert h["running"]["stale"] is False and h["running"]["current"] == h["list"]["current"], where
        assert h["active"] == "active", where
        assert h["env"] == f"DDTREE_TEST_MARK=m{n}", where  # a setting drift does not compare, live too
        assert h["health"].rstrip().endswith("rc=0"), where  # drift: the server runs the plan's budget
        assert recap(r.stdout)["changed"] >= 1, where
        print(f"\nkilled at {task!r}: re-run {t:.1f} s, now {h['list']['current']}")


def test_fleet_rollback_runs_the_previous_release_and_names_it(base):
    address = base["address"]
    h = _host(address)
    left, previous = h["list"]["current"], h["list"]["previous"]
    assert previous and previous != left, h
    scan = subprocess.run(["ssh-keyscan", "-T", "5", address], capture_output=True, text=True, timeout=30)
    known = base["tmp"] / "known_hosts"
    known.write_text(scan.stdout)
    inv = _inventory(base["tmp"], 16, "m2")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ddtree_ops", "fleet", "rollback", "-i", str(inv), "-l", HOST,
                        "--known-hosts", str(known)], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    after = _host(address)
    where = r.stdout + r.stderr + f"\n{after}\n" + _journal(address)[-2000:]
    assert r.returncode == 0, where
    assert f"{left} -> {previous}" in r.stdout, where
    assert after["list"]["current"] == previous and after["active"] == "active", where
    assert after["running"]["stale"] is False and after["health"].rstrip().endswith("rc=0"), where
    assert after["env"] == "DDTREE_TEST_MARK=m1", where  # the previous release's own env file
    print(f"\nfleet rollback {left} -> {previous}: {took:.1f} s")
