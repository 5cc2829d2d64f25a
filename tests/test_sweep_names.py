"""A sweep point may not be named like one of the sweep's own files in OUT (sweep.json, sweep.md,
restore.log): its result directory would take the file's place (a point ``sweep.json`` aborted
the sweep and lost its state). Refused when the sweep file is read, before any point runs."""

from __future__ import annotations

import pytest
import yaml

from ddtree_ops.fleet.sweep import OWN_FILES, SweepError, load_sweep


@pytest.mark.parametrize("name", ["sweep.json", "sweep.md", "restore.log", "Sweep.JSON"])
def test_point_named_like_a_file_of_the_sweep_is_refused(tmp_path, name):
    f = tmp_path / "s.yml"
    f.write_text(yaml.safe_dump({"host": "b300-01", "points": [
        {"name": "ok1", "set": {"ddtree_speculative.budget": 16}},
        {"name": name, "set": {"ddtree_speculative.budget": 32}}]}))
    with pytest.raises(SweepError, match="the sweep writes its own") as info:
        load_sweep(f)
    assert "\n" not in str(info.value) and "rename the point" in str(info.value)


def test_the_own_files_are_the_ones_run_sweep_writes(tmp_path):
    """The list is the one run_sweep writes with (one definition): every top-level name a sweep of
    invalid points leaves in OUT besides point directories is in it."""
    from helpers import base_hostvars

    from ddtree_ops.fleet.sweep import Point, run_sweep
    from ddtree_ops.runtime.bench import BenchOptions

    out = tmp_path / "out"
    pts = [Point("bad", {"ddtree_speculative.budget": -1})]
    run_sweep("b300-01", base_hostvars(), pts, BenchOptions(url="http://127.0.0.1:1"), [], out)
    assert set(p.name for p in out.iterdir()) <= OWN_FILES and {"sweep.json", "sweep.md"} <= OWN_FILES
