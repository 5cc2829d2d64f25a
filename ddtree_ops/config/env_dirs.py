"""Directories the server writes that ``ddtree_service.env`` names (cache and output directories).

The unit runs with ``ProtectSystem=strict`` (systemd.exec(5): the whole file system is read-only
to the service except ``ReadWritePaths=``, its ``RuntimeDirectory=`` and its private ``/tmp``);
ddtree-ops opens only the instance's ``state_dir`` and ``cache_dir``
(:func:`~.sandbox.unit_sandbox`) and points every cache it knows inside them
(:func:`~.instance.cache_env`). A cache variable set in ``ddtree_service.env`` replaces that
per-instance value: outside those two trees the server cannot write it (Triton, DeepGEMM and
FlashInfer fail on their first compile, long after the deploy looked fine), and nothing would keep
two instances on one machine from sharing it (one instance's JIT cache half-written under the
other's reads). Inside them it is the instance's own and the fleet checks see it
(:func:`~.instance.state_dirs`).
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import Finding
from .instance import cache_env, written_dirs_from_env
from .models import Deployment
from .plan import Plan

SOURCE = "systemd.exec(5) ProtectSystem=strict, ReadWritePaths=; SGLang 0.5.23 sglang/srt/environ.py"


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def rule_env_dirs(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Each cache / output directory ``ddtree_service.env`` sets
    (:data:`~.instance.WRITTEN_DIR_ENV`) is an absolute path inside the instance's ``cache_dir`` or
    ``state_dir`` (error otherwise); one that replaces a per-instance default of the unit
    (:func:`~.instance.cache_env`) is said (info), so the replacement is never silent."""
    svc = d.service
    own = cache_env(d)
    trees = (svc.cache_path, svc.state_path)
    for field, path in written_dirs_from_env(d):
        name = field.rsplit(".", 1)[1]
        default = own.get(name) or f"{svc.cache_path}/{name.lower().removesuffix('_dir').replace('_', '-')}"
        if not path.startswith("/") or "/../" in f"{path}/" or "/./" in f"{path}/":
            yield Finding("error", field, path,
                          "a directory the server writes must be an absolute path without . or .. parts (a relative "
                          "one resolves against the unit's working directory)",
                          f"use {default}, or remove it", SOURCE)
        elif not any(_under(path, t) for t in trees):
            yield Finding("error", field, path,
                          f"the server writes this directory, but it lies outside the instance's cache_dir "
                          f"({svc.cache_path}) and state_dir ({svc.state_path}): the unit runs with "
                          "ProtectSystem=strict and ReadWritePaths= opens only those two, so it is read-only to the "
                          "server, and another instance on the machine could share it",
                          f"remove it (the unit sets {name}={own[name]} per instance)" if name in own
                          else f"point it inside ddtree_service.cache_dir, e.g. {default}", SOURCE)
        elif name in own and path != own[name]:
            yield Finding("info", field, path,
                          f"replaces the unit's per-instance {name}={own[name]} (ddtree_service.env wins)",
                          "nothing to do if that is meant; remove it to keep the default", SOURCE)
