"""One definition for every value Python, Jinja, YAML and bash share.

Each value lives once in Python; the roles read it from an action's result, the templates from
the render context, the scripts ask the package. For each value two kinds of test:

* a grep: no literal copy of it (or of the logic that computes it) is back in ``roles/``,
  ``playbooks/``, ``deploy.yml``, ``action_plugins/``, the templates or ``scripts/`` (and, for
  the values whose definition is one Python constant, nowhere else in ``ddtree_ops/``);
* the value the roles and templates receive (an action's result, a rendered file, a script's
  output) is the Python constant.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import REPO, base_hostvars, role_tasks, role_text

ANSIBLE = [REPO / "deploy.yml", *sorted((REPO / "roles").rglob("*.yml")), *sorted((REPO / "roles").rglob("*.j2")),
           *sorted((REPO / "playbooks").rglob("*.yml"))]
"""The YAML and Jinja a role or play runs (role READMEs are generated from argument_specs.yml)."""
TEMPLATES = sorted((REPO / "ddtree_ops" / "templates").glob("*.j2"))
PLUGINS = sorted((REPO / "action_plugins").glob("*.py"))
SCRIPTS = sorted(p for p in (REPO / "scripts").rglob("*") if p.is_file() and p.suffix in (".sh", ".py", ""))
PACKAGE = sorted((REPO / "ddtree_ops").rglob("*.py"))


def _hits(pattern: str, files: list[Path], allowed: dict[str, str] | None = None) -> list[str]:
    """``path:line: text`` of every line of ``files`` matching ``pattern`` (a regex), except in the
    files of ``allowed`` (path relative to the repository -> why that one holds the definition)."""
    rx = re.compile(pattern)
    out = []
    for path in files:
        rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        if allowed and rel in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if rx.search(line):
                out.append(f"{rel}:{n}: {line.strip()}")
    return out


def test_hits_finds_a_planted_copy(tmp_path):
    """The grep itself: a copy planted in a file is found; a file allowed to hold it is skipped."""
    planted = tmp_path / "main.yml"
    planted.write_text("- name: x\n  vars:\n    managed: Managed by ddtree-ops: do not edit.\n")
    assert _hits("Managed by ddtree-ops", [planted]) == [f"{planted}:3: managed: Managed by ddtree-ops: do not edit."]
    assert _hits("Managed by ddtree-ops", [planted], {str(planted): "the definition"}) == []


def _action(name: str, args: dict, task_vars: dict) -> dict:
    """Run action plugin ``name`` as Ansible would on the controller."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.task import Task
    from ansible.template import Templar

    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        module = __import__(name)
    finally:
        sys.path.pop(0)
    task = Task()
    task.args = args
    loader = DataLoader()
    return module.ActionModule(task=task, connection=SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")),
                               play_context=None, loader=loader, templar=Templar(loader=loader, variables=task_vars),
                               shared_loader_obj=None).run(task_vars=task_vars)


def _host_vars(host: str = "h1", **over) -> dict:
    return {**base_hostvars(), **over, "inventory_hostname": host, "group_names": ["b300", "sglang_servers"]}


def _render(**over) -> dict:
    result = _action("ddtree_render", {}, _host_vars(**over))
    assert not result.get("failed"), result.get("msg")
    return result


# --- Prometheus job names ---------------------------------------------------------------------

def test_job_names_have_one_definition():
    from ddtree_ops.render.files import EXPORTER_JOB, SGLANG_JOB

    jobs = "|".join(re.escape(j) for j in (EXPORTER_JOB, SGLANG_JOB))
    literal = rf"""(?i)job(_name)?["']?\s*[:=]\s*\\?["']?({jobs})\b"""
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS + SCRIPTS)
    assert not _hits(literal, PACKAGE, {"ddtree_ops/render/files.py": "defines them"})
    assert _hits(literal, [REPO / "ddtree_ops/render/files.py"])  # the pattern matches the definition


