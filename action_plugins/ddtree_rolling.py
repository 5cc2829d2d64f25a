"""Ansible action ``ddtree_rolling``: ``playbooks/rolling.yml``'s inputs checked on the
controller before anything changes (its first play), by
:func:`ddtree_ops.host.release.rolling_settings` (the one definition of the rules).

Reads ``rolling_batches``, ``rolling_max_fail_percentage``, ``rolling_gate_deadline_s`` and the
router drain's ``rolling_router_deadline_s`` / ``rolling_router_in_flight_s`` from the play's
variables (``-e``, inventory) as given, so a Jinja expression is refused rather than run; absent
ones take the playbook's defaults. No options.

Returns the values normalised (``rolling_batches`` a list...). Fails with one line naming the
variable, its value, the rule and the fix.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        from ddtree_ops.host.release import ROLLING_DEFAULTS, ReleaseError, rolling_settings

        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        try:
            settings = rolling_settings({k: task_vars.get(k) for k in ROLLING_DEFAULTS})
        except ReleaseError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(changed=False, msg="rollout settings valid", **settings)
        return result
