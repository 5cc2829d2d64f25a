"""A warm worker registers itself at its routers (``router_worker join``, the join unit of
``ddtree_ops.render.router.render_join``) and smg drops an unhealthy one (``--remove-unhealthy-workers``).

The rendering: the join unit, the SGLang unit's drop-in and the 0600 config are written for an
instance a router fronts and for no other; the SGLang unit itself is the same bytes with or without
routers (a changed router list never restarts the GPU server); the key is only in the 0600 config;
the join unit passes ``systemd-analyze verify`` and scores within budget.

The join logic against fake smg routers (real HTTP servers in threads): one that fails with 500 a
few times then registers, one that redirects, one that drips, one that is down, one that still
lists the worker as ``draining`` after a crash; each router within its own total deadline, the key
never printed, and the exit 0 whatever the routers did (the SGLang server must not fail for it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from test_router import ANALYZE, _instance, _one, _router_inventory, needs_analyze

from ddtree_ops.cli import main
from ddtree_ops.config.router import routers_for
from ddtree_ops.fleet import router_worker
from ddtree_ops.render.router import join_config, join_paths, render_join, router_argv

KEY = "J0in-KEY-canary-7e1d"
WORKER = "http://10.0.0.5:30000"


# --- rendering -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet():
    return [_instance("gpu-a", "10.0.0.5", 30000), _instance("gpu-b", "10.0.0.6", 30000)]


def test_remove_unhealthy_workers_is_rendered(fleet):
    (r,), _ = _one(fleet)
    assert "--remove-unhealthy-workers" in router_argv(r)


def _files(out: Path, host: str) -> dict[str, Path]:
    return {str(p.relative_to(out / host)): p for p in (out / host).rglob("*") if p.is_file()}


def test_render_writes_join_files_only_for_fronted_instances(tmp_path):
    inv = _router_inventory(tmp_path, {"instances": ["ct200-01-qwen8b"], "api_key_secret": "RK"})
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["routers"]["hosts"]["gw-01"]["ddtree_secret_env"] = {"RK": KEY}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = tmp_path / "out"
    assert main(["render", "--out", str(out), "-i", str(inv)]) == 0
    mine = _files(out, "ct200-01-qwen8b")
    unit = mine["etc/systemd/system/ddtree-qwen8b-router-join.service"].read_text()
    assert "BindsTo=ddtree-qwen8b.service" in unit and "After=ddtree-qwen8b.service" in unit
    assert "LoadCredential=join:/etc/ddtree-router-join/ddtree-qwen8b.json" in unit and KEY not in unit
    # stopped with the SGLang unit (a crash included): the worker leaves its routers at once, bounded
    assert re.search(r"^ExecStop=\S+/bin/python -m ddtree_ops\.fleet\.router_worker leave --credential join "
                     r"--deadline 15$", unit, re.M), unit
    assert re.search(r"^TimeoutStopSec=45$", unit, re.M)
    dropin = mine["etc/systemd/system/ddtree-qwen8b.service.d/ddtree-router-join.conf"].read_text()
    assert re.search(r"^Upholds=ddtree-qwen8b-router-join\.service$", dropin, re.M)
    cfg_path = mine["etc/ddtree-router-join/ddtree-qwen8b.json"]
    assert cfg_path.stat().st_mode & 0o777 == 0o600
    cfg = json.loads(cfg_path.read_text())
    assert cfg == {"worker": "http://ct200-01.example.internal:30000",
                   "hold": "/etc/ddtree-router-join/ddtree-qwen8b.hold",
                   "routers": [{"name": "gw-01", "api": "http://10.0.0.9:30080", "key": KEY, "deadline_s": 300}]}
    # the other instance of the machine is not fronted: no join files at all
    assert not [p for p in _files(out, "ct200-01-qwen32b") if "router-join" in p]
    # the SGLang unit is the same bytes without any router: the router list is not in it
    plain = tmp_path / "plain"
    assert main(["render", "--out", str(plain), "-i", str(REPO_INV)]) == 0
    for host in ("ct200-01-qwen8b", "ct200-01-qwen32b"):  # every file of the plain render, unit included
        a, b = _files(out, host), _files(plain, host)
        assert any(k.endswith(".service") for k in b)
        assert {k: v.read_bytes() for k, v in b.items()} == {k: v.read_bytes() for k, v in a.items() if k in b}


REPO_INV = Path(__file__).resolve().parents[1] / "inventory" / "multi-example"


def test_join_config_matches_routers_for_and_a_port_change_touches_only_join_files(fleet):
    v = fleet[0]
    (r,), _ = _one(fleet, {"api_key_secret": "K", "port": 30100}, ddtree_secret_env={"K": KEY})
    mine, found = routers_for({"gw-1": {"ansible_host": "10.0.0.9", "ddtree_router": {"api_key_secret": "K",
                                                                                      "port": 30100},
                                        "ddtree_secret_env": {"K": KEY}}}, v)
    assert found == [] and [f.content for f in render_join(v, mine)] == [f.content for f in render_join(v, [r])]
    assert join_config(v, [r])["routers"] == [{"name": "gw-1", "api": "http://10.0.0.9:30100", "key": KEY,
                                               "deadline_s": 300}]
    assert join_config(v, [r])["worker"] == "http://10.0.0.5:30000"
    # an instance the router does not list, or a router without its key: nothing / one finding
    none, _ = routers_for({"gw-1": {"ddtree_router": {"instances": ["gpu-b"]}}}, v)
    assert none == [] and render_join(v, none) == []
    _, found = routers_for({"gw-1": {"ddtree_router": {"api_key_secret": "K"}}}, v)
    assert [f.field for f in found] == ["ddtree_router.api_key_secret"]
    _, found = routers_for({"gw-1": {"ddtree_router": {"join_deadline_s": 5}}}, v)
    assert [f.field for f in found] == ["ddtree_router.join_deadline_s"]
    _, found = routers_for({"gw-1": {}}, v)
    assert [f.field for f in found] == ["ddtree_router"]


def test_join_deadline_is_validated(fleet):
    _, errors = _one(fleet, {"join_deadline_s": 99999})
    assert [e.field for e in errors] == ["ddtree_router.join_deadline_s"]


@needs_analyze
@pytest.mark.skipif(not Path("/lib/systemd/system/multi-user.target").exists(), reason="no systemd unit directory")
def test_join_unit_verifies_and_scores_within_budget(fleet, tmp_path):
    from ddtree_ops.render import render_host

    v = fleet[0]
    (r,), _ = _one(fleet, {"api_key_secret": "K"}, ddtree_secret_env={"K": KEY})
    files = render_join(v, [r])
    root = tmp_path / "root"
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for f in [*render_host(v), *files]:
        if not f.path.startswith("/etc/systemd/system/"):
            continue
        p = root / f.path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f.content)
        for exe in re.findall(r"^Exec\w+=-?(/\S+)", f.content, flags=re.M):
            e = root / exe.lstrip("/")
            e.parent.mkdir(parents=True, exist_ok=True)
            e.write_text("#!/bin/sh\n")
            e.chmod(0o755)
    unit = root / join_paths(v)["unit"].lstrip("/")
    res = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={root}", str(unit),
                          str(root / "etc/systemd/system" / v.deployment.service.unit_name)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    res = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager", "--threshold=25", str(unit)],
                         capture_output=True, text=True, timeout=60)
    score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+) ", res.stdout).group(1))
    assert score <= 2.5 and res.returncode == 0, res.stdout


# --- the join against fake routers -------------------------------------------------------------

class _Smg(BaseHTTPRequestHandler):
    """A fake smg worker API: ``GET /workers`` lists the registry, ``POST /workers`` adds the worker
    (``ready`` at the next listing). ``server.fake``: mode ``ok``, ``fail`` (500 for the first
    ``fails`` requests), ``redirect``, ``drip``, ``draining`` (lists the worker ``draining`` for its
    first ``fails`` listings, then drops it, as smg's --remove-unhealthy-workers does)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code: int, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_ANY(self):  # noqa: N802
        f = self.server.fake
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        with f.lock:
            f.requests.append((self.command, self.path, self.headers.get("Authorization")))
            n = len(f.requests)
        if f.mode == "fail" and n <= f.fails:
            return self._send(500, {"error": f"boom {self.headers.get('Authorization')}"})
        if f.mode == "redirect":
            self.send_response(307)
            self.send_header("Location", "http://127.0.0.1:9/workers")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if f.mode == "drip":
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Length", str(10**6))
            self.end_headers()
            try:
                for _ in range(40):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.25)
            except OSError:
                pass
            return None
        if self.command == "GET" and self.path == "/workers":
            with f.lock:
                f.listings += 1
                if f.mode == "draining" and f.listings <= f.fails:
                    return self._send(200, {"workers": [{"id": "w0", "url": WORKER, "is_healthy": False,
                                                         "status": "draining"}]})
                return self._send(200, {"workers": [{"id": "w1", "url": u, "is_healthy": True, "status": "ready"}
                                                    for u in f.registered]})
        if self.command == "POST" and self.path == "/workers":
            with f.lock:
                f.registered.append(json.loads(body)["url"])
            return self._send(202, {"status": "accepted", "worker_id": "w1"})
        if self.command == "DELETE" and self.path == "/workers/w1":
            with f.lock:  # smg drains it first (--drain-settle-secs); the fake drops it at once
                f.registered.clear()
            return self._send(202, {"status": "accepted", "worker_id": "w1"})
        return self._send(404, {})

    do_GET = do_POST = do_DELETE = do_ANY  # noqa: N815


