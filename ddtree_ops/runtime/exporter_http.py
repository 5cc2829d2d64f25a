"""The exporter's own HTTP listener: bounded, so idle or slow clients cannot starve scrapes.

``prometheus_client.start_http_server`` gives every connection a thread and no read timeout;
1,100 idle connections to the port held every one of the unit's 1,024 descriptors, so
Prometheus' scrapes got nothing (the exporter job's ``up`` 0) while systemd still said
active. This listener instead:

* serves at most :data:`MAX_CONNECTIONS` connections; when a new one comes while all are
  taken, the oldest that has not yet sent a whole request head is cut to make room (a
  scrape already being answered is never cut), and past twice the limit (cut ones not yet
  gone) the new one is closed at accept; so the process never needs more than
  :data:`NOFILE_LIMIT` descriptors, the unit's ``LimitNOFILE=`` (rendered from this value);
* gives each connection :data:`CONNECTION_DEADLINE_S` in total, head read and answer written
  (Prometheus sends its request at once and reads a few KiB), so an idle or trickling
  client frees its slot within that time whatever it does;
* answers one request per connection (HTTP/1.0, no keep-alive to hold a slot).
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..config.exporter_limits import MAX_CONNECTIONS

CONNECTION_DEADLINE_S = 2.0
"""Total seconds a connection may live (request head read, answer written)."""

class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "ddtree-exporter"
    timeout = CONNECTION_DEADLINE_S  # per socket operation; the total is the server's timer
    registry: CollectorRegistry

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (BaseHTTPRequestHandler's name)
        pass  # a flood must not flood the journal either

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.answering(self.request)  # type: ignore[attr-defined]
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype, code = generate_latest(self.registry), CONTENT_TYPE_LATEST, 200
        elif path == "/":
            body, ctype, code = b"ddtree-ops exporter: see /metrics\n", "text/plain; charset=utf-8", 200
        else:
            body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class BoundedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server with a connection limit and a total deadline per connection."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS, deadline_s: float = CONNECTION_DEADLINE_S) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self._conns: dict[Any, bool] = {}  # socket -> its request head is in (insertion order: oldest first)
        self._cut: set[Any] = set()
        self._lock = threading.Lock()
        self.refused = 0
        self.evicted = 0
        super().__init__(addr, handler)

    def answering(self, request: Any) -> None:
        """The connection sent a whole request head: it is a client being answered, not cut."""
        with self._lock:
            if request in self._conns:
                self._conns[request] = True

    def _admit(self, request: Any) -> bool:
        with self._lock:
            if len(self._conns) >= 2 * self.max_connections:
                return False
            if len(self._conns) - len(self._cut) >= self.max_connections:
                victim = next((r for r, busy in self._conns.items() if not busy and r not in self._cut), None)
                if victim is None:
                    return False
                self._cut.add(victim)
                self.evicted += 1
                _cut(victim)
            self._conns[request] = False
            return True

    def _leave(self, request: Any) -> None:
        with self._lock:
            self._conns.pop(request, None)
            self._cut.discard(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._admit(request):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._leave(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = threading.Timer(self.deadline_s, _cut, (request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._leave(request)


def _cut(request: Any) -> None:
    """End a connection's blocked read or write now (its thread then closes it)."""
    try:
        request.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def serve_registry(registry: CollectorRegistry, host: str, port: int) -> tuple[BoundedHTTPServer, threading.Thread]:
    """Serve ``registry`` on ``http://host:port/metrics`` (daemon thread). ``port=0`` picks one."""
    handler = type("ExporterHandler", (_Handler,), {"registry": registry})
    server = BoundedHTTPServer((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, name="ddtree-exporter-http", daemon=True)
    thread.start()
    return server, thread
