"""Ansible's ``linear`` strategy on Mitogen (ansible.cfg: ``strategy = mitogen_linear``).

Mitogen keeps one Python interpreter per host alive for the whole run and runs modules in it,
instead of a fresh ``ssh`` + ``python3`` + AnsiballZ unpack per task: the no-change
``deploy.yml`` run on one test host went from 38 s to about 15 s (figures in
docs/performance.md, ``scripts/bench-deploy.py``). Mitogen's own documentation installs it by pointing
``strategy_plugins`` at ``ansible_mitogen/plugins/strategy`` inside the installed package; that
path differs per venv, so this file re-exports the installed package's class from a path that
is this checkout's own.

Requires the ``controller`` extra (``mitogen``, pinned in constraints.txt). Without it the run
stops at start with one line saying how to install it or how to run on the stock strategy
(``ANSIBLE_STRATEGY=linear``): the playbooks do not depend on Mitogen, only their speed does.

Imports warmed in the parent: Ansible runs each task in a worker process forked from the
strategy's process, and this checkout's action plugins (``ddtree_render`` ten times per host
per deploy) import the pydantic config model, the renderer and the checkpoint reader. Imported
once here, every fork inherits them: measured 13.7 s -> 11.0 s for the no-change run on one
host. A controller without ddtree-ops importable skips the warm-up; the action plugins then
say so themselves.
"""

from __future__ import annotations

import importlib

from ansible.errors import AnsibleError

try:
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by tests/test_strategy.py in a subprocess
    raise AnsibleError(
        f"strategy mitogen_linear (ansible.cfg): Mitogen is not importable ({exc}). Fix: install the controller "
        "extra (pip install -c constraints.txt 'ddtree-ops[controller]'), or run on Ansible's stock strategy "
        "with ANSIBLE_STRATEGY=linear (slower, same result)."
    ) from exc

_WARM = (
    "ddtree_ops.config", "ddtree_ops.config.checkpoint", "ddtree_ops.config.errors", "ddtree_ops.config.fleet",
    "ddtree_ops.config.hostvars", "ddtree_ops.config.load", "ddtree_ops.config.models",
    "ddtree_ops.config.multinode_fleet", "ddtree_ops.config.router", "ddtree_ops.config.toolchain",
    "ddtree_ops.host.release", "ddtree_ops.fleet.rollout", "ddtree_ops.host.toolkit",
    "ddtree_ops.python_tag", "ddtree_ops.render", "ddtree_ops.render.argv", "ddtree_ops.render.files",
    "ddtree_ops.render.monitoring", "ddtree_ops.render.release", "ddtree_ops.render.router",
    "ddtree_ops.sglang.expect", "ddtree_ops.sglang.probe",
)
for _name in _WARM:
    try:
        importlib.import_module(_name)
    except ImportError:  # the action plugins report a missing ddtree-ops in their own words
        break
