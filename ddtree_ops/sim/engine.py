"""Scheduler and decoding model of the SGLang SIMULATOR (a test double, NOT SGLang).

One scheduler thread runs the loop SGLang's scheduler runs: admit waiting requests up
to ``max_running_requests`` and prefill them (one step, first token), else run one
verify pass over the running batch. In a verify pass each request accepts about
``accept_length`` tokens (bonus token included; deterministic: fractional lengths are
carried per request), capped by what one pass can accept and by ``max_new_tokens``.

A pass takes ``SGLANG_SIM_STEP_SECONDS`` with a CUDA graph, ``SGLANG_SIM_EAGER_SLOWDOWN``
times that eagerly (batch larger than the largest captured size, or graphs disabled).
When a graph replays at a width other than the one it was captured for, the process
prints SGLang's scheduler crash and exits 1 (``os._exit``), like the real server.

Accounting as SGLang's scheduler: lifetime ``avg_spec_accept_length`` = accepted tokens
(incl. bonus) / request-verify steps; gauges are refreshed every ``decode_log_interval``
passes and when the batch drains; ``/flush_cache`` resets the lifetime counters.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import queue
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from ddtree_ops.sim import _crash
from ddtree_ops.sim.args import DEFAULT_ACCEPT_LENGTH, SimConfig
from ddtree_ops.sim.metrics import SimMetrics

logger = logging.getLogger("ddtree_ops.sim")

FILLER = (
    "the quick brown fox jumps over a lazy dog while speculative drafts propose tokens and "
    "the target model verifies them in one forward pass"
).split()


def count_tokens(text: str) -> int:
    """The sim's tokenizer: whitespace-separated words, at least 1."""
    return max(1, len(text.split()))


def filler_text(start: int, n: int) -> str:
    """``n`` filler words, continuing at word index ``start``."""
    return "".join(" " + FILLER[(start + i) % len(FILLER)] for i in range(n))


@dataclass
class Request:
    """One generation request. ``events`` gets ``("tokens", n)`` then ``("done", None)``."""

    prompt_tokens: int
    max_new_tokens: int
    prompt_key: str = ""
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.monotonic)
    events: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)
    done: threading.Event = field(default_factory=threading.Event)
    cached_tokens: int = 0
    completion_tokens: int = 0
    verify_ct: int = 0
    carry: float = 0.0
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    count_in_metrics: bool = True

    @property
    def finished(self) -> bool:
        return self.completion_tokens >= self.max_new_tokens

    def meta_info(self, speculative: bool) -> dict[str, Any]:
        e2e = (self.finished_time or time.monotonic()) - self.created
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": self.completion_tokens} if self.done.is_set() else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": round(e2e, 6),
        }
        if speculative:
            meta["spec_verify_ct"] = self.verify_ct
            if self.verify_ct > 0:
                meta["spec_accept_length"] = self.completion_tokens / self.verify_ct
        return meta


