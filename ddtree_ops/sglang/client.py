"""A small, bounded HTTP client for SGLang's native endpoints (``srt/entrypoints/http_server.py``).

Endpoints: ``/health`` (503 while starting, else a 1-token generation), ``/server_info``
(older builds: ``/get_server_info``), ``/generate``, ``/metrics``.

Every request is bounded three ways, because the server may be hostile or broken:

* **Total deadline**: :func:`fetch` runs connect, send, headers and the whole body inside
  one ``asyncio.timeout`` (httpx's own timeouts are per network operation and restart on
  every byte, so a server trickling one byte a second is never cut off by them).
* **Size cap**: the body is streamed and the request stops with :class:`SGLangError` once
  it passes the endpoint's cap (:data:`CAPS`); a compressed body is decompressed
  incrementally with its output bounded by the same cap (no gzip bomb).
* **Strict content**: :func:`loads_json` refuses non-finite numbers (``NaN``,
  ``Infinity``, ``1e999``), integers beyond a float, and nesting deeper than
  :data:`MAX_JSON_DEPTH`; :func:`select_samples` refuses non-finite metric values.

Every failure is an :class:`SGLangError` (one line, server text truncated and escaped), so
callers turn server misbehaviour into failed checks, never crashes.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import ssl
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

MIB = 1 << 20

CAPS = {
    "/metrics": 8 * MIB,
    "/server_info": 1 * MIB,
    "/get_server_info": 1 * MIB,
    "/health": 64 * 1024,
}
"""Body caps (bytes) per endpoint. ``/metrics``: real SGLang 0.5.23 with 8 TP ranks and
``--enable-metrics-for-all-schedulers`` serves ~0.8 MB, so 8 MiB leaves 10x headroom.
``/server_info``: the server args plus one ``internal_states`` object per DP rank, a few
KB in practice; 1 MiB. ``/health``: an empty body; 64 KiB."""

LOCAL_WORK_S = 0.25
"""Seconds of local work one answer can cost after its deadline: decoding and parsing a
capped body (worst case measured: ~0.2 s for 8 MiB of pathological Prometheus text on 2
shared cores; real SGLang answers take milliseconds). Time bounds add it per request."""

MAX_SAMPLES = 10_000
"""Most samples :func:`select_samples` accepts (SGLang exposes the selected families with a
few series per TP rank: hundreds at most)."""

DEFAULT_CAP = 1 * MIB
"""Cap (bytes) for any endpoint not in :data:`CAPS`."""

MAX_JSON_DEPTH = 32
"""Deepest JSON nesting accepted (SGLang's answers nest 4 levels at most)."""

PREVIEW_CHARS = 200
"""Server text quoted in an error message is cut to this many characters (+ ``…``)."""


GENERATE_ENVELOPE = 64 * 1024
"""Bytes of a ``/generate`` or chat-completion answer besides its tokens: SGLang's envelope
and ``meta_info`` (ids, finish reason, token counts, latencies, speculative counters) are
1-2 KB without logprobs, which warmup never asks for."""


def generate_cap(max_new_tokens: int) -> int:
    """Body cap (bytes) of a ``/generate`` or chat-completion answer generating
    ``max_new_tokens`` tokens: :data:`GENERATE_ENVELOPE` plus 64 bytes a token (its text,
    at most sextupled by JSON escaping, and its id in ``output_ids``). Warmup runs up to a
    batch size of requests at once, so this cap times the batch size bounds what it buffers."""
    return GENERATE_ENVELOPE + 64 * max(0, max_new_tokens)


class SGLangError(Exception):
    """The server could not be reached, or answered something that is not a valid answer.

    Attributes:
        reachable: the server accepted the connection and either answered HTTP or kept
            the connection open without finishing an answer (a hanging ``/health``).
        what: the message without the URL (for a list of probes of one URL).
    """

    def __init__(self, message: str, reachable: bool = True, what: str | None = None) -> None:
        super().__init__(message)
        self.reachable = reachable
        self.what = what or message


def _error(where: str, what: str, reachable: bool = True) -> SGLangError:
    return SGLangError(f"{where}: {what}", reachable, what)


PREVIEW_SCRUB_MARGIN = 1024
"""Characters past ``limit`` that :func:`preview` scrubs with the shown part, so a secret that starts
inside the cut and runs past it is still recognised whole (a token cut in two is no token shape)."""


def preview(data: bytes | str, limit: int = PREVIEW_CHARS) -> str:
    """Server-controlled text, safe to put in one line of a message, log or result file: decoded with
    replacement, secrets redacted (:func:`ddtree_ops.config.errors.scrub`: a server's error body may
    echo an ``Authorization`` header or a token), control characters escaped, cut to ``limit``
    characters plus ``…``. Scrubbed before the cut (:data:`PREVIEW_SCRUB_MARGIN`)."""
    from ..config.errors import scrub

    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes | bytearray) else str(data)
    window = scrub(text[: limit + PREVIEW_SCRUB_MARGIN])
    cut = window[:limit]
    safe = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in cut)
    return safe + ("…" if len(window) > limit or len(text) > limit + PREVIEW_SCRUB_MARGIN else "")


