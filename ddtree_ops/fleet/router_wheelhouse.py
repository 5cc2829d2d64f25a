"""Controller-side wheelhouse of the router: the pinned smg wheel and its dependencies, fetched
once, so router hosts install them with ``pip --no-index --find-links`` and need no internet.

Source of the pin: :data:`ddtree_ops.config.router.SMG_VERSION` / ``SMG_WHEEL`` / ``SMG_SHA256``
(smg 1.13.0 on PyPI); its dependencies are the wheel's ``Requires-Dist`` (setproctitle, grpcio,
grpcio-health-checking, pyyaml in 1.13.0), resolved by pip at build time and frozen in the
wheelhouse's manifest. Called by the ``router`` role (``delegate_to: localhost``)::

    python -m ddtree_ops.fleet.router_wheelhouse --out DIR [--python PY]

and prints one JSON object: ``{"ok", "dir", "id", "changed", "requirement", "wheel", "files",
"file_count", "size_bytes"}``; on refusal ``{"ok": false, "error"}`` and exit 2.

The directory is ``DIR/smg-<cpXY>-<id>``: ``id`` hashes the builder version, the pin (version,
wheel name, sha256) and the Python tag (grpcio and setproctitle are CPython-specific). It is
built in a temporary directory, the smg wheel's sha256 checked against the pin, and renamed into
place only when complete (under a lock), as :mod:`ddtree_ops.sglang.wheelhouse` does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..config.router import SMG_SHA256, SMG_VERSION, SMG_WHEEL
from ..python_tag import PYTHON_TAG_CODE
from ..sglang.wheelhouse import (
    WheelhouseError,
    _pip,
    _run,
    host_dir,
    offline_pip_args,
    publish_locked,
    sha256_file,
)

BUILDER_VERSION = "1"
MANIFEST = "wheelhouse.json"
NAME_PATTERN = r"^smg-cp[0-9]{2,3}-[0-9a-f]{16}$"
"""The names of router wheelhouse copies on a host (the role's cleanup removes no other name)."""


class RouterWheelhouseError(Exception):
    """The pinned smg cannot be fetched or is not the pinned file (the message names it and the fix)."""


def wheelhouse_id(python_tag: str) -> str:
    key = {"builder": BUILDER_VERSION, "python": python_tag, "version": SMG_VERSION, "wheel": SMG_WHEEL,
           "sha256": SMG_SHA256}
    return hashlib.sha256(json.dumps(key, sort_keys=True, allow_nan=False).encode()).hexdigest()[:16]


def _populate(python: str, dest: Path) -> dict[str, Any]:
    spec = f"smg=={SMG_VERSION}"
    _run([*_pip(python), "download", "--only-binary", ":all:", "-d", str(dest), spec], f"pip download {spec}")
    wheel = dest / SMG_WHEEL
    if not wheel.is_file():
        got = sorted(p.name for p in dest.glob("smg-*"))
        raise RouterWheelhouseError(f"pip download {spec} gave {got}, not the pinned {SMG_WHEEL} "
                                    "(ddtree_ops/config/router.py SMG_WHEEL). Fix: run on x86_64 Linux, or pin the "
                                    "wheel this platform gets")
    got = sha256_file(wheel)
    if got != SMG_SHA256:
        raise RouterWheelhouseError(f"{SMG_WHEEL}: SHA-256 is {got}, but SMG_SHA256 = {SMG_SHA256}: not the wheel "
                                    "that was pinned. Fix: check the index pip used; if it is the right build, pin "
                                    "its sha256")
    files = {f.name: sha256_file(f) for f in sorted(dest.iterdir()) if f.is_file()}
    manifest = {"requirement": spec, "wheel": SMG_WHEEL, "files": files}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return manifest


def build(out: Path, python: str = sys.executable) -> dict[str, Any]:
    """Build (or reuse) the router wheelhouse under ``out``; a reused one is checked file by file
    against its manifest (a file changed since: refused)."""
    tag = _run([python, "-c", PYTHON_TAG_CODE], "reading the Python tag").strip()
    if not re.fullmatch(r"cp[0-9]{2,3}", tag):
        raise RouterWheelhouseError(f"--python {python!r}: tag {tag!r} is not CPython's. Fix: use the hosts' CPython")
    final = out / f"smg-{tag}-{wheelhouse_id(tag)}"
    out.mkdir(parents=True, exist_ok=True)
    def populate(work: Path) -> None:
        (work / "wheels").mkdir()
        _populate(python, work / "wheels")

    changed = publish_locked(out, final, ".lock-router", populate)
    manifest = json.loads((final / MANIFEST).read_text())
    files = manifest.pop("files")
    for name, digest in files.items():
        if sha256_file(final / name) != digest:
            raise RouterWheelhouseError(f"{final / name}: changed since the wheelhouse was built. Fix: remove "
                                        f"{final} and run again")
    return {"ok": True, "dir": str(final), "id": final.name, "changed": changed, **manifest,
            "file_count": len(files), "size_bytes": sum((final / n).stat().st_size for n in files)}


def install_steps(result: dict[str, Any], venv: str, wheelhouse: str, ops_wheelhouse: str) -> list[dict[str, Any]]:
    """The offline pip commands of the ``router`` role (``ddtree_router_install_steps`` filter):
    the pinned smg with its dependencies from the host copy ``wheelhouse`` of :func:`build`'s
    ``result`` (no index: only its files), then ddtree-ops ``--no-deps`` from ``ops_wheelhouse``
    (the key launcher and :mod:`.router_worker`; both standard library + smg only).

    Raises:
        WheelhouseError: a path that is not a host directory
            (:func:`ddtree_ops.sglang.wheelhouse.host_dir`).
        RouterWheelhouseError: ``result`` does not name the pinned requirement.
    """
    named = result.get("requirement") if isinstance(result, dict) else result
    if named != f"smg=={SMG_VERSION}":
        raise RouterWheelhouseError(f"router wheelhouse result names {str(named)[:80]!r}, not smg=={SMG_VERSION}. "
                                    "Fix: run the role's wheelhouse task (tag always)")
    pip = [f"{host_dir('ddtree_router.venv', venv)}/bin/python", "-m", "pip", "install", "-q"]
    return [{"what": f"smg=={SMG_VERSION} and its dependencies",
             "argv": [*pip, *offline_pip_args(wheelhouse), f"smg=={SMG_VERSION}"]},
            {"what": "ddtree-ops without its dependencies (key launcher, worker API client)",
             "argv": [*pip, *offline_pip_args(ops_wheelhouse), "--no-deps", "ddtree-ops"]}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree_ops.fleet.router_wheelhouse",
                                 description="Build (once) the controller wheelhouse of the pinned smg router.")
    ap.add_argument("--out", type=Path, required=True, help="cache directory")
    ap.add_argument("--python", default=sys.executable, help="interpreter for pip (its CPython tag = the hosts')")
    a = ap.parse_args(argv)
    try:
        result = build(a.out, a.python)
    except (RouterWheelhouseError, WheelhouseError, OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}, allow_nan=False))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
