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
passes and when the batch drains; ``/flush_cache`` resets the lifetime counters. Every
forward pass moves ``realtime_tokens_total`` (prefill: computed and cached prompt tokens;
decode: the tokens the pass accepted) and ``cuda_graph_passes_total{mode}``; a finished
request adds its tokens to the tokenizer-side counters and its verify steps
(``meta_info.spec_verify_ct``) to ``spec_verify_calls_total``, as SGLang 0.5.17 does
(``observe_one_finished_request``).

Prompts are counted by :func:`count_tokens` (UTF-8 bytes, not words); the radix cache shares
prompt prefixes (:meth:`Engine._cached_prefix_tokens`).
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


RADIX_PROMPTS = 256
"""Prompts the simulated radix cache holds before it starts over."""
BYTES_PER_TOKEN = 3
"""UTF-8 bytes per token of the sim's tokenizer (see :func:`count_tokens`)."""


def count_tokens(text: str) -> int:
    """Prompt tokens of ``text``: ``1 + ceil(utf8_bytes / 3)`` (a BOS token and one token per
    3 bytes), a stand-in for a byte-level BPE tokenizer.

    Calibrated on the 4096-token byte-level BPE of the tiny Llama the real-SGLang fixtures were
    recorded with (``scripts/gpu-acceptance/models/tiny-llama``): on English prose it makes one
    token of 3.1 bytes (the 1024-word warmup prompt of ``ddtree_ops.runtime.warmup.long_prompt``:
    6521 bytes, 2085 real tokens, 2175 here), so the count is at least the real one on prose;
    tokenizers with larger vocabularies (Llama 3, Qwen: ~4 bytes a token on English) make fewer
    tokens still. Short strings, code and markup can make more real tokens than this count
    (a small vocabulary splits them finer): it is no exact tokenizer, only never fewer tokens
    on English text. Whitespace-separated words are NOT tokens: real tokenizers make about
    two of each English word here.
    """
    return 1 + -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def filler_text(start: int, n: int) -> str:
    """``n`` filler words, continuing at word index ``start``."""
    return "".join(" " + FILLER[(start + i) % len(FILLER)] for i in range(n))


