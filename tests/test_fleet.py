"""Clashes between the deployments of one inventory (``ddtree_ops.config.fleet``): two hosts
reaching one machine with the same port, unit, directory, GPU or account are refused by
validate/plan/render (exit 2, one line naming both hosts, nothing written) and by the
``ddtree_prometheus`` action plugin; several instances on one machine with their own ports,
names, accounts and GPUs pass (``inventory/multi-example``: a ct200 with two tp-4 instances)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import REPO, base_hostvars

from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.config.fleet import fleet_findings


def _inventory(root: Path, hosts: dict[str, dict]) -> Path:
    """``hosts.yml`` (every host in b300) + group_vars with the base deployment; ``hosts``
    maps an inventory name to its host variables."""
    inv = root / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": hosts}}}}))
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(base_hostvars()))
    return inv


def _v(host: str, **sections):
    hv = copy.deepcopy(base_hostvars())
    for key, value in sections.items():
        if key == "ansible_host":
            hv["ansible_host"] = value
        else:
            hv[f"ddtree_{key}"] = {**hv.get(f"ddtree_{key}", {}), **value}
    return validate_hostvars(host, hv)


def test_two_hosts_on_one_address_and_port_refused_by_every_command(tmp_path, capsys):
    inv = _inventory(tmp_path, {"b300-01": {"ansible_host": "10.0.0.5"}, "b300-02": {"ansible_host": "10.0.0.5"}})
    out = tmp_path / "OUT"
    for argv in (["validate"], ["validate", "--json"], ["plan"], ["render", "--out", str(out)]):
        assert main([*argv, "-i", str(inv)]) == 2, argv
        text = " ".join((lambda c: c.out + c.err)(capsys.readouterr()).split())
        assert "b300-02 and b300-01 both reach machine 10.0.0.5 and both claim port 30000" in text, argv
        assert "ddtree_ops.exporter_port" in text and "ddtree-sglang.service" in text and "Traceback" not in text
    assert not out.exists()


def test_instances_on_one_machine_with_their_own_ports_and_units_pass(tmp_path, capsys):
    tp4 = {**base_hostvars()["ddtree_server"], "tp_size": 4}
    inv = _inventory(tmp_path, {
        "b300-01": {"ansible_host": "10.0.0.5", "ddtree_server": tp4},
        "b300-01-b": {"ansible_host": "10.0.0.5", "ddtree_server": {**tp4, "port": 30001, "base_gpu_id": 4},
                      "ddtree_ops": {"exporter_port": 19401}, "ddtree_service": {"name": "second", "user": "second"}},
        "b300-02": {"ansible_host": "10.0.0.6"},
    })
    assert main(["validate", "-i", str(inv)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("a", "b", "field"),
    [
        (
            {"ansible_host": "10.0.0.5"},
            {"ansible_host": "10.0.0.6", "ops": {"scrape_host": "10.0.0.5"}},
            "ddtree_server.port",
        ),
        ({"ansible_host": "fd00::5"}, {"ansible_host": "fd00:0:0::5"}, "ddtree_server.port"),  # one IPv6 address
        ({"ansible_host": "B300-01.example"}, {"ansible_host": "b300-01.EXAMPLE"}, "ddtree_server.port"),  # RFC 4343
        ({}, {"ansible_host": "h1"}, "ddtree_server.port"),  # h1 without ansible_host is reached as h1
        # h2's SGLang port is h1's exporter port, units differ: still one port twice on one machine
        (
            {"ansible_host": "10.0.0.5"},
            {
                "ansible_host": "10.0.0.5",
                "server": {"port": 19400},
                "ops": {"exporter_port": 19401},
                "service": {"name": "two"},
            },
            "ddtree_server.port",
        ),
        (
            {"ansible_host": "10.0.0.5"},
            {"ansible_host": "10.0.0.5", "server": {"port": 30001}, "ops": {"exporter_port": 19401}},
            "ddtree_service.name",
        ),
    ],
)
def test_clash_detected(a, b, field):
    findings = fleet_findings([_v("h1", **a), _v("h2", **b)])
    assert [f.field for f in findings][:1] == [field]
    assert all(f.host == "h2" and f.level == "error" and "h2 and h1" in f.message() for f in findings)


def test_no_clash_between_different_machines_and_a_host_listed_twice():
    h1, h2 = _v("h1", ansible_host="10.0.0.5"), _v("h2", ansible_host="10.0.0.6")
    assert fleet_findings([h1, h2, h1]) == []


def test_limit_checks_against_hosts_outside_it(tmp_path, capsys):
    """``-l b300-02`` would deploy b300-02 onto b300-01's machine: still refused, on b300-02."""
    inv = _inventory(tmp_path, {"b300-01": {"ansible_host": "10.0.0.5"}, "b300-02": {"ansible_host": "10.0.0.5"},
                                "b300-03": {"ansible_host": "10.0.0.7"}})
    assert main(["validate", "-i", str(inv), "-l", "b300-02", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert {e["host"] for e in doc["errors"]} == {"b300-02"}
    assert main(["validate", "-i", str(inv), "-l", "b300-03"]) == 0
    assert main(["validate", "-i", str(inv), "-l", "b300-01"]) == 2  # reported on the focused host
    assert "b300-01 and b300-02 both reach machine 10.0.0.5" in " ".join(capsys.readouterr().err.split())


def _prometheus_action(task_vars: dict, servers: list[str], **extra):
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.task import Task
    from ansible.template import Templar

    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        from ddtree_prometheus import ActionModule
    finally:
        sys.path.pop(0)
    task = Task()
    task.args = {"servers": servers, **(extra or {"rules_path": "/etc/prometheus/ddtree-rules.yml"})}
    loader = DataLoader()
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))  # never used: runs on the controller
    action = ActionModule(task=task, connection=connection, play_context=None, loader=loader,
                          templar=Templar(loader=loader, variables=task_vars), shared_loader_obj=None)
    return action.run(task_vars=task_vars)


