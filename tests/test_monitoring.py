"""Alert rules, dashboard and scrape config, proven with the real ``promtool`` and a real
Prometheus server (the controller's ``prometheus`` binary, started here on loopback).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time

import httpx
import pytest
import yaml
from helpers import base_hostvars
from prometheus_client import CollectorRegistry
from test_exporter import fixtures_dir, generate, sim_deployment
from test_sim import Sim, post_json

from ddtree_ops.config import validate_hostvars
from ddtree_ops.render.files import plan_document, render_prometheus
from ddtree_ops.render.monitoring import (
    AlertSettings,
    AlertSettingsError,
    alert_rules,
    dashboard_panels,
    render_dashboard,
    render_rules,
)
from ddtree_ops.runtime.exporter import METRIC_NAMES, Exporter, serve

pytestmark = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed (scripts/setup.sh)")

EXP = {"host": "h1", "host_class": "b300", "model": "m", "job": "ddtree_exporter", "instance": "h1:19400",
       "service": "sglang", "algorithm": "DDTREE"}


def _series(name: str, labels: dict, values: str) -> dict:
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{lab}}}", "values": values}


def _annotations(alert: dict, labels: dict, value: float | None) -> dict:
    """The rule's annotations with Prometheus' template expansion for the forms it uses."""
    out = {}
    for k, text in alert["annotations"].items():
        for lk, lv in labels.items():
            text = text.replace(f"{{{{ $labels.{lk} }}}}", lv)
        if value is not None:
            text = (text.replace('{{ $value | printf "%.2f" }}', f"{value:.2f}").replace("{{ $value }}", f"{value:g}")
                .replace('{{ $value | printf "%.0f" }}', f"{value:.0f}"))
        out[k] = text
    return out


def _host(host: str, **extra: str) -> dict:
    return {**EXP, "host": host, "instance": f"{host}:19400", **extra}


def _sg(host: str, **extra: str) -> dict:
    return {**_host(host), "job": "sglang", "instance": f"{host}:30000", "model_name": "m", **extra}


DEPLOYED = [validate_hostvars(h, base_hostvars()) for h in ("h1", "h2")]
"""The fleet the per-deployment rules (absent series) are rendered for: h1 and h2, service sglang."""
ABSENT_LABELS = {"job": "ddtree_exporter", "service": "sglang"}


# For every alert: input series, then (eval_time, {host: expected value} of the hosts firing).
# Each case has hosts that must NOT fire, and an early eval time at which nothing fires yet.
TTFT_P99_SLOW = 5 + (10 - 5) * 0.99  # every observation in the (5, 10] bucket
CASES = {
    "DDTreeAcceptLengthCollapse": (
        [*[_series(n, _host(h), v) for h, vals in {
            "h1": ("1.0x30", "1.5x30", "1x30"),  # collapsed, speculation on: fires
            "h2": ("5.5x30", "1.5x30", "1x30"),  # healthy
            "h3": ("1.0x30", "1.5x30", "0x30"),  # speculation off: accept length means nothing
          }.items() for n, v in zip(("ddtree_accept_length", "ddtree_accept_length_floor",
                                     "ddtree_speculative_enabled"), vals, strict=True)],
         # h4: dips below the floor for 5 minutes only
         _series("ddtree_accept_length", _host("h4"), "5x5 1x5 5x20"),
         _series("ddtree_accept_length_floor", _host("h4"), "1.5x30"),
         _series("ddtree_speculative_enabled", _host("h4"), "1x30")],
        [("9m", {}), ("15m", {"h1": 1.0})],
    ),
    "DDTreeServiceDown": (
        [_series("ddtree_up", _host("h1"), "0x10"), _series("ddtree_up", _host("h2"), "1x10"),
         _series("ddtree_up", _host("h3"), "0 1 0 1 0 1 0 1 0 1")],  # flapping: never down for 2m
        [("1m", {}), ("5m", {"h1": 0})],
    ),
    "DDTreeExporterDown": (
        [_series("up", _host("h1"), "0x10"), _series("up", _host("h2"), "1x10"),
         _series("up", _sg("h3"), "0x10")],  # the SGLang job down is DDTreeServiceDown's business
        [("1m", {}), ("5m", {"h1": 0})],
    ),
    "DDTreeNotReady": (
        [_series("ddtree_up", _host("h1"), "1x10"), _series("ddtree_ready", _host("h1"), "0x10"),
         _series("ddtree_up", _host("h2"), "0x10"), _series("ddtree_ready", _host("h2"), "0x10"),
         _series("ddtree_up", _host("h3"), "1x10"), _series("ddtree_ready", _host("h3"), "1x10")],
        [("4m", {}), ("7m", {"h1": 1})],
    ),
    "DDTreeConfigDrift": (
        [_series("ddtree_config_drift", _host("h1"), "1x10"), _series("ddtree_config_drift", _host("h2"), "0x10")],
        [("0m", {}), ("3m", {"h1": 1})],
    ),
    "DDTreeQueueBuildup": (
        [*[_series("sglang:num_queue_reqs", _sg("h1", tp_rank=str(r)), "40x10") for r in range(2)],
         _series("sglang:num_queue_reqs", _sg("h2", tp_rank="0"), "10x10"),
         _series("sglang:num_queue_reqs", _host("h4"), "99x10")],  # not the sglang job
        [("4m", {}), ("7m", {"h1": 40})],
    ),
    "DDTreeTTFTHigh": (
        [*[_series("sglang:time_to_first_token_seconds_bucket", _sg("h1", le=le), v)
           for le, v in (("0.5", "0x30"), ("5", "0x30"), ("10", "0+10x30"), ("+Inf", "0+10x30"))],
         *[_series("sglang:time_to_first_token_seconds_bucket", _sg("h2", le=le), v)
           for le, v in (("0.5", "0+10x30"), ("5", "0+10x30"), ("10", "0+10x30"), ("+Inf", "0+10x30"))]],
        [("8m", {}), ("20m", {"h1": TTFT_P99_SLOW})],
    ),
    "DDTreeSGLangDown": (
        [_series("up", _sg("h1"), "0x10"), _series("up", _sg("h2"), "1x10"),
         _series("up", _host("h3"), "0x10")],  # the exporter job down is DDTreeExporterDown's business
        [("1m", {}), ("5m", {"h1": 0})],
    ),
    # A dead node: both targets of h1 down, so its ddtree_* series are gone; h2 healthy; h3
    # is not a deployment of this fleet (no rule for it).
    "DDTreeExporterAbsent": (
        [_series("up", _sg("h1"), "0x10"), _series("up", _host("h1"), "0x10"),
         _series("ddtree_up", _host("h2"), "1x10")],
        [("1m", {}), ("5m", {"h1": 1})],
    ),
    "DDTreeSchedulerStuck": (
        [_series("ddtree_scheduler_stuck", _host("h1"), "1x10"), _series("ddtree_scheduler_stuck", _host("h2"), "0x10"),
         _series("ddtree_scheduler_stuck", _host("h3"), "1 0 1 0 1 0 1 0 1 0")],
        [("1m", {}), ("5m", {"h1": 1})],
    ),
    "DDTreeUpstreamStale": (
        [_series("ddtree_upstream_staleness_seconds", _host("h1"), "200x10"),
         _series("ddtree_upstream_staleness_seconds", _host("h2"), "3x10"),
         _series("ddtree_upstream_staleness_seconds", _host("h3"), "200 200 3x8")],  # recovered
        [("4m", {}), ("7m", {"h1": 200})],
    ),
}


ROUTER_FIXTURE = "gpu/router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02"


def _gw(host: str, **extra: str) -> dict:
    """Target labels of a router's smg metrics (job smg, render_prometheus) plus series labels."""
    return {"job": "smg", "host": host, "service": "router", "instance": f"{host}:29000", **extra}


