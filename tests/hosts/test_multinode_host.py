"""One SGLang server over two machines, end to end: ``deploy.yml`` over ``ddt-th1`` (rank 0) and
``ddt-th2`` (rank 1) of one ``ddtree_server.multinode`` deployment (tp 16, 8 stand-in GPUs each,
the simulator meeting at rank 0's store over the hosts' routed veths). Both units start together
and become active; rank 0 serves the API, rank 1 only SGLang's health-only server; a stopped rank 1
takes rank 0 down as NCCL does, and ``ddtree-ops health`` / ``fleet status`` name the stopped node.

Its own service name, ports and account on ``ddt-th1`` (beside the shared deployment there); the
units are stopped at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from hostutil import KEY, REPO_ROOT, TEST_INVENTORY, deploy, link_hosts, recap, ssh, unlink_hosts

pytestmark = pytest.mark.hosts

NODES = ("ddt-th1", "ddt-th2")
NAME, PORT, EXPORTER, STORE = "sglang-mn", 30010, 19410, 30210
UNIT = f"ddtree-{NAME}.service"


def _inventory(root: Path, addrs: dict[str, str]) -> Path:
    inv = root / "inv"
    shutil.copytree(TEST_INVENTORY, inv)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    th = hosts["all"]["children"]["testhosts"]
    th["hosts"] = {h: {"ansible_host": addrs[h]} for h in NODES}
    th["vars"]["ansible_ssh_private_key_file"] = str(KEY)
    hosts["all"]["children"]["monitoring"] = {"hosts": {}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "host_vars").mkdir()
    for h in NODES:
        gw = re.sub(r"\.2$", ".1", addrs[h])
        (inv / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump({"cuda_toolkit_repo_url": f"http://{gw}:8765"}))
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    data["ddtree_server"] = {**data["ddtree_server"], "port": PORT, "nccl_port": PORT + 100, "tp_size": 16,
                             "multinode": {"nodes": list(NODES), "dist_init_addr": addrs[NODES[0]],
                                           "dist_init_port": STORE, "dist_timeout_s": 300}}
    data["ddtree_service"] = {**data["ddtree_service"], "name": NAME, "user": NAME, "group": NAME,
                              "restart_sec": 2}
    data["ddtree_ops"] = {**data["ddtree_ops"], "exporter_port": EXPORTER}
    gv.write_text(yaml.safe_dump(data))
    return inv


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _journal(addrs: dict[str, str]) -> str:
    return "\n".join(f"--- {h} ---\n" + ssh(a, f"journalctl --no-pager -n 40 -u {UNIT}").stdout
                     for h, a in addrs.items())


@pytest.fixture(scope="module")
def two_nodes(hosts, tmp_path_factory):
    missing = [h for h in NODES if h not in hosts]
    if missing:
        pytest.fail(f"{missing} not up ({hosts}): boot two test hosts (scripts/testhost.sh up 2)", pytrace=False)
    addrs = {h: hosts[h] for h in NODES}
    undo = link_hosts(addrs)
    try:
        inv = _inventory(tmp_path_factory.mktemp("multinode"), addrs)
        r, took = deploy(inv, limit=",".join(NODES))
        if r.returncode != 0:
            pytest.fail(r.stdout[-6000:] + r.stderr[-1500:] + "\n" + _journal(addrs), pytrace=False)
        print(f"\n2-node deploy: {took:.1f} s")
        yield {"addrs": addrs, "inv": inv, "deploy": r, "tmp": tmp_path_factory.mktemp("multinode-known")}
    finally:
        for a in addrs.values():
            ssh(a, f"systemctl disable --now {UNIT} ddtree-{NAME}-exporter.service")
        unlink_hosts(undo)


def test_two_nodes_deploy_and_serve_through_rank_0(two_nodes):
    addrs = two_nodes["addrs"]
    for h in NODES:
        rc = recap(two_nodes["deploy"].stdout, h)
        assert rc["failed"] == 0 and rc["ok"] > 0, (h, rc)
        assert ssh(addrs[h], f"systemctl is-active {UNIT}").stdout.strip() == "active", _journal(addrs)
    r0, r1 = (f"http://{addrs[h]}:{PORT}" for h in NODES)
    body = json.dumps({"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(f"{r0}/generate", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200 and "text" in json.loads(resp.read())
    assert _status(f"{r1}/health") == 200 and _status(f"{r1}/server_info") == 404  # health-only server
    # rank 0 only: its exporter; rank 1 has none
    assert ssh(addrs[NODES[0]], f"systemctl is-active ddtree-{NAME}-exporter.service").stdout.strip() == "active"
    assert ssh(addrs[NODES[1]], f"systemctl cat ddtree-{NAME}-exporter.service").returncode != 0
    argv = ssh(addrs[NODES[1]], f"systemctl show -p ExecStart --value {UNIT}").stdout
    assert "--nnodes 2 --node-rank 1" in argv and f"--dist-init-addr {addrs[NODES[0]]}:{STORE}" in argv, argv


def test_a_stopped_node_is_named_by_health_and_fleet_status(two_nodes):
    addrs = two_nodes["addrs"]
    ssh(addrs[NODES[1]], f"systemctl stop {UNIT}")
    # rank 0's collectives lose the node: it exits as SGLang does, and restarts waiting for it
    end = time.monotonic() + 60
    while time.monotonic() < end:
        log = ssh(addrs[NODES[0]], f"journalctl --no-pager -n 200 -u {UNIT}").stdout
        if "ncclRemoteError" in log:
            break
        time.sleep(1)
    assert "ncclRemoteError" in log, log[-3000:]
    health = ssh(addrs[NODES[0]], f"/opt/ddtree-ops/venv/bin/ddtree-ops health http://127.0.0.1:{PORT} "
                                  f"--plan /etc/ddtree-ops/{NAME}/plan.json --json")
    assert health.returncode != 0, health.stdout
    text = " ".join(c["detail"] for c in json.loads(health.stdout)["checks"])
    assert "ddt-th2 (rank 1)" in text, text
    known = two_nodes["tmp"] / "known_hosts"
    scan = subprocess.run(["ssh-keyscan", "-T", "5", *addrs.values()], capture_output=True, text=True, timeout=30)
    known.write_text(scan.stdout)
    r = subprocess.run([sys.executable, "-m", "ddtree_ops", "fleet", "status", "-i", str(two_nodes["inv"]),
                        "--known-hosts", str(known), "--timeout", "30", "--json"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    rows = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert r.returncode == 1 and not rows["ddt-th2"]["ok"], r.stdout
    assert rows["ddt-th2"]["active_state"] == "inactive" and f"unit {UNIT} is inactive" in rows["ddt-th2"]["error"]
    assert not rows["ddt-th1"]["ok"], rows["ddt-th1"]
