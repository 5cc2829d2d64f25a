"""A worker's registration at the router (smg 1.13.0's worker API), every call with a total deadline.

Source: smg 1.13.0 (PyPI wheel ``smg-1.13.0-cp38-abi3-...whl``, the one
:data:`ddtree_ops.config.router.SMG_WHEEL` pins), its routes read from the wheel's
``smg_rs.abi3.so`` (``/workers``, ``/workers/{id}``) and checked against that binary in front of
the simulator (``tests/test_router_worker.py`` replays the answers recorded from it):

* ``GET /workers`` -> ``{"workers": [{"id", "url", "is_healthy", "status", ...}], "total", "stats"}``
  (``status`` is ``ready``, ``draining``, ``pending``, ``not_ready`` or ``failed``; recorded on an
  H200 in ``tests/fixtures/gpu/router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02/workers.json``);
* ``DELETE /workers/{id}`` -> 202 ``{"status": "accepted", "worker_id"}``: the worker turns
  ``draining`` (no new request is routed to it) for ``--drain-settle-secs`` (default 5 s, a fixed
  delay: smg does not wait for its in-flight requests; smg docs ``graceful-shutdown.md``), then
  leaves the registry;
* ``POST /workers`` ``{"url": URL}`` -> 202 ``{"status": "accepted", "worker_id", "location"}``:
  the worker is probed and turns ``ready`` with ``is_healthy: true``.

Standard library only: it runs on the router host in the router's venv (ddtree-ops is installed
there without dependencies), and on the controller. The router's API key, when one is given, is
read from its 0600 file and sent as ``Authorization: Bearer`` (smg checks it only with
``--control-plane-api-keys``); it is never printed. Each call ends by its total deadline (connection,
headers and body together, not per socket read), follows no redirect (the key goes only to the
address given), refuses user info in a URL, and shows the router's text only cleaned (no key, no
escapes, secrets redacted) and its ``status`` only when one of :data:`STATES`.

CLI (one JSON object on stdout; exit 0 ok, 1 failed, 2 usage)::

    python -m ddtree_ops.fleet.router_worker list  --api URL [--api-key-file F] [--deadline S]
    python -m ddtree_ops.fleet.router_worker drain --api URL --worker URL [--api-key-file F] [--deadline S]
        [--in-flight-s S]
    python -m ddtree_ops.fleet.router_worker add   --api URL --worker URL [--api-key-file F] [--deadline S]
    python -m ddtree_ops.fleet.router_worker wait-ready --health URL [--deadline S]
    python -m ddtree_ops.fleet.router_worker join (--config FILE | --credential NAME)
    python -m ddtree_ops.fleet.router_worker leave (--config FILE | --credential NAME) [--deadline S]

``join`` is what an instance host runs once its SGLang unit is warm (the unit
``ddtree-<name>-router-join.service``, :func:`ddtree_ops.render.router.render_join`): :func:`add`
at every router of its config, each retried until that router's ``deadline_s``; it exits 0 even
when a router never answered (the failure is logged; the SGLang server must not fail for it).
``leave`` is what that unit runs when it stops (the SGLang unit stopped, crashed or restarts):
:func:`drain` at every router, so a crashed worker is out of the registry until its next join.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import stat
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .._core.scrub import clean_text

MAX_BODY = 8 << 20
"""Largest answer read from the router (bytes); ``GET /workers`` of 256 workers is ~1 MB."""
MAX_KEY = 4096
CHUNK = 64 << 10
"""One socket read of an answer: each read waits at most the time left of the call's deadline."""
POLL_S = 0.5
DEFAULT_DEADLINE_S = 60.0
IN_FLIGHT_S = 0.0
"""Extra wait after a drained worker left the registry (``drain --in-flight-s``): smg's settle
window is a fixed delay, a request longer than it is still running on the worker."""
STATES = ("ready", "draining", "pending", "not_ready", "failed")
"""``status`` values of smg 1.13.0's worker registry."""
UNKNOWN = "unknown"
"""What :func:`state_of` shows for a ``status`` outside :data:`STATES` (never the router's own text:
it may hold terminal escapes or bidi overrides)."""


