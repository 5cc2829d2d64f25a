"""Warm a server over every batch size it will run.

What runs (``ddtree-ops warmup``, and the unit's ``ExecStartPost`` before it is "active"):

* **Batch sizes** (:func:`warmup_batch_sizes`): the plan's captured CUDA-graph batch sizes
  (``plan.capture_bs``). With graphs off (or a capture list SGLang decides at run time),
  powers of two up to ``max_running_requests`` plus ``max_running_requests`` itself
  (``cuda_graph_max_bs`` if that is unset, else 1, 2, 4, 8): every power of two is a
  distinct kernel shape bucket for JIT-compiled attention/GEMM kernels.
* For each batch size ``bs``, two rounds of ``bs`` concurrent ``/generate`` requests (so
  the scheduler forms a decode batch of that size): a **greedy** round (temperature 0) and
  a **sampled** round (temperature 0.7); requests alternate a **short** and a **long**
  prompt, so that even ``bs = 1`` sees both. The long prompt is as long as the server's
  context allows (:func:`long_prompt_limit`), at most ``long_prompt_words`` words.
* **The context** comes from the server: one bounded ``/server_info`` read at the start gives
  ``context_length`` and the tokens SGLang reserves for speculation
  (:func:`limits_from_server_info`); the plan's ``context_length`` stands in when the server does not
  say. Words are not tokens: the long prompt is sized for a byte-level tokenizer, one token
  per UTF-8 byte, the most any BPE tokenizer makes of text. A server that still answers
  that the prompt is "longer than the model's context length" (SGLang
  ``tokenizer_manager.py`` ``_validate_one_request``, HTTP 400) gets the prompt cut to fit
  the token count it named and the round sent again, at most :data:`MAX_BACKOFFS` times.
* For a **vision** model (``ddtree_model.vision``), one ``/v1/chat/completions`` request
  with a PNG image of at least ``vision_min_pixels`` pixels (made in-process by
  :func:`make_png`, stdlib ``zlib`` only), after the text batches.

The report records, per batch size, wall latency (seconds, both rounds), generated
tokens and the mean ``meta_info.spec_accept_length`` (tokens per verify pass, bonus
included; ``None`` without speculation). Everything is bounded by one deadline (each
request's total deadline is the time left, :func:`ddtree_ops.sglang.client.fetch`) and
every answer by a size cap (:func:`ddtree_ops.sglang.client.generate_cap`); any failed
request (connection lost, server crashed, HTTP error, an answer too large, not strict JSON,
non-finite or negative counts) stops the warmup with a :class:`WarmupError` naming the
batch size and round.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ..sglang.client import SERVER_INFO_PATHS, SGLangError, async_client, fetch, generate_cap, preview

if TYPE_CHECKING:
    from ..config.plandoc_model import PlanDoc, PlanSizes

SHORT_PROMPT = "Explain speculative decoding in one paragraph."
LONG_PARAGRAPH = (
    "Write a Python function that checks whether a number is prime, then explain its complexity "
    "and how you would test it with property-based tests and edge cases. Consider negative numbers, "
    "zero, one, two, large primes, Carmichael numbers and the cost of trial division versus Miller-Rabin."
)
DEFAULT_LONG_PROMPT_WORDS = 1024
"""Most words in the long prompt (real SGLang 0.5.17 with a 4096-token byte-level BPE made 2089
tokens of 1024 of these words: ~2 tokens a word); the server's context cuts it further."""

SPECIAL_TOKENS_MARGIN = 16
"""Tokens left for what a tokenizer adds to any text (BOS/EOS and the like): a handful."""

SERVER_INFO_DEADLINE_S = 10.0
"""Bound on the one ``/server_info`` read at the start (both paths together; a quarter of the
warmup's deadline when that is less), seconds."""

MAX_BACKOFFS = 3
"""How often a long prompt refused as too long for the context is cut and the round resent."""

_TOO_LONG = re.compile(r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"
                       r"|maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: "
                       r"(\d+) tokens from the input")
