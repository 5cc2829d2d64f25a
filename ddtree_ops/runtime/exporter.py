"""``ddtree-ops exporter``: speculative-decoding health as Prometheus metrics.

A background thread polls one SGLang server (``/metrics``, ``/server_info``, ``/health``)
and keeps the last sample; a scrape of the exporter's own ``/metrics`` only reads that
cached sample, so a slow or dead SGLang never blocks a scrape. Every upstream request has a
total deadline and a size cap (:func:`ddtree_ops.sglang.client.fetch`), so one poll takes
at most :attr:`Exporter.poll_bound_s`. A sample older than :attr:`Exporter.stale_after_s`
(3 poll intervals plus one poll's bound) counts as no sample: ``ddtree_up 0`` and
``ddtree_ready 0``, whatever the poller is doing (a trickling server on SGLang's port, a
poller stuck for any reason). Answers that are not valid SGLang metrics (non-finite or
non-numeric values in the families read, over the cap, not HTTP) make ``ddtree_up 0``.

Metric names are a contract (alert rules, dashboard, tests rely on them); every series
carries the labels ``host``, ``host_class``, ``model`` from the host's ``plan.json``. Without a
plan (``ddtree-ops exporter --upstream URL``, an operator pointing it at any server) the labels
come from the server: ``host`` is the upstream's ``HOST:PORT``, ``host_class`` is empty,
``model`` and the ``ddtree_deployment_info`` labels are read from ``/server_info``
(:func:`identity_from_server`); the series only a plan can give (the floor, drift) are absent,
never invented. The
exporter's one table of them is :data:`METRICS` (name, help, extra labels); in words:

=========================================  =====================================================
``ddtree_up``                              1 if SGLang's ``/metrics`` answered valid metrics at the
                                           last poll, and that poll is fresh
``ddtree_ready``                           1 if the last ``/health`` probe answered 200 (fresh), and
                                           the release's flag-only ``/ready`` says 200 at the
                                           last poll where it has one (see below)
``ddtree_config_drift``                    1 if ``/server_info`` differs from plan.json
``ddtree_config_drift_settings{setting}``  per compared setting (``ops.drift``), 0/1
``ddtree_accept_length``                   tokens per verify pass over the window (see below)
``ddtree_accept_length_sglang``            SGLang's own ``sglang:spec_accept_length`` gauge
``ddtree_accept_length_floor``             the deployment's ``ddtree_ops.accept_length_floor``
``ddtree_speculative_enabled``             1 if the server runs speculative decoding
``ddtree_generation_tokens_per_second``    generation tokens per second over the window
``ddtree_upstream_staleness_seconds``      age of the last good upstream sample
``ddtree_scheduler_stuck``                 1 if requests were running or queued at every poll of
                                           the last ``stuck_after_s`` seconds and no counter of
                                           ``ops.health.PROGRESS_COUNTERS`` moved; else 0; absent
                                           while the upstream is down or before
                                           ``stuck_after_s`` of consecutive good polls
``ddtree_deployment_info{...}``            1, labels: algorithm, budget, block_size,
                                           verify_tokens_per_req, draft_tokens_per_req,
                                           tp_size, sglang_version
=========================================  =====================================================

Readiness without loading the server: SGLang's ``/health`` queues a real generation that a
client giving up does not cancel (:mod:`ddtree_ops.sglang.health_probe`, sgl-project/sglang#35884).
The exporter runs it on its own thread, one probe at a time, with a deadline that outlasts
SGLang's own ``SGLANG_HEALTH_CHECK_TIMEOUT`` (from the unit's environment in plan.json, default
20 s), and starts probes no closer than that timeout apart; a slow ``/metrics`` never delays
the probe, a slow ``/health`` never delays ``ddtree_up``. A release with ``GET /ready``
(0.5.23) is asked that on every poll (a flag, no generation).

plan.json follows the deployment: with the file's path (``ddtree-ops exporter --plan``) every
poll looks at the file (inode, size, mtime) and, when it changed, loads it again; a new file
that does not load keeps the plan in use (one log line naming the problem), so a deploy that
changes the budget changes ``ddtree_deployment_info`` and the drift reference within one poll
interval, without a restart.

Acceptance length over a window: SGLang (0.5.13.post1 and 0.5.23,
``sglang/srt/observability/metrics_collector.py`` ``observe_one_finished_request``) has no
accepted-tokens counter; when a request finishes, the tokenizer manager adds its
completion tokens to ``sglang:generation_tokens_total`` (0.5.23: one series per
``is_streaming``) and its verify passes to ``sglang:spec_verify_calls_total``. Its own
per-request figure is ``completion_tokens / spec_verify_ct``
(``tokenizer_manager.py``), so the window figure is
``Δ sum(generation_tokens_total) / Δ spec_verify_calls_total`` over requests that finished in
the window; absent when no verify pass finished in it (idle server). A counter that goes
down (SGLang restarted) restarts the window.

Over 600 lines: the poller, the collectors and the metric families of one exporter process;
the HTTP front is :mod:`.exporter_http`. Not yet split further.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config.plandoc_model import PlanDoc, PlanDocError, as_plan_doc, load_plan
from ..config.sglang_metrics import common_name
from ..sglang.client import (
    LOCAL_WORK_S,
    SERVER_INFO_PATHS,
    SERVER_INFO_REQUESTS,
    SGLangClient,
    SGLangError,
    metrics_text,
    select_samples,
    sum_lowest_rank,
)
from ..sglang.health_probe import (
    cheap_ready_path,
    min_probe_spacing_s,
    probe_deadline_s,
    sglang_health_timeout_s,
)
from .drift import compared_settings, find_drift
from .health import LOAD_GAUGES, PROGRESS_COUNTERS, Load, load_of

log = logging.getLogger("ddtree_ops.exporter")

LABELS = ("host", "host_class", "model")
INFO_LABELS = ("algorithm", "budget", "block_size", "verify_tokens_per_req", "draft_tokens_per_req", "tp_size",
               "sglang_version")

#: Every metric the exporter can expose, the one table of them (a contract for rules, dashboard
#: and tests): name -> (HELP text, labels beyond :data:`LABELS`). All are gauges. The HELP text
#: is ``str.format``ted with the exporter's ``window_s`` and ``stuck_after_s`` (seconds).
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ddtree_up": ("1 if SGLang's /metrics answered valid metrics at the last poll, and it is fresh.", ()),
    "ddtree_ready": ("1 if SGLang's /health answered 200 at the last poll, and it is fresh.", ()),
    "ddtree_config_drift": ("1 if /server_info differs from the deployed plan.json.", ()),
    "ddtree_config_drift_settings": (
        "Per setting: 1 if the running value differs from plan.json (absent: not reported).", ("setting",)),
    "ddtree_accept_length": (
        "Tokens per verify pass (bonus included) over the last {window_s:g} s of finished requests: "
        "delta sglang:generation_tokens_total / delta sglang:spec_verify_calls_total.", ()),
    "ddtree_accept_length_sglang": ("SGLang's own sglang:spec_accept_length gauge (cross-check).", ()),
    "ddtree_accept_length_floor": ("Configured acceptance-length floor (ddtree_ops.accept_length_floor).", ()),
    "ddtree_speculative_enabled": ("1 if the server runs speculative decoding.", ()),
    "ddtree_generation_tokens_per_second": (
        "Generation tokens per second over the last {window_s:g} s (finished requests).", ()),
    "ddtree_upstream_staleness_seconds": (
        "Seconds since the last good upstream sample (since exporter start when none yet).", ()),
    "ddtree_deployment_info": ("Deployed speculative-decoding configuration (value 1).", INFO_LABELS),
    "ddtree_scheduler_stuck": (
        "1 if requests were running or queued at every poll of the last {stuck_after_s:g} s and no "
        "progress counter moved (absent: upstream down or not enough history).", ()),
}

#: Every metric name the exporter can expose (the keys of :data:`METRICS`).
METRIC_NAMES = tuple(METRICS)

# SGLang's names for these, the same in every release read (ddtree_ops/config/sglang_metrics.py)
GEN_TOKENS = common_name("generation_tokens_total")
VERIFY_CALLS = common_name("spec_verify_calls_total")
SGLANG_ACCEPT = common_name("spec_accept_length")


PlanError = PlanDocError
"""The one error of a plan.json that cannot be used (:class:`~ddtree_ops.config.plandoc_model.PlanDocError`)."""


@dataclass(frozen=True)
class Identity:
    """What the exporter knows from plan.json (labels, sizes, floor).

    Attributes:
        labels: values of :data:`LABELS`.
        info: values of :data:`INFO_LABELS` (strings; ``""`` where not applicable).
        floor: ``ddtree_ops.accept_length_floor`` (tokens per verify pass); None without a plan.
        speculative: the deployment runs speculative decoding (algorithm not ``none``).
        url: the server's base URL from plan.json.
        health_timeout_s: ``ddtree_ops.health_timeout_s``.
        sglang_health_timeout_s: SGLang's own ``/health`` timeout for this server
            (:func:`~ddtree_ops.sglang.health_probe.sglang_health_timeout_s` of the unit's env).
        sglang_version: the SGLang release (plan.json's ``sglang_base_version``, or the
            server's ``version``), which decides the cheap readiness endpoint.
    """

    labels: tuple[str, str, str]
    info: tuple[str, ...]
    floor: float | None
    speculative: bool
    url: str
    health_timeout_s: float
    sglang_health_timeout_s: int = 20
    sglang_version: str | None = None


def identity_from_plan(doc: PlanDoc | dict[str, Any]) -> Identity:
    """Labels and sizes from a plan document (:class:`~ddtree_ops.config.plandoc_model.PlanDoc`;
    a rendered document is checked into one).

    Raises:
        PlanError: not a plan document, or a field breaks its rule.
    """
    doc = as_plan_doc(doc)
    d, p = doc.deployment, doc.plan

    def s(v: Any) -> str:
        return "" if v is None else str(v)

    info = (p.algorithm, s(p.budget), s(p.block_size), s(p.verify_tokens_per_req), s(p.draft_tokens_per_req),
            s(d.server.tp_size), doc.sglang_base_version)
    service = doc.document.get("deployment", {}).get("service")
    env = service.get("env") if isinstance(service, dict) else None
    return Identity(labels=(doc.host, doc.host_class, doc.model_name), info=info,
                    floor=d.ops.accept_length_floor, speculative=p.algorithm != "none", url=doc.url,
                    health_timeout_s=d.ops.health_timeout_s,
                    sglang_health_timeout_s=sglang_health_timeout_s(env if isinstance(env, dict) else None),
                    sglang_version=doc.sglang_base_version)


NO_PLAN_HEALTH_TIMEOUT_S = 5.0
"""``/health`` deadline without a plan: the default of ``ddtree-ops health`` without one."""

LABEL_CHARS = 200
"""Longest label value taken from a server (a hostile one cannot make every series huge)."""


def _server_label(value: Any, upper: bool = False) -> str:
    """A label value from a ``/server_info`` field: strings and integers as text (upper-cased
    when ``upper``, then cut to :data:`LABEL_CHARS`, control characters dropped); anything else
    empty. The cut comes last: case mapping can lengthen a string ("ß" -> "SS")."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return ""
    text = "".join(ch for ch in str(value) if ch.isprintable())
    return (text.upper() if upper else text)[:LABEL_CHARS]


def identity_from_server(url: str, server_info: dict[str, Any] | None) -> Identity:
    """Labels and sizes of a server the exporter watches without a plan, from what it says.

    ``host`` is the upstream's ``HOST:PORT``; ``model`` is ``served_model_name`` (else
    ``model_path``); the info labels are the server's ``speculative_algorithm`` (``none``
    without speculation), ``speculative_ddtree_budget``, block size
    (``speculative_dflash_block_size``, else ``speculative_num_draft_tokens``), ``tp_size`` and
    ``version``; the per-request sizes a plan derives are empty. ``speculative`` is False until
    the server has said otherwise; no floor.
    """
    info = server_info if isinstance(server_info, dict) else {}
    hostport = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    model = _server_label(info.get("served_model_name")) or _server_label(info.get("model_path"))
    algo = info.get("speculative_algorithm")
    speculative = algo not in (None, "", "NONE", "none")
    block = info.get("speculative_dflash_block_size") or (info.get("speculative_num_draft_tokens") if speculative
                                                           else None)
    labels = (_server_label(hostport), "", model)
    return Identity(labels=labels,
                    info=(_server_label(algo, upper=True) if speculative else "none",
                          _server_label(info.get("speculative_ddtree_budget")), _server_label(block), "", "",
                          _server_label(info.get("tp_size")), _server_label(info.get("version"))),
                    floor=None, speculative=speculative, url=url, health_timeout_s=NO_PLAN_HEALTH_TIMEOUT_S,
                    sglang_health_timeout_s=sglang_health_timeout_s(None),
                    sglang_version=_server_label(info.get("version")) or None)


@dataclass
class Sample:
    """One upstream poll (times from the exporter's clock, ``time.monotonic()`` by default).

    Attributes:
        t: when ``/metrics`` answered (the moment the counters describe).
        done_t: when the poll finished (freshness); ``t`` when not set.
        load: running/queued requests and the progress counters' sum (None: not exposed).
        error: why the poll is not ``up`` (one line, server text escaped), else ``""``.
    """

    t: float
    up: bool = False
    gen_tokens: float | None = None
    verify_calls: float | None = None
    sglang_accept_length: float | None = None
    server_info: dict[str, Any] | None = None
    load: Load | None = None
    done_t: float | None = None
    error: str = ""
    ready_flag: bool | None = None  # the release's flag-only /ready (None: no such endpoint)


@dataclass
class _State:
    last: Sample | None = None
    last_good_t: float | None = None
    window: deque = field(default_factory=deque)  # (t, gen_tokens, verify_calls or None)
    good_since: float | None = None  # t of the first sample of the current run of good polls
    frozen_since: tuple[float, float] | None = None  # (t, progress) of the first busy sample with these counters


@dataclass(frozen=True)
class Upstream:
    """What the exporter reads from SGLang's ``/metrics`` (None: not exposed).

    Attributes:
        gen_tokens: sum of ``sglang:generation_tokens_total`` (tokenizer side: one series per ``is_streaming``).
        verify_calls: ``sglang:spec_verify_calls_total`` of the lowest TP rank.
        accept_length: mean of ``sglang:spec_accept_length`` over its series.
        load: :class:`ddtree_ops.runtime.health.Load` (running, queued, progress counters).
    """

    gen_tokens: float | None
    verify_calls: float | None
    accept_length: float | None
    load: Load | None


UPSTREAM_FAMILIES = (GEN_TOKENS, VERIFY_CALLS, SGLANG_ACCEPT, *LOAD_GAUGES, *PROGRESS_COUNTERS)
"""The series :func:`parse_upstream` selects (everything else in SGLang's text is skipped)."""


def parse_upstream(text: str) -> Upstream:
    """The exporter's figures from an SGLang ``/metrics`` text (Prometheus text format).

    Only :data:`UPSTREAM_FAMILIES` are read, with one compiled regular expression over the
    text (:func:`ddtree_ops.sglang.client.select_samples`; a full parse of 8 TP ranks of
    SGLang's families costs ~100 ms of CPU per poll).

    Raises:
        SGLangError: a selected sample's value is not a finite number.
    """
    found = select_samples(text, UPSTREAM_FAMILIES)
    gen, accept = found[GEN_TOKENS], found[SGLANG_ACCEPT]
    g = sum(v for _, v in gen) if gen else None
    acc = sum(v / len(accept) for _, v in accept) if accept else None
    up = Upstream(g, sum_lowest_rank(found[VERIFY_CALLS]), acc, load_of(found))
    if not all(math.isfinite(x) for x in (up.gen_tokens, up.verify_calls, up.accept_length) if x is not None):
        raise SGLangError("/metrics: counters sum beyond the float range (a broken server)")
    return up


class Exporter:
    """Polls one SGLang server and exposes the ``ddtree_*`` metrics.

    Args:
        plan_doc: the host's plan.json (:class:`~ddtree_ops.config.plandoc_model.PlanDoc`, or a
            rendered document checked into one): labels, sizes, floor, drift reference. None:
            no plan, labels from the server (:func:`identity_from_server`); ``upstream`` is then
            required.
        registry: where to register the collector (default: a new ``CollectorRegistry``);
            injectable for tests and embedding.
        upstream: SGLang base URL (default: plan.json's ``url``).
        poll_interval_s: seconds between polls.
        window_s: seconds of the acceptance-length / token-rate window.
        timeout_s: total deadline (seconds) of each ``/metrics``, ``/server_info`` and
            ``/ready`` request; ``/health`` gets
            :func:`~ddtree_ops.sglang.health_probe.probe_deadline_s` (SGLang's own timeout
            and then some, at least ``max(timeout_s, health_timeout_s)``).
        stuck_after_s: seconds of busy polls with frozen progress counters before
            ``ddtree_scheduler_stuck`` is 1 (default: ``window_s``).
        clock: monotonic clock (seconds), injectable for tests.
        plan_path: the plan.json file ``plan_doc`` was read from; each poll loads it again
            when it changed (see the module docstring). None: the plan never changes.

    Attributes:
        poll_bound_s: upper bound of one poll: ``/metrics``, ``/server_info`` and its
            ``/get_server_info`` fallback, ``/ready``, each with its total deadline and
            :data:`~ddtree_ops.sglang.client.LOCAL_WORK_S` to parse its answer (``/health``
            runs on its own thread).
        stale_after_s: a sample older than this is no sample (``ddtree_up 0``):
            3 poll intervals plus :attr:`poll_bound_s`.
        health_timeout_s: the ``/health`` probe's total deadline.
        health_spacing_s: least time between two probe starts (SGLang's timeout plus one
            handler step, at least one poll interval).
        ready_stale_after_s: a probe result older than this counts as none (``ddtree_ready 0``).

    Raises:
        PlanError: plan_doc is not a plan document, or a field breaks its rule.
        ValueError: neither a plan nor an upstream.
    """

    STALE_POLLS = 3
    """Poll intervals (plus one poll's bound) after which the last sample counts as none."""

    def __init__(self, plan_doc: PlanDoc | dict[str, Any] | None, registry: CollectorRegistry | None = None,
                 upstream: str | None = None,
                 poll_interval_s: float = 5.0, window_s: float = 60.0, timeout_s: float = 3.0,
                 stuck_after_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 plan_path: str | os.PathLike[str] | None = None) -> None:
        if plan_doc is None and not upstream:
            raise ValueError("the exporter needs a plan.json or an upstream URL")
        self.plan_doc = as_plan_doc(plan_doc) if plan_doc is not None else None
        self.identity = (identity_from_plan(self.plan_doc) if self.plan_doc is not None
                         else identity_from_server(str(upstream).rstrip("/"), None))
        self.upstream = (upstream or self.identity.url).rstrip("/")
        self.poll_interval_s = poll_interval_s
        self.window_s = window_s
        self.stuck_after_s = window_s if stuck_after_s is None else stuck_after_s
        self.timeout_s = timeout_s
        sglang_t = self.identity.sglang_health_timeout_s
        self.health_timeout_s = probe_deadline_s(sglang_t, max(timeout_s, self.identity.health_timeout_s))
        self.health_spacing_s = max(poll_interval_s, min_probe_spacing_s(sglang_t))
        self.poll_bound_s = (2 + SERVER_INFO_REQUESTS) * (timeout_s + LOCAL_WORK_S)
        self.stale_after_s = self.STALE_POLLS * poll_interval_s + self.poll_bound_s
        self.ready_stale_after_s = self.health_spacing_s + self.health_timeout_s + LOCAL_WORK_S + \
            self.STALE_POLLS * poll_interval_s
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()  # one poll at a time on the client's event loop
        # One /health in flight, on its own client (each client owns an event loop).
        self._probe_lock = threading.Lock()
        self._health: tuple[float, float, bool] | None = None  # (started, done, answered 200)
        self._probe_started: float | None = None
        self._state = _State()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._health_thread: threading.Thread | None = None
        self._http = SGLangClient(self.upstream, timeout=timeout_s)
        self._health_http = SGLangClient(self.upstream, timeout=self.health_timeout_s)
        self.plan_path = Path(plan_path) if plan_path is not None else None
        self._plan_stamp = self._stamp()
        self.plan_error = ""
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ---- polling ---------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int, int] | None:
        """(inode, size, mtime_ns) of plan.json, None without a path or when it cannot be read."""
        if self.plan_path is None:
            return None
        try:
            st = os.stat(self.plan_path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def reload_plan(self) -> bool:
        """Load plan.json again when the file changed since it was last read. A new document
        that does not load keeps the plan in use (:attr:`plan_error` says why, logged once per
        change). Returns True when a new plan is in use."""
        stamp = self._stamp()
        if self.plan_path is None or stamp is None or stamp == self._plan_stamp:
            return False
        self._plan_stamp = stamp
        try:
            doc = load_plan(self.plan_path)
            ident = identity_from_plan(doc)
        except PlanDocError as exc:
            self.plan_error = str(exc)
            log.error("plan.json changed but does not load, keeping the plan in use: %s", exc)
            return False
        with self._lock:
            self.plan_doc, self.identity = doc, ident
        self.plan_error = ""
        log.info("plan.json changed: now budget=%s block_size=%s sglang=%s", ident.info[1], ident.info[2],
                 ident.info[6])
        return True

    def poll_once(self) -> Sample:
        """Poll the upstream once (blocking, at most :attr:`poll_bound_s`) and record the sample.
        Never raises for upstream faults: they make the sample not ``up`` (``Sample.error``).
        Loads plan.json again first when it changed. ``/health`` is not probed here
        (:meth:`probe_health`)."""
        self.reload_plan()
        with self._poll_lock:
            s = self._poll()
        self._record(s)
        return s

    def probe_health(self) -> bool | None:
        """One ``/health`` probe (blocking, at most :attr:`health_timeout_s` plus local work),
        recorded for ``ddtree_ready``. Skipped (None) while another probe is in flight or sooner
        than :attr:`health_spacing_s` after the last one started: SGLang keeps each probe's
        generation even when we hang up. Returns whether it answered 200."""
        if not self._probe_lock.acquire(blocking=False):
            return None
        try:
            t0 = self.clock()
            if self._probe_started is not None and t0 - self._probe_started < self.health_spacing_s:
                return None
            self._probe_started = t0
            try:
                ok = self._health_http.health(self.health_timeout_s) == 200
            except SGLangError as exc:
                log.debug("/health: %s", exc)
                ok = False
            with self._lock:
                self._health = (t0, self.clock(), ok)
            return ok
        finally:
            self._probe_lock.release()

    def health_result(self, now: float | None = None) -> bool:
        """The last ``/health`` probe answered 200 and is younger than :attr:`ready_stale_after_s`."""
        with self._lock:
            h = self._health
        now = self.clock() if now is None else now
        return bool(h and h[2] and now - h[1] <= self.ready_stale_after_s)

    def _poll(self) -> Sample:
        c = self._http
        try:
            r = c.get("/metrics")
            s = Sample(t=self.clock())
            if r.status != 200:
                s.error = f"/metrics answered HTTP {r.status}"
            else:
                u = parse_upstream(metrics_text(r))
                if u.load is None:
                    raise SGLangError(f"/metrics answered 200 without {' or '.join(LOAD_GAUGES)}: not SGLang's metrics")
                s.gen_tokens, s.verify_calls, s.sglang_accept_length, s.load = (u.gen_tokens, u.verify_calls,
                                                                                u.accept_length, u.load)
                s.up = True
        except SGLangError as exc:
            s = Sample(t=self.clock(), error=str(exc))
        if s.up:
            for path in SERVER_INFO_PATHS:
                try:
                    r = c.get(path)
                except SGLangError:
                    break
                if r.status == 200:
                    try:
                        info = r.json()
                        s.server_info = info if isinstance(info, dict) else None
                    except SGLangError:
                        pass
                    break
                if r.status != 404:
                    break
            ident = self.identity if self.plan_doc is not None else identity_from_server(self.upstream,
                                                                                           s.server_info)
            path = cheap_ready_path(ident.sglang_version)
            if path is not None:
                try:
                    status = c.get(path).status
                    s.ready_flag = None if status == 404 else status == 200  # 404: a build without it
                except SGLangError:
                    s.ready_flag = False
        else:
            log.debug("upstream not up: %s", s.error)
        s.done_t = self.clock()
        return s

    def _record(self, s: Sample) -> None:
        with self._lock:
            if self.plan_doc is None and s.server_info is not None:
                self.identity = identity_from_server(self.upstream, s.server_info)
            st = self._state
            st.last = s
            if not s.up:
                st.good_since = st.frozen_since = None
                return
            st.last_good_t = s.done_t if s.done_t is not None else s.t
            if st.good_since is None:
                st.good_since = s.t
            if s.load is None or not s.load.has_progress or not s.load.busy:
                st.frozen_since = None
            elif st.frozen_since is None or s.load.progress != st.frozen_since[1]:
                st.frozen_since = (s.t, s.load.progress)  # busy, and the counters moved (or first busy poll)
            if s.gen_tokens is not None:
                # A server without speculation exports no verify counter (real 0.5.17): the
                # token rate needs only the generation counter; acceptance needs both.
                last = st.window[-1] if st.window else None
                if last and (s.gen_tokens < last[1] or (s.verify_calls is None) != (last[2] is None)
                             or (s.verify_calls is not None and s.verify_calls < last[2])):
                    st.window.clear()  # counter reset (SGLang restarted) or the counter set changed
                st.window.append((s.t, s.gen_tokens, s.verify_calls))
                # keep one sample at or before the window start as the baseline
                while len(st.window) >= 2 and st.window[1][0] <= s.t - self.window_s:
                    st.window.popleft()

    def start(self) -> Exporter:
        """Start the background polling thread and the ``/health`` thread (daemons). Returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ddtree-exporter-poll", daemon=True)
            self._thread.start()
            self._health_thread = threading.Thread(target=self._run_health, name="ddtree-exporter-health",
                                                   daemon=True)
            self._health_thread.start()
        return self

    def _run_health(self) -> None:
        """Probe ``/health`` while ``/metrics`` is up, one at a time, :attr:`health_spacing_s` apart."""
        while not self._stop.is_set():
            wait = min(self.poll_interval_s, 0.25)  # until /metrics is up: a cheap look, no request
            try:
                if self.fresh():
                    started = self.clock()
                    if self.probe_health() is not None:
                        wait = max(0.0, self.health_spacing_s - (self.clock() - started))
            except Exception:  # never let the prober die; ddtree_ready goes stale and reads 0
                log.exception("health probe failed")
            self._stop.wait(wait)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = self.clock()
            try:
                self.poll_once()
            except Exception:  # never let the poller die; the staleness figure shows the gap
                log.exception("poll failed")
            self._stop.wait(max(0.0, self.poll_interval_s - (self.clock() - t0)))

    def stop(self, join_timeout: float | None = None) -> None:
        """Stop polling (waits up to ``join_timeout`` seconds for the thread). The client
        is closed once no poll runs (a poll still running past the join is left to finish
        within its bound; the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join_timeout)
            if self._thread.is_alive():
                return
        with self._poll_lock:
            self._http.close()
        if self._probe_lock.acquire(blocking=False):  # a probe in flight keeps its client until it ends
            try:
                self._health_http.close()
            finally:
                self._probe_lock.release()

    # ---- derived figures -------------------------------------------------------------
    def window_rates(self) -> tuple[float | None, float | None]:
        """``(accept_length, generation_tokens_per_second)`` over the window, None when
        undefined (fewer than two samples; accept length also when no verify pass finished)."""
        with self._lock:
            w = list(self._state.window)
        if len(w) < 2:
            return None, None
        (t0, g0, v0), (t1, g1, v1) = w[0], w[-1]
        dt, dg = t1 - t0, g1 - g0
        dv = v1 - v0 if v0 is not None and v1 is not None else 0.0
        accept = dg / dv if dv > 0 else None
        tps = dg / dt if dt > 0 else None
        finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731 (absurd counters)
        return finite(accept), finite(tps)

    def scheduler_stuck(self) -> float | None:
        """``ddtree_scheduler_stuck``: 1.0 when every good poll of the last
        :attr:`stuck_after_s` seconds saw requests running or queued and the same progress
        counters; 0.0 otherwise; None while the last sample is not up or fewer than
        :attr:`stuck_after_s` seconds of consecutive good polls exist, or when the server
        exposes none of :data:`~ddtree_ops.runtime.health.PROGRESS_COUNTERS`."""
        with self._lock:
            st = self._state
            last, good_since, frozen = st.last, st.good_since, st.frozen_since
        if last is None or not last.up or good_since is None or last.t - good_since < self.stuck_after_s:
            return None
        if last.load is None or not last.load.has_progress:
            return None  # no progress counter exposed: cannot judge
        return 1.0 if frozen is not None and last.t - frozen[0] >= self.stuck_after_s else 0.0

    def snapshot(self) -> tuple[Sample | None, float | None]:
        with self._lock:
            return self._state.last, self._state.last_good_t

    def fresh(self, now: float | None = None) -> bool:
        """The last sample is good and younger than :attr:`stale_after_s`."""
        last, last_good = self.snapshot()
        now = self.clock() if now is None else now
        return bool(last and last.up and last_good is not None and now - last_good <= self.stale_after_s)


class _Collector(Collector):
    """Turns the exporter's cached state into metric families (no I/O: scrapes never block)."""

    def __init__(self, exporter: Exporter) -> None:
        self.e = exporter

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        e = self.e
        ident = e.identity  # one read: without a plan the poller replaces it as the server says more
        lv = list(ident.labels)
        last, last_good = e.snapshot()
        now = e.clock()

        def gauge(name: str, value: float | None) -> GaugeMetricFamily:
            """The family ``name`` of :data:`METRICS`, with one series of ``value`` unless None."""
            doc, extra = METRICS[name]
            g = GaugeMetricFamily(name, doc.format(window_s=e.window_s, stuck_after_s=e.stuck_after_s),
                                  labels=[*LABELS, *extra])
            if value is not None:
                g.add_metric(lv, value)
            return g

        up = e.fresh(now)  # a sample older than stale_after_s is no sample, whatever the poller does
        yield gauge("ddtree_up", 1.0 if up else 0.0)
        ready = up and last is not None and e.health_result(now) and last.ready_flag is not False
        yield gauge("ddtree_ready", 1.0 if ready else 0.0)
        since = last_good if last_good is not None else e.started
        yield gauge("ddtree_upstream_staleness_seconds", max(0.0, now - since))
        yield gauge("ddtree_accept_length_floor", ident.floor)  # absent without a plan
        info = gauge("ddtree_deployment_info", None)
        info.add_metric([*lv, *ident.info], 1.0)
        yield info

        server_info = last.server_info if (up and last) else None
        spec = ident.speculative
        if server_info is not None and "speculative_algorithm" in server_info:
            spec = server_info["speculative_algorithm"] not in (None, "", "NONE", "none")
        yield gauge("ddtree_speculative_enabled", 1.0 if spec else 0.0)

        drift = gauge("ddtree_config_drift", None)
        per = gauge("ddtree_config_drift_settings", None)
        if server_info is not None and e.plan_doc is not None:
            try:
                drifts, missing = find_drift(e.plan_doc, server_info)
            except (KeyError, TypeError):
                drifts, missing = None, []
            if drifts is not None and "model_path" in missing and "tp_size" in missing:
                drifts = None  # every SGLang reports both: nothing was compared, drift unknown (absent)
            if drifts is not None:
                drift.add_metric(lv, 1.0 if drifts else 0.0)
                names = {d.name for d in drifts}
                for setting in compared_settings():
                    if setting not in missing:
                        per.add_metric([*lv, setting], 1.0 if setting in names else 0.0)
        yield drift
        yield per

        accept, tps = e.window_rates() if up else (None, None)
        yield gauge("ddtree_accept_length", accept)
        # Real SGLang without speculation exports spec_accept_length 0.0 (0.5.17 captures): no
        # acceptance to report, so absent rather than a 0 that reads as a collapse.
        yield gauge("ddtree_accept_length_sglang", last.sglang_accept_length if up and last and spec else None)
        yield gauge("ddtree_generation_tokens_per_second", tps)
        yield gauge("ddtree_scheduler_stuck", e.scheduler_stuck() if up else None)


def serve(exporter: Exporter, host: str, port: int):
    """Serve the exporter's registry on ``http://host:port/metrics`` (threaded, daemon).

    The listener is :mod:`ddtree_ops.runtime.exporter_http`'s: a connection limit and a total
    deadline per connection, so idle or slow clients cannot take the descriptors scrapes need.

    Returns:
        ``(server, thread)``; ``server.server_port`` is the bound port (``port=0`` picks a free one).
    """
    from .exporter_http import serve_registry

    return serve_registry(exporter.registry, host, port)
