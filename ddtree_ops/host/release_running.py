"""Is the running unit the current release? (``ddtree-ops release running``; standard library only).

A deploy restarts the service because the unit systemd runs is not the release ``current``
names, not because this run changed a file: a run cut off after ``release activate`` switched
``current`` (before its restart handler ran) leaves the old process serving the old settings,
and the re-run finds nothing to change (activation answers "already current"). The
``ddtree_service`` role asks this right after the activation and notifies its restart handler
when the answer is "stale".

The unit runs the current release only when all of these hold (systemd's own properties,
``systemctl show``; systemd.exec(5), org.freedesktop.systemd1(5)):

* the unit is loaded and ``active``/``activating``/``reloading`` (a failed or stopped unit runs nothing);
* ``NeedDaemonReload=no``: systemd loaded the unit file as it is on disk now; the live unit is a
  symlink through ``current``, so after a switch it reads "yes" until a ``daemon-reload``;
* its main process started after ``current`` was last switched (``ExecMainStartTimestampMonotonic``
  against the switch time: ``current`` is made fresh by every switch, :func:`ddtree_ops.host.release._switch`,
  so its own mtime is the switch time): a process older than the switch read the env file and
  plan.json of the release before, whatever systemd has loaded since.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from .release import CURRENT, ReleaseError, _shown, open_root, read_current

UNIT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,250}\.service$")
"""A service unit name (what :attr:`ddtree_ops.config.service_models.Service.unit_name` renders)."""
SYSTEMCTL_TIMEOUT_S = 30.0
"""Longest one ``systemctl show`` may take."""
RUNNING_STATES = ("active", "activating", "reloading")
"""ActiveStates in which the unit's main process runs."""


def unit_properties(unit: str, systemctl: str = "systemctl") -> dict[str, str]:
    """``systemctl show UNIT`` of the properties :func:`running` reads.

    Raises:
        ReleaseError: systemctl is missing, fails or does not answer within :data:`SYSTEMCTL_TIMEOUT_S`.
    """
    props = ["LoadState", "ActiveState", "SubState", "NeedDaemonReload", "ExecMainStartTimestampMonotonic"]
    argv = [systemctl, "show", unit, "--no-pager"] + [f"--property={p}" for p in props]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"systemctl show {unit}: {exc}; cannot tell which release the unit runs") from None
    if proc.returncode != 0:
        raise ReleaseError(f"systemctl show {unit} exited {proc.returncode}: {_shown(proc.stderr.strip(), 200)}")
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def running(root: Path, unit: str, props: dict[str, str] | None = None) -> dict:
    """Whether ``unit`` runs the release ``current`` under ``root`` names.

    Returns:
        ``{root, unit, current, stale, why}``: ``stale`` True when the unit must be restarted to run
        the current release (``why`` says which condition of the module docstring failed).

    Raises:
        ReleaseError: a bad unit name, an unsafe root or ``current`` (:func:`open_root`,
            :func:`read_current`), or systemctl not answering.
    """
    if not isinstance(unit, str) or not UNIT_RE.fullmatch(unit):
        raise ReleaseError(f"--unit {_shown(unit)}: not a service unit name (such as ddtree-sglang.service)")
    fd = open_root(root)
    try:
        current = read_current(fd, root)
        switched = os.stat(CURRENT, dir_fd=fd, follow_symlinks=False).st_mtime_ns if current else None
    finally:
        os.close(fd)
    out = {"root": str(root), "unit": unit, "current": current, "stale": False, "why": ""}
    if current is None:
        out["why"] = "no current release: nothing to run"
        return out
    p = props if props is not None else unit_properties(unit)
    # the switch time on the monotonic clock systemd's *Monotonic properties use (CLOCK_MONOTONIC)
    switched_mono_us = (switched - (time.time_ns() - time.monotonic_ns())) // 1000
    try:
        started_us = int(p.get("ExecMainStartTimestampMonotonic") or 0)
    except ValueError:
        started_us = 0
    state = p.get("ActiveState", "?")
    if p.get("LoadState") != "loaded":
        why = f"unit {unit} is not loaded ({_shown(p.get('LoadState'), 40)})"
    elif state not in RUNNING_STATES:
        why = f"unit {unit} is {_shown(state, 40)} ({_shown(p.get('SubState'), 40)}): it runs no release"
    elif p.get("NeedDaemonReload") == "yes":
        why = (f"unit {unit}: its file changed on disk since systemd loaded it (current is {current}); "
               "systemd would restart the unit of the release before")
    elif started_us <= 0 or started_us < switched_mono_us:
        why = (f"unit {unit}: its process started before current was switched to {current} "
               "(it serves the settings of the release before)")
    else:
        why = ""
    out.update(stale=bool(why), why=why or f"unit {unit} runs release {current} (started after the switch)")
    return out
