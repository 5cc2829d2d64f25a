"""Several deployments on one machine: GPU sets (``CUDA_VISIBLE_DEVICES`` /
``base_gpu_id`` cover tp x dp, disjoint across instances), per-instance rendezvous port,
directories, accounts and Prometheus multiprocess directory, deploy waves, and the shipped
``inventory/multi-example`` (a ct200 with two tp-4 instances) validating and rendering both."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_hostvars

from ddtree_ops.cli import main
from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.fleet import MAX_WAVES, fleet_findings, instance_waves
from ddtree_ops.render import build_argv, render_host

EXAMPLE = REPO / "inventory" / "multi-example"


def _hv(address: str = "10.0.0.5", **sections) -> dict:
    hv = copy.deepcopy(base_hostvars())
    hv["ansible_host"] = address
    hv["ddtree_server"]["tp_size"] = 4
    for key, value in sections.items():
        hv[f"ddtree_{key}"] = {**hv.get(f"ddtree_{key}", {}), **value}
    return hv


def _errors(host: str, hv: dict) -> list:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars(host, hv)
    return [f for f in exc.value.findings if f.level == "error"]


def _second(**extra) -> dict:
    """A second instance on 10.0.0.5 with its own ports, name and account, GPUs 4-7."""
    sections = {"server": {"port": 30001, "base_gpu_id": 4}, "ops": {"exporter_port": 19401},
                "service": {"name": "two", "user": "two"}}
    for key, value in extra.items():
        sections[key] = {**sections.get(key, {}), **value}
    return _hv(**sections)


@pytest.mark.parametrize(("env", "server", "needle"), [
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, {"tp_size": 8}, "CUDA_VISIBLE_DEVICES=4,5,6,7 leaves 4 GPUs visible"),
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, {"tp_size": 2, "dp_size": 2, "base_gpu_id": 1}, "need 5 GPUs"),
    ({}, {"tp_size": 4, "base_gpu_id": 6}, "need 10 GPUs, but a b300 host has 8"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-5f3c9e2a-0000-0000-0000-000000000000"}, {}, "comma-separated list of GPU indices"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,1,2"}, {}, "lists a GPU twice"),
    ({"CUDA_VISIBLE_DEVICES": "5,6,7,8"}, {}, "a b300 host has GPUs 0-7"),
])
def test_gpu_set_must_cover_tp_times_dp_on_the_host(env, server, needle):
    errs = _errors("h1", _hv(server=server, service={"env": env}))
    assert len(errs) == 1 and needle in errs[0].message(), [e.message() for e in errs]
    assert errs[0].field in ("ddtree_service.env.CUDA_VISIBLE_DEVICES", "ddtree_server.tp_size",
                             "ddtree_server.base_gpu_id")


def test_gpu_sets_that_fit_pass():
    for env, server in (({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, {"tp_size": 4}),
                        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, {"tp_size": 2, "dp_size": 2, "base_gpu_id": 4}),
                        ({}, {"tp_size": 4, "base_gpu_id": 4})):
        validate_hostvars("h1", _hv(server=server, service={"env": env}))


def _fleet(*hvs: dict) -> list:
    return fleet_findings([validate_hostvars(f"h{i + 1}", hv) for i, hv in enumerate(hvs)])


def test_two_tp4_instances_on_disjoint_gpus_pass_and_overlap_is_refused_naming_both():
    assert _fleet(_hv(), _second()) == []
    assert _fleet(_hv(service={"env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}),
                  _second(server={"base_gpu_id": 0}, service={"env": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}})) == []
    found = _fleet(_hv(service={"env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}), _second(server={"base_gpu_id": 2}))
    assert [f.field for f in found] == ["ddtree_server.base_gpu_id"]
    text = found[0].message()
    assert "h2 and h1 both reach machine 10.0.0.5 and both claim GPU 2,3" in text
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in text and found[0].host == "h2"


@pytest.mark.parametrize(("second", "field", "needle"), [
    (_second(service={"cache_dir": "/var/cache/ddtree-ops/sglang"}), "ddtree_service.cache_dir",
     "directory /var/cache/ddtree-ops/sglang"),
    (_second(service={"state_dir": "/var/lib/ddtree-ops/sglang/two"}), "ddtree_service.state_dir",
     "overlapping /var/lib/ddtree-ops/sglang"),
    (_second(service={"user": "sglang"}), "ddtree_service.user", "service account sglang"),
    (_second(server={"port": 30100}), "ddtree_server.port", "port 30100"),  # h1's derived --nccl-port
    (_second(server={"nccl_port": 19400}), "ddtree_server.nccl_port", "port 19400"),
    (_second(sglang={"source": "simulator"}), "ddtree_service.sglang_venv",
     "with different ddtree_sglang pins"),
])
def test_shared_state_ports_and_accounts_refused(second, field, needle):
    found = _fleet(_hv(), second)
    assert field in [f.field for f in found], [f.message() for f in found]
    f = next(f for f in found if f.field == field)
    assert needle in f.message() and "h2 and h1" in f.message()


def test_two_instances_sharing_a_prometheus_multiproc_dir_refused(tmp_path, capsys):
    """Instances sharing PROMETHEUS_MULTIPROC_DIR must not validate; by default each
    gets its own RuntimeDirectory, which systemd creates and wipes with the unit."""
    shared = {"env": {"PROMETHEUS_MULTIPROC_DIR": "/var/tmp/prom"}}
    errs = _errors("h1", _hv(service=shared))
    assert [e.field for e in errs] == ["ddtree_service.env.PROMETHEUS_MULTIPROC_DIR"]
    assert "RuntimeDirectory /run/ddtree-ops/sglang" in errs[0].message()
    # pointing into the other instance's runtime directory: still outside its own
    errs = _errors("h2", _second(service={"env": {"PROMETHEUS_MULTIPROC_DIR": "/run/ddtree-ops/sglang"}}))
    assert [e.field for e in errs] == ["ddtree_service.env.PROMETHEUS_MULTIPROC_DIR"]
    validate_hostvars("h1", _hv(service={"env": {"PROMETHEUS_MULTIPROC_DIR": "/run/ddtree-ops/sglang/prom"}}))
    env = next(f for f in render_host(validate_hostvars("h1", _hv())) if f.path.endswith(".env")).content
    assert "PROMETHEUS_MULTIPROC_DIR=/run/ddtree-ops/sglang\n" in env


@pytest.mark.parametrize(("a", "b"), [("localhost", "127.0.0.1"), ("127.0.0.1", "::1"), ("LOCALHOST", "127.0.1.1")])
def test_loopback_names_are_one_machine(a, b):
    found = _fleet(_hv(a), _hv(b))
    assert found and all("both reach machine localhost" in f.message() for f in found)


def test_rendezvous_port_rendered_per_instance():
    one, two = validate_hostvars("h1", _hv()), validate_hostvars("h2", _second(server={"nccl_port": 31000}))
    a1, a2 = build_argv(one.deployment, one.plan), build_argv(two.deployment, two.plan)
    assert a1[a1.index("--nccl-port") + 1] == "30100" and "--base-gpu-id" not in a1
    assert a2[a2.index("--nccl-port") + 1] == "31000" and a2[a2.index("--base-gpu-id") + 1] == "4"
    errs = _errors("h1", _hv(server={"nccl_port": 19400}))
    assert [e.field for e in errs] == ["ddtree_server.nccl_port"] and "also ddtree_ops.exporter_port" in errs[
        0
    ].message()
    high = validate_hostvars("h1", _hv(server={"port": 65500}))
    assert high.deployment.server.rendezvous_port == 65400


def test_deploy_waves_serialize_the_instances_of_one_machine():
    vs = [validate_hostvars("m1-a", _hv()), validate_hostvars("m1-b", _second()),
          validate_hostvars("m2-a", _hv("10.0.0.6"))]
    assert instance_waves(vs) == {"m1-a": 0, "m1-b": 1, "m2-a": 0}
    plays = yaml.safe_load((REPO / "deploy.yml").read_text())
    waves = [p["vars"]["ddtree_service_hosts"] for p in plays if p.get("vars", {}).get("ddtree_service_hosts")]
    assert waves == [f"ddtree_wave_{i}" for i in range(MAX_WAVES)]
    group_by = next(t for t in plays[0]["tasks"] if "ansible.builtin.group_by" in t)
    assert "_ddtree_fleet.waves[inventory_hostname]" in group_by["ansible.builtin.group_by"]["key"]
    service = yaml.safe_load((REPO / "playbooks" / "service.yml").read_text())[0]
    assert service["hosts"] == ("{{ ((groups.get(ddtree_service_hosts, []) if ddtree_service_hosts is string else "
                                "[]) | intersect(groups.get('sglang_servers', []))) if ddtree_service_hosts is defined "
                                "else 'sglang_servers' }}")


def test_service_play_targets_its_wave_and_skips_an_empty_one_quietly(tmp_path):
    """playbooks/service.yml's ``hosts``, as written, under a real ansible-playbook: deploy.yml's
    waves are groups made by group_by, so only waves with an instance exist; the play targets
    exactly its wave's hosts, skips a wave no instance is in without a "Could not match supplied
    host pattern" warning (seven on every single-instance deploy before), keeps ``--limit``, and
    run alone targets every SGLang server."""
    import shutil

    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if playbook is None:
        pytest.skip("ansible-playbook not installed next to this Python")
    hosts_expr = yaml.safe_load((REPO / "playbooks" / "service.yml").read_text())[0]["hosts"]
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"sglang_servers": {"hosts": {
        "a": {**local, "w": 0}, "b": {**local, "w": 1}, "c": {**local, "w": 0}}}, "monitoring": {"hosts": {
            "mon": local}}}}}))
    show = [{"ansible.builtin.copy": {"content": "x", "dest": str(tmp_path / "ran-{{ wave }}-{{ inventory_hostname }}"),
                                      "mode": "0644"}, "delegate_to": "localhost"}]
    plays = [{"hosts": "sglang_servers", "gather_facts": False,
              "tasks": [{"ansible.builtin.group_by": {"key": "ddtree_wave_{{ w }}"}}]}]
    plays += [{"hosts": hosts_expr, "gather_facts": False, "vars": {"ddtree_service_hosts": f"ddtree_wave_{i}",
                                                                   "wave": i}, "tasks": show} for i in range(3)]
    plays += [{"hosts": hosts_expr, "gather_facts": False, "vars": {"wave": "alone"}, "tasks": show}]
    # Not a wave: another group (all, monitoring) is cut to the SGLang servers, a non-string is no host.
    plays += [{"hosts": hosts_expr, "gather_facts": False, "vars": {"ddtree_service_hosts": group, "wave": name},
               "tasks": show} for name, group in (("all", "all"), ("mon", "monitoring"), ("list", ["mon"]))]
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(plays))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([playbook, "-i", str(tmp_path / "hosts.yml"), "-l", "a,b,mon", str(tmp_path / "pb.yml")],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-0-a", "ran-1-b", "ran-all-a", "ran-all-b",
                                                             "ran-alone-a", "ran-alone-b"]
    assert "Could not match" not in r.stdout + r.stderr, r.stderr


def test_multi_example_inventory_validates_and_renders_both_instances(tmp_path, capsys):
    assert main(["validate", "-i", str(EXAMPLE)]) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["render", "-i", str(EXAMPLE), "--out", str(out)]) == 0, capsys.readouterr().err
    hosts = yaml.safe_load((EXAMPLE / "hosts.yml").read_text())["sglang_servers"]["children"]["ct200"]["hosts"]
    assert len(hosts) == 2 and len({h["ansible_host"] for h in hosts.values()}) == 1
    units = {}
    for host in hosts:
        [unit] = [p for p in (out / host / "etc/systemd/system").glob("ddtree-*.service")
                  if not p.name.endswith("-exporter.service") and "nvidia-devices" not in p.name]
        units[host] = unit.read_text()
    assert len({u.split("--nccl-port ")[1].split()[0] for u in units.values()}) == 2
    assert len({u.split("RuntimeDirectory=")[1].split()[0] for u in units.values()}) == 2
    # the machine's device-node unit is one file both instances install: byte-identical
    devices = {(out / h / "etc/systemd/system/ddtree-nvidia-devices.service").read_text() for h in hosts}
    assert len(devices) == 1
    prom = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
    for job in prom["scrape_configs"]:
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        assert len(targets) == 2 == len(set(targets)), targets


def test_sim_refuses_a_rendezvous_port_in_use(tmp_path):
    """The simulator binds --nccl-port as SGLang's TP rendezvous does: a second instance on the
    same port exits 1 before loading."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        env = {**os.environ, "SGLANG_SIM_LOAD_SECONDS": "0.1", "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-m", "ddtree_ops.sim", "--model-path", "/m", "--port", "1",
                            "--nccl-port", str(port)], capture_output=True, text=True, timeout=30, env=env,
                           cwd=tmp_path)
    assert r.returncode == 1 and "EADDRINUSE" in r.stdout + r.stderr


