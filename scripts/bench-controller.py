#!/usr/bin/env python3
"""Benchmark the controller commands at 1/10/100/1000 hosts, side by side with Ansible's own
``ansible-inventory --list`` on the same inventory, in one run (figures and targets: docs/performance.md).

For each size N an inventory is generated from the shipped ``inventory/example`` (its
``group_vars`` copied unchanged; N hosts split between the ``b300`` and ``ct200`` groups),
then each command runs ``--repeat`` times as a fresh process, interleaved (one round runs
every command once), and the median wall time and median CPU time (user + sys of the child,
``os.wait4``) are printed with their ratio to ``ansible-inventory --list``:

    validate -i INV            (target: <= 1.1x ansible-inventory at 100 and 1000 hosts)
    plan -i INV --json
    render -i INV --out DIR    (target: <= 2x validate at 1000 hosts)
    file-tree floor            the same files written by a bare Python loop (what the kernel
                               and file system cost, whoever renders)

and ``ddtree-ops --help`` start-up (target: <= 0.3 s), beside ``python -c pass``.

Usage: .venv/bin/python scripts/bench-controller.py [--sizes 1,10,100,1000] [--repeat 5] [--tmp DIR]
Prints figures; it is not a test. CPU figures are the ones to trust on a loaded machine.
``--tmp`` puts the inventories and the rendered trees on another file system (e.g. ``/dev/shm``,
a tmpfs): render's system time is almost all the file system's cost of creating ~6000
directories and ~5000 files at 1000 hosts (docs/performance.md, "Speed at a thousand hosts").

Two things the figures depend on that are not the commands' own:

* ``ddtree_ops`` is byte-compiled first (``compileall``, as ``pip install`` does): with
  ``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__`` in the checkout, every run would compile
  the package again (~0.07 s CPU) while Ansible's modules are compiled in site-packages.
* every render and floor run writes a new tree; the trees are deleted only after the last run of
  a size. ext4 without a journal (this VM's disk) skips, when it allocates an inode, every inode
  freed in the last 30 s (5 min while its inode-table block is not yet written back), reading
  each one's inode-table block (``recently_deleted()`` in ``fs/ext4/ialloc.c``): a tree created
  right after an 11,000-inode tree was deleted paid that scan for each inode (measured with
  ``perf record``: 60 % of the system time in ``recently_deleted``; 0.5 s growing to 6 s for the
  same tree over repeated delete-and-create rounds). Other users deleting files on the same disk
  still add to it: the floor column shows what the disk costs in that minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def make_inventory(base: Path, n: int) -> Path:
    """An inventory of ``n`` server hosts: ``inventory/example``'s group_vars, hosts split
    evenly between b300 and ct200 (names ``b300-0001``, ``ct200-0002``, ...)."""
    inv = base / f"inv-{n}"
    shutil.copytree(REPO / "inventory" / "example" / "group_vars", inv / "group_vars")
    groups: dict[str, list[str]] = {"b300": [], "ct200": []}
    for i in range(1, n + 1):
        cls = "b300" if i % 2 else "ct200"
        groups[cls].append(f"{cls}-{i:04d}")
    lines = ["sglang_servers:", "  children:"]
    for cls, hosts in groups.items():
        lines += [f"    {cls}:", "      hosts:" if hosts else "      hosts: {}"]
        lines += [f"        {h}:\n          ansible_host: {h}.example.internal" for h in hosts]
    (inv / "hosts.yml").write_text("\n".join(lines) + "\n")
    return inv


FLOOR = """
import json, os, sys
out, manifest = sys.argv[1], json.load(open(sys.argv[2]))
for rel, size in manifest:
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"x" * size)
    os.close(fd)
    os.replace(tmp, path)
