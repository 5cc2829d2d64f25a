"""Tests of the SGLang SIMULATOR (``ddtree_ops.sim``), the test double that stands in for
SGLang on hosts without GPUs. They check it against the real SGLang facts in
``tests/fixtures/sglang`` (metric names, resolved server args), not against our own
planning code."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ddtree_ops.sim.args import SimArgumentError, parse_args, spec_capture_bs

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "sglang"

DDTREE_8_32 = [
    "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "models/draft",
    "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget", "32",
]
SIZE_MISMATCH = (
    "RuntimeError: The size of tensor a (8) must match the size of tensor b (33) at non-singleton dimension 0"
)


# ---------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: object | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> dict:
    status, body = http("GET", url)
    assert status == 200, (status, body)
    return json.loads(body)


def post_json(url: str, body: object) -> object:
    status, raw = http("POST", url, body)
    assert status == 200, (status, raw)
    return json.loads(raw)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Sim:
    """A simulator subprocess on a free loopback port; output goes to a file."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None,
                 load: float = 0.3, warmup: float = 0.3) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"sim-{self.port}.log"
        full_env = {**os.environ, "SGLANG_SIM_LOAD_SECONDS": str(load), "SGLANG_SIM_WARMUP_SECONDS": str(warmup),
                    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        full_env.update(env or {})
        self._out = open(self.log, "w")  # noqa: SIM115
        if "--nccl-port" in args:  # a rendered argv's fixed rendezvous port: tests run several sims at once
            args = list(args)
            args[args.index("--nccl-port") + 1] = str(free_port())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddtree_ops.sim", "--model-path", "models/target", "--port", str(self.port), *args],
            stdout=self._out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO,
        )

    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sim exited {self.proc.returncode}:\n{self.output()}"
            if port_open(self.port) and http("GET", self.base + "/health")[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"sim not ready in {timeout}s:\n{self.output()}")

    def wait_exit(self, timeout: float = 10.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def fixture_metric_names(version: str) -> set[str]:
    return set((FIXTURES / f"metric_names-{version}.txt").read_text().split())


def exposed_metric_names(text: str) -> set[str]:
    """Family names as SGLang's source spells them (counters with _total)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, _kind = line.split()
            names.add(name)
    return names


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


# ---------------------------------------------------------------- argv (in process)
def _parse_fails(argv: list[str], version: str, build: str = "ddtree") -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "m", *argv], version=version, build=build)
    assert exc.value.code == 2


def test_resolution_matches_real_0_5_23_fixture() -> None:
    fixture = json.loads((FIXTURES / "resolved_server_args-0.5.23-eagle-tp8.json").read_text())
    argv = ("--model-path models/qwen3-tiny --speculative-algorithm EAGLE --speculative-draft-model-path "
            "models/eagle-tiny --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
            "--tp-size 8 --cuda-graph-max-bs-decode 16 --device cuda").split()
    cfg = parse_args(argv, version="0.5.23", build="release")
    assert set(cfg.server_args) <= set(fixture), set(cfg.server_args) - set(fixture)
    # resolved there without a GPU: memory, and mm_feature_transport (cpu without CUDA; the
    # simulator stands for a CUDA host: cuda_ipc)
    machine_dependent = {"mem_fraction_static", "random_seed", "mm_feature_transport"}
    diff = {k: (v, fixture[k]) for k, v in cfg.server_args.items() if fixture[k] != v and k not in machine_dependent}
    assert diff == {}
    assert cfg.capture_bs == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
    assert cfg.server_args["max_running_requests"] == 48


def test_capture_list_and_silent_rewrites() -> None:
    assert spec_capture_bs(48) == [*range(1, 9), *range(10, 33, 2), 40, 44, 48]
    cfg = parse_args(["--model-path", "m", *DDTREE_8_32, "--speculative-num-steps", "4"], version="0.5.23")
    sa = cfg.server_args
    assert (sa["speculative_num_steps"], sa["speculative_eagle_topk"], sa["max_running_requests"]) == (1, 1, 48)
    assert (cfg.verify_tokens_per_req, cfg.draft_tokens_per_req, cfg.captured_verify_tokens_per_req) == (33, 8, 33)
    cfg = parse_args(["--model-path", "m", *DDTREE_8_32], version="0.5.13", build="ddtree-unpatched")
    assert (cfg.verify_tokens_per_req, cfg.captured_verify_tokens_per_req) == (33, 8)
    cfg = parse_args(["--model-path", "m", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "d",
                      "--speculative-num-draft-tokens", "8"], version="0.5.23")
    assert cfg.budget == 7 and cfg.verify_tokens_per_req == 8
    cfg = parse_args(["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                      "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"], version="0.5.23")
    assert cfg.server_args["speculative_num_draft_tokens"] == 4
    with pytest.raises(ValueError, match="window"):
        parse_args(["--model-path", "m", *DDTREE_8_32, "--speculative-draft-window-size", "4"], version="0.5.23")


def test_graph_flag_dialects() -> None:
    legacy = parse_args(["--model-path", "m", "--cuda-graph-max-bs", "8"], version="0.5.13.post1")
    assert legacy.server_args["cuda_graph_max_bs"] == 8 and "cuda_graph_max_bs_decode" not in legacy.server_args
    _parse_fails(["--cuda-graph-max-bs-decode", "8"], "0.5.13")
    both = parse_args(["--model-path", "m", "--cuda-graph-max-bs", "8", "--cuda-graph-bs", "1", "2", "4"],
                      version="0.5.16")
    assert both.server_args["cuda_graph_max_bs_decode"] == 4 and both.server_args["cuda_graph_bs_decode"] == [1, 2, 4]
    new = parse_args(["--model-path", "m", "--cuda-graph-max-bs-decode=8"], version="0.5.16")
    assert new.server_args["cuda_graph_max_bs_decode"] == 8
    _parse_fails(["--cuda-graph-max-bs", "8"], "0.5.23")
    _parse_fails(["--cuda-graph-bs=8"], "0.5.23")
    _parse_fails(["--speculative-ddtree-budget", "8"], "0.5.23", build="release")
    with pytest.raises(SimArgumentError, match="Unknown speculative algorithm name: DDTREE"):
        parse_args(["--model-path", "m", "--speculative-algorithm", "DDTREE"], version="0.5.23", build="release")
    for version in ("0.5.13", "0.5.16", "0.5.23"):
        assert parse_args(["--model-path", "m", "--disable-cuda-graph"], version=version).capture_bs == []


def test_cli_errors_like_sglang(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "ddtree_ops.sim", "--model-path", "m"]
    r = subprocess.run([*cmd, "--speculative-ddtree-budget", "8"], env={**env, "SGLANG_SIM_BUILD": "release"},
                       capture_output=True, text=True, timeout=20, check=False)
    assert r.returncode == 2 and "error: unrecognized arguments: --speculative-ddtree-budget 8" in r.stderr
    r = subprocess.run([*cmd, "--cuda-graph-max-bs", "8"], env={**env, "SGLANG_SIM_VERSION": "0.5.23"},
                       capture_output=True, text=True, timeout=20, check=False)
    assert r.returncode == 2 and "ambiguous option: --cuda-graph-max-bs" in r.stderr


# ---------------------------------------------------------------- a DDTree server, start to stop
@pytest.fixture(scope="module")
def ddtree_sim(tmp_path_factory: pytest.TempPathFactory):
    sim = Sim(tmp_path_factory.mktemp("sim"),
              [*DDTREE_8_32, "--enable-metrics", "--cuda-graph-max-bs-decode", "16"],
              load=1.0, warmup=1.0)
    seen = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert sim.proc.poll() is None, sim.output()
        if not port_open(sim.port):
            state = "closed"
        else:
            state = str(http("GET", sim.base + "/health")[0])
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == "200":
            break
        time.sleep(0.05)
    sim.phases = seen
    yield sim
    sim.stop()


def test_startup_phases(ddtree_sim: Sim) -> None:
    assert ddtree_sim.phases == ["closed", "503", "200"]
    out = ddtree_sim.output()
    assert "TEST DOUBLE" in out
    for line in ("Load weight end", "Capture cuda graph bs [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]",
                 "The server is fired up and ready to roll!"):
        assert line in out


def test_server_info(ddtree_sim: Sim) -> None:
    for path in ("/server_info", "/get_server_info"):
        info = get_json(ddtree_sim.base + path)
        assert info["speculative_algorithm"] == "DDTREE"
        assert info["speculative_num_draft_tokens"] == 8 and info["speculative_dflash_block_size"] == 8
        assert info["speculative_ddtree_budget"] == 32
        assert (info["speculative_num_steps"], info["speculative_eagle_topk"]) == (1, 1)
        assert info["cuda_graph_max_bs_decode"] == 16 and info["disable_cuda_graph"] is False
        assert info["max_running_requests"] == 48 and info["port"] == ddtree_sim.port
        assert info["version"] == "0.5.23"
        states = info["internal_states"]
        assert len(states) == 1 and states[0]["avg_spec_accept_length"] > 1.0  # the warmup verified
    assert get_json(ddtree_sim.base + "/model_info")["is_generation"] is True
    models = get_json(ddtree_sim.base + "/v1/models")
    assert models["object"] == "list" and models["data"][0]["id"] == "models/target"


def test_generate_single_and_batch(ddtree_sim: Sim) -> None:
    one = post_json(ddtree_sim.base + "/generate",
                    {"text": "the capital of France is", "sampling_params": {"max_new_tokens": 40}})
    meta = one["meta_info"]
    # the sim's byte-level stand-in tokenizer: a BOS token + one token per 3 UTF-8 bytes
    assert meta["completion_tokens"] == 40 and meta["prompt_tokens"] == 1 + 8
    assert meta["finish_reason"] == {"type": "length", "length": 40}
    assert meta["spec_verify_ct"] > 0 and 3.0 < meta["spec_accept_length"] <= 8.0
    assert len(one["text"].split()) == 40
    many = post_json(ddtree_sim.base + "/generate",
                     {"text": ["a b", "c d e", "f"], "sampling_params": {"max_new_tokens": 16}})
    assert isinstance(many, list) and [m["meta_info"]["prompt_tokens"] for m in many] == [2, 3, 2]
    chat = post_json(ddtree_sim.base + "/v1/chat/completions",
                     {"model": "models/target", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5})
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 5
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert http("POST", ddtree_sim.base + "/flush_cache")[0] == 200


@pytest.mark.parametrize("path, raw", [
    ("/generate", b"[1, 2]"), ("/generate", b'{"text": 5}'), ("/generate", b'{"text": ["a", 5]}'),
    ("/generate", b'{"text": "a", "sampling_params": "x"}'), ("/v1/chat/completions", b'{"messages": [5]}'),
    ("/v1/completions", b'{"prompt": {"a": 1}}'), ("/v1/completions", b'{"prompt": 5}'),
    ("/_sim/fault", b'{"health_503": 1e400}'), ("/_sim/fault", b"[1]"),
])
def test_odd_request_bodies_get_400_not_a_dropped_connection(ddtree_sim: Sim, path: str, raw: bytes) -> None:
    """Non-object bodies and wrongly typed fields answer 400 with a message; the handler thread
    used to die with AttributeError/OverflowError (connection closed, traceback in the log)."""
    req = urllib.request.Request(ddtree_sim.base + path, data=raw, method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 400 and "message" in json.loads(exc.value.read())["error"]
    assert "Traceback" not in ddtree_sim.output()


def test_metrics_are_real_sglang_names(ddtree_sim: Sim) -> None:
    post_json(ddtree_sim.base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 8}})
    status, raw = http("GET", ddtree_sim.base + "/metrics")
    assert status == 200
    text = raw.decode()
    names = exposed_metric_names(text)
    wanted = {
        "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput", "sglang:num_running_reqs",
        "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate", "sglang:generation_tokens_total",
        "sglang:prompt_tokens_total", "sglang:num_requests_total", "sglang:spec_verify_calls_total",
        "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
    }
    assert wanted <= names
    assert names <= fixture_metric_names("0.5.23"), names - fixture_metric_names("0.5.23")
    assert names <= fixture_metric_names("0.5.13.post1")
    assert 'model_name="models/target"' in text and 'tp_rank="0"' in text and 'tp_rank="1"' not in text
    assert "_created" not in text
    assert metric_value(text, "sglang:num_requests_total") >= 2


# ---------------------------------------------------------------- accept length control, SIGTERM
def test_forced_accept_length_and_sigterm(tmp_path: Path) -> None:
    sim = Sim(tmp_path, [*DDTREE_8_32, "--enable-metrics", "--skip-server-warmup"], load=0.2)
    try:
        sim.wait_ready()
        assert "avg_spec_accept_length" not in get_json(sim.base + "/server_info")["internal_states"][0]
        assert post_json(sim.base + "/_sim/accept_length", {"value": 1.0})["accept_length"] == 1.0
        post_json(sim.base + "/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 30}})
        info = get_json(sim.base + "/server_info")
        assert info["internal_states"][0]["avg_spec_accept_length"] == 1.0
        text = http("GET", sim.base + "/metrics")[1].decode()
        assert metric_value(text, "sglang:spec_accept_length") == 1.0
        assert metric_value(text, "sglang:spec_accept_rate") == 0.0
        assert get_json(sim.base + "/_sim/state")["accept_length_forced"] is True
        post_json(sim.base + "/_sim/accept_length", {"value": 7.0})
        post_json(sim.base + "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 71}})
        text = http("GET", sim.base + "/metrics")[1].decode()
        assert metric_value(text, "sglang:spec_accept_length") == 7.0
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.wait_exit(5) == 0
    finally:
        sim.stop()


# ---------------------------------------------------------------- the graph-size crash
def test_unpatched_ddtree_dies_in_warmup(tmp_path: Path) -> None:
    sim = Sim(tmp_path, DDTREE_8_32, env={"SGLANG_SIM_BUILD": "ddtree-unpatched", "SGLANG_SIM_VERSION": "0.5.13"},
              load=0.2)
    rc = sim.wait_exit(15)
    out = sim.output()
    assert rc != 0
    assert SIZE_MISMATCH in out
    assert "The server is fired up" not in out


def test_unpatched_ddtree_serves_without_graphs(tmp_path: Path) -> None:
    sim = Sim(tmp_path, [*DDTREE_8_32, "--disable-cuda-graph"],
              env={"SGLANG_SIM_BUILD": "ddtree-unpatched", "SGLANG_SIM_VERSION": "0.5.13"}, load=0.2, warmup=0.1)
    try:
        sim.wait_ready()
        out = post_json(sim.base + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 12}})
        assert out["meta_info"]["completion_tokens"] == 12
        assert get_json(sim.base + "/server_info")["cuda_graph_bs"] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16,
                                                                         18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48]
    finally:
        sim.stop()


def test_unpatched_ddtree_large_batch_eager_then_crash(tmp_path: Path) -> None:
    sim = Sim(tmp_path, [*DDTREE_8_32, "--skip-server-warmup", "--cuda-graph-max-bs", "2"],
              env={"SGLANG_SIM_BUILD": "ddtree-unpatched", "SGLANG_SIM_VERSION": "0.5.13"}, load=0.2)
    try:
        sim.wait_ready()
        # 4 requests in one batch: larger than the largest captured bs (2) -> eager, no crash
        outs = post_json(
            sim.base + "/generate", {"text": ["a", "b", "c", "d"], "sampling_params": {"max_new_tokens": 9}}
        )
        assert [o["meta_info"]["completion_tokens"] for o in outs] == [9, 9, 9, 9]
        state = get_json(sim.base + "/_sim/state")
        assert state["eager_passes"] > 0 and state["graph_passes"] == 0 and state["captured_bs"] == [1, 2]
        with pytest.raises((ConnectionError, urllib.error.URLError, OSError)):
            http("POST", sim.base + "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 9}})
        assert sim.wait_exit(5) == 1
        assert SIZE_MISMATCH in sim.output()
    finally:
        sim.stop()


def test_reused_connection_answers_without_delayed_ack(ddtree_sim: Sim) -> None:
    """Like uvicorn (TCP_NODELAY, keep-alive), a response on a reused connection does not wait
    for the client's delayed ACK (~40 ms on Linux): the header and body writes go out at once."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", ddtree_sim.port, timeout=10)
    try:
        latencies, sockets = [], set()
        for _ in range(12):
            t0 = time.perf_counter()
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            body = resp.read()
            latencies.append(time.perf_counter() - t0)
            assert resp.status == 200 and json.loads(body)["object"] == "list"
            sockets.add(id(conn.sock))
        assert len(sockets) == 1  # one connection for all twelve: keep-alive
    finally:
        conn.close()
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.015, f"median {latencies[len(latencies) // 2] * 1000:.1f} ms: {latencies}"


# ---------------------------------------------------------------- prompt length checks (0.5.17 tokenizer_manager)
def test_reserved_tokens_only_for_eagle() -> None:
    from ddtree_ops.sim.server import reserved_tokens

    eagle = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    assert reserved_tokens(parse_args(["--model-path", "m", *eagle], version="0.5.17")) == 4
    topk = [*eagle[:7], "2", "--speculative-num-draft-tokens", "8"]
    assert reserved_tokens(parse_args(["--model-path", "m", *topk], version="0.5.17")) == 8  # max(2 * 3, 8)
    assert reserved_tokens(parse_args(["--model-path", "m", *DDTREE_8_32], version="0.5.23")) == 0
    assert reserved_tokens(parse_args(["--model-path", "m"], version="0.5.17")) == 0


def test_count_tokens_is_a_byte_level_stand_in() -> None:
    from ddtree_ops.runtime.warmup import long_prompt
    from ddtree_ops.sim.engine import count_tokens

    assert count_tokens("") == 1 and count_tokens("abc") == 2 and count_tokens("abcd") == 3
    assert count_tokens("é") == 2  # UTF-8 bytes, not characters
    # the fixtures' real 4096-token BPE made 2085 tokens of this prompt (tests/fixtures/gpu, ops_warmup.txt)
    assert count_tokens(long_prompt(1024)) >= 2085


def test_too_long_requests_are_refused_in_sglangs_shapes(ddtree_sim: Sim) -> None:
    ctx = 32768  # no --context-length, no config.json: the sim's default
    total = ("Requested token count exceeds the model's maximum context length of 32768 tokens. You requested a "
             "total of 40002 tokens: 2 tokens from the input messages and 40000 tokens for the completion. Please "
             "reduce the number of tokens in the input messages or the completion to fit within the limit.")
    too_many = {"max_new_tokens": 40000}
    status, raw = http("POST", ddtree_sim.base + "/generate", {"text": "a", "sampling_params": too_many})
    assert (status, json.loads(raw)) == (400, {"error": {"message": total}})
    status, raw = http("POST", ddtree_sim.base + "/generate",
                       {"text": "a", "stream": True, "sampling_params": {"max_new_tokens": 40000}})
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    assert status == 200 and events[1] == "[DONE]" and len(events) == 2
    assert json.loads(events[0]) == {"error": {"message": total, "type": "invalid_request_error", "code": 400,
                                               "retryable": False}}
    long_text = "x" * (3 * ctx)
    status, raw = http("POST", ddtree_sim.base + "/generate", {"text": long_text})  # no max_new_tokens: input only
    assert status == 400
    assert json.loads(raw)["error"]["message"] == (f"The input ({1 + ctx} tokens) is longer than the model's context "
                                                  f"length ({ctx} tokens).")
    status, raw = http("POST", ddtree_sim.base + "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40000})
    body = json.loads(raw)
    assert status == 400 and body["object"] == "error" and body["type"] == "BadRequestError"
    assert body["code"] == 400 and body["param"] is None and body["message"].startswith("Requested token count")
    status, raw = http("POST", ddtree_sim.base + "/v1/completions", {"prompt": long_text, "stream": True})
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    assert status == 200 and events[1] == "[DONE]"
    assert json.loads(events[0])["error"]["message"].startswith("The input (")