@dataclass(frozen=True)
class Answer:
    """A complete HTTP answer: ``status``, ``content_type`` and the (decoded) ``body``."""

    url: str
    status: int
    content_type: str
    body: bytes

    def text(self) -> str:
        """The body as text (UTF-8, invalid bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as strict JSON (:func:`loads_json`). Raises :class:`SGLangError`."""
        return loads_json(self.body, self.url)


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"number {preview(s, 30)} is out of range (not finite)")
    return v


def _bounded_int(s: str) -> int:
    v = int(s)  # CPython refuses > 4300 digits itself (ValueError)
    try:
        float(v)
    except OverflowError:
        raise ValueError(f"integer of {len(s)} digits is out of range") from None
    return v


def loads_json(body: bytes | str, where: str) -> Any:
    """Strict JSON: no ``NaN``/``Infinity``, no number beyond a float, nesting at most
    :data:`MAX_JSON_DEPTH` (checked without recursion).

    Raises:
        SGLangError: naming ``where`` and what was wrong (never ValueError/RecursionError).
    """
    try:
        doc = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError:
        raise _error(where, f"answered JSON nested too deeply (limit {MAX_JSON_DEPTH})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _error(where, f"answered malformed JSON ({preview(str(exc), 120)}): "
                            f"{preview(body if isinstance(body, bytes) else body.encode(), 80)}") from None
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _error(where, f"answered JSON nested deeper than {MAX_JSON_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return doc


class _Decoder:
    """Content-Encoding decoding with bounded output. We ask for ``identity``; a server
    that compresses anyway may use gzip/deflate (zlib header), nothing else."""

    def __init__(self, encoding: str, where: str) -> None:
        enc = encoding.strip().lower()
        self.where = where
        if enc in ("", "identity"):
            self._z = None
        elif enc in ("gzip", "x-gzip", "deflate"):
            self._z = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib header, auto-detected
        else:
            raise _error(where, f"answered Content-Encoding {preview(enc, 40)!r}, which is not supported "
                                "(asked for identity; gzip/deflate are decoded)")

    def feed(self, data: bytes, room: int) -> bytes:
        """Decoded bytes of ``data``, at most ``room + 1`` of them (one more than fits: the caller's cap
        check trips)."""
        if self._z is None:
            return data
        try:
            out = self._z.decompress(data, room + 1)
        except zlib.error as exc:
            raise _error(self.where, f"answered a body that is not valid compressed data ({exc})") from None
        return out

    def finish(self, room: int) -> bytes:
        if self._z is None:
            return b""
        try:
            out = self._z.decompress(self._z.unconsumed_tail, room + 1) if self._z.unconsumed_tail else b""
        except zlib.error as exc:
            raise _error(self.where, f"answered a body that is not valid compressed data ({exc})") from None
        if len(out) <= room and not self._z.eof:
            raise _error(self.where, "answered a truncated compressed body")
        return out


def _ssl_context(url: str) -> ssl.SSLContext | bool:
    """``True`` (httpx loads the CA bundle, ~50 ms of CPU) only for https; for http an
    empty client context that is never used (and would fail closed: it trusts no CA)."""
    return True if httpx.URL(url).scheme == "https" else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def async_client(base_url: str, max_connections: int = 4) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for :func:`fetch` (redirects not followed, identity encoding).

    Timeouts are left to :func:`fetch`'s total deadline.
    """
    return httpx.AsyncClient(base_url=base_url, timeout=None, verify=_ssl_context(base_url),
                             follow_redirects=False, headers={"Accept-Encoding": "identity"},
                             limits=httpx.Limits(max_connections=max_connections))


async def fetch(client: httpx.AsyncClient, method: str, path: str, deadline_s: float, cap: int | None = None,
                json_body: Any = None) -> Answer:
    """One request, bounded by a total deadline and a body cap.

    Args:
        client: from :func:`async_client`.
        method, path: e.g. ``GET``, ``/metrics``.
        deadline_s: seconds for everything (connect, send, headers, whole body).
        cap: body cap in bytes after decoding (default: :data:`CAPS` for ``path``, else :data:`DEFAULT_CAP`).
        json_body: request body, sent as JSON.

    Returns:
        The complete :class:`Answer` (any status: callers decide what a status means).

    Raises:
        SGLangError: connection refused or lost, deadline passed, not HTTP, bad
            Content-Encoding, body over the cap. ``reachable`` says whether the server
            accepted the connection.
    """
    cap = cap if cap is not None else CAPS.get(path, DEFAULT_CAP)
    deadline_s = max(0.0, deadline_s)
    u = client.base_url  # named without user info (netloc is host:port): no credentials in messages
    where = f"{u.scheme}://{u.netloc.decode('ascii')}{u.path.rstrip('/')}{path}"
    connected = False

    async def trace(event: str, info: dict) -> None:
        nonlocal connected
        if event in ("connection.connect_tcp.complete", "http11.send_request_headers.started"):
            connected = True  # the second one also fires on a pooled (kept-alive) connection

    body = bytearray()
    try:
        async with asyncio.timeout(deadline_s):
            async with client.stream(method, path, json=json_body, extensions={"trace": trace}) as r:
                connected = True
                decoder = _Decoder(r.headers.get("content-encoding", ""), where)
                chunks = r.aiter_raw()
                try:
                    async for raw in chunks:
                        body += decoder.feed(raw, cap - len(body))
                        if len(body) > cap:
                            raise _error(where, f"answer exceeds the {cap} byte cap (HTTP {r.status_code}); "
                                                "stopped reading")
                finally:
                    await chunks.aclose()  # type: ignore[attr-defined]
                body += decoder.finish(cap - len(body))
                if len(body) > cap:
                    raise _error(where, f"answer exceeds the {cap} byte cap (HTTP {r.status_code}); stopped reading")
                return Answer(where, r.status_code, r.headers.get("content-type", ""), bytes(body))
    except TimeoutError:
        if connected:
            raise _error(where, f"no complete answer within {deadline_s:g} s (total deadline; the server "
                                "accepted the connection)") from None
        raise _error(where, f"could not connect within {deadline_s:g} s", reachable=False) from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise _error(where, f"{type(exc).__name__} (loading weights or down): {preview(str(exc), 120)}",
                     reachable=False) from None
    except httpx.HTTPError as exc:  # not HTTP, closed mid-answer, oversized headers, ...
        raise _error(where, f"{type(exc).__name__}: {preview(str(exc) or 'connection lost', 120)}",
                     reachable=False) from None
    finally:
        body.clear()  # an error's traceback keeps this frame (and a cap's worth of bytes) until the next GC


class SGLangClient:
    """Synchronous client for one SGLang server: one event loop and one
    ``httpx.AsyncClient`` (one connection pool) for its lifetime; every request through
    :func:`fetch` (total deadline, size cap). Not for concurrent use from several threads.

    Args:
        base_url: e.g. ``http://127.0.0.1:30000``.
        timeout: default total deadline per request, seconds.

    Attributes:
        name: the base URL for messages, without user info (credentials never reach output).
    """

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        u = httpx.URL(self.base_url)
        self.name = f"{u.scheme}://{u.netloc.decode('ascii')}{u.path.rstrip('/')}"
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._http = async_client(self.base_url)

    def close(self) -> None:
        """Close the connections and the event loop (not while a request runs in another thread)."""
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._http.aclose())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, timeout: float | None = None, cap: int | None = None) -> Answer:
        """``GET path`` through :func:`fetch`. Raises :class:`SGLangError`."""
        return self._loop.run_until_complete(
            fetch(self._http, "GET", path, self.timeout if timeout is None else timeout, cap))

    def health(self, timeout: float | None = None) -> int:
        """HTTP status of ``GET /health``. Raises :class:`SGLangError` (see ``reachable``)."""
        return self.get("/health", timeout).status

    def server_info(self, timeout: float | None = None) -> dict[str, Any]:
        """``/server_info`` (falls back to ``/get_server_info`` on older builds: up to
        :data:`SERVER_INFO_REQUESTS` requests).

        Raises:
            SGLangError: neither endpoint answered 200 with a JSON object.
        """
        for path in SERVER_INFO_PATHS:
            r = self.get(path, timeout)
            if r.status == 200:
                info = r.json()
                if not isinstance(info, dict):
                    raise SGLangError(f"{self.name}{path}: answered JSON {type(info).__name__}, not an object "
                                      "(not an SGLang server?)")
                return info
            if r.status != 404:
                raise SGLangError(f"{self.name}{path}: HTTP {r.status}: {preview(r.body, 80)}")
        raise SGLangError(f"{self.name}: no /server_info or /get_server_info")

    def metrics(self, timeout: float | None = None) -> str:
        """Prometheus text of ``/metrics`` (needs ``--enable-metrics``). Raises :class:`SGLangError`
        (also for a body that is not Prometheus text: :func:`metrics_text`)."""
        r = self.get("/metrics", timeout)
        if r.status != 200:
            raise SGLangError(f"{self.name}/metrics: HTTP {r.status}")
        return metrics_text(r)


METRICS_CONTENT_TYPES = ("text/plain", "application/openmetrics-text")
"""Content types of a Prometheus exposition (prometheus_client, which SGLang uses, serves
``text/plain; version=0.0.4`` or OpenMetrics); an HTML page holding a metric-like line is not one."""


def metrics_text(r: Answer) -> str:
    """The text of a ``/metrics`` answer. Raises :class:`SGLangError` when its content type is
    not a Prometheus exposition (:data:`METRICS_CONTENT_TYPES`; an absent type is accepted)."""
    ctype = r.content_type.split(";", 1)[0].strip().lower()
    if ctype and ctype not in METRICS_CONTENT_TYPES:
        raise SGLangError(f"{r.url}: answered Content-Type {preview(ctype, 60)!r}, not Prometheus text "
                          "(not SGLang's /metrics?)")
    return r.text()


SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
SERVER_INFO_REQUESTS = len(SERVER_INFO_PATHS)
"""Requests :meth:`SGLangClient.server_info` can make (count them in every time bound)."""


# ---------------------------------------------------------------- Prometheus text
MAX_LINE = 4096
"""Longest sample line read, characters. SGLang's label sets (model_name, engine_type,
tp_rank, ...) keep a sample line to a few hundred characters; a selected line longer than
this is not SGLang's (and would cost unbounded regex work)."""
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:Inf|inf|NaN|nan)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SAMPLE_LINE = re.compile(r'([^{ \t]+)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)')
"""One sample line: name, optional label set, value (the alternatives inside the braces
start with disjoint characters, so matching is linear in the line's length)."""