def filler_ids(start: int, n: int) -> list[int]:
    """Token ids of :func:`filler_text` (one id a filler word; ``output_ids`` of ``/generate``)."""
    return [100 + (start + i) % len(FILLER) for i in range(n)]


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
    streaming: bool = False
    cached_tokens: int = 0
    completion_tokens: int = 0
    verify_ct: int = 0
    proposed_per_verify: int = 0
    correct_drafts_histogram: list[int] = field(default_factory=list)
    carry: float = 0.0
    received_ts: float = field(default_factory=time.time)
    prefill_ts: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    finished_ts: float | None = None
    count_in_metrics: bool = True

    @property
    def finished(self) -> bool:
        return self.completion_tokens >= self.max_new_tokens

    def count_verify(self, accepted: int) -> None:
        """One verify step of this request that accepted ``accepted`` tokens (bonus included)."""
        self.verify_ct += 1
        correct = max(0, accepted - 1)
        hist = self.correct_drafts_histogram
        hist.extend([0] * (correct + 1 - len(hist)))
        hist[correct] += 1

    def meta_info(self, speculative: bool, final: bool | None = None, first_chunk: bool = False) -> dict[str, Any]:
        """``meta_info`` with SGLang 0.5.17's keys. A stream's chunks before the last one
        (``final`` False) carry only the request's progress (the first one also
        ``response_sent_to_client_ts``); the last one, and a non-streamed answer, add the
        latencies, timestamps and (with speculation, after a verify step) the ``spec_*`` figures."""
        final = self.done.is_set() if final is None else final
        now = time.time()
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": self.completion_tokens} if final else None,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "forward_entry_time": self.received_ts,
            "prefill_finished_time": self.prefill_ts,
            "queue_time": 0.0,
            "reasoning_tokens": 0,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_tokens_details": {"device": self.cached_tokens, "host": 0} if self.cached_tokens else None,
            "dp_rank": None,
        }
        if first_chunk:
            meta["response_sent_to_client_ts"] = now
        if not final:
            return meta
        end = self.finished_time or time.monotonic()
        meta["e2e_latency"] = round(end - self.created, 6)
        if speculative and self.verify_ct > 0:
            correct = sum(i * n for i, n in enumerate(self.correct_drafts_histogram))
            proposed = self.verify_ct * self.proposed_per_verify
            if proposed > 0:
                meta.update({
                    "spec_accept_rate": correct / proposed,
                    "spec_accept_length": self.completion_tokens / self.verify_ct,
                    "spec_num_correct_drafts": correct,
                    "spec_num_proposed_drafts": proposed,
                    "spec_verify_ct": self.verify_ct,
                    "spec_accepted_drafts": correct,
                    "spec_proposed_drafts": proposed,
                })
            if self.correct_drafts_histogram:
                meta["spec_correct_drafts_histogram"] = list(self.correct_drafts_histogram)
                meta["spec_accept_histogram"] = list(self.correct_drafts_histogram)
        decode_s = end - (self.first_token_time or end)
        meta.update({
            "request_received_ts": self.received_ts,
            "api_server_dispatch_finish_ts": self.received_ts,
            "request_finished_ts": self.finished_ts or now,
            "decode_throughput": (self.completion_tokens - 1) / decode_s if decode_s > 0 else 0.0,
            "response_sent_to_client_ts": now,
        })
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
        if self.cfg.speculative:
            ndt = self.cfg.server_args.get("speculative_num_draft_tokens")
            # SGLang: proposed drafts per verify step = speculative_num_draft_tokens - 1
            req.proposed_per_verify = max(0, int(ndt or self.cfg.verify_tokens_per_req) - 1)
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

    def _cached_prefix_tokens(self, key: str) -> int:
        """The radix cache: tokens of the longest prefix ``key`` shares with a cached prompt: the
        BOS token every prompt starts with, and B // 3 tokens of B shared bytes; one less with
        EAGLE, whose draft keeps the last one (as the recorded 0.5.17: 5 and 4 tokens of "The
        capital of France is" after the warmup's "The capital city of France is")."""
        if not self.radix:
            return 0
        if len(self.radix) > RADIX_PROMPTS:
            self.radix.clear()  # "evicted"
        best = 0
        for other in self.radix:
            if other[:1] == key[:1] and len(other) > best:
                best = max(best, len(os.path.commonprefix([key, other]).encode("utf-8")))
        eagle = 1 if self.cfg.algorithm in ("EAGLE", "EAGLE3") else 0
        return max(0, 1 + best // BYTES_PER_TOKEN - eagle)

    def _prefill_graph_max_tokens(self) -> int:
        """Largest prefill (tokens) run with a prefill CUDA graph; 0 without prefill graphs."""
        sa = self.cfg.server_args
        prefill = (sa.get("cuda_graph_config") or {}).get("prefill") or {}
        if prefill.get("backend") in (None, "disabled") or sa.get("disable_cuda_graph") \
                or sa.get("disable_prefill_cuda_graph"):
            return 0
        return int(prefill.get("max_bs") or 0)

    def _prefill(self, reqs: list[Request]) -> None:
        total_prompt = sum(r.prompt_tokens for r in reqs)
        cached = 0
        for r in reqs:
            if r.prompt_key and not self.cfg.server_args.get("disable_radix_cache"):
                r.cached_tokens = min(r.prompt_tokens - 1, self._cached_prefix_tokens(r.prompt_key))
                self.radix.add(r.prompt_key)
            cached += r.cached_tokens
        computed = total_prompt - cached
        if self.metrics is not None:
            m = self.metrics
            m.set_sched(m.cache_hit_rate, round(cached / total_prompt, 4) if total_prompt else 0)
            # SGLang's report_prefill_stats: one pass counted per prefill batch, its tokens by mode
            graph = 0 < computed <= self._prefill_graph_max_tokens()
            m.inc_sched(m.cuda_graph_passes, 1, mode="prefill_cuda_graph" if graph else "prefill_none")
            m.inc_sched(m.realtime_tokens, computed, mode="prefill_compute")
            m.inc_sched(m.realtime_tokens, cached, mode="prefill_cache")
        chunk = max(1, int(self.cfg.server_args.get("chunked_prefill_size") or 4096))
        time.sleep(self.step_seconds * (1 + computed // chunk))
        now = time.monotonic()
        wall = time.time()
        for r in reqs:
            r.prefill_ts = wall
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
        emitted = 0
        for r in self.running:
            remaining = r.max_new_tokens - r.completion_tokens
            if cfg.speculative:
                r.carry += target
                n = max(1, min(int(r.carry), cfg.max_accept_length))
                r.carry -= n
                n = min(n, remaining)
                r.count_verify(n)
                accepted_this_pass += n
            else:
                n = min(1, remaining)
            emitted += max(0, n)
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
            # SGLang: every decode pass moves realtime_tokens_total{mode="decode"} (batch size +
            # correct drafts) and cuda_graph_passes_total; spec_verify_calls_total moves only when
            # a request finishes (_finish)
            m = self.metrics
            m.inc_sched(m.realtime_tokens, emitted, mode="decode")
            m.set_sched(m.is_cuda_graph, 1 if padded is not None else 0)
            m.inc_sched(m.cuda_graph_passes, 1, mode="decode_cuda_graph" if padded is not None else "decode_none")
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
                m = self.metrics
                m.tok(m.ttft, **m.streaming(r.streaming)).observe(now - r.created)
        elif self.metrics is not None and r.count_in_metrics and prev is not None:
            self.metrics.tok(self.metrics.itl).observe((now - prev) / n)
        r.events.put(("tokens", n))

    def _finish(self, r: Request, now: float) -> None:
        r.finished_time = now
        r.finished_ts = time.time()
        if self.metrics is not None and r.count_in_metrics:
            # SGLang's observe_one_finished_request (tokenizer side): the request's tokens, and its
            # verify steps added once to spec_verify_calls_total
            m = self.metrics
            streaming = m.streaming(r.streaming)
            m.tok(m.prompt_tokens, **streaming).inc(r.prompt_tokens)
            m.tok(m.generation_tokens, **streaming).inc(r.completion_tokens)
            if r.cached_tokens > 0:
                m.tok(m.cached_tokens, cache_source="device").inc(r.cached_tokens)
            if m.spec_verify_calls is not None and r.verify_ct > 0:
                m.tok(m.spec_verify_calls).inc(r.verify_ct)
            m.tok(m.num_requests, **streaming).inc()
            m.tok(m.e2e, **streaming).observe(now - r.created)
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