"""SGLang's two context-length refusals (0.5.17 ``tokenizer_manager.py`` ``_validate_one_request``):
the input alone, or input plus ``max_new_tokens``; the numbers name the tokens it counted."""

EAGER_FALLBACK_BS = [1, 2, 4, 8]
TEMPERATURES = (("greedy", 0.0), ("sampled", 0.7))


class WarmupError(Exception):
    """A warmup request failed (server down, crashed or answered an error) or the deadline passed."""


class _TooLong(WarmupError):
    """The server refused a prompt as longer than its context: ``tokens`` is its count of the
    input, ``context`` the context length it named."""

    def __init__(self, message: str, tokens: int, context: int) -> None:
        super().__init__(message)
        self.tokens, self.context = tokens, context


@dataclass
class _Long:
    """The long prompt as it is now (cut by refusals during the run)."""

    words: int
    max_bytes: int | None
    max_new_tokens: int
    reserved_tokens: int
    text: str = ""
    backoffs: int = 0
    tokens: int | None = None

    def __post_init__(self) -> None:
        self.text = long_prompt(self.words, self.max_bytes)

    def cut(self, refusal: _TooLong) -> bool:
        """Shorten the prompt to fit the context the server named, by the ratio of the token
        count it gave; False when no more back-offs are allowed or nothing can be cut."""
        size = len(self.text.encode())
        if self.backoffs >= MAX_BACKOFFS or size <= 1 or refusal.tokens <= 0:
            return False
        budget = long_prompt_limit(refusal.context, self.max_new_tokens, self.reserved_tokens) or 1
        self.max_bytes = max(1, min(size - 1, size * budget // refusal.tokens))
        self.text = long_prompt(self.words, self.max_bytes)
        self.backoffs += 1
        return True


@dataclass
class BatchResult:
    """One batch size's warmup.

    Attributes:
        batch_size: concurrent requests per round (``0`` is never used; vision uses 1).
        kind: ``text`` or ``vision``.
        requests: requests sent (both rounds).
        latency_s: wall seconds of all rounds of this batch size.
        round_latency_s: wall seconds per round (``greedy``, ``sampled``; ``vision``).
        prompt_tokens, completion_tokens: summed over the requests, as the server counted them.
        accept_length: mean ``meta_info.spec_accept_length`` of the requests that report one.
    """

    batch_size: int
    latency_s: float
    completion_tokens: int
    accept_length: float | None
    kind: str = "text"
    requests: int = 0
    prompt_tokens: int = 0
    round_latency_s: dict[str, float] = field(default_factory=dict)


@dataclass
class WarmupReport:
    """The whole warmup (``--json``'s ``report``; also the warm marker's content).

    ``context_length`` / ``context_source``: the context the long prompt was sized for and
    where it was read (server or plan); ``long_prompt_bytes``: the long prompt's size as
    sent last; ``long_prompt_tokens``: the server's token count of it (``meta_info``);
    ``long_prompt_backoffs``: how often it was cut after a context-length refusal."""

    url: str
    batch_sizes: list[int]
    batch_sizes_source: str = ""
    context_length: int | None = None
    context_source: str = ""
    long_prompt_bytes: int = 0
    long_prompt_tokens: int | None = None
    long_prompt_backoffs: int = 0
    results: list[BatchResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    finished_at: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WarmupPlan:
    """What to warm: batch sizes (and why), prompt bounds and the vision input.

    Attributes:
        batch_sizes: sorted, distinct, each >= 1.
        source: one line saying where the sizes come from.
        vision_min_pixels: send an image of at least this many pixels; None for text-only.
        context_length: the model's context (tokens) if the deployment states it.
        from_server: no plan: take the batch sizes from the server's ``/server_info``
            (:func:`limits_from_server_info`); ``batch_sizes`` is the fallback when it says none.
    """

    batch_sizes: list[int]
    source: str
    vision_min_pixels: int | None = None
    context_length: int | None = None
    from_server: bool = False


def _powers_up_to(limit: int) -> list[int]:
    sizes, x = [], 1
    while x < limit:
        sizes.append(x)
        x *= 2
    return sorted(set(sizes) | {limit})


def warmup_batch_sizes(plan: PlanSizes) -> tuple[list[int], str]:
    """Batch sizes to warm for a plan (``plan.json``'s ``plan`` object,
    :class:`~ddtree_ops.config.plandoc_model.PlanSizes`).

    Returns:
        ``(sizes, source)``: ``plan.capture_bs`` when graphs are captured; otherwise powers
        of two up to ``max_running_requests`` (or ``cuda_graph_max_bs``) plus that limit,
        or ``[1, 2, 4, 8]`` when SGLang decides the limit from memory.
    """
    capture = plan.capture_bs
    if plan.cuda_graphs and capture:
        return sorted(set(capture)), f"plan.capture_bs: the {len(set(capture))} captured CUDA-graph batch sizes"
    why = "CUDA graphs off (eager)" if not plan.cuda_graphs else "capture list decided by SGLang"
    for key, limit in (("max_running_requests", plan.max_running_requests),
                       ("cuda_graph_max_bs", plan.cuda_graph_max_bs)):
        if limit is not None:  # 1..4096 (the contract's bound)
            return _powers_up_to(limit), f"{why}: powers of two up to {key}={limit}, plus {limit}"
    return list(EAGER_FALLBACK_BS), f"{why}, no max_running_requests: {EAGER_FALLBACK_BS}"


def warmup_plan(plan_doc: PlanDoc | dict[str, Any]) -> WarmupPlan:
    """A :class:`WarmupPlan` from a host's ``plan.json`` (:class:`~ddtree_ops.config.plandoc_model.PlanDoc`;
    a rendered document is checked into one). ``context_length`` and ``vision_min_pixels`` are
    within the model's bounds (the contract checks them before any request).

    Raises:
        PlanDocError: not a plan document, or a field breaks its rule.
    """
    from ..config.plandoc_model import as_plan_doc

    doc = as_plan_doc(plan_doc)
    model = doc.deployment.model
    sizes, source = warmup_batch_sizes(doc.plan)
    return WarmupPlan(sizes, source, model.vision_min_pixels if model.vision else None, model.context_length)


# ---------------------------------------------------------------- images
def make_png(width: int, height: int) -> bytes:
    """An RGB PNG (8 bits per channel, a colour gradient) built with the stdlib only.

    Args:
        width, height: pixels, each 1..16384.

    Returns:
        The PNG file's bytes (signature, IHDR, one zlib IDAT, IEND; PNG spec ISO/IEC 15948).
    """
    if not (1 <= width <= 16384 and 1 <= height <= 16384):
        raise ValueError(f"image size {width}x{height}: each side must be 1..16384")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter: none
        g = (y * 255) // max(1, height - 1)
        for x in range(width):
            rows += bytes(((x * 255) // max(1, width - 1), g, (x ^ y) & 0xFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(bytes(rows), 6))
        + chunk(b"IEND", b"")
    )


def image_side(min_pixels: int, patch: int = 28) -> int:
    """Side (pixels) of a square image with at least ``min_pixels`` pixels, rounded up to a
    multiple of ``patch`` (ViT patch 14 x spatial merge 2, as Qwen-VL's ``smart_resize``)."""
    side = max(patch, math.isqrt(max(1, min_pixels - 1)) + 1)
    return -(-side // patch) * patch


def image_data_url(min_pixels: int) -> tuple[str, int, int]:
    """``(data URL, width, height)`` of a PNG with at least ``min_pixels`` pixels."""
    side = image_side(min_pixels)
    return "data:image/png;base64," + base64.b64encode(make_png(side, side)).decode(), side, side


# ---------------------------------------------------------------- requests
def long_prompt(words: int, max_bytes: int | None = None) -> str:
    """A prompt of ``words`` whitespace-separated words (>= 1), cut at a word boundary to at
    most ``max_bytes`` UTF-8 bytes when given (at least one word is kept)."""
    base = LONG_PARAGRAPH.split()
    text = " ".join(base[i % len(base)] for i in range(max(1, words)))
    if max_bytes is not None and len(text.encode()) > max_bytes:
        cut = text.encode()[:max(1, max_bytes) + 1].decode("utf-8", "ignore")
        text = cut.rsplit(" ", 1)[0] if " " in cut.rstrip() else base[0]
    return text


@dataclass(frozen=True)
class ServerLimits:
    """What the server says bounds a request (None: not said).

    Attributes:
        context_length: ``/server_info`` ``context_length`` (tokens).
        reserved_tokens: output slots SGLang reserves per request on top of its input:
            0.5.17 ``managers/utils.py`` ``compute_num_reserved_tokens`` counts, for the
            EAGLE family, ``max(topk * num_steps, max_speculative_num_draft_tokens)``; taken
            here for any speculative server (it only makes the prompt shorter).
    """

    context_length: int | None = None
    reserved_tokens: int = 0
    batch_sizes: tuple[int, ...] = ()
    batch_sizes_source: str = ""


def _server_batch_sizes(info: dict[str, Any], pos_int: Callable[[str], int | None]) -> tuple[list[int], str]:
    """Batch sizes a server runs, from what its ``/server_info`` reports: the decode capture
    list when resolved there (``cuda_graph_bs_decode``; ``cuda_graph_bs`` up to 0.5.13) and within
    the plan contract's bounds (at most :data:`~ddtree_ops.config.plandoc_model.MAX_CAPTURE_SIZES`
    entries, each 1..4096), else powers of two up to the capture maximum
    (``cuda_graph_max_bs_decode`` / ``cuda_graph_max_bs``) or ``max_running_requests``;
    ``([], "")`` when it reports none of them."""
    from ..config.plandoc_model import MAX_CAPTURE_SIZES

    for key in ("cuda_graph_bs_decode", "cuda_graph_bs"):
        v = info.get(key)
        if (isinstance(v, list) and v and len(v) <= MAX_CAPTURE_SIZES
                and all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 4096 for x in v)):
            return sorted(set(v)), f"server /server_info {key}: the {len(set(v))} captured batch sizes"
    for key in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs", "max_running_requests"):
        v = pos_int(key)
        if v is not None and v <= 4096:
            return _powers_up_to(v), f"server /server_info: powers of two up to {key}={v}, plus {v}"
    return [], ""


def limits_from_server_info(info: Any) -> ServerLimits:
    """:class:`ServerLimits` from a ``/server_info`` object; fields that are absent or not
    positive integers are left unset (a hostile server cannot make the prompt longer than the
    plan or the default allows: the smaller bound wins, see :func:`long_prompt_limit`)."""
    if not isinstance(info, dict):
        return ServerLimits()

    def pos_int(key: str) -> int | None:
        v = info.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_COUNT else None

    reserved = 0
    if info.get("speculative_algorithm") not in (None, "", "NONE", "none"):
        topk, steps = pos_int("speculative_eagle_topk") or 0, pos_int("speculative_num_steps") or 0
        reserved = max(topk * steps, pos_int("speculative_num_draft_tokens") or 0,
                       pos_int("max_speculative_num_draft_tokens") or 0)
    sizes, source = _server_batch_sizes(info, pos_int)
    return ServerLimits(pos_int("context_length"), min(reserved, 1 << 20), tuple(sizes), source)


def long_prompt_limit(context_length: int | None, max_new_tokens: int, reserved_tokens: int = 0) -> int | None:
    """Most UTF-8 bytes of the long prompt for a context of ``context_length`` tokens: one
    token per byte (byte-level BPE's worst case) leaves room for the answer, SGLang's reserved
    speculative slots and :data:`SPECIAL_TOKENS_MARGIN`. None when the context is unknown;
    at least 1."""
    if context_length is None:
        return None
    return max(1, context_length - max_new_tokens - reserved_tokens - SPECIAL_TOKENS_MARGIN)


async def _server_limits(client: httpx.AsyncClient, deadline_s: float) -> ServerLimits:
    """One read of ``/server_info`` (``/get_server_info`` on older builds), both within
    ``deadline_s`` in all, for :class:`ServerLimits`; an empty one when neither answers a JSON
    object in time (the plan's context or the refusal back-off then bound the prompt)."""
    end = time.monotonic() + deadline_s
    for path in SERVER_INFO_PATHS:
        try:
            r = await fetch(client, "GET", path, end - time.monotonic())
        except SGLangError:
            return ServerLimits()
        if r.status == 200:
            try:
                return limits_from_server_info(r.json())
            except SGLangError:
                return ServerLimits()
        if r.status != 404:
            break
    return ServerLimits()


async def _post(client: httpx.AsyncClient, path: str, body: dict, where: str, deadline_s: float, cap: int) -> Any:
    """POST ``body`` as JSON; the parsed strict-JSON answer (any JSON value).

    Raises:
        WarmupError: no complete answer within ``deadline_s`` (total), over ``cap`` bytes,
            not HTTP 200, or not strict JSON (non-finite numbers count as malformed).
    """
    try:
        r = await fetch(client, "POST", path, deadline_s, cap, json_body=body)
    except SGLangError as exc:
        hint = "" if exc.reachable else " (server crashed, restarted or unreachable)"
        raise WarmupError(f"{where}: {path} failed: {exc.what}{hint}") from None
    if r.status != 200:
        m = _TOO_LONG.search(r.body[:4096].decode("utf-8", "replace")) if r.status == 400 else None
        if m:
            tokens, context = (int(m.group(1)), int(m.group(2))) if m.group(1) else (int(m.group(4)), int(m.group(3)))
            raise _TooLong(f"{where}: {path} answered HTTP {r.status}: {preview(r.body)}", tokens, context)
        raise WarmupError(f"{where}: {path} answered HTTP {r.status}: {preview(r.body)}")
    try:
        return r.json()
    except SGLangError as exc:
        raise WarmupError(f"{where}: {path} {exc.what}") from None


META_KEYS = ("prompt_tokens", "completion_tokens", "spec_accept_length")
"""What warmup keeps of each answer's ``meta_info`` (the rest is dropped as soon as the
answer is parsed, so a batch in flight holds only these)."""


def _meta(out: Any, where: str, path: str = "/generate") -> dict:
    """:data:`META_KEYS` of one ``/generate`` answer's ``meta_info`` (SGLang always sends
    it); WarmupError if absent."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if not isinstance(meta, dict):
        shown = f"a JSON {type(out).__name__}" if not isinstance(out, dict) else \
            f"an object with keys {preview(', '.join(map(str, list(out)[:10])), 120)}"
        raise WarmupError(f"{where}: {path} answered {shown} (no meta_info object): not SGLang's /generate")
    return {k: meta[k] for k in META_KEYS if k in meta}


async def _generate(client: httpx.AsyncClient, body: dict, where: str, deadline_s: float, cap: int) -> dict:
    """POST one ``/generate`` and keep only its :func:`_meta` (the parsed answer is freed here)."""
    return _meta(await _post(client, "/generate", body, where, deadline_s, cap), where)


MAX_COUNT = 1 << 53
"""Largest token count accepted from the server (beyond it a float loses integers)."""


def _num(value: Any) -> float | None:
    """A JSON number as float; None for anything else (absent, null, strings, booleans).
    Strict JSON (:func:`ddtree_ops.sglang.client.loads_json`) already refused non-finite numbers."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(meta: dict, key: str, where: str) -> int:
    """A token count of ``meta_info`` (0 when not reported). WarmupError when it is negative,
    fractional or beyond :data:`MAX_COUNT`: not a count, a broken server."""
    v = _num(meta.get(key))
    if v is None:
        return 0
    if not (0 <= v <= MAX_COUNT and v == int(v)):
        raise WarmupError(f"{where}: meta_info.{key} = {preview(repr(meta.get(key)), 40)}: a token count must be "
                          f"an integer 0..{MAX_COUNT} (a broken server)")
    return int(v)


def _accept(meta: dict, where: str) -> float | None:
    """``meta_info.spec_accept_length`` (None when not reported); WarmupError when negative."""
    v = _num(meta.get("spec_accept_length"))
    if v is not None and not 0 <= v <= MAX_COUNT:
        raise WarmupError(f"{where}: meta_info.spec_accept_length = {preview(repr(v), 40)}: must be 0..{MAX_COUNT} "
                          "tokens per verify pass (a broken server)")
    return v


async def _gather(jobs: list) -> list[dict]:
    outs = await asyncio.gather(*jobs, return_exceptions=True)
    for o in outs:
        if isinstance(o, BaseException):
            raise o
    return outs  # type: ignore[return-value]


async def _text_batch(client: httpx.AsyncClient, bs: int, max_new_tokens: int, long: _Long,
                      end: float) -> BatchResult:
    t0 = time.monotonic()
    metas: list[tuple[dict, str]] = []
    rounds: dict[str, float] = {}
    cap = generate_cap(max_new_tokens)
    for r_i, (name, temp) in enumerate(TEMPERATURES):
        where = f"batch size {bs} ({name} round)"
        tr = time.monotonic()
        while True:
            is_long = [bool((i + r_i) % 2) for i in range(bs)]
            jobs = [_generate(client, {
                "text": long.text if is_long[i] else SHORT_PROMPT,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temp,
                                    "ignore_eos": True},
            }, where, end - time.monotonic(), cap) for i in range(bs)]
            try:
                outs = await _gather(jobs)
                break
            except _TooLong as exc:
                if not long.cut(exc):
                    raise WarmupError(f"{exc} (the long prompt was cut {long.backoffs} times and still did not "
                                      "fit: a tokenizer that makes more than one token per byte?)") from None
        rounds[name] = round(time.monotonic() - tr, 4)
        metas += [(o, where) for o in outs]
        for o, lg in zip(outs, is_long, strict=True):
            if lg and long.tokens is None:
                long.tokens = _count(o, "prompt_tokens", where) or None
    als = [x for x in (_accept(m, w) for m, w in metas) if x is not None]
    return BatchResult(
        batch_size=bs, kind="text", requests=len(metas), latency_s=round(time.monotonic() - t0, 4),
        round_latency_s=rounds,
        prompt_tokens=sum(_count(m, "prompt_tokens", w) for m, w in metas),
        completion_tokens=sum(_count(m, "completion_tokens", w) for m, w in metas),
        accept_length=round(sum(x / len(als) for x in als), 3) if als else None,
    )


async def _vision(client: httpx.AsyncClient, min_pixels: int, max_new_tokens: int, end: float) -> BatchResult:
    url, w, h = image_data_url(min_pixels)
    t0 = time.monotonic()
    where = f"vision ({w}x{h} image)"
    out = await _post(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "Describe this image in one sentence."},
        ]}],
        "max_tokens": max_new_tokens, "temperature": 0.0,
    }, where, end - time.monotonic(), generate_cap(max_new_tokens))
    lat = round(time.monotonic() - t0, 4)
    if not isinstance(out, dict) or not isinstance(out.get("choices"), list):
        raise WarmupError(f"{where}: /v1/chat/completions answered {preview(type(out).__name__)} without a choices "
                          "list: not an OpenAI-compatible chat completion")
    usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
    return BatchResult(batch_size=1, kind="vision", requests=1, latency_s=lat, round_latency_s={"vision": lat},
                       prompt_tokens=_count(usage, "prompt_tokens", where),
                       completion_tokens=_count(usage, "completion_tokens", where), accept_length=None)