# --- GPU placement by SGLang's own formula: pp, gpu_id_step, DP attention, secret env

def test_pipeline_stages_and_gpu_id_step_widen_the_gpu_set():
    """--pp-size 2 puts a tp-4 instance on GPUs 0-7; --gpu-id-step 2 on 0,2,4,6: both overlap a
    second instance on GPUs 4-7 (engine.py / data_parallel_controller.py, SGLang 0.5.23)."""
    # without speculation: SGLang runs DFLASH/DDTree only at pp_size 1 (_handle_dflash)
    plain = {"algorithm": "none"}
    for extra in ({"--pp-size": "2"}, {"--gpu-id-step": 2}):
        hv = _hv(server={"extra_args": extra})
        hv["ddtree_speculative"] = plain
        found = _fleet(hv, _second())
        assert found and "both claim GPU" in found[0].message(), (extra, [f.message() for f in found])
    assert _fleet(_hv(server={"extra_args": {"--gpu-id-step": 1}}), _second()) == []


def test_gpu_id_step_past_the_host_is_refused_and_dp_attention_shares_the_tp_gpus():
    errs = _errors("h1", _hv(server={"tp_size": 4, "dp_size": 2, "extra_args": {"--gpu-id-step": "2"}}))
    assert any("span 15 GPUs" in e.message() for e in errs), [e.message() for e in errs]
    # DP attention: 8 DP ranks share the 8 TP GPUs (the usual DeepSeek layout) -- not 64 GPUs
    # (0.5.23's DFLASH worker takes DP attention with a DP LM head: _handle_dflash)
    validate_hostvars("h1", _hv(server={"tp_size": 8, "dp_size": 8, "extra_args": {"--enable-dp-attention": True,
                                                                                  "--enable-dp-lm-head": True}}))
    [e] = [e for e in _errors("h1", _hv(server={"extra_args": {"--pp-size": "x"}})) if "pp-size" in e.message()]
    assert "must be an integer 1-64" in e.message()


