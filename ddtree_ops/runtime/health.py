"""Health checks against a running SGLang server (``ddtree-ops health``).

Check names are stable (``--json`` consumers rely on them), in this order:

=================  ==========================================================================
``reachable``      liveness: the port answers HTTP (a ``/health`` that hangs still counts)
``ready``          readiness: ``/health`` answered 200 within ``failures`` consecutive probes
``warm``           (with a warm marker path) the unit's warmup finished in this run
``drift``          (with a deployed plan) ``/server_info`` matches the deployed config
                   (:func:`ddtree_ops.runtime.drift.find_drift`); any drift fails
``progress``       requests running or queued -> generation counters move within the window
``accept_length``  informational: ``avg_spec_accept_length`` from ``/server_info`` (since the server
                   started: :data:`ACCEPT_WINDOW`)
``node``           (a plan of a node of rank >= 1 of a multi-node server, instead of the checks
                   after ``ready``) the node's health-only server answers: its ranks joined rank 0
=================  ==========================================================================

A check that cannot run because an earlier one failed (no ``ready`` when not reachable;
no deep checks when not ready) is left out, never reported as passing.

Flapping: SGLang's ``/health`` is a 1-token generation that answers 503 after 20 s under a
long prefill (SGLang ``srt/entrypoints/http_server.py``, ``health_generate``). ``ready`` fails only after ``failures``
(``ddtree_ops.health_failures``) consecutive failed probes ``interval_s`` apart; the
``progress`` check likewise fails only when counters stay frozen over ``failures``
consecutive windows. Every request has a total deadline of ``timeout`` seconds (connect to
last byte; ``/health`` gets :attr:`HealthOptions.health_deadline_s`, see below) and a size
cap (:mod:`ddtree_ops.sglang.client`), so one call is bounded by
:func:`bound_s`, whatever the server does. A server that answers garbage, too much, too
slowly or non-finite numbers fails the check that asked, naming what it did.

Not loading the server: SGLang's ``/health`` queues a generation that a client hanging up
does not cancel (:mod:`ddtree_ops.sglang.health_probe`, sgl-project/sglang#35884). So the
``/health`` deadline outlasts SGLang's own ``SGLANG_HEALTH_CHECK_TIMEOUT`` (the deployed
unit's env from plan.json, else 20 s; ``http_server.py`` 0.5.17 / 0.5.23) and probes run one
after another: when one ends, SGLang's handler has ended too, so a server never holds two
of our probes, and a slow but healthy answer (200 after 8 s) counts as ready.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sglang.client import (
    LOCAL_WORK_S,
    SERVER_INFO_REQUESTS,
    SGLangClient,
    SGLangError,
    accept_length,
    preview,
    select_samples,
)
from ..sglang.health_probe import DEFAULT_HEALTH_CHECK_TIMEOUT_S, probe_deadline_s, sglang_health_timeout_s
from .drift import drift_fix, find_drift

if TYPE_CHECKING:
    from ..config.plandoc_model import PlanDoc

CHECK_NAMES = ("reachable", "ready", "warm", "drift", "progress", "accept_length", "node")
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
``generation_tokens_total``, ``spec_verify_calls_total``, ``prompt_tokens_total`` and
``num_requests_total`` move only when a request finishes (0.5.13.post1, 0.5.17 and 0.5.23:
``observe_one_finished_request``); the scheduler-side ``realtime_tokens_total{mode}`` moves every
forward pass (seen in the real 0.5.17 captures, ``tests/fixtures/gpu/``), so a long generation
with nothing finishing is still progress. ``forward_execution_seconds_total`` is in no recorded
release's text; it is kept for builds that export it. Shared by the ``progress`` check and the
exporter's ``ddtree_scheduler_stuck``."""

LOAD_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
"""SGLang's scheduler load gauges (per TP rank with ``--enable-metrics-for-all-schedulers``)."""

MARKER_CAP = 1 << 20
"""Largest warm marker read (bytes); the report of 4096 batch sizes is ~1 MB less than this."""


@dataclass(frozen=True)
class Load:
    """What ``/metrics`` says about progress: requests ``running`` and ``queued`` (summed over
    every series: with per-rank metrics each TP rank reports its batch, so a request may be
    counted once per rank, but any busy DP rank makes the sum > 0), ``progress`` (sum over every
    series of :data:`PROGRESS_COUNTERS`; only its movement matters), ``has_progress`` (any progress counter exposed)."""

    running: float
    queued: float
    progress: float
    has_progress: bool

    @property
    def busy(self) -> bool:
        return self.running + self.queued > 0