CASES.update({
    "DDTreeRouterNoHealthyWorkers": (
        [_series("smg_worker_health", _gw("g1", worker="http://10.0.0.1:30000"), "1 1 0x8"),
         _series("smg_worker_health", _gw("g1", worker="http://10.0.0.2:30000"), "1 1 0x8"),
         _series("smg_worker_health", _gw("g2", worker="http://10.0.0.1:30000"), "1x10"),
         _series("smg_worker_health", _gw("g2", worker="http://10.0.0.2:30000"), "0x10")],  # one left: no alert
        [("1m", {}), ("5m", {"g1": 0})],
    ),
    "DDTreeRouterCircuitOpen": (
        [_series("smg_worker_cb_state", _gw("g1", worker="http://10.0.0.1:30000"), "0 1x9"),
         _series("smg_worker_cb_state", _gw("g2", worker="http://10.0.0.1:30000"), "0 2x9"),  # half-open
         _series("smg_worker_cb_state", _gw("g3", worker="http://10.0.0.1:30000"), "0 1 0x8")],  # closed again
        [("2m", {}), ("5m", {"g1": 1})],
    ),
    "DDTreeRouterErrorRate": (
        [_series("smg_http_responses_total", _gw("g1", path="/generate", status_code="200", error_code=""),
                 "0+60x20"),
         _series("smg_http_responses_total", _gw("g1", path="/generate", status_code="500",
                                                 error_code="call_upstream_connection_failed"), "0+20x20"),
         _series("smg_http_responses_total", _gw("g2", path="/generate", status_code="200", error_code=""),
                 "0+60x20"),
         _series("smg_http_responses_total", _gw("g2", path="/generate", status_code="503", error_code=""),
                 "0+1x20")],  # 1/61 < 0.05
        [("4m", {}), ("12m", {"g1": 0.25})],
    ),
})


