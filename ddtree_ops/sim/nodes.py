"""Multi-node start of the SGLang SIMULATOR (a test double, NOT SGLang): ``--nnodes``,
``--node-rank``, ``--dist-init-addr``, ``--dist-timeout``.

What it reproduces (real SGLang, read off ``sgl-project/sglang`` ``python/sglang/srt``; 0.5.23
``arg_groups/fields/parallel.py`` for the flags, ``dist_timeout`` default None):

* every rank meets in torch.distributed's TCP store at ``tcp://<dist_init_addr>``, which global
  rank 0 (node 0) listens on (``model_executor/model_runner.py`` ``init_torch_distributed``),
  before the weights load. Node 0 waits until every node joined: with fewer it stays in its
  load phase (the HTTP port closed: not ready) and after ``dist_timeout`` seconds (torch's NCCL
  default 600 s when None, ``torch/distributed/constants.py``) fails as torch's ``TCPStore``
  does ("Timed out after N seconds waiting for clients. J/N clients joined."). A node of rank
  >= 1 retries the connection for as long and fails with torch's client-side timeout text;
* a node of rank >= 1 serves no API: once its ranks are ready it runs
  ``launch_dummy_health_check_server`` on ``--port`` (``/health``, ``/health_generate``,
  ``/ping`` answer 200; ``/metrics`` with ``--enable-metrics``; anything else 404 as FastAPI)
  and blocks on its scheduler processes (``entrypoints/engine.py`` ``_launch_subprocesses``);
* a node that dies breaks the NCCL communicator: the surviving ranks' collectives fail, the
  watchdog of ``ProcessGroupNCCL`` ends the scheduler, and SGLang's launcher exits non-zero
  ("Scheduler hit an exception", the ``ncclRemoteError`` text below). The simulator watches
  the store connections and exits 1 with that text when a peer's connection closes.

The simulator's store protocol is its own (one line ``rank R`` per joining node); only the
timing, the readiness and the failure texts stand for SGLang's.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("ddtree_ops.sim")

TORCH_NCCL_DEFAULT_TIMEOUT_S = 600
"""torch.distributed's default process-group timeout for NCCL (``default_pg_nccl_timeout``,
10 min), what SGLang passes on when ``--dist-timeout`` is unset."""

NCCL_REMOTE_ERROR = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group "
    "watchdog thread terminated with exception: NCCL error: remote process exited or there was a network "
    "error, NCCL version 2.27.3\nncclRemoteError: A call failed possibly due to a network error or a remote "
    "process exiting prematurely.\nLast error:\nsocket recv: Connection reset by peer (node rank {peer}, {what})")
"""What the surviving ranks log when a peer node dies (NCCL's ``ncclRemoteError``, torch's watchdog)."""


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` / ``[IPV6]:PORT`` of ``--dist-init-addr`` (SGLang's ``configure_ipv6``)."""
    if addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
    else:
        host, _, port = addr.rpartition(":")
    return host, int(port)


def _die(text: str) -> None:
    logger.error("Scheduler hit an exception: Traceback (most recent call last):\n%s", text)
    sys.stderr.write(text + "\n")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)


def _watch(conn: socket.socket, rank: int, peer: int, what: str) -> None:
    """Exit the process (as SGLang's launcher does) once ``conn`` to ``peer`` closes."""
    def run() -> None:
        while True:
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            if not data:
                _die(NCCL_REMOTE_ERROR.format(rank=rank, peer=peer, what=what))
    threading.Thread(target=run, name=f"sim-nccl-watch-{peer}", daemon=True).start()


