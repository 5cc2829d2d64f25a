"""Filters of the ``sglang`` and ``ddtree_service`` roles: the offline pip commands, built in
Python (:mod:`ddtree_ops.sglang.wheelhouse`, unit-tested in ``tests/test_sglang_wheelhouse.py``),
so the roles only run them. Found through ``filter_plugins`` in ansible.cfg.

* ``ddtree_sglang_install_steps(wheelhouse_result, build, host_wheelhouse, host_ops_wheelhouse)``:
  ``[{"what", "argv"}]`` that install the build (:func:`ddtree_ops.sglang.wheelhouse.install_steps`;
  ``wheelhouse_result`` is the JSON the controller's wheelhouse tool printed: its ``lock`` and
  ``wheel``);
* ``ddtree_pip_offline_args(find_links)``: the offline ``pip install`` arguments as one string
  for ``ansible.builtin.pip``'s ``extra_args``
  (:func:`ddtree_ops.sglang.wheelhouse.offline_pip_args`);
* ``ddtree_wheelhouse_patterns(kind)``: the regexes of the wheelhouse directory names the roles'
  cleanup may remove (:data:`ddtree_ops.config.build_id.WHEELHOUSE_NAME_PATTERNS`).

Refusals are one ``AnsibleFilterError`` line (field, value cut to 200 characters, rule, fix).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


def _install_steps(wheelhouse_result, build, host_wheelhouse, host_ops_wheelhouse):
    from ddtree_ops.sglang.wheelhouse import WheelhouseError, _shown, install_steps

    if not isinstance(wheelhouse_result, Mapping) or not {"lock", "wheel"} <= set(wheelhouse_result):
        raise AnsibleFilterError(
            f"ddtree_sglang_install_steps: the wheelhouse result = {_shown(wheelhouse_result)}: must be the JSON "
            "object python -m ddtree_ops.sglang.wheelhouse printed (with lock and wheel). Fix: do not set _sglang_wh; "
            "run the role's wheelhouse tasks (tag always)")
    try:
        return install_steps(build, host_wheelhouse, host_ops_wheelhouse, wheelhouse_result["lock"],
                             wheelhouse_result["wheel"])
    except WheelhouseError as exc:  # one line, no traceback; the host paths come from sglang_host_wheelhouse
        raise AnsibleFilterError(f"{exc} (the host paths are under sglang_host_wheelhouse)") from None


def _offline_args(find_links):
    from ddtree_ops.sglang.wheelhouse import WheelhouseError, offline_pip_args

    try:
        return shlex.join(offline_pip_args(find_links))
    except WheelhouseError as exc:
        raise AnsibleFilterError(
            f"ddtree_pip_offline_args: {exc} (the path is under ddtree_service_host_wheelhouse)") from None


def _wheelhouse_patterns(kind):
    from ddtree_ops.config.build_id import WHEELHOUSE_NAME_PATTERNS

    if kind not in WHEELHOUSE_NAME_PATTERNS:
        raise AnsibleFilterError(f"ddtree_wheelhouse_patterns: kind = {kind!r:.200}: must be one of "
                                 f"{sorted(WHEELHOUSE_NAME_PATTERNS)}")
    return list(WHEELHOUSE_NAME_PATTERNS[kind])


class FilterModule:
    def filters(self):
        return {"ddtree_sglang_install_steps": _install_steps, "ddtree_pip_offline_args": _offline_args,
                "ddtree_wheelhouse_patterns": _wheelhouse_patterns}
