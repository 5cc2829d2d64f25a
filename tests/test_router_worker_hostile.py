"""``router_worker`` and ``fleet status``'s router column against a hostile or broken router: one
that drips its answer a byte a second or a header line a second, answers JSON nested 100 000 deep,
redirects to another port, reflects the ``Authorization`` header (or the bare key) into an error
body, or puts terminal escapes and U+202E in a worker's ``status``. Real HTTP servers in threads.

Every call must end by its total deadline (not per socket read), the key must go only to the
address given and never be printed, and no server text may reach the terminal raw.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_router import _instance, _one

from ddtree_ops.fleet import router_status, router_worker
from ddtree_ops.fleet.router_worker import Api, RouterError, state_of

KEY = "SECRETKEYcanary123"
WORKER = "http://10.0.0.5:30000"
DRIP_FOR_S = 8.0
"""How long the dripping server drips before it hangs up (so a call without a total deadline
ends, late, instead of hanging the test run)."""


class _Target(BaseHTTPRequestHandler):
    """Where the redirect points: records the ``Authorization`` it is sent."""

    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802
        self.server.hostile.forwarded.append(self.headers.get("Authorization"))
        body = json.dumps({"workers": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_DELETE = do_GET  # noqa: N815


class _Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, headers_too: bool) -> None:
        """A byte of body (or a header line) every half second for DRIP_FOR_S, then hang up."""
        end = time.monotonic() + DRIP_FOR_S
        self.close_connection = True
        try:
            if headers_too:
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            else:
                self.send_response(200)
                self.send_header("Content-Length", str(10**6))
                self.end_headers()
            while time.monotonic() < end:
                self.wfile.write(b"X-A: b\r\n" if headers_too else b" ")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            return

    def _redirect(self) -> None:
        self.send_response(307)
        self.send_header("Location", f"http://127.0.0.1:{self.server.hostile.target.server_address[1]}/workers")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_ANY(self):  # noqa: N802
        mode = self.server.hostile.mode
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if mode in ("drip", "drip_headers"):
            return self._drip(mode == "drip_headers")
        if mode == "deep_workers":
            return self._send(200, b'{"workers": ' + b"[" * 100000 + b"]" * 100000 + b"}")
        if mode == "redirect":
            return self._redirect()
        listing = self.command == "GET" and self.path == "/workers"
        if mode == "ansi":
            if listing:
                return self._send(200, json.dumps({"workers": [
                    {"id": "w\x1b]0;pwn\x07x", "url": WORKER, "is_healthy": True,
                     "status": "\x1b[31mready\u202e\x1b[2J"}]}).encode())
            return self._send(500, b"\x1b[2J\x1b[31mboom\xe2\x80\xae")
        if listing:  # reflect, reflect_bare
            return self._send(200, json.dumps({"workers": [
                {"id": "w1", "url": WORKER, "is_healthy": True, "status": "ready"}]}).encode())
        auth = self.headers.get("Authorization", "")
        said = auth if mode == "reflect" else auth.removeprefix("Bearer ")
        return self._send(500, json.dumps({"error": f"unauthorized: got {said}"}).encode())

    do_GET = do_POST = do_DELETE = do_ANY  # noqa: N815


class Hostile:
    """A fake smg on 127.0.0.1 answering in ``mode``; ``target`` is a second server a redirect points at,
    recording the ``Authorization`` it is sent (``forwarded``)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.forwarded: list[str | None] = []
        self.target = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
        self.api = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        for s in (self.httpd, self.target):
            s.daemon_threads = True
            s.hostile = self
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def close(self) -> None:
        for s in (self.httpd, self.target):
            s.shutdown()
            s.server_close()


@pytest.fixture
def hostile():
    servers: list[Hostile] = []

    def make(mode: str) -> Hostile:
        servers.append(Hostile(mode))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def key_file(tmp_path):
    def make(text: str) -> str:
        p = tmp_path / f"key{len(list(tmp_path.iterdir()))}"
        p.write_text(text, newline="")
        p.chmod(0o600)
        return str(p)

    return make


def _router(api: str):
    fleet = [_instance("gpu-a", "10.0.0.5", 30000)]
    (r,), errors = _one(fleet, {"instances": ["gpu-a"]}, address="127.0.0.1")
    assert not errors
    port = int(api.rsplit(":", 1)[1])
    return type(r)(r.host, r.address, r.settings.model_copy(update={"port": port}), r.workers, r.dp_aware, KEY), fleet


def _timed(fn, *args):
    t0 = time.monotonic()
    try:
        return fn(*args), time.monotonic() - t0
    except RouterError as exc:
        return exc, time.monotonic() - t0


@pytest.mark.parametrize("mode", ["drip", "drip_headers"])
def test_a_dripping_router_cannot_stretch_the_total_deadline(hostile, capsys, mode):
    """A byte (or a header line) every half second resets a per-read timeout forever: each call, and
    the whole of router_status.registries, ends within its deadline plus a second."""
    srv = hostile(mode)
    api = Api(srv.api)
    deadline = 1.5
    calls = [(router_worker.main, ["list", "--api", srv.api, "--deadline", str(deadline)]),
             (router_worker.drain, api, WORKER, deadline),
             (router_worker.add, api, WORKER, deadline),
             (router_worker.wait_ready, srv.api, deadline)]
    for fn, *args in calls:
        result, took = _timed(fn, *args)
        assert took < deadline + 1, (fn.__name__, took)
        assert result == 1 or isinstance(result, RouterError), (fn.__name__, result)
    assert "within the deadline" in capsys.readouterr().err
    r, _ = _router(srv.api)
    regs, took = _timed(router_status.registries, [r], deadline)
    assert took < deadline + 1 and regs == {"gw-1": None}


