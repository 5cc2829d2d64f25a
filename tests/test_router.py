"""The model gateway (smg) in front of the fleet: validated ``ddtree_router`` settings, the
worker list derived from the instances, port clashes with every instance of the router's
machine, the rendered ``ddtree-router.service`` (sandbox score, verify) and its argv checked
against the pinned ``smg launch --help`` (tests/fixtures/smg)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO, base_hostvars

from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.config.router import POLICIES, SMG_VERSION, validate_routers
from ddtree_ops.render.router import UNIT_NAME, exec_argv, render_router, router_argv

HELP = (FIXTURES / "smg" / f"launch-help-{SMG_VERSION}.txt").read_text()
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")


def _options() -> set[str]:
    """Every option string of the recorded help (its option lines: two spaces, then --name)."""
    out: set[str] = set()
    for line in HELP.splitlines():
        m = re.match(r"^  (--[a-z0-9-]+.*?)(?:\s{2,}|$)", line)
        if m:
            out.update(re.findall(r"--[a-z0-9-]+", m.group(1)))
    return out


def _instance(name: str, address: str, port: int, **server) -> object:
    hv = copy.deepcopy(base_hostvars())
    hv["ansible_host"] = address
    hv["ddtree_server"] = {**hv.get("ddtree_server", {}), "port": port, **server}
    return validate_hostvars(name, hv)


@pytest.fixture(scope="module")
def fleet():
    return [_instance("gpu-a", "10.0.0.5", 30000), _instance("gpu-b", "10.0.0.6", 30000)]


def _one(fleet, settings: dict | None = None, address: str = "10.0.0.9", **hv):
    routers, errors = validate_routers({"gw-1": {"ansible_host": address, "ddtree_router": settings or {}, **hv}},
                                       fleet)
    return routers, errors


def test_workers_are_derived_from_the_instances(fleet):
    (r,), errors = _one(fleet)
    assert errors == []
    assert r.workers == ("http://10.0.0.5:30000", "http://10.0.0.6:30000")
    assert not r.dp_aware
    (r,), _ = _one(fleet, {"instances": ["gpu-b"]})
    assert r.workers == ("http://10.0.0.6:30000",)


def test_every_rendered_flag_is_an_option_of_the_pinned_smg():
    opts = _options()
    assert {"--worker-urls", "--policy", "--dp-aware", "--prometheus-port"} <= opts  # the parse works
    # DFLASH with DP attention needs a DP LM head too (SGLang refuses it otherwise)
    dp = {"--enable-dp-attention": True, "--enable-dp-lm-head": True}
    fleet = [_instance("gpu-a", "10.0.0.5", 30000, extra_args=dp, dp_size=2)]
    (r,), errors = _one(fleet, {"policy": "power_of_two"})
    assert errors == [] and r.dp_aware
    flags = [a for a in router_argv(r) if a.startswith("--")]
    assert "--dp-aware" in flags
    assert [f for f in flags if f not in opts] == []
    for policy in POLICIES:  # our choices are exactly smg's
        assert policy in re.search(r"--policy \{([^}]*)\}", HELP).group(1).split(",")
    assert len(POLICIES) == len(re.search(r"--policy \{([^}]*)\}", HELP).group(1).split(","))


def test_the_flag_check_can_fail():
    assert "--worker-url" not in _options() and "--api-key" in _options()


@pytest.mark.parametrize(("settings", "field", "needle"), [
    ({"policy": "cache-aware"}, "ddtree_router.policy", "cache_aware"),
    ({"port": 80}, "ddtree_router.port", "1024"),
    ({"port": 29000}, "ddtree_router.metrics_port", "is also ddtree_router.port"),
    ({"health": {"timeout_secs": 30, "interval_secs": 10}}, "ddtree_router.health", "overlap"),
    ({"health": {"endpoint": "health"}}, "ddtree_router.health.endpoint", "absolute URL path"),
    ({"api_key_secret": "sk-live-abcdef"}, "ddtree_router.api_key_secret", "NAME of a ddtree_secret_env"),
    ({"user": "root"}, "ddtree_router.user", "never root"),
    ({"host": "gw.example"}, "ddtree_router.host", "IP address"),
    ({"polcy": "random"}, "ddtree_router.polcy", "unknown setting"),
])
def test_bad_settings_are_one_finding_each(fleet, settings, field, needle):
    routers, errors = _one(fleet, settings)
    assert routers == [] and len(errors) == 1
    f = errors[0]
    assert f.field == field and needle in f.rule + f.fix, f
    assert f.fix and "\n" not in f.message()


def test_router_port_clashing_with_an_instance_on_its_machine_is_refused(fleet):
    # smg's own default port (30000) is SGLang's: a router on gpu-a's machine at 30000 clashes
    _, errors = _one(fleet, {"port": 30000}, address="10.0.0.5")
    assert [(f.field, f.value) for f in errors] == [("ddtree_router.port", 30000)]
    assert "gpu-a's ddtree_server.port" in errors[0].rule
    # the exporter and rendezvous ports count too
    _, errors = _one(fleet, {"metrics_port": 30100}, address="10.0.0.5")
    assert "ddtree_server.nccl_port" in errors[0].rule
    # another machine: no clash
    assert _one(fleet, {"port": 30000}, address="10.0.0.9")[1] == []


def test_two_routers_on_one_machine_need_their_own_ports(fleet):
    _, errors = validate_routers({"gw-1": {"ansible_host": "10.0.0.9", "ddtree_router": {}},
                                  "gw-2": {"ansible_host": "10.0.0.9", "ddtree_router": {}}}, fleet)
    assert {f.host for f in errors} == {"gw-2"} and len(errors) == 3


def test_instances_must_exist_serve_one_model_and_be_reachable(fleet):
    _, errors = _one(fleet, {"instances": ["gpu-z"]})
    assert errors[0].value == "gpu-z"
    other = _instance("gpu-c", "10.0.0.7", 30000)
    other = type(other)(other.deployment.model_copy(update={"model": other.deployment.model.model_copy(
        update={"path": "Qwen/Qwen3-32B", "served_model_name": None})}), other.plan, [])
    _, errors = _one([*fleet, other])
    assert "must serve one model" in errors[0].rule
    local = _instance("gpu-l", "10.0.0.8", 30000, host="127.0.0.1")
    _, errors = _one([local])
    assert "loopback only" in errors[0].rule


def test_api_key_only_by_reference_and_never_in_argv_or_unit(fleet):
    _, errors = _one(fleet, {"api_key_secret": "ROUTER_API_KEY"})
    assert "names no non-empty entry" in errors[0].rule
    key = "k3y-for-the-workers-0123456789"
    (r,), errors = _one(fleet, {"api_key_secret": "ROUTER_API_KEY"}, ddtree_secret_env={"ROUTER_API_KEY": key})
    assert errors == []
    files = {f.path: f for f in render_router(r)}
    unit = files[f"/etc/systemd/system/{UNIT_NAME}"]
    assert key not in unit.content and key not in " ".join(exec_argv(r)) and "--api-key" not in exec_argv(r)
    assert "LoadCredential=api-key:/etc/ddtree-router/api-key" in unit.content
    cred = files["/etc/ddtree-router/api-key"]
    assert cred.secret and cred.mode == "0600" and cred.content == key


def test_not_a_mapping_and_dual_role_hosts_are_refused(fleet):
    _, errors = validate_routers({"gw-1": {"ddtree_router": "cache_aware"}}, fleet)
    assert errors[0].field == "ddtree_router"
    _, errors = validate_routers({"gpu-a": {"ddtree_router": {}}}, fleet)
    assert "not both" in errors[0].rule


def _router_inventory(tmp_path: Path, settings: dict) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "multi-example", inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["routers"] = {"hosts": {"gw-01": {"ansible_host": "10.0.0.9", "ddtree_router": settings}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def test_render_writes_the_router_unit_and_validate_refuses_a_clash(tmp_path, capsys):
    inv = _router_inventory(tmp_path, {"instances": ["ct200-01-qwen8b"]})
    out = tmp_path / "out"
    assert main(["render", "--out", str(out), "-i", str(inv)]) == 0
    unit = (out / "gw-01/etc/systemd/system" / UNIT_NAME).read_text()
    assert "--worker-urls http://ct200-01.example.internal:30000 --policy cache_aware" in unit
    prom = yaml.safe_load((out / "prometheus/prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "smg"]
    assert job["static_configs"] == [{"targets": ["10.0.0.9:29000"], "labels": {"host": "gw-01", "service": "router"}}]
    plain = tmp_path / "plain"
    assert main(["render", "--out", str(plain), "-i", str(REPO / "inventory" / "multi-example")]) == 0
    assert "smg" not in [j["job_name"] for j in yaml.safe_load((plain / "prometheus/prometheus.yml").read_text())[
        "scrape_configs"]]
    assert not list(plain.glob(f"*/etc/systemd/system/{UNIT_NAME}"))
    bad = _router_inventory(tmp_path / "bad", {"instances": ["ct200-01-qwen8b"], "port": 30001})
    (bad / "hosts.yml").write_text((bad / "hosts.yml").read_text().replace("10.0.0.9", "ct200-01.example.internal"))
    capsys.readouterr()
    assert main(["validate", "-i", str(bad)]) != 0
    err = capsys.readouterr()
    assert "ddtree_router.port" in err.out + err.err and "ct200-01-qwen32b" in err.out + err.err


@needs_analyze
def test_router_unit_scores_within_budget_and_verifies(fleet, tmp_path):
    key = "k3y-for-the-workers-0123456789"
    for settings, extra in (({}, {}), ({"api_key_secret": "K"}, {"ddtree_secret_env": {"K": key}})):
        (r,), _ = _one(fleet, settings, **extra)
        unit = tmp_path / UNIT_NAME
        unit.write_text(render_router(r)[0].content)
        res = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager", "--threshold=20", str(unit)],
                             capture_output=True, text=True, timeout=60)
        score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+) ", res.stdout).group(1))
        assert score <= 2.0 and res.returncode == 0, res.stdout
        root = tmp_path / "root"
        if not root.exists():
            shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
        (root / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
        (root / "etc/systemd/system" / UNIT_NAME).write_text(unit.read_text())
        exe = root / exec_argv(r)[0].lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        res = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={root}",
                              str(root / "etc/systemd/system" / UNIT_NAME)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and not res.stderr.strip(), res.stderr


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr",
                                  "--nnode", "--node-r", "--dist-init", "--nccl-init", "--nnodes=2",
                                  "--node-rank=1", "--dist-init-addr=10.0.0.5:25000"])
def test_multi_node_flags_in_extra_args_are_refused(flag):
    from ddtree_ops.config import ConfigError

    hv = copy.deepcopy(base_hostvars())
    hv["ddtree_server"] = {**hv.get("ddtree_server", {}), "extra_args": {flag: 2}}
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    (f,) = [f for f in exc.value.findings if f.level == "error"]
    assert f.field == "ddtree_server.extra_args"
    assert "ddtree-ops renders the multi-node flags from ddtree_server.multinode" in f.rule and flag in f.rule
    assert "ddtree_server.multinode.nodes" in f.fix


def test_other_flags_sharing_a_start_are_not_multi_node():
    """Real options of the pinned parsers that share a start with a multi-node flag pass; a
    prefix argparse would find ambiguous (--n, --nccl-) is refused with the rule too."""
    from ddtree_ops.config.multinode_flags import multinode_flag

    for other in ("--nccl-port", "--dist-timeout", "--numa-node", "--num-continuous-decode-steps",
                  "--nsa-decode-backend"):
        assert multinode_flag(other) is None, other
    assert multinode_flag("--n") == "--nnodes" and multinode_flag("--nccl-i=x") == "--nccl-init-addr"


def test_deploy_checks_and_scrapes_the_routers_like_render():
    """The ``ddtree_prometheus`` action (deploy.yml's fleet check, the prometheus_targets role)
    takes ``routers``: a clash fails before any host changes; a valid router is job smg."""
    from test_fleet import _hostvars, _prometheus_action

    for task in (yaml.safe_load((REPO / "deploy.yml").read_text())[0]["tasks"],
                 yaml.safe_load((REPO / "roles/prometheus_targets/tasks/main.yml").read_text())):
        (t,) = [t for t in task if "ddtree_prometheus" in t]
        assert t["ddtree_prometheus"]["routers"] == "{{ groups['routers'] | default([]) }}"
    hv = {"h1": _hostvars("h1", "10.0.0.5"),
          "gw": {"inventory_hostname": "gw", "ansible_host": "10.0.0.5", "ddtree_router": {"port": 30000}}}
    result = _prometheus_action({"hostvars": hv}, ["h1"], routers=["gw"], fleet_only=True)
    assert result["failed"] and "ddtree_router.port 30000 clashes with h1's ddtree_server.port" in result["msg"]
    hv["gw"]["ddtree_router"] = {}
    result = _prometheus_action({"hostvars": hv}, ["h1"], routers=["gw"], rules_path="/etc/prometheus/r.yml")
    assert not result.get("failed"), result.get("msg")
    assert "job_name: smg" in result["prometheus_yml"] and "10.0.0.5:29000" in result["prometheus_yml"]
    result = _prometheus_action({"hostvars": hv}, ["h1"], rules_path="/etc/prometheus/r.yml")
    assert "job_name: smg" not in result["prometheus_yml"]


def test_launcher_reads_one_line_credential_and_refuses_argv_keys(tmp_path, monkeypatch):
    from ddtree_ops import router_launch

    (tmp_path / "api-key").write_text("k3y\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert router_launch.read_credential("api-key") == "k3y"
    for bad in ("", "two\nlines\n", "x" * 5000):
        (tmp_path / "api-key").write_text(bad)
        with pytest.raises(SystemExit):
            router_launch.read_credential("api-key")
    with pytest.raises(SystemExit, match="must not be given"):
        router_launch.main(["api-key", "--api-k", "x"])
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(SystemExit, match="CREDENTIALS_DIRECTORY"):
        router_launch.read_credential("api-key")


def test_an_inventory_router_names_its_key_by_a_secret_env_name(tmp_path, capsys):
    """The whole inventory's validate (the same pass deploy.yml's fleet check runs): a router whose
    api_key_secret names its ddtree_secret_env entry (ROUTER_API_KEY, the documented shape) is valid;
    the entry's NAME is not a secret, only its value is, and the value never reaches the output."""
    from ddtree_ops import cli

    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example", inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    key = "rt-Key-0f-this-test-4417"
    hosts["routers"] = {"hosts": {"gw-01": {
        "ansible_host": "10.0.0.9", "ddtree_router": {"api_key_secret": "ROUTER_API_KEY"},
        "ddtree_secret_env": {"ROUTER_API_KEY": key}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    rc = cli.main(["validate", "-i", str(inv)])
    text = "".join(capsys.readouterr())
    assert rc == 0, text
    assert key not in text
    # and the value itself pasted into a plain router field is refused as before
    hosts["routers"]["hosts"]["gw-01"]["ddtree_router"]["policy"] = key
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    rc = cli.main(["validate", "-i", str(inv)])
    text = "".join(capsys.readouterr())
    assert rc != 0 and key not in text, text


@pytest.mark.parametrize("name", ["ROUTER_API_KEY", "SMG_WORKER_TOKEN"])
def test_a_missing_entry_is_named_in_its_finding(fleet, monkeypatch, name):
    """api_key_secret holds only the NAME of a ddtree_secret_env entry: the load does not register it as a
    secret, and the finding shows it (value and fix) though the field's name looks secret. A key pasted
    there by mistake is still registered and never shown."""
    from ddtree_ops._core import scrub as core_scrub
    from ddtree_ops.config.hostvars import _register_secrets

    monkeypatch.setattr(core_scrub, "_known_secrets", set())
    _register_secrets("ddtree_router", {"api_key_secret": name})
    assert not core_scrub.registered_secret_in(name)
    _, errors = _one(fleet, {"api_key_secret": name})
    line = errors[0].message()
    assert f"ddtree_router.api_key_secret = '{name}'" in line and f"add {name} to ddtree_secret_env" in line, line
    assert errors[0].as_dict()["value"] == name
    _register_secrets("ddtree_router", {"api_key_secret": "sk-live-abcdef"})
    assert core_scrub.registered_secret_in("sk-live-abcdef")
    _, errors = _one(fleet, {"api_key_secret": "sk-live-abcdef"})
    assert "sk-live" not in errors[0].message() and "(redacted)" in errors[0].message()


@pytest.mark.parametrize("text, shown", [('ddtree_router: "yes"', "'str'"), ("ddtree_router: [a]", "'list'"),
                                         ("ddtree_router: 5", "'int'")])
def test_a_finding_names_the_type_as_written_not_ansibles_tagged_class(fleet, tmp_path, text, shown):
    """ansible-core 2.19 loads YAML scalars as tagged subclasses (_AnsibleTaggedStr): a message says str."""
    from ansible.parsing.dataloader import DataLoader

    loaded = DataLoader().load(text, file_name=str(tmp_path / "host_vars.yml"))["ddtree_router"]
    _, errors = validate_routers({"gw-1": {"ansible_host": "10.0.0.9", "ddtree_router": loaded}}, fleet)
    line = errors[0].message()
    assert f"ddtree_router = {shown}:" in line and "Ansible" not in line, line


def test_type_name_is_the_plain_base_type():
    from ddtree_ops.config.errors import type_name

    class Tagged(dict):
        pass

    class Other:
        pass

    assert [type_name(v) for v in (Tagged(), True, 1, 1.5, "s", [], (), Other())] == [
        "dict", "bool", "int", "float", "str", "list", "tuple", "Other"]