def test_smg_families_the_rules_read_are_the_recorded_routers():
    """Every family of SMG_METRICS is in the real smg 1.13.0's recorded /metrics (the GPU fixture),
    with the labels the rules group by; a name the router does not export is caught."""
    from ddtree_ops.render.monitoring import SMG_METRICS

    text = "".join((fixtures_dir() / ROUTER_FIXTURE / f).read_text()
                   for f in ("metrics_idle.txt", "metrics_after_latency.txt", "metrics_after_crash.txt"))
    types = dict(re.findall(r"^# TYPE (smg_\w+) (\w+)$", text, re.M))
    for name in SMG_METRICS:
        assert name in types, name
    assert types["smg_router_request_duration_seconds"] == "histogram"
    assert re.search(r'^smg_worker_health\{worker="http://127.0.0.1:30003"\} [01]$', text, re.M)
    assert re.search(r'^smg_worker_cb_state\{worker="[^"]+"\} [012]$', text, re.M)
    assert re.search(r'^smg_http_responses_total\{path="[^"]+",status_code="\d+",error_code="[^"]*"\} \d+$', text,
                     re.M)
    assert "smg_worker_healthy" not in types  # the check can fail: a misspelt family is absent


def test_every_alert_has_a_case_and_a_runbook() -> None:
    rules = alert_rules(validated=DEPLOYED)
    assert sorted({r["alert"] for r in rules}) == sorted(CASES)
    assert [r["expr"] for r in rules if r["alert"] == "DDTreeExporterAbsent"] == [" or ".join(
        f'absent(ddtree_up{{job="ddtree_exporter", host="{h}", service="sglang"}})' for h in ("h1", "h2"))]
    assert "DDTreeExporterAbsent" not in {r["alert"] for r in alert_rules()}  # no fleet, no per-deployment rules
    assert all(r["annotations"]["runbook"].strip() and "\n" not in r["annotations"]["runbook"] for r in rules)


