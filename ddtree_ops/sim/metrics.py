"""Prometheus metrics of the SGLang SIMULATOR (a test double, NOT SGLang).

Every exposed name is a real ``sglang:`` metric name of SGLang 0.5.13.post1 and 0.5.23
(see ``tests/fixtures/sglang/metric_names-*.txt``); types, label names and histogram
buckets are those a real SGLang 0.5.17 server exported (``tests/fixtures/gpu/``, held by
``tests/test_sim_conformance.py``). Metrics live on a private ``CollectorRegistry``. As with
SGLang's multiprocess collector, no ``*_created`` series (``server.main`` turns them off
process-wide; importing this module changes nothing), and a labelled counter or histogram
shows up only once something was counted in it.

Labels as SGLang 0.5.17:

* scheduler metrics (gauges, ``cuda_graph_passes_total{mode}``, ``realtime_tokens_total{mode}``):
  ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (rank 0 only,
  unless ``--enable-metrics-for-all-schedulers``: then one series per TP rank);
* tokenizer metrics: ``model_name``, ``engine_type``, plus ``is_streaming`` on the token
  and request counters, time to first token and end-to-end latency (not in 0.5.13.post1,
  which has no such label), and ``cache_source``
  on ``cached_tokens_total``. ``spec_verify_calls_total`` (tokenizer side, counted when a
  request finishes) exists only with speculative decoding, as in SGLang.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

ENGINE_TYPE = "unified"
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")

# SGLang 0.5.17's default buckets (metrics_collector.py; as exported by the recorded server)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               600.0, 1200.0, 1800.0, 2400.0)


class SimMetrics:
    """The sim's ``sglang:`` metrics. Methods are thread-safe (prometheus_client is)."""

    def __init__(self, model_name: str, tp_size: int = 1, all_schedulers: bool = False,
                 speculative: bool = True, is_streaming_label: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ranks = range(tp_size) if all_schedulers else range(1)
        self._sched_labels = [
            {"model_name": model_name, "engine_type": ENGINE_TYPE, "tp_rank": str(i), "pp_rank": "0",
             "moe_ep_rank": "0"} for i in ranks
        ]
        self._tok_labels = {"model_name": model_name, "engine_type": ENGINE_TYPE}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, SCHEDULER_LABELS, registry=r)

        self.num_running_reqs = g("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = g("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = g("sglang:token_usage", "The token usage.")
        self.gen_throughput = g("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = g("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.spec_accept_length = g(
            "sglang:spec_accept_length", "The average acceptance length of speculative decoding."
        )
        self.spec_accept_rate = g("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
                                  "(accepted draft tokens / proposed draft tokens).")
        self.spec_num_steps = g("sglang:spec_num_steps", "The number of speculative decoding steps.")
        self.spec_num_draft_tokens = g("sglang:spec_num_draft_tokens", "The number of speculative draft tokens.")
        self.is_cuda_graph = g("sglang:is_cuda_graph", "Whether the batch is using CUDA graph.")
        self.max_total_num_tokens = g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache.")
        self.context_len = g("sglang:context_len", "The context length of the model.")
        self.cuda_graph_passes = Counter("sglang:cuda_graph_passes_total",
                                         "Total number of forward passes categorized by CUDA graph.",
                                         (*SCHEDULER_LABELS, "mode"), registry=r)
        self.realtime_tokens = Counter("sglang:realtime_tokens_total",
                                       "Total number of tokens processed (updated on each log interval). "
                                       "mode: prefill_compute, prefill_cache, decode.",
                                       (*SCHEDULER_LABELS, "mode"), registry=r)

        # 0.5.17 and 0.5.23 split these by is_streaming; 0.5.13.post1 does not
        self._is_streaming_label = is_streaming_label
        streaming = (*TOKENIZER_LABELS, "is_streaming") if is_streaming_label else TOKENIZER_LABELS
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                                     streaming, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         streaming, registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens_total", "Number of cached prompt tokens.",
                                     (*TOKENIZER_LABELS, "cache_source"), registry=r)
        self.num_requests = Counter("sglang:num_requests_total", "Number of requests processed.",
                                    streaming, registry=r)
        self.spec_verify_calls = (
            Counter("sglang:spec_verify_calls_total", "Number of speculative decoding verification calls.",
                    TOKENIZER_LABELS, registry=r) if speculative else None
        )
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              streaming, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             TOKENIZER_LABELS, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             streaming, buckets=E2E_BUCKETS, registry=r)

        # the scheduler's gauges are exported from the start (SGLang logs its stats at startup)
        for labels in self._sched_labels:
            for m in (self.num_running_reqs, self.num_queue_reqs, self.num_used_tokens, self.token_usage,
                      self.gen_throughput, self.cache_hit_rate, self.spec_accept_length, self.spec_accept_rate,
                      self.spec_num_steps, self.spec_num_draft_tokens, self.is_cuda_graph,
                      self.max_total_num_tokens, self.context_len):
                m.labels(**labels)

    # scheduler side -------------------------------------------------------------
    def set_sched(self, gauge: Gauge, value: float) -> None:
        for labels in self._sched_labels:
            gauge.labels(**labels).set(value)

    def inc_sched(self, counter: Counter, amount: float, **extra: str) -> None:
        """Add ``amount`` (nothing when 0: a series appears with its first count, as in SGLang)."""
        if amount:
            for labels in self._sched_labels:
                counter.labels(**labels, **extra).inc(amount)

    # tokenizer side -------------------------------------------------------------
    def tok(self, metric, **extra: str):  # returns the labelled child
        return metric.labels(**self._tok_labels, **extra)

    def streaming(self, streaming: bool) -> dict[str, str]:
        """The ``is_streaming`` label of a request's tokenizer metrics (none where the version has none)."""
        return {"is_streaming": "true" if streaming else "false"} if self._is_streaming_label else {}

    def render(self) -> bytes:
        return generate_latest(self.registry)
