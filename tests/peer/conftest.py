"""Fixtures of the peer test tier (see ``peerutil`` for the venv rules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO
from peerutil import PEER_VERSIONS, import_venv_dir, run_worker, sglang_python


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.peer)


@pytest.fixture(scope="session")
def peer_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("peer")


@pytest.fixture(scope="session")
def introspection(peer_tmp) -> dict[str, dict[str, Any]]:
    """SGLang's own parser options/choices, ServerArgs fields and metric names, per version."""
    out = {}
    for v in PEER_VERSIONS:
        py = import_venv_dir(v) / "bin" / "python"
        if (import_venv_dir(v) / ".ddtree-sglang-venv-complete").exists():
            out[v] = run_worker(py, [{"kind": "introspect"}], peer_tmp / f"introspect-{v}")[0]
    return out


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """ddtree-ops installed ``--no-deps`` (real pip, real wheel build, real entry-point
    metadata) into a fresh directory that an SGLang venv's python puts on ``sys.path``
    through ``PYTHONPATH``: what a host gets when the sglang role installs the plugin
    into the service venv, without touching the shared cached venvs."""
    for v in PEER_VERSIONS:
        sglang_python(v)  # no SGLang venv: skip (or fail under DDTREE_PEER=1) before building
    site = tmp_path_factory.mktemp("plugin-site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(site), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list(site.glob("ddtree_ops-*.dist-info/entry_points.txt")), "no entry-point metadata installed"
    return site
