"""The preflight on the booted test host (stand-in nvidia-smi printing the derived 8x B300
fixtures, ``scripts/testhost-standins.sh``): the deployed host passes; a 64 MB ``/dev/shm`` and a
port taken by another process fail with the right fix; deploy.yml stops the unfit host before
anything changes on it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from hostutil import HOST, copy_test_inventory, deploy, recap, ssh, ssh_options

from ddtree_ops.host.preflight import build_zipapp

pytestmark = pytest.mark.hosts

PROBE = ("sha256sum /etc/systemd/system/ddtree-sglang.service /etc/ddtree-ops/sglang/*; "
         "systemctl show -p MainPID -p ActiveEnterTimestamp ddtree-sglang.service")
SKIP = ["--skip=kernel_module", "--skip=device_nodes", "--disk-min-free-gib", "2"]  # as inventory/test
TAKEN = 30123


@pytest.fixture(scope="module")
def zipapp(deployed, tmp_path_factory):
    addr = deployed["address"]
    app = build_zipapp(str(tmp_path_factory.mktemp("pf") / "preflight.pyz"))
    cp = subprocess.run(["scp", *ssh_options(), app, f"root@{addr}:/root/preflight.pyz"], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    yield "/root/preflight.pyz"
    ssh(addr, "rm -f /root/preflight.pyz /root/plan-taken.json")


def preflight(addr: str, app: str, plan: str = "/etc/ddtree-ops/sglang/plan.json") -> tuple[int, dict]:
    r = ssh(addr, f"python3 {app} --plan {plan} --json {' '.join(SKIP)}")
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)["checks"]}


def test_deployed_host_passes(deployed, zipapp):
    rc, c = preflight(deployed["address"], zipapp)
    assert rc == 0, {n: x["detail"] for n, x in c.items() if not x["ok"]}
    assert c["gpu_name"]["detail"].startswith("NVIDIA B300 SXM6 AC") and c["interconnect"]["ok"]
    assert "held by ddtree-sglang.service itself" in c["ports"]["detail"]


def test_64mb_dev_shm_fails_with_the_fix(deployed, zipapp):
    addr = deployed["address"]
    opts = ssh(addr, "findmnt -no OPTIONS /dev/shm").stdout.strip()
    size = next((o for o in opts.split(",") if o.startswith("size=")), "size=50%")
    assert ssh(addr, "mount -o remount,size=64M /dev/shm").returncode == 0
    try:
        rc, c = preflight(addr, zipapp)
    finally:
        assert ssh(addr, f"mount -o remount,{size} /dev/shm").returncode == 0  # as it was
    assert rc == 1 and not c["shm"]["ok"], opts
    assert "/dev/shm is 64 MiB" in c["shm"]["detail"] and "remount,size=" in c["shm"]["remediation"]


@pytest.fixture
def holder(deployed):
    """Another process (a unit of its own) listening on TAKEN."""
    addr = deployed["address"]
    r = ssh(addr, "systemd-run --unit=ddtree-test-holder.service python3 -c 'import socket,time; s=socket.socket(); "
                  f"s.bind((\"0.0.0.0\", {TAKEN})); s.listen(); time.sleep(600)' && sleep 1")
    assert r.returncode == 0, r.stderr
    yield
    ssh(addr, "systemctl stop ddtree-test-holder.service")


def test_taken_port_fails_with_the_fix(deployed, zipapp, holder):
    addr = deployed["address"]
    doc = json.loads(ssh(addr, "cat /etc/ddtree-ops/sglang/plan.json").stdout)
    doc["deployment"]["server"]["port"] = TAKEN
    ssh(addr, f"cat > /root/plan-taken.json <<'EOF'\n{json.dumps(doc)}\nEOF")
    rc, c = preflight(addr, zipapp, "/root/plan-taken.json")
    assert rc == 1 and not c["ports"]["ok"]
    assert f"port {TAKEN} is already in use by pid" in c["ports"]["detail"]
    assert "ddtree-test-holder.service" in c["ports"]["detail"]
    assert "set another port in the inventory" in c["ports"]["remediation"]


def test_deploy_stops_the_unfit_host_before_anything_changes(deployed, holder, tmp_path):
    addr = deployed["address"]
    before = ssh(addr, PROBE).stdout
    inv = tmp_path / "inv"
    copy_test_inventory(inv)
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    data["ddtree_server"]["port"] = TAKEN
    gv.write_text(yaml.safe_dump(data))
    r, _ = deploy(inv)
    assert r.returncode != 0
    assert f"preflight failed on {HOST} (nothing was changed on it)" in r.stdout, r.stdout[-3000:]
    assert f"[ports] port {TAKEN} is already in use" in r.stdout and "Fix: stop the process" in r.stdout
    assert "TASK [cuda_toolkit" not in r.stdout and "Traceback" not in r.stdout + r.stderr
    assert recap(r.stdout)["changed"] == 0
    assert ssh(addr, PROBE).stdout == before