def load_of(found: dict[str, list[tuple[dict[str, str], float]]]) -> Load | None:
    """:class:`Load` from :func:`ddtree_ops.sglang.client.select_samples` over
    :data:`LOAD_GAUGES` + :data:`PROGRESS_COUNTERS`; None when neither load gauge is
    exposed (not SGLang's metrics)."""
    running, queued = (sum(v for _, v in found[n]) if found.get(n) else None for n in LOAD_GAUGES)
    if running is None and queued is None:
        return None
    if (running or 0.0) < 0 or (queued or 0.0) < 0:
        raise SGLangError(f"/metrics: negative request counts ({LOAD_GAUGES[0]} {running}, {LOAD_GAUGES[1]} {queued}): "
                          "a broken server")
    series = [v for n in PROGRESS_COUNTERS for _, v in found.get(n, [])]
    total = sum(series)
    if not math.isfinite(total) or not math.isfinite((running or 0.0) + (queued or 0.0)):
        raise SGLangError("/metrics: progress counters or load gauges sum beyond the float range (a broken server)")
    return Load(running or 0.0, queued or 0.0, total, bool(series))


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
        plan_doc: the deployed ``plan.json`` (:class:`~ddtree_ops.config.plandoc_model.PlanDoc`;
            a rendered document is checked into one, PlanDocError if it is none) enables
            ``drift``; None: no drift check.
        warm_marker: path of the unit's warm marker (enables ``warm``), or None.
        sglang_health_timeout_s: SGLang's own ``/health`` timeout; None: the deployed unit's
            ``SGLANG_HEALTH_CHECK_TIMEOUT`` from ``plan_doc``, else SGLang's default (20 s).
        health_cap_s: a caller's own upper bound on one ``/health`` probe (the release gate's
            ``--deadline``, which an operator sets and which must hold); None: no cap. The gate
            probes once, one probe at a time, so a capped probe that ends before SGLang's
            generation does leaves at most one behind per gate, never a pile-up.
        health_deadline_s: (property) one ``/health`` probe's total deadline:
            :func:`~ddtree_ops.sglang.health_probe.probe_deadline_s`, at least ``timeout``, at
            most ``health_cap_s``.
    """

    timeout: float = 5.0
    failures: int = 3
    interval_s: float = 1.0
    progress_window_s: float = 2.0
    plan_doc: PlanDoc | None = None
    warm_marker: Path | None = None
    sglang_health_timeout_s: float | None = None
    health_cap_s: float | None = None

    def __post_init__(self) -> None:
        if self.plan_doc is not None:
            from ..config.plandoc_model import as_plan_doc  # pydantic: only when a plan is given

            object.__setattr__(self, "plan_doc", as_plan_doc(self.plan_doc))
        if self.sglang_health_timeout_s is None:
            env = None
            if self.plan_doc is not None:
                service = self.plan_doc.document.get("deployment", {}).get("service")
                env = service.get("env") if isinstance(service, dict) else None
            object.__setattr__(self, "sglang_health_timeout_s",
                               float(sglang_health_timeout_s(env if isinstance(env, dict) else None)))

    @property
    def health_deadline_s(self) -> float:
        full = probe_deadline_s(self.sglang_health_timeout_s or DEFAULT_HEALTH_CHECK_TIMEOUT_S, self.timeout)
        return full if self.health_cap_s is None else min(full, self.health_cap_s)


def bound_s(o: HealthOptions) -> float:
    """Upper bound (seconds) of one :func:`check_health` call: every request it can make
    has a total deadline of ``timeout`` (:func:`ddtree_ops.sglang.client.fetch`) plus
    :data:`~ddtree_ops.sglang.client.LOCAL_WORK_S` to parse its capped answer, so the
    bound counts requests and sleeps, check by check:

    * ``reachable``/``ready``: ``failures`` ``/health`` probes, ``interval_s`` apart, each
      with :attr:`HealthOptions.health_deadline_s`;
    * ``drift``/``accept_length``: ``/server_info`` then the ``/get_server_info`` fallback
      (:data:`~ddtree_ops.sglang.client.SERVER_INFO_REQUESTS` requests);
    * ``progress``: one ``/metrics`` sample, then up to ``failures`` windows of a
      ``progress_window_s`` sleep and one ``/metrics`` sample.

    ``warm`` reads a local file of at most :data:`MARKER_CAP` bytes (covered by the same
    per-request allowance).
    """
    requests = SERVER_INFO_REQUESTS + 1 + o.failures
    sleeps = (o.failures - 1) * o.interval_s + o.failures * o.progress_window_s
    return o.failures * (o.health_deadline_s + LOCAL_WORK_S) + requests * (o.timeout + LOCAL_WORK_S) + sleeps


def _probe_ready(c: SGLangClient, o: HealthOptions, timeout: float | None = None) -> tuple[Check, Check]:
    """``reachable`` and ``ready`` from up to ``failures`` consecutive ``/health`` probes, one at
    a time, each with ``timeout`` (default :attr:`HealthOptions.health_deadline_s`)."""
    seen: list[str] = []
    reachable = False
    for i in range(o.failures):
        if i:
            time.sleep(o.interval_s)
        try:
            status = c.health(o.health_deadline_s if timeout is None else timeout)
        except SGLangError as exc:
            reachable = reachable or exc.reachable
            seen.append(exc.what)
            continue
        reachable = True
        if status == 200:
            before = f" after {len(seen)} failed ({'; '.join(seen)})" if seen else ""
            return Check("reachable", True, "port open"), Check("ready", True, f"/health answered 200{before}")
        seen.append(
            f"answered {status}" + (f" (starting, or its 1-token generation took > {o.sglang_health_timeout_s:g} s)"
                                    if status == 503 else "")
        )
    detail = f"/health failed {o.failures} consecutive probe(s), {o.interval_s:g} s apart: {'; '.join(seen)}"
    return (Check("reachable", reachable, "port open" if reachable else f"{c.name}/health: {seen[-1]}"),
            Check("ready", False, detail))


def _warm(o: HealthOptions) -> Check:
    path = o.warm_marker
    assert path is not None
    try:
        if not path.is_file():  # a FIFO or device would block or never end
            if path.exists():
                return Check("warm", False, f"warm marker {path} is not a regular file")
            raise FileNotFoundError(path)
        with path.open("rb") as f:
            raw = f.read(MARKER_CAP + 1)
        if len(raw) > MARKER_CAP:
            return Check("warm", False, f"warm marker {path} is larger than {MARKER_CAP} bytes: not a warm marker")
        report = json.loads(raw)
        sizes = report["batch_sizes"]
    except FileNotFoundError:
        return Check("warm", False, f"no warm marker {path}: warmup has not finished since the last (re)start")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return Check("warm", False, f"warm marker {path} unreadable: {preview(str(exc), 120)}")
    return Check("warm", True, f"warmed over batch sizes {preview(str(sizes))} in "
                               f"{preview(str(report.get('elapsed_s', '?')), 40)} s")


def _drift(info: dict[str, Any], plan_doc: PlanDoc) -> Check:
    drifts, missing = find_drift(plan_doc, info)
    if drifts:
        return Check("drift", False, "running server differs from the deployed config: "
                     + "; ".join(preview(str(d)) for d in drifts)
                     + f". Fix: {drift_fix(drifts, plan_doc.sglang_base_version)}")
    if "model_path" in missing and "tp_size" in missing:  # every SGLang reports both: nothing was compared
        return Check("drift", False, f"/server_info reports none of the deployed settings ({', '.join(missing)}): "
                     "not an SGLang server_info? Fix: check that the URL is the SGLang server of this deployment")
    tail = f" (not reported by this build: {', '.join(missing)})" if missing else ""
    return Check("drift", True, "running settings match the deployed config" + tail)


class _NoMetrics(Exception):
    """``/metrics`` is not served (metrics disabled): progress is not measured."""


PROMETHEUS_TEXT_TYPES = ("text/plain", "application/openmetrics-text")
"""Media types of a Prometheus exposition (the part before ``;``). SGLang serves ``/metrics``
through prometheus_client's ASGI app (``make_asgi_app``, sglang/srt/entrypoints/http_server.py),
whose ``CONTENT_TYPE_LATEST`` is ``text/plain; version=0.0.4`` (prometheus_client < 0.22) or
``text/plain; version=1.0.0`` (0.26, prometheus_client/exposition.py), and
``application/openmetrics-text`` only when asked for it; a page served as ``text/html`` (a proxy's
login or error page that happens to hold the gauge names) is not the server's metrics."""