class Fake:
    def __init__(self, mode: str = "ok", fails: int = 0):
        self.mode, self.fails, self.lock = mode, fails, threading.Lock()
        self.requests: list[tuple] = []
        self.registered: list[str] = []
        self.listings = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Smg)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.api = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes():
    made: list[Fake] = []

    def make(*a, **kw) -> Fake:
        made.append(Fake(*a, **kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.fixture(autouse=True)
def _quick(monkeypatch):
    monkeypatch.setattr(router_worker, "JOIN_RETRY_S", 0.2)
    monkeypatch.setattr(router_worker, "POLL_S", 0.1)


def _config(tmp_path: Path, routers: list[dict], mode: int = 0o600) -> str:
    p = tmp_path / "join.json"
    p.write_text(json.dumps({"worker": WORKER, "hold": str(tmp_path / "hold"), "routers": routers}))
    p.chmod(mode)
    return str(p)


def _run(capsys, *args, action: str = "join") -> tuple[int, dict, str, float]:
    t0 = time.monotonic()
    rc = router_worker.main([action, *args])
    took = time.monotonic() - t0
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if out.out.strip() else {}), out.err, took


def test_join_retries_through_500s_and_registers(fakes, tmp_path, capsys):
    f = fakes("fail", fails=3)
    rc, doc, err, _ = _run(capsys, "--config", _config(tmp_path, [{"name": "gw", "api": f.api, "key": KEY,
                                                                   "deadline_s": 10}]))
    assert rc == 0 and doc["ok"] and doc["routers"][0]["attempts"] > 1, (doc, err)
    assert f.registered == [WORKER]
    assert {a for *_, a in f.requests} == {f"Bearer {KEY}"}  # the key went to the router ...
    assert KEY not in json.dumps(doc) + err and "HTTP 500" in err  # ... and was never printed


@pytest.mark.parametrize("mode", ["redirect", "drip", "down"])
def test_a_hostile_or_absent_router_ends_by_its_deadline_and_exits_0(fakes, tmp_path, capsys, mode):
    if mode == "down":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        api = f"http://127.0.0.1:{s.getsockname()[1]}"
        s.close()  # nothing listens there: connection refused, retried until the deadline
    else:
        api = fakes(mode).api
    good = fakes("ok")
    deadline = 2.0
    rc, doc, err, took = _run(capsys, "--config", _config(tmp_path, [
        {"name": "bad", "api": api, "key": KEY, "deadline_s": deadline},
        {"name": "good", "api": good.api, "key": None, "deadline_s": deadline}]))
    assert rc == 0 and took < deadline + 2, took  # both routers at once, each within its deadline
    by = {r["router"]: r for r in doc["routers"]}
    assert by["good"]["ok"] and not by["bad"]["ok"] and not doc["ok"]
    assert good.registered == [WORKER]
    assert "NOT registered" in err and KEY not in err + json.dumps(doc)
    if mode == "redirect":
        assert "redirect, not followed" in err


def test_a_worker_still_draining_after_its_crash_is_posted_again(fakes, tmp_path, capsys, monkeypatch):
    """smg lists the crashed worker ``draining`` until --remove-unhealthy-workers drops it: an
    attempt that found it listed ends after JOIN_ATTEMPT_S and the next one posts it."""
    monkeypatch.setattr(router_worker, "JOIN_ATTEMPT_S", 0.6)
    f = fakes("draining", fails=4)
    rc, doc, err, _ = _run(capsys, "--config", _config(tmp_path, [{"name": "gw", "api": f.api, "key": None,
                                                                   "deadline_s": 10}]))
    assert rc == 0 and doc["ok"] and doc["routers"][0]["attempts"] >= 2, (doc, err)
    assert f.registered == [WORKER] and ("POST", "/workers", None) in f.requests


def test_a_hold_keeps_the_worker_out_without_asking_any_router(fakes, tmp_path, capsys):
    f = fakes("ok")
    (tmp_path / "hold").write_text("held\n")
    rc, doc, err, _ = _run(capsys, "--config", _config(tmp_path, [{"name": "gw", "api": f.api, "key": KEY,
                                                                   "deadline_s": 5}]))
    assert rc == 0 and doc["held"] and f.requests == [] and "held out of its routers" in err


def test_a_readable_or_broken_config_is_refused(tmp_path, capsys):
    rc, _, err, _ = _run(capsys, "--config", _config(tmp_path, [], mode=0o644))
    assert rc == 1 and "mode 0644" in err and "chmod 0600" in err
    p = tmp_path / "join.json"
    p.write_text(json.dumps({"worker": WORKER, "hold": "/x", "routers": [{"name": "gw", "api": "http://a:1",
                                                                         "key": None, "deadline_s": 0}]}))
    p.chmod(0o600)
    rc, _, err, _ = _run(capsys, "--config", str(p))
    assert rc == 1 and "deadline_s in (0, 3600]" in err


def test_the_credential_is_read_from_systemds_directory(fakes, tmp_path, capsys, monkeypatch):
    f = fakes("ok")
    _config(tmp_path, [{"name": "gw", "api": f.api, "key": None, "deadline_s": 5}])
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    rc, doc, _, _ = _run(capsys, "--credential", "join.json")
    assert rc == 0 and doc["ok"]
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    rc, _, err, _ = _run(capsys, "--credential", "join.json")
    assert rc == 1 and "CREDENTIALS_DIRECTORY" in err
    assert os.path.exists(tmp_path / "join.json")


# --- the leave: the join unit's stop -------------------------------------------------------------

def test_leave_takes_the_worker_out_at_every_router_and_exits_0(fakes, tmp_path, capsys):
    """What the join unit runs when the SGLang unit stops or crashes: DELETE at each router, so smg
    cannot readmit the worker on its /health before the next join (after warmup) adds it."""
    a, b = fakes("ok"), fakes("ok")
    a.registered.append(WORKER)
    b.registered.append(WORKER)
    cfg = _config(tmp_path, [{"name": "a", "api": a.api, "key": KEY, "deadline_s": 300},
                             {"name": "b", "api": b.api, "key": None, "deadline_s": 300}])
    rc, doc, err, _ = _run(capsys, "--config", cfg, "--deadline", "5", action="leave")
    assert rc == 0 and doc["ok"] and a.registered == b.registered == [], (doc, err)
    assert ("DELETE", "/workers/w1", f"Bearer {KEY}") in a.requests and KEY not in err + json.dumps(doc)
    assert [r["was_listed"] for r in doc["routers"]] == [True, True]
    # not listed (a rollout drained it already): nothing to delete, still ok
    rc, doc, _, _ = _run(capsys, "--config", cfg, "--deadline", "5", action="leave")
    assert rc == 0 and doc["ok"] and [r["was_listed"] for r in doc["routers"]] == [False, False]


@pytest.mark.parametrize("mode", ["redirect", "drip", "down", "fail"])
def test_leave_from_a_hostile_or_absent_router_ends_by_its_deadline_and_exits_0(fakes, tmp_path, capsys, mode):
    """The SGLang unit's restart after a crash waits for this stop: a router that is down, answers 500,
    redirects or drips costs its --deadline at most, never the join's (longer) deadline_s."""
    if mode == "down":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        api = f"http://127.0.0.1:{s.getsockname()[1]}"
        s.close()
    else:
        api = fakes(mode, fails=100).api
    good = fakes("ok")
    good.registered.append(WORKER)
    rc, doc, err, took = _run(capsys, "--config", _config(tmp_path, [
        {"name": "bad", "api": api, "key": KEY, "deadline_s": 300},
        {"name": "good", "api": good.api, "key": None, "deadline_s": 300}]), "--deadline", "2", action="leave")
    assert rc == 0 and took < 2 + 2, took
    by = {r["router"]: r for r in doc["routers"]}
    assert by["good"]["ok"] and not by["bad"]["ok"] and good.registered == []
    assert "not taken out" in err and KEY not in err + json.dumps(doc)


def test_the_recorded_crash_needs_the_leave():
    """What real smg 1.13.0 did with a SIGKILLed SGLang 0.5.17 worker on an H200 (the fixture's README):
    without the leave it stayed registered ``not_ready`` and smg's own probes made it ``ready`` again,
    so its readmission depended on nothing but /health; with the leave it was out of the registry from
    seconds after the kill until the join, and no request failed either way."""
    from helpers import FIXTURES

    d = FIXTURES / "gpu" / "router-join-smg-1.13.0-sglang-0.5.17-h200-2026-12-04"
    argv = (d / "no-leave" / "argv.txt").read_text().split()
    assert "--remove-unhealthy-workers" in argv and argv == (d / "leave" / "argv.txt").read_text().split()
    plain = json.loads((d / "no-leave" / "crash.json").read_text())
    assert [h for _, h in plain["router_view"]] == [True, False, True]  # never dropped from the registry
    assert json.loads(plain["join_output"].splitlines()[0])["routers"][0]["was"] == "not_ready"
    left = json.loads((d / "leave" / "crash.json").read_text())
    view = left["router_view"]
    dropped = next(t for t, h in view if h is None)
    back = next(t for t, h in view if h is True and t > 0)
    assert dropped < 10 < left["s_kill_to_join"] < back and not left["listed_healthy_before_join"]
    assert json.loads(left["join_output"].splitlines()[0])["routers"][0]["was"] == "absent"
    assert json.loads((d / "leave" / "crash_leave.json").read_text())["routers"][0]["was_listed"] is True
    assert plain["failed"] == left["failed"] == 0
    # the product's own state reading of the recorded registry after the crash
    after = json.loads((d / "leave" / "workers_after_crash.json").read_text())["workers"]
    assert router_worker.state_of(after, "http://127.0.0.1:30003") == "ready"
