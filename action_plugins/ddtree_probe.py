"""Ansible action ``ddtree_probe``: read the capability probe's output on the controller, so
the ``sglang`` role formats and judges nothing in YAML (logic lives in Python).

Runs on the controller only. Options: ``stdout`` and ``stderr`` of
``<sglang-venv>/bin/python -m ddtree_ops.sglang.probe --request - --json`` run on the host.
Returns ``probe`` (the report: :func:`ddtree_ops.sglang.probe.read_report`; a crash before any
output is a failed report naming the last line of stderr), ``ok``, ``lines`` (its text form:
:func:`~ddtree_ops.sglang.probe.report_lines`) and ``failure`` (the failed checks' details:
:func:`~ddtree_ops.sglang.probe.failure_detail`). Never fails itself: the role decides what a
failed probe stops.
"""

from __future__ import annotations

import json

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # Reads and computes only (nothing on the host changes): runs under --check as well.
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        from ddtree_ops.sglang.probe import failure_detail, read_report, report_lines

        result = super().run(tmp, task_vars)
        stdout = self._task.args.get("stdout") or ""
        if isinstance(stdout, (dict, list)):  # a templating layer that turned the JSON text into data
            stdout = json.dumps(stdout)
        report = read_report(str(stdout), str(self._task.args.get("stderr") or ""))
        result.update(changed=False, probe=report, ok=report["ok"], lines=report_lines(report),
                      failure=failure_detail(report))
        return result