def _sample_load(c: SGLangClient, timeout: float | None = None) -> Load:
    """One ``/metrics`` sample as a :class:`Load`.

    Raises:
        _NoMetrics: ``/metrics`` answered a status other than 200 (SGLang without
            ``--enable-metrics``): progress is not measured.
        SGLangError: no complete answer in time, over the cap, not HTTP, or 200 with
            something that is not SGLang's metrics (the ``progress`` check fails).
    """
    r = c.get("/metrics", timeout)
    if r.status != 200:
        raise _NoMetrics(f"HTTP {r.status}")
    ctype = r.content_type.split(";", 1)[0].strip().lower()
    if ctype not in PROMETHEUS_TEXT_TYPES:
        raise SGLangError(f"/metrics answered 200 as {preview(ctype or '(no Content-Type)', 60)!r}, not Prometheus "
                          f"text ({' or '.join(PROMETHEUS_TEXT_TYPES)}): not SGLang's metrics")
    text = r.text()
    load = load_of(select_samples(text, LOAD_GAUGES + PROGRESS_COUNTERS))
    if load is None:
        raise SGLangError(f"/metrics answered 200 without {' or '.join(LOAD_GAUGES)}: not SGLang's metrics "
                          f"({preview(text, 80)!r})")
    return load


def _progress(c: SGLangClient, o: HealthOptions) -> Check:
    try:
        return _progress_of(c, o)
    except _NoMetrics as exc:
        return Check(
            "progress", True, f"not measured: /metrics unavailable ({exc}); start SGLang with --enable-metrics"
        )
    except SGLangError as exc:
        return Check("progress", False, f"/metrics did not give SGLang's Prometheus text: {exc}")