class RouterError(Exception):
    """A router call that failed or ran past its deadline (the message never holds the key)."""


@dataclass(frozen=True)
class Api:
    """Where the router's HTTP API is and the key to send."""

    base: str
    key: str | None = None

    def __post_init__(self) -> None:
        try:
            u = urllib.parse.urlsplit(self.base)
            u.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            u = None
        if u is not None and "@" in u.netloc:
            raise RouterError(f"router api {u.scheme}://(redacted)@{u.netloc.rpartition('@')[2][:100]}: user info "
                              "in the URL is refused (it would be sent and printed). Fix: give http(s)://HOST:PORT "
                              "and the key with --api-key-file")
        if u is None or u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query \
                or u.fragment:
            raise RouterError(f"router api {clean_text(self.base)[:200]!r}: must be http(s)://HOST:PORT with no "
                              "path. Fix: give the router's --port address, e.g. http://127.0.0.1:30080")
        if self.key is not None and not (self.key and self.key.isascii() and self.key.isprintable()):
            raise RouterError("router api key: empty or holds a control or non-ASCII character (a CR of a CRLF "
                              "line end?); it must be printable ASCII (an HTTP header value, RFC 9110 5.5). "
                              "Fix: store the key as one line of printable characters")

    def shown(self, text: object, limit: int = 200) -> str:
        """Server-supplied ``text`` safe to print: the key's own text replaced, then one line without
        escapes and with secret-looking values redacted (:func:`ddtree_ops._core.scrub.clean_text`)."""
        text = str(text)
        if self.key:
            text = text.replace(self.key, "(redacted)")
        return clean_text(text)[:limit]


def read_key_file(path: str) -> str:
    """The key in ``path``: a regular file not readable by group or others (0600), one line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RouterError(f"--api-key-file {path!r}: {exc.strerror}. Fix: give the router's key file "
                          "(/etc/ddtree-router/api-key)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise RouterError(f"--api-key-file {path!r}: mode {stat.S_IMODE(st.st_mode):04o}, must be a regular "
                              "file readable by its owner only. Fix: chmod 0600 it")
        data = f.read(MAX_KEY + 1)
    key = data.decode("utf-8", "replace").rstrip("\n")
    if not key or len(data) > MAX_KEY or "\n" in key:
        raise RouterError(f"--api-key-file {path!r}: must hold one non-empty line of at most {MAX_KEY} bytes")
    if not (key.isascii() and key.isprintable()):
        why = "a carriage return (CRLF line end)" if "\r" in key else "a control or non-ASCII character"
        raise RouterError(f"--api-key-file {path!r}: the key holds {why}; it must be printable ASCII (an HTTP "
                          "header value, RFC 9110 5.5). Fix: rewrite the file with one line ending in LF only")
    return key


def _abort(conn: http.client.HTTPConnection) -> None:
    """Shut the connection's socket: a read blocked on it (a header line, a body dripping) returns."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _read(conn: http.client.HTTPConnection, method: str, path: str,
          deadline: float, body: bytes | None, headers: dict) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        if conn.sock is not None:
            conn.sock.settimeout(left)
        b = r.read1(CHUNK)
        if not b:
            break
        chunks.append(b)
        size += len(b)
        if size > MAX_BODY:
            raise RouterError(f"{method} {path}: answer larger than {MAX_BODY} bytes")
    if time.monotonic() >= deadline:
        raise TimeoutError("deadline passed")  # the watchdog shut the socket: what came is not the whole answer
    if r.length:
        raise http.client.IncompleteRead(b"", r.length)  # fewer bytes than its Content-Length
    return r.status, b"".join(chunks)