class Engine:
    """The simulated scheduler. ``start()`` runs it in a daemon thread."""

    def __init__(self, cfg: SimConfig, metrics: SimMetrics | None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.step_seconds = float(os.environ.get("SGLANG_SIM_STEP_SECONDS", "0.005"))
        self.eager_slowdown = float(os.environ.get("SGLANG_SIM_EAGER_SLOWDOWN", "3.8"))
        env_accept = os.environ.get("SGLANG_SIM_ACCEPT_LENGTH")
        self.default_accept_length = self._clamp_accept(
            float(env_accept) if env_accept else DEFAULT_ACCEPT_LENGTH.get(cfg.algorithm, 3.0)
        )
        self.forced_accept_length: float | None = None
        self.cv = threading.Condition()
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.radix: set[str] = set()
        self.word_cursor = itertools.count()
        # lifetime (reset by flush_cache)
        self.total_accepted = 0
        self.total_verify_ct = 0
        # window since the last stats refresh
        self.win_passes = 0
        self.win_accepted = 0
        self.win_verify_ct = 0
        self.win_gen_tokens = 0
        self.win_start = time.monotonic()
        self.last_gen_throughput = 0.0
        self.last_accept_length: float | None = None
        self.verify_passes = 0
        self.graph_passes = 0
        self.eager_passes = 0
        self.frozen = False  # test-double fault (/_sim/fault {"freeze": true}): no forward pass makes progress
        self._thread: threading.Thread | None = None

    # ---- control -------------------------------------------------------------
    def _clamp_accept(self, value: float) -> float:
        if not self.cfg.speculative:
            return 1.0
        return max(1.0, min(float(value), float(self.cfg.max_accept_length)))

    @property
    def accept_length(self) -> float:
        if self.forced_accept_length is not None:
            return self.forced_accept_length
        return self.default_accept_length

    def force_accept_length(self, value: float | None) -> float:
        """Set (or with None, reset) the acceptance length; returns the effective value."""
        if value is not None and value < 1.0:
            raise ValueError("accept length must be >= 1.0 (the bonus token is always accepted)")
        self.forced_accept_length = None if value is None else self._clamp_accept(value)
        return self.accept_length

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sim-scheduler", daemon=True)
        self._thread.start()

    def submit(self, req: Request) -> Request:
        with self.cv:
            self.waiting.append(req)
            self.cv.notify()
        return req

    def flush_cache(self) -> bool:
        """Like Scheduler.flush_cache: refuses while requests are queued or running."""
        with self.cv:
            if self.waiting or self.running:
                return False
            self.radix.clear()
            self.total_accepted = 0
            self.total_verify_ct = 0
            return True

    def avg_spec_accept_length(self) -> float | None:
        if not self.cfg.speculative or self.total_verify_ct == 0:
            return None
        return self.total_accepted / self.total_verify_ct

    def load(self) -> tuple[int, int]:
        with self.cv:
            return len(self.running), len(self.waiting)

    # ---- the loop --------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.waiting and not self.running:
                    if self.win_passes:
                        self._refresh_stats()
                    self._set_load_gauges(0, 0)
                    self.cv.wait()
                admit: list[Request] = []
                while self.waiting and len(self.running) + len(admit) < self.cfg.max_running_requests:
                    admit.append(self.waiting.popleft())
                n_waiting = len(self.waiting)
            self._set_load_gauges(len(self.running) + len(admit), n_waiting)
            if self.frozen:  # a hung GPU: requests are admitted and counted, no token comes out
                with self.cv:
                    self.running.extend(admit)
                time.sleep(self.step_seconds)
                continue
            if admit:
                self._prefill(admit)
            else:
                self._verify_pass()

    def _set_load_gauges(self, running: int, waiting: int) -> None:
        if self.metrics is None:
            return
        m = self.metrics
        m.set_sched(m.num_running_reqs, running)
        m.set_sched(m.num_queue_reqs, waiting)
        used = sum(r.prompt_tokens + r.completion_tokens for r in list(self.running))
        m.set_sched(m.num_used_tokens, used)
        m.set_sched(m.token_usage, round(used / self.cfg.max_total_num_tokens, 4))

    def _prefill(self, reqs: list[Request]) -> None:
        total_prompt = sum(r.prompt_tokens for r in reqs)
        cached = 0
        for r in reqs:
            if r.prompt_key and r.prompt_key in self.radix:
                r.cached_tokens = r.prompt_tokens - 1
            elif r.prompt_key and not self.cfg.server_args.get("disable_radix_cache"):
                self.radix.add(r.prompt_key)
            cached += r.cached_tokens
        if self.metrics is not None:
            self.metrics.set_sched(self.metrics.cache_hit_rate, round(cached / total_prompt, 4) if total_prompt else 0)
        chunk = max(1, int(self.cfg.server_args.get("chunked_prefill_size") or 4096))
        time.sleep(self.step_seconds * (1 + (total_prompt - cached) // chunk))
        now = time.monotonic()
        for r in reqs:
            if r.max_new_tokens > 0:
                self._emit(r, 1, now)
            if r.finished:
                self._finish(r, now)
            else:
                self.running.append(r)

    def _verify_pass(self) -> None:
        cfg = self.cfg
        bs = len(self.running)
        padded = cfg.padded_bs(bs)
        if padded is not None and cfg.captured_verify_tokens_per_req != cfg.verify_tokens_per_req:
            self._crash(bs, padded)
        time.sleep(self.step_seconds * (1.0 if padded is not None else self.eager_slowdown))
        now = time.monotonic()
        target = self.accept_length
        accepted_this_pass = 0
        for r in self.running:
            remaining = r.max_new_tokens - r.completion_tokens
            if cfg.speculative:
                r.carry += target
                n = max(1, min(int(r.carry), cfg.max_accept_length))
                r.carry -= n
                n = min(n, remaining)
                r.verify_ct += 1
                accepted_this_pass += n
            else:
                n = min(1, remaining)
            self._emit(r, n, now)
        if cfg.speculative:
            self.total_accepted += accepted_this_pass
            self.total_verify_ct += bs
            self.win_accepted += accepted_this_pass
            self.win_verify_ct += bs
            self.verify_passes += 1
        self.win_passes += 1
        if padded is not None:
            self.graph_passes += 1
        else:
            self.eager_passes += 1
        if self.metrics is not None:
            m = self.metrics
            if cfg.speculative:
                m.inc_sched(m.spec_verify_calls, bs)
            m.set_sched(m.is_cuda_graph, 1 if padded is not None else 0)
            if padded is not None:
                m.inc_sched(m.cuda_graph_passes, 1)
        still = []
        for r in self.running:
            if r.finished:
                self._finish(r, now)
            else:
                still.append(r)
        with self.cv:
            self.running = still
        if self.win_passes >= int(cfg.server_args.get("decode_log_interval") or 40):
            self._refresh_stats(log=True)

    def _emit(self, r: Request, n: int, now: float) -> None:
        if n <= 0:
            return
        prev = r.last_token_time
        r.completion_tokens += n
        r.last_token_time = now
        self.win_gen_tokens += n
        if r.first_token_time is None:
            r.first_token_time = now
            if self.metrics is not None and r.count_in_metrics:
                self.metrics.tok(self.metrics.ttft).observe(now - r.created)
        elif self.metrics is not None and r.count_in_metrics and prev is not None:
            self.metrics.tok(self.metrics.itl).observe((now - prev) / n)
        r.events.put(("tokens", n))

    def _finish(self, r: Request, now: float) -> None:
        r.finished_time = now
        if self.metrics is not None and r.count_in_metrics:
            m = self.metrics
            m.tok(m.prompt_tokens).inc(r.prompt_tokens)
            m.tok(m.generation_tokens).inc(r.completion_tokens)
            m.tok(m.cached_tokens).inc(r.cached_tokens)
            m.tok(m.num_requests).inc()
            m.tok(m.e2e).observe(now - r.created)
        r.done.set()
        r.events.put(("done", None))

    def _refresh_stats(self, log: bool = False) -> None:
        now = time.monotonic()
        elapsed = max(now - self.win_start, 1e-9)
        self.last_gen_throughput = self.win_gen_tokens / elapsed
        accept_len = self.win_accepted / self.win_verify_ct if self.win_verify_ct else None
        if accept_len is not None:
            self.last_accept_length = accept_len
        if self.metrics is not None:
            m = self.metrics
            m.set_sched(m.gen_throughput, round(self.last_gen_throughput, 2))
            if accept_len is not None:
                m.set_sched(m.spec_accept_length, round(accept_len, 4))
                denom = max(1, self.cfg.max_accept_length - 1)
                m.set_sched(m.spec_accept_rate, round((accept_len - 1) / denom, 4))
        if log:
            msg = (f"[TP0] Decode batch, #running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, "
                   f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                   f"cuda graph: {self.cfg.cuda_graph_enabled}")
            if accept_len is not None:
                msg += f", accept len: {accept_len:.2f}"
            logger.info(msg)
        self.win_passes = self.win_accepted = self.win_verify_ct = self.win_gen_tokens = 0
        self.win_start = now

    def _crash(self, bs: int, padded: int) -> None:
        cfg = self.cfg
        try:
            _crash.run_batch(cfg.captured_verify_tokens_per_req, bs, padded, cfg.verify_tokens_per_req)
            tb = "Traceback (most recent call last):\nRuntimeError: graph width mismatch\n"  # not reached
        except RuntimeError:
            tb = traceback.format_exc()
        text = f"[TP0] Scheduler hit an exception: {tb}"
        logger.error(text.rstrip())
        sys.stderr.write(tb)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)