def test_job_names_reach_prometheus_yml_and_the_rules():
    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render import render_prometheus
    from ddtree_ops.render.monitoring import EXPORTER_JOB, SGLANG_JOB, render_rules

    v = validate_hostvars("h1", base_hostvars())
    doc = yaml.safe_load(render_prometheus([v]))
    assert [j["job_name"] for j in doc["scrape_configs"]] == [SGLANG_JOB, EXPORTER_JOB]
    rules = render_rules(validated=[v])
    assert f'job="{EXPORTER_JOB}"' in rules and f'job="{SGLANG_JOB}"' in rules


# --- file names of the rules and the dashboard --------------------------------------------------

def test_rules_and_dashboard_file_names_have_one_definition():
    from ddtree_ops.render.monitoring import DASHBOARD_FILE, RULES_FILE

    literal = "|".join(re.escape(f) for f in (RULES_FILE, DASHBOARD_FILE))
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS + SCRIPTS)
    assert not _hits(literal, PACKAGE, {"ddtree_ops/render/monitoring.py": "defines them"})


def test_the_role_installs_where_the_action_says():
    """prometheus_targets passes its directory and (empty by default) file variables; the action
    returns the paths, and the rules path is the one prometheus.yml's ``rule_files`` names."""
    from ddtree_ops.render.monitoring import DASHBOARD_FILE, RULES_FILE

    defaults = yaml.safe_load((REPO / "roles/prometheus_targets/defaults/main.yml").read_text())
    assert defaults["prometheus_targets_rules_file"] == "" and defaults["prometheus_targets_dashboard_file"] == ""
    tasks = role_tasks("prometheus_targets")
    dests = {t["name"]: t["ansible.builtin.copy"]["dest"] for t in tasks if "ansible.builtin.copy" in t}
    assert dests["Install the alert rules (checked by promtool)"] == "{{ _prometheus_targets_render.rules_path }}"
    assert dests["Install the Grafana dashboard"] == "{{ _prometheus_targets_render.dashboard_path }}"

    hv = {"hostvars": {"h1": _host_vars(ansible_host="10.0.0.5")}}
    r = _action("ddtree_prometheus", {"servers": ["h1"], "config_dir": "/etc/prom/", "rules_path": "",
                                      "dashboard_path": ""}, hv)
    assert not r.get("failed"), r.get("msg")
    assert (r["rules_path"], r["dashboard_path"]) == (f"/etc/prom/{RULES_FILE}", f"/etc/prom/{DASHBOARD_FILE}")
    assert yaml.safe_load(r["prometheus_yml"])["rule_files"] == [r["rules_path"]]
    r = _action("ddtree_prometheus", {"servers": ["h1"], "config_dir": "/etc/prom", "rules_path": "/srv/r.yml",
                                      "dashboard_path": "/srv/d.json"}, hv)
    assert (r["rules_path"], r["dashboard_path"]) == ("/srv/r.yml", "/srv/d.json")
    r = _action("ddtree_prometheus", {"servers": ["h1"], "config_dir": "etc/prom"}, hv)
    assert r["failed"] and r["msg"].count("\n") == 0 and "rules_path = 'etc/prom/ddtree-rules.yml'" in r["msg"]
    assert "absolute path" in r["msg"] and "Fix:" in r["msg"]


def test_render_cli_points_rule_files_at_the_rules_file(tmp_path):
    from ddtree_ops.cli import main
    from ddtree_ops.render.monitoring import PROMETHEUS_CONFIG_DIR, RULES_FILE

    assert main(["render", "--out", str(tmp_path / "out"), "-i", str(REPO / "inventory/example")]) == 0
    doc = yaml.safe_load((tmp_path / "out/prometheus/prometheus.yml").read_text())
    assert doc["rule_files"] == [f"{PROMETHEUS_CONFIG_DIR}/{RULES_FILE}"]
    assert (tmp_path / "out/prometheus" / RULES_FILE).is_file()


# --- the nvidia-smi query -----------------------------------------------------------------------

def test_driver_query_has_one_definition():
    from ddtree_ops.host.toolkit import QUERY_FIELDS

    literal = r"--query-gpu=|" + re.escape(",".join(QUERY_FIELDS))
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS + [p for p in SCRIPTS if p.suffix == ".sh"],
                     {"scripts/record-gpu-facts.sh": "records a wider query for fixtures and bug reports (its own)"})
    # in Python, a string that starts the query (docstrings name the flag inside ``...``)
    assert not _hits(r"[\"']--query-gpu=|[\"']driver_version,compute_cap", PACKAGE,
                     {"ddtree_ops/host/toolkit.py": "defines it"})
    assert _hits(r"[\"']--query-gpu=", [REPO / "ddtree_ops/host/toolkit.py"])


