"""Hostile values reaching the offline pip commands and the wheelhouse cleanup of the ``sglang``
and ``ddtree_service`` roles: :func:`ddtree_ops.sglang.wheelhouse.host_dir`,
``install_steps``, ``offline_pip_args`` and ``filter_plugins/ddtree_sglang.py``, unit-tested and
under a real ansible-playbook with this checkout's ansible.cfg."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, role_tasks

from ddtree_ops.sglang.wheelhouse import WheelhouseError, host_dir, install_steps, offline_pip_args

PLAYBOOK = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
needs_ansible = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed next to this Python")


@pytest.mark.parametrize("value", [
    "http://evil.example/wh",  # pip --find-links fetches a URL despite --no-index
    "--index-url=http://evil.example", "rel/dir", "", "/", "//srv/wh", "/opt/../etc", "/opt/./wh", "/opt/wh/",
    "/w\n--pre", "/w\x1b[2J", 7, None, ["/a"], "/" + "a" * 5000,
])
def test_offline_pip_args_refuse_what_is_not_a_host_directory(value):
    with pytest.raises(WheelhouseError, match=r"^find_links = .*: must be a normalized absolute directory path") as e:
        offline_pip_args(value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 600  # one line, the value cut to 200 characters


def test_paths_with_spaces_and_shell_characters_stay_one_argument():
    path = "/srv/wh $(touch pwned);`id`|x&y"
    assert host_dir("f", path) == path
    assert offline_pip_args(path)[-1] == path
    steps = install_steps(path, path, path, None, "s;rm -rf ~.whl")
    assert steps[0]["argv"][0] == f"{path}/bin/python" and steps[0]["argv"][-1] == f"{path}/s;rm -rf ~.whl"


@pytest.mark.parametrize("lock, wheel", [(None, "a" * 300 + ".whl"), ("a" * 300, "s.whl"), (None, "s\x7f.whl")])
def test_install_steps_refuse_long_or_control_file_names_in_one_line(lock, wheel):
    with pytest.raises(WheelhouseError, match=r"^install_steps: (lock|wheel) = .*: must be a file name") as e:
        install_steps("/b", "/w", "/o", lock, wheel)
    assert len(str(e.value)) < 600 and "…" in str(e.value) or "\\x7f" in str(e.value)


def _play(tmp_path: Path, tasks: list, extra: list[str] = ()) -> subprocess.CompletedProcess:
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "th1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO)}
    return subprocess.run([PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "pb.yml"), *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


@needs_ansible
@pytest.mark.parametrize("wh, message", [
    ("not a dict", "the wheelhouse result = 'not a dict': must be the JSON object"),
    ({"wheel": "s.whl"}, "the wheelhouse result = {'wheel': 's.whl'}: must be the JSON object"),
    ({"lock": None, "wheel": "s.whl", "host": "http://evil.example"}, "wheelhouse = 'http://evil.example/cp311-"),
])
def test_the_role_refuses_a_bad_wheelhouse_or_host_path_in_one_line(tmp_path, wh, message):
    """The sglang role's install task, as written: a ``_sglang_wh`` that is not the tool's object, or a
    ``sglang_host_wheelhouse`` that is a URL, stops the task with one line naming it (no Python
    error such as ``string indices must be integers`` or ``'lock'``), and nothing runs."""
    install = next(t for t in role_tasks("sglang") if t.get("name", "").startswith("Install the lock, SGLang"))
    host = wh.pop("host", "/opt/wh") if isinstance(wh, dict) else "/opt/wh"
    facts = {"_sglang_wh": wh, "_sglang_build": str(tmp_path / "build"), "_sglang_host_wh": f"{host}/cp311-{'0' * 16}",
             "_sglang_host_ops": f"{host}/ops-{'0' * 12}"}
    r = _play(tmp_path, [{"name": "facts", "ansible.builtin.set_fact": facts}, install])
    assert r.returncode == 2, r.stdout[-2000:]
    out = r.stdout + r.stderr
    assert message in out and "Traceback" not in out
    assert not (tmp_path / "build").exists()


@needs_ansible
def test_the_wheelhouse_cleanups_remove_only_wheelhouse_copies(tmp_path):
    """Both roles' "remove wheelhouses of earlier …" tasks, as written, with the host wheelhouse
    variable set to a shared directory (here a stand-in for ``/opt``): only directories named like a
    wheelhouse copy go (before, every other directory there did, e.g. ``/opt/ddtree-ops`` itself)."""
    shared = tmp_path / "opt"
    keep = ["ddtree-ops", "nvidia", "cp311-notawheelhouse", f"cp311-{'a' * 16}", f"ops-{'b' * 12}", f"cp311-{'c' * 12}"]
    old = [f"cp311-{'d' * 16}", f"ops-{'e' * 12}", f"cp311-{'f' * 12}"]
    for d in keep + old:
        (shared / d).mkdir(parents=True)
    sglang = [t for t in role_tasks("sglang") if "wheelhouses of earlier pins" in t.get("name", "")]
    ops = [t for t in role_tasks("ddtree_service") if "wheelhouses of earlier versions" in t.get("name", "")]
    assert len(sglang) == len(ops) == 2
    facts = {"sglang_host_wheelhouse": str(shared), "ddtree_service_host_wheelhouse": str(shared),
             "_sglang_wh": {"id": f"cp311-{'a' * 16}"}, "_sglang_ops_id": "b" * 12,
             "_ddtree_service_wheels": str(shared / f"cp311-{'c' * 12}")}
    r = _play(tmp_path, [{"name": "facts", "ansible.builtin.set_fact": facts}, *sglang, *ops])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert sorted(p.name for p in shared.iterdir()) == sorted(keep)
