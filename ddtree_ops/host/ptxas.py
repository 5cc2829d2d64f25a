"""Assemble a tiny PTX with exactly the ptxas a service will use (standard library only).

This file runs on GPU hosts before ddtree-ops is installed there: the ``triton`` role copies
it and runs it with any Python 3 (``python3 ptxas.py --target sm_103a --ptx-version 8.8
[--ptxas PATH | --python VENV_PY] --json``). ``ddtree-ops check-ptxas`` calls the same
functions on the controller.

Which ptxas: ``--ptxas PATH`` checks that binary; ``--python VENV_PY`` asks Triton inside
that venv, through Triton's own ``triton.backends.nvidia.compiler.get_ptxas(arch)`` (or
``knobs.nvidia.ptxas`` / ``_path_to_binary`` in releases without it), in the current
environment — so ``TRITON_PTXAS_PATH`` / ``TRITON_PTXAS_BLACKWELL_PATH`` set for the
service decide it exactly as they will in the service. Triton silently falls back to its
bundled binary when an override does not answer ``--version``; :func:`triton_ptxas`
reports such a fallback as a failure.

Exit codes: 0 assembled, 1 ptxas refused (or fell back), 2 usage error / ptxas or Triton
missing. ``--json`` prints ``{"ok", "checks": [{name, ok, detail}], "ptxas": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

_TARGET = re.compile(r"sm_[0-9]{2,3}a?")
_PTX_VERSION = re.compile(r"[0-9]\.[0-9]")


class PtxasUsageError(Exception):
    """Bad arguments, or no ptxas / Triton where one was named (exit 2)."""


def ptx_source(target: str, ptx_version: str) -> str:
    """The smallest PTX module with one empty kernel for ``target`` (e.g. ``sm_103a``)."""
    if not _TARGET.fullmatch(target) or not _PTX_VERSION.fullmatch(ptx_version):
        raise PtxasUsageError(f"target {target!r} / PTX version {ptx_version!r}: expected e.g. sm_103a and 8.8")
    return (f".version {ptx_version}\n.target {target}\n.address_size 64\n\n"
            ".visible .entry ddtree_ops_ptxas_check()\n{\n\tret;\n}\n")


def ptxas_version(path: str, timeout: float = 60.0) -> str | None:
    """CUDA ``major.minor`` a ptxas reports (``release 13.0``), or None if it does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+)", out.stdout + out.stderr)
    return m.group(1) if m and out.returncode == 0 else None


def assemble(path: str, target: str, ptx_version: str, timeout: float = 120.0) -> dict:
    """Run ``ptxas --gpu-name=<target>`` on :func:`ptx_source`.

    Returns:
        ``{ok, ptxas, version, target, ptx_version, rc, output}``; ``output`` is ptxas'
        own message (e.g. ``Value 'sm_103a' is not defined for option 'gpu-name'``).

    Raises:
        PtxasUsageError: ``path`` is not an executable ptxas.
    """
    version = ptxas_version(path)
    if version is None:
        raise PtxasUsageError(f"{path}: not an executable ptxas (it does not answer --version)")
    src = ptx_source(target, ptx_version)
    with tempfile.TemporaryDirectory(prefix="ddtree-ptxas-") as tmp:
        ptx, cubin = os.path.join(tmp, "check.ptx"), os.path.join(tmp, "check.cubin")
        with open(ptx, "w", encoding="ascii") as f:
            f.write(src)
        try:
            r = subprocess.run([path, f"--gpu-name={target}", ptx, "-o", cubin],
                               capture_output=True, text=True, timeout=timeout)
            rc, output = r.returncode, (r.stdout + r.stderr).strip()
        except subprocess.TimeoutExpired:
            rc, output = 124, f"ptxas did not finish in {timeout:g} s"
        ok = rc == 0 and os.path.getsize(cubin) > 0 if os.path.exists(cubin) else False
    return {"ok": ok, "ptxas": path, "version": version, "target": target, "ptx_version": ptx_version,
            "rc": rc, "output": output.replace(tmp, "<tmp>")}


