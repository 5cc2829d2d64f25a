"""Prometheus metrics of the SGLang SIMULATOR (a test double, NOT SGLang).

Every exposed name is a real ``sglang:`` metric name of SGLang 0.5.13.post1 and 0.5.23
(see ``tests/fixtures/sglang/metric_names-*.txt``). Metrics live on a private
``CollectorRegistry``. As with SGLang's multiprocess collector, no ``*_created`` series
(``server.main`` turns them off process-wide; importing this module changes nothing).

Labels as SGLang: scheduler metrics carry ``model_name``, ``engine_type``, ``tp_rank``,
``pp_rank`` (rank 0 only, unless ``--enable-metrics-for-all-schedulers``: then one series
per TP rank); tokenizer metrics (requests, tokens, latencies) carry ``model_name``.
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

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank")
TOKENIZER_LABELS = ("model_name",)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
               100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0)


class SimMetrics:
    """The sim's ``sglang:`` metrics. Methods are thread-safe (prometheus_client is)."""

    def __init__(self, model_name: str, tp_size: int = 1, all_schedulers: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ranks = range(tp_size) if all_schedulers else range(1)
        self._sched_labels = [
            {"model_name": model_name, "engine_type": "unified", "tp_rank": str(i), "pp_rank": "0"} for i in ranks
        ]
        self._tok_labels = {"model_name": model_name}

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
        self.is_cuda_graph = g("sglang:is_cuda_graph", "Whether the last batch ran with a CUDA graph.")
        self.max_total_num_tokens = g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache.")
        self.spec_verify_calls = Counter("sglang:spec_verify_calls_total",
                                         "The number of verify calls (one per request per verify pass).",
                                         SCHEDULER_LABELS, registry=r)
        self.cuda_graph_passes = Counter("sglang:cuda_graph_passes_total",
                                         "The number of forward passes run with a CUDA graph.",
                                         SCHEDULER_LABELS, registry=r)

        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                                     TOKENIZER_LABELS, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         TOKENIZER_LABELS, registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens_total", "Number of cached prompt tokens.",
                                     TOKENIZER_LABELS, registry=r)
        self.num_requests = Counter("sglang:num_requests_total", "Number of requests processed.",
                                    TOKENIZER_LABELS, registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TOKENIZER_LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             TOKENIZER_LABELS, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             TOKENIZER_LABELS, buckets=E2E_BUCKETS, registry=r)

        # materialize the labelled series so they are exported from the start
        for labels in self._sched_labels:
            for m in (self.num_running_reqs, self.num_queue_reqs, self.num_used_tokens, self.token_usage,
                      self.gen_throughput, self.cache_hit_rate, self.spec_accept_length, self.spec_accept_rate,
                      self.is_cuda_graph, self.max_total_num_tokens, self.spec_verify_calls, self.cuda_graph_passes):
                m.labels(**labels)
        for m in (self.prompt_tokens, self.generation_tokens, self.cached_tokens, self.num_requests,
                  self.ttft, self.itl, self.e2e):
            m.labels(**self._tok_labels)

    # scheduler side -------------------------------------------------------------
    def set_sched(self, gauge: Gauge, value: float) -> None:
        for labels in self._sched_labels:
            gauge.labels(**labels).set(value)

    def inc_sched(self, counter: Counter, amount: float) -> None:
        if amount:
            for labels in self._sched_labels:
                counter.labels(**labels).inc(amount)

    # tokenizer side -------------------------------------------------------------
    def tok(self, metric):  # returns the labelled child
        return metric.labels(**self._tok_labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
