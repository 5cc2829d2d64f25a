"""Every file the inventory loader reads is checked (a regular file, bounded size) before Ansible
reads it: a FIFO or a link to ``/dev/zero`` in the inventory directory itself, or given as ``-i``,
is one line and exit 2, never a hang or an out-of-memory kill."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_hostvars

from ddtree_ops.config import ConfigError
from ddtree_ops.config.inventory import MAX_VARS_FILE_BYTES, load_hostvars


def _inventory(tmp: Path) -> Path:
    inv = tmp / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"b300-01": {}}}}}})
    )
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(base_hostvars()))
    return inv


def _validate(inv: Path) -> subprocess.CompletedProcess:
    """``ddtree-ops validate`` in a child with a deadline: a regression hangs the child, not the suite."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "ddtree_ops", "validate", "-i", str(inv)], capture_output=True,
                          text=True, timeout=60, env=env, cwd=REPO)


def _plant(inv: Path, kind: str, name: str) -> Path:
    f = inv / name
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "zero":
        os.symlink("/dev/zero", f)
    elif kind == "socket":
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(f))
        s.close()
    elif kind == "huge":
        with open(f, "wb") as fh:
            fh.truncate(MAX_VARS_FILE_BYTES + 1)  # sparse: no disk used
    return f


CASES = [
    ("fifo", "extra.yml", "not a regular file"),
    ("zero", "zero.yml", "not a regular file"),
    ("fifo", "hosts2", "not a regular file"),  # no extension: Ansible's ini plugin would read it
    ("socket", "sock", "not a regular file"),
    ("huge", "big.yml", "larger than"),
    ("zero", "sub/nested.yml", "not a regular file"),  # a directory source, read recursively
    ("fifo", "group_vars/all.yml", "not a regular file"),
]


@pytest.mark.parametrize(("kind", "name", "needle"), CASES)
def test_bad_file_in_the_inventory_directory_is_one_line(tmp_path, kind, name, needle):
    inv = _inventory(tmp_path)
    (inv / name).parent.mkdir(parents=True, exist_ok=True)
    f = _plant(inv, kind, name)
    r = _validate(inv)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert str(f) in errors[0] and needle in errors[0]


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_inventory_given_as_a_fifo_or_device_is_one_line(tmp_path, kind):
    f = _plant(tmp_path, kind, "inventory.yml")
    r = _validate(f)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr


def test_files_ansible_never_reads_are_not_checked(tmp_path):
    """Ansible's own ignore list (hidden names, .md, .txt, ~): a FIFO there is never opened, so the
    inventory still loads."""
    inv = _inventory(tmp_path)
    for name in (".pipe", "README.md", "notes.txt", "hosts.yml~"):
        os.mkfifo(inv / name)
    assert set(load_hostvars(inv)) == {"b300-01"}


def test_dangling_symlink_in_the_inventory_directory_is_refused(tmp_path):
    inv = _inventory(tmp_path)
    os.symlink(tmp_path / "gone.yml", inv / "more.yml")
    with pytest.raises(ConfigError, match="dangling symlink"):
        load_hostvars(inv)
