"""Filters of ``playbooks/rolling.yml``: its per-host summary line, the failure reason and the
rollout summary, built in Python (:mod:`ddtree_ops.fleet.rollout`, unit-tested in
``tests/test_rollout.py``), so the play only moves data. Found through ``filter_plugins`` in
ansible.cfg.

* ``ddtree_roll_why(task_name, failed_result)``: ``<task>: <reason>`` (the gate's failing checks,
  else the task's message);
* ``ddtree_roll_line(host, from, to, t0, gate=..., failed=..., why=..., back=..., regate=...)``:
  one host's line (:func:`ddtree_ops.fleet.rollout.roll_line`);
* ``ddtree_roll_summary(hosts, lines)``: every host's line, in order, one per line;
* ``ddtree_roll_split(hosts, batches, multinode)``: ``""``, or the one line saying why the run's
  ``serial`` batches would restart a multi-node server's nodes apart (:func:`ddtree_ops.fleet.rollout.unit_split`);
* ``ddtree_release_current(list_result)``: the current release id of a registered
  ``ddtree-ops release list --json`` result, or None.
"""

from __future__ import annotations


class FilterModule:
    def filters(self):
        from ddtree_ops.fleet.rollout import release_current, roll_line, roll_summary, roll_why, unit_split

        return {"ddtree_roll_line": roll_line, "ddtree_roll_why": roll_why, "ddtree_roll_summary": roll_summary,
                "ddtree_release_current": release_current, "ddtree_roll_split": unit_split}
