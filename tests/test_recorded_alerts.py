"""The acceptance-collapse alert over what the exporter really printed against real SGLang.

The rule tests in test_monitoring.py feed promtool series written by hand. Here the series are
the exporter's own scrapes, recorded while real SGLang 0.5.17 served on an H200
(``scripts/gpu-acceptance/run.sh``: three servers, an exporter each, ``/metrics`` of the exporter
read every 2 s under bench load). So the names, labels and gating the rule relies on are the ones
the exporter emits against the real server, not the ones the tests assumed:

* EAGLE3 with the config-only (random-weight) draft accepted ~1.016 tokens per verify pass:
  a collapse, and the alert must fire;
* DFLASH accepted ~3.05: above the floor, no alert;
* the baseline (no speculation) has no acceptance length and ``ddtree_speculative_enabled 0``.

That run's exporters ran from ``--upstream`` alone, so they print no floor; the floor series is
the one the rendered deployment's exporter printed in the same session (``rendered/``: 1.5 from
plan.json), given each server's labels. The scrapes are replayed one per promtool interval
(one minute), so the 2 s cadence of the recording is stretched: what is under test is which
series exist with which labels and values, and that the rule fires on them after ``collapse_for``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_monitoring import _annotations

from ddtree_ops.render.monitoring import AlertSettings, alert_rules, render_rules

pytestmark = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed (scripts/setup.sh)")

RUN = Path(__file__).parent / "fixtures" / "gpu" / "acceptance-sglang-0.5.17-h200-2026-12-02"
SERVERS = {"19400": "EAGLE3", "19401": "NONE", "19402": "DFLASH"}  # exporter port -> algorithm (run.sh)
NAMES = ("ddtree_accept_length", "ddtree_speculative_enabled")


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """(name, sorted labels) -> value of the gauges the rule reads, from one recorded scrape."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in (*NAMES, "ddtree_accept_length_floor"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _recorded_floor() -> float:
    floors = [v for (name, _), v in _samples((RUN / "rendered" / "exporter_after_gate.txt").read_text()).items()
              if name == "ddtree_accept_length_floor"]
    assert len(floors) == 1, floors
    return floors[0]


def _input_series(floor: float) -> tuple[list[dict], dict[str, dict], int]:
    """promtool input series (one scrape a minute) of every server, its labels by algorithm,
    and the number of scrapes."""
    scrapes = sorted(RUN.glob("exporter_19400_load_*.txt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    n = len(scrapes)
    series, labels_of = [], {}
    for port, algo in SERVERS.items():
        per_scrape = [_samples((RUN / f"exporter_{port}_load_{i}.txt").read_text()) for i in range(1, n + 1)]
        keys = {k for s in per_scrape for k in s}
        labels = {dict(lab)["host"]: dict(lab) for _, lab in keys}
        assert len(labels) == 1, labels  # one server per exporter
        raw = next(iter(labels.values()))
        # An empty label value is no label to Prometheus (the run had no host class: host_class="").
        lab = {k: v for k, v in raw.items() if v != ""}
        labels_of[algo] = lab
        text = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
        for name in NAMES:
            key = (name, tuple(sorted(raw.items())))
            values = " ".join(repr(s[key]) if key in s else "_" for s in per_scrape)
            series.append({"series": f"{name}{{{text}}}", "values": values})
        series.append({"series": f"ddtree_accept_length_floor{{{text}}}", "values": f"{floor!r}x{n - 1}"})
    return series, labels_of, n


def _promtool(tmp_path: Path, series: list[dict], tests: list[dict]) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "rules.yml"
    rules.write_text(render_rules())
    t = tmp_path / "test.yml"
    t.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                 "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]},
                                sort_keys=False))
    return subprocess.run(["promtool", "test", "rules", str(t)], capture_output=True, text=True, timeout=60)


def _minutes(duration: str) -> int:
    m = re.fullmatch(r"(\d+)m", duration)
    assert m, f"collapse_for {duration!r} is not whole minutes; this test replays one scrape a minute"
    return int(m.group(1))


def test_collapse_fires_on_the_real_eagle3_scrapes_only(tmp_path) -> None:
    floor = _recorded_floor()
    series, labels_of, n = _input_series(floor)
    rule = next(r for r in alert_rules() if r["alert"] == "DDTreeAcceptLengthCollapse")
    # The recording itself: the EAGLE3 exporter printed an acceptance length below the floor,
    # DFLASH one above it, the baseline none at all (speculation off).
    eagle = [s for s in series if s["series"].startswith("ddtree_accept_length{") and
             f'host="{labels_of["EAGLE3"]["host"]}"' in s["series"]][0]["values"].split()
    first = next(i for i, v in enumerate(eagle) if v != "_")
    assert all(float(v) < floor for v in eagle[first:]), eagle
    none = [s for s in series if s["series"].startswith("ddtree_accept_length{") and
            f'host="{labels_of["NONE"]["host"]}"' in s["series"]][0]["values"].split()
    assert set(none) == {"_"}
    for_m = _minutes(AlertSettings().collapse_for)
    fires_at = first + for_m  # minute the condition has held for collapse_for
    assert fires_at < n, f"the recording ({n} scrapes) is too short for collapse_for {for_m}m"
    value = float(eagle[fires_at])
    lab = labels_of["EAGLE3"]
    expected = [{"exp_labels": {**lab, **rule["labels"]}, "exp_annotations": _annotations(rule, lab, value)}]
    tests = [
        {"eval_time": f"{fires_at - 1}m", "alertname": rule["alert"], "exp_alerts": []},  # still pending
        {"eval_time": f"{fires_at}m", "alertname": rule["alert"], "exp_alerts": expected},
        {"eval_time": f"{n - 1}m", "alertname": rule["alert"], "exp_alerts": [
            {**expected[0], "exp_annotations": _annotations(rule, lab, float(eagle[n - 1]))}]},
    ]
    r = _promtool(tmp_path, series, tests)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_alert_when_the_floor_is_below_what_was_recorded(tmp_path) -> None:
    """The harness can fail, and the rule reads the floor: with a floor of 1.0 the recorded
    1.016 is no collapse, and expecting the alert is an error promtool reports."""
    series, labels_of, n = _input_series(1.0)
    rule = next(r for r in alert_rules() if r["alert"] == "DDTreeAcceptLengthCollapse")
    quiet = _promtool(tmp_path, series, [{"eval_time": f"{n - 1}m", "alertname": rule["alert"], "exp_alerts": []}])
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    lab = labels_of["EAGLE3"]
    wrong = _promtool(tmp_path, series, [{"eval_time": f"{n - 1}m", "alertname": rule["alert"], "exp_alerts": [
        {"exp_labels": {**lab, **rule["labels"]}, "exp_annotations": _annotations(rule, lab, 1.0158730158730158)}]}])
    assert wrong.returncode != 0
