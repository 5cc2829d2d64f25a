"""The installed wheel works outside the checkout: a wheel built from the
repository carries its Jinja layouts as package data, and `render` from the installed
package, in a folder with no checkout around it, writes the same files as the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import REPO


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_built_wheel_ships_templates_and_renders_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(dist), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = dist.glob("ddtree_ops-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ddtree_ops/templates/sglang.service.j2" in names, names

    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The installed copy first on sys.path; the checkout is nowhere near the working folder.
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import ddtree_ops; print(ddtree_ops.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr

    out_pkg, out_repo = tmp_path / "out-installed", tmp_path / "out-checkout"
    inv = str(REPO / "inventory" / "example")
    r = subprocess.run([sys.executable, "-m", "ddtree_ops", "render", "-i", inv, "-o", str(out_pkg)], cwd=elsewhere,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r2 = subprocess.run([sys.executable, "-m", "ddtree_ops", "render", "-i", inv, "-o", str(out_repo)], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr[-2000:]
    installed, checkout = _tree(out_pkg), _tree(out_repo)
    assert any(name.endswith(".service") for name in installed), sorted(installed)
    assert installed == checkout
