"""Every role keeps ``meta/argument_specs.yml`` in sync with ``defaults/main.yml``:
same variables, same defaults, every variable prefixed with the role name; and the
``ddtree_service`` role's service-account guard, run locally (read-only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import REPO

ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def test_roles_found():
    assert {"ddtree_service", "cuda_toolkit", "triton", "sglang", "ddtree_exporter", "prometheus_targets"} <= set(ROLES)
    # every role directory is a complete role with specs
    for p in (REPO / "roles").iterdir():
        if p.is_dir():
            assert p.name in ROLES and (p / "meta" / "argument_specs.yml").is_file(), p.name


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_match_defaults(role):
    base = REPO / "roles" / role
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options), f"{role}: defaults and argument_specs list different variables"
    for name, value in defaults.items():
        assert name.startswith(role + "_"), f"{role}: {name} is not prefixed with the role name"
        assert options[name].get("default") == value, f"{role}: {name} default differs"
        assert options[name].get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_role_vars_not_read_as_deployment_config(role):
    from ddtree_ops.config.hostvars import is_deployment_var

    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    assert not any(is_deployment_var(k) for k in defaults)


@pytest.mark.parametrize(("user", "ok"), [("daemon", False), ("root", False), ("ddtree-no-such-account", True)])
def test_service_account_guard_on_this_machine(tmp_path, user, ok):
    """roles/ddtree_service/tasks/account_check.yml (read-only: getent) run locally: an existing
    account the role did not create is refused before the user task would rewrite it."""
    import json
    import shutil
    import subprocess
    import sys

    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if playbook is None:
        pytest.skip("ansible-playbook not installed next to this Python")
    role = REPO / "roles" / "ddtree_service"
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(role / "vars" / "main.yml")],
        "tasks": [{"ansible.builtin.import_tasks": str(role / "tasks" / "account_check.yml")}]}]))
    render = {"deployment": {"service": {"user": user}}, "paths": {"state": "/var/lib/ddtree-ops/sglang"}}
    r = subprocess.run([playbook, "-i", "localhost,", str(tmp_path / "pb.yml"), "-e",
                        json.dumps({"_ddtree_service_render": render, "ansible_python_interpreter": sys.executable})],
                       capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    text = " ".join(r.stdout.split())
    if ok:
        assert r.returncode == 0, text
    else:
        assert r.returncode == 2 and f"ddtree_service.user = '{user}': the account already exists" in text, text
        assert "was not created by ddtree-ops" in text and "Fix: name an account" in text


def test_role_readmes_are_generated_from_the_argument_specs():
    """roles/*/README.md is what scripts/role-readmes.py writes from each role's meta/argument_specs.yml,
    task files, handlers and the playbooks using it: a variable added to a role without regenerating its
    README fails here."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(REPO / "scripts" / "role-readmes.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for role in (REPO / "roles").iterdir():
        text = (role / "README.md").read_text()
        specs = (role / "meta" / "argument_specs.yml").read_text()
        for line in specs.splitlines():
            if line.startswith("      ") and not line.startswith("       ") and line.rstrip().endswith(":"):
                assert f"`{line.strip()[:-1]}`" in text, (role.name, line)


# --- task files with tags -----------------------------------------------------

TAGS = {"preflight", "install", "configure"}


def _listed(tags: str) -> dict[str, set[str]]:
    """`deploy.yml --list-tasks --tags TAGS` as {task: its tags} (real ansible-playbook)."""
    import re
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    r = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", "inventory/test", "deploy.yml", "--list-tasks",
                        "--tags", tags], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out: dict[str, set[str]] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^\s{6}(.+?)\tTAGS: \[(.*)\]$", line)
        if m:
            out[m.group(1)] = {t.strip() for t in m.group(2).split(",") if t.strip()}
    return out


def test_each_roles_main_is_always_tasks_then_tagged_task_files():
    """tasks/main.yml of every role: the validate/render tasks every other file needs (tag
    always), then the task files (preflight / install / configure) imported with their tag."""
    for role in ROLES:
        tasks = yaml.safe_load((REPO / "roles" / role / "tasks" / "main.yml").read_text())
        for t in tasks:
            if "ansible.builtin.import_tasks" in t:
                assert set(t["tags"]) <= TAGS | {"always"}, (role, t)
                assert (REPO / "roles" / role / "tasks" / t["ansible.builtin.import_tasks"]).is_file()
            elif "ansible.builtin.include_tasks" in t:
                assert t["tags"] == t["ansible.builtin.include_tasks"]["apply"]["tags"], (role, t)
            else:
                assert t.get("tags") == ["always"], (role, t["name"])


def test_tags_select_the_task_files_and_keep_validation():
    install, configure = _listed("install"), _listed("configure")
    for listed, tag in ((install, "install"), (configure, "configure")):
        assert listed and all(tags & {tag, "always"} for tags in listed.values()), tag
        # the controller-side validation and the deploy waves run whatever the tags
        assert "Validate deployment config" in listed
        assert "Group the instances of each machine into deploy waves" in listed
    assert "ddtree_service : Install ddtree-ops into the service venv (offline, from the wheelhouse)" in install
    assert "ddtree_service : Install ddtree-ops into the service venv (offline, from the wheelhouse)" not in configure
    assert "ddtree_service : Activate this release (switch `current`, prune beyond ddtree_service.keep_releases)" \
        in configure
    assert not any(t.startswith("ddtree_service : Activate") for t in install)
    assert any(t.startswith("sglang : Install the lock, SGLang and ddtree-ops") for t in install)