def _call(api: Api, method: str, path: str, deadline: float, body: dict | None = None) -> tuple[int, Any]:
    """One HTTP call that ends by ``deadline`` (monotonic), connection, headers and body together: each
    socket read waits at most the time left and a watchdog shuts the socket at the deadline. A
    redirect is not followed (the key would go where the answer says)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise RouterError(f"{method} {path}: deadline passed")
    headers = {"Accept": "application/json", "Connection": "close"}
    data = None
    if body is not None:
        data = json.dumps(body, allow_nan=False).encode()
        headers["Content-Type"] = "application/json"
    if api.key:
        headers["Authorization"] = f"Bearer {api.key}"
    u = urllib.parse.urlsplit(api.base)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port, timeout=left)
    watchdog = threading.Timer(left, _abort, (conn,))
    watchdog.daemon = True
    watchdog.start()
    try:
        status, raw = _read(conn, method, path, deadline, data, headers)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if time.monotonic() >= deadline or isinstance(exc, TimeoutError):
            raise RouterError(f"{method} {api.base}{path}: no whole answer within the deadline") from None
        raise RouterError(f"{method} {api.base}{path}: {api.shown(getattr(exc, 'reason', exc))}") from None
    finally:
        watchdog.cancel()
        conn.close()
    if 300 <= status < 400:
        raise RouterError(f"{method} {api.base}{path}: HTTP {status} redirect, not followed (the key is sent "
                          "only to the address given). Fix: give the router's own --port address")
    try:
        doc = json.loads(raw) if raw.strip() else None
    except RecursionError:
        raise RouterError(f"{method} {api.base}{path}: HTTP {status}, JSON nested too deeply, not smg's "
                          "answer") from None
    except ValueError:
        doc = raw[:200].decode("utf-8", "replace")
    return status, doc


def workers(api: Api, deadline: float) -> list[dict]:
    """``GET /workers``: the registry (each ``{id, url, is_healthy, status}`` at least)."""
    status, doc = _call(api, "GET", "/workers", deadline)
    if status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise RouterError(f"GET /workers: HTTP {status}, not smg's worker list")
    return [w for w in doc["workers"] if isinstance(w, dict) and isinstance(w.get("url"), str)]


def norm(url: str) -> str:
    return url.rstrip("/")


def state_of(registry: list[dict], url: str) -> str:
    """A worker's state at the router: its ``status`` (``ready`` only when also ``is_healthy``;
    ``unhealthy`` otherwise; :data:`UNKNOWN` when not one of :data:`STATES`), ``absent`` when the
    router does not list it."""
    for w in registry:
        if norm(w["url"]) == norm(url):
            s = w.get("status")
            if s not in STATES:
                return UNKNOWN
            if s == "ready" and w.get("is_healthy") is not True:
                return "unhealthy"
            return s
    return "absent"


def drain(api: Api, url: str, deadline_s: float = DEFAULT_DEADLINE_S, in_flight_s: float = IN_FLIGHT_S) -> dict:
    """Take ``url`` out of the router: ``DELETE /workers/{id}`` of every entry for it, then wait
    until the router no longer lists it (smg drains it for ``--drain-settle-secs`` first), then
    ``in_flight_s`` more. Absent already: nothing to do."""
    t0 = time.monotonic()
    end = t0 + deadline_s
    reg = workers(api, end)
    ids = [w.get("id") for w in reg if norm(w["url"]) == norm(url)]
    for wid in ids:
        if not isinstance(wid, str) or not wid or "/" in wid:
            raise RouterError(f"GET /workers: worker {url} has no usable id ({api.shown(wid, 40)!r})")
        status, doc = _call(api, "DELETE", f"/workers/{urllib.parse.quote(wid)}", end)
        if status not in (200, 202, 404):
            raise RouterError(f"DELETE /workers/{api.shown(wid, 80)} ({url}): HTTP {status} {api.shown(doc)}")
    while True:
        state = state_of(workers(api, end), url)
        if state == "absent":
            break
        if time.monotonic() + POLL_S >= end:
            raise RouterError(f"drain {url}: still {state} at the router after {deadline_s:g} s "
                              "(smg's --drain-settle-secs is 5 s). Fix: check the router's journal")
        time.sleep(POLL_S)
    if in_flight_s > 0:
        time.sleep(min(in_flight_s, max(0.0, end - time.monotonic())))
    return {"ok": True, "worker": url, "was_listed": bool(ids), "seconds": round(time.monotonic() - t0, 2)}


def add(api: Api, url: str, deadline_s: float = DEFAULT_DEADLINE_S) -> dict:
    """Register ``url`` at the router (``POST /workers``) unless it is listed, then wait until
    it is ``ready`` and healthy there (smg probes it first)."""
    t0 = time.monotonic()
    end = t0 + deadline_s
    before = state_of(workers(api, end), url)
    if before in ("absent", "failed"):
        status, doc = _call(api, "POST", "/workers", end, {"url": url})
        if status not in (200, 201, 202):
            raise RouterError(f"POST /workers {url}: HTTP {status} {api.shown(doc)}")
    while True:
        state = state_of(workers(api, end), url)
        if state == "ready":
            break
        if time.monotonic() + POLL_S >= end:
            raise RouterError(f"add {url}: {state} at the router after {deadline_s:g} s, not ready. Fix: check "
                              "the worker's health from the router host (curl URL/health) and the router's journal")
        time.sleep(POLL_S)
    return {"ok": True, "worker": url, "was": before, "seconds": round(time.monotonic() - t0, 2)}


def wait_ready(health: str, deadline_s: float = DEFAULT_DEADLINE_S) -> dict:
    """Wait until smg's health listener answers ``GET /readiness`` 200 (at least one healthy
    worker; smg 1.13.0 ``--health-check-port``, recorded in the GPU fixture's
    ``health_port_readiness.txt``)."""
    api = Api(health)
    t0 = time.monotonic()
    end = t0 + deadline_s
    last = "no answer"
    while True:
        try:
            status, doc = _call(api, "GET", "/readiness", end)
            if status == 200 and isinstance(doc, dict) and doc.get("status") == "ready":
                return {"ok": True, "readiness": doc, "seconds": round(time.monotonic() - t0, 2)}
            last = f"HTTP {status} {api.shown(doc)}"
        except RouterError as exc:
            last = str(exc)
        if time.monotonic() + POLL_S >= end:
            raise RouterError(f"router {health}/readiness not ready after {deadline_s:g} s: {last}")
        time.sleep(POLL_S)


JOIN_ATTEMPT_S = 30.0
"""Longest single :func:`add` of a join: a worker smg still lists (``draining`` after a crash,
removed by ``--remove-unhealthy-workers`` a moment later) is not re-posted by :func:`add`, so an
attempt must end and the next one post it again."""
JOIN_RETRY_S = 2.0
MAX_CONFIG = 1 << 20


def read_join_config(path: str) -> dict:
    """The join config in ``path`` (:func:`ddtree_ops.render.router.join_config`): a regular file
    readable by its owner only (it holds the routers' keys), JSON ``{worker, hold, routers:
    [{name, api, key, deadline_s}]}``; each router's ``api`` and ``key`` are checked by :class:`Api`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RouterError(f"join config {path!r}: {exc.strerror}. Fix: deploy the instance again (the ddtree_service "
                          "role writes it)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise RouterError(f"join config {path!r}: mode {stat.S_IMODE(st.st_mode):04o}, must be a regular file "
                              "readable by its owner only (it holds the routers' keys). Fix: chmod 0600 it")
        data = f.read(MAX_CONFIG + 1)
    try:
        doc = json.loads(data) if len(data) <= MAX_CONFIG else None
    except (ValueError, RecursionError):
        doc = None
    routers = doc.get("routers") if isinstance(doc, dict) else None
    ok = isinstance(doc, dict) and isinstance(doc.get("worker"), str) and isinstance(doc.get("hold"), str) \
        and isinstance(routers, list) and all(
            isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("api"), str)
            and (r.get("key") is None or isinstance(r.get("key"), str))
            and isinstance(r.get("deadline_s"), (int, float)) and not isinstance(r.get("deadline_s"), bool)
            and 0 < r["deadline_s"] <= 3600 for r in routers)
    if not ok:
        raise RouterError(f"join config {path!r}: not a join config ({{worker, hold, routers: [{{name, api, key, "
                          "deadline_s in (0, 3600]}]}}). Fix: deploy the instance again")
    return doc


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def join_one(api: Api, url: str, deadline_s: float, name: str) -> dict:
    """Register ``url`` at one router, retrying every :data:`JOIN_RETRY_S` until ``deadline_s`` in
    total (the router down, restarting, answering 5xx or a redirect: each attempt logged); never raises."""
    t0 = time.monotonic()
    end = t0 + deadline_s
    attempts, last = 0, ""
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        attempts += 1
        try:
            out = add(api, url, min(left, JOIN_ATTEMPT_S))
            _log(f"router {name}: {url} registered and ready ({out['was']} before, attempt {attempts}, "
                 f"{time.monotonic() - t0:.1f} s)")
            return {"router": name, "ok": True, "was": out["was"], "attempts": attempts,
                    "seconds": round(time.monotonic() - t0, 2)}
        except RouterError as exc:
            last = api.shown(exc, 300)
            _log(f"router {name}: attempt {attempts} failed: {last}")
        time.sleep(max(0.0, min(JOIN_RETRY_S, end - time.monotonic())))
    _log(f"router {name}: {url} NOT registered after {deadline_s:g} s ({attempts} attempts): {last}. Fix: check "
         f"the router, then `systemctl restart` this join unit (or re-add it with router_worker add)")
    return {"router": name, "ok": False, "attempts": attempts, "error": last,
            "seconds": round(time.monotonic() - t0, 2)}


