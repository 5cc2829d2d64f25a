#!/usr/bin/env python3
"""Deploy time at fleet scale: ``deploy.yml`` over 1, 2 and 4 booted test
hosts, the first run (fresh hosts) and the no-change run after it, as seconds and as ratios
to 1 host. A benchmark that prints figures, not a test.

For each size N: ``scripts/testhost.sh down`` then ``up N`` (fresh volatile hosts: the first
run installs everything), the stand-ins for N hosts, then ``deploy.yml`` twice over
ddt-th1..N (an inventory generated from ``inventory/test``: the same deployment on each host,
each host reaching the stand-in apt repository on its own veth). The hosts are taken down at
the end.

Usage (as root, machine-wide test hosts: hold the lock)::

    flock -o /run/ddtree-testhost.lock .venv/bin/python scripts/bench-deploy.py [--sizes 1,2,4]

Targets (docs/performance.md): no-change run < 15 s per host, T(4 hosts) / T(1) < 1.6.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TEST_INVENTORY = REPO / "inventory" / "test"
KEY = REPO / ".state" / "ssh" / "id_ed25519"


def sh(*argv: str, timeout: float = 600) -> None:
    subprocess.run(list(argv), cwd=REPO, check=True, timeout=timeout, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL)


def inventory(root: Path, n: int) -> Path:
    """inventory/test over ddt-th1..N (ddt-thI at 10.213.I.2, its apt stand-in at 10.213.I.1)."""
    inv = root / f"inv{n}"
    shutil.copytree(TEST_INVENTORY, inv)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    th = hosts["all"]["children"]["testhosts"]
    th["hosts"] = {f"ddt-th{i}": {"ansible_host": f"10.213.{i}.2"} for i in range(1, n + 1)}
    th["vars"]["ansible_ssh_private_key_file"] = str(KEY)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "host_vars").mkdir()
    for i in range(1, n + 1):
        (inv / "host_vars" / f"ddt-th{i}.yml").write_text(
            yaml.safe_dump({"cuda_toolkit_repo_url": f"http://10.213.{i}.1:8765"}))
    return inv


def busy_cpu_s() -> float:
    """CPU seconds this machine has spent busy since boot (/proc/stat, all cores): the controller
    and the test hosts (containers on the same kernel) together."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def deploy(inv: Path, n: int) -> tuple[float, dict[str, int]]:
    t0 = time.monotonic()
    r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "deploy.yml"], cwd=REPO, capture_output=True,
                       text=True, timeout=3600, stdin=subprocess.DEVNULL)
    t = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"deploy.yml over {n} hosts failed (rc {r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-1000:]}")
    m = re.search(r"^ddt-th1\s+:\s+(.*)$", r.stdout, re.M)
    recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}
    return t, recap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,2,4", help="host counts, comma-separated (1..20; the first is the base)")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
        if not sizes or any(not 1 <= s <= 20 for s in sizes):
            raise ValueError
    except ValueError:
        ap.error(f"--sizes {args.sizes[:200]!r}: comma-separated integers 1..20, e.g. 1,2,4")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        try:
            for n in sizes:
                sh("bash", "scripts/testhost-standins.sh", "down")
                sh("bash", "scripts/testhost.sh", "down")
                sh("bash", "scripts/testhost.sh", "up", str(n))
                sh("bash", "scripts/testhost-standins.sh", "up", str(n))
                inv = inventory(Path(tmp), n)
                first, _ = deploy(inv, n)
                c0 = busy_cpu_s()
                again, recap = deploy(inv, n)
                cpu = busy_cpu_s() - c0
                rows.append((n, first, again, recap.get("changed"), cpu))
                print(f"{n} hosts: first run {first:7.1f} s, no-change run {again:6.1f} s "
                      f"(changed={recap.get('changed')}; machine busy {cpu:.1f} CPU-s)", flush=True)
        finally:
            subprocess.run(["bash", "scripts/testhost-standins.sh", "down"], cwd=REPO, check=False)
            subprocess.run(["bash", "scripts/testhost.sh", "down"], cwd=REPO, check=False)
    base = rows[0]
    cores = os.cpu_count() or 1
    print(f"\n{'hosts':>5} {'first s':>9} {'x1':>6} {'no-change s':>12} {'x1':>6} {'no-change s/host':>17} "
          f"{'busy CPU-s':>11} {'CPU floor s':>12}")
    for n, first, again, _, cpu in rows:
        # the controller and the hosts share this machine's cores: the run cannot be shorter than
        # its CPU time spread over all of them
        print(f"{n:5d} {first:9.1f} {first / base[1]:6.2f} {again:12.1f} {again / base[2]:6.2f} {again / n:17.1f} "
              f"{cpu:11.1f} {cpu / cores:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