def _progress_of(c: SGLangClient, o: HealthOptions) -> Check:
    first = _sample_load(c, o.timeout)
    if not first.busy:
        return Check("progress", True, "idle: no running or queued requests")
    if not first.has_progress:
        return Check("progress", True, f"not measured: {first.running:g} running, {first.queued:g} queued, but "
                                       f"/metrics exposes none of {', '.join(PROGRESS_COUNTERS[:3])}, ...")
    last = first
    for _ in range(o.failures):
        time.sleep(o.progress_window_s)
        now = _sample_load(c, o.timeout)
        if now.progress > first.progress:
            return Check("progress", True, f"{now.running:g} running, {now.queued:g} queued; "
                                           f"counters moved by {now.progress - first.progress:g}")
        if not now.busy:
            return Check("progress", True, "idle: the requests finished")
        last = now
    return Check(
        "progress",
        False,
        f"{last.running:g} running, {last.queued:g} queued, but no generation counter moved in "
        f"{o.failures} x {o.progress_window_s:g} s ({', '.join(PROGRESS_COUNTERS[:3])}): the scheduler is stuck",
    )


def _deep(c: SGLangClient, o: HealthOptions, checks: list[Check], options_given: bool) -> list[Check]:
    """After ``ready``: warm, drift, progress, accept_length; ``node`` alone on a node of rank >= 1."""
    if o.plan_doc is not None and o.plan_doc.node_rank > 0:
        # SGLang's health-only server (0.5.23 entrypoints/engine.py, launch_dummy_health_check_server):
        # /health answers once this node's ranks joined rank 0; there is no /server_info to compare
        return checks + [Check("node", True, f"node rank {o.plan_doc.node_rank} of {o.plan_doc.nnodes}: its "
                                             "scheduler ranks joined rank 0, which serves the API (check rank 0 for "
                                             "drift and acceptance)")]
    if o.warm_marker is not None:
        checks.append(_warm(o))
    try:
        info = c.server_info(o.timeout)
    except SGLangError as exc:
        return checks + [Check("drift" if o.plan_doc is not None else "accept_length", False, str(exc))]
    if o.plan_doc is not None:
        checks.append(_drift(info, o.plan_doc))
    if options_given:
        checks.append(_progress(c, o))
    al = accept_length(info)
    # a server that reports speculative_algorithm null runs no speculation (real 0.5.17): say so
    no_spec = "speculative_algorithm" in info and info["speculative_algorithm"] in (None, "", "NONE", "none")
    checks.append(
        Check("accept_length", True,
              "no speculative decoding (speculative_algorithm none)" if no_spec and al is None
              else "no verify pass yet" if al is None else f"{al:.2f} tokens per verify pass ({ACCEPT_WINDOW})")
    )
    return checks


ACCEPT_WINDOW = ("SGLang's total since the server started, /server_info avg_spec_accept_length, counted at each "
                 "decode log; warmup and bench give their own requests' mean, sglang:spec_accept_length the last "
                 "decode-log interval, so the figures differ")