def _each_router(config: dict, one) -> list[dict]:
    """``one(api, router)`` for every router of join ``config``, all at once (one thread each); a
    router whose address or key is unusable gives its failure without a call. Each ``one`` ends by
    that router's own deadline; the margin covers one last call's watchdog."""
    apis, results = [], []
    for r in config["routers"]:
        try:
            apis.append((Api(r["api"], r["key"]), r))
        except RouterError as exc:
            _log(f"router {r['name']}: {exc}")
            results.append({"router": r["name"], "ok": False, "attempts": 0, "error": str(exc)})
    lock = threading.Lock()

    def run(api: Api, r: dict) -> None:
        res = one(api, r)
        with lock:
            results.append(res)

    threads = [threading.Thread(target=run, args=pair, daemon=True) for pair in apis]
    for t in threads:
        t.start()
    for t in threads:
        t.join(float(max((r["deadline_s"] for r in config["routers"]), default=0)) + 10)
    return sorted(results, key=lambda x: x["router"])


def join(config: dict) -> dict:
    """Register the worker of ``config`` at each of its routers, all at once, unless the hold marker
    exists: a rollout has drained it and re-adds it only after its gate passed
    (``playbooks/rolling.yml``). Each router within its own ``deadline_s``."""
    url, hold = config["worker"], config["hold"]
    if os.path.lexists(hold):
        _log(f"{url}: held out of its routers by a rollout ({hold} exists); not registering. The rollout re-adds "
             "it after its gate and removes the hold")
        return {"ok": True, "worker": url, "held": True, "routers": []}
    results = _each_router(config, lambda api, r: join_one(api, url, float(r["deadline_s"]), r["name"]))
    return {"ok": all(x["ok"] for x in results), "worker": url, "held": False, "routers": results}


