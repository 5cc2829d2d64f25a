"""``health``, ``warmup`` and the exporter against hostile servers on loopback.

Each server is a raw-socket thread (127.0.0.1, ephemeral port) that misbehaves on some
paths and answers like a minimal SGLang on the others. Every behaviour is bounded (it
stops when the client goes away, when the server is closed, or after ``MAX_BEHAVE_S``).

Contract under test: a misbehaving server is exit 1 with the normal checks (valid JSON,
no NaN/Infinity tokens), a failed check naming what the server did, within the reported
``bound_s`` (or the warmup deadline); the exporter reports ``ddtree_up 0``; bodies are cut
at the endpoint's cap (the message names it) instead of being read into memory.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import base_hostvars
from prometheus_client import CollectorRegistry

from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.exporter import Exporter, Sample
from ddtree_ops.runtime.health import CHECK_NAMES

REPO = Path(__file__).resolve().parents[1]
MAX_BEHAVE_S = 15.0
TIMEOUT = 1.0  # --timeout of health, timeout_s of the exporter
# SGLang's own /health timeout at its smallest (1 s): each /health probe waits past it (4 s),
# other requests get --timeout
HEALTH = ["--timeout", str(TIMEOUT), "--failures", "1", "--interval", "0", "--progress-window", "0.1",
          "--sglang-health-timeout", "1", "--json"]
SLACK_S = 0.75  # in-process scheduling slack over a stated bound (2 shared CPU cores)

GOOD = {
    "/health": (200, "text/plain", b""),
    "/server_info": (200, "application/json", b'{"model_path": "m", "tp_size": 1, "internal_states": []}'),
    "/get_server_info": (404, "text/plain", b"not found"),
    "/metrics": (200, "text/plain; version=0.0.4",
                 b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:generation_tokens_total 10\n"),
    "/generate": (200, "application/json", b'{"text": "x", "meta_info": {"prompt_tokens": 3, "completion_tokens": 4}}'),
}


def no_nan_json(text: str):
    """json.loads that refuses NaN/Infinity tokens (they are not JSON)."""
    def refuse(name):
        raise AssertionError(f"non-JSON token {name} in output")
    return json.loads(text, parse_constant=refuse)


# --------------------------------------------------------------------------- server
class Conn:
    """One accepted connection and the server's stop flag."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self.sock, self.stop, self.t0 = sock, stop, time.monotonic()

    def alive(self) -> bool:
        return not self.stop.is_set() and time.monotonic() - self.t0 < MAX_BEHAVE_S

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:  # the client gave up: that is the point
            return False

    def answer(self, status: int, ctype: str, body: bytes, extra: str = "") -> None:
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n{extra}\r\n")
        self.send(head.encode() + body)

    def trickle(self, data: bytes, every: float = 0.2) -> None:
        for i in range(len(data)):
            if not self.alive() or not self.send(data[i:i + 1]):
                return
            time.sleep(every)

    def stream(self, head: bytes, chunk: bytes, total: int | None = None) -> None:
        """``head`` then ``chunk`` repeatedly (up to ``total`` bytes, else until the client leaves)."""
        if not self.send(head):
            return
        sent = 0
        while self.alive() and (total is None or sent < total):
            if not self.send(chunk):
                return
            sent += len(chunk)

    def idle(self) -> None:
        while self.alive():
            time.sleep(0.05)


Behave = Callable[[Conn, str, str], None]  # (conn, method, path)


class Hostile:
    """A loopback server: ``behave`` on ``paths`` (None: every path), :data:`GOOD` elsewhere."""

    def __init__(self, behave: Behave, paths: set[str] | None = None) -> None:
        self.behave, self.paths = behave, paths
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        c.settimeout(2)
        with c:
            try:
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 1 << 16:
                    more = c.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = next(
                    (int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0
                )
                while len(body) < length:
                    more = c.recv(65536)
                    if not more:
                        break
                    body += more
            except (OSError, ValueError):
                return
            conn = Conn(c, self.stop)
            if self.paths is None or path in self.paths:
                self.behave(conn, method, path)
            else:
                conn.answer(*GOOD.get(path, (404, "text/plain", b"not found")))

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


# --------------------------------------------------------------------------- behaviours
def trickle_headers(c: Conn, m: str, p: str) -> None:
    c.trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 400 + b"\r\n\r\n")


def trickle_body(c: Conn, m: str, p: str) -> None:
    c.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    c.trickle(b" " * 100000)


