"""Prometheus alert rules and the Grafana dashboard of a fleet, generated from Python.

The rules read the exporter's contract (:data:`ddtree_ops.runtime.exporter.METRIC_NAMES`) and
SGLang's own metric names as the fleet's pinned releases spell them
(:func:`ddtree_ops.config.sglang_metrics.promql_selector`, read off each release's wheel),
scraped by the ``sglang`` job of :func:`ddtree_ops.render.files.render_prometheus`. The acceptance-length
floor is per deployment: each exporter exports its ``ddtree_ops.accept_length_floor`` as
``ddtree_accept_length_floor``, and the collapse rule compares the two series of the same
target, so one rules file serves deployments with different floors. Durations and the
fleet-wide thresholds come from :class:`AlertSettings` (role variables of
``prometheus_targets``; tests shorten the ``for`` durations).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import yaml

from ..config.sglang_metrics import promql_selector
from .files import EXPORTER_JOB, ROUTER_JOB, SGLANG_JOB

if TYPE_CHECKING:
    from ..config.load import Validated

RULES_FILE = "ddtree-rules.yml"
"""File name of the alert rules in the Prometheus config directory (``prometheus_targets`` role: ``rules_path``)."""
DASHBOARD_FILE = "ddtree-dashboard.json"
"""File name of the Grafana dashboard in the Prometheus config directory (role: ``dashboard_path``)."""
PROMETHEUS_CONFIG_DIR = "/etc/prometheus"
"""Prometheus' configuration directory in Debian's and Ubuntu's ``prometheus`` package (where
``ddtree-ops render`` points ``rule_files`` at; the ``prometheus_targets`` role's
``prometheus_targets_config_dir`` default)."""
DASHBOARD_UID = "ddtree-ops"
SMG_METRICS = ("smg_worker_health", "smg_worker_pool_size", "smg_worker_cb_state", "smg_http_responses_total",
               "smg_router_request_duration_seconds", "smg_worker_requests_active",
               "smg_router_upstream_responses_total")
"""The smg 1.13.0 families the router rules and panels read, as the real router exported them on
an H200 (``tests/fixtures/gpu/router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02/metrics_*.txt``:
``smg_worker_health{worker}`` 1 healthy / 0 unhealthy, ``smg_worker_pool_size{model}``,
``smg_worker_cb_state{worker}`` 0 closed / 1 open / 2 half_open,
``smg_http_responses_total{path, status_code, error_code}``, the histogram
``smg_router_request_duration_seconds``, ``smg_worker_requests_active{worker}``,
``smg_router_upstream_responses_total{status_code, error_code}``); ``tests/test_monitoring.py``
holds this list to the fixture."""
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_BY = "host, host_class, model"


def _releases(validated: Sequence[Validated]) -> list[str]:
    """The SGLang releases the fleet's deployments pin (their base release); empty: every release read."""
    return sorted({v.deployment.sglang.base_version for v in validated})


def monitoring_paths(config_dir: str, rules_path: str = "", dashboard_path: str = "") -> dict[str, str]:
    """Where the rules and the dashboard land on the monitoring host: ``rules_path`` and
    ``dashboard_path`` as given, an empty one ``<config_dir>/`` + :data:`RULES_FILE` /
    :data:`DASHBOARD_FILE` (what the ``ddtree_prometheus`` action returns to the
    ``prometheus_targets`` role, whose path variables default to empty).

    Raises:
        ValueError: a path that is not absolute or holds a control character (one line naming it).
    """
    paths = {"rules_path": rules_path or f"{config_dir.rstrip('/')}/{RULES_FILE}",
             "dashboard_path": dashboard_path or f"{config_dir.rstrip('/')}/{DASHBOARD_FILE}"}
    for name, path in paths.items():
        if not path.startswith("/") or re.search(r"[\x00-\x1f\x7f]", path):
            raise ValueError(f"ddtree_prometheus {name} = {path[:200]!r}{'…' if len(path) > 200 else ''}: must be "
                             "an absolute path without control characters. Fix: set prometheus_targets_config_dir "
                             "(or the file variable) to an absolute path, e.g. /etc/prometheus")
    return paths


class AlertSettingsError(ValueError):
    """A setting of :class:`AlertSettings` is out of range (message names field, value, rule, fix)."""