def select_samples(text: str, names: Iterable[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of the named series in Prometheus text, without a full parse: lines
    are split in C, only lines starting with a wanted name are matched (a full parse of 8
    TP ranks of SGLang's families costs ~100 ms of CPU), and each such line is at most
    :data:`MAX_LINE` characters, so the work is linear in the text and a pathological
    upstream cannot hold the interpreter (and the exporter's scrapes) for long.

    Returns:
        ``{name: [(labels, value), ...]}`` for every name (an empty list when not exposed).

    Raises:
        SGLangError: a selected line is longer than :data:`MAX_LINE` or is not a sample,
            its value is not a number, or not finite (``+Inf``/``NaN``/``1e999``: counters
            and gauges of SGLang are finite), or more than :data:`MAX_SAMPLES` samples.
    """
    wanted = tuple(dict.fromkeys(names))
    found: dict[str, list[tuple[dict[str, str], float]]] = {n: [] for n in wanted}
    count = 0
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        if len(line) > MAX_LINE:
            raise SGLangError(f"/metrics: a line of {len(line)} characters starts with a selected family "
                              f"(limit {MAX_LINE}; not SGLang's metrics?): {preview(line, 80)}")
        m = _SAMPLE_LINE.match(line)
        if m is None or m.group(1) not in found:
            if m is None and line[len(next(n for n in wanted if line.startswith(n))):][:1] in ("{", " ", "\t"):
                raise SGLangError(f"/metrics: malformed sample line {preview(line, 80)!r} (not Prometheus text?)")
            continue  # a longer family name that merely starts with a selected one
        count += 1
        if count > MAX_SAMPLES:
            raise SGLangError(f"/metrics: more than {MAX_SAMPLES} samples of {len(wanted)} families "
                              "(not SGLang's metrics?)")
        raw = m.group(3)
        if not _NUMBER.fullmatch(raw):
            raise SGLangError(f"/metrics: {m.group(1)} has value {preview(raw, 40)!r}, not a number "
                              "(not Prometheus text from SGLang?)")
        value = float(raw)
        if not math.isfinite(value):
            raise SGLangError(f"/metrics: {m.group(1)} has value {preview(raw, 40)!r}, not finite "
                              "(SGLang's counters and gauges are finite: a broken server)")
        found[m.group(1)].append((dict(_LABEL.findall(m.group(2) or "")), value))
    return found


def sum_lowest_rank(samples: list[tuple[dict[str, str], float]]) -> float | None:
    """Sum of the series of the lowest ``tp_rank`` (all series when there is no tp_rank);
    None when there are no samples.

    SGLang exports scheduler metrics per TP rank with ``--enable-metrics-for-all-schedulers``;
    each rank counts the same passes, so summing ranks would multiply them.
    """
    if not samples:
        return None
    ranks = {lab.get("tp_rank", "") for lab, _ in samples}
    lowest = min(ranks, key=lambda r: (int(r) if r.isdigit() else -1, r))
    return sum(v for lab, v in samples if lab.get("tp_rank", "") == lowest)


def accept_length(server_info: dict[str, Any]) -> float | None:
    """Mean ``avg_spec_accept_length`` over DP ranks of ``/server_info``, or None before
    the first verify pass (tokens accepted per verify pass, bonus token included)."""
    states = server_info.get("internal_states")
    values = [  # a value that is not a finite number >= 0 (a broken or foreign server) counts as not reported
        float(s["avg_spec_accept_length"])
        for s in (states if isinstance(states, list) else [])
        if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), int | float)
        and not isinstance(s["avg_spec_accept_length"], bool)
        and math.isfinite(float(s["avg_spec_accept_length"])) and float(s["avg_spec_accept_length"]) >= 0
    ]
    return sum(v / len(values) for v in values) if values else None  # each term finite: no overflow