"""Which verify passes the health figure covers, said next to it: 0.5.23
``scheduler_components/internal_state.py`` divides the reporter's lifetime counters
(``spec_total_num_accept_tokens / spec_total_num_forward_ct``, added to at each decode log,
``metrics_reporter.py``), while the ``sglang:spec_accept_length`` gauge holds the last
``decode_log_interval`` only and ``meta_info.spec_accept_length`` one request
(``tokenizer_manager.py``: ``completion_tokens / spec_verify_ct``)."""


def check_health(url: str, timeout: float = 5.0, options: HealthOptions | None = None) -> list[Check]:
    """One bounded round of checks (see the module docstring for names and order).

    Args:
        url: server base URL.
        timeout: total deadline per HTTP request when ``options`` is None (then one probe, no deep checks).
        options: probes, windows, deployed plan and warm marker.

    Returns:
        The checks that ran; all ``ok`` means healthy. Never raises for server faults;
        finishes within :func:`bound_s` seconds.
    """
    o = options or HealthOptions(timeout=timeout, failures=1)
    with SGLangClient(url, timeout=o.timeout) as c:
        return _check(c, o, options is not None)


def _check(c: SGLangClient, o: HealthOptions, options_given: bool) -> list[Check]:
    reachable, ready = _probe_ready(c, o)
    if not reachable.ok:
        return [_nodes_hint(reachable, o)]
    if not ready.ok:
        return [reachable, _nodes_hint(ready, o)]
    return _deep(c, o, [reachable, ready], options_given)


def _nodes_hint(failed: Check, o: HealthOptions) -> Check:
    """``failed`` with the other nodes named, on a node of a multi-node server: rank 0 answers only
    once every node has joined its store, and every rank exits when a node dies (SGLang 0.5.23
    ``model_executor/model_runner.py`` ``init_torch_distributed``; :mod:`ddtree_ops.config.multinode`)."""
    doc = o.plan_doc
    if doc is None or doc.nnodes <= 1:
        return failed
    server = ((doc.document.get("deployment") or {}).get("server") or {})
    nodes = [str(n)[:64] for n in ((server.get("multinode") or {}).get("nodes") or [])][:16]
    others = ", ".join(f"{n} (rank {i})" for i, n in enumerate(nodes) if i != doc.node_rank) or "the other nodes"
    return Check(failed.name, False, f"{failed.detail}; node rank {doc.node_rank} of a {doc.nnodes}-node server: "
                 f"it waits for (or died with) {others}: check those nodes (ddtree-ops fleet status)")


def wait_ready(url: str, deadline_s: float, timeout: float = 5.0, interval_s: float = 1.0,
               options: HealthOptions | None = None, alive: Callable[[], bool] | None = None) -> list[Check]:
    """Poll until ``reachable`` and ``ready`` pass or ``deadline_s`` seconds pass, then run
    one full round of checks (drift does not heal by waiting).

    Every probe's deadline is cut to the time left, so the whole call finishes within
    ``deadline_s + bound_s(options)`` seconds. ``alive`` (e.g. "the unit's main process still
    exists", :func:`pid_alive`) is asked before each probe: once it answers False the wait
    ends at once with ``reachable`` failed, so a server that crashed during start-up fails the
    unit's start in seconds, not after ``start_timeout_s``.

    Returns:
        The last round of checks (all ok, or the failing round at the deadline).
    """
    o = options or HealthOptions(timeout=timeout, failures=1, interval_s=interval_s)
    end = time.monotonic() + deadline_s
    one = HealthOptions(timeout=o.timeout, failures=1, sglang_health_timeout_s=o.sglang_health_timeout_s)
    with SGLangClient(url, timeout=o.timeout) as c:
        while True:
            if alive is not None and not alive():
                return [Check("reachable", False, "the server process exited before it was ready (it crashed during "
                                                  "start-up: see its log, e.g. journalctl -u <unit>); not waiting "
                                                  "for the rest of the deadline")]
            left = end - time.monotonic()
            # the probe's deadline is cut to the time left; one cut short ends the wait anyway
            reachable, ready = _probe_ready(c, one, timeout=max(0.0, min(o.health_deadline_s, left)))
            if reachable.ok and ready.ok:
                return _check(c, o, options is not None)
            if time.monotonic() + o.interval_s >= end:
                return [reachable, ready] if reachable.ok else [reachable]
            time.sleep(o.interval_s)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (``kill(pid, 0)``: a process of another user counts)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