@dataclass(frozen=True)
class AlertSettings:
    """Durations (Prometheus duration strings, e.g. ``10m``) and thresholds of the rules.

    Attributes:
        collapse_for: how long acceptance length must stay below the floor (10 minutes by default).
        down_for: how long ``ddtree_up == 0`` (or the exporter target down) before alerting.
        not_ready_for: how long up but ``/health`` not 200.
        drift_for: how long ``ddtree_config_drift == 1``.
        queue_reqs: waiting requests (``sglang:num_queue_reqs``, max over ranks) that count as build-up.
        queue_for: how long the queue must stay above ``queue_reqs``.
        ttft_p99_s: time-to-first-token p99 threshold, seconds.
        ttft_for: how long p99 must stay above ``ttft_p99_s``.
        rate_window: range of ``rate()`` for the TTFT histogram (>= 4 scrape intervals).
        stuck_for: how long ``ddtree_scheduler_stuck == 1`` before paging.
        stale_s: age of the exporter's last good upstream sample (seconds) that counts as stale
            (default: many poll intervals of 5 s plus their timeouts).
        stale_for: how long the sample must stay older than ``stale_s``.
        interval: evaluation interval of the rule group.
        router_down_for: how long a router has no healthy worker before paging.
        router_cb_for: how long a worker's circuit breaker stays open at a router.
        router_error_ratio: share of a router's answers that are 5xx (over ``rate_window``).
        router_error_for: how long it must stay above ``router_error_ratio``.
    """

    collapse_for: str = "10m"
    down_for: str = "2m"
    not_ready_for: str = "5m"
    drift_for: str = "1m"
    queue_reqs: float = 32
    queue_for: str = "5m"
    ttft_p99_s: float = 5.0
    ttft_for: str = "10m"
    rate_window: str = "5m"
    stuck_for: str = "2m"
    stale_s: float = 120
    stale_for: str = "5m"
    interval: str = "30s"
    router_down_for: str = "1m"
    router_cb_for: str = "2m"
    router_error_ratio: float = 0.05
    router_error_for: str = "5m"

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "str":
                if not isinstance(v, str) or not _DURATION.match(v):
                    raise AlertSettingsError(f"alert setting {f.name} = {v!r}: must be a Prometheus duration. "
                                             "Fix: write e.g. 30s, 5m or 1h")
            elif isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or v != v:
                raise AlertSettingsError(f"alert setting {f.name} = {v!r}: must be a number > 0. Fix: e.g. "
                                         f"{getattr(AlertSettings, f.name)}")

    @classmethod
    def from_dict(cls, values: dict) -> AlertSettings:
        """Build from a mapping (unknown keys are an error; None means default).

        Raises:
            AlertSettingsError: unknown key or bad value.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise AlertSettingsError(f"alert settings {unknown}: unknown. Fix: use only {sorted(known)}")
        return cls(**{k: v for k, v in values.items() if v is not None})


def _promql_str(value: str) -> str:
    """A PromQL string literal (double quotes; JSON escapes are PromQL's Go escapes)."""
    return json.dumps(value, allow_nan=False)


def absent_rules(validated: Sequence[Validated], settings: AlertSettings = AlertSettings()) -> list[dict]:
    """``DDTreeExporterAbsent``: ``absent(ddtree_up{...})`` for every deployment (its ``host``
    and ``service`` target labels, see ``render_prometheus``), joined with ``or`` into one rule
    (``absent()`` keeps the equality labels, so each deployment alerts on its own). When a
    node dies, both of its targets are down and every exporter-only series vanishes, so no
    rule on them can fire; this one does (critical). No deployments: no rule. A node of rank >= 1
    of a multi-node server runs no exporter (``render_host``: only the node serving the API
    does), so it gets no term: its ``absent()`` would fire for as long as the server runs; its
    SGLang target's ``up`` (``DDTreeSGLangDown``) names it when it dies."""
    terms = []
    for v in sorted(validated, key=lambda v: (v.deployment.host, v.deployment.service.name)):
        if not v.deployment.serves_http:
            continue
        sel = (f"job={_promql_str(EXPORTER_JOB)}, host={_promql_str(v.deployment.host)}, "
               f"service={_promql_str(v.deployment.service.name)}")
        terms.append(f"absent(ddtree_up{{{sel}}})")
    out = []
    if terms:
        out.append({
            "alert": "DDTreeExporterAbsent",
            "expr": " or ".join(dict.fromkeys(terms)),
            "for": settings.down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.host }}: no ddtree_* series from the exporter of {{ $labels.service }}",
                "runbook": "The host or both of its services are gone (SGLang and exporter targets down, or never "
                           "scraped): check the node is up (ping, BMC), then systemctl status of "
                           "ddtree-{{ $labels.service }}.service and its exporter; confirm the scrape config lists it.",
            },
        })
    return out