async def _run(url: str, wp: WarmupPlan, deadline_s: float, max_new_tokens: int, long_prompt_words: int,
               on_progress: Callable[[BatchResult], None] | None,
               on_start: Callable[[WarmupPlan, WarmupReport], None] | None = None) -> WarmupReport:
    t0 = time.monotonic()
    end = t0 + deadline_s
    async with async_client(url, max_connections=4) as info_client:
        # a quarter of the deadline at most: a server that never answers /server_info still leaves
        # the batches most of their time (and their own error)
        limits = await _server_limits(info_client, min(SERVER_INFO_DEADLINE_S, deadline_s / 4))
    if wp.from_server and limits.batch_sizes:
        wp = WarmupPlan(list(limits.batch_sizes), limits.batch_sizes_source, wp.vision_min_pixels, wp.context_length)
    report = WarmupReport(url, list(wp.batch_sizes), wp.source)
    steps: list[tuple[str, int]] = [("text", bs) for bs in wp.batch_sizes]
    if wp.vision_min_pixels:
        steps.append(("vision", 1))
    async with async_client(url, max_connections=max(wp.batch_sizes or [1]) + 4) as client:
        known = [(c, src) for c, src in ((limits.context_length, "server /server_info"),
                                         (wp.context_length, "plan")) if c is not None]
        context, report.context_source = min(known) if known else (None, "unknown (back-off on refusal)")
        report.context_length = context
        long = _Long(long_prompt_words, long_prompt_limit(context, max_new_tokens, limits.reserved_tokens),
                     max_new_tokens, limits.reserved_tokens)
        report.long_prompt_bytes = len(long.text.encode())
        if on_start:
            on_start(wp, report)
        for kind, bs in steps:
            left = deadline_s - (time.monotonic() - t0)
            what = f"batch size {bs}" if kind == "text" else "the vision request"
            if left <= 0:
                raise WarmupError(f"deadline of {deadline_s:g} s passed before {what}")
            coro = (_text_batch(client, bs, max_new_tokens, long, end) if kind == "text"
                    else _vision(client, wp.vision_min_pixels or 1, max_new_tokens, end))
            try:
                res = await asyncio.wait_for(coro, timeout=left)
            except TimeoutError:
                raise WarmupError(f"deadline of {deadline_s:g} s passed during {what}") from None
            report.results.append(res)
            report.long_prompt_bytes, report.long_prompt_tokens = len(long.text.encode()), long.tokens
            report.long_prompt_backoffs = long.backoffs
            if on_progress:
                on_progress(res)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    report.finished_at = round(time.time(), 3)
    return report


