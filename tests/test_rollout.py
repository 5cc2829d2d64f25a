"""The rolling gate's verdict and the rollout's summary lines (``ddtree_ops/fleet/rollout.py``), and
the filters ``playbooks/rolling.yml`` calls them through (``filter_plugins/ddtree_rollout.py``,
loaded by a real ``ansible-playbook`` with this checkout's ansible.cfg, connection local)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, gate_document

from ddtree_ops.fleet.rollout import (
    GATE_OUTPUT_CAP,
    NOT_UPGRADED,
    read_gate,
    release_current,
    roll_line,
    roll_summary,
    roll_why,
)

_gate = gate_document  # tests/helpers.py: the gate's own floor check


def test_a_passing_gate_reads_accept_length_and_floor():
    v = read_gate(_gate(3.1), 0)
    assert v.ok and (v.accept_length, v.floor, v.elapsed_s) == (3.1, 1.5, 2.5)
    assert v.detail == "accept length 3.10 >= floor 1.50"


def test_a_gate_without_speculation_has_no_floor():
    v = read_gate(_gate(None, floor=None), 0)
    assert v.ok and v.floor is None and v.detail == "accept length - vs floor -"


def test_a_gate_under_the_floor_fails_with_its_check():
    v = read_gate("some warning on stderr\n" + _gate(1.2), 1)
    assert not v.ok and v.accept_length == 1.2
    assert v.detail == "accept_length_floor: acceptance length 1.20 < the floor 1.5 (ddtree_ops.accept_length_floor)"
    assert v.versus == "accept length 1.20 < floor 1.50"


@pytest.mark.parametrize(("out", "rc", "expect"), [
    (_gate(1.0, ok=True).replace('"ok": false', '"ok": true'), 0, "acceptance length 1.00 under the floor 1.5"),
    (_gate(3.0), 1, "the gate failed (exit 1"),  # a document that says ok but a non-zero exit
    (json.dumps({"ok": True, "checks": [{"name": "x", "ok": True}], "accept_length": True, "floor": 1.5}), 0,
     "acceptance length - under the floor"),  # a bool is no number
    (json.dumps({"ok": True, "checks": [{"name": "x", "ok": True}], "accept_length": 2, "floor": "1.5"}), 0,
     "floor '1.5' is no number"),
    ('{"ok": true, "checks": [{"name": "x", "ok": true}], "accept_length": 1e999, "floor": 1.5}', 0,
     "acceptance length - under"),  # inf is no finite number
    ('{"ok": true, "checks": "all fine"}', 0, "no list of checks"),
    ('[1, 2]', 0, "no JSON result"),
    ("", None, "no JSON result from `ddtree-ops release gate` (exit None): no output"),
    ('{"ok": true, "checks": [' + "[" * 100_00 + "]", 0, "no JSON result"),  # deeper than the parser goes
    ("x" * (GATE_OUTPUT_CAP + 1), 0, f"more than {GATE_OUTPUT_CAP} bytes"),
])
def test_malformed_or_lying_gate_output_is_a_failed_gate(out, rc, expect):
    v = read_gate(out, rc)
    assert not v.ok and expect in v.detail, v.detail
    assert "\n" not in v.detail and len(v.detail) <= 320


def test_a_cut_output_is_never_trusted():
    assert not read_gate(_gate(3.0), 0, cut=True).ok


def test_gate_text_is_cleaned_and_scrubbed():
    evil = "\x1b]0;x\x07\x1b[31mred\nnext token=hf_abcdefghijklmnopqrstuvwxyz0123 " + "B" * 2000
    v = read_gate(_gate(3.0, extra_checks=[{"name": "load", "ok": False, "detail": evil}]), 1)
    assert not v.ok and "\x1b" not in v.detail and "\n" not in v.detail and "hf_abc" not in v.detail
    assert v.detail.startswith("load: red next") and len(v.detail) <= 301


def test_roll_line_passed_and_failed():
    t0 = time.time() - 12.34
    gate = {"rc": 0, "stdout": _gate(3.1)}
    line = roll_line("th1", "aaaaaaaaaaaa", "bbbbbbbbbbbb", t0, gate=gate)
    assert line.startswith("th1: aaaaaaaaaaaa -> bbbbbbbbbbbb: gate passed (accept length 3.10, floor 1.50) in 12.")
    assert roll_line("th1", None, "bbbbbbbbbbbb", t0, gate=gate).startswith("th1: none -> bbbbbbbbbbbb: gate passed")
    why = roll_why("Gate (health, load)", {"rc": 1, "stdout": _gate(1.2), "msg": "non-zero return code"})
    back = {"rc": 0, "stdout": json.dumps({"ok": True, "checks": [], "from": "bbbbbbbbbbbb", "to": "aaaaaaaaaaaa"})}
    line = roll_line("th1", "aaaaaaaaaaaa", "bbbbbbbbbbbb", t0, failed=True, why=why, back=back,
                     regate={"rc": 0, "stdout": _gate(3.0)})
    assert line.startswith("th1: aaaaaaaaaaaa -> bbbbbbbbbbbb: gate FAILED (Gate (health, load): accept_length_floor: "
                           "acceptance length 1.20 < the floor 1.5 (ddtree_ops.accept_length_floor)); rolled back to "
                           "aaaaaaaaaaaa; serving again (gate passed) in 12."), line


@pytest.mark.parametrize(("frm", "back", "regate", "expect"), [
    (None, {"skipped": True, "changed": False}, {"skipped": True}, "not rolled back: no previous release; NOT serving"),
    ("aaaaaaaaaaaa", {"skipped": True, "changed": False}, {"rc": 0}, "not rolled back: the new release was never "
                                                                      "activated; serving again"),
    ("aaaaaaaaaaaa", None, None, "not rolled back: the new release was never activated; NOT serving"),
    ("aaaaaaaaaaaa", {"rc": 1, "stdout": json.dumps({"ok": False, "checks": [
        {"name": "release-rollback", "ok": False, "detail": "R: no previous release on disk\x1b[2J"}]})}, {"rc": 1},
     "not rolled back: R: no previous release on disk; NOT serving (gate after rollback failed)"),
    ("aaaaaaaaaaaa", {"rc": 2, "stdout": "Usage: ...\nError: No such command 'release'."}, {"rc": 1},
     "not rolled back: rollback failed; NOT serving"),
])
def test_roll_line_of_a_host_not_rolled_back(frm, back, regate, expect):
    why = roll_why("Restart onto the new release", {"msg": "Unable to start service ddtree-sglang.service:\n  Job "
                                                           "failed"})
    assert why == "Restart onto the new release: Unable to start service ddtree-sglang.service: Job failed"
    line = roll_line("th1", frm, "bbbbbbbbbbbb", "not a number", failed=True, why=why, back=back, regate=regate)
    assert expect in line and line.endswith(" in ? s") and "\n" not in line and "\x1b" not in line, line


def test_roll_why_caps_a_long_reason():
    line = roll_line("h", "aaaaaaaaaaaa", "bbbbbbbbbbbb", time.time(), failed=True, why="x " * 400, back=None)
    assert "x x" in line and "x …); not rolled back" in line and len(line) < 460


def test_summary_names_every_host_in_order():
    text = roll_summary(["th1", "th2", "th3"], ["th1: a ->  b:\n gate passed", "", None])
    assert text.splitlines() == ["th1: a -> b: gate passed", f"th2: {NOT_UPGRADED}", f"th3: {NOT_UPGRADED}"]


@pytest.mark.parametrize(("result", "current"), [
    ({"rc": 0, "stdout": json.dumps({"ok": True, "checks": [], "current": "0123456789ab"})}, "0123456789ab"),
    ({"rc": 0, "stdout": json.dumps({"ok": True, "checks": [], "current": None})}, None),
    ({"rc": 0, "stdout": json.dumps({"ok": True, "current": "../../etc"})}, None),
    ({"rc": 1, "stdout": json.dumps({"ok": False, "current": "0123456789ab"})}, None),
    ({"rc": 2, "stdout": "Error: No such command 'release'."}, None),
    ({"rc": 0, "stdout": "not json"}, None),
    (None, None),
])
def test_release_current_of_a_list_result(result, current):
    assert release_current(result) == current


def test_the_playbook_reaches_the_filters_through_ansible_cfg(tmp_path):
    """A real ansible-playbook (this checkout's ansible.cfg: filter_plugins) on two local hosts:
    the rolling play's summary task, as written in playbooks/rolling.yml, with one host that
    recorded a line and one that did not."""
    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if playbook is None:
        pytest.skip("ansible-playbook not installed next to this Python")
    rolling = yaml.safe_load((REPO / "playbooks" / "rolling.yml").read_text())
    summary = next(t for t in rolling[1]["tasks"] if t["name"].startswith("Rollout summary"))
    record = next(t for t in rolling[1]["tasks"] if "block" in t)["block"][-1]
    assert record["name"] == "Record the result"
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "th1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "th2": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    tasks = [
        {"name": "fake a gate", "ansible.builtin.set_fact": {
            "_ddtree_roll_t0": "{{ now(utc=true).timestamp() }}", "_ddtree_roll_from": "aaaaaaaaaaaa",
            "_ddtree_roll_to": "bbbbbbbbbbbb", "_ddtree_roll_gate": {"rc": 0, "stdout": _gate(2.75)},
            "_ddtree_roll_rank0": "th1"},
         "when": "inventory_hostname == 'th1'"},
        {**record, "when": "inventory_hostname == 'th1'"},
        {**summary, "run_once": True}]
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([playbook, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "pb.yml")], capture_output=True,
                       text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shown = r.stdout.split("TASK [Rollout summary")[1]  # the yaml result format prints msg's lines as they are
    assert "th1: aaaaaaaaaaaa -> bbbbbbbbbbbb: gate passed (accept length 2.75, floor 1.50) in " in shown, shown
    assert f"th2: {NOT_UPGRADED}" in shown, shown


# --- a multi-node server restarts as one unit --------------------------------------------------

def _ansible_batches(hosts: list[str], batches: list) -> list[list[str]]:
    """Ansible's own cut of ``hosts`` into ``serial`` batches (ansible-core's PlaybookExecutor)."""
    from types import SimpleNamespace

    from ansible.executor.playbook_executor import PlaybookExecutor

    me = SimpleNamespace(_inventory=SimpleNamespace(get_hosts=lambda *a, **k: list(hosts)))
    return [list(b) for b in PlaybookExecutor._get_serialized_batches(me, SimpleNamespace(hosts="all", order=None,
                                                                                       serial=batches))]


@pytest.mark.parametrize("n, batches", [(5, [1, "50%"]), (7, [2, "30%", 1]), (3, ["100%"]), (9, [1, 3]),
                                        (4, ["10%"]), (1, [1, "50%"])])
def test_serial_batches_cut_hosts_as_ansible_does(n, batches):
    from ddtree_ops.fleet.rollout import serial_batches

    hosts = [f"h{i}" for i in range(n)]
    assert serial_batches(hosts, batches) == _ansible_batches(hosts, batches)


MN = {"b300-01": ["b300-01", "b300-02"], "b300-02": ["b300-01", "b300-02"]}


def test_a_batch_split_of_a_multinode_server_is_refused_in_one_line():
    from ddtree_ops.fleet.rollout import unit_split

    hosts = ["b300-01", "b300-02", "h100-01", "h100-02"]
    # the default canary of one host would restart rank 0 without its peer
    why = unit_split(hosts, [1, "50%"], MN)
    assert "splits the multi-node server of b300-01" in why and "b300-01 in batch 1; b300-02 in batch 2" in why
    assert "\n" not in why and "Fix:" in why
    assert unit_split(hosts, [2, "50%"], MN) == ""
    # second input: the server at the end of the inventory, split by the percentage batches
    hosts = ["h100-01", "h100-02", "h100-03", "b300-01", "b300-02"]
    assert unit_split(hosts, [1, 2, 2], MN) == ""
    assert unit_split(hosts, [1, "40%"], MN) == ""  # 40 % of 5 is 2: [h100-01], [h100-02, h100-03], [b300-*]
    why = unit_split(hosts, [1, "20%"], MN)
    assert "b300-01 in batch 4; b300-02 in batch 5" in why, why
    # one-machine servers only: nothing to keep together
    assert unit_split(["a", "b", "c"], [1], {}) == ""


@pytest.mark.parametrize("limit", [["b300-02"], ["b300-01", "h100-01"]])
def test_a_run_with_only_some_nodes_of_a_server_is_refused(limit):
    from ddtree_ops.fleet.rollout import unit_split

    why = unit_split(limit, ["100%"], MN)
    missing = ({"b300-01", "b300-02"} - set(limit)).pop()
    assert f"node(s) {missing} of the multi-node server" in why and "not in this run" in why, why


def test_server_nodes_lists_every_node_rank_0_first():
    import copy

    from helpers import base_hostvars

    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.config.multinode_fleet import server_nodes

    def hv(address: str, mn: bool) -> dict:
        h = copy.deepcopy(base_hostvars())
        h["ansible_host"] = address
        if mn:
            h["ddtree_server"] = {**h["ddtree_server"], "tp_size": 16,
                                  "multinode": {"nodes": ["b300-02", "b300-01"], "dist_init_addr": "10.0.0.2"}}
        return h

    vs = [validate_hostvars("b300-01", hv("10.0.0.1", True)), validate_hostvars("b300-02", hv("10.0.0.2", True)),
          validate_hostvars("h1", hv("10.0.0.3", False))]
    assert server_nodes(vs) == {"b300-01": ["b300-02", "b300-01"], "b300-02": ["b300-02", "b300-01"]}


def _run_local(tmp_path: Path, hosts: dict[str, dict], tasks: list[dict]) -> subprocess.CompletedProcess:
    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if playbook is None:
        pytest.skip("ansible-playbook not installed next to this Python")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {h: {**local, **v} for h, v in hosts.items()}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO)}
    return subprocess.run([playbook, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "pb.yml")],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


@pytest.mark.parametrize("batches, refused", [([1, "50%"], True), ([2], False)])
def test_the_validate_play_refuses_a_split_before_anything_changes(tmp_path, batches, refused):
    """The first play's check, as written in rolling.yml, on a real ansible-playbook: the rollout settings
    and the fleet's multinode map as the actions return them."""
    rolling = yaml.safe_load((REPO / "playbooks" / "rolling.yml").read_text())
    check = next(t for t in rolling[0]["tasks"] if t["name"].startswith("The nodes of each multi-node server"))
    fake = {"name": "the actions' results", "ansible.builtin.set_fact": {
        "_ddtree_rolling": {"rolling_batches": batches}, "_ddtree_fleet": {"multinode": MN}}}
    r = _run_local(tmp_path, {"b300-01": {}, "b300-02": {}, "h1": {}}, [fake, check])
    assert (r.returncode != 0) is refused, r.stdout[-3000:] + r.stderr[-3000:]
    if refused:
        assert "splits the multi-node server of b300-01" in r.stdout, r.stdout[-3000:]