_TRITON_PICK = r"""
import inspect, json, os, sys
arch = int(sys.argv[1])
import triton
from triton.backends.nvidia import compiler as c

def pick():
    f = getattr(c, "get_ptxas", None)
    if f is None:
        from triton import knobs
        return knobs.nvidia.ptxas.path
    f = getattr(f, "__wrapped__", f)  # 3.3 caches it; we call it twice
    try:
        tool = f(arch)
    except TypeError:  # 3.4/3.5: get_ptxas() takes no arch
        tool = f()
    return tool if isinstance(tool, str) else tool[0] if isinstance(tool, tuple) else tool.path

saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TRITON_PTXAS")}
bundled = pick()  # with no override: which bundled binary Triton picks for this arch
os.environ.update(saved)
path = pick()
binary = os.path.basename(bundled)
try:
    from triton import knobs
    env = inspect.getattr_static(knobs.nvidia, binary.replace("-", "_")).key
except Exception:  # before knobs (3.3): TRITON_<BINARY>_PATH, dash kept
    env = "TRITON_" + binary.upper() + "_PATH"
print(json.dumps({"triton": triton.__version__, "path": path, "binary": binary, "env": env,
                  "override": os.environ.get(env), "bundled": bundled}))
"""


def triton_ptxas(python: str, arch_number: int, timeout: float = 300.0) -> dict:
    """The ptxas Triton in ``python``'s environment uses for ``arch_number`` (e.g. 103).

    Runs Triton's own selection code in a child process with the current environment.

    Returns:
        ``{triton, path, binary, env, override, bundled}``: ``env`` is the variable that
        would override it, ``override`` its value here (or None).

    Raises:
        PtxasUsageError: the interpreter does not run or Triton does not import.
    """
    try:
        r = subprocess.run([python, "-c", _TRITON_PICK, str(arch_number)], capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PtxasUsageError(f"{python}: cannot run ({exc})") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise PtxasUsageError(f"{python}: Triton's ptxas choice could not be read ({last})")
    try:
        pick = json.loads((r.stdout.strip().splitlines() or [""])[-1])
        if not isinstance(pick, dict) or not isinstance(pick.get("path"), str) or not pick["path"]:
            raise ValueError("no ptxas path")
    except ValueError:
        raise PtxasUsageError(f"{python}: Triton's ptxas choice could not be read (the interpreter printed "
                              f"{r.stdout.strip()[-200:]!r}, not Triton's choice); give the service venv's "
                              "python, e.g. /opt/ddtree-ops/venv/bin/python") from None
    return pick


def check(target: str, ptx_version: str, ptxas: str | None = None, python: str | None = None) -> dict:
    """Pick the ptxas (given, or Triton's in ``python``), assemble, and report checks.

    Returns:
        ``{ok, checks: [{name, ok, detail}], ptxas: {...}, triton: {...} | None}``.

    Raises:
        PtxasUsageError: neither or both of ``ptxas`` / ``python``, or they do not run.
    """
    if (ptxas is None) == (python is None):
        raise PtxasUsageError("give exactly one of --ptxas PATH or --python VENV_PYTHON")
    checks, triton = [], None
    if python is not None:
        triton = triton_ptxas(python, int(re.sub(r"\D", "", target)))
        ptxas = triton["path"]
        fell_back = bool(triton["override"]) and os.path.realpath(triton["override"]) != os.path.realpath(ptxas)
        checks.append(
            {
                "name": "triton-ptxas",
                "ok": not fell_back,
                "detail": (
                    f"Triton {triton['triton']} ignored {triton['env']}={triton['override']} (it does not "
                    f"answer --version) and fell back to {ptxas}"
                    if fell_back
                    else f"Triton {triton['triton']} uses {ptxas} for {target} "
                    f"({triton['env']}={'unset' if not triton['override'] else triton['override']})"
                ),
            }
        )
    res = assemble(ptxas, target, ptx_version)
    detail = (f"ptxas {res['version']} ({ptxas}) assembled .version {ptx_version} .target {target}" if res["ok"] else
              f"ptxas {res['version']} ({ptxas}) cannot assemble .version {ptx_version} .target {target}: "
              f"{res['output'] or 'rc ' + str(res['rc'])}")
    checks.append({"name": f"ptxas-{target}", "ok": res["ok"], "detail": detail})
    return {"ok": all(c["ok"] for c in checks), "checks": checks, "ptxas": res, "triton": triton}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="PTX target, e.g. sm_103a")
    ap.add_argument("--ptx-version", required=True, help="PTX ISA version, e.g. 8.8")
    ap.add_argument("--ptxas", help="check this ptxas binary")
    ap.add_argument("--python", help="check the ptxas Triton in this interpreter's venv would use")
    ap.add_argument("--json", action="store_true", dest="as_json")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        result = check(args.target, args.ptx_version, args.ptxas, args.python)
    except PtxasUsageError as exc:
        result = {"ok": False, "checks": [{"name": "usage", "ok": False, "detail": str(exc)}]}
        rc = 2
    else:
        rc = 0 if result["ok"] else 1
    if args.as_json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        for c in result["checks"]:
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
