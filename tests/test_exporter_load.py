"""The exporter must not hurt what it watches, nor be starved, nor keep a stale plan.

* ``/health`` is a real generation SGLang keeps running after a client hangs up
  (sgl-project/sglang#35884): one probe in flight, a deadline past SGLang's own
  ``SGLANG_HEALTH_CHECK_TIMEOUT`` (``sglang/srt/entrypoints/http_server.py``, 0.5.17 / 0.5.23).
* Idle clients on the exporter's port must not take the descriptors scrapes need.
* A deploy that rewrites plan.json changes what the running exporter reports.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from helpers import REPO
from prometheus_client import CollectorRegistry
from test_exporter import sim_deployment
from test_sim import Sim, free_port

from ddtree_ops.config.exporter_limits import MAX_CONNECTIONS, NOFILE_LIMIT
from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.exporter import Exporter, serve
from ddtree_ops.sglang.health_probe import (
    cheap_ready_path,
    min_probe_spacing_s,
    probe_deadline_s,
    sglang_health_timeout_s,
)


def labels(exp: Exporter) -> dict[str, str]:
    return dict(zip(("host", "host_class", "model"), exp.identity.labels, strict=True))


def sim_state(base: str) -> dict:
    return httpx.get(base + "/_sim/state", timeout=5).json()


# --------------------------------------------------------------------------- the rules
@pytest.mark.parametrize(("env", "want"), [
    (None, 20), ({}, 20), ({"SGLANG_HEALTH_CHECK_TIMEOUT": "45"}, 45), ({"SGLANG_HEALTH_CHECK_TIMEOUT": " 7 "}, 7),
    ({"SGLANG_HEALTH_CHECK_TIMEOUT": "abc"}, 20), ({"SGLANG_HEALTH_CHECK_TIMEOUT": "-3"}, 20),
    ({"SGLANG_HEALTH_CHECK_TIMEOUT": "0"}, 20), ({"SGLANG_HEALTH_CHECK_TIMEOUT": "99999"}, 3600),
])
def test_sglang_health_timeout_from_the_unit_env(env, want) -> None:
    assert sglang_health_timeout_s(env) == want


def test_probe_deadline_outlasts_sglang_and_spacing_covers_the_handler() -> None:
    assert probe_deadline_s(20) == 23.0 and probe_deadline_s(20, 60) == 60.0
    assert probe_deadline_s(20, 5) > 20 + 1  # the old 5 s probe gave up on a handler that lives 21 s
    assert min_probe_spacing_s(20) == 21.0
    assert cheap_ready_path("0.5.23") == "/ready" and cheap_ready_path("0.5.17") is None
    assert cheap_ready_path("0.5.13.post1") is None and cheap_ready_path("not a version") is None
    assert cheap_ready_path(None) is None and cheap_ready_path("0.6.0") == "/ready"


class CountingHealth:
    """An upstream that answers SGLang-ish /metrics at once and /health after ``delay`` s,
    counting probes in flight (its handler runs on when the client hangs up, as SGLang's)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.in_flight, self.most, self.probes = delay, 0, 0, 0
        lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path == "/health":
                    with lock:
                        outer.in_flight += 1
                        outer.probes += 1
                        outer.most = max(outer.most, outer.in_flight)
                    time.sleep(outer.delay)
                    with lock:
                        outer.in_flight -= 1
                    body = b""
                elif self.path == "/metrics":
                    body = b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def test_probes_are_spaced_by_sglangs_timeout_and_never_overlap() -> None:
    """Fake clock: a second probe sooner than SGLang's timeout after the first is skipped,
    and so is one while another is in flight; the deadline follows the unit's env."""
    up = CountingHealth(delay=0.3)
    now = [100.0]
    v, _ = sim_deployment({"ddtree_service": {"env": {"SGLANG_HEALTH_CHECK_TIMEOUT": "40"}}})
    exp = Exporter(plan_document(v), upstream=up.url, timeout_s=1, poll_interval_s=5, clock=lambda: now[0])
    try:
        assert exp.health_timeout_s == 43.0 and exp.health_spacing_s == 41.0
        assert exp.probe_health() is True
        now[0] += 40.9
        assert exp.probe_health() is None  # sooner than 41 s after the last start
        now[0] += 0.2
        t = threading.Thread(target=exp.probe_health)
        t.start()
        time.sleep(0.1)
        assert exp.probe_health() is None  # one in flight
        t.join()
        assert (up.probes, up.most) == (2, 1)
    finally:
        exp.stop(join_timeout=0)
        up.close()


@pytest.mark.parametrize("delay", [pytest.param(8.0, marks=pytest.mark.slow), 6.0])
def test_slow_health_is_ready_with_one_probe_in_flight(delay) -> None:
    """The reported case (8 s /health; the exporter's 5 s probe every 5 s had 4 in flight and
    ddtree_ready 0) and a 6 s one: ready 1 after the first answer, never two in flight."""
    up = CountingHealth(delay=delay)
    v, _ = sim_deployment()
    reg = CollectorRegistry()
    exp = Exporter(plan_document(v), registry=reg, upstream=up.url, timeout_s=1, poll_interval_s=0.5).start()
    try:
        t0 = time.monotonic()
        while reg.get_sample_value("ddtree_ready", labels(exp)) != 1 and time.monotonic() - t0 < delay + 4:
            time.sleep(0.1)
        took = time.monotonic() - t0
        print(f"\n/health {delay:g} s: ddtree_ready 1 after {took:.1f} s, probes {up.probes}, most in flight {up.most}")
        assert reg.get_sample_value("ddtree_ready", labels(exp)) == 1
        assert reg.get_sample_value("ddtree_up", labels(exp)) == 1
        assert up.most == 1 and up.probes == 1
    finally:
        exp.stop(join_timeout=0)
        up.close()


def test_sim_slow_health_one_generation_at_a_time(tmp_path) -> None:
    """Against the simulator (a 0.5.23 build: /ready is the cheap signal on every poll) with a
    3 s /health: the simulator never sees two generations at once."""
    v, launch = sim_deployment()
    sim = Sim(tmp_path, launch, env={"SGLANG_SIM_HEALTH_SECONDS": "3"}, load=0.2, warmup=0.2)
    try:
        sim.wait_ready(timeout=15)
        before = sim_state(sim.base)["health"]["probes"]
        reg = CollectorRegistry()
        exp = Exporter(plan_document(v), registry=reg, upstream=sim.base, timeout_s=1, poll_interval_s=0.3).start()
        try:
            t0 = time.monotonic()
            while reg.get_sample_value("ddtree_ready", labels(exp)) != 1 and time.monotonic() - t0 < 8:
                time.sleep(0.1)
            assert reg.get_sample_value("ddtree_ready", labels(exp)) == 1
            time.sleep(1.0)
            h = sim_state(sim.base)["health"]
            assert h["max_in_flight"] == 1 and h["probes"] - before == 1, h
        finally:
            exp.stop(join_timeout=0)
    finally:
        sim.stop()


# --------------------------------------------------------------------------- plan.json follows the deploy
def test_exporter_follows_a_rewritten_plan(tmp_path) -> None:
    """The exporter started with plan budget 16 while the server now runs 32 (a deploy changed
    both): drift 1 until it rereads plan.json; a rewrite in place and an atomic rename are both
    seen; a broken new file keeps the plan in use."""
    v, launch = sim_deployment()
    sim = Sim(tmp_path, launch, load=0.2, warmup=0.2)
    try:
        sim.wait_ready()
        doc = plan_document(v)
        old = json.loads(json.dumps(doc))
        old["plan"]["budget"] = 16
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(old))
        reg = CollectorRegistry()
        exp = Exporter(old, registry=reg, upstream=sim.base, plan_path=plan)
        info = {"algorithm": "DDTREE", "block_size": "8", "verify_tokens_per_req": "33", "draft_tokens_per_req": "8",
                "tp_size": "8", "sglang_version": "0.5.23"}

        def budget_info(b: str) -> float | None:
            return reg.get_sample_value("ddtree_deployment_info", {**labels(exp), **info, "budget": b,
                                                                    "verify_tokens_per_req": "33"})
        exp.poll_once()
        assert reg.get_sample_value("ddtree_config_drift", labels(exp)) == 1
        assert budget_info("16") == 1

        plan.write_text(json.dumps(doc))  # the deploy writes the new plan (in place)
        exp.poll_once()
        assert reg.get_sample_value("ddtree_config_drift", labels(exp)) == 0
        assert budget_info("32") == 1 and budget_info("16") is None

        (tmp_path / "bad.json").write_text("{not json")
        os.replace(tmp_path / "bad.json", plan)
        exp.poll_once()
        assert exp.plan_error and "plan.json" in exp.plan_error
        assert budget_info("32") == 1 and reg.get_sample_value("ddtree_config_drift", labels(exp)) == 0

        (tmp_path / "new.json").write_text(json.dumps(old))  # atomic rename: a new inode
        os.replace(tmp_path / "new.json", plan)
        exp.poll_once()
        assert exp.plan_error == "" and budget_info("16") == 1
        exp.stop()
    finally:
        sim.stop()