def alert_rules(settings: AlertSettings = AlertSettings(), validated: Sequence[Validated] = ()) -> list[dict]:
    """The alerting rules, each ``{alert, expr, for, labels, annotations}`` with a ``runbook``
    annotation (one line: what to look at and what to do); with ``validated`` deployments,
    also their :func:`absent_rules`."""
    s = settings
    sg = f'job="{SGLANG_JOB}"'
    rel = _releases(validated)
    return [
        {
            "alert": "DDTreeAcceptLengthCollapse",
            "expr": "ddtree_accept_length < ddtree_accept_length_floor and ddtree_speculative_enabled == 1",
            "for": s.collapse_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": '{{ $labels.host }}: acceptance length {{ $value | printf "%.2f" }} is below the '
                "deployment's floor",
                "runbook": "Speculation is not paying: check the draft checkpoint and block_size against plan.json "
                "(ddtree-ops health --json), ddtree_config_drift_settings, and the SGLang log for "
                "graph/eager fallbacks; roll back the last draft or config change.",
            },
        },
        {
            "alert": "DDTreeServiceDown",
            "expr": "ddtree_up == 0",
            "for": s.down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.host }}: SGLang does not answer /metrics",
                "runbook": "systemctl status and journalctl -u of the SGLang unit on the host; a unit in its "
                "restart loop points at a crash (graph-size mismatch, OOM, NCCL): see the last log lines.",
            },
        },
        {
            "alert": "DDTreeExporterDown",
            "expr": f'up{{job="{EXPORTER_JOB}"}} == 0',
            "for": s.down_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.host }}: the ddtree-ops exporter is not scraped",
                "runbook": "systemctl status ddtree-{{ $labels.service }}-exporter.service on {{ $labels.host }}; "
                "check that the exporter port (ddtree_ops.exporter_port) is reachable from Prometheus.",
            },
        },
        {
            "alert": "DDTreeSGLangDown",
            "expr": f"up{{{sg}}} == 0",
            "for": s.down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.host }}: Prometheus cannot scrape SGLang's /metrics",
                "runbook": "The SGLang process or its host is down (this fires without the exporter, e.g. when the "
                "node dies): check the host, then systemctl status / journalctl -u "
                "ddtree-{{ $labels.service }}.service for a crash or restart loop.",
            },
        },
        {
            "alert": "DDTreeSchedulerStuck",
            "expr": "ddtree_scheduler_stuck == 1",
            "for": s.stuck_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.host }}: SGLang's scheduler is stuck (requests waiting, no tokens generated)",
                "runbook": "SGLang answers HTTP but makes no progress: capture py-spy dump of the scheduler processes "
                "and the last log lines, then restart ddtree-{{ $labels.service }}.service.",
            },
        },
        {
            "alert": "DDTreeUpstreamStale",
            "expr": f"ddtree_upstream_staleness_seconds > {s.stale_s:g}",
            "for": s.stale_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": '{{ $labels.host }}: the exporter\'s last good SGLang sample is {{ $value | printf "%.0f" '
                           '}} s old',
                "runbook": "The exporter cannot read SGLang's /metrics (slow or hung server, or a stuck poller): "
                "compare with DDTreeServiceDown, curl /metrics on the host, restart the exporter unit "
                "if SGLang answers.",
            },
        },
        {
            "alert": "DDTreeNotReady",
            "expr": "ddtree_up == 1 and ddtree_ready == 0",
            "for": s.not_ready_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.host }}: SGLang answers but /health is not 200",
                "runbook": "Run ddtree-ops health URL --json on the host: a long warmup, a stuck scheduler or "
                "exhausted KV cache keep /health from generating; restart the unit if it stays stuck.",
            },
        },
        {
            "alert": "DDTreeConfigDrift",
            "expr": "ddtree_config_drift == 1",
            "for": s.drift_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.host }}: the running server differs from the deployed config",
                "runbook": "ddtree_config_drift_settings == 1 names the settings; re-run deploy.yml for the host "
                "(restarts onto plan.json) or find who started SGLang by hand.",
            },
        },
        {
            "alert": "DDTreeQueueBuildup",
            "expr": f"max by ({_BY}) ({promql_selector('num_queue_reqs', rel, sg)}) > {s.queue_reqs:g}",
            "for": s.queue_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.host }}: {{ $value }} requests waiting",
                "runbook": "Load exceeds max_running_requests or the KV cache (sglang:token_usage near 1): add "
                "capacity or shed load; a queue with flat generation counters is a stuck scheduler.",
            },
        },
        {
            "alert": "DDTreeTTFTHigh",
            "expr": (
                f"histogram_quantile(0.99, sum by ({_BY}, le) "
                f"(rate({promql_selector('time_to_first_token_seconds', rel, sg, '_bucket')}[{s.rate_window}]))) "
                f"> {s.ttft_p99_s:g}"
            ),
            "for": s.ttft_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": '{{ $labels.host }}: TTFT p99 {{ $value | printf "%.2f" }} s',
                "runbook": "Long prefills or queueing: compare with sglang:num_queue_reqs and prompt sizes; "
                "consider chunked-prefill size, more replicas or a lower max_running_requests.",
            },
        },
        *router_rules(s),
        *absent_rules(validated, s),
    ]