def test_cuda_visible_devices_in_secret_env_is_refused_without_its_value():
    hv = _hv()
    hv["ddtree_secret_env"] = {"CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}
    [e] = [e for e in _errors("h1", hv) if "CUDA_VISIBLE_DEVICES" in e.field]
    assert (
        e.field == "ddtree_secret_env.CUDA_VISIBLE_DEVICES"
        and "move CUDA_VISIBLE_DEVICES to ddtree_service.env" in e.message()
    )
    assert "4,5,6,7" not in e.message()


@pytest.mark.parametrize(("name", "value"), [
    ("TRITON_CACHE_DIR", "/var/cache/shared-triton"), ("SGLANG_DG_CACHE_DIR", "/opt/dg-cache"),
    ("TORCHINDUCTOR_CACHE_DIR", "/srv/inductor"), ("SGLANG_TORCH_PROFILER_DIR", "/var/log/sglang-prof"),
    ("HF_HOME", "/var/cache/ddtree-ops/sglang/../other"), ("SGLANG_JIT_CACHE_DIR", "jit"),
])
def test_a_cache_dir_set_through_the_env_outside_the_instances_trees_is_refused(name, value):
    """The unit runs with ProtectSystem=strict and opens only state_dir and cache_dir: a cache elsewhere is
    read-only to the server (first JIT compile fails) and shared by whichever instance names it too."""
    errs = _errors("h1", _hv(service={"env": {name: value}}))
    assert [e.field for e in errs] == [f"ddtree_service.env.{name}"], [e.message() for e in errs]
    text = errs[0].message()
    assert "ProtectSystem=strict" in text or "absolute path" in text
    assert "/var/cache/ddtree-ops/sglang" in text


def test_a_cache_dir_inside_the_instance_is_its_own_and_a_replaced_default_is_said():
    v = validate_hostvars("h1", _hv(service={"env": {"TRITON_CACHE_DIR": "/var/cache/ddtree-ops/sglang/tri",
                                                     "SGLANG_DG_CACHE_DIR": "/var/lib/ddtree-ops/sglang/dg"}}))
    said = [f for f in v.warnings if f.field == "ddtree_service.env.TRITON_CACHE_DIR"]
    assert [f.level for f in said] == ["info"]
    assert "replaces the unit's per-instance TRITON_CACHE_DIR=/var/cache/ddtree-ops/sglang/triton" in said[0].message()
    assert not [f for f in v.warnings if f.field == "ddtree_service.env.SGLANG_DG_CACHE_DIR"]
    env = next(f for f in render_host(v) if f.path.endswith(".env")).content
    assert "TRITON_CACHE_DIR=/var/cache/ddtree-ops/sglang/tri\n" in env


def test_two_instances_naming_one_cache_dir_through_the_env_clash():
    """h2 points its Triton cache into h1's cache dir: outside its own trees (refused for h2 alone), and
    the fleet check names the shared directory."""
    shared = {"env": {"SGLANG_DG_CACHE_DIR": "/var/cache/ddtree-ops/sglang/dg"}}
    errs = _errors("h2", _second(service=shared))
    assert [e.field for e in errs] == ["ddtree_service.env.SGLANG_DG_CACHE_DIR"]
    from ddtree_ops.config.instance import state_dirs

    one = validate_hostvars("h1", _hv(service=shared))
    assert ("ddtree_service.env.SGLANG_DG_CACHE_DIR", "/var/cache/ddtree-ops/sglang/dg") in state_dirs(one.deployment)


def test_every_cache_dir_the_unit_sets_is_one_the_env_rule_knows():
    from ddtree_ops.config.instance import WRITTEN_DIR_ENV, cache_env

    d = validate_hostvars("h1", _hv()).deployment
    assert all(WRITTEN_DIR_ENV.fullmatch(n) for n in cache_env(d))
    read_only = ("CUDA_HOME", "SGLANG_MOE_CONFIG_DIR", "SGLANG_NCCL_SO_PATH", "SGLANG_DISABLE_OUTLINES_DISK_CACHE",
                 "PROMETHEUS_MULTIPROC_DIR")
    assert not any(WRITTEN_DIR_ENV.fullmatch(n) for n in read_only)


def _clashing_example(tmp_path, port: int) -> Path:
    """inventory/multi-example with the second instance's port moved to ``port``."""
    import shutil

    inv = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inv)
    hv = inv / "host_vars" / "ct200-01-qwen32b.yml"
    doc = yaml.safe_load(hv.read_text())
    doc["ddtree_server"]["port"] = port
    hv.write_text(yaml.safe_dump(doc))
    return inv


