"""The playbooks' strategy: Mitogen's linear strategy through strategy_plugins/mitogen_linear.py.

Real ansible-playbook runs (localhost): the checkout's ansible.cfg selects the strategy and a play
runs under it; without Mitogen the run stops at once with the one-line fix; the imports warmed in
the strategy's process cover every ddtree_ops module the action plugins import.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PLAY = """\
- hosts: localhost
  connection: local
  gather_facts: false
  vars: {ansible_python_interpreter: "%s"}
  tasks:
    - name: First task (prints the pid of the interpreter that ran its module)
      ansible.builtin.command: {argv: [sh, -c, 'echo ran-under-the-strategy $PPID']}
      register: one
      changed_when: false
    - name: Second task
      ansible.builtin.command: {argv: [sh, -c, 'echo ran-under-the-strategy $PPID']}
      register: two
      changed_when: false
    - name: Show both
      ansible.builtin.debug:
        msg: "PIDS {{ one.stdout.split()[-1] }} {{ two.stdout.split()[-1] }}"
"""

def _play(tmp_path: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY % sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(env_extra or {})
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play), "-v"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_ansible_cfg_selects_the_mitogen_strategy_from_this_checkout():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    r = subprocess.run([str(BIN / "ansible-config"), "dump", "--only-changed"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    lines = {ln.split("(", 1)[0].strip(): ln for ln in r.stdout.splitlines()}
    assert "= mitogen_linear" in lines["DEFAULT_STRATEGY"]
    assert str(REPO / "strategy_plugins") in lines["DEFAULT_STRATEGY_PLUGIN_PATH"]


def _pids(out: str) -> tuple[str, str]:
    line = next(ln for ln in out.splitlines() if "PIDS " in ln)
    a, b = line.split("PIDS ", 1)[1].strip().strip('"').split()[:2]
    return a, b


def test_a_play_runs_under_mitogen(tmp_path):
    """Mitogen keeps one interpreter per host for the run: both tasks' modules run in the same
    process. The stock strategy (the control) starts a fresh interpreter per task."""
    r = _play(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    a, b = _pids(r.stdout)
    assert a == b, f"two tasks ran in two interpreters ({a}, {b}): not Mitogen"
    r = _play(tmp_path, {"ANSIBLE_STRATEGY": "linear"})
    assert r.returncode == 0, r.stdout[-2000:]
    a, b = _pids(r.stdout)
    assert a != b


def test_without_mitogen_the_run_stops_with_the_fix(tmp_path):
    fake = tmp_path / "shadow" / "ansible_mitogen"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ansible_mitogen (test double)')\n")
    r = _play(tmp_path, {"PYTHONPATH": str(fake.parent)})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "ran-under-the-strategy" not in out
    assert "Mitogen is not importable" in out and "ANSIBLE_STRATEGY=linear" in out
    # and the stated fix works: the stock strategy runs the same play
    r = _play(tmp_path, {"PYTHONPATH": str(fake.parent), "ANSIBLE_STRATEGY": "linear"})
    assert r.returncode == 0, r.stdout[-2000:]
    assert "ran-under-the-strategy" in r.stdout


def _warm_list() -> set[str]:
    tree = ast.parse((REPO / "strategy_plugins" / "mitogen_linear.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_WARM":
            return set(ast.literal_eval(node.value))
    raise AssertionError("_WARM not found")


def test_warm_imports_cover_what_the_action_plugins_import():
    imported = set()
    for f in (REPO / "action_plugins").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddtree_ops"):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name.startswith("ddtree_ops"))
    assert imported, "the action plugins import nothing from ddtree_ops?"
    assert imported <= _warm_list(), f"add to _WARM in strategy_plugins/mitogen_linear.py: {imported - _warm_list()}"
    for name in _warm_list():
        __import__(name)
