"""Filter of the ``router`` role: its offline pip commands, built in Python
(:func:`ddtree_ops.fleet.router_wheelhouse.install_steps`, unit-tested in
``tests/test_router_role.py``), so the role only runs them.

* ``ddtree_router_install_steps(wheelhouse_result, venv, host_wheelhouse, host_ops_wheelhouse)``:
  ``[{"what", "argv"}]``.

Refusals are one ``AnsibleFilterError`` line.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _install_steps(result, venv, host_wheelhouse, host_ops_wheelhouse):
    from ddtree_ops.fleet.router_wheelhouse import RouterWheelhouseError, install_steps
    from ddtree_ops.sglang.wheelhouse import WheelhouseError

    try:
        return install_steps(dict(result), venv, host_wheelhouse, host_ops_wheelhouse)
    except (RouterWheelhouseError, WheelhouseError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"ddtree_router_install_steps: {exc}") from None


class FilterModule:
    def filters(self):
        return {"ddtree_router_install_steps": _install_steps}