@pytest.mark.parametrize("port", [30100, 30000])  # the first's derived rendezvous port; its own port
def test_a_host_in_a_fleet_clash_is_one_failed_check_and_its_unset_fields_read_as_unset(tmp_path, capsys, port):
    """A clash on one machine printed the host 'ok' and then 'error', and --json listed it twice; the
    rendezvous port the first instance never set was echoed as 'ddtree_server.nccl_port = 30100'."""
    import json

    inv = _clashing_example(tmp_path, port)
    assert main(["validate", "-i", str(inv), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in doc["checks"]]
    assert len(names) == len(set(names)) == 2
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert len(failed) == 1 and failed[0]["name"] == "config:ct200-01-qwen8b"
    assert main(["validate", "-i", str(inv)]) == 2
    out, err = capsys.readouterr()
    assert "ct200-01-qwen8b" not in out.replace("info ct200-01-qwen8b", "")  # not also "ok"
    assert "error ct200-01-qwen8b" in err or "ct200-01-qwen8b:" in err
    if port == 30100:
        assert "ddtree_server.nccl_port = None" in err and "(not set: derived 30100)" in err
        assert "nccl_port = 30100" not in err
    else:  # both write port: 30000 (their value, shown); their rendezvous ports are derived (not set)
        assert "ddtree_server.port = 30000" in err and "ddtree_server.nccl_port = None" in err


def test_a_clash_on_fields_the_inventory_sets_shows_their_values():
    found = _fleet(_hv(), _second(server={"nccl_port": 19400}))
    f = next(f for f in found if f.field == "ddtree_server.nccl_port")
    assert f.value == 19400 and "not set" not in f.message().split("; one machine")[0].split("h2: ")[1][:40]
    assert "h1: ddtree_ops.exporter_port (not set: derived 19400)" in f.message()