def _hostvars(host: str, address: str) -> dict:
    return {**base_hostvars(), "inventory_hostname": host, "ansible_host": address,
            "group_names": ["b300", "sglang_servers"]}


def test_prometheus_action_refuses_a_clash_and_lists_a_host_once():
    task_vars = {"hostvars": {"h1": _hostvars("h1", "10.0.0.5"), "h2": _hostvars("h2", "10.0.0.5"),
                              "h3": _hostvars("h3", "10.0.0.6")}}
    result = _prometheus_action(task_vars, ["h1", "h2"])
    assert result["failed"] and "h2 and h1 both reach machine 10.0.0.5" in result["msg"]
    result = _prometheus_action(task_vars, ["h1", "h3", "h1"])
    assert not result.get("failed"), result.get("msg")
    assert result["targets"] == ["h1", "h3"] and result["prometheus_yml"].count("10.0.0.5:30000") == 1


def test_deploy_checks_the_fleet_before_any_host_changes():
    """deploy.yml's first play runs the fleet check once (``fleet_only``): a clash stops the
    deploy before the service play; a clean fleet passes without rendering Prometheus files."""
    play = yaml.safe_load((REPO / "deploy.yml").read_text())[0]
    task = next(t for t in play["tasks"] if "ddtree_prometheus" in t)
    assert task["ddtree_prometheus"]["fleet_only"] is True and task["run_once"] is True
    task_vars = {"hostvars": {"h1": _hostvars("h1", "10.0.0.5"), "h2": _hostvars("h2", "10.0.0.5"),
                              "h3": _hostvars("h3", "10.0.0.6")}}
    result = _prometheus_action(task_vars, ["h1", "h2", "h3"], fleet_only=True)
    assert result["failed"] and "h2 and h1 both reach machine 10.0.0.5" in result["msg"]
    result = _prometheus_action(task_vars, ["h1", "h3"], fleet_only=True)
    assert not result.get("failed") and result["targets"] == ["h1", "h3"] and "prometheus_yml" not in result


def test_one_machine_is_one_host_class_and_mapped_ipv6_is_the_same_machine():
    """``::ffff:10.0.0.5`` is 10.0.0.5; one machine listed as b300 and ct200 is refused."""
    from ddtree_ops.config.fleet import fleet_findings

    a = validate_hostvars("h1", {**base_hostvars(), "ansible_host": "10.0.0.5"})
    b = validate_hostvars("h2", {**base_hostvars(), "ansible_host": "::ffff:10.0.0.5"})
    assert any("both reach machine 10.0.0.5" in f.rule for f in fleet_findings([a, b]))
    a = validate_hostvars("h1", {**base_hostvars(), "ansible_host": "10.0.0.5",
                                 "ddtree_server": {**base_hostvars()["ddtree_server"], "tp_size": 4}})
    ct = {**base_hostvars(), "ansible_host": "10.0.0.5", "ddtree_host_class": "ct200",
          "ddtree_server": {"tp_size": 4, "port": 30001, "base_gpu_id": 4}, "ddtree_ops": {"exporter_port": 19401},
          "ddtree_service": {"name": "other", "user": "other"}, "ddtree_accepted_risks": []}
    ct["ddtree_speculative"] = {**ct["ddtree_speculative"]}
    c = validate_hostvars("h3", ct)
    found = fleet_findings([a, c])
    assert [f.field for f in found] == ["ddtree_host_class"] and "a ct200 and a b300" in found[0].rule