def test_rules_pass_promtool_check(tmp_path) -> None:
    p = tmp_path / "rules.yml"
    p.write_text(render_rules(validated=DEPLOYED))
    r = subprocess.run(["promtool", "check", "rules", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "14 rules found" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("alert", sorted(CASES))
def test_promtool_unit_test(alert, tmp_path) -> None:
    rule = next(r for r in alert_rules(validated=DEPLOYED) if r["alert"] == alert)
    series, evals = CASES[alert]
    labels_of = {"h1": {"host": "h1", **ABSENT_LABELS}} if alert == "DDTreeExporterAbsent" else {}
    for s in series:
        m = re.match(r"^[^{]+\{(.*)\}$", s["series"])
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if alert != "DDTreeExporterAbsent":
            labels_of.setdefault(lab["host"], lab)
            if alert == "DDTreeRouterErrorRate" and lab.get("status_code") == "500":
                labels_of[lab["host"]] = lab
    tests = []
    for eval_time, firing in evals:
        exp = []
        for host, val in sorted(firing.items()):
            lab = dict(labels_of[host])
            if alert == "DDTreeQueueBuildup" or alert == "DDTreeTTFTHigh":
                lab = {k: lab[k] for k in ("host", "host_class", "model")}
            elif alert in ("DDTreeRouterNoHealthyWorkers", "DDTreeRouterErrorRate"):
                lab = {"host": lab["host"]}
            elif alert == "DDTreeRouterCircuitOpen":
                lab = {k: lab[k] for k in ("host", "worker")}
            lab.pop("le", None)
            lab.pop("tp_rank", None)
            exp.append({"exp_labels": {**lab, **rule["labels"]}, "exp_annotations": _annotations(rule, lab, val)})
        tests.append({"eval_time": eval_time, "alertname": alert, "exp_alerts": exp})
    rules = tmp_path / "rules.yml"
    rules.write_text(render_rules(validated=DEPLOYED))
    t = tmp_path / "test.yml"
    t.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                 "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]},
                                sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(t)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(e[1] for e in evals) and any(not e[1] for e in evals)  # fires and does not fire


def test_promtool_unit_test_detects_a_wrong_expectation(tmp_path) -> None:
    """The harness can fail: expecting DDTreeServiceDown for a healthy host is an error."""
    rules = tmp_path / "rules.yml"
    rules.write_text(render_rules())
    t = tmp_path / "test.yml"
    t.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [_series("ddtree_up", _host("h2"), "1x10")],
        "alert_rule_test": [{"eval_time": "5m", "alertname": "DDTreeServiceDown",
                             "exp_alerts": [{"exp_labels": {**_host("h2"), "severity": "critical"}}]}]}]}))
    r = subprocess.run(["promtool", "test", "rules", str(t)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def test_alert_settings_are_checked() -> None:
    assert AlertSettings.from_dict({"collapse_for": "3s", "queue_reqs": None}).collapse_for == "3s"
    with pytest.raises(AlertSettingsError, match="collapse_for = '10 minutes'.*Fix"):
        AlertSettings(collapse_for="10 minutes")
    with pytest.raises(AlertSettingsError, match="queue_reqs"):
        AlertSettings(queue_reqs=0)
    with pytest.raises(AlertSettingsError, match="unknown"):
        AlertSettings.from_dict({"colapse_for": "1m"})
    assert "for: 3s" in render_rules(AlertSettings(collapse_for="3s"))


# --------------------------------------------------------------------------- dashboard
def _known_metric_names() -> set[str]:
    names = set(METRIC_NAMES) | {"up"}
    for f in fixtures_dir().glob("sglang/metric_names-*.txt"):
        names |= {n.strip() for n in f.read_text().split() if n.strip()}
    for f in (fixtures_dir() / ROUTER_FIXTURE).glob("metrics_*.txt"):  # the real smg 1.13.0's families
        names |= set(re.findall(r"^# TYPE (smg_\w+) ", f.read_text(), re.M))
    return names


def _selectors(expr: str) -> set[str]:
    """Metric names used as selectors (``name{...}``) in a PromQL expression."""
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))


