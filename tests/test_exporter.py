"""``ddtree-ops exporter`` against a real simulator on loopback (no fakes above HTTP).

The exporter's collector is registered in an injected ``CollectorRegistry``; polling is
driven explicitly (``poll_once``) where a test needs determinism, and by the background
thread where it tests blocking behaviour.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import FIXTURES, REPO, base_hostvars
from prometheus_client import CollectorRegistry
from test_sim import Sim, post_json

from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.exporter import METRIC_NAMES, Exporter, PlanError, parse_upstream, serve

LABELS = {"host": "h1", "host_class": "b300", "model": "moonshotai/Kimi-K2.6"}


def fixtures_dir() -> Path:
    """``tests/fixtures`` (real outputs; see its README)."""
    return FIXTURES


def sim_deployment(overrides: dict | None = None):
    """A validated simulator DDTree deployment (b300, block 8, budget 32) and its launch argv."""
    from ddtree_ops.render import build_argv

    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    hv.update(overrides or {})
    v = validate_hostvars("h1", hv)
    argv = build_argv(v.deployment, v.plan)
    launch = argv[argv.index("--model-path"):]
    i = launch.index("--port")
    del launch[i:i + 2]  # the Sim helper picks a free port
    return v, launch


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    v, launch = sim_deployment()
    s = Sim(tmp_path_factory.mktemp("exporter"), launch, load=0.2, warmup=0.2)
    s.wait_ready()
    s.plan_doc = plan_document(v)
    yield s
    s.stop()


def generate(base: str, n: int = 4, max_new_tokens: int = 40) -> list[dict]:
    out = post_json(base + "/generate", {"text": [f"prompt {i}" for i in range(n)],
                                         "sampling_params": {"max_new_tokens": max_new_tokens}})
    return [o["meta_info"] for o in out]


def value(reg: CollectorRegistry, name: str, **extra: str) -> float | None:
    return reg.get_sample_value(name, {**LABELS, **extra})


def test_accept_length_from_counters_matches_requests(sim) -> None:
    reg = CollectorRegistry()
    exp = Exporter(sim.plan_doc, registry=reg, upstream=sim.base, window_s=600)
    exp.poll_once()
    assert value(reg, "ddtree_up") == 1 and value(reg, "ddtree_ready") == 0  # no /health probe yet
    assert exp.probe_health() is True
    assert value(reg, "ddtree_up") == 1 and value(reg, "ddtree_ready") == 1
    assert value(reg, "ddtree_accept_length") is None  # one sample: no window yet
    post_json(sim.base + "/_sim/accept_length", {"value": 5.0})
    metas = generate(sim.base, n=4, max_new_tokens=41)
    exp.poll_once()
    expected = sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)
    got = value(reg, "ddtree_accept_length")
    print(f"\naccept length: exporter {got:.3f}, requests {expected:.3f}, "
          f"SGLang gauge {value(reg, 'ddtree_accept_length_sglang')}")
    assert got == pytest.approx(expected, rel=0.05)
    assert 4.0 < got < 5.5
    assert value(reg, "ddtree_accept_length_sglang") == pytest.approx(5.0, rel=0.05)
    assert value(reg, "ddtree_generation_tokens_per_second") > 0
    assert value(reg, "ddtree_accept_length_floor") == 1.5
    assert value(reg, "ddtree_speculative_enabled") == 1
    assert value(reg, "ddtree_config_drift") == 0
    assert value(reg, "ddtree_config_drift_settings", setting="budget") == 0
    info = {"algorithm": "DDTREE", "budget": "32", "block_size": "8", "verify_tokens_per_req": "33",
            "draft_tokens_per_req": "8", "tp_size": "8", "sglang_version": "0.5.23"}
    assert value(reg, "ddtree_deployment_info", **info) == 1
    assert value(reg, "ddtree_upstream_staleness_seconds") < 5
    exposed = {m.name for m in reg.collect()}
    assert exposed == set(METRIC_NAMES)

    # collapse: the window figure follows the forced accept length down to ~1
    post_json(sim.base + "/_sim/accept_length", {"value": 1.0})
    exp.window_s = 0.001  # only the newest pair of samples
    exp.poll_once()
    generate(sim.base, n=4, max_new_tokens=40)
    exp.poll_once()
    assert value(reg, "ddtree_accept_length") == pytest.approx(1.0, abs=0.05)
    post_json(sim.base + "/_sim/accept_length", {"value": None})
    # idle window: no verify pass finished, so no figure (absent, not 0)
    exp.poll_once()
    assert value(reg, "ddtree_accept_length") is None
    exp.stop()


def test_drift_gauge_names_the_setting(sim) -> None:
    doc = json.loads(json.dumps(sim.plan_doc))
    doc["plan"]["budget"] = 16
    reg = CollectorRegistry()
    exp = Exporter(doc, registry=reg, upstream=sim.base)
    exp.poll_once()
    assert value(reg, "ddtree_config_drift") == 1
    assert value(reg, "ddtree_config_drift_settings", setting="budget") == 1
    assert value(reg, "ddtree_config_drift_settings", setting="block_size") == 0
    exp.stop()


def test_parse_upstream_real_label_shapes() -> None:
    """0.5.23 splits generation tokens by ``is_streaming``; per-rank scheduler series
    (``--enable-metrics-for-all-schedulers``) must not multiply verify passes."""
    text = "\n".join([
        "# TYPE sglang:generation_tokens_total counter",
        'sglang:generation_tokens_total{model_name="m",is_streaming="false"} 300.0',
        'sglang:generation_tokens_total{model_name="m",is_streaming="true"} 100.0',
        "# TYPE sglang:spec_verify_calls_total counter",
        *[f'sglang:spec_verify_calls_total{{model_name="m",tp_rank="{r}"}} 80.0' for r in range(8)],
        "# TYPE sglang:spec_accept_length gauge",
        *[f'sglang:spec_accept_length{{model_name="m",tp_rank="{r}"}} 5.0' for r in range(8)],
        "",
    ])
    p = parse_upstream(text)
    assert (p.gen_tokens, p.verify_calls, p.accept_length, p.load) == (400.0, 80.0, 5.0, None)
    p = parse_upstream("# TYPE x gauge\nx 1\n")
    assert (p.gen_tokens, p.verify_calls, p.accept_length, p.load) == (None, None, None, None)


def test_counter_reset_restarts_the_window(sim) -> None:
    reg = CollectorRegistry()
    exp = Exporter(sim.plan_doc, registry=reg, upstream=sim.base, window_s=600)
    from ddtree_ops.runtime.exporter import Sample

    for t, g, v in ((0, 1000, 200), (10, 1500, 300), (20, 50, 20), (30, 110, 30)):
        exp._record(Sample(t=t, up=True, gen_tokens=g, verify_calls=v))
    accept, tps = exp.window_rates()
    assert accept == pytest.approx(6.0) and tps == pytest.approx(6.0)
    exp.stop()


class Hanging:
    """A TCP server that accepts and never answers (a hung SGLang)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("upstream", ["down", "hanging"])
