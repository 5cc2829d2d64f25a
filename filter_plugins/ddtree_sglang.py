"""Filters of the ``sglang`` and ``ddtree_service`` roles: the offline pip commands, built in
Python (:mod:`ddtree_ops.sglang.wheelhouse`, unit-tested in ``tests/test_sglang_wheelhouse.py``),
so the roles only run them. Found through ``filter_plugins`` in ansible.cfg.

* ``ddtree_sglang_install_steps(wheelhouse_result, build, host_wheelhouse, host_ops_wheelhouse)``:
  ``[{"what", "argv"}]`` that install the build (:func:`ddtree_ops.sglang.wheelhouse.install_steps`;
  ``wheelhouse_result`` is the JSON the controller's wheelhouse tool printed: its ``lock`` and
  ``wheel``);
* ``ddtree_pip_offline_args(find_links)``: the offline ``pip install`` arguments as one string
  for ``ansible.builtin.pip``'s ``extra_args``
  (:func:`ddtree_ops.sglang.wheelhouse.offline_pip_args`).
"""

from __future__ import annotations

import shlex


def _install_steps(wheelhouse_result, build, host_wheelhouse, host_ops_wheelhouse):
    from ddtree_ops.sglang.wheelhouse import install_steps

    return install_steps(str(build), str(host_wheelhouse), str(host_ops_wheelhouse), wheelhouse_result["lock"],
                         wheelhouse_result["wheel"])


def _offline_args(find_links):
    from ddtree_ops.sglang.wheelhouse import offline_pip_args

    return shlex.join(offline_pip_args(str(find_links)))


class FilterModule:
    def filters(self):
        return {"ddtree_sglang_install_steps": _install_steps, "ddtree_pip_offline_args": _offline_args}
