"""Two deployments on one machine, end to end: ``deploy.yml`` with two
inventory hosts sharing ``ddt-th1``'s ``ansible_host`` (tp 4 each, GPUs 0-3 and 4-7 of the
stand-in's 8, different models, ports, units and accounts) deploys both instances in two
waves; both units become active (warm) and healthy, each holds its own rendezvous port and
RuntimeDirectory (with the Prometheus multiprocess directory inside), Prometheus gets one
target per instance, and a second run changes nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hostutil import HOST, KEY, TEST_INVENTORY, VENV_BIN, deploy, recap, ssh

pytestmark = pytest.mark.hosts

SECOND = f"{HOST}-b"
INSTANCES = {  # inventory host -> (service name, SGLang port, exporter port, rendezvous port, model name)
    HOST: ("sglang", 30000, 19400, 30100, "kimi-k2.6"),
    SECOND: ("sglang-b", 30001, 19401, 30101, "qwen3-8b"),
}


def _inventory(root: Path, address: str) -> Path:
    """inventory/test plus a second inventory host on the same machine (host_vars for both)."""
    inv = root / "inv"
    shutil.copytree(TEST_INVENTORY, inv)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    hosts["all"]["children"]["testhosts"]["hosts"][SECOND] = {"ansible_host": address}
    hosts["all"]["children"]["testhosts"]["vars"]["ansible_ssh_private_key_file"] = str(
        KEY
    )  # not next to inventory_dir
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    base = yaml.safe_load((TEST_INVENTORY / "group_vars" / "testhosts.yml").read_text())["ddtree_server"]
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / f"{HOST}.yml").write_text(yaml.safe_dump({
        "ddtree_server": {**base, "tp_size": 4},
        "ddtree_service": {"name": "sglang", "start_timeout_s": 300, "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
    }))
    (inv / "host_vars" / f"{SECOND}.yml").write_text(yaml.safe_dump({
        "ddtree_model": {"path": "/srv/models/qwen3-8b-sim", "served_model_name": "qwen3-8b"},
        "ddtree_server": {**base, "tp_size": 4, "port": 30001, "base_gpu_id": 4},
        "ddtree_service": {"name": "sglang-b", "user": "sglang-b", "group": "sglang-b", "start_timeout_s": 300},
        "ddtree_ops": {"health_timeout_s": 5, "exporter_port": 19401, "ready_timeout_s": 120},
    }))
    return inv


@pytest.fixture(scope="module")
def multi(hosts, tmp_path_factory):
    assert HOST in hosts, f"{HOST} is not up: {hosts}"
    inv = _inventory(tmp_path_factory.mktemp("multi"), hosts[HOST])
    first, t1 = deploy(inv, limit=f"{HOST},{SECOND}")
    if first.returncode != 0:
        journal = ssh(hosts[HOST], "journalctl --no-pager -n 60 -u 'ddtree-sglang*'").stdout
        pytest.fail(first.stdout[-4000:] + first.stderr[-1000:] + "\n--- journal ---\n" + journal, pytrace=False)
    second, t2 = deploy(inv, limit=f"{HOST},{SECOND}")
    print(f"\nmulti-instance deploy: first run {t1:.1f} s, second run {t2:.1f} s")
    return {"address": hosts[HOST], "inv": inv, "first": first, "second": second}


def test_both_instances_deploy_in_their_own_wave(multi):
    """The service play runs once per wave: the first over ddt-th1 alone, the next over ddt-th1-b."""
    out = multi["first"].stdout
    waves = []
    for section in out.split("PLAY [")[1:]:
        if section.startswith("Install and start the SGLang service]"):
            waves.append(set(re.findall(r"^(?:ok|changed|skipping): \[([\w.-]+)", section, re.M)))
    assert [w for w in waves if w] == [{HOST}, {SECOND}], waves  # waves 2-7: "no hosts matched"
    for host in INSTANCES:
        r = recap(out, host)
        assert r["failed"] == 0 and r["ok"] > 0, (host, r)


def test_both_units_active_warm_and_healthy(multi):
    addr = multi["address"]
    for host, (name, port, exporter, nccl, model) in INSTANCES.items():
        unit = f"ddtree-{name}.service"
        assert ssh(addr, f"systemctl is-active {unit}").stdout.strip() == "active", host
        assert ssh(addr, f"test -s /run/ddtree-ops/{name}/warm.json").returncode == 0, host
        r = subprocess.run([str(VENV_BIN / "ddtree-ops"), "health", f"http://{addr}:{port}", "--json"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        info = json.loads(ssh(addr, f"curl -fsS --max-time 5 http://127.0.0.1:{port}/server_info").stdout)
        assert info["served_model_name"] == model and info["nccl_port"] == nccl and info["tp_size"] == 4
        assert ssh(addr, f"systemctl is-active ddtree-{name}-exporter.service").stdout.strip() == "active"
        assert ssh(addr, f"curl -fsS --max-time 5 -o /dev/null http://127.0.0.1:{exporter}/metrics").returncode == 0


def test_each_instance_holds_its_own_rendezvous_port_and_runtime_state(multi):
    addr = multi["address"]
    listening = ssh(addr, "ss -Hltnp").stdout
    for host, (name, _port, _exporter, nccl, _model) in INSTANCES.items():
        pid = ssh(addr, f"systemctl show -p MainPID --value ddtree-{name}.service").stdout.strip()
        assert any(f"127.0.0.1:{nccl} " in line and f"pid={pid}," in line for line in listening.splitlines()), \
            (host, nccl, listening)
        # SGLang's (and the sim's) multiprocess directory: a temporary directory in the unit's RuntimeDirectory
        found = ssh(addr, f"find /run/ddtree-ops/{name} -mindepth 2 -name '*.db' | head -1").stdout.strip()
        assert found.startswith(f"/run/ddtree-ops/{name}/tmp"), (host, found)
    users = {ssh(addr, f"stat -c %U /var/cache/ddtree-ops/{name}").stdout.strip() for name, *_ in INSTANCES.values()}
    assert users == {"sglang", "sglang-b"}


def test_prometheus_gets_one_target_per_instance(multi):
    addr = multi["address"]
    doc = yaml.safe_load(ssh(addr, "cat /etc/prometheus/prometheus.yml").stdout)
    for job in doc["scrape_configs"]:
        if job["job_name"] in ("sglang", "ddtree_exporter"):
            targets = sorted(t for sc in job["static_configs"] for t in sc["targets"])
            want = sorted(f"{addr}:{v[1] if job['job_name'] == 'sglang' else v[2]}" for v in INSTANCES.values())
            assert targets == want, (job["job_name"], targets)


def test_second_run_changes_nothing(multi):
    assert multi["second"].returncode == 0
    for host in INSTANCES:
        r = recap(multi["second"].stdout, host)
        assert r["changed"] == 0 and r["failed"] == 0, (host, multi["second"].stdout[-4000:])


def test_a_held_rendezvous_port_stops_the_deploy_naming_the_holder(multi):
    """Last (it leaves ddt-th1-b's new unit file uninstalled-by-restart): a stray listener on the
    port ddt-th1-b is about to use as --nccl-port stops its deploy before any restart."""
    addr, inv = multi["address"], multi["inv"]
    stray = ssh(addr, "systemd-run --unit ddtree-test-stray /usr/bin/python3 -m http.server --bind 0.0.0.0 31555")
    assert stray.returncode == 0, stray.stderr
    try:
        hv = inv / "host_vars" / f"{SECOND}.yml"
        data = yaml.safe_load(hv.read_text())
        data["ddtree_server"]["nccl_port"] = 31555
        hv.write_text(yaml.safe_dump(data))
        pid = ssh(addr, "systemctl show -p MainPID --value ddtree-sglang-b.service").stdout.strip()
        r, _ = deploy(inv, limit=SECOND)
        # stopped by the first check that sees it: the host preflight (it checks every port the
        # instance binds, the rendezvous port included) or, for a holder that came up after it, the
        # role's own check; both run before anything of the service changes
        assert r.returncode != 0
        assert "31555" in r.stdout and "ddtree_server.nccl_port" in r.stdout, r.stdout[-3000:]
        assert "ddtree-test-stray.service" in r.stdout, r.stdout[-3000:]
        assert "Activate this release" not in r.stdout, r.stdout[-3000:]
        assert ssh(addr, "systemctl show -p MainPID --value ddtree-sglang-b.service").stdout.strip() == pid
    finally:
        ssh(addr, "systemctl stop ddtree-test-stray.service")
