"""Health checks against a running SGLang server (``ddtree-ops health``).

Check names are stable (``--json`` consumers rely on them), in this order:

=================  ==========================================================================
``reachable``      liveness: the port answers HTTP (a ``/health`` that hangs still counts)
``ready``          readiness: ``/health`` answered 200 within ``failures`` consecutive probes
``warm``           (with a warm marker path) the unit's warmup finished in this run
``drift``          (with a deployed plan) ``/server_info`` matches the deployed config
                   (:func:`ddtree_ops.ops.drift.find_drift`); any drift fails
``progress``       requests running or queued -> generation counters move within the window
``accept_length``  informational: ``avg_spec_accept_length`` from ``/server_info``
=================  ==========================================================================

A check that cannot run because an earlier one failed (no ``ready`` when not reachable;
no deep checks when not ready) is left out, never reported as passing.

Flapping: SGLang's ``/health`` is a 1-token generation that answers 503 after 20 s under a
long prefill (``../shared/DESIGN.md`` §2). ``ready`` fails only after ``failures``
(``ddtree_ops.health_failures``) consecutive failed probes ``interval_s`` apart; the
``progress`` check likewise fails only when counters stay frozen over ``failures``
consecutive windows. Every probe has ``timeout`` seconds, so one call is bounded by
:func:`bound_s`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..sglang.client import SGLangClient, SGLangError, accept_length
from .drift import find_drift

CHECK_NAMES = ("reachable", "ready", "warm", "drift", "progress", "accept_length")
"""Every check name ``ddtree-ops health`` can report, in report order."""

PROGRESS_COUNTERS = (
    "sglang:generation_tokens_total",
    "sglang:realtime_tokens_total",
    "sglang:spec_verify_calls_total",
    "sglang:forward_execution_seconds_total",
    "sglang:prompt_tokens_total",
    "sglang:num_requests_total",
)
"""Counters that move while the scheduler makes progress (any of them moving is progress).
``generation_tokens_total`` alone moves only when a request finishes; the scheduler-side
``realtime_tokens_total``/``spec_verify_calls_total`` move every forward pass."""

LOAD_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


@dataclass(frozen=True)
class Check:
    """One check: stable ``name`` (see :data:`CHECK_NAMES`), ``ok``, one-line ``detail``."""

    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class HealthOptions:
    """How hard to look.

    Attributes:
        timeout: seconds per HTTP request (>= 3 recommended: ``/health`` generates a token).
        failures: consecutive failed observations before a check fails (>= 1).
        interval_s: seconds between ``/health`` probes.
        progress_window_s: seconds between two ``/metrics`` samples of the progress check.
        plan_doc: the deployed ``plan.json`` document (enables ``drift``), or None.
        warm_marker: path of the unit's warm marker (enables ``warm``), or None.
    """

    timeout: float = 5.0
    failures: int = 3
    interval_s: float = 1.0
    progress_window_s: float = 2.0
    plan_doc: dict[str, Any] | None = None
    warm_marker: Path | None = None


def bound_s(o: HealthOptions) -> float:
    """Upper bound (seconds) of one :func:`check_health` call, before scheduling slack:
    ``failures`` probes of ``timeout`` + ``interval`` for ``ready``, one ``timeout`` for
    ``/server_info``, ``failures`` windows of ``progress_window_s`` + ``timeout``."""
    return o.failures * (o.timeout + o.interval_s) + o.timeout + o.timeout + o.failures * (o.progress_window_s + o.timeout)


def _probe_ready(c: SGLangClient, o: HealthOptions) -> tuple[Check, Check]:
    """``reachable`` and ``ready`` from up to ``failures`` consecutive ``/health`` probes."""
    seen: list[str] = []
    reachable = False
    for i in range(o.failures):
        if i:
            time.sleep(o.interval_s)
        try:
            status = c.health()
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            seen.append(f"{type(exc).__name__} (loading weights or down)")
            continue
        except httpx.TimeoutException:
            reachable = True
            seen.append(f"timed out after {o.timeout:g} s")
            continue
        except httpx.TransportError as exc:
            seen.append(f"{type(exc).__name__}")
            continue
        reachable = True
        if status == 200:
            before = f" after {len(seen)} failed ({'; '.join(seen)})" if seen else ""
            return Check("reachable", True, "port open"), Check("ready", True, f"/health answered 200{before}")
        seen.append(f"answered {status}" + (" (starting, or its 1-token generation took > 20 s)" if status == 503 else ""))
    detail = f"/health failed {o.failures} consecutive probe(s), {o.interval_s:g} s apart: {'; '.join(seen)}"
    return (Check("reachable", reachable, "port open" if reachable else f"{c.base_url}: {seen[-1]}"),
            Check("ready", False, detail))


def _warm(o: HealthOptions) -> Check:
    path = o.warm_marker
    assert path is not None
    try:
        report = json.loads(path.read_text())
        sizes = report["batch_sizes"]
    except FileNotFoundError:
        return Check("warm", False, f"no warm marker {path}: warmup has not finished since the last (re)start")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Check("warm", False, f"warm marker {path} unreadable: {exc}")
    return Check("warm", True, f"warmed over batch sizes {sizes} in {report.get('elapsed_s', '?')} s")


def _drift(info: dict[str, Any], plan_doc: dict[str, Any]) -> Check:
    try:
        drifts, missing = find_drift(plan_doc, info)
    except (KeyError, TypeError) as exc:
        return Check("drift", False, f"the deployed plan is not a plan.json document ({exc})")
    if drifts:
        return Check("drift", False, "running server differs from the deployed config: "
                     + "; ".join(str(d) for d in drifts) + ". Fix: redeploy, or restart the unit")
    if "model_path" in missing and "tp_size" in missing:  # every SGLang reports both: nothing was compared
        return Check("drift", False, f"/server_info reports none of the deployed settings ({', '.join(missing)}): "
                     "not an SGLang server_info? Fix: check that the URL is the SGLang server of this deployment")
    tail = f" (not reported by this build: {', '.join(missing)})" if missing else ""
    return Check("drift", True, "running settings match the deployed config" + tail)


def _sample(c: SGLangClient) -> tuple[float, float, float] | None:
    """(running, queued, sum of progress counters) from ``/metrics``; None without metrics."""
    try:
        text = c.metrics()
    except (SGLangError, httpx.HTTPError):
        return None
    load = dict.fromkeys(LOAD_GAUGES, 0.0)
    progress = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in load:
                load[s.name] += s.value
            elif s.name in PROGRESS_COUNTERS:
                progress += s.value
    return load[LOAD_GAUGES[0]], load[LOAD_GAUGES[1]], progress


def _progress(c: SGLangClient, o: HealthOptions) -> Check:
    try:
        return _progress_of(c, o)
    except ValueError as exc:  # prometheus_client's parser
        return Check("progress", False, f"/metrics is not Prometheus text ({exc}): not an SGLang server?")


def _progress_of(c: SGLangClient, o: HealthOptions) -> Check:
    first = _sample(c)
    if first is None:
        return Check("progress", True, "not measured: /metrics unavailable (start SGLang with --enable-metrics)")
    running, queued, start = first
    if running + queued == 0:
        return Check("progress", True, "idle: no running or queued requests")
    for _ in range(o.failures):
        time.sleep(o.progress_window_s)
        now = _sample(c)
        if now is None:
            return Check("progress", True, "not measured: /metrics stopped answering")
        r2, q2, value = now
        if value > start:
            return Check("progress", True, f"{int(r2)} running, {int(q2)} queued; counters moved by {value - start:g}")
        if r2 + q2 == 0:
            return Check("progress", True, "idle: the requests finished")
        running, queued = r2, q2
    return Check("progress", False,
                 f"{int(running)} running, {int(queued)} queued, but no generation counter moved in "
                 f"{o.failures} x {o.progress_window_s:g} s ({', '.join(PROGRESS_COUNTERS[:3])}): the scheduler is stuck")


def check_health(url: str, timeout: float = 5.0, options: HealthOptions | None = None) -> list[Check]:
    """One bounded round of checks (see the module docstring for names and order).

    Args:
        url: server base URL.
        timeout: seconds per HTTP request when ``options`` is None (then one probe, no deep checks).
        options: probes, windows, deployed plan and warm marker.

    Returns:
        The checks that ran; all ``ok`` means healthy. Never raises for server faults.
    """
    o = options or HealthOptions(timeout=timeout, failures=1)
    with SGLangClient(url, timeout=o.timeout) as c:
        reachable, ready = _probe_ready(c, o)
        if not reachable.ok:
            return [reachable]
        checks = [reachable, ready]
        if not ready.ok:
            return checks
        if o.warm_marker is not None:
            checks.append(_warm(o))
        try:
            info = c.server_info()
        except (SGLangError, ValueError) as exc:
            return checks + [Check("drift" if o.plan_doc is not None else "accept_length", False, str(exc))]
        if o.plan_doc is not None:
            checks.append(_drift(info, o.plan_doc))
        if options is not None:
            checks.append(_progress(c, o))
        al = accept_length(info)
        checks.append(Check("accept_length", True, "no verify pass yet" if al is None else f"{al:.2f} tokens per verify pass"))
        return checks


def wait_ready(url: str, deadline_s: float, timeout: float = 5.0, interval_s: float = 1.0,
               options: HealthOptions | None = None) -> list[Check]:
    """Poll until ``reachable`` and ``ready`` pass or ``deadline_s`` seconds pass, then run
    the deep checks once (drift does not heal by waiting).

    Returns:
        The last round of checks (all ok, or the failing round at the deadline).
    """
    o = options or HealthOptions(timeout=timeout, failures=1, interval_s=interval_s)
    end = time.monotonic() + deadline_s
    probe = HealthOptions(timeout=o.timeout, failures=1, interval_s=o.interval_s)
    while True:
        t = min(o.timeout, max(0.5, end - time.monotonic()))
        with SGLangClient(url, timeout=t) as c:
            reachable, ready = _probe_ready(c, HealthOptions(timeout=t, failures=1))
        if reachable.ok and ready.ok:
            return check_health(url, options=o) if options is not None else check_health(url, timeout=o.timeout)
        if time.monotonic() + probe.interval_s > end:
            return [reachable, ready] if reachable.ok else [reachable]
        time.sleep(probe.interval_s)