"""
"""The file-system floor of ``render``: the same tree (directories, files, sizes) written by a
bare Python loop, temporary file + rename per file as ``render`` does."""


def manifest_of(out: Path, dest: Path) -> None:
    """Write ``[[relative path, size], ...]`` of every file under ``out`` to ``dest`` (JSON)."""
    import json

    files = [[str(p.relative_to(out)), p.stat().st_size] for p in sorted(out.rglob("*")) if p.is_file()]
    dest.write_text(json.dumps(files))


def timed(argv: list[str], before=None) -> tuple[float, float, float, int]:
    """Run ``argv`` (output discarded); return (wall s, user CPU s, system CPU s, exit code)."""
    if before:
        before()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    return wall, ru.ru_utime, ru.ru_stime, os.waitstatus_to_exitcode(status)


def measure(commands: dict[str, list[str]], repeat: int, before: dict | None = None) -> dict[str, tuple[float, ...]]:
    """Median (wall, CPU, user CPU, system CPU) per command, interleaved round by round;
    ``before[name]`` runs untimed before each run of ``name`` (e.g. emptying --out)."""
    samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in commands}
    for _ in range(repeat):
        for name, argv in commands.items():
            wall, user, sys_s, rc = timed(argv, (before or {}).get(name))
            if rc != 0:
                sys.exit(f"bench-controller: {name} exited {rc}: {' '.join(argv)}")
            samples[name].append((wall, user, sys_s))
    med = statistics.median
    return {k: (med(w for w, _, _ in v), med(u + s for _, u, s in v), med(u for _, u, _ in v), med(s for _, _, s in v))
            for k, v in samples.items()}


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (``/proc/self/mounts``), or ``?``."""
    best, kind = "", "?"
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and str(path).startswith(fields[1].rstrip("/") + "/") and len(fields[1]) > len(best):
                    best, kind = fields[1], fields[2]
    except OSError:
        pass
    return kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,100,1000", help="comma-separated host counts")
    ap.add_argument("--repeat", type=int, default=5, help="runs per command and size (median)")
    ap.add_argument("--tmp", default=None, help="directory for the inventories and rendered trees "
                    "(default: the system's temporary directory)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    ddtree = [sys.executable, "-m", "ddtree_ops"]  # run from the checkout: this tree's ddtree_ops
    ansible_inv = str(BIN / "ansible-inventory")
    for exe in (ansible_inv,):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench-controller: {exe} not found; run it with the project venv's python")

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {args.repeat} runs; "
          "wall s / CPU s, ratio = CPU / CPU of ansible-inventory --list (wall ratio in brackets)")
    start = measure({"python -c pass": [sys.executable, "-c", "pass"],
                     "ddtree-ops --help": ddtree + ["--help"]}, args.repeat)
    for name, (wall, cpu, _, _) in start.items():
        print(f"  {name:<22} {wall:6.3f} s wall  {cpu:6.3f} s CPU")
    help_wall = start["ddtree-ops --help"][0]
    print(f"  --help {help_wall:.3f} s (target <= 0.3 s: {'met' if help_wall <= 0.3 else 'NOT met'})")

    import compileall

    compileall.compile_dir(str(REPO / "ddtree_ops"), quiet=1)  # as installed: no compile per run
    with tempfile.TemporaryDirectory(prefix="bench-controller-", dir=args.tmp) as tmp:
        base = Path(tmp)
        print(f"\ninventories and rendered trees under {base} ({_fs_type(base)})")
        print(f"\n{'hosts':>5}  {'command':<22} {'wall s':>8} {'CPU s':>8} {'user':>7} {'sys':>7} "
              f"{'ratio':>7} {'(wall)':>8}")
        for n in sizes:
            inv = make_inventory(base, n)
            out = base / f"out-{n}"
            cmds = {
                "ansible-inventory": [ansible_inv, "-i", str(inv), "--list"],
                "validate": ddtree + ["validate", "-i", str(inv)],
                "plan --json": ddtree + ["plan", "-i", str(inv), "--json"],
                "render": ddtree + ["render", "-i", str(inv), "--out", str(out)],
            }
            subprocess.run(cmds["render"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
            manifest = base / f"manifest-{n}.json"
            manifest_of(out, manifest)
            floor_out = base / f"floor-{n}"
            cmds["file-tree floor"] = [sys.executable, "-c", FLOOR, str(floor_out), str(manifest)]
            # each run into a new directory, none deleted until the size is done (see the docstring)
            trees = base / f"trees-{n}"
            trees.mkdir()
            fresh = {"render": (cmds["render"], -1), "file-tree floor": (cmds["file-tree floor"], -2)}

            def new_tree(name: str, fresh: dict = fresh, trees: Path = trees) -> None:
                argv, at = fresh[name]
                argv[at] = str(trees / f"{name.split()[0]}-{len(list(trees.iterdir()))}")

            res = measure(
                cmds,
                args.repeat,
                {"render": lambda: new_tree("render"), "file-tree floor": lambda: new_tree("file-tree floor")},
            )
            ref_wall, ref_cpu = res["ansible-inventory"][:2]
            for name, (wall, cpu, user, sys_s) in res.items():
                print(
                    f"{n:>5}  {name:<22} {wall:8.3f} {cpu:8.3f} {user:7.3f} {sys_s:7.3f} {cpu / ref_cpu:6.2f}x "
                    f"{wall / ref_wall:7.2f}x"
                )
            v_cpu, v_user = res["validate"][1:3]
            r_cpu, r_user = res["render"][1:3]
            f_cpu = res["file-tree floor"][1]
            notes = [
                f"validate/ansible-inventory {v_cpu / ref_cpu:.2f}x"
                + (f" (target <= 1.1: {'met' if v_cpu / ref_cpu <= 1.1 else 'NOT met'})" if n >= 100 else ""),
                f"render/validate {r_cpu / v_cpu:.2f}x"
                + (f" (target <= 2: {'met' if r_cpu / v_cpu <= 2 else 'NOT met'})" if n >= 1000 else "")
                + f"; user CPU only {r_user / v_user:.2f}x; (render - file-tree floor) / validate "
                f"{(r_cpu - f_cpu) / v_cpu:.2f}x",
            ]
            print(f"{'':>5}  " + "; ".join(notes))
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(trees, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
