"""``ddtree-ops bench``: a closed-loop async load generator for one SGLang server.

What it measures, per concurrency level (``concurrency`` requests in flight, each worker
sending its next request when the last one ends), over SGLang's streaming endpoints:

* **TTFT**: request sent -> first chunk carrying a token (seconds).
* **ITL**: inter-token latency, as SGLang's own ``bench_serving`` counts it
  (``sglang/benchmark/serving.py``, ``async_request_sglang_generate``): the gap between two
  chunks divided by the tokens the later chunk brought, once per token (a speculative
  verify pass brings several tokens in one chunk).
* **E2E** latency, **output tok/s per request** (``completion_tokens / e2e``), **decode
  tok/s per request** (``(completion_tokens - 1) / (e2e - ttft)``) and **aggregate output
  tok/s** (all completion tokens of the level / the level's wall time).
* **Acceptance length**: per request from ``meta_info`` (``spec_accept_length`` =
  ``completion_tokens / spec_verify_ct``, SGLang 0.5.23 ``tokenizer_manager.py``), pooled
  per level as ``sum(completion_tokens) / sum(spec_verify_ct)``; and from the server's
  counters over the level (``/metrics``: delta ``sglang:generation_tokens_total`` / delta
  ``sglang:spec_verify_calls_total``, read as the exporter reads them,
  :func:`ddtree_ops.runtime.exporter.parse_upstream`), when the server runs with
  ``--enable-metrics``.

Endpoints (``api``): ``generate`` = SGLang's native ``POST /generate`` with ``stream``
(each SSE event is ``data: {json}`` whose ``meta_info.completion_tokens`` is the running
count; ``data: [DONE]`` ends it; SGLang 0.5.23 ``http_server.py``); ``chat`` /
``completions`` = the OpenAI-compatible ``/v1/chat/completions`` / ``/v1/completions``
with ``stream_options: {include_usage, continuous_usage_stats}`` (every chunk carries
the running ``usage.completion_tokens``; a server that ignores ``continuous_usage_stats``
gets one token counted per content chunk, as ``bench_serving`` does for these endpoints).

Bounds (the rules of :mod:`ddtree_ops.sglang.client`): every request runs under one total
deadline (``request_timeout_s``); a stream event longer than :func:`event_cap` bytes or a
stream of more events than :func:`max_events` stops the request; answers are parsed as
strict JSON (no NaN/Infinity, nesting bounded by the interpreter's recursion limit, no
integer of more than 4300 digits) and every field used is checked (counts are integers
0..2**53). A misbehaving server fails the request (recorded with one line saying why),
never the run: the caller turns failed requests into exit 1.

Over 600 lines: the load generator, its per-request measurements and the result files of one
run; the report across runs is :mod:`.bench_report`. Not yet split further.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import os
import platform
import socket
import stat
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ddtree_ops.sglang.client import (
    LOCAL_WORK_S,
    MIB,
    SERVER_INFO_PATHS,
    SERVER_INFO_REQUESTS,
    SGLangError,
    async_client,
    fetch,
    generate_cap,
    loads_json,
    preview,
)

APIS = {"generate": "/generate", "chat": "/v1/chat/completions", "completions": "/v1/completions"}
"""Benchmarked endpoint per ``api`` name."""

MAX_COUNT = 1 << 53
"""Largest token count accepted from a server (beyond it a float loses integers)."""

BENCH_FORMAT = 1
"""Format version of the ``bench.json`` :func:`write_results` writes and :func:`load_result` reads (a file of
another version is refused, not misread)."""

MAX_ACCEPT_LENGTH = 1025
"""Largest acceptance length (tokens per verify step) a ``bench.json`` level may hold: at most every draft
token plus the bonus token, and ``num_draft_tokens`` is at most 1024 (``ddtree_ops/config/models.py``
``Speculative``; ``tests/test_output_writers.py`` holds the two together)."""

MAX_PROMPTS = 100_000
"""Most prompts read from a prompt file (a run sends at most this many distinct prompts)."""

MAX_PROMPT_CHARS = 1 << 20
"""Longest prompt accepted from a prompt file (1 MiB of text: ~250k tokens)."""

MAX_PROMPT_FILE = 1 << 30
"""Largest prompt file read (ShareGPT_V3_unfiltered_cleaned_split.json is ~670 MB)."""

ITL_SAMPLES_KEPT = 50_000
"""Per-token ITL samples kept per level in the JSON result (evenly strided beyond this):
enough for the distribution plot; the quantiles are computed over all of them."""

ERRORS_KEPT = 5
"""Distinct error lines kept per level."""

PROMPTS: tuple[str, ...] = (
    "Explain, in three short paragraphs, how speculative decoding speeds up language model inference.",
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring and tests.",
    "Summarize the causes and consequences of the 1929 stock market crash for a high-school student.",
    "Translate into French: 'The train leaves at seven, so we should have breakfast before six thirty.'",
    "A farmer has 17 sheep; all but 9 run away. How many are left? Explain your reasoning step by step.",
    "List ten creative names for a coffee shop that is also a bicycle repair workshop, one per line.",
    "What are the trade-offs between B-trees and LSM-trees for a write-heavy key-value store?",
    "Write a haiku about GPUs waiting for memory, then explain its imagery.",
    "Give a SQL query that returns the top three customers by total order value in the last 30 days, "
    "given tables customers(id, name) and orders(id, customer_id, total, created_at).",
    "Describe the water cycle as if you were a raindrop telling your life story.",
    "Compare TCP and QUIC: handshake, head-of-line blocking, congestion control and deployment.",
    "Draft a polite email asking a colleague to review a pull request by Friday.",
    "Prove that the square root of two is irrational.",
    "Write a bash one-liner that finds the ten largest files under the current directory.",
    "You are a travel guide. Plan a two-day walking itinerary for Lisbon with food suggestions.",
    "Explain the difference between a process and a thread to someone who knows only spreadsheets.",
)
"""The shipped prompt set: short, varied tasks (code, math, reasoning, translation, prose)."""


class BenchInputError(ValueError):
    """Bad benchmark input (prompt file, options): one line naming the field, value, rule and fix."""


@dataclass(frozen=True)
class Prompt:
    """One prompt. ``output_len``: tokens to generate for it (None: the run's ``max_new_tokens``)."""

    text: str
    output_len: int | None = None


@dataclass(frozen=True)
class BenchOptions:
    """What one benchmark run does.

    Attributes:
        url: server base URL (``http(s)://HOST:PORT``, no user info).
        api: ``generate`` | ``chat`` | ``completions`` (:data:`APIS`).
        concurrency: levels, each >= 1, run in this order.
        requests: requests per level (None: run for ``duration_s``).
        duration_s: seconds per level during which new requests start (None: ``requests``).
        max_new_tokens: tokens per request (a prompt's own ``output_len`` wins).
        temperature, top_p: sampling parameters sent with every request.
        ignore_eos: generate exactly ``max_new_tokens`` (fixed output length).
        request_timeout_s: total deadline of one request (connect to last byte), seconds.
        warmup_requests: requests sent (not measured) before the first level, at the first level's concurrency.
        model: ``model`` field of OpenAI requests (None: the server's).
        api_key: sent as ``Authorization: Bearer`` (SGLang ``--api-key``); never written to results.
    """

    url: str
    api: str = "generate"
    concurrency: tuple[int, ...] = (1,)
    requests: int | None = 32
    duration_s: float | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = True
    request_timeout_s: float = 600.0
    warmup_requests: int = 2
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raises :class:`BenchInputError` naming the first option out of its bounds."""
        rules: list[tuple[str, Any, bool, str]] = [
            ("api", self.api, self.api in APIS, f"one of {', '.join(APIS)}"),
            (
                "concurrency",
                list(self.concurrency),
                bool(self.concurrency) and all(type(c) is int and 1 <= c <= 4096 for c in self.concurrency),
                "integers 1..4096, e.g. 1,8,32",
            ),
            (
                "requests",
                self.requests,
                self.requests is None or type(self.requests) is int and 1 <= self.requests <= 1_000_000,
                "1..1000000",
            ),
            (
                "duration",
                self.duration_s,
                self.duration_s is None or _finite(self.duration_s) and 0 < self.duration_s <= 86400,
                "seconds, > 0 and <= 86400",
            ),
            (
                "max-new-tokens",
                self.max_new_tokens,
                type(self.max_new_tokens) is int and 1 <= self.max_new_tokens <= 1 << 20,
                f"1..{1 << 20}",
            ),
            ("temperature", self.temperature, _finite(self.temperature) and 0 <= self.temperature <= 100, "0..100"),
            ("top-p", self.top_p, _finite(self.top_p) and 0 < self.top_p <= 1, "> 0 and <= 1"),
            (
                "request-timeout",
                self.request_timeout_s,
                _finite(self.request_timeout_s) and 0 < self.request_timeout_s <= 86400,
                "seconds, > 0 and <= 86400",
            ),
            (
                "warmup",
                self.warmup_requests,
                type(self.warmup_requests) is int and 0 <= self.warmup_requests <= 10_000,
                "0..10000",
            ),
        ]
        for name, value, ok, rule in rules:
            if not ok:
                raise BenchInputError(f"--{name} {preview(repr(value))}: must be {rule}")
        if (self.requests is None) == (self.duration_s is None):
            raise BenchInputError(
                "--requests / --duration: give exactly one (requests per level, or seconds per level)"
            )

    def as_dict(self) -> dict[str, Any]:
        """The options for the results (``api_key`` replaced by whether one was sent)."""
        d = asdict(self)
        d["api_key"] = "(set)" if self.api_key else None
        d["concurrency"] = list(self.concurrency)
        return d


def _finite(x: Any) -> bool:
    """A finite number a float can hold (an int of JSON text may be 2**2000: no float, OverflowError)."""
    if not isinstance(x, int | float) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


# ------------------------------------------------------------------ prompts
def _prompt_of(obj: Any, where: str) -> Prompt:
    """One prompt from a JSON object: ``{"prompt"|"text": str, "output_len"?: int}`` or
    ShareGPT (``{"conversations": [{"from": "human", "value": str}, ...]}``: the first human
    turn; the answer's length is not known in tokens without the model's tokenizer)."""
    if not isinstance(obj, dict):
        raise BenchInputError(f"{where}: a {type(obj).__name__}; each entry must be an object with \"prompt\" "
                              "(or \"text\", or ShareGPT \"conversations\")")
    text: Any = None
    if "conversations" in obj:
        conv = obj["conversations"]
        if not isinstance(conv, list):
            raise BenchInputError(f"{where}: conversations is a {type(conv).__name__}; must be a list of "
                                  "{\"from\", \"value\"} turns (ShareGPT)")
        text = next((t.get("value") for t in conv if isinstance(t, dict) and t.get("from") in ("human", "user")), None)
        if text is None:
            raise BenchInputError(f'{where}: conversations has no turn from "human"; skip such entries or fix the file')
    else:
        text = obj.get("prompt", obj.get("text"))
    if not isinstance(text, str) or not text.strip():
        raise BenchInputError(f"{where}: prompt = {preview(repr(text), 80)}; must be a non-empty string")
    if len(text) > MAX_PROMPT_CHARS:
        raise BenchInputError(f"{where}: prompt of {len(text)} characters; must be at most {MAX_PROMPT_CHARS}")
    out = obj.get("output_len")
    if out is not None and not (type(out) is int and 1 <= out <= 1 << 20):
        raise BenchInputError(f"{where}: output_len = {preview(repr(out), 40)}; must be an integer 1..{1 << 20} "
                              "(or absent: the run's --max-new-tokens)")
    return Prompt(text, out)


def load_prompts(path: Path | None) -> list[Prompt]:
    """The prompts of a run: the shipped :data:`PROMPTS`, or a file.

    The file is JSONL (one object a line, blank lines skipped) or one JSON array of objects
    (ShareGPT dumps are arrays); each object as :func:`_prompt_of`.

    Raises:
        BenchInputError: not a regular file, over :data:`MAX_PROMPT_FILE` bytes, not UTF-8,
            malformed JSON (with the line), an entry without a prompt, none at all, or more
            than :data:`MAX_PROMPTS` entries.
        OSError: the file cannot be read.
    """
    if path is None:
        return [Prompt(t) for t in PROMPTS]
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise BenchInputError(f"--prompts {preview(str(path))}: not a regular file; give a JSONL or JSON file")
    if st.st_size > MAX_PROMPT_FILE:
        raise BenchInputError(f"--prompts {preview(str(path))}: {st.st_size} bytes; at most {MAX_PROMPT_FILE} "
                              "(cut the file)")
    with open(path, "rb") as f:
        raw = f.read(MAX_PROMPT_FILE + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BenchInputError(
            f"--prompts {preview(str(path))}: not UTF-8 (byte {exc.start}); save it as UTF-8"
        ) from None
    prompts: list[Prompt] = []
    if text.lstrip().startswith("["):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise BenchInputError(
                f"--prompts {preview(str(path))}: malformed JSON ({preview(str(exc), 120)})"
            ) from None
        if len(doc) > MAX_PROMPTS:
            doc = doc[:MAX_PROMPTS]
        prompts = [_prompt_of(o, f"--prompts {preview(str(path))} entry {i}") for i, o in enumerate(doc)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"--prompts {preview(str(path))} line {n}"
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise BenchInputError(
                    f"{where}: malformed JSON ({preview(str(exc), 120)}); one JSON object a line"
                ) from None
            prompts.append(_prompt_of(obj, where))
            if len(prompts) >= MAX_PROMPTS:
                break
    if not prompts:
        raise BenchInputError(f"--prompts {preview(str(path))}: no prompts; give one JSON object a line")
    return prompts


# ------------------------------------------------------------------ one request
@dataclass
class RequestResult:
    """One measured request (times in seconds; ``start_s`` from the level's start)."""

    level: int
    index: int
    ok: bool = False
    error: str = ""
    start_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunks: int = 0
    spec_verify_ct: int | None = None
    accept_length: float | None = None
    itl_s: list[float] = field(default_factory=list)

    @property
    def output_tok_s(self) -> float | None:
        """Completion tokens per second of the whole request (``completion_tokens / e2e``)."""
        return self.completion_tokens / self.e2e_s if self.ok and self.e2e_s else None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second after the first (``(completion_tokens - 1) / (e2e - ttft)``)."""
        if not self.ok or self.e2e_s is None or self.ttft_s is None or self.completion_tokens < 2:
            return None
        span = self.e2e_s - self.ttft_s
        return (self.completion_tokens - 1) / span if span > 0 else None


def event_cap(max_new_tokens: int) -> int:
    """Largest SSE event (bytes) accepted for a request of ``max_new_tokens``: SGLang's
    non-incremental stream repeats the whole text and ``output_ids`` so far in every event,
    so one event is bounded like a whole ``/generate`` answer
    (:func:`ddtree_ops.sglang.client.generate_cap`)."""
    return generate_cap(max_new_tokens)


def max_events(max_new_tokens: int) -> int:
    """Most SSE events accepted for one request: one per token at worst, plus the role,
    finish, usage and ``[DONE]`` events and slack for keep-alive comments."""
    return max_new_tokens + 64


class _StreamError(Exception):
    pass


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise _StreamError(f"{what} = {preview(repr(value), 40)}: a token count must be an integer 0..{MAX_COUNT}")
    return value


def request_body(opts: BenchOptions, prompt: Prompt) -> dict[str, Any]:
    """The JSON body of one streaming request for ``opts.api`` (shapes of SGLang 0.5.23's
    ``GenerateReqInput`` and the OpenAI protocol)."""
    n = prompt.output_len or opts.max_new_tokens
    if opts.api == "generate":
        sp: dict[str, Any] = {"max_new_tokens": n, "temperature": opts.temperature, "ignore_eos": opts.ignore_eos}
        if opts.top_p < 1:
            sp["top_p"] = opts.top_p
        return {"text": prompt.text, "sampling_params": sp, "stream": True}
    body: dict[str, Any] = {"max_tokens": n, "temperature": opts.temperature, "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                            "ignore_eos": opts.ignore_eos}
    if opts.top_p < 1:
        body["top_p"] = opts.top_p
    if opts.model:
        body["model"] = opts.model
    if opts.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


class _Tokens:
    """Running token count of one stream -> TTFT and per-token ITL (bench_serving's rule)."""

    def __init__(self, res: RequestResult, t0: float) -> None:
        self.res, self.t0 = res, t0
        self.last_t: float | None = None
        self.count = 0
        self.server_count: int | None = None  # the last count the server reported (meta_info / usage)

    def at(self, now: float, total: int | None) -> None:
        """A chunk arrived at ``now`` and the running count is ``total`` (None: +1, a content chunk
        of a server that does not report running usage)."""
        new = 1 if total is None else total - self.count
        if new < 0:
            raise _StreamError(f"completion_tokens went down ({self.count} -> {total})")
        if new == 0:
            return
        if self.last_t is None:
            self.res.ttft_s = now - self.t0
        else:
            gap = (now - self.last_t) / new
            self.res.itl_s.extend([gap] * new)
        self.last_t = now
        self.count += new
        self.res.chunks += 1


def _handle_event(data: bytes, api: str, tok: _Tokens, res: RequestResult, now: float) -> bool:
    """One SSE ``data:`` payload; True at ``[DONE]``."""
    if data == b"[DONE]":
        return True
    try:
        obj = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise _StreamError(f"malformed JSON in the stream ({preview(str(exc), 80)}): {preview(data, 80)}") from None
    if not isinstance(obj, dict):
        raise _StreamError(f"a stream event is a JSON {type(obj).__name__}, not an object")
    if "error" in obj:
        e = obj["error"]
        msg = e.get("message") if isinstance(e, dict) else e
        raise _StreamError(f"the server reported an error: {preview(str(msg), 160)}")
    if api == "generate":
        _generate_event(obj, tok, res, now)
    else:
        _openai_event(obj, api, tok, res, now)
    return False


def _generate_event(obj: dict[str, Any], tok: _Tokens, res: RequestResult, now: float) -> None:
    """One event of SGLang's ``/generate`` stream: counts and accept length from ``meta_info``."""
    meta = obj.get("meta_info")
    if not isinstance(meta, dict):
        raise _StreamError("a /generate stream event without a meta_info object (not SGLang's /generate)")
    tok.server_count = _count(meta.get("completion_tokens"), "meta_info.completion_tokens")
    tok.at(now, tok.server_count)
    res.completion_tokens = tok.count
    if "prompt_tokens" in meta:
        res.prompt_tokens = _count(meta["prompt_tokens"], "meta_info.prompt_tokens")
    if "spec_verify_ct" in meta:
        res.spec_verify_ct = _count(meta["spec_verify_ct"], "meta_info.spec_verify_ct")
    al = meta.get("spec_accept_length")
    if al is not None:
        if not _finite(al) or not 0 <= al <= MAX_COUNT:
            raise _StreamError(
                f"meta_info.spec_accept_length = {preview(repr(al), 40)}: must be a number 0..{MAX_COUNT}"
            )
        res.accept_length = float(al)


def _openai_event(obj: dict[str, Any], api: str, tok: _Tokens, res: RequestResult, now: float) -> None:
    """One event of an OpenAI-style stream (``chat`` or completions): choices and usage."""
    usage = obj.get("usage")
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise _StreamError("an OpenAI stream event without a choices list")
    running = None
    if isinstance(usage, dict):
        running = tok.server_count = _count(usage.get("completion_tokens"), "usage.completion_tokens")
        if "prompt_tokens" in usage:
            res.prompt_tokens = _count(usage["prompt_tokens"], "usage.prompt_tokens")
    has_text = any(isinstance(c, dict) and bool(_piece(c.get("delta"), "content") if api == "chat" else c.get("text"))
                   for c in choices)
    if running is not None and choices:
        tok.at(now, running)  # continuous_usage_stats: the running count on every chunk
    elif has_text:
        tok.at(now, None)  # no running count: one token a content chunk
    # a usage-only chunk (choices []: include_usage's last one) gives the total, not a token time
    res.completion_tokens = max(tok.count, running or 0)


def _piece(obj: Any, key: str) -> Any:
    """``obj[key]`` when ``obj`` is a mapping, else None (a delta of another shape carries no text)."""
    return obj.get(key) if isinstance(obj, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


async def _one(client: httpx.AsyncClient, opts: BenchOptions, prompt: Prompt, res: RequestResult,
               headers: dict[str, str], end: float | None = None) -> None:
    """Send one streaming request and fill ``res`` (``ok`` or ``error``); never raises (but CancelledError).
    ``end`` (event-loop time): the run's bound, which cuts the request's own deadline short."""
    n = prompt.output_len or opts.max_new_tokens
    path = APIS[opts.api]
    t0 = time.perf_counter()
    tok = _Tokens(res, t0)
    done = False
    try:
        limit = opts.request_timeout_s
        if end is not None:
            limit = min(limit, max(0.0, end - asyncio.get_running_loop().time()))
        async with asyncio.timeout(limit):
            async with client.stream("POST", path, json=request_body(opts, prompt), headers=headers) as r:
                if r.status_code != 200:
                    body = b""
                    async for raw in r.aiter_raw():
                        body += raw
                        if len(body) > 4096:
                            break
                    raise _StreamError(f"HTTP {r.status_code}: {preview(body, 160)}")
                done = await _read_events(r, opts.api, tok, res, n)
        if not done:
            raise _StreamError("the stream ended without data: [DONE]")
        res.e2e_s = time.perf_counter() - t0
        if tok.count == 0:
            raise _StreamError("no token in the stream")
        if opts.ignore_eos and tok.server_count is not None and res.completion_tokens != n:
            raise _StreamError(f"the server reported {res.completion_tokens} tokens for a fixed output of {n} "
                               "(ignore_eos): its figures would not compare with other runs")
        res.ok = True
    except TimeoutError:
        res.error = f"no complete answer within {opts.request_timeout_s:g} s (total deadline)"
    except _StreamError as exc:
        res.error = str(exc)
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {preview(str(exc) or 'connection lost', 120)}"
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        # a shape no check above foresaw: the request fails, the run goes on (never a traceback)
        res.error = f"unexpected answer ({type(exc).__name__}: {preview(str(exc), 120)})"
    if not res.ok:
        res.itl_s.clear()


async def _read_events(r: httpx.Response, api: str, tok: _Tokens, res: RequestResult, n: int) -> bool:
    """Read the SSE stream of a request for ``n`` tokens, handing each ``data:`` payload to
    :func:`_handle_event`; True once ``[DONE]`` came. At most :func:`max_events` events and
    :func:`event_cap` bytes per event (:class:`_StreamError` beyond)."""
    cap, limit = event_cap(n), max_events(n)
    done = False
    buf = bytearray()
    events = 0
    async for raw in r.aiter_raw():
        buf += raw
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            line = bytes(buf[:i]).rstrip(b"\r")
            del buf[:i + 1]
            if not line.startswith(b"data:"):
                continue  # blank separators, comments (": ping"), event: lines
            events += 1
            if events > limit:
                raise _StreamError(f"more than {limit} stream events for {n} tokens; stopped reading")
            if _handle_event(line[5:].strip(), api, tok, res, time.perf_counter()):
                done = True
                break  # nothing after [DONE] counts
        if len(buf) > cap:
            raise _StreamError(f"a stream event exceeds the {cap} byte cap; stopped reading")
        if done:
            break
    return done


# ------------------------------------------------------------------ server side
SIDE_DEADLINE_S = 10.0
"""Most seconds each side request (``/server_info``, ``/metrics`` before and after a level) may take;
never more than the run's ``request_timeout_s``."""


async def _server_counters(client: httpx.AsyncClient,
                           deadline_s: float = SIDE_DEADLINE_S) -> tuple[float, float] | None:
    """``(generation tokens, verify calls)`` from ``/metrics`` within ``deadline_s``; None when it is
    not served (no ``--enable-metrics``) or holds no speculative counters."""
    from ddtree_ops.runtime.exporter import parse_upstream

    try:
        a = await fetch(client, "GET", "/metrics", deadline_s)
        if a.status != 200:
            return None
        up = parse_upstream(a.text())
    except SGLangError:
        return None
    if up.gen_tokens is None or up.verify_calls is None:
        return None
    return up.gen_tokens, up.verify_calls


async def server_identity(client: httpx.AsyncClient, deadline_s: float = SIDE_DEADLINE_S) -> dict[str, Any]:
    """What the server says it is: ``version`` and a few server args from ``/server_info``
    (``/get_server_info`` on older builds), both tries within ``deadline_s`` in total. Values are
    server-controlled text, shortened."""
    end = time.monotonic() + deadline_s
    for path in SERVER_INFO_PATHS:  # counted in bound_s as SERVER_INFO_REQUESTS
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            a = await fetch(client, "GET", path, left)
            if a.status != 200:
                continue
            info = loads_json(a.body, path)
        except SGLangError:
            continue
        if isinstance(info, dict):
            keep = ("version", "model_path", "served_model_name", "speculative_algorithm", "tp_size", "dp_size",
                    "max_running_requests", "speculative_num_draft_tokens", "speculative_dflash_block_size",
                    "speculative_ddtree_budget", "cuda_graph_max_bs", "cuda_graph_max_bs_decode")
            return {k: (preview(str(info[k]), 200) if isinstance(info[k], str) else info[k])
                    for k in keep if k in info and isinstance(info[k], str | int | float | bool | type(None))}
    return {}


def bound_s(opts: BenchOptions) -> float:
    """Upper bound (seconds) of one :func:`run`, whatever the server does (a server that stalls
    every answer costs exactly this): each await of a run has a total deadline, so the bound
    counts them.

    * the server's identity: :data:`SERVER_INFO_REQUESTS` tries sharing one side deadline
      (``min(SIDE_DEADLINE_S, request_timeout_s)``), each answer parsed in
      :data:`~ddtree_ops.sglang.client.LOCAL_WORK_S`;
    * per level, one ``/metrics`` sample before and one after (a side deadline each);
    * the warmup and each level with ``requests``: ``c`` workers take the requests one after the
      other, and every worker finishes one within ``request_timeout_s`` (+ local work), so the
      level ends within ``ceil(requests / c)`` of them; with ``duration_s`` new requests start
      until it ends, and the last started one has ``request_timeout_s`` after it.
    """
    side = min(SIDE_DEADLINE_S, opts.request_timeout_s)
    one = opts.request_timeout_s + LOCAL_WORK_S
    total = side + SERVER_INFO_REQUESTS * LOCAL_WORK_S
    if opts.warmup_requests:
        total += math.ceil(opts.warmup_requests / opts.concurrency[0]) * one
    for c in opts.concurrency:
        total += 2 * (side + LOCAL_WORK_S)
        total += math.ceil(opts.requests / c) * one if opts.requests is not None else (opts.duration_s or 0) + one
    return total


# ------------------------------------------------------------------ a level
def quantiles(xs: list[float]) -> dict[str, float | None]:
    """``mean``, ``p50``, ``p90``, ``p99`` (nearest-rank on the sorted values; None when empty)."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

    return {"mean": statistics.fmean(s), "p50": q(0.50), "p90": q(0.90), "p99": q(0.99)}


@dataclass
class LevelResult:
    """One concurrency level's figures (seconds, tokens, tokens per second)."""

    concurrency: int
    requests: int
    ok: int
    failed: int
    wall_s: float
    output_tokens: int
    output_tok_s: float
    ttft_s: dict[str, float | None]
    itl_s: dict[str, float | None]
    e2e_s: dict[str, float | None]
    request_output_tok_s: dict[str, float | None]
    request_decode_tok_s: dict[str, float | None]
    accept_length: float | None
    accept_length_server: float | None
    errors: list[str]
    itl_samples_s: list[float] = field(default_factory=list, repr=False)


def summarize(level: int, results: list[RequestResult], wall_s: float,
              server: tuple[tuple[float, float] | None, tuple[float, float] | None]) -> LevelResult:
    """A :class:`LevelResult` from the level's requests and two ``/metrics`` snapshots."""
    ok = [r for r in results if r.ok]
    itl = [x for r in ok for x in r.itl_s]
    tokens = sum(r.completion_tokens for r in ok)
    spec = [r for r in ok if r.spec_verify_ct]
    accept = (sum(r.completion_tokens for r in spec) / sum(r.spec_verify_ct or 0 for r in spec)) if spec else None
    before, after = server
    acc_srv = None
    if before and after and after[1] > before[1] and after[0] >= before[0]:  # counters reset: no figure
        acc_srv = (after[0] - before[0]) / (after[1] - before[1])
    stride = max(1, math.ceil(len(itl) / ITL_SAMPLES_KEPT))
    errors: list[str] = []
    for r in results:
        if r.error and r.error not in errors and len(errors) < ERRORS_KEPT:
            errors.append(r.error)
    return LevelResult(
        concurrency=level, requests=len(results), ok=len(ok), failed=len(results) - len(ok), wall_s=wall_s,
        output_tokens=tokens, output_tok_s=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_s=quantiles([r.ttft_s for r in ok if r.ttft_s is not None]), itl_s=quantiles(itl),
        e2e_s=quantiles([r.e2e_s for r in ok if r.e2e_s is not None]),
        request_output_tok_s=quantiles([x for r in ok if (x := r.output_tok_s) is not None]),
        request_decode_tok_s=quantiles([x for r in ok if (x := r.decode_tok_s) is not None]),
        accept_length=accept, accept_length_server=acc_srv, errors=errors, itl_samples_s=itl[::stride],
    )


async def _level(client: httpx.AsyncClient, opts: BenchOptions, prompts: list[Prompt], level: int, start_index: int,
                 headers: dict[str, str], on_request: Callable[[RequestResult], None] | None,
                 requests: int | None, duration_s: float | None,
                 end: float | None = None) -> tuple[list[RequestResult], float]:
    results: list[RequestResult] = []
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    counter = iter(range(requests if requests is not None else 1 << 62))
    stop_at = None if duration_s is None else t0 + duration_s

    async def worker() -> None:
        for i in counter:
            if stop_at is not None and time.perf_counter() >= stop_at or end is not None and loop.time() >= end:
                return
            res = RequestResult(level=level, index=i, start_s=time.perf_counter() - t0)
            results.append(res)
            await _one(client, opts, prompts[(start_index + i) % len(prompts)], res, headers, end)
            if on_request:
                on_request(res)

    await asyncio.gather(*(worker() for _ in range(level)))
    return results, time.perf_counter() - t0


@dataclass
class BenchResult:
    """A whole run: what was run against what, and the figures per level."""

    options: dict[str, Any]
    server: dict[str, Any]
    client: dict[str, Any]
    plan: dict[str, Any] | None
    started_at: float
    elapsed_s: float
    levels: list[LevelResult]
    requests: list[RequestResult]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (per-request ITL lists dropped; each level keeps :data:`ITL_SAMPLES_KEPT`)."""
        reqs = []
        for r in self.requests:
            d = asdict(r)
            d.pop("itl_s")
            d["output_tok_s"], d["decode_tok_s"] = r.output_tok_s, r.decode_tok_s
            reqs.append(d)
        return {"kind": "ddtree-ops-bench", "format": BENCH_FORMAT, "options": self.options, "server": self.server,
                "client": self.client, "plan": self.plan, "started_at": self.started_at,
                "elapsed_s": self.elapsed_s, "levels": [asdict(lv) for lv in self.levels], "requests": reqs}

    @property
    def failed(self) -> int:
        return sum(lv.failed for lv in self.levels)


async def run_async(opts: BenchOptions, prompts: list[Prompt], plan: dict[str, Any] | None = None,
                    on_request: Callable[[RequestResult], None] | None = None,
                    on_level: Callable[[LevelResult], None] | None = None,
                    deadline_s: float | None = None) -> BenchResult:
    """Run every level of ``opts`` (see :func:`run`), within :func:`bound_s` or ``deadline_s``
    when that is shorter (a caller's own budget: the release gate's load)."""
    opts.check()
    headers: dict[str, str] = {}
    started = time.time()
    t0 = time.perf_counter()
    levels: list[LevelResult] = []
    all_requests: list[RequestResult] = []
    loop = asyncio.get_running_loop()
    # bound_s is structurally never reached; it is also enforced, so it holds on a slow client
    end = loop.time() + (bound_s(opts) if deadline_s is None else min(bound_s(opts), deadline_s))

    def side() -> float:
        return max(0.0, min(SIDE_DEADLINE_S, opts.request_timeout_s, end - loop.time()))

    async with async_client(opts.url, max_connections=max(opts.concurrency) + 4) as client:
        if opts.api_key:
            client.headers["Authorization"] = f"Bearer {opts.api_key}"
        server = await server_identity(client, side())
        if opts.warmup_requests:
            await _level(client, opts, prompts, opts.concurrency[0], 0, headers, None, opts.warmup_requests, None,
                         end)
        index = 0
        for level in opts.concurrency:
            before = await _server_counters(client, side()) if side() > 0 else None
            results, wall = await _level(client, opts, prompts, level, index, headers, on_request,
                                         opts.requests, opts.duration_s, end)
            after = await _server_counters(client, side()) if side() > 0 else None
            index += len(results)
            lv = summarize(level, results, wall, (before, after))
            levels.append(lv)
            all_requests += results
            if on_level:
                on_level(lv)
    client_info = {"host": socket.gethostname(), "python": platform.python_version(),
                   "ddtree_ops": _own_version(), "prompts": len(prompts)}
    return BenchResult(opts.as_dict(), server, client_info, plan, round(started, 3),
                       round(time.perf_counter() - t0, 3), levels, all_requests)


def run(opts: BenchOptions, prompts: list[Prompt], plan: dict[str, Any] | None = None,
        on_request: Callable[[RequestResult], None] | None = None,
        on_level: Callable[[LevelResult], None] | None = None) -> BenchResult:
    """Benchmark ``opts.url``: a warmup, then each concurrency level in turn.

    Args:
        opts: the run (checked first).
        prompts: sent round-robin (:func:`load_prompts`).
        plan: the deployment's ``plan.json`` document, recorded as is in the result.
        on_request, on_level: progress callbacks (after each request / level).

    Returns:
        The :class:`BenchResult`; failed requests are counted per level, never raised.

    Raises:
        BenchInputError: an option out of bounds.
    """
    loop_factory, loop_name = event_loop()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(run_async(opts, prompts, plan, on_request, on_level))
    result.client["event_loop"] = loop_name
    return result


def event_loop() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The event loop the load generator runs on: uvloop where it is installed (the ``bench`` extra), else
    asyncio's own; ``DDTREE_BENCH_LOOP=asyncio`` forces asyncio's. Recorded in the result (``client.event_loop``).

    uvloop cuts the client's CPU per streamed token by ~25 % at concurrency 256 (23.0 -> 17.4 µs on a 2-core
    machine, ``scripts/bench-client.py --pin``), which is what keeps the client's own ITL error small: a busy
    client reads every chunk late. The rest of the cost is httpcore/anyio's per-read machinery.

    Returns:
        ``(loop_factory, name)``: ``loop_factory`` for :class:`asyncio.Runner` (None: asyncio's default),
        ``name`` ``"uvloop"`` or ``"asyncio"``.
    """
    if os.environ.get("DDTREE_BENCH_LOOP", "auto") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop, "uvloop"
    return None, "asyncio"


def _own_version() -> str:
    try:
        from importlib.metadata import version

        return version("ddtree-ops")
    except Exception:  # not installed (a checkout on sys.path)
        return "unknown"


# ------------------------------------------------------------------ output
LEVEL_COLUMNS = ("concurrency", "requests", "ok", "failed", "wall_s", "output_tokens", "output_tok_s",
                 "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "itl_mean_s", "itl_p50_s", "itl_p99_s",
                 "e2e_mean_s", "e2e_p99_s", "request_output_tok_s_mean", "request_decode_tok_s_mean",
                 "accept_length", "accept_length_server")
"""Columns of ``levels.csv`` (one row per concurrency level)."""

REQUEST_COLUMNS = ("level", "index", "ok", "error", "start_s", "prompt_tokens", "completion_tokens", "ttft_s",
                   "e2e_s", "chunks", "spec_verify_ct", "accept_length", "output_tok_s", "decode_tok_s")
"""Columns of ``requests.csv`` (one row per request)."""


def level_row(lv: LevelResult) -> dict[str, Any]:
    """One ``levels.csv`` row."""
    return {
        "concurrency": lv.concurrency, "requests": lv.requests, "ok": lv.ok, "failed": lv.failed,
        "wall_s": lv.wall_s, "output_tokens": lv.output_tokens, "output_tok_s": lv.output_tok_s,
        "ttft_mean_s": lv.ttft_s["mean"], "ttft_p50_s": lv.ttft_s["p50"], "ttft_p99_s": lv.ttft_s["p99"],
        "itl_mean_s": lv.itl_s["mean"], "itl_p50_s": lv.itl_s["p50"], "itl_p99_s": lv.itl_s["p99"],
        "e2e_mean_s": lv.e2e_s["mean"], "e2e_p99_s": lv.e2e_s["p99"],
        "request_output_tok_s_mean": lv.request_output_tok_s["mean"],
        "request_decode_tok_s_mean": lv.request_decode_tok_s["mean"],
        "accept_length": lv.accept_length, "accept_length_server": lv.accept_length_server,
    }


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_results(out_dir: Path, result: BenchResult) -> list[Path]:
    """Write ``bench.json`` (everything), ``levels.csv`` and ``requests.csv`` into ``out_dir``
    (created), each through :func:`ddtree_ops._core.write.write_file`: ``out_dir`` must be ours and
    not writable by others, and a symlink planted at a result or temporary name is never followed.
    Returns the paths written.

    Raises:
        UnsafeOutput: ``out_dir`` cannot be written safely; OSError: the file system refused.
    """
    from ddtree_ops._core.write import write_file
    from ddtree_ops.config.errors import scrub_all

    # the result holds the server's texts (error lines, /server_info fields), scrubbed where they were read
    # (sglang.client.preview); scrubbed again here for any text that reached the result another way
    doc = scrub_all(result.as_dict())
    files = {
        "bench.json": json.dumps(doc, indent=1, allow_nan=False) + "\n",
        "levels.csv": _csv([level_row(lv) for lv in result.levels], LEVEL_COLUMNS),
        "requests.csv": _csv(doc["requests"], REQUEST_COLUMNS),
    }
    return [write_file(out_dir / name, text) for name, text in files.items()]


def load_result(path: Path) -> dict[str, Any]:
    """A ``bench.json`` written by :func:`write_results` (file or the directory holding it).

    Raises:
        BenchInputError: not such a document (names the path and what is missing).
        OSError: cannot be read.
    """
    p = path / "bench.json" if path.is_dir() else path
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
        raise BenchInputError(f"{preview(str(p))}: not a regular file; give the bench.json ddtree-ops bench wrote")
    if st.st_size > 256 * MIB:
        raise BenchInputError(f"{preview(str(p))}: over 256 MiB; not a bench.json of ddtree-ops bench")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:
        raise BenchInputError(f"{preview(str(p))}: malformed JSON ({preview(str(exc), 120)})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ddtree-ops-bench" or not isinstance(doc.get("levels"), list):
        raise BenchInputError(f"{preview(str(p))}: not a bench.json written by ddtree-ops bench (kind, levels)")
    fmt = doc.get("format")
    if type(fmt) is not int or fmt != BENCH_FORMAT:
        newer = type(fmt) is int and fmt > BENCH_FORMAT
        raise BenchInputError(
            f"{preview(str(p))}: format = {preview(repr(fmt), 40)}: this ddtree-ops reads bench.json format "
            f"{BENCH_FORMAT} only{' (a newer ddtree-ops wrote it)' if newer else ''}; compare with the ddtree-ops that "
            "wrote it, or re-run ddtree-ops bench with this one")
    for key in ("options", "server"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise BenchInputError(f"{preview(str(p))}: {key} is a {type(doc[key]).__name__}, not an object; "
                                  "re-run ddtree-ops bench")
    seen: set[int] = set()
    for i, lv in enumerate(doc["levels"]):
        problem = level_problem(lv)
        if problem is None and lv["concurrency"] in seen:
            problem = f"concurrency {lv['concurrency']} appears twice"
        if problem:
            raise BenchInputError(f"{preview(str(p))}: levels[{i}]: {problem}; re-run ddtree-ops bench")
        seen.add(lv["concurrency"])
    return doc


LEVEL_STATS = ("ttft_s", "itl_s", "e2e_s", "request_output_tok_s")
"""The per-level statistics (``{mean, p50, p99}``) the comparison and its report read."""


def level_problem(lv: Any) -> str | None:
    """What is wrong with one level of a ``bench.json`` as the report reads it (None: nothing):
    every field the comparison, the markdown and the plots use is checked for its type here, so
    a crafted or truncated file is one line, never a traceback half-way through the report."""
    if not isinstance(lv, dict):
        return f"a {type(lv).__name__}, not an object"
    c = lv.get("concurrency")
    if type(c) is not int or not 1 <= c <= 1 << 20:
        return f"concurrency {preview(repr(c), 40)} is not an integer 1..{1 << 20}"
    for key in ("ok", "failed"):
        if type(lv.get(key)) is not int or not 0 <= lv[key] <= MAX_COUNT:
            # bounded like every other number: a 4000-digit count would be written whole into report.md
            return f"{key} {preview(repr(lv.get(key)), 40)} is not a count (an integer 0..2**53)"
    if not _finite(lv.get("output_tok_s")) or not 0 <= lv["output_tok_s"] <= MAX_COUNT:
        return f"output_tok_s {preview(repr(lv.get('output_tok_s')), 40)} is not a number 0..2**53"
    for key in LEVEL_STATS:
        st = lv.get(key)
        if not isinstance(st, dict):
            return f"{key} {preview(repr(st), 40)} is not an object of mean/p50/p99"
        for k in ("mean", "p50", "p99"):
            if st.get(k) is not None and (not _finite(st[k]) or not 0 <= st[k] <= MAX_COUNT):
                return f"{key}.{k} {preview(repr(st[k]), 40)} is not a number 0..2**53 or null"
    for key in ("accept_length", "accept_length_server"):
        if lv.get(key) is not None and (not _finite(lv[key]) or not 0 <= lv[key] <= MAX_ACCEPT_LENGTH):
            return (f"{key} {preview(repr(lv[key]), 40)} is not an acceptance length 0..{MAX_ACCEPT_LENGTH} "
                    "(tokens per verify step) or null")
    samples = lv.get("itl_samples_s")
    if samples is not None and (not isinstance(samples, list) or not all(_finite(x) and x > 0 for x in samples)):
        return "itl_samples_s is not a list of finite numbers > 0"
    return None