def test_a_redirect_is_not_followed_with_the_key(hostile, key_file, capsys):
    """A 307 to another port would carry ``Authorization: Bearer KEY`` there."""
    srv = hostile("redirect")
    rc = router_worker.main(["list", "--api", srv.api, "--api-key-file", key_file(KEY + "\n"), "--deadline", "3"])
    out = capsys.readouterr()
    assert rc == 1 and "redirect, not followed" in out.err
    assert srv.forwarded == [] and KEY not in out.out + out.err


@pytest.mark.parametrize("flag", ["--api", "--health"])
def test_user_info_in_the_url_is_refused_and_never_echoed(capsys, flag):
    action = "wait-ready" if flag == "--health" else "list"
    rc = router_worker.main([action, flag, "http://admin:SECRETKEYpw@127.0.0.1:1", "--deadline", "1"])
    out = capsys.readouterr()
    assert rc == 1 and "user info" in out.err and len(out.err.splitlines()) == 1
    assert "SECRETKEYpw" not in out.out + out.err and "admin" not in out.out + out.err


@pytest.mark.parametrize("mode", ["reflect", "reflect_bare"])
@pytest.mark.parametrize("action", ["drain", "add"])
def test_a_reflected_key_in_an_error_body_is_not_printed(hostile, key_file, capsys, mode, action):
    """A 500 body echoing ``Bearer KEY`` (or the key alone, no secret-looking word before it)."""
    srv = hostile(mode)
    worker = WORKER if action == "drain" else "http://10.0.0.6:30000"
    rc = router_worker.main([action, "--api", srv.api, "--worker", worker, "--api-key-file", key_file(KEY + "\n"),
                             "--deadline", "3"])
    out = capsys.readouterr()
    assert rc == 1 and "HTTP 500" in out.err and "unauthorized" in out.err
    assert KEY not in out.out + out.err


def test_a_crlf_key_file_is_refused_in_one_line_without_the_key(hostile, key_file, capsys):
    srv = hostile("reflect")
    rc = router_worker.main(["list", "--api", srv.api, "--api-key-file", key_file(KEY + "\r\n"), "--deadline", "3"])
    out = capsys.readouterr()
    assert rc == 1 and "carriage return" in out.err and len(out.err.splitlines()) == 1
    assert KEY not in out.out + out.err
    with pytest.raises(RouterError, match="printable ASCII") as exc:  # a key given directly (a router's vault)
        Api(srv.api, KEY + "\r")
    assert KEY not in str(exc.value)


def test_deeply_nested_json_is_one_line_and_an_unreachable_cell(hostile, capsys):
    srv = hostile("deep_workers")
    rc = router_worker.main(["list", "--api", srv.api, "--deadline", "5"])
    out = capsys.readouterr()
    assert rc == 1 and "nested too deeply" in out.err and len(out.err.splitlines()) == 1
    assert "Traceback" not in out.err
    r, fleet = _router(srv.api)
    assert router_status.cells([r], router_status.registries([r], 5), fleet) == {"gpu-a": "gw-1: unreachable"}


def test_escapes_in_a_router_answer_never_reach_the_terminal(hostile, capsys):
    """A ``status`` outside smg's states shows as ``unknown`` (the router column and ``list``); an
    error body with escapes and U+202E is cleaned before it is printed."""
    srv = hostile("ansi")
    reg = router_worker.workers(Api(srv.api), time.monotonic() + 5)
    assert state_of(reg, WORKER) == "unknown"
    r, fleet = _router(srv.api)
    assert router_status.cells([r], router_status.registries([r], 5), fleet) == {"gpu-a": "gw-1: unknown"}
    assert router_worker.main(["list", "--api", srv.api, "--deadline", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"] == [{"url": WORKER, "state": "unknown"}]
    assert router_worker.main(["drain", "--api", srv.api, "--worker", WORKER, "--deadline", "3"]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "boom" in out.err and "\x1b" not in text and "\u202e" not in text and "\\u202e" not in text


def test_fleet_status_router_column_against_hostile_routers(hostile, monkeypatch, capsys):
    """``fleet status`` with one router answering deep JSON and one answering escapes: exit 0, the
    cells ``unreachable`` and ``unknown``, nothing raw on the table."""
    from ddtree_ops import cli
    from ddtree_ops.cli import fleet as fleet_cli
    from ddtree_ops.fleet import ssh as fleet_ssh

    (deep, _), (ansi, fleet) = _router(hostile("deep_workers").api), _router(hostile("ansi").api)
    ansi = type(ansi)("gw-2", *[getattr(ansi, f) for f in ("address", "settings", "workers", "dp_aware", "api_key")])
    rows = [fleet_ssh.HostStatus("gpu-a", ok=True, release="abc", active_state="active", sub_state="running")]
    monkeypatch.setattr(fleet_cli, "_targets", lambda *a: ([], "/dev/null"))
    monkeypatch.setattr(fleet_cli, "_limits", lambda *a, **k: type("L", (), {"deadline_s": 1.0})())
    monkeypatch.setattr(fleet_ssh, "status", lambda targets, limits: rows)
    monkeypatch.setattr(router_status, "fleet_cells",
                        lambda inv, vault: router_status.cells([deep, ansi],
                                                               router_status.registries([deep, ansi], 5), fleet))
    rc = cli.main(["fleet", "status", "-i", "inventory/example"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "gw-1: unreachable, gw-2: unknown" in " ".join(text.split())
    assert "\x1b" not in text and "\u202e" not in text