def router_rules(settings: AlertSettings = AlertSettings()) -> list[dict]:
    """The router's alerts over smg 1.13.0's families (:data:`SMG_METRICS`, job
    :data:`ROUTER_JOB`): no healthy worker, a worker's circuit breaker open, the share of 5xx
    answers. Without routers their series do not exist and nothing fires."""
    s = settings
    rj = f'job="{ROUTER_JOB}"'
    return [
        {
            "alert": "DDTreeRouterNoHealthyWorkers",
            "expr": (f"(sum by (host) (smg_worker_health{{{rj}}}) < 1) or "
                     f"(sum by (host) (smg_worker_pool_size{{{rj}}}) < 1)"),
            "for": s.router_down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "router {{ $labels.host }}: no healthy worker",
                "runbook": "Every request through this router fails: ddtree-ops fleet status (router column), then "
                "the instances' units and health; a worker left drained by a cut-off rollout is re-added with "
                "python -m ddtree_ops.fleet.router_worker add on the router host (docs/router.md).",
            },
        },
        {
            "alert": "DDTreeRouterCircuitOpen",
            "expr": f"max by (host, worker) (smg_worker_cb_state{{{rj}}}) == 1",
            "for": s.router_cb_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "router {{ $labels.host }}: circuit breaker open for {{ $labels.worker }}",
                "runbook": "The router stopped sending requests to this worker after repeated failures: check the "
                "worker's journal and health; it closes again by itself once the worker answers.",
            },
        },
        {
            "alert": "DDTreeRouterErrorRate",
            "expr": (f"sum by (host) (rate(smg_http_responses_total{{{rj}, status_code=~\"5..\"}}[{s.rate_window}])) "
                     f"/ sum by (host) (rate(smg_http_responses_total{{{rj}}}[{s.rate_window}])) "
                     f"> {s.router_error_ratio:g}"),
            "for": s.router_error_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": 'router {{ $labels.host }}: {{ $value | printf "%.2f" }} of answers are 5xx',
                "runbook": "Workers fail or time out behind the router: smg_router_upstream_responses_total by "
                "error_code names the cause; check the workers and the router's journal.",
            },
        },
    ]


def render_rules(settings: AlertSettings = AlertSettings(), validated: Sequence[Validated] = ()) -> str:
    """The rules file (YAML) for Prometheus ``rule_files``: :func:`alert_rules` of the fleet's
    validated deployments (the same list ``render_prometheus`` gets)."""
    from .files import MANAGED, YAML_DUMPER

    doc = {"groups": [{"name": "ddtree-ops", "interval": settings.interval,
                       "rules": alert_rules(settings, validated)}]}
    return f"# {MANAGED}\n" + yaml.dump(doc, Dumper=YAML_DUMPER, sort_keys=False, width=1000, allow_unicode=True)


# --------------------------------------------------------------------------- dashboard
def _panel(pid: int, title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int,
           w: int = 12, h: int = 8) -> dict:
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
    }