def never_answers(c: Conn, m: str, p: str) -> None:
    c.idle()


def closes_immediately(c: Conn, m: str, p: str) -> None:
    c.sock.shutdown(socket.SHUT_RDWR)


def huge_body(c: Conn, m: str, p: str) -> None:  # 64 MiB, streamed lazily
    c.stream(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 67108864\r\n\r\n",
             b"sglang:num_running_reqs 0\n" * 2520, total=64 << 20)


def huge_headers(c: Conn, m: str, p: str) -> None:
    c.stream(b"HTTP/1.1 200 OK\r\n", b"X-Pad: " + b"p" * 1000 + b"\r\n", total=32 << 20)


def chunked_forever(c: Conn, m: str, p: str) -> None:
    chunk = b"x" * 65536
    c.stream(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
             f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")


def bad_encoding(encoding: str) -> Behave:
    def behave(c: Conn, m: str, p: str) -> None:
        body = b"\x1f\x8b\x08\x00garbage, not gzip at all" if encoding == "gzip" else b"\xff\xfe not brotli"
        c.answer(200, "application/json", body, f"Content-Encoding: {encoding}\r\n")
    return behave


_BOMB: list[bytes] = []


def gzip_bomb(c: Conn, m: str, p: str) -> None:
    """~32 KiB on the wire that inflates to 32 MiB of zeros (4x the largest cap; built in ~0.1 s)."""
    if not _BOMB:
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        zero = bytes(1 << 20)
        _BOMB.append(b"".join([*(z.compress(zero) for _ in range(32)), z.flush()]))
    c.answer(200, "text/plain", _BOMB[0], "Content-Encoding: gzip\r\n")


def fixed(status: int, ctype: str, body: bytes, extra: str = "") -> Behave:
    def behave(c: Conn, m: str, p: str) -> None:
        c.answer(status, ctype, body, extra)
    return behave


def metrics_with(line: bytes) -> Behave:
    return fixed(200, "text/plain", b"sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\n" + line + b"\n")


def http09(c: Conn, m: str, p: str) -> None:
    c.send(b"garbage that is no status line\r\n\x00\x01\x02\r\n\r\n")


def redirect_loop(c: Conn, m: str, p: str) -> None:
    c.answer(302, "text/plain", b"", f"Location: {p}\r\n")


DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
ANSI = b"\x1b[31mred alert\x1b[0m \x07 secret-looking text"
ALL = None
INFO = {"/server_info", "/get_server_info"}
METRICS = {"/metrics"}
GEN = {"/generate"}

# id, behaviour, paths, words in health's failed check (None: health not affected), words in warmup's
# failed check (None: /generate not affected), exporter up=0 expected
CASES = [
    ("trickle-headers", trickle_headers, ALL, "no complete answer within 4 s", "5 s", True),
    ("trickle-body", trickle_body, ALL, "no complete answer within 4 s", "5 s", True),
    ("never-answers", never_answers, ALL, "no complete answer within 4 s", "5 s", True),
    ("closes-immediately", closes_immediately, ALL, "RemoteProtocolError", "RemoteProtocolError", True),
    ("huge-body", huge_body, ALL, "exceeds the 65536 byte cap", "byte cap", True),
    ("huge-body-metrics", huge_body, METRICS, "exceeds the 8388608 byte cap", None, True),
    ("huge-body-info", huge_body, INFO, "exceeds the 1048576 byte cap", None, False),
    ("huge-headers", huge_headers, ALL, "RemoteProtocolError", "RemoteProtocolError", True),
    ("chunked-forever", chunked_forever, ALL, "byte cap", "byte cap", True),
    ("chunked-forever-metrics", chunked_forever, METRICS, "exceeds the 8388608 byte cap", None, True),
    ("bad-gzip", bad_encoding("gzip"), ALL, "not valid compressed data", "not valid compressed data", True),
    ("bad-br", bad_encoding("br"), ALL, "Content-Encoding 'br'", "Content-Encoding 'br'", True),
    ("gzip-bomb", gzip_bomb, ALL, "byte cap", "byte cap", True),
    ("gzip-bomb-metrics", gzip_bomb, METRICS, "exceeds the 8388608 byte cap", None, True),
    ("trickle-metrics", trickle_body, METRICS, "no complete answer within 1 s", None, True),
    ("inf-gauge", metrics_with(b'sglang:num_queue_reqs{tp_rank="0"} +Inf'), METRICS, "not finite", None, True),
    ("nan-counter", metrics_with(b"sglang:generation_tokens_total NaN"), METRICS, "not finite", None, True),
    ("1e999-counter", metrics_with(b"sglang:spec_verify_calls_total 1e999"), METRICS, "not finite", None, True),
    (
        "negative-load",
        fixed(200, "text/plain", b"sglang:num_running_reqs -3\nsglang:num_queue_reqs 0\n"),
        METRICS,
        "negative request counts",
        None,
        True,
    ),
    ("words-as-value", metrics_with(b"sglang:num_requests_total many"), METRICS, "not a number", None, True),
    (
        "not-prometheus",
        fixed(200, "text/html", b"<html><body>hello</body></html>"),
        METRICS,
        "not SGLang's metrics",
        None,
        True,
    ),
    (
        "too-many-samples",
        fixed(200, "text/plain", b"".join(b'sglang:num_running_reqs{i="%d"} 0\n' % i for i in range(10_001))),
        METRICS,
        "more than 10000 samples",
        None,
        True,
    ),
    (
        "unterminated-label-8mib",
        fixed(200, "text/plain", b'sglang:num_running_reqs{a="' + b"x" * ((8 << 20) - 100) + b"\n"),
        METRICS,
        "not SGLang's metrics",
        None,
        True,
    ),
    ("json-list", fixed(200, "application/json", b"[1, 2]"), INFO | GEN, "not an object", "no meta_info object", False),
    (
        "json-string",
        fixed(200, "application/json", b'"hello"'),
        INFO | GEN,
        "not an object",
        "no meta_info object",
        False,
    ),
    (
        "json-deep",
        fixed(200, "application/json", DEEP_JSON),
        INFO | GEN,
        "nested too deeply",
        "byte cap",  # 200k deep: over /generate's 64 KiB cap
        False,
    ),
    (
        "json-33-deep",
        fixed(200, "application/json", b"[" * 33 + b"]" * 33),
        INFO | GEN,
        "deeper than 32",
        "deeper than 32",
        False,
    ),
    (
        "json-nan",
        fixed(200, "application/json", b'{"model_path": NaN, "tp_size": 1}'),
        INFO,
        "malformed JSON",
        None,
        False,
    ),
    (
        "meta-nan",
        fixed(200, "application/json", b'{"meta_info": {"completion_tokens": NaN}}'),
        GEN,
        None,
        "non-finite number NaN",
        False,
    ),
    (
        "meta-1e999",
        fixed(200, "application/json", b'{"meta_info": {"spec_accept_length": 1e999}}'),
        GEN,
        None,
        "out of range",
        False,
    ),
    (
        "meta-negative",
        fixed(200, "application/json", b'{"meta_info": {"completion_tokens": -5}}'),
        GEN,
        None,
        "a token count must be an integer",
        False,
    ),
    (
        "meta-huge-int",
        fixed(200, "application/json", b'{"meta_info": {"prompt_tokens": 1' + b"0" * 400 + b"}}"),
        GEN,
        None,
        "out of range",
        False,
    ),
    (
        "wrong-content-type",
        fixed(200, "text/html", b"<html>I am a login page</html>"),
        INFO | METRICS | GEN,
        "malformed JSON",
        "malformed JSON",
        True,
    ),
    ("http09-garbage", http09, ALL, "RemoteProtocolError", "RemoteProtocolError", True),
    ("redirect-loop", redirect_loop, ALL, "answered 302", "HTTP 302", True),
    ("503-forever", fixed(503, "text/plain", b"Service Unavailable"), ALL, "answered 503", "HTTP 503", True),
    ("ansi-500", fixed(500, "text/plain", ANSI), ALL, "answered 500", "HTTP 500", True),
]


@pytest.fixture(scope="module")
def plan_doc() -> dict:
    return plan_document(validate_hostvars("h1", base_hostvars()))


def _check_output(out: str) -> dict:
    doc = no_nan_json(out)
    assert doc["ok"] is False and doc["checks"], doc
    assert "\x1b" not in out and "\x07" not in out, "server control characters reached the output"
    return doc


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_server(case, plan_doc, capsys) -> None:
    name, behave, paths, health_words, warmup_words, exporter_down = case
    srv = Hostile(behave, paths)
    try:
        if health_words is not None:
            t0 = time.monotonic()
            rc = main(["health", srv.url, *HEALTH])
            wall = time.monotonic() - t0
            doc = _check_output(capsys.readouterr().out)
            assert rc == 1, doc
            assert [c["name"] for c in doc["checks"]] == [
                n for n in CHECK_NAMES if n in {c["name"] for c in doc["checks"]}
            ]
            failed = [c for c in doc["checks"] if not c["ok"]]
            assert failed and any(health_words in c["detail"] for c in failed), doc
            assert wall <= doc["bound_s"] + SLACK_S, (wall, doc["bound_s"])
        if warmup_words is not None:
            t0 = time.monotonic()
            rc = main(["warmup", srv.url, "--json", "--deadline", "5", "--batch-sizes", "1"])
            wall = time.monotonic() - t0
            doc = _check_output(capsys.readouterr().out)
            assert rc == 1, doc
            assert warmup_words in doc["checks"][0]["detail"], doc
            assert wall <= 5 + SLACK_S, wall
        reg = CollectorRegistry()
        exp = Exporter(plan_doc, registry=reg, upstream=srv.url, timeout_s=TIMEOUT, poll_interval_s=0.2)
        try:
            t0 = time.monotonic()
            sample = exp.poll_once()
            wall = time.monotonic() - t0
            assert wall <= exp.poll_bound_s + SLACK_S, (wall, exp.poll_bound_s)
            up = reg.get_sample_value(
                "ddtree_up", dict(zip(("host", "host_class", "model"), exp.identity.labels, strict=True))
            )
            assert up == (0.0 if exporter_down else 1.0), sample
            if exporter_down:
                assert sample.error and "\x1b" not in sample.error
        finally:
            exp.stop(join_timeout=0)
    finally:
        srv.close()


# --------------------------------------------------------------------------- true bounds (subprocess)
def _cli(*args: str, timeout: float = 60) -> tuple[int, dict, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ddtree_ops", *args], capture_output=True, text=True, timeout=timeout,
                       cwd=REPO, env=env)
    wall = time.monotonic() - t0
    return p.returncode, no_nan_json(p.stdout), wall


PROCESS_SLACK_S = 3.0  # interpreter start and imports on 2 shared cores


def test_health_against_trickling_server_stays_within_bound_s() -> None:
    """The attack that ran > 240 s against a bound of 49 s: one byte every 0.2 s on every path."""
    srv = Hostile(trickle_body)
    try:
        rc, doc, wall = _cli("health", srv.url, "--timeout", "2", "--failures", "3", "--interval", "0.5",
                             "--sglang-health-timeout", "1", "--json")
    finally:
        srv.close()
    print(f"\ntrickling server: health wall {wall:.2f} s (process included), bound_s {doc['bound_s']}")
    assert rc == 1 and not doc["ok"]
    assert "no complete answer within 4 s" in doc["checks"][-1]["detail"]  # /health waits past SGLang's 1 s
    assert 6.0 <= wall <= doc["bound_s"] + PROCESS_SLACK_S


def test_health_against_slow_server_uses_every_request_within_bound_s() -> None:
    """Every request answered just under the deadline, /server_info missing (fallback to
    /get_server_info), busy with frozen counters: the longest path through the checks."""
    answers = {**GOOD, "/server_info": (404, "text/plain", b""),
               "/get_server_info": GOOD["/server_info"],
               "/metrics": (200, "text/plain", b"sglang:num_running_reqs 2\nsglang:num_queue_reqs 1\n"
                                               b"sglang:generation_tokens_total 10\n")}

    def slow(c: Conn, m: str, p: str) -> None:
        time.sleep(0.85)
        c.answer(*answers.get(p, (404, "text/plain", b"")))

    srv = Hostile(slow)
    try:
        rc, doc, wall = _cli("health", srv.url, "--timeout", "1", "--failures", "2", "--interval", "0.1",
                             "--sglang-health-timeout", "1", "--progress-window", "0.1", "--json")
    finally:
        srv.close()
    print(f"\nslow server (0.85 s/request, timeout 1 s): health wall {wall:.2f} s, bound_s {doc['bound_s']}")
    checks = {c["name"]: c for c in doc["checks"]}
    assert rc == 1 and checks["ready"]["ok"] and not checks["progress"]["ok"], doc
    assert "the scheduler is stuck" in checks["progress"]["detail"]
    assert 0.85 * 6 <= wall <= doc["bound_s"] + PROCESS_SLACK_S  # 6 requests: health, 2 x info, 3 x metrics


def test_wait_ready_against_silent_server_stays_within_wait_plus_bound() -> None:
    srv = Hostile(never_answers)
    try:
        rc, doc, wall = _cli("health", srv.url, "--wait", "2", "--timeout", "1", "--failures", "1", "--interval", "0.2",
                             "--sglang-health-timeout", "1", "--json")
    finally:
        srv.close()
    print(f"\nsilent server: health --wait 2 wall {wall:.2f} s, bound_s {doc['bound_s']}")
    assert rc == 1 and doc["checks"][0]["name"] == "reachable"
    assert 2.0 <= wall <= doc["bound_s"] + PROCESS_SLACK_S


# --------------------------------------------------------------------------- exporter honesty
class Switchable:
    """A minimal SGLang whose /metrics we control (running/queued, progress counter, mode)."""

    def __init__(self) -> None:
        self.running, self.tokens, self.mode = 0, 0, "good"

        def behave(c: Conn, m: str, p: str) -> None:
            if self.mode == "trickle":
                return trickle_body(c, m, p)
            if p == "/metrics":
                c.answer(200, "text/plain", f"sglang:num_running_reqs {self.running}\nsglang:num_queue_reqs 0\n"
                                            f"sglang:realtime_tokens_total {self.tokens}\n".encode())
            else:
                c.answer(*GOOD.get(p, (404, "text/plain", b"")))

        self.srv = Hostile(behave)
        self.url = self.srv.url


def _labels(exp: Exporter) -> dict[str, str]:
    return dict(zip(("host", "host_class", "model"), exp.identity.labels, strict=True))


def test_scheduler_stuck_flips_to_1_on_frozen_counters_and_back(plan_doc) -> None:
    up = Switchable()
    now = [0.0]
    reg = CollectorRegistry()
    exp = Exporter(plan_doc, registry=reg, upstream=up.url, timeout_s=TIMEOUT, poll_interval_s=1, stuck_after_s=2,
                   clock=lambda: now[0])
    stuck = lambda: reg.get_sample_value("ddtree_scheduler_stuck", _labels(exp))  # noqa: E731
    try:
        up.running, up.tokens = 3, 100
        seen = []
        for t in (0, 1, 2, 3):
            now[0] = t
            exp.poll_once()
            seen.append(stuck())
        assert seen == [None, None, 1.0, 1.0]  # absent before 2 s of history, then stuck
        up.tokens = 150  # the scheduler moves again
        now[0] = 4
        exp.poll_once()
        assert stuck() == 0.0
        now[0] = 5
        exp.poll_once()
        assert stuck() == 0.0  # frozen for 1 s only
        up.running = 0  # idle with frozen counters is not stuck
        for t in (6, 7, 8, 9):
            now[0] = t
            exp.poll_once()
        assert stuck() == 0.0
        up.running = 1
        for t in (10, 11, 12):
            now[0] = t
            exp.poll_once()
        assert stuck() == 1.0
        up.mode = "trickle"  # upstream down: absent, and up 0
        now[0] = 13
        assert not exp.poll_once().up
        assert stuck() is None and reg.get_sample_value("ddtree_up", _labels(exp)) == 0
    finally:
        exp.stop(join_timeout=0)
        up.srv.close()


def test_trickling_server_on_the_port_makes_up_0_within_the_staleness_bound(plan_doc) -> None:
    """SGLang replaced by a trickling server: the background poller's requests hit their total
    deadline, so ddtree_up and ddtree_ready go to 0 (they stayed 1 for >= 94 s before)."""
    up = Switchable()
    reg = CollectorRegistry()
    exp = Exporter(plan_doc, registry=reg, upstream=up.url, timeout_s=0.5, poll_interval_s=0.2).start()
    try:
        deadline = time.monotonic() + 5
        while reg.get_sample_value("ddtree_ready", _labels(exp)) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reg.get_sample_value("ddtree_up", _labels(exp)) == 1
        up.mode = "trickle"
        t0 = time.monotonic()
        while reg.get_sample_value("ddtree_up", _labels(exp)) != 0 and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        took = time.monotonic() - t0
        print(f"\ntrickling upstream: ddtree_up 0 after {took:.2f} s (staleness bound {exp.stale_after_s:g} s)")
        assert took <= exp.stale_after_s
        assert reg.get_sample_value("ddtree_ready", _labels(exp)) == 0
    finally:
        exp.stop(join_timeout=0)
        up.srv.close()


def test_a_stuck_poller_cannot_keep_up_1(plan_doc, monkeypatch) -> None:
    """Whatever keeps the poller from recording (here: a poll blocked on an event), the
    collector judges the age of the last good sample: up 0 past stale_after_s."""
    up = Switchable()
    now = [0.0]
    reg = CollectorRegistry()
    exp = Exporter(plan_doc, registry=reg, upstream=up.url, timeout_s=TIMEOUT, poll_interval_s=5,
                   clock=lambda: now[0])
    try:
        exp.poll_once()
        assert reg.get_sample_value("ddtree_up", _labels(exp)) == 1
        release = threading.Event()
        monkeypatch.setattr(exp, "_poll", lambda: (release.wait(10), Sample(t=now[0], error="released"))[1])
        exp.start()
        now[0] = exp.stale_after_s
        assert reg.get_sample_value("ddtree_up", _labels(exp)) == 1
        now[0] = exp.stale_after_s + 0.01
        assert reg.get_sample_value("ddtree_up", _labels(exp)) == 0
        assert reg.get_sample_value("ddtree_ready", _labels(exp)) == 0
        assert reg.get_sample_value("ddtree_upstream_staleness_seconds", _labels(exp)) > exp.stale_after_s
        release.set()
    finally:
        exp.stop(join_timeout=0)
        up.srv.close()


def test_gzip_answers_within_the_cap_are_decoded() -> None:
    """A server that compresses although we asked for identity still works when honest."""
    body = gzip.compress(GOOD["/metrics"][2])
    srv = Hostile(fixed(200, "text/plain", body, "Content-Encoding: gzip\r\n"), METRICS)
    try:
        from ddtree_ops.sglang.client import SGLangClient

        with SGLangClient(srv.url, timeout=2) as c:
            assert c.metrics() == GOOD["/metrics"][2].decode()
    finally:
        srv.close()


def test_parse_upstream_selects_load_gauges_and_progress_counters() -> None:
    """The exporter's one-regex pre-selection reads the load gauges (summed) and every
    progress counter of ops.health (summed), and nothing else."""
    from ddtree_ops.runtime.exporter import parse_upstream
    from ddtree_ops.runtime.health import PROGRESS_COUNTERS

    text = "\n".join([
        "# TYPE sglang:num_running_reqs gauge",
        'sglang:num_running_reqs{tp_rank="1",model_name="m"} 7',
        'sglang:num_running_reqs{tp_rank="0",model_name="m"} 5',
        'sglang:num_queue_reqs{tp_rank="0",model_name="m"} 2',
        'sglang:num_queue_reqs_other{tp_rank="0"} 99',
        *(f'{name}{{tp_rank="0"}} {i + 1}' for i, name in enumerate(PROGRESS_COUNTERS)),
        'sglang:cache_hit_rate{tp_rank="0"} NaN',  # not selected: not read, not judged
    ]) + "\n"
    load = parse_upstream(text).load
    assert load is not None
    assert (load.running, load.queued, load.has_progress) == (12.0, 2.0, True)  # every series: any busy rank counts
    assert load.progress == sum(range(1, len(PROGRESS_COUNTERS) + 1))


def test_busy_without_progress_counters_is_not_judged(plan_doc, capsys) -> None:
    """Load gauges but none of PROGRESS_COUNTERS: health says 'not measured' (it used to call the
    scheduler stuck), the exporter leaves ddtree_scheduler_stuck absent."""
    srv = Hostile(fixed(200, "text/plain", b"sglang:num_running_reqs 2\nsglang:num_queue_reqs 0\n"), METRICS)
    now = [0.0]
    reg = CollectorRegistry()
    exp = Exporter(plan_doc, registry=reg, upstream=srv.url, timeout_s=TIMEOUT, stuck_after_s=1, clock=lambda: now[0])
    try:
        assert main(["health", srv.url, *HEALTH]) == 0
        progress = [c for c in no_nan_json(capsys.readouterr().out)["checks"] if c["name"] == "progress"][0]
        assert progress["ok"] and progress["detail"].startswith("not measured: 2 running"), progress
        for t in (0, 1, 2):
            now[0] = t
            assert exp.poll_once().up
        assert reg.get_sample_value("ddtree_up", _labels(exp)) == 1
        assert reg.get_sample_value("ddtree_scheduler_stuck", _labels(exp)) is None
    finally:
        exp.stop(join_timeout=0)
        srv.close()


def test_failed_requests_do_not_keep_their_bodies() -> None:
    """An error's traceback references fetch's frame; the body buffer is emptied on every exit,
    so failed requests against a huge body do not pile up a cap's worth of bytes each until
    the next garbage collection (measured before: +8.5 MiB retained per failed /metrics)."""
    import gc
    import tracemalloc

    from ddtree_ops.sglang.client import SGLangClient, SGLangError

    srv = Hostile(huge_body)
    gc.disable()
    tracemalloc.start()
    try:
        with SGLangClient(srv.url, timeout=5) as c:
            errors = []
            for _ in range(3):
                with pytest.raises(SGLangError, match="8388608 byte cap") as info:
                    c.get("/metrics")
                errors.append(info.value)  # keep the errors (and their tracebacks) alive
            current, _peak = tracemalloc.get_traced_memory()
        assert current < 4 << 20, f"{current / 2 ** 20:.1f} MiB still allocated after 3 failed requests"
    finally:
        tracemalloc.stop()
        gc.enable()
        srv.close()


# ---- the metrics selection is linear: a pathological /metrics cannot hold the exporter
@pytest.mark.parametrize("line, why", [
    # ~8 MiB of label sets whose quoted values never close the brace (attack: held the GIL,
    # exporter scrapes p99 374 ms with the earlier one-regex selection)
    ("sglang:num_running_reqs{" + ('a="' + "b" * 60 + '",') * 30, "malformed sample line"),
    ("sglang:num_running_reqs{a=\"" + "b" * 5000 + "\"} 1", "characters starts with a selected family"),
    ("sglang:num_running_reqs{a=\"x\"}", "malformed sample line"),
])
def test_select_samples_refuses_pathological_lines(line, why):
    from ddtree_ops.sglang.client import SGLangError, select_samples

    text = "\n".join([line] * (8_000_000 // (len(line) + 1)))
    with pytest.raises(SGLangError, match=why):
        select_samples(text, ["sglang:num_running_reqs", "sglang:num_queue_reqs"])


def test_select_samples_reads_real_shaped_lines_and_skips_longer_names():
    from ddtree_ops.sglang.client import select_samples

    text = ("# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 3.0\n'
            'sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 4.0 1700000000\n'
            'sglang:num_running_reqs_total_extra{tp_rank="0"} 99\n'
            "sglang:num_queue_reqs 2\n")
    got = select_samples(text, ["sglang:num_running_reqs", "sglang:num_queue_reqs"])
    assert [v for _, v in got["sglang:num_running_reqs"]] == [3.0, 4.0]
    assert got["sglang:num_running_reqs"][1][0]["tp_rank"] == "1"
    assert got["sglang:num_queue_reqs"] == [({}, 2.0)]


def test_warmup_keeps_only_the_counts_of_each_answer():
    """A batch in flight holds what warmup reads of each answer, not the answer: a server padding
    valid answers (attack: ~9 MB RSS per request in flight at 1 MB a answer) costs nothing after parsing."""
    from ddtree_ops.runtime.warmup import META_KEYS, _meta
    from ddtree_ops.sglang.client import generate_cap

    out = {"text": "x", "pad": [0] * 100_000,
           "meta_info": {"prompt_tokens": 5, "completion_tokens": 32, "spec_accept_length": 3.0, "junk": [0] * 10_000}}
    assert _meta(out, "bs 1") == {"prompt_tokens": 5, "completion_tokens": 32, "spec_accept_length": 3.0}
    assert set(META_KEYS) == {"prompt_tokens", "completion_tokens", "spec_accept_length"}
    assert generate_cap(32) == 64 * 1024 + 64 * 32  # a 1 MB answer is refused, not buffered per request


def test_an_html_page_with_a_metric_line_is_not_metrics():
    """An HTML /metrics body holding one matching line gave ddtree_up 1."""
    from ddtree_ops.sglang.client import Answer, SGLangError, metrics_text

    html = Answer("http://h/metrics", 200, "text/html; charset=utf-8", b"<pre>\nsglang:num_running_reqs 1\n</pre>")
    with pytest.raises(SGLangError, match="not Prometheus text"):
        metrics_text(html)
    ok = Answer("http://h/metrics", 200, "text/plain; version=0.0.4; charset=utf-8", b"sglang:num_running_reqs 1\n")
    assert metrics_text(ok) == "sglang:num_running_reqs 1\n"
