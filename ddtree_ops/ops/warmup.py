"""Warm a server over every captured batch size.

For each batch size ``bs`` of the plan's capture list, ``bs`` concurrent ``/generate``
requests run (so the scheduler forms a batch of that size), a short greedy one and a
sampled one. The report records, per batch size, wall latency (seconds), generated tokens
and the mean ``meta_info.spec_accept_length``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx

PROMPTS = (
    "Explain speculative decoding in one paragraph.",
    "Write a Python function that checks whether a number is prime, then explain its complexity "
    "and how you would test it with property-based tests and edge cases.",
)


class WarmupError(Exception):
    """A warmup request failed (server down, crashed or answered an error)."""


@dataclass
class BatchResult:
    batch_size: int
    latency_s: float
    completion_tokens: int
    accept_length: float | None


@dataclass
class WarmupReport:
    url: str
    batch_sizes: list[int]
    results: list[BatchResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


async def _one(client: httpx.AsyncClient, prompt: str, max_new_tokens: int, temperature: float) -> dict:
    try:
        r = await client.post("/generate", json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature},
        })
    except httpx.HTTPError as exc:
        raise WarmupError(f"/generate failed: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise WarmupError(f"/generate answered HTTP {r.status_code}: {r.text[:200]}")
    return r.json()


async def _batch(client: httpx.AsyncClient, bs: int, max_new_tokens: int) -> BatchResult:
    t0 = time.monotonic()
    jobs = [_one(client, PROMPTS[i % 2], max_new_tokens, 0.0 if i % 2 == 0 else 0.7) for i in range(bs)]
    outs = await asyncio.gather(*jobs)
    lat = time.monotonic() - t0
    metas = [o.get("meta_info", {}) for o in outs]
    tokens = sum(int(m.get("completion_tokens", 0)) for m in metas)
    als = [float(m["spec_accept_length"]) for m in metas if m.get("spec_accept_length") is not None]
    return BatchResult(bs, round(lat, 4), tokens, round(sum(als) / len(als), 3) if als else None)


async def _run(url: str, batch_sizes: list[int], deadline_s: float, max_new_tokens: int,
               on_progress: Callable[[BatchResult], None] | None) -> WarmupReport:
    report = WarmupReport(url, batch_sizes)
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=max(batch_sizes or [1]) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=deadline_s, limits=limits) as client:
        for bs in batch_sizes:
            left = deadline_s - (time.monotonic() - t0)
            if left <= 0:
                raise WarmupError(f"deadline of {deadline_s:g} s passed before batch size {bs}")
            try:
                res = await asyncio.wait_for(_batch(client, bs, max_new_tokens), timeout=left)
            except asyncio.TimeoutError:
                raise WarmupError(f"deadline of {deadline_s:g} s passed during batch size {bs}") from None
            report.results.append(res)
            if on_progress:
                on_progress(res)
    report.elapsed_s = round(time.monotonic() - t0, 3)
    return report


def warmup(url: str, batch_sizes: list[int], deadline_s: float = 600.0, max_new_tokens: int = 32,
           on_progress: Callable[[BatchResult], None] | None = None) -> WarmupReport:
    """Drive ``url`` through every batch size, in order.

    Args:
        url: server base URL.
        batch_sizes: requests per batch, e.g. the plan's ``capture_bs``.
        deadline_s: bound on the whole warmup, seconds.
        max_new_tokens: tokens generated per request.
        on_progress: called after each batch size.

    Raises:
        WarmupError: a request failed or the deadline passed.
    """
    return asyncio.run(_run(url, list(batch_sizes), deadline_s, max_new_tokens, on_progress))
