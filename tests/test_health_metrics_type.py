"""health's progress check reads ``/metrics`` only when it is served as Prometheus text
(:data:`ddtree_ops.runtime.health.PROMETHEUS_TEXT_TYPES`): the same gauges in a ``text/html`` page (a
proxy's page, another app) fail the check instead of passing as "idle"."""

from __future__ import annotations

import pytest
from test_hostile_servers import Hostile, fixed

from ddtree_ops.runtime.health import HealthOptions, check_health

BODY = b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:generation_tokens_total 10\n"


def _progress(ctype: str):
    srv = Hostile(fixed(200, ctype, BODY), {"/metrics"})
    try:
        checks = check_health(srv.url, options=HealthOptions(timeout=2.0, failures=1, progress_window_s=0.1))
    finally:
        srv.close()
    return next(c for c in checks if c.name == "progress")


@pytest.mark.parametrize("ctype", ["text/html", "text/html; charset=utf-8", "application/json", "",
                                   "text/plainish", "image/png"])
def test_metrics_not_served_as_prometheus_text_fail_progress(ctype):
    c = _progress(ctype)
    assert not c.ok and "not Prometheus text" in c.detail, c


@pytest.mark.parametrize("ctype", ["text/plain; version=0.0.4; charset=utf-8",  # prometheus_client < 0.22
                                   "text/plain; version=1.0.0; charset=utf-8",  # prometheus_client 0.26
                                   "application/openmetrics-text; version=1.0.0; charset=utf-8", "TEXT/PLAIN"])
def test_prometheus_text_passes(ctype):
    c = _progress(ctype)
    assert c.ok and "idle" in c.detail, c
