"""``ddtree-ops release running``: does the unit run the release ``current`` names? A deploy cut off
after the activation switched ``current`` leaves the old process serving; its re-run must see that
(and restart) although it changes no file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree_ops.host.release import ReleaseError
from ddtree_ops.host.release_running import running

RID = "3efecb838ef7"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "releases"
    (r / RID).mkdir(parents=True)
    r.chmod(0o755)
    (r / "current").symlink_to(RID)
    return r


def _props(started_s_ago: float, state: str = "active", reload: str = "no", load: str = "loaded") -> dict:
    return {"LoadState": load, "ActiveState": state, "SubState": "running", "NeedDaemonReload": reload,
            "ExecMainStartTimestampMonotonic": str(int((time.monotonic() - started_s_ago) * 1e6))}


def test_a_process_older_than_the_switch_is_stale(root):
    res = running(root, "ddtree-sglang.service", _props(started_s_ago=60))
    assert res["stale"] and res["current"] == RID and "started before current was switched" in res["why"], res


def test_a_process_started_after_the_switch_of_the_loaded_unit_runs_the_current_release(root):
    os.utime(root / "current", (time.time() - 30, time.time() - 30), follow_symlinks=False)
    res = running(root, "ddtree-sglang.service", _props(started_s_ago=5))
    assert not res["stale"], res


@pytest.mark.parametrize("props, says", [
    # restarted after the switch but without a reload: systemd ran the cached unit of the release before
    ({"reload": "yes"}, "changed on disk since systemd loaded it"),
    ({"state": "failed"}, "is 'failed'"),
    ({"state": "inactive"}, "runs no release"),
    ({"load": "not-found"}, "not loaded"),
])
def test_a_unit_that_does_not_run_the_loaded_current_file_is_stale(root, props, says):
    os.utime(root / "current", (time.time() - 30, time.time() - 30), follow_symlinks=False)
    res = running(root, "ddtree-sglang.service", _props(started_s_ago=5, **props))
    assert res["stale"] and says in res["why"], res


def test_a_unit_that_never_started_is_stale(root):
    res = running(root, "ddtree-sglang.service", {**_props(0), "ExecMainStartTimestampMonotonic": "0"})
    assert res["stale"], res


@pytest.mark.parametrize("unit", ["sglang", "../x.service", "a b.service", "x.service\n", ""])
def test_a_bad_unit_name_is_refused_before_systemctl_runs(root, unit):
    with pytest.raises(ReleaseError, match="not a service unit name"):
        running(root, unit, _props(0))


def test_no_current_release_is_nothing_to_restart(root):
    (root / "current").unlink()
    assert running(root, "ddtree-sglang.service", {})["stale"] is False


def test_the_cli_asks_systemctl_and_prints_one_json_object(root, tmp_path):
    """Through the CLI the role runs, with a systemctl double that answers as systemd would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = int((time.monotonic() - 120) * 1e6)
    (bin_dir / "systemctl").write_text("#!/bin/sh\nprintf 'LoadState=loaded\\nActiveState=active\\nSubState=running\\n"
                                       f"NeedDaemonReload=no\\nExecMainStartTimestampMonotonic={started}\\n'\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    p = subprocess.run([sys.executable, "-m", "ddtree_ops", "release", "running", "--root", str(root), "--unit",
                        "ddtree-sglang.service", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["stale"] and doc["current"] == RID, doc
