"""Releases and the rolling upgrade on three booted test hosts:
``scripts/testhost.sh up 3`` (scripts/test.sh boots three), the simulator as server.

One deployment is shared by every scenario, in order (each starts from the state the previous
one left, which is what it asserts on):

1. ``deploy.yml`` on ddt-th1..3: release R1 everywhere, live paths are symlinks through ``current``;
2. a good change rolled out with ``playbooks/rolling.yml``: every host on R2, gate passed;
3. a change only the running build reveals (``simulated_build: ddtree-unpatched``: the verify
   graphs are sized for the block, the first verify pass crashes the server): the canary fails
   at its restart, is rolled back to R2 and serves again; ddt-th2/3 untouched (R2, same PID);
4. a change that passes health but collapses acceptance length (``SGLANG_SIM_ACCEPT_LENGTH``
   below ``ddtree_ops.accept_length_floor``): caught by the canary's gate, rolled back.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hostutil import KEY, REPO_ROOT, TEST_INVENTORY, VENV_BIN, deploy, ssh

pytestmark = [pytest.mark.hosts, pytest.mark.slow]  # three booted hosts, ~4.5 min: scripts/test.sh --slow (CI)

HOSTS = ("ddt-th1", "ddt-th2", "ddt-th3")
ROOT = "/etc/ddtree-ops/sglang/releases"
UNIT = "ddtree-sglang.service"
BATCHES = '{"rolling_batches": [1, "100%"]}'  # canary, then the other two at once (faster)


def _inventory(root: Path, addresses: dict[str, str], **changes) -> Path:
    """inventory/test over three hosts (each reaching the stand-in apt repository on its own
    veth), with ``changes`` merged into group_vars/testhosts.yml."""
    inv = root / "inv"
    shutil.rmtree(inv, ignore_errors=True)
    shutil.copytree(TEST_INVENTORY, inv)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    th = hosts["all"]["children"]["testhosts"]
    th["hosts"] = {h: {"ansible_host": addresses[h]} for h in HOSTS}
    th["vars"]["ansible_ssh_private_key_file"] = str(KEY)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "host_vars").mkdir()
    for h in HOSTS:
        gw = re.sub(r"\.2$", ".1", addresses[h])
        (inv / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump({"cuda_toolkit_repo_url": f"http://{gw}:8765"}))
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    for key, value in changes.items():
        data[key] = {**data.get(key, {}), **value}
    gv.write_text(yaml.safe_dump(data))
    return inv


def _rolling(inv: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "-l", ",".join(HOSTS),
                        "-e", BATCHES, "playbooks/rolling.yml"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


def _state(addr: str) -> dict:
    r = ssh(addr, f"{'/opt/ddtree-ops/venv/bin/ddtree-ops'} release list --root {ROOT} --json; "
                  f"echo '@@'; systemctl show -p MainPID --value {UNIT}; systemctl is-active {UNIT}")
    doc, rest = r.stdout.split("@@")
    pid, active = rest.split()
    return {"current": json.loads(doc)["current"], "pid": int(pid), "active": active, "list": json.loads(doc)}


def _summary(out: str) -> dict[str, str]:
    """The last rollout summary the play printed: host -> its line."""
    blocks = out.split("TASK [Rollout summary")
    assert len(blocks) > 1, out[-3000:]
    return {h: m.group(0) for h in HOSTS if (m := re.search(rf"{h}: [^\n]*", blocks[-1]))}


def _fail(r: subprocess.CompletedProcess[str], addr: str) -> str:
    journal = ssh(addr, f"journalctl --no-pager -n 40 -u {UNIT}").stdout
    return r.stdout[-6000:] + r.stderr[-1500:] + "\n--- journal ---\n" + journal


@pytest.fixture(scope="module")
def fleet(hosts, tmp_path_factory):
    missing = [h for h in HOSTS if h not in hosts]
    if missing:
        pytest.fail(f"{missing} not up ({hosts}): scripts/test.sh boots three test hosts", pytrace=False)
    tmp = tmp_path_factory.mktemp("rolling")
    addrs = {h: hosts[h] for h in HOSTS}
    r, t = deploy(_inventory(tmp, addrs), limit=",".join(HOSTS))
    assert r.returncode == 0, _fail(r, addrs[HOSTS[0]])
    print(f"\ndeploy.yml on 3 hosts: {t:.1f} s")
    return {"tmp": tmp, "addrs": addrs, "r1": {h: _state(a)["current"] for h, a in addrs.items()}}


def test_deploy_lands_in_a_release_with_live_links(fleet):
    """Each host's release (ids differ: plan.json names its host) is the id `ddtree-ops render`
    prints for it; the live paths are symlinks through `current`; the linked unit verifies."""
    addr = fleet["addrs"]["ddt-th1"]
    r1 = fleet["r1"]["ddt-th1"]
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in fleet["r1"].values()), fleet["r1"]
    links = ssh(addr, f"readlink /etc/systemd/system/{UNIT} /etc/ddtree-ops/sglang/plan.json "
                      f"/etc/ddtree-ops/sglang/sglang.env {ROOT}/current").stdout.split()
    assert links == [f"{ROOT}/current/{UNIT}", "releases/current/plan.json", "releases/current/sglang.env", r1]
    v = ssh(addr, f"systemd-analyze verify --man=no /etc/systemd/system/{UNIT}")
    assert v.returncode == 0, v.stdout + v.stderr
    assert ssh(addr, f"systemctl is-enabled {UNIT}").stdout.strip() in ("enabled", "linked")
    out = subprocess.run([str(VENV_BIN / "ddtree-ops"), "render", "--out", str(fleet["tmp"] / "render"), "-i",
                          str(_inventory(fleet["tmp"] / "r", fleet["addrs"]))],
                         capture_output=True, text=True, timeout=120)
    for h in HOSTS:
        assert f"release {h}: {fleet['r1'][h]}" in out.stdout, out.stdout[-2000:] + out.stderr


def test_good_rollout_upgrades_all(fleet):
    inv = _inventory(fleet["tmp"], fleet["addrs"], ddtree_service={"env": {"SGLANG_SIM_HEALTH_SECONDS": "0.04"}})
    r, t = _rolling(inv)
    assert r.returncode == 0, _fail(r, fleet["addrs"]["ddt-th1"])
    print(f"\nrolling upgrade of 3 hosts (canary + 2): {t:.1f} s")
    states = {h: _state(a) for h, a in fleet["addrs"].items()}
    r2 = {h: s["current"] for h, s in states.items()}
    lines = _summary(r.stdout)
    for h, s in states.items():
        assert s["current"] != fleet["r1"][h] and s["active"] == "active", (h, s)
        assert s["list"]["previous"] == fleet["r1"][h]
        assert f"{fleet['r1'][h]} -> {r2[h]}: gate passed" in lines[h], lines
    # the canary ran alone in the first batch
    plays = r.stdout.split("PLAY [Rolling upgrade")[1:]
    assert len(plays) == 2 and "ddt-th2" not in plays[0].split("TASK [Rollout summary")[0], plays[0][:3000]
    fleet["r2"] = r2
    fleet["pids"] = {h: s["pid"] for h, s in states.items()}


def _bad_rollout(fleet, expect_in_line: str, **changes) -> None:
    assert "r2" in fleet, "needs test_good_rollout_upgrades_all first"
    inv = _inventory(fleet["tmp"], fleet["addrs"], **changes)
    r, t = _rolling(inv)
    print(f"\nfailed canary rolled back in {t:.1f} s")
    assert r.returncode != 0, r.stdout[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    line = _summary(r.stdout)
    r2 = fleet["r2"]["ddt-th1"]
    assert re.search(rf"ddt-th1: {r2} -> [0-9a-f]{{12}}: gate FAILED", line["ddt-th1"]), line
    assert re.search(expect_in_line, line["ddt-th1"]), line
    assert f"rolled back to {r2}" in line["ddt-th1"] and "serving again" in line["ddt-th1"], line
    for h in ("ddt-th2", "ddt-th3"):
        assert "not upgraded" in line[h], line
    states = {h: _state(a) for h, a in fleet["addrs"].items()}
    canary = states["ddt-th1"]
    assert canary["current"] == r2 and canary["active"] == "active", canary
    for h in ("ddt-th2", "ddt-th3"):  # untouched: same release, same process
        assert states[h]["current"] == fleet["r2"][h] and states[h]["pid"] == fleet["pids"][h], (h, states[h])
    # the canary serves again: the gate, run by hand on the host, passes
    g = ssh(fleet["addrs"]["ddt-th1"], "/opt/ddtree-ops/venv/bin/ddtree-ops release gate "
                                       "--plan /etc/ddtree-ops/sglang/plan.json --deadline 60 --json")
    assert g.returncode == 0, g.stdout[-2000:]
    fleet["pids"]["ddt-th1"] = canary["pid"]


def test_change_only_the_running_build_reveals_fails_on_the_canary(fleet):
    _bad_rollout(fleet, r"gate FAILED \(Restart onto the new release",
                 ddtree_sglang={"simulated_build": "ddtree-unpatched"})


def test_collapsed_acceptance_length_is_caught_by_the_gate(fleet):
    _bad_rollout(fleet, r"gate FAILED \(Gate .*acceptance length 1\.[0-4]\d < the floor 1\.5",
                 ddtree_service={"env": {"SGLANG_SIM_ACCEPT_LENGTH": "1.2"}})


# --- one host: a release pins its SGLang build; the role prunes only builds no release runs ------

BUILDS = "/opt/ddtree-ops/sglang-venv.builds"
OPS = "/opt/ddtree-ops/venv/bin"
# An older release on another SGLang pin, as a deploy of that pin leaves it: the current
# release's files with identity.sglang_build naming another build (content key recomputed),
# activated before the current one (history).
_FAKE_OLDER = r"""
import json, shutil, sys
from ddtree_ops.host.release import MANIFEST, compute_id
root, cur, build = sys.argv[1:4]
doc = json.load(open(f"{root}/{cur}/{MANIFEST}"))
doc["identity"]["sglang_build"] = build
doc["id"] = rid = compute_id(doc["files"], doc["identity"])
shutil.copytree(f"{root}/{cur}", f"{root}/{rid}")
json.dump(doc, open(f"{root}/{rid}/{MANIFEST}", "w"))
hist = [i for i in open(f"{root}/history").read().split() if i not in (cur, rid)]
open(f"{root}/history", "w").write("\n".join(hist + [rid, cur]) + "\n")
print(rid)
"""


def test_the_release_pins_its_sglang_build_and_prune_keeps_the_builds_releases_run(hosts):
    """deploy.yml on ddt-th1 (inventory/test installs the real SGLang release beside the
    simulator, whose release runs the ops venv and pins no build): the role installs the build
    ddtree_render names; a build an older kept release runs survives the next deploy's prune, a
    build no release runs does not; rollback switches to the older release, whose build is on disk."""
    assert "ddt-th1" in hosts, hosts
    addr = hosts["ddt-th1"]
    r, t = deploy()
    assert r.returncode == 0, _fail(r, addr)
    print(f"\ndeploy.yml on ddt-th1: {t:.1f} s")
    info = json.loads(ssh(addr, f"{OPS}/ddtree-ops release list --root {ROOT} --json").stdout)
    cur = info["current"]
    assert next(x["sglang_build"] for x in info["releases"] if x["id"] == cur) is None, info  # the simulator's
    build = ssh(addr, "readlink /opt/ddtree-ops/sglang-venv").stdout.strip()
    assert re.fullmatch(rf"{BUILDS}/cp311-[0-9a-f]{{16}}-[0-9a-f]{{12}}", build), build
    check = ssh(addr, f"ls {BUILDS}; test -f {build}/.ddtree-sglang-complete && echo done")
    assert check.stdout.split() == [Path(build).name, "done"], check.stdout + check.stderr  # older builds pruned
    old, stray = f"{BUILDS}/cp311-{'e' * 16}-{'e' * 12}", f"{BUILDS}/cp311-{'f' * 16}-{'f' * 12}"
    made = ssh(addr, f"mkdir -p {old} {stray} && {OPS}/python -c '{_FAKE_OLDER}' {ROOT} {cur} {old}")
    assert made.returncode == 0, made.stdout + made.stderr
    older = made.stdout.strip()
    try:
        r, t = deploy()
        assert r.returncode == 0, _fail(r, addr)
        print(f"deploy.yml again (prune): {t:.1f} s")
        assert re.search(r"TASK \[sglang : Remove builds no release runs[^\n]*\n\s*changed: \[ddt-th1\]", r.stdout), \
            r.stdout[-4000:]
        left = ssh(addr, f"ls {BUILDS}; cat {BUILDS}/.in-use/*.json").stdout
        assert Path(old).name in left and Path(build).name in left and Path(stray).name not in left, left
        # rollback across the "pin change": the older release is current and its build is there
        back = json.loads(ssh(addr, f"{OPS}/ddtree-ops release rollback --root {ROOT} --json").stdout)
        assert (back["from"], back["to"]) == (cur, older), back
        info = json.loads(ssh(addr, f"{OPS}/ddtree-ops release list --root {ROOT} --json").stdout)
        assert next(x["sglang_build"] for x in info["releases"] if x["id"] == older) == old
    finally:  # leave the host as a deploy leaves it: the real release current, no fake one
        ssh(addr, f"{OPS}/ddtree-ops release activate --root {ROOT} --id {cur} --json; rm -rf {ROOT}/{older} {old}; "
                  f"sed -i '/^{older}$/d' {ROOT}/history")