def test_dashboard_structure_and_queries(tmp_path) -> None:
    doc = json.loads(render_dashboard())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 36
    panels = doc["panels"]
    titles = " ".join(p["title"] for p in panels).lower()
    for want in ("acceptance length", "tokens per second", "first token", "inter-token", "queue"):
        assert want in titles
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    known = _known_metric_names()
    exprs = []
    for p in panels:
        assert p["type"] == "timeseries" and p["targets"] and set(p["gridPos"]) == {"h", "w", "x", "y"}
        for t in p["targets"]:
            assert 'host=~"$host"' in t["expr"] or 'job="smg", host=~"$router"' in t["expr"], t["expr"]  # per host
            used = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count"))
                    and re.sub(r"_(bucket|sum|count)$", "", n) in known else n for n in _selectors(t["expr"])}
            assert used and used <= known, (t["expr"], used - known)
            exprs.append(t["expr"].replace("$__rate_interval", "5m").replace("$host", ".*").replace("$router", ".*"))
    for name in ("host", "router"):
        hostvar = next(v for v in doc["templating"]["list"] if v["name"] == name)
        m = re.fullmatch(r"label_values\((\w+), host\)", hostvar["query"])
        assert m and m.group(1) in known
    # every query parses: promtool parses each expression of a rules file
    p = tmp_path / "panels.yml"
    p.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": [
        {"record": f"panel:q{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    r = subprocess.run(["promtool", "check", "rules", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (host ("}]}]}))
    assert subprocess.run(["promtool", "check", "rules", str(bad)], capture_output=True).returncode != 0


def test_alert_rules_reference_real_metrics() -> None:
    known = _known_metric_names()
    for r in alert_rules(validated=DEPLOYED):
        used = {re.sub(r"_bucket$", "", n) for n in _selectors(r["expr"])} | set(
            re.findall(r"\b(ddtree_[a-z_]+)\b", re.sub(r'"[^"]*"', '""', r["expr"])))
        assert used <= known, (r["alert"], used - known)


def test_dashboard_panels_are_stable() -> None:
    assert [p["id"] for p in dashboard_panels()] == list(range(1, len(dashboard_panels()) + 1))


