"""Hold the SGLang SIMULATOR (``ddtree_ops.sim``) to recorded answers of REAL SGLang.

Every recording under ``tests/fixtures/gpu/`` with the layout of
``scripts/gpu-acceptance/capture.sh`` (one folder per server holding ``server_info.body``,
``metrics_*.txt``, ``generate*.json``, the streams, ...) is replayed here: a simulator is
started per recorded server with that server's flags (read back from its recorded
``server_info``: SGLang version, speculative algorithm and sizes, context length, ...), the
requests of ``capture.sh`` are sent to it in the same order, and its answers are compared with
the real ones, per endpoint:

* HTTP status codes, and the header names of the GET endpoints;
* the ``/server_info`` values that follow from the flags (:data:`RESOLVED_VALUES`: speculative
  sizes, overlap scheduler, CUDA-graph lists, ...), and ``/v1/models``' context length;
* JSON key sets and value types (recursively) of ``/server_info`` (also under load),
  ``/get_server_info``, ``/model_info``, ``/get_model_info``, ``/v1/models``, ``/generate``
  (plain and batched, ``meta_info`` included), the non-streamed chat completion;
* SSE framing, chunk kinds in order and each kind's shape, and the ``[DONE]`` terminator of the
  ``/generate``, ``/v1/completions`` and ``/v1/chat/completions`` streams (with usage);
* metric family names, types, label names and histogram buckets of ``/metrics`` idle, under
  load and after (parsed with prometheus_client's text parser);
* ``/health`` timing; the context-length refusal the product's warmup met (``ops_warmup.txt``).

Values that depend on the model (token ids, texts, latencies, counts) are not compared. A
difference is either fixed in the simulator or listed, with its reason, in :data:`INTENTIONAL`
(one table); an unlisted difference fails its test, and so does a listed one that no longer
occurs. Keys and metric families the product reads (:data:`PRODUCT_SERVER_INFO_KEYS`,
:data:`PRODUCT_METRICS`, ...) can never be listed: they must be there, with the right type.
A new recording (say of a newer release) is picked up as it is, keyed by the version its
``server_info`` reports; its differences show up as failures until fixed or listed.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddtree_ops.runtime.exporter import UPSTREAM_FAMILIES
from ddtree_ops.runtime.warmup import long_prompt
from ddtree_ops.sim.server import DEFAULT_HEALTH_SECONDS

REPO = Path(__file__).resolve().parents[1]
GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"
MODELS = REPO / "scripts" / "gpu-acceptance" / "models"
CAPTURE_SH = REPO / "scripts" / "gpu-acceptance" / "capture.sh"

LAYOUT = ("server_info.body", "server_info.code", "health.code", "health_times.txt", "metrics_before.txt",
          "metrics_under_load.txt", "metrics_after.txt", "generate.json", "generate_batch.json",
          "generate_stream.txt", "completions_stream.txt", "chat_stream.txt", "chat.json")
"""Files that make a folder a recorded server (``scripts/gpu-acceptance/capture.sh``)."""

GET_ENDPOINTS = ("health", "health_generate", "model_info", "server_info", "get_server_info", "v1/models",
                 "get_model_info")
"""``capture.sh``'s GET requests, in its order (file names: ``/`` -> ``_``)."""

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "generate": ("/generate", {"text": "The capital of France is",
                               "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}),
    "generate_batch": ("/generate", {"text": ["a b c", "def f(x):"],
                                     "sampling_params": {"max_new_tokens": 16, "temperature": 0.7,
                                                         "ignore_eos": True}}),
    "generate_stream": ("/generate", {"text": "Once upon a time", "stream": True,
                                      "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                          "ignore_eos": True}}),
    "completions_stream": ("/v1/completions", {"model": "tiny-llama", "prompt": "import os", "max_tokens": 24,
                                               "temperature": 0, "stream": True,
                                               "stream_options": {"include_usage": True}}),
    "chat_stream": ("/v1/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 24, "temperature": 0, "stream": True,
                                             "stream_options": {"include_usage": True}}),
    "chat": ("/v1/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 24, "temperature": 0}),
}
"""``capture.sh``'s POST requests before the load, in its order (checked against the script)."""
LOAD = ("/generate", {"text": "x y z", "sampling_params": {"max_new_tokens": 200, "temperature": 0,
                                                           "ignore_eos": True}})
LOAD_REQUESTS = 12
WARMUP_LONG = {"text": long_prompt(1024),
               "sampling_params": {"max_new_tokens": 32, "temperature": 0.7, "ignore_eos": True}}
"""The request of ``ddtree-ops warmup`` (defaults, no plan) that real SGLang refused
(``ops_warmup.txt``: its sampled round at batch size 1 sends the 1024-word prompt)."""

# ------------------------------------------------------------------ what the product reads
PRODUCT_SERVER_INFO_KEYS = frozenset({
    # runtime/drift.py (_SETTINGS), runtime/bench.py (the server summary), sglang/client.py (accept length)
    "speculative_algorithm", "speculative_dflash_block_size", "speculative_num_draft_tokens",
    "speculative_ddtree_budget", "tp_size", "dp_size", "max_running_requests", "disable_cuda_graph",
    "cuda_graph_config", "cuda_graph_config.decode", "cuda_graph_config.decode.bs", "cuda_graph_bs_decode",
    "cuda_graph_bs", "cuda_graph_max_bs", "attention_backend", "page_size", "model_path", "served_model_name",
    "version", "internal_states", "internal_states[]", "internal_states[].avg_spec_accept_length",
})
PRODUCT_RESPONSE_KEYS = frozenset({
    # runtime/warmup.py, runtime/bench.py: /generate meta_info and the OpenAI answers and chunks
    "meta_info", "meta_info.prompt_tokens", "meta_info.completion_tokens", "meta_info.spec_accept_length",
    "meta_info.spec_verify_ct", "text", "choices", "choices[]", "choices[].text", "choices[].delta",
    "choices[].delta.content", "choices[].message", "choices[].message.content", "usage", "usage.prompt_tokens",
    "usage.completion_tokens", "error", "error.message",
})
PRODUCT_METRICS = frozenset(
    {n.removesuffix("_total") for n in UPSTREAM_FAMILIES}  # exporter, health (progress, load)
    | {"sglang:gen_throughput", "sglang:token_usage", "sglang:time_to_first_token_seconds",
       "sglang:inter_token_latency_seconds", "sglang:num_queue_reqs", "sglang:num_running_reqs"}  # monitoring
)

# ------------------------------------------------------------------ the one table of accepted differences
INTENTIONAL: dict[str, str] = {
    # "KIND VERSION/SERVER/ENDPOINT:PATH" (fnmatch; {a,b} lists alternatives) -> why the simulator need not match
    "missing */*/*server_info*:*":
        "ServerArgs fields, scheduler info and internal_states entries of real /server_info that no tool of "
        "ddtree-ops reads (the product's keys are checked apart and cannot be listed here); the simulator "
        "carries the fields its own resolution decides and tests/peer checks them against the real parser",
    "type */*/*server_info*:internal_states[].memory_usage.graph":
        "graph memory: real 0.5.17 reports one figure per captured graph kind, the simulator one total; "
        "nothing reads it",
    "missing */*/*model_info:embedding":
        "0.5.17's description of its embedding / breakable-CUDA-graph runtime; nothing reads it and the "
        "simulator has no embedding models",
    "default */*/health:seconds":
        "a real /health waits at least 1 s (its first poll of the 1-token generation), the simulator "
        "answers in SGLANG_SIM_HEALTH_SECONDS (default 0.05 s) so that tests polling /health stay fast; "
        "set to the recorded time it reproduces SGLang (test_health_timing)",
    "missing */*/metrics:sglang:{kv_*,mamba_*,swa_*,full_token_usage,num_pages,page_size,decode_sum_seq_lens,"
    "new_token_ratio,pending_prealloc_token_usage,weight_memory_usage_gb,"
    "graph_memory_usage_gb,utilization,fwd_occupancy}":
        "KV / mamba / SWA pool and memory figures of the real scheduler; the simulator has no memory pools "
        "and nothing of ddtree-ops reads them (it reads token_usage, which the simulator exports)",
    "missing */*/metrics:sglang:{num_grammar_queue_reqs,num_paused_reqs,num_retracted_reqs,"
    "num_prefill_bootstrap_queue_reqs,num_prefill_inflight_queue_reqs,num_decode_prealloc_queue_reqs,"
    "num_decode_transfer_queue_reqs}":
        "queues the simulator does not have (grammar, retraction, PD disaggregation); nothing reads them",
    "missing */*/metrics:sglang:{routing_key_all_req_count,routing_key_running_req_count,routing_keys_active,"
    "num_unique_running_routing_keys}":
        "routing-key accounting of the real scheduler; nothing reads it",
    "missing */*/metrics:sglang:{http_requests,http_requests_active,http_responses,process_cpu_seconds}":
        "SGLang's HTTP-server and process counters; nothing reads them",
    "missing */*/metrics:sglang:{startup_time_seconds,startup_cuda_graph_time_seconds,"
    "startup_available_gpu_memory_gb}":
        "startup timings and memory of a real load; the simulator's startup is a sleep; nothing reads them",
    "missing */*/metrics:sglang:{per_stage_req_latency_seconds,queue_time_seconds,prompt_tokens_histogram,"
    "generation_tokens_histogram,uncached_prompt_tokens_histogram}":
        "per-request latency and size histograms nothing reads (the dashboard uses time_to_first_token and "
        "inter_token_latency, which the simulator exports)",
    "missing */*/metrics:sglang:{spec_cap_length,spec_block_accept_length}":
        "ragged-verify figures (0 unless SGLANG_RAGGED_VERIFY_MODE is set); nothing reads them",
}


# ------------------------------------------------------------------ recordings
@dataclass(frozen=True)
class Recording:
    """One recorded real server: its folder, version, algorithm, and the simulator's argv/env."""

    path: Path
    info: dict[str, Any]

    @property
    def version(self) -> str:
        return str(self.info["version"])

    @property
    def name(self) -> str:
        # the recording's folder too: two runs of one release must not share a name (replays are keyed by it)
        return f"{self.version}/{self.path.parent.name}/{self.path.name}"

    @property
    def algorithm(self) -> str | None:
        return self.info.get("speculative_algorithm")

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def json(self, name: str) -> Any:
        return json.loads(self.read(name))

    def code(self, name: str) -> tuple[int, float]:
        status, seconds = self.read(f"{name}.code").split()
        return int(status), float(seconds)

    def health_seconds(self) -> list[float]:
        times = [self.code(n)[1] for n in ("health", "health_generate") if (self.path / f"{n}.code").exists()]
        return times + [float(line.split()[1]) for line in self.read("health_times.txt").splitlines() if line]

    def argv(self) -> list[str]:
        """The recorded server's flags, from its resolved args (model directories: the config-only
        copies in ``scripts/gpu-acceptance/models``)."""
        i = self.info
        argv = ["--model-path", _model_dir(i["model_path"])]
        for key in ("attention_backend", "sampling_backend", "decode_log_interval", "served_model_name", "dtype",
                    "context_length", "max_running_requests", "max_total_tokens", "mem_fraction_static",
                    "cuda_graph_max_bs_decode", "cuda_graph_max_bs", "mm_feature_transport", "load_format"):
            if i.get(key) is not None:
                argv += ["--" + key.replace("_", "-"), str(i[key])]
        if i.get("enable_metrics"):
            argv.append("--enable-metrics")
        algo = self.algorithm
        if algo:
            argv += ["--speculative-algorithm", algo,
                     "--speculative-draft-model-path", _model_dir(i["speculative_draft_model_path"])]
            if algo in ("EAGLE", "EAGLE3", "STANDALONE"):
                for key in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
                    argv += ["--" + key.replace("_", "-"), str(i[key])]
            if i.get("speculative_draft_load_format"):
                argv += ["--speculative-draft-load-format", i["speculative_draft_load_format"]]
        return argv

    def env(self) -> dict[str, str]:
        env = {"SGLANG_SIM_VERSION": self.version, "SGLANG_SIM_BUILD": "release",
               "SGLANG_SIM_LOAD_SECONDS": "0.1", "SGLANG_SIM_WARMUP_SECONDS": "0.1",
               "SGLANG_SIM_STEP_SECONDS": "0.005",
               "SGLANG_SIM_HEALTH_SECONDS": f"{statistics.median(self.health_seconds()):.3f}"}
        if self.algorithm:  # acceptance as recorded (DFLASH: SGLANG_SIMULATE_ACC_LEN=3.0 on the real server)
            recorded = self.json("generate.json")["meta_info"].get("spec_accept_length") or 1.0
            env["SGLANG_SIM_ACCEPT_LENGTH"] = f"{max(1.0, recorded):.3f}"
        return env


def _model_dir(recorded: str) -> str:
    local = MODELS / Path(recorded).name
    return str(local) if local.is_dir() else recorded


def recordings() -> list[Recording]:
    """Every recorded server under ``tests/fixtures/gpu/*/``."""
    found = []
    for rec in sorted(p for p in GPU_FIXTURES.iterdir() if p.is_dir()):
        for srv in sorted(p for p in rec.iterdir() if p.is_dir()):
            if all((srv / f).is_file() for f in LAYOUT):
                found.append(Recording(srv, json.loads((srv / "server_info.body").read_text())))
    return found


RECORDINGS = recordings()
IDS = [r.name for r in RECORDINGS]
assert len(set(IDS)) == len(IDS), f"two recorded servers share a name: {IDS}"


# ------------------------------------------------------------------ replay against a simulator
@dataclass
class Answer:
    status: int
    seconds: float
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Replay:
    """The simulator's answers to a recording's requests (names as the recording's files)."""

    answers: dict[str, Answer] = field(default_factory=dict)
    health_times: list[float] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    log: str = ""


def _request(base: str, path: str, body: dict | None = None, timeout: float = 30.0) -> Answer:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, headers = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as exc:
        raw, status, headers = exc.read(), exc.code, exc.headers
    return Answer(status, time.perf_counter() - t0, {k.lower(): v for k, v in headers.items()}, raw)


def _metric(text: str, family: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


class SimProcess:
    def __init__(self, rec: Recording, tmp: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"sim-{rec.path.name}.log"
        env = {**os.environ, **rec.env(), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self._out = open(self.log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "ddtree_ops.sim", *rec.argv(), "--port", str(self.port)],
                                     stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"simulator exited {self.proc.returncode}:\n{self.log.read_text()}"
            try:
                if _request(self.base, "/health", timeout=5).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"simulator not ready in {timeout} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def replay(rec: Recording, tmp: Path) -> Replay:
    """Start a simulator like ``rec``'s server and send it ``capture.sh``'s requests, in its order."""
    sim = SimProcess(rec, tmp)
    out = Replay()
    try:
        sim.wait_ready()
        b = sim.base
        with ThreadPoolExecutor(5) as pool:  # each /health waits; five at once keep the replay short
            health = [pool.submit(_request, b, "/" + p) for p in ("health", "health_generate", "health", "health",
                                                                  "health")]
            for p in GET_ENDPOINTS[2:]:
                out.answers[p.replace("/", "_")] = _request(b, "/" + p)
            answered = [f.result() for f in health]
        out.answers["health"], out.answers["health_generate"] = answered[0], answered[1]
        out.health_times = [a.seconds for a in answered[2:]]
        out.metrics["before"] = _request(b, "/metrics").body.decode()
        metas = []
        for name, (path, body) in REQUESTS.items():
            out.answers[name] = _request(b, path, body)
            if name == "generate_stream":  # the /generate trio: every request that reported spec_verify_ct
                metas += [out.answers["generate"].json()["meta_info"]]
                metas += [x["meta_info"] for x in out.answers["generate_batch"].json()]
                metas += [e["meta_info"] for e in sse_events(out.answers[name].body)[0] if isinstance(e, dict)
                          and e.get("meta_info", {}).get("finish_reason")]
                out.checks["trio_metrics"] = _request(b, "/metrics").body.decode()
                out.checks["trio_metas"] = metas
        load = [threading.Thread(target=_request, args=(b, *LOAD)) for _ in range(LOAD_REQUESTS)]
        for t in load:
            t.start()
        deadline = time.monotonic() + 10  # capture.sh sleeps 1 s; here: until the 12 run (a busy machine)
        while True:
            text = _request(b, "/metrics").body.decode()
            if _metric(text, "sglang:num_running_reqs") >= LOAD_REQUESTS or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        out.metrics["under_load"] = text
        out.answers["server_info_under_load"] = _request(b, "/server_info")
        time.sleep(0.05)
        out.checks["under_load_later"] = _request(b, "/metrics").body.decode()
        for t in load:
            t.join(60)
        out.metrics["after"] = _request(b, "/metrics").body.decode()
        out.answers["ops_warmup"] = _request(b, "/generate", WARMUP_LONG)
    finally:
        sim.stop()
        out.log = sim.log.read_text()
    return out


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Replay]:
    """One simulator per recorded server, all replayed at once (a few seconds in all)."""
    tmp = tmp_path_factory.mktemp("conformance")
    with ThreadPoolExecutor(max(1, len(RECORDINGS))) as pool:
        futures = {r.name: pool.submit(replay, r, tmp) for r in RECORDINGS}
        return {name: f.result() for name, f in futures.items()}


# ------------------------------------------------------------------ differences
@dataclass(frozen=True)
class Diff:
    kind: str  # missing | extra | type | status | header | pattern | frame | labels | buckets | default | value
    where: str  # VERSION/SERVER/ENDPOINT:PATH
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.where}" + (f" ({self.detail})" if self.detail else "")


def _product_path(d: Diff) -> bool:
    """A difference on something the product reads (never listable)."""
    endpoint, _, path = d.where.split("/", 2)[2].partition(":")
    if endpoint == "metrics":
        return path in PRODUCT_METRICS
    if "server_info" in endpoint:
        return path in PRODUCT_SERVER_INFO_KEYS
    path = re.sub(r"^(<\w>|\[\])\.?", "", path)  # a stream chunk's kind, a batch's item
    return path in PRODUCT_RESPONSE_KEYS


def expand(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``abd``, ``acd`` (one brace group)."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if not m:
        return [pattern]
    return [pattern[:m.start()] + alt + pattern[m.end():] for alt in m.group(1).split(",")]


def listed_as(d: Diff) -> str | None:
    """The INTENTIONAL alternative (expanded pattern) that lists ``d`` (None: not listed, or a product key)."""
    if _product_path(d):
        return None
    text = str(d).split(" (", 1)[0]
    return next((alt for key in INTENTIONAL for alt in expand(key) if fnmatch.fnmatchcase(text, alt)), None)


def intentional(d: Diff) -> str | None:
    """The INTENTIONAL key that lists ``d`` (None: not listed, or a product key)."""
    alt = listed_as(d)
    return None if alt is None else next(k for k in INTENTIONAL if alt in expand(k))


def unexplained(diffs: list[Diff]) -> list[str]:
    return [str(d) + ("  <- read by the product: must match" if _product_path(d) else "")
            for d in diffs if intentional(d) is None]


def kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", list: "list", dict: "object"}.get(type(v), type(v).__name__)


def shape_diffs(real: Any, sim: Any, where: str, path: str = "") -> list[Diff]:
    """Key sets and value types of two JSON values, recursively (lists: their first items)."""
    at = f"{where}:{path}"
    if kind_of(real) != kind_of(sim):
        return [Diff("type", at, f"real {kind_of(real)}, simulator {kind_of(sim)}")]
    out: list[Diff] = []
    if isinstance(real, dict):
        for k in sorted(set(real) - set(sim)):
            out.append(Diff("missing", f"{where}:{path}{'.' if path else ''}{k}", f"real {kind_of(real[k])}"))
        for k in sorted(set(sim) - set(real)):
            out.append(Diff("extra", f"{where}:{path}{'.' if path else ''}{k}", f"simulator {kind_of(sim[k])}"))
        for k in sorted(set(real) & set(sim)):
            out += shape_diffs(real[k], sim[k], where, f"{path}{'.' if path else ''}{k}")
    elif isinstance(real, list) and real and sim:
        out += shape_diffs(real[0], sim[0], where, f"{path}[]")
    return out


def sse_events(raw: bytes) -> tuple[list[Any], list[str]]:
    """``data:`` events of an SSE body (``"[DONE]"`` kept as the string) and framing problems."""
    text = raw.decode("utf-8", "replace")
    problems = [] if text.endswith("\n\n") else ["the body does not end with a blank line"]
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        if not block.startswith("data: ") or "\n" in block:
            problems.append(f"not one 'data: ' line: {block[:60]!r}")
            continue
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events, problems


def chunk_kind(stream: str, e: Any, i: int) -> str:
    """One letter per event: ``D`` [DONE], ``E`` error; /generate: ``F`` first, ``M`` more, ``L`` last;
    OpenAI: ``R`` role, ``C`` content, ``L`` with the finish reason, ``U`` usage (no choices)."""
    if e == "[DONE]":
        return "D"
    if "error" in e:
        return "E"
    if stream == "generate_stream":
        return "L" if e["meta_info"].get("finish_reason") else ("F" if i == 0 else "M")
    if not e.get("choices"):
        return "U"
    c = e["choices"][0]
    if c.get("finish_reason"):
        return "L"
    return "R" if "role" in (c.get("delta") or {}) else "C"


def pattern(kinds: list[str]) -> str:
    """Runs of one kind collapsed (``C C C`` -> ``C+``): the order of kinds, not their counts."""
    out: list[str] = []
    for k in kinds:
        if out and out[-1].rstrip("+") == k:
            out[-1] = k + "+"
        else:
            out.append(k)
    return " ".join(out)


def stream_diffs(real_raw: bytes, sim_raw: bytes, stream: str, where: str) -> list[Diff]:
    real, real_problems = sse_events(real_raw)
    sim, sim_problems = sse_events(sim_raw)
    assert not real_problems, real_problems  # the recording itself is well framed
    out = [Diff("frame", f"{where}:", p) for p in sim_problems]
    rk = [chunk_kind(stream, e, i) for i, e in enumerate(real)]
    sk = [chunk_kind(stream, e, i) for i, e in enumerate(sim)]
    if pattern(rk) != pattern(sk):
        out.append(Diff("pattern", f"{where}:", f"real {pattern(rk)!r}, simulator {pattern(sk)!r}"))
    for kind in dict.fromkeys(rk):
        if kind in ("D", "E") or kind not in sk:
            continue
        out += shape_diffs(real[rk.index(kind)], sim[sk.index(kind)], where, f"<{kind}>")
    return out


@dataclass(frozen=True)
class Family:
    type: str
    labels: frozenset[str]
    buckets: frozenset[str]


def families(*texts: str) -> dict[str, Family]:
    """Families with at least one sample over ``texts`` (names as the text parser gives them)."""
    found: dict[str, tuple[str, set[str], set[str]]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if not fam.samples:
                continue
            t, labels, les = found.setdefault(fam.name, (fam.type, set(), set()))
            for s in fam.samples:
                labels |= set(s.labels) - {"le", "quantile"}
                if "le" in s.labels:
                    les.add(s.labels["le"])
    return {n: Family(t, frozenset(lab), frozenset(les)) for n, (t, lab, les) in found.items()}


def metric_diffs(real: dict[str, Family], sim: dict[str, Family], where: str) -> list[Diff]:
    out = [Diff("missing", f"{where}:{n}", real[n].type) for n in sorted(set(real) - set(sim))]
    out += [Diff("extra", f"{where}:{n}", sim[n].type) for n in sorted(set(sim) - set(real))]
    for n in sorted(set(real) & set(sim)):
        r, s = real[n], sim[n]
        if r.type != s.type:
            out.append(Diff("type", f"{where}:{n}", f"real {r.type}, simulator {s.type}"))
        if r.labels != s.labels:
            out.append(Diff("labels", f"{where}:{n}", f"real {sorted(r.labels)}, simulator {sorted(s.labels)}"))
        if r.buckets != s.buckets:
            out.append(Diff("buckets", f"{where}:{n}", f"real {sorted(r.buckets, key=float)}, "
                                                         f"simulator {sorted(s.buckets, key=float)}"))
    return out


ERROR_INPUT = re.compile(r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)\.")


def recorded_warmup_error(rec: Recording) -> tuple[int, Any] | None:
    """(status, body) of the refusal in ``ops_warmup.txt`` (the product's report quotes the answer)."""
    if not (rec.path / "ops_warmup.txt").is_file():
        return None
    text = rec.read("ops_warmup.txt")  # "== warmup", the report's JSON, "rc=1 ..."
    report, _ = json.JSONDecoder().raw_decode(text, text.index("{"))
    detail = report["checks"][0]["detail"]
    m = re.search(r"answered HTTP (\d+): (\{.*\})$", detail)
    assert m, detail
    return int(m.group(1)), json.loads(m.group(2))


@functools.cache
def _recording(name: str) -> Recording:
    return next(r for r in RECORDINGS if r.name == name)


RESOLVED_VALUES = (
    "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_dflash_block_size", "speculative_draft_attention_backend", "speculative_draft_load_format",
    "disable_overlap_schedule", "enable_mixed_chunk", "max_running_requests", "context_length", "max_total_tokens",
    "tp_size", "dp_size", "page_size", "attention_backend", "disable_cuda_graph", "cuda_graph_max_bs_decode",
    "cuda_graph_bs_decode", "cuda_graph_config.decode.backend", "cuda_graph_config.decode.max_bs",
    "cuda_graph_config.decode.bs", "cuda_graph_config.prefill.backend", "mm_feature_transport", "load_format",
    "served_model_name", "enable_metrics", "decode_log_interval", "version",
)
"""``/server_info`` values that follow from the argv, not from the model or the machine: compared as
values (what runtime/drift.py compares is among them)."""

JSON_ANSWERS = {
    "server_info": "server_info.body", "get_server_info": "get_server_info.body", "model_info": "model_info.body",
    "get_model_info": "get_model_info.body", "v1_models": "v1_models.body",
    "server_info_under_load": "server_info_under_load.json", "generate": "generate.json",
    "generate_batch": "generate_batch.json", "chat": "chat.json",
}
"""The JSON answers compared by shape: replay name -> recorded file."""


def all_diffs(rec: Recording, rp: Replay) -> dict[str, list[Diff]]:
    """Every difference between a recording and its replay, by area."""
    w = rec.name
    areas: dict[str, list[Diff]] = {"status": [], "headers": [], "json": [], "values": [], "streams": [],
                                    "metrics": [], "errors": [], "health": []}
    for name in [p.replace("/", "_") for p in GET_ENDPOINTS]:
        if not (rec.path / f"{name}.code").is_file():
            continue
        real_status = rec.code(name)[0]
        if real_status != rp.answers[name].status:
            areas["status"].append(Diff("status", f"{w}/{name}:", f"real {real_status}, "
                                                                  f"simulator {rp.answers[name].status}"))
        real_headers = _header_names(rec.read(f"{name}.headers"))
        sim_headers = set(rp.answers[name].headers) - {"date"}
        areas["headers"] += [Diff("header", f"{w}/{name}:{h}", "real only") for h in sorted(real_headers - sim_headers)]
        areas["headers"] += [Diff("header", f"{w}/{name}:{h}", "simulator only")
                             for h in sorted(sim_headers - real_headers)]
    for name, file in JSON_ANSWERS.items():
        real = rec.json(file)
        sim_answer = rp.answers[name]
        if sim_answer.status != 200:
            areas["status"].append(Diff("status", f"{w}/{name}:", f"real 200, simulator {sim_answer.status}"))
            continue
        areas["json"] += shape_diffs(real, sim_answer.json(), f"{w}/{name}")
    real_info, sim_info = rec.json("server_info.body"), rp.answers["server_info"].json()
    for key in RESOLVED_VALUES:
        real_v, sim_v = _lookup(real_info, key), _lookup(sim_info, key)
        if real_v != sim_v:
            areas["values"].append(Diff("value", f"{w}/server_info:{key}", f"real {real_v!r}, simulator {sim_v!r}"))
    real_model = rec.json("v1_models.body")["data"][0]["max_model_len"]
    if rp.answers["v1_models"].json()["data"][0].get("max_model_len") != real_model:
        areas["values"].append(Diff("value", f"{w}/v1_models:data[].max_model_len", f"real {real_model}"))
    for name in ("generate_stream", "completions_stream", "chat_stream"):
        areas["streams"] += stream_diffs((rec.path / f"{name}.txt").read_bytes(), rp.answers[name].body, name,
                                         f"{w}/{name}")
    real_fams = families(*(rec.read(f"metrics_{s}.txt") for s in ("before", "under_load", "after")))
    sim_fams = families(*rp.metrics.values())
    areas["metrics"] += metric_diffs(real_fams, sim_fams, f"{w}/metrics")
    recorded = recorded_warmup_error(rec)
    if recorded is not None:
        status, body = recorded
        sim = rp.answers["ops_warmup"]
        if sim.status != status:
            areas["errors"].append(Diff("status", f"{w}/ops_warmup:", f"real {status}, simulator {sim.status}"))
        else:
            areas["errors"] += shape_diffs(body, sim.json(), f"{w}/ops_warmup")
    median = statistics.median(rec.health_seconds())
    if abs(DEFAULT_HEALTH_SECONDS - median) > 0.1:
        areas["health"].append(Diff("default", f"{w}/health:seconds",
                                    f"real {median:.2f} s, simulator default {DEFAULT_HEALTH_SECONDS} s"))
    return areas


def _lookup(info: Any, key: str) -> Any:
    for part in key.split("."):
        info = info.get(part, "<absent>") if isinstance(info, dict) else "<absent>"
    return info


def _header_names(raw: str) -> set[str]:
    lines = raw.replace("\r", "").split("\n")[1:]
    return {ln.split(":", 1)[0].strip().lower() for ln in lines if ":" in ln} - {"date"}


@pytest.fixture(scope="module")
def diffs(replays: dict[str, Replay]) -> dict[str, dict[str, list[Diff]]]:
    return {name: all_diffs(_recording(name), rp) for name, rp in replays.items()}


# ------------------------------------------------------------------ the tests
def test_recordings_are_found() -> None:
    assert RECORDINGS, f"no recorded server under {GPU_FIXTURES}"
    versions = {r.version for r in RECORDINGS}
    assert "0.5.17" in versions
    assert {r.algorithm for r in RECORDINGS if r.version == "0.5.17"} == {"EAGLE3", "DFLASH", None}


def test_replayed_requests_are_capture_sh() -> None:
    """The requests replayed here are the ones ``capture.sh`` sent (same bodies, same order)."""
    script = CAPTURE_SH.read_text()
    bodies = [json.loads(b) for b in re.findall(r"-d '(\{.*?\})'", script)]
    assert bodies == [body for _, body in REQUESTS.values()] + [LOAD[1]]
    assert f"seq 1 {LOAD_REQUESTS}" in script
    gets = re.search(r"for p in ([^;]+); do", script)
    assert gets and tuple(gets.group(1).split()) == GET_ENDPOINTS


@pytest.mark.parametrize("area", ["status", "headers", "json", "values", "streams", "metrics", "errors", "health"])
def test_no_unexplained_difference(diffs, area: str) -> None:
    found = [d for per in diffs.values() for d in per[area]]
    bad = unexplained(found)
    assert not bad, f"{len(bad)} {area} difference(s) neither fixed in the simulator nor listed in INTENTIONAL:\n" \
        + "\n".join(bad)


def test_every_intentional_entry_still_applies(diffs) -> None:
    used = {listed_as(d) for per in diffs.values() for ds in per.values() for d in ds}
    stale = sorted({alt for key in INTENTIONAL for alt in expand(key)} - used)
    assert not stale, f"INTENTIONAL lists differences that no longer occur (remove them): {stale}"


def test_product_keys_are_present_with_their_type(diffs) -> None:
    """What the product reads is there with the real type (and label names), whatever INTENTIONAL says."""
    bad = [str(d) for per in diffs.values() for ds in per.values() for d in ds if _product_path(d)]
    assert not bad, "read by ddtree-ops, and differs:\n" + "\n".join(bad)


def test_product_server_info_keys_cover_drift() -> None:
    """Every ``/server_info`` key runtime/drift.py compares is one of PRODUCT_SERVER_INFO_KEYS."""
    from ddtree_ops.runtime import drift

    keys = {k for s in drift._SETTINGS for k in s.keys}
    assert keys <= PRODUCT_SERVER_INFO_KEYS, keys - PRODUCT_SERVER_INFO_KEYS


@pytest.mark.parametrize("rec", RECORDINGS, ids=IDS)
def test_health_timing(rec: Recording, replays) -> None:
    """Real /health and /health_generate take SGLang's 1 s poll (0.5.17 ``health_generate``:
    ``await asyncio.sleep(1)`` before its first look for the 1-token answer); the simulator,
    started with ``SGLANG_SIM_HEALTH_SECONDS`` at the recorded time, answers in that time."""
    recorded = rec.health_seconds()
    median = statistics.median(recorded)
    assert all(abs(t - median) < 0.1 for t in recorded), recorded
    if rec.version == "0.5.17":
        assert 1.0 <= median < 1.05, recorded
    rp = replays[rec.name]
    sim = [rp.answers["health"].seconds, rp.answers["health_generate"].seconds, *rp.health_times]
    assert all(median - 0.02 <= t < median + 0.3 for t in sim), (median, sim)
    assert rp.answers["health"].status == rec.code("health")[0] == 200


@pytest.mark.parametrize("rec", RECORDINGS, ids=IDS)
def test_long_prompt_refused_like_sglang(rec: Recording, replays) -> None:
    """The 1024-word warmup prompt: real SGLang answered 400 'The input (N tokens) is longer than
    the model's context length'; the simulator refuses it too, counting at least as many tokens."""
    recorded = recorded_warmup_error(rec)
    sim = replays[rec.name].answers["ops_warmup"]
    if recorded is None:
        assert sim.status in (200, 400)
        return
    status, body = recorded
    real_m = ERROR_INPUT.fullmatch(body["error"]["message"])
    sim_m = ERROR_INPUT.fullmatch(sim.json()["error"]["message"])
    assert sim.status == status == 400 and real_m and sim_m, (sim.status, sim.body)
    assert sim_m.group(2) == real_m.group(2)  # the same context length
    assert int(sim_m.group(1)) >= int(real_m.group(1)), "the simulator's tokenizer counted fewer tokens than SGLang's"


@pytest.mark.parametrize("rec", RECORDINGS, ids=IDS)
def test_spec_counters_move_as_sglang(rec: Recording, replays) -> None:
    """``spec_verify_calls_total`` moves when a request finishes, by its ``spec_verify_ct`` (so the
    exporter's delta generation tokens / delta verify calls is tokens per verify step);
    ``realtime_tokens_total{mode="decode"}`` moves every forward pass; without speculation there
    is no verify counter, in the recording as in the simulator."""
    rp = replays[rec.name]
    verify = "sglang:spec_verify_calls_total"
    real_has = any(f == "sglang:spec_verify_calls" for f in families(rec.read("metrics_after.txt")))
    sim_has = "sglang:spec_verify_calls" in families(*rp.metrics.values())
    assert real_has == sim_has == bool(rec.algorithm)
    decode_before = _metric(rp.metrics["under_load"], "sglang:realtime_tokens_total", mode="decode")
    decode_later = _metric(rp.checks["under_load_later"], "sglang:realtime_tokens_total", mode="decode")
    assert decode_later > decode_before, "realtime_tokens_total must move while requests decode"
    assert _metric(rp.checks["under_load_later"], "sglang:num_running_reqs") > 0
    if not rec.algorithm:
        return
    finished = (_metric(rp.checks["under_load_later"], "sglang:num_requests_total")
                - _metric(rp.metrics["under_load"], "sglang:num_requests_total"))
    assert finished == 0, "a load request finished between the two scrapes (the 12 run in one batch)"
    assert _metric(rp.checks["under_load_later"], verify) == _metric(rp.metrics["under_load"], verify), \
        "no request finished between the two scrapes: the verify counter must not move"
    delta = _metric(rp.checks["trio_metrics"], verify) - _metric(rp.metrics["before"], verify)
    assert delta == sum(m["spec_verify_ct"] for m in rp.checks["trio_metas"])


# ------------------------------------------------------------------ the comparisons can fail
def test_shape_diffs_find_missing_extra_and_type() -> None:
    real = {"a": 1, "b": {"c": [1.5]}, "d": None}
    sim = {"a": "1", "b": {"c": [2], "x": True}}
    found = {str(d).split(" (")[0] for d in shape_diffs(real, sim, "v/s/e")}
    assert found == {"type v/s/e:a", "type v/s/e:b.c[]", "extra v/s/e:b.x", "missing v/s/e:d"}


def test_stream_diffs_find_framing_order_and_terminator() -> None:
    ok = (b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n'
          b'data: {"choices":[{"text":"","finish_reason":"length"}]}\n\ndata: [DONE]\n\n')
    assert stream_diffs(ok, ok, "completions_stream", "v/s/c") == []
    no_done = ok.rsplit(b"data: [DONE]", 1)[0]
    assert [d.kind for d in stream_diffs(ok, no_done, "completions_stream", "v/s/c")] == ["pattern"]
    bad_frame = ok.replace(b"\n\ndata: [DONE]\n\n", b"\ndata: [DONE]\n")
    assert {d.kind for d in stream_diffs(ok, bad_frame, "completions_stream", "v/s/c")} >= {"frame"}


def test_metric_diffs_find_type_labels_buckets() -> None:
    real = families('# TYPE sglang:x_total counter\nsglang:x_total{a="1",b="2"} 1\n'
                    '# TYPE sglang:h histogram\nsglang:h_bucket{le="1.0"} 1\nsglang:h_bucket{le="+Inf"} 1\n'
                    'sglang:h_count 1\nsglang:h_sum 1\n')
    sim = families('# TYPE sglang:x gauge\nsglang:x{a="1"} 1\n'
                   '# TYPE sglang:h histogram\nsglang:h_bucket{le="2.0"} 1\nsglang:h_bucket{le="+Inf"} 1\n'
                   'sglang:h_count 1\nsglang:h_sum 1\n# TYPE sglang:y gauge\nsglang:y 1\n')
    assert sorted(d.kind for d in metric_diffs(real, sim, "v/s/metrics")) == ["buckets", "extra", "labels", "type"]


def test_unlisted_and_product_differences_are_not_explained() -> None:
    assert unexplained([Diff("extra", "9.9.9/x/server_info:new_key")]) != []
    assert intentional(Diff("missing", "9.9.9/x/server_info:tokenizer_backend")) is not None
    assert intentional(Diff("missing", "9.9.9/x/server_info:speculative_algorithm")) is None  # read by drift
    assert intentional(Diff("missing", "9.9.9/x/metrics:sglang:spec_verify_calls")) is None  # read by the exporter
    assert intentional(Diff("missing", "9.9.9/x/metrics:sglang:kv_used_tokens")) is not None