def _unit_tasks(fail_on: str | None, fail_at: str) -> list[dict]:
    """The rolling block's bookkeeping and unit checks as rolling.yml writes them, the roles, restarts and
    gate replaced by facts; ``fail_on`` fails at ``fail_at`` ("roles" or "gate")."""
    rolling = yaml.safe_load((REPO / "playbooks" / "rolling.yml").read_text())
    tasks = rolling[1]["tasks"]
    clock = next(t for t in tasks if t["name"] == "Start the clock")
    block = next(t for t in tasks if "block" in t)
    by_name = {t["name"]: t for t in block["block"]}
    fail = {"name": "fail here", "ansible.builtin.fail": {"msg": "planted"}}

    def at(step: str) -> dict:
        return {**fail, "when": f"inventory_hostname == {fail_on!r}"} if fail_on and fail_at == step else {
            "name": f"no failure at {step}", "ansible.builtin.debug": {"msg": "ok"}}

    names = [n for n in by_name if n.startswith(("Every node", "Will this server", "This node is up"))]
    assert len(names) == 4, names
    fake = {"name": "the roles' facts", "ansible.builtin.set_fact": {"_ddtree_roll_from": "a", "_ddtree_roll_to": "b",
                                                                     "_ddtree_service_running": {"stdout": "{}"}}}
    own = by_name["Will this host restart"]
    body = [fake, at("roles"), own, by_name[names[0]], by_name[names[1]], at("gate"), by_name[names[2]],
            by_name[names[3]], {"name": "record", "ansible.builtin.set_fact": {"_done": True}}]
    rescue = [{"name": "rescued", "ansible.builtin.set_fact": {"_rescued": True}}]
    fleet = {"name": "fleet", "ansible.builtin.set_fact": {"_ddtree_fleet": {"multinode": MN}}}
    report = {"name": "report", "ansible.builtin.debug": {
        "msg": "{{ inventory_hostname }} done={{ _done | default(false) }} rescued={{ _rescued | default(false) }} "
               "restart={{ _ddtree_roll_restart_needed | default('-') }} peer={{ _ddtree_roll_peer }}"}}
    return [fleet, clock, {"name": "unit", "block": body, "rescue": rescue}, report]


@pytest.mark.parametrize("fail_on, fail_at", [(None, ""), ("b300-02", "roles"), ("b300-01", "gate"),
                                              ("b300-02", "gate"), ("h1", "gate")])
def test_the_nodes_of_a_server_fail_and_roll_back_together(tmp_path, fail_on, fail_at):
    """rolling.yml's unit checks on a real ansible-playbook (the batch's hosts run each task together):
    when any node of the server fails, before its restart or at rank 0's gate, every node of it goes to
    the rescue (the rollback); a one-machine server beside it is not affected either way."""
    r = _run_local(tmp_path, {"b300-01": {}, "b300-02": {}, "h1": {}}, _unit_tasks(fail_on, fail_at))
    out = r.stdout
    server_failed = fail_on in ("b300-01", "b300-02")
    for host in ("b300-01", "b300-02"):
        assert f"{host} done={not server_failed} rescued={server_failed}" in out, out[-4000:]
    assert f"h1 done={fail_on != 'h1'} rescued={fail_on == 'h1'}" in out, out[-4000:]
    assert "b300-02 done" in out and "peer=True" in out.split("b300-02 done")[1].split("\n")[0]