def leave(config: dict, deadline_s: float) -> dict:
    """Take the worker of ``config`` out at each of its routers, all at once: what the join unit runs
    when it stops, i.e. whenever the SGLang unit stops, crashes or restarts (its ``BindsTo=``).

    smg's own health checks alone cannot keep a crashed worker out until it is warm again: with
    ``--remove-unhealthy-workers`` smg removes a worker only once it is ``failed``, which takes
    ``failure_threshold`` failed probes to ``not_ready`` and three times as many more (smg
    ``model_gateway/src/worker/manager.rs`` ``compute_next_status``); a worker back on ``/health``
    before that turns ``ready`` again after ``success_threshold`` probes, warm or not. Recorded on an
    H200 with smg 1.13.0 and the default health settings (10 s, 3 failures): 98 s after the SIGKILL
    it was still listed ``not_ready``
    (``tests/fixtures/gpu/router-join-smg-1.13.0-sglang-0.5.17-h200-2026-12-04/``). Removing it
    here, at once, leaves only the join to bring it back. Never raises; each router within
    ``deadline_s`` (the unit passes ``ddtree_ops.config.router.LEAVE_DEADLINE_S``), failures logged."""
    url = config["worker"]

    def one(api: Api, r: dict) -> dict:
        t0 = time.monotonic()
        try:
            out = drain(api, url, float(r["deadline_s"]), 0)
        except RouterError as exc:
            last = api.shown(exc, 300)
            _log(f"router {r['name']}: {url} not taken out: {last}; smg's health checks take it out of rotation")
            return {"router": r["name"], "ok": False, "error": last, "seconds": round(time.monotonic() - t0, 2)}
        _log(f"router {r['name']}: {url} taken out ({'was listed' if out['was_listed'] else 'was not listed'}, "
             f"{out['seconds']} s)")
        return {"router": r["name"], "ok": True, "was_listed": out["was_listed"], "seconds": out["seconds"]}

    results = _each_router({**config, "routers": [{**r, "deadline_s": deadline_s} for r in config["routers"]]}, one)
    return {"ok": all(x["ok"] for x in results), "worker": url, "routers": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree_ops.fleet.router_worker",
                                 description="A worker's registration at the smg router.")
    ap.add_argument("action", choices=("list", "drain", "add", "wait-ready", "join", "leave"))
    ap.add_argument("--config", help="join, leave: the join config file (0600)")
    ap.add_argument("--credential", help="join, leave: the config's name under $CREDENTIALS_DIRECTORY (systemd)")
    ap.add_argument("--api", help="the router's API, http://HOST:PORT (its --port)")
    ap.add_argument("--health", help="the router's health listener, http://HOST:PORT (wait-ready)")
    ap.add_argument("--worker", help="the worker's URL as the router lists it")
    ap.add_argument("--api-key-file", help="0600 file with the router's API key")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="total seconds")
    ap.add_argument("--in-flight-s", type=float, default=IN_FLIGHT_S, help="drain: extra wait after removal")
    a = ap.parse_args(argv)
    if not 0 < a.deadline <= 3600 or not 0 <= a.in_flight_s <= 3600:
        ap.error("--deadline must be in (0, 3600], --in-flight-s in [0, 3600]")
    key = None
    try:
        if a.action in ("join", "leave"):
            if bool(a.config) == bool(a.credential):
                ap.error(f"{a.action} needs one of --config FILE and --credential NAME")
            path = a.config
            if a.credential:
                creds = os.environ.get("CREDENTIALS_DIRECTORY")
                if not creds or "/" in a.credential:
                    raise RouterError(f"{a.action} --credential {a.credential!r}: no $CREDENTIALS_DIRECTORY (run by "
                                      "systemd with LoadCredential=) or a name with '/'. Fix: give --config FILE")
                path = os.path.join(creds, a.credential)
            config = read_join_config(path)
            out = join(config) if a.action == "join" else leave(config, a.deadline)
            keys = [r["key"] for r in config["routers"] if r.get("key")]
            text = json.dumps(out, allow_nan=False)
            for k in keys:  # the routers' text is cleaned already; the key's own text never printed
                text = text.replace(k, "(redacted)")
            print(text)
            return 0  # a router not joined or left is logged: the SGLang server must not fail or restart for it
        if a.action == "wait-ready":
            if not a.health:
                ap.error("wait-ready needs --health")
            out = wait_ready(a.health, a.deadline)
        else:
            if not a.api or (a.action != "list" and not a.worker):
                ap.error(f"{a.action} needs --api" + ("" if a.action == "list" else " and --worker"))
            key = read_key_file(a.api_key_file) if a.api_key_file else None
            api = Api(a.api, key)
            if a.action == "list":
                end = time.monotonic() + a.deadline
                out = {"ok": True, "workers": [{"url": w["url"], "state": state_of([w], w["url"])}
                                               for w in workers(api, end)]}
            elif a.action == "drain":
                out = drain(api, a.worker, a.deadline, a.in_flight_s)
            else:
                out = add(api, a.worker, a.deadline)
    except RouterError as exc:
        msg = str(exc).replace(key, "(redacted)") if key else str(exc)  # server text is cleaned already (Api.shown)
        print(json.dumps({"ok": False, "error": msg}, allow_nan=False))
        print(f"error: {msg}", file=sys.stderr)
        return 1
    print(json.dumps(out, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
