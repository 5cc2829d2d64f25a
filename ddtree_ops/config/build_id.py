"""The names of SGLang builds and wheelhouses: content keys of what determines their bytes (the
pin, its lock and patches, the Python tag, the ddtree-ops source), the one definition the
controller's renderer (:func:`ddtree_ops.render.argv.sglang_build_path`), the wheelhouse builder
(:mod:`ddtree_ops.sglang.wheelhouse`) and the host-side prune
(:func:`ddtree_ops.host.release.prune_builds`) all use (standard library only)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

BUILDER_VERSION = "1"
"""Bumped when the wheelhouse layout changes (part of the id)."""

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MANIFEST = "wheelhouse.json"
LOCK_NAME = "requirements.lock"


class WheelhouseError(Exception):
    """A pin that cannot be fetched or built; the message names the field, value, rule and fix."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _resolve(path: str, root: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else root / p


def _need_file(field: str, path: str, root: Path) -> Path:
    p = _resolve(path, root)
    if not p.is_file():
        raise WheelhouseError(f"ddtree_sglang.{field} = {path!r}: no such file on the controller ({p}). "
                              f"Fix: give an existing path (relative paths start at {root})")
    return p


def wheelhouse_id(pin: dict[str, Any], root: Path, python_tag: str) -> str:
    """Content key of the wheelhouse for ``pin`` (16 hex digits).

    Raises:
        WheelhouseError: a lock or patch file named by the pin is missing.
    """
    # A simulator host's install_release is a PyPI download of the same release: same key.
    source = "pypi" if pin["source"] == "simulator" else pin["source"]
    key: dict[str, Any] = {"builder": BUILDER_VERSION, "python": python_tag, "source": source,
                           "version": pin.get("version")}
    if pin["source"] == "wheel":
        key.update(sha256=pin.get("sha256"))
    elif pin["source"] == "git":
        key.update(repo=pin.get("repo"), commit=pin.get("commit"),
                   patches=[p["sha256"] for p in pin.get("patches") or []])
    if pin.get("requirements"):
        key["lock"] = sha256_file(_need_file("requirements", pin["requirements"], root))
    return hashlib.sha256(json.dumps(key, sort_keys=True, allow_nan=False).encode()).hexdigest()[:16]


OPS_ID_LENGTH = 12
"""Hex digits of :func:`ops_source_id`."""


@functools.lru_cache(maxsize=8)
def ops_source_id(root: Path = PROJECT_ROOT) -> str:
    """Content key of the ddtree-ops code at ``root`` (12 hex digits): sha256 over every
    ``ddtree_ops/**/*.py`` (each as its path relative to ``root``, a NUL, its size, a NUL, its
    bytes; paths sorted). The package's own files only, so a checkout and an installed wheel of
    the same code give the same id (``ddtree-ops render`` from either names the same build).
    :func:`build_name` uses it (the code installed ``--no-deps`` into an SGLang build);
    :func:`ops_wheelhouse_id` adds ``pyproject.toml`` for the ops wheelhouse (which holds the
    dependencies too)."""
    h = hashlib.sha256()
    files = sorted((root / "ddtree_ops").rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    for f in files:
        data = f.read_bytes()
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()[:OPS_ID_LENGTH]


def ops_wheelhouse_id(root: Path = PROJECT_ROOT) -> str:
    """Content key of the ddtree-ops wheelhouse built from the project at ``root`` (12 hex
    digits): sha256 over ``pyproject.toml`` (the dependencies) and :func:`ops_source_id`.
    ``scripts/build-wheelhouse.sh`` names its directory ``<cpXY>-<this id>`` (``--ops-wheelhouse-id``)."""
    pyproject = root / "pyproject.toml"
    data = pyproject.read_bytes() if pyproject.is_file() else b""
    return hashlib.sha256(data + b"\0" + ops_source_id(root).encode()).hexdigest()[:OPS_ID_LENGTH]


BUILD_RE = re.compile(r"^cp[0-9]{2,3}-[0-9a-f]{16}-[0-9a-f]{12}$")
"""The shape of an SGLang build's directory name (:func:`build_name`); the host-side prune
(:func:`ddtree_ops.host.release.prune_builds`) touches no other name."""


WHEELHOUSE_NAME_PATTERNS: dict[str, list[str]] = {
    "sglang": [r"^cp[0-9]{2,3}-[0-9a-f]{16}$", rf"^ops-[0-9a-f]{{{OPS_ID_LENGTH}}}$"],
    "ops": [rf"^cp[0-9]{{2,3}}-[0-9a-f]{{{OPS_ID_LENGTH}}}$"],
}
"""The names of the wheelhouse copies on a host, the only directories the roles' cleanup of earlier
wheelhouses removes (``ansible.builtin.find`` ``patterns``, ``use_regex``, through the
``ddtree_wheelhouse_patterns`` filter): ``sglang``: ``sglang_host_wheelhouse``'s
``<cpXY>-<wheelhouse_id>`` (:func:`build`'s ``id``) and ``ops-<ops_source_id>``; ``ops``:
``ddtree_service_host_wheelhouse``'s ``<cpXY>-<ops_wheelhouse_id>`` (``scripts/build-wheelhouse.sh``).
A host wheelhouse variable set to a shared directory (``/opt``, ``/``) then loses nothing else."""


def build_name(pin: dict[str, Any], root: Path, tag: str, ops_id: str) -> str:
    """The directory name of the SGLang build of ``pin`` under ``<sglang_venv>.builds/``:
    ``<cpXY>-<wheelhouse_id>-<ops_source_id>`` (the SGLang wheelhouse and the ddtree-ops wheel
    installed into it). The one definition: the ``sglang`` role installs into it (the
    wheelhouse CLI prints it as ``build``) and a release's unit runs it
    (:func:`ddtree_ops.render.argv.sglang_build_path`), so a rolled-back release runs the build it
    was rendered for.

    Raises:
        WheelhouseError: a lock file named by the pin is missing on the controller.
    """
    return f"{tag}-{wheelhouse_id(pin, root, tag)}-{ops_id}"
