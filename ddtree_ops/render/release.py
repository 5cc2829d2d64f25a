"""Releases: the content key of a deployment and the layout of its release on the host.
One definition, used by ``ddtree-ops render`` (prints the id), the
``ddtree_render`` action plugin (returns it; the ``ddtree_service`` role installs the release
under it) and the host-side ``ddtree-ops release`` commands (:mod:`ddtree_ops.host.release`,
which re-check a release against its manifest before switching to it).

Layout on the host (``R`` = :func:`release_root`, ``{config_dir}/releases``)::

    R/<id>/ddtree-<name>.service   the rendered unit      (this release's bytes)
    R/<id>/<name>.env              the rendered env file
    R/<id>/plan.json               the rendered plan.json
    R/<id>/release.json            the manifest (:func:`manifest_text`): id, files + sha256, identity
    R/current -> <id>              relative symlink, switched atomically (symlink + rename)
    R/history                      ids in activation order, newest last (one per line)

The live paths are symlinks through ``current`` (:func:`live_links`)::

    /etc/systemd/system/ddtree-<name>.service -> R/current/ddtree-<name>.service
    {config_dir}/<name>.env                   -> releases/current/<name>.env
    {config_dir}/plan.json                    -> releases/current/plan.json

Why symlinks and not a unit that reads ``current`` itself: the unit's own bytes (``ExecStart``
argv, sandbox, timeouts) differ between releases, so the unit file must be part of the
release; a unit in ``/etc/systemd/system`` that is a symlink to a file of the same name is a
"linked" unit for systemd (systemd.unit(5), "Unit File Load Path"; ``systemctl enable`` and
``systemd-analyze verify`` accept it), and systemd reads it through the chain on every
``daemon-reload``. The unit, the health/warmup steps and the exporter keep reading the paths
they always read (``{config_dir}/plan.json``...), so switching ``current`` switches all of
them at once, and rollback is ``current`` -> the previous id + ``daemon-reload`` + restart.

Not in a release: the secrets file (``{config_dir}/secrets.env``, 0600: a secret rotation is no
new release, and a hash of secrets is never printed) and the ops venv (shared by every release
of the host; its version is part of the identity). The SGLang build is pinned, not copied: the
unit's ``ExecStart`` runs ``<sglang_venv>.builds/<build name>/bin/python`` (content-keyed:
:func:`ddtree_ops.config.build_id.build_name`, the directory the ``sglang`` role installs
into), recorded as ``identity.sglang_build`` in the manifest; the role removes only builds no
release on the host names (``ddtree-ops release prune-builds``), so a rollback across an SGLang
pin change runs the old build again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.release_layout import (
    CURRENT,
    FORMAT,
    HISTORY,
    ID_LENGTH,
    ID_RE,
    MANIFEST,
    MANIFEST_MODE,
    compute_id,
    file_entry,
)
from .files import RenderedFile, render_host

if TYPE_CHECKING:
    from ..config.load import Validated

__all__ = ["CURRENT", "FORMAT", "HISTORY", "ID_LENGTH", "ID_RE", "MANIFEST", "Release", "build_release",
           "compute_id", "file_entry", "identity", "live_links", "release_files", "release_result", "release_root"]


def release_root(v: Validated) -> str:
    """The host's release root of this deployment: ``{config_dir}/releases`` (root-owned, 0755)."""
    return f"{v.deployment.service.config_path}/releases"


def release_files(v: Validated) -> list[RenderedFile]:
    """The files that make up a release: the service component's non-secret files of
    :func:`~ddtree_ops.render.files.render_host` (unit, env file, plan.json), in that order."""
    return [f for f in render_host(v) if f.component == "service" and not f.secret]


def identity(v: Validated) -> dict:
    """What a release depends on beyond its files' bytes: the ddtree-ops version (the ops venv
    the unit runs health, warmup and the exporter from), the SGLang pin, the SGLang venv path
    and ``sglang_build``: the content-keyed build directory the release's unit runs
    (:func:`ddtree_ops.render.argv.unit_sglang_build`; None for the simulator). The host-side prune
    (``ddtree-ops release prune-builds``) keeps every build a kept release names here.
    JSON-ready, no secrets."""
    from .. import __version__
    from .argv import unit_sglang_build

    d = v.deployment
    return {"ddtree_ops": __version__, "sglang_pin": d.sglang.model_dump(mode="json"),
            "sglang_venv": d.service.sglang_venv_path, "sglang_build": unit_sglang_build(d)}


@dataclass(frozen=True)
class Release:
    """A rendered release.

    Attributes:
        id: content key (:func:`ddtree_ops.host.release.compute_id`).
        root: the release root on the host (:func:`release_root`).
        files: ``(name in the release dir, live path, RenderedFile)`` per file.
        manifest: the ``release.json`` text.
    """

    id: str
    root: str
    files: tuple[tuple[str, str, RenderedFile], ...]
    manifest: str

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.id}"


def build_release(v: Validated) -> Release:
    """The release of one validated deployment (pure: same input, same id and bytes)."""
    files = release_files(v)
    names = [f.path.rsplit("/", 1)[1] for f in files]
    if len(set(names)) != len(names):  # unit, <name>.env and plan.json: distinct by construction
        raise ValueError(f"release files with the same name: {names}")
    entries = [file_entry(n, f.content.encode("utf-8"), f.mode) for n, f in zip(names, files, strict=True)]
    ident = identity(v)
    rid = compute_id(entries, ident)
    manifest = json.dumps({"format": FORMAT, "id": rid, "files": entries, "identity": ident},
                          indent=2, sort_keys=True, allow_nan=False) + "\n"
    return Release(rid, release_root(v), tuple((n, f.path, f) for n, f in zip(names, files, strict=True)), manifest)


def live_links(rel: Release) -> list[dict]:
    """The live paths as symlinks into ``current`` (see the module docstring): ``{path, src}``.
    The unit's link is absolute (systemd resolves it from ``/etc/systemd/system``); the config
    dir's links are relative (``releases/current/...``), valid wherever the config dir is."""
    out = []
    for name, live, _f in rel.files:
        if live.rsplit("/", 1)[0] == rel.root.rsplit("/", 1)[0]:
            src = f"{rel.root.rsplit('/', 1)[1]}/{CURRENT}/{name}"
        else:
            src = f"{rel.root}/{CURRENT}/{name}"
        out.append({"path": live, "src": src})
    return out


def release_result(v: Validated) -> dict:
    """What the ``ddtree_render`` action returns as ``release`` (the role installs from it):
    ``id``, ``root``, ``dir``, ``keep`` (``ddtree_service.keep_releases``), ``files``
    (``{path in the release dir, content, mode}``, the manifest last), ``links`` (:func:`live_links`),
    ``current`` (the ``current`` switch's path: ``--check --diff`` compares the new files with it)."""
    rel = build_release(v)
    files = [{"path": f"{rel.dir}/{name}", "content": f.content, "mode": f.mode} for name, _live, f in rel.files]
    files.append({"path": f"{rel.dir}/{MANIFEST}", "content": rel.manifest, "mode": MANIFEST_MODE})
    return {"id": rel.id, "root": rel.root, "dir": rel.dir, "keep": v.deployment.service.keep_releases,
            "files": files, "links": live_links(rel), "current": f"{rel.root}/{CURRENT}"}