def test_the_role_runs_the_query_the_parser_reads():
    from ddtree_ops.host.toolkit import QUERY_COMMAND, parse_query_gpu

    result = _render()
    assert result["driver_query"] == QUERY_COMMAND[1:]
    tasks = role_tasks("cuda_toolkit")
    [task] = [t for t in tasks if t["name"] == "Read the NVIDIA driver version"]
    assert task["ansible.builtin.command"]["argv"].endswith("+ _cuda_toolkit_render.driver_query }}")
    assert [g.driver_version for g in parse_query_gpu("580.159.04, 10.3\n")] == ["580.159.04"]


# --- the CPython tag ----------------------------------------------------------------------------

def test_python_tag_code_has_one_definition():
    literal = r"version_info\[0\]|version_info\.major|f['\"]cp\{"
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS + SCRIPTS)
    assert not _hits(literal, PACKAGE, {"ddtree_ops/python_tag.py": "defines it"})


def test_every_reader_of_the_tag_gets_the_same_tag(tmp_path):
    from ddtree_ops.python_tag import PYTHON_TAG_CODE

    want = f"cp{sys.version_info.major}{sys.version_info.minor}"
    by_code = subprocess.run([sys.executable, "-c", PYTHON_TAG_CODE], capture_output=True, text=True, timeout=30)
    by_module = subprocess.run([sys.executable, "-m", "ddtree_ops.python_tag"], capture_output=True, text=True,
                               timeout=30, cwd=REPO)
    assert by_code.stdout == by_module.stdout == want + "\n"
    assert _render()["python_tag_code"] == PYTHON_TAG_CODE
    for role, var in (("sglang", "_sglang_render"), ("ddtree_service", "_ddtree_service_render")):
        text = role_text(role)
        assert f'"-c", "{{{{ {var}.python_tag_code }}}}"]' in text, role
    script = (REPO / "scripts/build-wheelhouse.sh").read_text()
    assert '"$py" -m ddtree_ops.python_tag' in script


# --- the managed-file header --------------------------------------------------------------------

def test_managed_header_has_one_definition():
    literal = r"Managed by ddtree-ops"
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS + SCRIPTS)
    assert not _hits(literal, PACKAGE, {"ddtree_ops/render/files.py": "defines it"})


def test_every_managed_file_carries_the_header(tmp_path):
    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render import render_host, render_prometheus
    from ddtree_ops.render.files import MANAGED, MANAGED_BY
    from ddtree_ops.render.monitoring import render_rules

    assert MANAGED.startswith(MANAGED_BY)
    v = validate_hostvars("h1", base_hostvars())
    texts = [f.content for f in render_host(v) if not f.path.endswith(".json")]
    texts += [render_prometheus([v]), render_rules(validated=[v])]
    assert texts and all(f"# {MANAGED}\n" in t for t in texts)
    assert _render()["managed_by"] == MANAGED_BY
    tasks = role_text("cuda_toolkit")
    assert 'managed: "{{ _cuda_toolkit_render.managed_by }}."' in tasks
    assert "// {{ _cuda_toolkit_render.managed_by }} (cuda_toolkit role):" in tasks


# --- does this host install real SGLang ---------------------------------------------------------

def test_installs_sglang_condition_has_one_definition():
    # attribute access in Jinja (the inventory variable ddtree_sglang.install_release may be named in docs)
    literal = r"(?<!ddtree_)sglang\.install_release|sglang\.source\s*[!=]=\s*['\"]simulator"
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS + SCRIPTS)
    # in Python, the condition itself ("simulator and not install_release") only where it is defined
    assert not _hits(r"not [\w.]*install_release\b|install_release\s+or\b|\bor [\w.]*install_release\b", PACKAGE,
                     {"ddtree_ops/config/models.py": "defines SGLangPin.installs_sglang"})


