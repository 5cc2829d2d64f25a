"""SGLang metric names per release (``ddtree_ops/config/sglang_metrics.py``, generated data in
``sglang_metrics_data.py`` by ``scripts/sglang-metric-facts.py``): ground truth for 0.5.17 is a
real server's /metrics (``tests/fixtures/gpu/``); the exporter, alert rules and dashboard take
their names from the lookup."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO

from ddtree_ops.config import sglang_metrics
from ddtree_ops.config.sglang_metrics import common_name, metric_name, promql_selector, release_for
from ddtree_ops.config.sglang_metrics_data import METRICS
from ddtree_ops.config.versions import RELEASES

GEN = REPO / "scripts" / "sglang-metric-facts.py"
TYPE_LINE = re.compile(r"^# TYPE (sglang[:_][a-zA-Z0-9_:]*) (\w+)$", re.MULTILINE)


def recorded_0_5_17() -> dict[str, str]:
    """Every ``# TYPE`` of a ``sglang`` family in the real SGLang 0.5.17 recordings."""
    out: dict[str, str] = {}
    for f in (FIXTURES / "gpu").rglob("metrics_*.txt"):
        out.update(dict(TYPE_LINE.findall(f.read_text())))
    return out


def test_every_release_read_has_names():
    assert set(METRICS) == set(RELEASES)
    assert all(len(METRICS[v]) > 100 for v in METRICS)


def test_0_5_17_names_and_kinds_are_those_a_real_server_exported():
    rec = recorded_0_5_17()
    assert len(rec) >= 60 and "sglang:spec_accept_length" in rec
    ours = METRICS["0.5.17"]
    assert set(rec) <= set(ours), sorted(set(rec) - set(ours))
    assert {n: ours[n] for n in rec} == rec


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
def test_names_scraped_from_the_collectors_are_all_there(version):
    listed = set((FIXTURES / "sglang" / f"metric_names-{version}.txt").read_text().split())
    assert listed <= set(METRICS[version]), sorted(listed - set(METRICS[version]))


def test_release_for_unread_versions():
    assert release_for("0.5.17") == "0.5.17"
    assert release_for("0.5.20") == "0.5.17"
    assert release_for("0.5.30") == "0.5.23"
    assert release_for("0.5.11") == "0.5.13.post1"
    with pytest.raises(ValueError, match="not a version"):
        release_for("latest")


def test_lookup_errors_name_the_release_and_key():
    with pytest.raises(KeyError, match="SGLang 0.5.13.post1 exposes no metric 'no_such_metric'"):
        metric_name("no_such_metric", "0.5.13.post1")


def test_exporter_and_health_read_names_every_release_exposes():
    from ddtree_ops.runtime import exporter, health

    for name in (exporter.GEN_TOKENS, exporter.VERIFY_CALLS, exporter.SGLANG_ACCEPT,
                 *health.LOAD_GAUGES, *health.PROGRESS_COUNTERS):
        for v in METRICS:
            assert name in METRICS[v], (name, v)


@pytest.fixture
def underscore_release(monkeypatch):
    """A release that spells its names ``sglang_`` (as sgl-project/sglang#12618 /
    sgl-project/sglang#20752 discuss): 0.5.23's families renamed."""
    renamed = {("sglang_" + k.split(":", 1)[1]): kind for k, kind in METRICS["0.5.23"].items()}
    monkeypatch.setitem(sglang_metrics.METRICS, "0.6.0", renamed)
    return "0.6.0"


def test_a_release_with_the_other_prefix_gets_its_own_names(underscore_release):
    assert metric_name("num_queue_reqs", underscore_release) == "sglang_num_queue_reqs"
    assert metric_name("num_queue_reqs", "0.5.23") == "sglang:num_queue_reqs"
    with pytest.raises(ValueError, match="spell metric 'num_queue_reqs' differently"):
        common_name("num_queue_reqs")
    assert promql_selector("num_queue_reqs", ["0.5.23"], 'job="sglang"') == 'sglang:num_queue_reqs{job="sglang"}'
    both = promql_selector("time_to_first_token_seconds", ["0.5.23", underscore_release], 'job="sglang"', "_bucket")
    assert both == ('{__name__=~"sglang:time_to_first_token_seconds_bucket|sglang_time_to_first_token_seconds_bucket", '
                    'job="sglang"}')