def test_scrape_fast_when_upstream_down_or_hanging(sim, upstream) -> None:
    hang = Hanging() if upstream == "hanging" else None
    if hang:
        url = f"http://127.0.0.1:{hang.port}"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: connection refused
    reg = CollectorRegistry()
    exp = Exporter(sim.plan_doc, registry=reg, upstream=url, poll_interval_s=0.2, timeout_s=3.0).start()
    server, _ = serve(exp, "127.0.0.1", 0)
    try:
        time.sleep(0.5)  # the poller is now inside a request that hangs for up to 3 s (or refused)
        worst = 0.0
        with httpx.Client(timeout=5) as c:
            for _ in range(20):
                t0 = time.perf_counter()
                r = c.get(f"http://127.0.0.1:{server.server_port}/metrics")
                worst = max(worst, time.perf_counter() - t0)
                assert r.status_code == 200
        print(f"\nupstream {upstream}: worst of 20 scrapes {worst * 1000:.1f} ms")
        assert worst < 1.0
        assert value(reg, "ddtree_up") == 0 and value(reg, "ddtree_ready") == 0
        assert value(reg, "ddtree_upstream_staleness_seconds") >= 0.5
        assert value(reg, "ddtree_accept_length") is None and value(reg, "ddtree_config_drift") is None
    finally:
        server.shutdown()
        exp.stop(join_timeout=0)
        if hang:
            hang.close()