# --------------------------------------------------------------------------- starving the listener
def test_listener_limits_connections_and_cuts_idle_ones() -> None:
    """In process: more idle connections than the limit; a scrape still answers within the
    per-connection deadline, and the idle ones are closed by the server."""
    up = CountingHealth(delay=0.0)
    v, _ = sim_deployment()
    exp = Exporter(plan_document(v), upstream=up.url, timeout_s=1)
    server, _ = serve(exp, "127.0.0.1", 0)
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS + 50):
            idle.append(socket.create_connection(("127.0.0.1", server.server_port), timeout=5))
        t0 = time.monotonic()
        got = None
        while time.monotonic() - t0 < 10 and got is None:
            try:
                r = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=3)
                got = r.status_code
            except httpx.HTTPError:
                time.sleep(0.2)
        took = time.monotonic() - t0
        print(f"\n{len(idle)} idle connections: scrape {got} after {took:.2f} s, cut {server.evicted}, "
              f"refused {server.refused}")
        assert got == 200 and took < 1  # the oldest idle connection made room at once
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the server cut it (deadline or limit)
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        exp.stop(join_timeout=0)
        up.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _idle_flood(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that never send a byte."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def _trickle(port: int, stop: threading.Event) -> None:
    """Slowloris: a byte of request head every 0.5 s, reconnecting when cut."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as c:
                for ch in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":
                    if stop.is_set():
                        return
                    c.sendall(bytes([ch]))
                    time.sleep(0.5)
        except OSError:
            time.sleep(0.05)


@pytest.mark.slow
def test_real_exporter_process_survives_an_idle_and_slow_client_flood(tmp_path) -> None:
    """A real ``ddtree-ops exporter`` under the descriptor limit the unit used to get (1,024)
    and 1,100 idle connections plus trickling clients: scrapes answer, the process stays
    within the unit's LimitNOFILE."""
    up = CountingHealth(delay=0.0)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    log = open(tmp_path / "exporter.log", "w")  # noqa: SIM115
    p = subprocess.Popen([sys.executable, "-m", "ddtree_ops", "exporter", "--upstream", up.url, "--listen",
                          f"127.0.0.1:{port}", "--poll-interval", "0.5", "--timeout", "1"],
                         cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit)
    flood: list[socket.socket] = []
    stop = threading.Event()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        flood = _idle_flood(port, 1100)
        assert len(flood) > 1024  # more than the descriptors the unit used to get
        trick = [threading.Thread(target=_trickle, args=(port, stop), daemon=True) for _ in range(20)]
        for t in trick:
            t.start()
        ok, worst, peak = 0, 0.0, 0
        t_end = time.monotonic() + 6
        while time.monotonic() < t_end:
            t1 = time.monotonic()
            try:
                r = httpx.get(url, timeout=5)
                if r.status_code == 200 and "ddtree_up" in r.text:
                    ok += 1
                    worst = max(worst, time.monotonic() - t1)
            except httpx.HTTPError:
                pass
            peak = max(peak, _fds(p.pid))
            time.sleep(0.2)
        print(f"\nflood of {len(flood)} idle + 20 trickling: {ok} scrapes answered, worst {worst:.2f} s, "
              f"peak {peak} fds (LimitNOFILE {NOFILE_LIMIT})")
        assert p.poll() is None
        assert ok >= 10 and worst < 3
        assert peak <= NOFILE_LIMIT
    finally:
        stop.set()
        for s in flood:
            s.close()
        p.terminate()
        p.wait(10)
        log.close()
        up.close()


def test_unit_limits_descriptors_to_what_the_listener_needs() -> None:
    from ddtree_ops.render.files import exporter_unit

    v, _ = sim_deployment()
    text = exporter_unit(v).content
    assert f"LimitNOFILE={NOFILE_LIMIT}\n" in text
    assert NOFILE_LIMIT > MAX_CONNECTIONS