def _validated(version: str):
    from ddtree_ops.config import validate_hostvars

    return validate_hostvars("h1", {
        "ddtree_host_class": "h200x1", "ddtree_sglang": {"source": "pypi", "version": version},
        "ddtree_model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "ddtree_speculative": {"algorithm": "EAGLE3", "draft_model_path": "jamesliu1/sglang-EAGLE3-Llama-3.1-8B",
                               "num_steps": 3, "topk": 1},
        "ddtree_server": {"tp_size": 1, "max_running_requests": 16}})


def test_rules_and_dashboard_use_the_pinned_releases_names(underscore_release, monkeypatch):
    from ddtree_ops.config import versions
    from ddtree_ops.render.monitoring import alert_rules, dashboard_panels

    v = _validated("0.5.23")
    monkeypatch.setattr(type(v.deployment.sglang), "base_version", property(lambda self: underscore_release))
    exprs = [r["expr"] for r in alert_rules(validated=[v])]
    exprs += [t["expr"] for p in dashboard_panels([v]) for t in p["targets"]]
    used = set(re.findall(r"sglang[:_][a-z_]+", " ".join(exprs)))
    assert used and all(n.startswith("sglang_") for n in used), used
    assert "sglang_num_queue_reqs" in used and "sglang_time_to_first_token_seconds_bucket" in used
    assert versions  # the fake release is only in the metrics table
    # no deployment given: the names of every release read (all ``sglang:``... and the fake one)
    plain = " ".join(t["expr"] for p in dashboard_panels() for t in p["targets"])
    assert '__name__=~"sglang:num_queue_reqs|sglang_num_queue_reqs"' in plain


def test_generator_reads_a_package(tmp_path):
    """The generator on a small package: literal names of each kind (counters as exposed,
    ``_total``), both prefixes; f-string names and other prefixes skipped."""
    site = tmp_path / "site"
    (site / "sglang-9.9.9.dist-info").mkdir(parents=True)
    src = site / "sglang" / "srt" / "observability"
    src.mkdir(parents=True)
    (src / "metrics_collector.py").write_text(
        "from prometheus_client import Counter, Gauge, Histogram\n"
        "import prometheus_client as pc\n"
        "a = Counter(name='sglang:prompt_tokens', documentation='x')\n"
        "b = Counter('sglang:done_total', 'x')\n"
        "c = Gauge(name='sglang_num_running_reqs', documentation='x')\n"
        "d = pc.Histogram(name='sglang:ttft_seconds', documentation='x')\n"
        "e = Gauge(name=f'sglang_{x}', documentation='x')\n"
        "f = Gauge(name='vllm:other', documentation='x')\n")
    out = subprocess.run([sys.executable, str(GEN), str(site)], capture_output=True, text=True, check=True).stdout
    ns: dict = {}
    exec(compile(out, "generated", "exec"), ns)  # the generated module is plain data
    assert ns["METRICS"] == {"9.9.9": {"sglang:done_total": "counter", "sglang:prompt_tokens_total": "counter",
                                       "sglang:ttft_seconds": "histogram", "sglang_num_running_reqs": "gauge"}}


@pytest.mark.skipif(not os.environ.get("DDTREE_SGLANG_SITES"),
                    reason="DDTREE_SGLANG_SITES (site-packages of the released wheels, space-separated) unset")
def test_committed_data_equals_the_generator_on_the_real_wheels():
    sites = os.environ["DDTREE_SGLANG_SITES"].split()
    out = subprocess.run([sys.executable, str(GEN), *sites], capture_output=True, text=True, check=True).stdout
    assert out == (REPO / "ddtree_ops" / "config" / "sglang_metrics_data.py").read_text(), (
        "regenerate: python scripts/sglang-metric-facts.py SITE... > ddtree_ops/config/sglang_metrics_data.py")


def test_no_sglang_metric_literal_left_in_rules_and_dashboard_code():
    """The rule and panel expressions take names from the lookup, never one literal."""
    text = (REPO / "ddtree_ops" / "render" / "monitoring.py").read_text()
    exprs = re.findall(r'"expr":\s*f?"([^"]*)"', text)
    assert exprs and not any(re.search(r"sglang[:_][a-z]", e) for e in exprs)
    assert not re.search(r'\(f"(?:sum|max) by \(host\) \(sglang', text)
    assert Path(GEN).is_file()
