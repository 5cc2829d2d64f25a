"""End to end: ``ansible-playbook deploy.yml`` onto a booted systemd test host.

Proves: the service is active and healthy, a second run reports changed=0, what Ansible
installed is byte-identical to ``ddtree-ops render``, every rendered unit passes
``systemd-analyze verify``, warmup covers the plan, bad input changes nothing, and
``--check --diff`` reports what a run would change and changes nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hostutil import HOST, REPO_ROOT, TEST_INVENTORY, VENV_BIN, copy_test_inventory, deploy, recap, ssh, ssh_options

pytestmark = pytest.mark.hosts

def test_second_run_changes_nothing(deployed):
    r = recap(deployed["second"].stdout)
    assert deployed["second"].returncode == 0
    assert r["changed"] == 0 and r["failed"] == 0, deployed["second"].stdout[-4000:]


def test_deploy_skips_empty_waves_quietly(deployed):
    """One instance: waves 1..7 have no host and are skipped without a warning per wave."""
    for run in (deployed["first"], deployed["second"]):
        assert "Could not match supplied host pattern" not in run.stdout + run.stderr, run.stderr[-2000:]


def test_service_active_and_healthy(deployed):
    addr = deployed["address"]
    assert ssh(addr, "systemctl is-active ddtree-sglang.service").stdout.strip() == "active"
    assert ssh(addr, "systemctl is-enabled ddtree-sglang.service").stdout.strip() == "enabled"
    r = subprocess.run([str(VENV_BIN / "ddtree-ops"), "health", f"http://{addr}:30000", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["ready"]["ok"] and checks["accept_length"]["ok"]


def test_play_shows_the_plan(deployed):
    out = deployed["first"].stdout
    assert "draft_tokens_per_req=8" in out and "verify_tokens_per_req=33" in out


def test_installed_files_byte_identical_to_cli_render(deployed, tmp_path):
    r = subprocess.run([str(VENV_BIN / "ddtree-ops"), "render", "--out", str(tmp_path), "-i", str(TEST_INVENTORY),
                        "-l", HOST], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rendered = sorted(p for p in (tmp_path / HOST).rglob("*") if p.is_file())
    assert len(rendered) >= 3
    for p in rendered:
        remote = "/" + str(p.relative_to(tmp_path / HOST))
        got = subprocess.run(
            ["ssh", *ssh_options(), f"root@{deployed['address']}", f"cat {remote}"], capture_output=True, timeout=60
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout == p.read_bytes(), f"{remote} differs from `ddtree-ops render`"
        mode = ssh(deployed["address"], f"stat -L -c %a {remote}").stdout.strip()  # through the release links
        assert mode == f"{p.stat().st_mode & 0o777:o}", remote


def test_every_rendered_unit_passes_systemd_analyze_verify(deployed, tmp_path):
    addr = deployed["address"]
    r = ssh(addr, "systemd-analyze verify --man=no /etc/systemd/system/ddtree-sglang.service")
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    for inv in ("example", "test"):
        out = tmp_path / inv
        subprocess.run([str(VENV_BIN / "ddtree-ops"), "render", "--out", str(out), "-i",
                        str(REPO_ROOT / "inventory" / inv)], check=True, capture_output=True, timeout=120)
        for unit in out.glob("*/etc/systemd/system/*.service"):
            remote = f"/tmp/verify-{inv}-{unit.parent.parent.parent.parent.name}/{unit.name}"
            assert ssh(addr, f"mkdir -p {Path(remote).parent}").returncode == 0
            cp = subprocess.run(["scp", *ssh_options(), str(unit), f"root@{addr}:{remote}"],
                                capture_output=True, text=True, timeout=60)
            assert cp.returncode == 0, cp.stderr
            # A release runs its own SGLang build (<sglang_venv>.builds/<name>/bin/python): for another
            # inventory's pin that build is not on this host; verify checks the unit, so stand in for
            # the interpreter with the host's python3 while verifying, then take it away.
            exe = next(ln.split("=", 1)[1].split()[0] for ln in unit.read_text().splitlines()
                       if ln.startswith("ExecStart=")).lstrip("-@:+!")  # systemd's prefixes
            stand_in = ssh(addr, f"test -e {exe} && echo present || echo absent").stdout.strip() == "absent"
            if stand_in:
                assert ssh(addr, f"mkdir -p {Path(exe).parent} && ln -s /usr/bin/python3 {exe}").returncode == 0
            try:
                v = ssh(addr, f"systemd-analyze verify --man=no {remote}")
            finally:
                if stand_in:
                    ssh(addr, f"rm -f {exe} && rmdir -p --ignore-fail-on-non-empty {Path(exe).parent}")
            assert v.returncode == 0 and not v.stderr.strip(), f"{unit}: {v.stderr}"


def test_warmup_covers_the_plan(deployed, tmp_path):
    addr = deployed["address"]
    plan = tmp_path / "plan.json"
    plan.write_text(ssh(addr, "cat /etc/ddtree-ops/sglang/plan.json").stdout)
    r = subprocess.run([str(VENV_BIN / "ddtree-ops"), "warmup", f"http://{addr}:30000", "--plan", str(plan), "--json",
                        "--deadline", "120"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)["report"]
    capture = json.loads(plan.read_text())["plan"]["capture_bs"]
    assert [x["batch_size"] for x in report["results"]] == capture
    assert all(x["completion_tokens"] > 0 and x["accept_length"] > 1 for x in report["results"])


@pytest.mark.parametrize("bad", [
    {"ddtree_model": {"path": "/srv/models/100%"}},
    {"ddtree_speculative": {"algorithm": "DDTREE", "draft_model_path": "/d", "block_size": 8, "budget": -1}},
    {"ddtree_server": {"tp_size": 16, "port": 30000}},
    {"ddtree_host_class": "h100"},
])
def test_bad_input_changes_nothing_on_the_host(deployed, tmp_path, bad):
    addr = deployed["address"]
    probe = ("sha256sum /etc/systemd/system/ddtree-sglang.service /etc/ddtree-ops/sglang/*; "
             "systemctl show -p MainPID -p ActiveEnterTimestamp ddtree-sglang.service")
    before = ssh(addr, probe).stdout
    inv = copy_test_inventory(tmp_path / "inv")
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    data.update(bad)
    gv.write_text(yaml.safe_dump(data))
    r, _ = deploy(inv)
    assert r.returncode != 0
    assert "Fix:" in r.stdout and "Traceback" not in r.stdout + r.stderr
    assert recap(r.stdout)["changed"] == 0
    assert ssh(addr, probe).stdout == before


# What a deployed host is, for the check-mode tests: the unit and every file of the deployment
# (the live paths, which are links through `current`), the release the `current` link names,
# the releases on the host, and the service's process.
HOST_STATE = ("sha256sum /etc/systemd/system/ddtree-sglang.service /etc/ddtree-ops/sglang/*; "
              "readlink /etc/ddtree-ops/sglang/releases/current; ls /etc/ddtree-ops/sglang/releases; "
              "systemctl show -p MainPID -p ActiveEnterTimestamp -p NRestarts ddtree-sglang.service")


def test_check_mode_on_a_deployed_host_reports_and_changes_nothing(deployed):
    """`deploy.yml --check --diff` on a host deployed with the same inventory: rc 0, changed=0,
    the host exactly as it was."""
    addr = deployed["address"]
    before = ssh(addr, HOST_STATE).stdout
    r, _ = deploy(args=("--check", "--diff"))
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    got = recap(r.stdout)
    assert got["changed"] == 0 and got["failed"] == 0, r.stdout[-5000:]
    assert ssh(addr, HOST_STATE).stdout == before


def test_check_mode_shows_a_config_change_and_makes_none(deployed, tmp_path):
    """A changed budget (32 -> 16) under `--check --diff`: the run says what would change (the
    rendered argv in plan.json and the unit's env, as diffs) and changes nothing on the host."""
    addr = deployed["address"]
    before = ssh(addr, HOST_STATE).stdout
    inv = copy_test_inventory(tmp_path / "inv")
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    assert data["ddtree_speculative"]["budget"] == 32
    data["ddtree_speculative"]["budget"] = 16
    gv.write_text(yaml.safe_dump(data))
    r, _ = deploy(inv, args=("--check", "--diff"))
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    got = recap(r.stdout)
    assert got["changed"] > 0 and got["failed"] == 0, r.stdout[-5000:]
    diff_lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("+", "-")) and "budget" in ln]
    assert any(ln.startswith("-") and "32" in ln for ln in diff_lines), r.stdout[-5000:]
    assert any(ln.startswith("+") and "16" in ln for ln in diff_lines), r.stdout[-5000:]
    assert ssh(addr, HOST_STATE).stdout == before


@pytest.mark.parametrize("tags", ["configure", "install", "preflight"])
def test_a_tagged_run_on_a_deployed_host_changes_nothing(deployed, tags):
    """`deploy.yml --tags install|configure|preflight` runs that task file of
    every role (validation always) on a deployed host: rc 0, nothing changed, same process."""
    addr = deployed["address"]
    before = ssh(addr, HOST_STATE).stdout
    r, _ = deploy(args=("--tags", tags))
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    got = recap(r.stdout)
    assert got["changed"] == 0 and got["failed"] == 0 and got["ok"] > 10, r.stdout[-5000:]
    assert ssh(addr, HOST_STATE).stdout == before