@pytest.mark.parametrize("pin, installs", [
    ({"source": "git", "ddtree_source": "sglang-pr-29907", "version": "0.5.23"}, True),
    ({"source": "pypi", "version": "0.5.23"}, True),
    ({"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}, False),
    ({"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree",
      "install_release": True}, True),
])
def test_the_roles_install_what_the_model_says(pin, installs):
    from ddtree_ops.config import validate_hostvars

    over = {"ddtree_sglang": pin}
    if pin["source"] == "pypi":  # no DDTree in a release: DFlash
        over["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "z-lab/Kimi-K2.6-DFlash",
                                      "block_size": 8}
        over["ddtree_accepted_risks"] = []
    v = validate_hostvars("h1", {**base_hostvars(), **over})
    assert v.deployment.sglang.installs_sglang is installs
    assert _render(**over)["installs_sglang"] is installs
    sglang = yaml.safe_load((REPO / "roles/sglang/tasks/main.yml").read_text())
    files = [t for t in sglang if "ansible.builtin.import_tasks" in t]
    assert files and all(t["when"] == "_sglang_render.installs_sglang" for t in files)
    triton = (REPO / "roles/triton/tasks/main.yml").read_text()
    assert "and not _triton_render.installs_sglang" in triton


# --- the loopback URL ---------------------------------------------------------------------------

def test_loopback_url_has_one_definition():
    literal = r"127\.0\.0\.1|\[::1\]"
    allowed = {
        # Prometheus' own address on the monitoring host: an operator setting of that role, not ours
        "roles/prometheus_targets/defaults/main.yml": "prometheus_targets_web_url",
        "roles/prometheus_targets/meta/argument_specs.yml": "prometheus_targets_web_url",
    }
    assert not _hits(literal, ANSIBLE + TEMPLATES + PLUGINS, allowed)
    # code that writes a loopback URL (help texts and docstrings give examples; those are not code)
    assert not _hits(r"""f["']http://(127\.0\.0\.1|\[::1\])|["']127\.0\.0\.1["'] if""", PACKAGE)


def test_loopback_urls_come_from_loopback_url():
    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.config.fields import LOOPBACK, loopback_url
    from ddtree_ops.config.service_models import Server
    from ddtree_ops.fleet.ssh import status_command, target_of

    assert loopback_url(30000) == f"http://{LOOPBACK[4]}:30000"
    assert loopback_url(30000, 6) == f"http://[{LOOPBACK[6]}]:30000"
    assert Server(host="0.0.0.0", port=30001).local_url == loopback_url(30001)
    assert Server(host="::", port=30001).local_url == loopback_url(30001, 6)
    result = _render(ddtree_ops={"exporter_port": 19411})
    assert result["exporter_url"] == loopback_url(19411)
    assert result["url"] == loopback_url(30000)
    hv = {**base_hostvars(), "ddtree_ops": {"exporter_port": 19411}}
    t = target_of(validate_hostvars("h1", hv), hv)
    assert f"{loopback_url(19411)}/metrics" in status_command(t, "n0nce")


# --- probe output formatting --------------------------------------------------------------------

def test_probe_output_is_read_in_python_not_yaml():
    text = role_text("sglang")
    for logic in ("map('ternary'", "rejectattr('ok')", "_sglang_probe_run.stdout | from_json", "startswith('{')"):
        assert logic not in text, logic
    by_name = {t["name"]: t for t in role_tasks("sglang")}
    read = next(t for n, t in by_name.items() if n.startswith("Read the probe's report"))
    assert set(read["ddtree_probe"]) == {"stdout", "stderr"} and read["register"] == "_sglang_probe"
    assert by_name["Show the probe"]["ansible.builtin.debug"]["msg"] == "{{ _sglang_probe.lines }}"


REPORT = {"ok": False, "version": "0.5.23", "plugin": {"summary": "installed, active"},
          "checks": [{"name": "sglang-version", "ok": True, "detail": "0.5.23"},
                     {"name": "argv-parses", "ok": False, "detail": "unknown flag --x"},
                     {"name": "verify-graph-sizing", "ok": False, "detail": "needs the plugin"}]}


@pytest.mark.parametrize("stdout, stderr, ok, first_detail", [
    (json.dumps(REPORT), "", False, "0.5.23"),
    (json.dumps({**REPORT, "ok": True, "checks": REPORT["checks"][:1]}), "", True, "0.5.23"),
    ("", "Traceback ...\nImportError: libcuda.so.1: cannot open shared object file\n", False,
     "ImportError: libcuda.so.1: cannot open shared object file"),
    ("", "", False, "no output"),
    ("{not json", "boom\n", False, "the probe's output is not JSON"),
    ('{"ok": true, "checks": "all"}', "", False, "the probe's output is not a report"),
    ('[1, 2]', "", False, "no output"),
    ('{"ok": true, "checks": [{"name": "x", "ok": "yes"}]}', "", False, "the probe's output is not a report"),
    # a check that failed under an "ok": true is still a failure
    (json.dumps({"ok": True, "checks": [{"name": "x", "ok": False, "detail": "d"}]}), "", False, "d"),
    ("{" + " " * (1 << 20), "", False, "the probe printed more than"),
])
def test_probe_action_reads_every_output(stdout, stderr, ok, first_detail):
    from ddtree_ops.sglang.probe import DETAIL_CAP, read_report, report_lines

    r = _action("ddtree_probe", {"stdout": stdout, "stderr": stderr}, {})
    assert not r.get("failed") and r["ok"] is ok and r["probe"]["ok"] is ok
    assert r["probe"]["checks"][0]["detail"].startswith(first_detail)
    assert r["lines"] == report_lines(read_report(stdout, stderr))
    assert all(len(line) < 2 * DETAIL_CAP + 20 for line in r["lines"])
    assert r["failure"] == " | ".join(c["detail"] for c in r["probe"]["checks"] if not c["ok"])


def test_probe_action_takes_the_report_as_data_too():
    """Should templating hand the action the parsed JSON instead of the text, it reads the same."""
    assert _action("ddtree_probe", {"stdout": REPORT, "stderr": ""}, {})["lines"] == _action(
        "ddtree_probe", {"stdout": json.dumps(REPORT), "stderr": ""}, {})["lines"]


def test_probe_text_output_is_the_roles_lines(tmp_path, capsys, monkeypatch):
    """``--json``-less runs print :func:`report_lines`, the same lines the role shows."""
    from ddtree_ops.sglang import probe

    r = _action("ddtree_probe", {"stdout": json.dumps(REPORT), "stderr": ""}, {})
    assert r["lines"] == ["ok   sglang-version: 0.5.23", "FAIL argv-parses: unknown flag --x",
                          "FAIL verify-graph-sizing: needs the plugin", "info plugin: installed, active"]
    assert r["failure"] == "unknown flag --x | needs the plugin"
    monkeypatch.setattr(probe, "probe", lambda req: REPORT)
    req = tmp_path / "req.json"
    req.write_text('{"argv": []}')
    assert probe.main(["--request", str(req)]) == 1
    assert capsys.readouterr().out.splitlines() == r["lines"]


def test_offline_pip_arguments_have_one_definition():
    """The offline ``pip install`` flags and the build's pip commands are built in Python
    (:func:`ddtree_ops.sglang.wheelhouse.install_steps` / ``offline_pip_args``), not in the roles."""
    run = [p for p in ANSIBLE + PLUGINS if p.name != "argument_specs.yml"]  # specs describe, they do not run
    assert _hits(r"--no-index|--find-links|-m,? pip|'pip'", run) == []
    install = next(t for t in role_tasks("sglang") if t.get("name", "").startswith("Install the lock, SGLang"))
    assert "ddtree_sglang_install_steps" in install["loop"] and install["ansible.builtin.command"] == {
        "argv": "{{ item.argv }}"}
    pip = next(t for t in role_tasks("ddtree_service") if "ansible.builtin.pip" in t)["ansible.builtin.pip"]
    assert "ddtree_pip_offline_args" in pip["extra_args"]


@pytest.mark.parametrize("lock", ["requirements.lock", None])
def test_install_steps(lock):
    from ddtree_ops.sglang.wheelhouse import install_steps, offline_pip_args

    steps = install_steps("/opt/b", "/var/wh/x", "/var/wh/ops-y", lock, "sglang-0.5.9-py3-none-any.whl")
    pip = ["/opt/b/bin/python", "-m", "pip", "install", "-q"]
    expect = [[*pip, *offline_pip_args("/var/wh/x"), "--no-deps", "-r", "/var/wh/x/requirements.lock"]] if lock else []
    expect += [[*pip, *offline_pip_args("/var/wh/x"), *(["--no-deps"] if lock else []),
                "/var/wh/x/sglang-0.5.9-py3-none-any.whl"],
               [*pip, *offline_pip_args("/var/wh/ops-y"), "--no-deps", "ddtree-ops"]]
    assert [s["argv"] for s in steps] == expect
    assert offline_pip_args("/w") == ["--no-index", "--disable-pip-version-check", "--find-links", "/w"]
    assert all(isinstance(a, str) for s in steps for a in s["argv"]) and all(s["what"] for s in steps)


@pytest.mark.parametrize("args, field", [
    (("rel/b", "/w", "/o", None, "s.whl"), "build"), (("/b", "/w\n", "/o", None, "s.whl"), "wheelhouse"),
    (("/b", "/w", 7, None, "s.whl"), "ops_wheelhouse"), (("/b", "/w", "/o", "../lock", "s.whl"), "lock"),
    (("/b", "/w", "/o", "--index-url=http://x", "s.whl"), "lock"), (("/b", "/w", "/o", None, "-e.whl"), "wheel"),
    (("/b", "/w", "/o", None, "a/../s.whl"), "wheel"), (("/b", "/w", "/o", None, "s.tar.gz"), "wheel"),
    (("/b", "/w", "/o", None, None), "wheel"), (("/b", "/w", "/o", "", "s.whl"), "lock"),
])
def test_install_steps_refuse_what_is_not_a_path_or_a_file_name(args, field):
    from ddtree_ops.sglang.wheelhouse import WheelhouseError, install_steps

    with pytest.raises(WheelhouseError, match=f"install_steps: {field} = "):
        install_steps(*args)


def test_the_role_runs_the_install_steps_through_the_filters(tmp_path):
    """The sglang role's install task and ddtree_service's pip arguments, as written, under a real
    ansible-playbook with this checkout's ansible.cfg (filter_plugins): the build's ``bin/python`` is
    a stand-in that records its argv, so what the role runs is compared with what Python built."""
    import os
    import shlex
    import shutil

    from ddtree_ops.sglang.wheelhouse import install_steps, offline_pip_args

    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if playbook is None:
        pytest.skip("ansible-playbook not installed next to this Python")
    build, log = tmp_path / "build", tmp_path / "argv.log"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "python").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {log}\n")
    (build / "bin" / "python").chmod(0o755)
    install = next(t for t in role_tasks("sglang") if t.get("name", "").startswith("Install the lock, SGLang"))
    pip = next(t for t in role_tasks("ddtree_service") if "ansible.builtin.pip" in t)["ansible.builtin.pip"]
    wh = {"lock": "requirements.lock", "wheel": "sglang-0.5.9-py3-none-any.whl"}
    facts = {"_sglang_wh": wh, "_sglang_build": str(build), "_sglang_host_wh": "/var/wh/x",
             "_sglang_host_ops": "/var/wh/ops-y", "_ddtree_service_wheels": "/var/wh/ops z"}
    tasks = [{"name": "facts", "ansible.builtin.set_fact": facts}, install,
             {"name": "extra", "ansible.builtin.copy": {"content": pip["extra_args"], "dest": str(tmp_path / "extra"),
                                                         "mode": "0644"}}]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "th1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([playbook, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "pb.yml")], capture_output=True,
                       text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = log.read_text().splitlines()
    assert ran == [" ".join(s["argv"][1:]) for s in install_steps(str(build), "/var/wh/x", "/var/wh/ops-y",
                                                                   wh["lock"], wh["wheel"])]
    assert (tmp_path / "extra").read_text() == "--force-reinstall " + shlex.join(offline_pip_args("/var/wh/ops z"))
