"""``ddtree-ops health`` (and ``--wait``, and the release gate's health round) against a slow
``/health``: SGLang queues a generation per probe and keeps it when the client hangs up
(sgl-project/sglang#35884, ``sglang/srt/entrypoints/http_server.py`` 0.5.17 / 0.5.23), so a
probe waits past SGLang's own timeout and probes never overlap."""

from __future__ import annotations

import time

from test_exporter import sim_deployment
from test_exporter_load import CountingHealth

from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.health import HealthOptions, bound_s, check_health, wait_ready


def _by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_health_reads_a_slow_but_healthy_health_as_ready_with_one_probe() -> None:
    """6 s /health, the default 5 s timeout and 3 failures: the old probe gave up three times
    (three generations queued, not ready); now one probe, ready."""
    up = CountingHealth(delay=6.0)
    try:
        t0 = time.monotonic()
        checks = _by_name(check_health(up.url, options=HealthOptions(timeout=5, failures=3, interval_s=0.1,
                                                                        progress_window_s=0.1)))
        took = time.monotonic() - t0
        print(f"\nhealth against a 6 s /health: ready {checks['ready'].ok} in {took:.1f} s, probes {up.probes}, "
              f"most in flight {up.most}")
        assert checks["ready"].ok and up.probes == 1 and up.most == 1
    finally:
        up.close()


def test_wait_ready_probes_one_at_a_time() -> None:
    """A 2.5 s /health under a 1 s --timeout: the wait's probe and the full round's probe after
    it, one after the other (the old 1 s probe every 0.2 s stacked them)."""
    up = CountingHealth(delay=2.5)
    try:
        checks = _by_name(wait_ready(up.url, 10, options=HealthOptions(timeout=1, failures=1, interval_s=0.2,
                                                                       progress_window_s=0.1)))
        assert checks["ready"].ok and up.most == 1 and up.probes == 2
    finally:
        up.close()


def test_health_deadline_follows_the_deployed_sglang_timeout() -> None:
    v, _ = sim_deployment({"ddtree_service": {"env": {"SGLANG_HEALTH_CHECK_TIMEOUT": "30"}}})
    o = HealthOptions(timeout=5, failures=2, interval_s=1, progress_window_s=2, plan_doc=plan_document(v))
    assert o.sglang_health_timeout_s == 30 and o.health_deadline_s == 33
    assert bound_s(o) >= 2 * 33
    plain = HealthOptions(timeout=5, failures=1)
    assert plain.sglang_health_timeout_s == 20 and plain.health_deadline_s == 23
    assert HealthOptions(timeout=60, failures=1).health_deadline_s == 60  # a longer ask stays
    assert HealthOptions(timeout=1, failures=1, sglang_health_timeout_s=1).health_deadline_s == 4