def warmup(url: str, batch_sizes: list[int] | WarmupPlan, deadline_s: float = 600.0, max_new_tokens: int = 32,
           on_progress: Callable[[BatchResult], None] | None = None,
           long_prompt_words: int = DEFAULT_LONG_PROMPT_WORDS,
           on_start: Callable[[WarmupPlan, WarmupReport], None] | None = None) -> WarmupReport:
    """Drive ``url`` through every batch size, in order (then the vision request, if any).

    Args:
        url: server base URL.
        batch_sizes: a :class:`WarmupPlan`, or plain batch sizes (text only).
        deadline_s: bound on the whole warmup, seconds.
        max_new_tokens: tokens generated per request (``ignore_eos``: exactly this many).
        on_progress: called after each batch size.
        long_prompt_words: most words of the long prompt (the context cuts it further).
        on_start: called once the batch sizes and the context are known, before the first batch.

    Raises:
        WarmupError: a request failed (names the batch size and round) or the deadline passed.
    """
    wp = batch_sizes if isinstance(batch_sizes, WarmupPlan) else WarmupPlan(list(batch_sizes), "given")
    return asyncio.run(_run(url, wp, deadline_s, max_new_tokens, long_prompt_words, on_progress, on_start))


def write_marker(path: Path, report: WarmupReport) -> None:
    """Write the warm marker (the report as JSON) atomically: readers see all of it or none
    (:func:`ddtree_ops._core.write.write_file`: its directory ours, never through a symlink)."""
    from .._core.write import write_file

    write_file(path, json.dumps(report.as_dict(), allow_nan=False), 0o600)