def test_drift_absent_when_server_info_reports_nothing_to_compare(sim) -> None:
    """An upstream whose /server_info holds none of the deployed settings is 'drift unknown'
    (absent), not ddtree_config_drift 0."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"sglang:num_running_reqs 0\n" if self.path == "/metrics" else b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    up = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    reg = CollectorRegistry()
    exp = Exporter(sim.plan_doc, registry=reg, upstream=f"http://127.0.0.1:{up.server_address[1]}")
    try:
        assert exp.poll_once().up
        assert value(reg, "ddtree_up") == 1 and value(reg, "ddtree_config_drift") is None
    finally:
        exp.stop(join_timeout=0)
        up.shutdown()


def test_cli_exporter_bad_plan_is_one_line_exit_2(tmp_path, capsys) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"host": "x"}')
    assert main(["exporter", "--plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--plan" in err and "plan.json" in err and "Traceback" not in err
    assert main(["exporter", "--plan", str(tmp_path / "missing.json")]) == 2
    with pytest.raises(PlanError):
        Exporter({"deployment": {}}, registry=CollectorRegistry())


@pytest.mark.parametrize("url", ["garbage", None, "http://[::1"])
def test_cli_exporter_bad_plan_url_is_refused(url, tmp_path, capsys) -> None:
    """Without --upstream the plan's url is the upstream: a bad one is exit 2 naming it (it used to
    serve ddtree_up 0 forever, or end in a bare InvalidURL). The plan.json contract refuses it
    with the same line for every reader, --upstream or not (the document is damaged)."""
    doc = plan_document(sim_deployment()[0])
    doc["url"] = url
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    assert main(["exporter", "--plan", str(plan), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert f"url = {url!r}" in err and "must be http(s)://HOST:PORT" in err and "InvalidURL" not in err, err
    assert main(["exporter", "--plan", str(plan), "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err == err


def test_cli_exporter_refuses_non_ascii_port_and_list_plan(tmp_path, capsys) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(sim_deployment()[0])))
    assert main(["exporter", "--plan", str(plan), "--listen", "127.0.0.1:\u0661\u0662"]) == 2
    assert "--listen" in capsys.readouterr().err
    plan.write_text("[1, 2]")
    assert main(["exporter", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "not a plan.json" in err and "missing or bad list indices" not in err, err


def test_cli_exporter_port_0_prints_the_bound_port(sim, tmp_path) -> None:
    """--listen HOST:0 binds a free port; the startup line names it (it printed ':0')."""
    import re
    import signal
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(sim.plan_doc))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddtree_ops",
            "exporter",
            "--plan",
            str(plan),
            "--upstream",
            sim.base,
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stderr.readline()
        m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", line)
        assert m and m.group(1) != "0", line
        assert "ddtree_deployment_info" in httpx.get(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=5).text
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=10)


def test_cli_exporter_serves_until_sigterm(sim, tmp_path) -> None:
    import signal
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(sim.plan_doc))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "ddtree_ops", "exporter", "--plan", str(plan), "--upstream", sim.base,
                          "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.2"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                if 'ddtree_up{host="h1",host_class="b300",model="moonshotai/Kimi-K2.6"} 1.0' in text:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert 'ddtree_up{host="h1",host_class="b300",model="moonshotai/Kimi-K2.6"} 1.0' in text, text
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
    assert p.returncode == 0, err


def test_module_docstring_lists_exactly_the_metrics_table():
    """The prose table of the module docstring names every metric of ``METRICS`` and no other."""
    import re

    import ddtree_ops.runtime.exporter as exporter

    documented = set(re.findall(r"^``(ddtree_[a-z_]+)", exporter.__doc__, flags=re.M))
    assert documented == set(exporter.METRICS) == set(METRIC_NAMES)