# --------------------------------------------------------------------------- a real Prometheus
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str, step: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@pytest.mark.skipif(not shutil.which("prometheus"), reason="prometheus not installed (scripts/setup.sh)")
def test_real_prometheus_sees_accept_length_and_fires_the_collapse_alert(tmp_path) -> None:
    v0, launch = sim_deployment()
    sim = Sim(tmp_path, launch, load=0.2, warmup=0.2)
    stop = threading.Event()
    prom = exp = server = None
    try:
        sim.wait_ready()
        exp = Exporter(plan_document(v0), registry=CollectorRegistry(), upstream=sim.base, poll_interval_s=0.25,
                       window_s=2.0)
        server, _ = serve(exp, "127.0.0.1", 0)
        exp.start()
        # the same deployment, as Prometheus must reach it on loopback
        v, _ = sim_deployment({"ddtree_ops": {"scrape_host": "127.0.0.1", "exporter_port": server.server_port},
                               "ddtree_server": {**sim_deployment()[0].deployment.server.model_dump(
                                   mode="json", exclude_none=True), "port": sim.port}})
        rules = tmp_path / "ddtree-rules.yml"
        rules.write_text(render_rules(AlertSettings(collapse_for="3s", interval="1s")))
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(render_prometheus([v], scrape_interval="1s", scrape_timeout="1s", rule_files=[str(rules)]))
        r = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        port = _free_port()
        api = f"http://127.0.0.1:{port}/api/v1"
        log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115
        prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT)

        def traffic() -> None:
            while not stop.is_set():
                try:
                    generate(sim.base, n=4, max_new_tokens=48)
                except Exception:  # the sim is being stopped
                    return

        threading.Thread(target=traffic, daemon=True).start()

        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        _wait(ready, 30, "prometheus ready")

        def query(q: str) -> list:
            return httpx.get(f"{api}/query", params={"query": q}, timeout=5).json()["data"]["result"]

        def targets_up() -> dict:
            t = httpx.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
            return {x["labels"]["job"]: x["health"] for x in t} if all(x["health"] == "up" for x in t) else {}

        assert _wait(targets_up, 30, "both targets up") == {"sglang": "up", "ddtree_exporter": "up"}
        got = _wait(lambda: query('ddtree_accept_length{host="h1"} > 3'), 30, "accept length in Prometheus")
        assert got[0]["metric"]["host_class"] == "b300" and got[0]["metric"]["model"] == "moonshotai/Kimi-K2.6"
        print(f"\nPrometheus sees ddtree_accept_length = {float(got[0]['value'][1]):.2f}")
        assert query("sglang:num_queue_reqs")  # SGLang's own metrics are scraped too

        def collapse_state() -> str | None:
            alerts = httpx.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
            return next((a["state"] for a in alerts if a["labels"]["alertname"] == "DDTreeAcceptLengthCollapse"), None)

        time.sleep(4)  # longer than `for`: healthy acceptance must not fire
        assert collapse_state() is None
        post_json(sim.base + "/_sim/accept_length", {"value": 1.0})
        t0 = time.monotonic()
        _wait(lambda: collapse_state() == "firing", 45, "DDTreeAcceptLengthCollapse firing")
        low = query('ddtree_accept_length{host="h1"}')
        print(f"collapse alert firing {time.monotonic() - t0:.1f} s after forcing accept length 1.0 "
              f"(ddtree_accept_length = {float(low[0]['value'][1]):.2f}, for: 3s)")
        assert float(low[0]["value"][1]) < 1.5
    finally:
        stop.set()
        if prom is not None:
            prom.terminate()
            prom.wait(10)
        if server is not None:
            server.shutdown()
        if exp is not None:
            exp.stop(join_timeout=2)
        sim.stop()


def test_cli_render_writes_monitoring_files_and_exporter_unit(tmp_path) -> None:
    from helpers import REPO

    from ddtree_ops.cli import main

    assert main(["render", "--out", str(tmp_path), "-i", str(REPO / "inventory" / "test")]) == 0
    unit = (tmp_path / "ddt-th1/etc/systemd/system/ddtree-sglang-exporter.service").read_text()
    assert ("ExecStart=/opt/ddtree-ops/venv/bin/python -m ddtree_ops exporter --plan /etc/ddtree-ops/sglang/plan.json "
            "--upstream http://127.0.0.1:30000 --listen 0.0.0.0:19400") in unit
    assert "\nDynamicUser=yes\n" in unit and "\nUser=" not in unit  # its own identity: cannot read SGLang's env
    assert "ProtectSystem=strict" in unit and "NoNewPrivileges=yes" in unit
    prom = tmp_path / "prometheus"
    cfg = yaml.safe_load((prom / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["ddtree_exporter"]["static_configs"][0]["targets"] == ["10.213.1.2:19400"]
    assert jobs["sglang"]["static_configs"][0]["targets"] == ["10.213.1.2:30000"]
    assert cfg["rule_files"] == ["/etc/prometheus/ddtree-rules.yml"]
    # promtool resolves rule_files: point it at the rendered rules file
    local = tmp_path / "prom-local.yml"
    local.write_text((prom / "prometheus.yml").read_text().replace("/etc/prometheus/ddtree-rules.yml",
                                                                   str(prom / "ddtree-rules.yml")))
    r = subprocess.run(["promtool", "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "14 rules found" in r.stdout, r.stdout + r.stderr  # 10 + the fleet's absent rule
    assert json.loads((prom / "ddtree-dashboard.json").read_text())["uid"] == "ddtree-ops"