def rendezvous(sa: dict[str, Any], keep: list[object]) -> int | None:
    """Join the store of a multi-node start (no-op with ``nnodes`` 1). Returns an exit status to
    end the process with, or None to go on; the sockets go to ``keep`` (held for the process' life)."""
    nnodes, rank = int(sa.get("nnodes") or 1), int(sa.get("node_rank") or 0)
    if nnodes <= 1:
        return None
    if not sa.get("dist_init_addr"):
        logger.error("--dist-init-addr is required with --nnodes %d", nnodes)
        return 1
    host, port = split_addr(str(sa["dist_init_addr"]))
    timeout = float(sa.get("dist_timeout") or TORCH_NCCL_DEFAULT_TIMEOUT_S)
    deadline = time.monotonic() + timeout
    logger.info("[sim] node rank %d of %d: torch.distributed store tcp://%s:%d (dist_timeout %ss)",
                rank, nnodes, host, port, int(timeout))
    if rank == 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        store = socket.socket(family, socket.SOCK_STREAM)
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            store.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
            store.listen(16)
        except OSError as exc:
            logger.error("torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                         "network address. port: %d, useIPv6: %d, code: -98, name: EADDRINUSE (%s)",
                         port, int(family == socket.AF_INET6), exc)
            return 1
        keep.append(store)
        joined: dict[int, socket.socket] = {}
        while len(joined) < nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:  # torch reports timeout + 1 s (61 for --dist-timeout 60: SGLang 0.5.17 on an H200, recorded)
                waited = int(timeout) + 1
                logger.error("torch.distributed.DistStoreError: Timed out after %d seconds waiting for clients. "
                             "%d/%d clients joined.", waited, len(joined) + 1, nnodes)
                missing = sorted(set(range(1, nnodes)) - set(joined))
                logger.error("[sim] node ranks %s never joined rank 0", ",".join(map(str, missing)))
                return 1
            store.settimeout(min(left, 5.0))
            try:
                conn, peer = store.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            try:
                line = conn.recv(64).decode("ascii", "replace").strip()
                peer_rank = int(line.removeprefix("rank "))
            except (OSError, ValueError):
                conn.close()
                continue
            conn.settimeout(None)
            joined[peer_rank] = conn
            keep.append(conn)
            logger.info("[sim] node rank %d joined from %s (%d/%d)", peer_rank, peer[0], len(joined) + 1, nnodes)
        for peer_rank, conn in joined.items():
            conn.sendall(b"go\n")
            _watch(conn, 0, peer_rank, "a node of this server stopped")
        return None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            logger.error("torch.distributed.DistNetworkError: The client socket has timed out after %ds while "
                         "trying to connect to (%s, %d).", int(timeout), host, port)
            return 1
        try:
            conn = socket.create_connection((host, port), timeout=min(left, 5.0))
            conn.sendall(f"rank {rank}\n".encode())
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            if conn.recv(64).strip() != b"go":
                raise OSError("store closed")
            conn.settimeout(None)
            break
        except OSError:
            time.sleep(1.0)
    keep.append(conn)
    _watch(conn, rank, 0, "rank 0 stopped")
    return None


class _DummyHandler(BaseHTTPRequestHandler):
    """SGLang's ``launch_dummy_health_check_server``: health endpoints only."""

    server_version = "uvicorn"
    sys_version = ""
    metrics = False

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ping"):
            self._send(200, b"", "text/plain")
        elif path == "/metrics" and self.metrics:
            self._send(200, b"", "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b'{"detail":"Not Found"}')

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self._send(404 if self.path.split("?", 1)[0] not in ("/health", "/health_generate", "/ping") else 405,
                   b'{"detail":"Not Found"}')


def serve_dummy_health(host: str, port: int, enable_metrics: bool) -> int:
    """A node of rank >= 1 after its ranks are ready: the health-only server, forever."""
    handler = type("Handler", (_DummyHandler,), {"metrics": enable_metrics})
    try:
        httpd = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        logger.error("Failed to bind %s:%s: %s", host, port, exc)
        return 1
    logger.info("Starting dummy health check server at %s:%s", host, port)
    sys.stdout.flush()
    httpd.serve_forever()
    return 0