def dashboard_panels(validated: Sequence[Validated] = ()) -> list[dict]:
    """Dashboard panels (Grafana schema ``timeseries``), one query per series kind, per host;
    SGLang's own series by the names of the fleet's pinned releases (every release read when
    ``validated`` is empty)."""
    h = 'host=~"$host"'
    sg = f'job="{SGLANG_JOB}", {h}'
    rel = _releases(validated)

    def m(key: str, suffix: str = "") -> str:
        return promql_selector(key, rel, sg, suffix)

    q = "histogram_quantile({q}, sum by (host, le) (rate({sel}[$__rate_interval])))"
    rows = [
        ("Acceptance length (tokens per verify pass)",
         [(f"ddtree_accept_length{{{h}}}", "{{host}} window"),
          (f"ddtree_accept_length_sglang{{{h}}}", "{{host}} SGLang gauge"),
          (f"ddtree_accept_length_floor{{{h}}}", "{{host}} floor")], "none"),
        ("Generation tokens per second",
         [(f"ddtree_generation_tokens_per_second{{{h}}}", "{{host}}"),
          (f"sum by (host) ({m('gen_throughput')})", "{{host}} SGLang gauge")], "none"),
        ("Time to first token",
         [(q.format(q="0.5", sel=m("time_to_first_token_seconds", "_bucket")), "{{host}} p50"),
          (q.format(q="0.99", sel=m("time_to_first_token_seconds", "_bucket")), "{{host}} p99")], "s"),
        ("Inter-token latency",
         [(q.format(q="0.5", sel=m("inter_token_latency_seconds", "_bucket")), "{{host}} p50"),
          (q.format(q="0.99", sel=m("inter_token_latency_seconds", "_bucket")), "{{host}} p99")], "s"),
        ("Requests: queued and running",
         [(f"max by (host) ({m('num_queue_reqs')})", "{{host}} queued"),
          (f"max by (host) ({m('num_running_reqs')})", "{{host}} running")], "none"),
        ("Up, ready, config drift",
         [(f"ddtree_up{{{h}}}", "{{host}} up"), (f"ddtree_ready{{{h}}}", "{{host}} ready"),
          (f"ddtree_config_drift{{{h}}}", "{{host}} drift"),
          (f"ddtree_upstream_staleness_seconds{{{h}}}", "{{host}} staleness s")], "none"),
    ]
    r = f'job="{ROUTER_JOB}", host=~"$router"'
    rq = "histogram_quantile({q}, sum by (host, le) (rate(smg_router_request_duration_seconds_bucket{{{sel}}}"
    rows += [
        ("Router: healthy workers, pool size",
         [(f"sum by (host) (smg_worker_health{{{r}}})", "{{host}} healthy"),
          (f"sum by (host) (smg_worker_pool_size{{{r}}})", "{{host}} registered")], "none"),
        ("Router: circuit breaker (0 closed, 1 open, 2 half-open) and active requests per worker",
         [(f"max by (host, worker) (smg_worker_cb_state{{{r}}})", "{{host}} {{worker}} breaker"),
          (f"sum by (host, worker) (smg_worker_requests_active{{{r}}})", "{{host}} {{worker}} active")], "none"),
        ("Router: answers by status code",
         [(f"sum by (host, status_code) (rate(smg_http_responses_total{{{r}}}[$__rate_interval]))",
           "{{host}} {{status_code}}")], "reqps"),
        ("Router: request duration",
         [((rq + "[$__rate_interval])))").format(q="0.5", sel=r), "{{host}} p50"),
          ((rq + "[$__rate_interval])))").format(q="0.99", sel=r), "{{host}} p99")], "s"),
    ]
    return [_panel(i + 1, title, targets, unit, x=12 * (i % 2), y=8 * (i // 2))
            for i, (title, targets, unit) in enumerate(rows)]


def render_dashboard(validated: Sequence[Validated] = ()) -> str:
    """Grafana dashboard JSON (importable; ``datasource`` and ``host`` template variables) for
    the fleet's deployments ``validated`` (:func:`dashboard_panels`)."""
    doc = {
        "uid": DASHBOARD_UID,
        "title": "ddtree-ops: speculative decoding",
        "description": "Generated by ddtree-ops (ddtree_ops/render/monitoring.py); do not edit by hand.",
        "tags": ["ddtree-ops", "sglang"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "host", "type": "query", "label": "host", "multi": True, "includeAll": True,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(ddtree_deployment_info, host)", "refresh": 2},
            {"name": "router", "type": "query", "label": "router", "multi": True, "includeAll": True,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(smg_worker_pool_size, host)", "refresh": 2},
        ]},
        "annotations": {"list": []},
        "panels": dashboard_panels(validated),
    }
    return json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n"
