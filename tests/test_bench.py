"""``ddtree-ops bench`` and ``bench-compare`` (``ddtree_ops.runtime.bench``, ``bench_report``) against
the SGLang simulator with known ground truth, and against hostile servers.

Ground truth of the simulator (``ddtree_ops.sim.engine``): a verify pass takes
``SGLANG_SIM_STEP_SECONDS`` (:data:`STEP`) and accepts exactly ``SGLANG_SIM_ACCEPT_LENGTH``
tokens per request (an integer here: no carry); prefill takes one step and emits the first
token. With ``max_new_tokens`` = 1 + 4k every decode chunk carries 4 tokens, so:
acceptance length = (1 + 4k) / k exactly; per-token ITL = pass time / 4; TTFT at
concurrency 1 = one step; a request's E2E = (1 + k) passes. Pass times are ``time.sleep``
plus the simulator's own work, so timing figures are checked against the configured
step within a stated tolerance and against the server's own histograms
(``sglang:inter_token_latency_seconds``) more tightly.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from test_hostile_servers import Conn, Hostile
from test_sim import DDTREE_8_32, Sim, http

from ddtree_ops.cli import main
from ddtree_ops.fleet.sweep import SweepError, load_sweep
from ddtree_ops.runtime.bench import (
    PROMPTS,
    BenchInputError,
    BenchOptions,
    Prompt,
    load_prompts,
    load_result,
    quantiles,
    run,
    summarize,
    write_results,
)
from ddtree_ops.runtime.bench_report import compare, write_report

STEP = 0.02
ACCEPT = 4
K = 8
TOKENS = 1 + ACCEPT * K  # 33: prefill token + 8 passes of 4
TIME_TOL = 0.30  # timing figures vs the configured step: sleep + simulator work + 2 shared, loaded cores
# Client ITL vs the server's own ITL histogram (the same passes seen from both ends): a request's
# gaps sum to (last - first chunk arrival), so the mean differs by the delivery jitter of two
# chunks over its 8 passes (160 ms): 15 % allows ~24 ms of scheduling delay on a loaded host.
SERVER_TOL = 0.15


def _sim(tmp: Path, spec: bool) -> Sim:
    args = [*DDTREE_8_32] if spec else []
    env = {"SGLANG_SIM_STEP_SECONDS": str(STEP), "SGLANG_SIM_ACCEPT_LENGTH": str(ACCEPT)}
    sim = Sim(tmp, [*args, "--enable-metrics", "--cuda-graph-max-bs-decode", "16", "--max-running-requests", "16"],
              env=env, load=0.2, warmup=0.1)
    sim.wait_ready()
    return sim


@pytest.fixture(scope="module")
def spec_sim(tmp_path_factory):
    sim = _sim(tmp_path_factory.mktemp("spec"), spec=True)
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def base_sim(tmp_path_factory):
    sim = _sim(tmp_path_factory.mktemp("base"), spec=False)
    yield sim
    sim.stop()


def _server_itl(base: str) -> tuple[float, float]:
    """(sum, count) of the simulator's sglang:inter_token_latency_seconds histogram."""
    text = http("GET", base + "/metrics")[1].decode()
    vals = {}
    for line in text.splitlines():
        for k in ("sum", "count"):
            if line.startswith(f"sglang:inter_token_latency_seconds_{k}"):
                vals[k] = float(line.rsplit(" ", 1)[1])
    return vals["sum"], vals["count"]


# ------------------------------------------------------------------ ground truth
@pytest.mark.parametrize("api", ["generate", "chat", "completions"])
def test_figures_match_the_simulator(spec_sim: Sim, api: str) -> None:
    s0, n0 = _server_itl(spec_sim.base)
    res = run(BenchOptions(url=spec_sim.base, api=api, concurrency=(1, 4), requests=8, max_new_tokens=TOKENS,
                           warmup_requests=1), load_prompts(None))
    s1, n1 = _server_itl(spec_sim.base)
    assert [lv.concurrency for lv in res.levels] == [1, 4]
    for lv in res.levels:
        assert (lv.ok, lv.failed, lv.errors) == (8, 0, [])
        assert lv.output_tokens == 8 * TOKENS
        # acceptance length: exact, from the server's counters always, from meta_info on /generate
        assert lv.accept_length_server == pytest.approx(TOKENS / K, abs=1e-9)
        assert lv.accept_length == (pytest.approx(TOKENS / K, abs=1e-9) if api == "generate" else None)
        itl = lv.itl_s["mean"]
        assert STEP / ACCEPT <= itl <= STEP / ACCEPT * (1 + TIME_TOL), (api, lv.concurrency, itl)
        per_req = lv.request_output_tok_s["mean"]
        ideal = TOKENS / ((1 + K) * STEP)
        assert ideal * (1 - TIME_TOL) <= per_req <= ideal * 1.02, (api, lv.concurrency, per_req, ideal)
    c1 = res.levels[0]
    assert STEP <= c1.ttft_s["p50"] <= STEP * (1 + TIME_TOL) + 0.010, c1.ttft_s
    # the client's ITL is the server's ITL: same per-token gaps seen from the client side
    server_itl = (s1 - s0) / (n1 - n0)
    client_itl = sum(lv.itl_s["mean"] * lv.ok for lv in res.levels) / sum(lv.ok for lv in res.levels)
    assert client_itl == pytest.approx(server_itl, rel=SERVER_TOL), (client_itl, server_itl)
    # concurrency 4 runs as one batch: ~4x the aggregate rate of concurrency 1
    assert res.levels[1].output_tok_s > 2.5 * c1.output_tok_s
    for r in res.requests:
        assert r.ok and r.completion_tokens == TOKENS and len(r.itl_s) == TOKENS - 1
        if api == "generate":
            assert r.spec_verify_ct == K and r.chunks == 1 + K


@pytest.mark.parametrize("loop", ["asyncio", "auto"])
def test_the_event_loop_is_recorded_and_both_give_the_figures(spec_sim: Sim, loop: str, monkeypatch) -> None:
    """uvloop (the ``bench`` extra, installed by the dev set-up) runs the load generator unless
    DDTREE_BENCH_LOOP=asyncio; either loop gives the simulator's figures, and the result says which ran."""
    monkeypatch.setenv("DDTREE_BENCH_LOOP", loop)
    res = run(BenchOptions(url=spec_sim.base, concurrency=(4,), requests=4, max_new_tokens=TOKENS,
                           warmup_requests=0), load_prompts(None))
    assert res.client["event_loop"] == ("asyncio" if loop == "asyncio" else "uvloop")
    lv = res.levels[0]
    assert (lv.ok, lv.failed, lv.output_tokens) == (4, 0, 4 * TOKENS)
    assert lv.accept_length == pytest.approx(TOKENS / K, abs=1e-9)
    assert STEP / ACCEPT <= lv.itl_s["mean"] <= STEP / ACCEPT * (1 + TIME_TOL)


def test_baseline_has_no_acceptance_length_and_compare_gives_the_speedup(spec_sim, base_sim, tmp_path) -> None:
    """Autoregressive: one token a pass, no speculative counters. Speculative over baseline at the
    same pass time: (1 + 32) passes vs (1 + 8) passes a request, a speedup of 33/9 = 3.67."""
    docs = {}
    for name, sim in (("spec", spec_sim), ("base", base_sim)):
        res = run(BenchOptions(url=sim.base, concurrency=(1, 2), requests=2, max_new_tokens=TOKENS, warmup_requests=0),
                  [Prompt("one two three")])
        write_results(tmp_path / name, res)
        docs[name] = load_result(tmp_path / name)
    base = docs["base"]["levels"]
    assert all(lv["accept_length"] is None and lv["accept_length_server"] is None for lv in base)
    assert docs["base"]["server"]["speculative_algorithm"] is None
    assert STEP <= base[0]["itl_s"]["mean"] <= STEP * (1 + TIME_TOL)
    path, rows = write_report(tmp_path / "report", docs["spec"], docs["base"])
    assert [r["concurrency"] for r in rows] == [1, 2]
    ideal = (1 + TOKENS - 1) / (1 + K)
    for r in rows:
        assert ideal * (1 - TIME_TOL) <= r["speedup"] <= ideal * (1 + TIME_TOL), r
        assert r["accept_length"] == pytest.approx(TOKENS / K)
    text = path.read_text()
    assert "| 1 |" in text and "x |" in text and "![tok_s.png](tok_s.png)" in text
    for png in ("tok_s.png", "accept_length.png", "itl.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_duration_mode_and_outputs(spec_sim: Sim, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run(BenchOptions(url=spec_sim.base, concurrency=(2,), requests=None, duration_s=0.5, max_new_tokens=TOKENS,
                           warmup_requests=0, api_key="sk-CANARY"), load_prompts(None), plan={"plan": {"x": 1}})
    took = time.monotonic() - t0
    lv = res.levels[0]
    assert lv.requests >= 2 and lv.failed == 0
    assert took < 0.5 + 2 * (1 + K) * STEP * (1 + TIME_TOL) + 1.0  # no request starts after the duration
    files = write_results(tmp_path, res)
    assert [f.name for f in files] == ["bench.json", "levels.csv", "requests.csv"]
    raw = (tmp_path / "bench.json").read_text()
    assert "CANARY" not in raw and "CANARY" not in (tmp_path / "requests.csv").read_text()
    doc = json.loads(raw)
    assert doc["plan"] == {"plan": {"x": 1}} and doc["options"]["api_key"] == "(set)"
    assert doc["server"]["version"] == "0.5.23" and doc["client"]["host"]
    lines = (tmp_path / "levels.csv").read_text().splitlines()
    assert lines[0].startswith("concurrency,requests,ok,failed") and lines[1].startswith("2,")
    assert len((tmp_path / "requests.csv").read_text().splitlines()) == 1 + lv.requests


def test_cli_bench_exit_codes(spec_sim: Sim, tmp_path: Path, capsys) -> None:
    out = tmp_path / "o"
    rc = main(["bench", spec_sim.base, "--concurrency", "1,2", "--requests", "2", "--max-new-tokens", "9",
               "--warmup", "0", "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["ok"] and [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    assert (out / "bench.json").is_file()
    rc = main(["bench", spec_sim.base, "--concurrency", "1,x", "--out", str(out)])
    assert rc == 2 and "--concurrency" in capsys.readouterr().err
    rc = main(["bench", spec_sim.base, "--requests", "2", "--duration", "3", "--out", str(out)])
    assert rc == 2 and "give exactly one" in capsys.readouterr().err
    rc = main(["bench-compare", str(out), str(out), "--out", str(tmp_path / "r"), "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rc == 0 and [r["speedup"] for r in rows] == [1.0, 1.0]
    # --baseline: both runs and the report in one command; a baseline that is down fails it (exit 1)
    down = f"http://127.0.0.1:{_free_port()}"
    rc = main(["bench", spec_sim.base, "--baseline", down, "--concurrency", "1", "--requests", "1",
               "--max-new-tokens", "5", "--warmup", "0", "--out", str(tmp_path / "both"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and [c["name"] for c in doc["checks"]] == ["requests", "baseline requests", "compare"]
    assert [c["ok"] for c in doc["checks"]] == [True, False, True] and "ConnectError" in doc["checks"][1]["detail"]
    assert (tmp_path / "both" / "spec" / "bench.json").is_file() and (
        tmp_path / "both" / "report" / "report.md"
    ).is_file()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ hostile servers
def _sse(c: Conn, events: list[bytes], then_idle: bool = False) -> None:
    c.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    for e in events:
        if not c.send(b"data: " + e + b"\n\n"):
            return
    if then_idle:
        c.idle()
    c.sock.close()


def _meta(n: int, extra: str = "") -> bytes:
    return b'{"text": "x", "meta_info": {"completion_tokens": %d%s}}' % (n, extra.encode())


HOSTILE = {
    "http 500": (lambda c, m, p: c.answer(500, "text/plain", b"boom"), "HTTP 500: boom"),
    "no [DONE], hangs": (lambda c, m, p: _sse(c, [_meta(1)], then_idle=True), "total deadline"),
    "closes mid-stream": (lambda c, m, p: _sse(c, [_meta(1), _meta(2)]), "without data: [DONE]"),
    "NaN": (lambda c, m, p: _sse(c, [_meta(1, ', "spec_accept_length": NaN')]), "non-finite number NaN"),
    "count goes down": (lambda c, m, p: _sse(c, [_meta(3), _meta(2)]), "went down"),
    "fractional count": (lambda c, m, p: _sse(c, [_meta(1).replace(b"1}", b"1.5}")]), "must be an integer"),
    "not SGLang": (lambda c, m, p: _sse(c, [b'{"hello": 1}']), "without a meta_info"),
    "endless events": (lambda c, m, p: _sse(c, [_meta(1)] * 500), "more than 72 stream events"),
    "huge event": (lambda c, m, p: c.stream(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {\"",
                                            b"a" * 65536, total=8 << 20), "byte cap"),
    "chat delta not an object": (lambda c, m, p: _sse(c, [b'{"choices": [{"delta": [1]}]}', b"[DONE]"]), "no token"),
    "error event": (lambda c, m, p: _sse(c, [b'{"error": {"message": "bad\\u0007 input"}}']), "bad\\x07 input"),
    # a fixed output (ignore_eos) of 8 answered with 32 or 3 tokens, or [DONE] before the data
    "too many tokens": (lambda c, m, p: _sse(c, [_meta(16), _meta(32), b"[DONE]"]), "reported 32 tokens"),
    "too few tokens": (lambda c, m, p: _sse(c, [_meta(3), b"[DONE]"]), "reported 3 tokens"),
    "[DONE] first": (lambda c, m, p: _sse(c, [b"[DONE]", _meta(8)]), "no token"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_stream_fails_the_request_not_the_run(name: str) -> None:
    behave, needle = HOSTILE[name]
    api = "chat" if name.startswith("chat") else "generate"
    srv = Hostile(behave, {"/generate", "/v1/chat/completions"})
    try:
        t0 = time.monotonic()
        res = run(BenchOptions(url=srv.url, api=api, concurrency=(1,), requests=2, max_new_tokens=8, warmup_requests=0,
                               request_timeout_s=0.5), [Prompt("p")])
        took = time.monotonic() - t0
    finally:
        srv.close()
    lv = res.levels[0]
    assert (lv.ok, lv.failed) == (0, 2)
    assert any(needle in e for e in lv.errors), lv.errors
    assert took < 2 * 0.5 + 1.5  # each request within its total deadline
    json.dumps(res.as_dict(), allow_nan=False)  # a broken server never puts NaN into the results


def test_openai_server_without_running_usage(tmp_path: Path) -> None:
    """A server that ignores continuous_usage_stats: one token counted a content chunk (as
    bench_serving counts), the total from the last usage chunk, no ITL sample made up for it."""
    def chunk(text: str) -> bytes:
        return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]}).encode()

    events = [chunk(" a"), chunk(" b c"), chunk(" d"),
              json.dumps({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}).encode(), b"[DONE]"]
    srv = Hostile(lambda c, m, p: _sse(c, events), {"/v1/completions"})
    try:
        res = run(BenchOptions(url=srv.url, api="completions", requests=1, max_new_tokens=5, warmup_requests=0),
                  [Prompt("p")])
    finally:
        srv.close()
    r = res.requests[0]
    assert r.ok and (r.completion_tokens, r.prompt_tokens, r.chunks, len(r.itl_s)) == (5, 2, 3, 2), r


def test_cli_against_hostile_server_is_exit_1(tmp_path: Path, capsys) -> None:
    srv = Hostile(HOSTILE["closes mid-stream"][0], {"/generate"})
    try:
        rc = main(["bench", srv.url, "--concurrency", "1", "--requests", "1", "--warmup", "0",
                   "--out", str(tmp_path), "--json"])
    finally:
        srv.close()
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and not doc["ok"] and "without data: [DONE]" in doc["checks"][0]["detail"]
    assert (tmp_path / "bench.json").is_file()


# ------------------------------------------------------------------ inputs
def test_prompt_files(tmp_path: Path) -> None:
    assert [p.text for p in load_prompts(None)] == list(PROMPTS) and len(set(PROMPTS)) >= 12
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a b"}\n\n{"text": "c", "output_len": 7}\n'
                  '{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "hi"}, '
                  '{"from": "gpt", "value": "yo"}]}\n')
    assert load_prompts(jl) == [Prompt("a b"), Prompt("c", 7), Prompt("hi")]
    arr = tmp_path / "sharegpt.json"
    arr.write_text(json.dumps([{"id": "x", "conversations": [{"from": "human", "value": "q1"}]}]))
    assert load_prompts(arr) == [Prompt("q1")]
    for body, needle in [('{"prompt": ""}', "line 1: prompt = ''"), ("{nope", "line 1: malformed JSON"),
                         ('{"prompt": "a", "output_len": 0}', "output_len = 0"),
                         ('{"conversations": [{"from": "gpt", "value": "x"}]}', "no turn from \"human\""),
                         ("[5]", "entry 0: a int"), ("\n\n", "no prompts")]:
        jl.write_text(body)
        with pytest.raises(BenchInputError, match=None) as exc:
            load_prompts(jl)
        assert needle in str(exc.value), (body, str(exc.value))
    with pytest.raises(BenchInputError, match="not a regular file"):
        load_prompts(tmp_path)
    (tmp_path / "bad.jsonl").write_bytes(b'{"prompt": "\xff"}')
    with pytest.raises(BenchInputError, match="not UTF-8"):
        load_prompts(tmp_path / "bad.jsonl")


@pytest.mark.parametrize("field, value, needle", [
    ("api", "grpc", "--api 'grpc'"), ("concurrency", (0,), "--concurrency [0]"), ("requests", 0, "--requests 0"),
    ("max_new_tokens", 0, "--max-new-tokens 0"), ("temperature", float("nan"), "--temperature nan"),
    ("top_p", 0.0, "--top-p 0.0"), ("request_timeout_s", float("inf"), "--request-timeout inf"),
])
def test_options_are_checked(field: str, value, needle: str) -> None:
    with pytest.raises(BenchInputError) as exc:
        BenchOptions(url="http://127.0.0.1:1", **{field: value}).check()
    assert str(exc.value).startswith(needle), str(exc.value)


def test_quantiles_and_compare_rows() -> None:
    assert quantiles([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    q = quantiles([float(x) for x in range(1, 101)])
    assert (q["mean"], q["p50"], q["p90"], q["p99"]) == (50.5, 50.0, 90.0, 99.0)

    def doc(tok_s: float, itl: float, conc=(1, 8)) -> dict:
        lv = {"output_tok_s": tok_s, "request_output_tok_s": {"mean": tok_s / 2}, "itl_s": {"mean": itl},
              "ttft_s": {"mean": 0.1}, "failed": 0, "accept_length": None, "accept_length_server": None}
        return {"levels": [{**lv, "concurrency": c} for c in conc]}

    # server-side acceptance length: counter deltas; none when the counters went back (restart) or no verify
    assert summarize(1, [], 1.0, ((100.0, 10.0), (160.0, 20.0))).accept_length_server == 6.0
    assert summarize(1, [], 1.0, ((100.0, 10.0), (50.0, 20.0))).accept_length_server is None
    assert summarize(1, [], 1.0, ((100.0, 10.0), (160.0, 10.0))).accept_length_server is None
    assert summarize(1, [], 1.0, (None, (160.0, 20.0))).accept_length_server is None

    rows = compare(doc(300.0, 0.002, (8, 1, 64)), doc(100.0, 0.004))
    assert [(r["concurrency"], r["speedup"], r["itl_ratio"]) for r in rows] == [(1, 3.0, 0.5), (8, 3.0, 0.5)]
    assert compare(doc(1.0, 0.0), doc(0.0, 0.0))[0]["speedup"] is None


def test_no_outside_paths_in_results(spec_sim: Sim, tmp_path: Path) -> None:
    """The results name the server by its URL and the client by host name, nothing of this checkout."""
    res = run(BenchOptions(url=spec_sim.base, requests=1, max_new_tokens=5, warmup_requests=0), [Prompt("x")])
    raw = json.dumps(res.as_dict())
    assert os.getcwd() not in raw and str(Path.home()) not in raw


# ------------------------------------------------------------------ sweep
def _inventory(tmp: Path) -> Path:
    import yaml
    from helpers import base_hostvars

    inv = tmp / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"b300-01": {}}}}}})
    )
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(base_hostvars()))
    return inv


def test_sweep_four_points_one_invalid_resumable(spec_sim: Sim, tmp_path: Path, capsys) -> None:
    """4 points: two benchmarked (an endpoint already serving them), one valid without an
    endpoint (validated and rendered only), one refused by the validator (never run)."""
    spec = tmp_path / "sweep.yml"
    spec.write_text(f"""
host: b300-01
points:
  - {{name: budget32, set: {{ddtree_speculative.budget: 32}}, url: "{spec_sim.base}"}}
  - {{name: budget0, set: {{ddtree_speculative.budget: 0}}, url: "{spec_sim.base}"}}
grid:
  ddtree_speculative.budget: [16, 24]
urls: {{budget16: "{spec_sim.base}"}}
""")
    out = tmp_path / "out"
    args = ["sweep", str(spec), "-i", str(_inventory(tmp_path)), "--out", str(out), "--concurrency", "1,2",
            "--requests", "2", "--max-new-tokens", "9", "--warmup", "0", "--json"]
    rc = main(args)
    doc = json.loads(capsys.readouterr().out)
    status = {c["name"]: c["detail"].split(":")[0] for c in doc["checks"]}
    assert rc == 0 and status == {"point budget32": "done", "point budget0": "invalid",
                                  "point budget16": "done", "point budget24": "rendered"}, doc
    state = json.loads((out / "sweep.json").read_text())
    bad = next(p for p in state["points"] if p["name"] == "budget0")
    assert "ddtree_speculative.budget" in bad["detail"] and bad["argv"] == []
    assert not (out / "budget0").exists() and not (out / "budget24").exists()
    b16 = next(p for p in state["points"] if p["name"] == "budget16")
    assert (
        "--speculative-ddtree-budget" in b16["argv"]
        and b16["argv"][b16["argv"].index("--speculative-ddtree-budget") + 1] == "16"
    )
    assert load_result(out / "budget16")["plan"]["deployment"]["speculative"]["budget"] == 16
    md = (out / "sweep.md").read_text()
    assert "## concurrency 2" in md and "| 1 | budget" in md and "| budget0 | invalid |" in md
    # resumed: nothing is benchmarked again (the server counts no new request)
    served = _served(spec_sim.base)
    rc = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and {c["detail"].split(":")[0] for c in doc["checks"]} == {"resumed", "invalid", "rendered"}
    assert _served(spec_sim.base) == served


def _served(base: str) -> float:
    text = http("GET", base + "/metrics")[1].decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("sglang:num_requests_total"))


def test_sweep_file_errors(tmp_path: Path) -> None:
    from ddtree_ops.fleet.sweep import SweepError, apply, load_sweep

    f = tmp_path / "s.yml"
    for body, needle in [("[1]", "must be a mapping"), ("points: []", "host = None"),
                         ("host: h\npoints: [{name: '../x', set: {}}]", "name = '../x'"),
                         ("host: h\npoints: [{name: a, set: {model.path: x}}]", "set key 'model.path'"),
                         ("host: h\npoints: [{name: a, set: {ddtree_hf_token: x}}]", "secrets are not swept"),
                         ("host: h\npoints: [{name: a, url: 'http://u:p@h:1'}]", "without user info"),
                         ("host: h\npoints: [{name: a}, {name: a}]", "'a' twice"),
                         ("host: h\ngrid: {ddtree_x.y: [1]}\nurls: {nope: 'http://h:1'}", "urls for no point"),
                         ("host: h", "no points")]:
        f.write_text(body)
        with pytest.raises(SweepError) as exc:
            load_sweep(f)
        assert needle in str(exc.value), (body, str(exc.value))
    with pytest.raises(SweepError, match="not a regular file"):
        load_sweep(tmp_path)
    assert apply({"ddtree_a": {"b": 1}}, {"ddtree_a.c.d": 2}) == {"ddtree_a": {"b": 1, "c": {"d": 2}}}
    with pytest.raises(SweepError, match="ddtree_a.b is a int"):
        apply({"ddtree_a": {"b": 1}}, {"ddtree_a.b.c": 2})


FAKE_PLAYBOOK = """#!/bin/sh
# Test double of ansible-playbook: records its argv and the extra-vars file it was given, then
# behaves as DDTREE_FAKE_DEPLOY says for the point whose vars it got (fail / hang / succeed).
log="$DDTREE_FAKE_LOG"
printf '%s\\n' "$*" >>"$log"
for a in "$@"; do case "$a" in @*) cat "${a#@}" >>"$log"; printf '\\n' >>"$log";; esac; done
echo "PLAY RECAP token=hf_abcdefghijklmnopqrstuvwxyz0123456789AB"
case "$*" in *"$DDTREE_FAKE_FAIL"*) echo failing >&2; exit 4;; esac
case "$*" in *"$DDTREE_FAKE_HANG"*) sleep 60;; esac
exit 0
"""


def test_sweep_deploys_each_point_through_the_playbook_and_restores(spec_sim: Sim, tmp_path: Path, capsys,
                                                                    monkeypatch) -> None:
    """--deploy: each valid point without a url is deployed by ansible-playbook (a test double here;
    tests/hosts runs the real play) with only the variables it changes, then benchmarked at the
    host's address; a failed or hung deploy fails that point only; an invalid point is never
    deployed; the inventory's settings are deployed again at the end."""
    import yaml

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ansible-playbook"
    fake.write_text(FAKE_PLAYBOOK)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DDTREE_FAKE_LOG", str(log))
    monkeypatch.setenv("DDTREE_FAKE_FAIL", "budget24/deploy-vars.json")
    monkeypatch.setenv("DDTREE_FAKE_HANG", "budget20/deploy-vars.json")
    inv = _inventory(tmp_path)
    hv = yaml.safe_load((inv / "host_vars" / "b300-01.yml").read_text())
    hv["ansible_host"] = "127.0.0.1"
    hv.setdefault("ddtree_server", {})["port"] = spec_sim.port
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(hv))
    playbook = tmp_path / "deploy.yml"
    playbook.write_text("- hosts: all\n  tasks: []\n")
    spec = tmp_path / "sweep.yml"
    spec.write_text("host: b300-01\ngrid:\n  ddtree_speculative.budget: [16, 0, 24, 20]\n")
    out = tmp_path / "out"
    rc = main(["sweep", str(spec), "-i", str(inv), "--out", str(out), "--concurrency", "1", "--requests", "2",
               "--max-new-tokens", "9", "--warmup", "0", "--deploy", str(playbook), "--deploy-timeout", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    status = {c["name"]: c["detail"] for c in doc["checks"]}
    assert rc == 1, doc  # two points failed
    assert status["point budget16"].startswith("done"), status
    assert status["point budget0"].startswith("invalid"), status
    assert status["point budget24"] == "failed: deploy failed: ansible-playbook exited 4 (see deploy.log)", status
    assert "did not finish within 3 s" in status["point budget20"], status
    calls = log.read_text()
    # the invalid point never reached Ansible; each other point did with its own vars; then the restore
    assert "budget0" not in calls and calls.count("-l b300-01") == 4
    assert calls.rstrip().splitlines()[-1] == f"-i {inv} -l b300-01 {playbook}", calls  # the restore: no -e
    sent = json.loads((out / "budget16" / "deploy-vars.json").read_text())
    assert list(sent) == ["ddtree_speculative"] and sent["ddtree_speculative"]["budget"] == 16
    assert sent["ddtree_speculative"]["block_size"] == hv["ddtree_speculative"]["block_size"]  # whole variable
    assert (out / "budget16" / "deploy-vars.json").stat().st_mode & 0o077 == 0
    assert "hf_abcdefghij" not in (out / "budget16" / "deploy.log").read_text()  # scrubbed
    state = json.loads((out / "sweep.json").read_text())
    assert state["restore"] == {"ok": True, "detail": "deployed with the inventory's own settings"}
    assert load_result(out / "budget16")["levels"][0]["ok"] == 2


@pytest.mark.parametrize("name, body, needle", [
    ("alias bomb", "host: b300-01\nx: &a0 [1,1,1,1,1,1,1,1,1,1]\n"
     + "".join(f"x{i}: &a{i} [*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1},*a{i-1}]\n"
               for i in range(1, 9))
     + "points: [{name: p, set: {ddtree_accepted_risks: *a8}}]\n", "alias bomb"),
    ("jinja value", "host: b300-01\npoints: [{name: p, set: {ddtree_accepted_risks: "
     "[{rule: r, reason: \"{{ lookup('pipe','touch /tmp/x') }}\"}]}}]\n", "holds Jinja"),
    ("token value", "host: b300-01\npoints: [{name: p, set: {ddtree_service.env: {MY_VAR: "
     "sk-abcdefghijklmnopqrstuvwxyz012345}}}]\n", "looks like a secret"),
    ("secret key inside", "host: b300-01\npoints: [{name: p, set: {ddtree_service.env: {HF_TOKEN: x}}}]\n", "a secret"),
    ("url user info", "host: b300-01\npoints: [{name: p, set: {ddtree_sglang.url: 'https://u:pw@example.com/x'}}]\n",
     "looks like a secret"),
])
def test_sweep_refuses_hostile_values_in_one_line(tmp_path: Path, name: str, body: str, needle: str) -> None:
    """A sweep file is data; an alias bomb, Jinja (validated as a literal, templated by
    Ansible at deploy) and secrets (written to sweep.json) are refused before any point runs."""
    import time

    spec = tmp_path / "sweep.yml"
    spec.write_text(body)
    t0 = time.monotonic()
    with pytest.raises(SweepError) as exc:
        load_sweep(spec)
    assert time.monotonic() - t0 < 5
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg
    assert "sk-abc" not in msg and ":pw@" not in msg


def test_sweep_state_files_of_any_shape_resume_without_a_crash(spec_sim: Sim, tmp_path: Path, capsys) -> None:
    """A hostile or damaged sweep.json (deeply nested) and a resumed point whose bench.json lacks fields:
    every point runs or reports, the exit status is a check's, never an internal error (70)."""
    spec = tmp_path / "sweep.yml"
    spec.write_text(f'host: b300-01\npoints: [{{name: u1, set: {{}}, url: "{spec_sim.base}"}}]\n')
    out = tmp_path / "out"
    args = ["sweep", str(spec), "-i", str(_inventory(tmp_path)), "--out", str(out), "--concurrency", "1",
            "--requests", "1", "--max-new-tokens", "9", "--warmup", "0", "--json"]
    out.mkdir()
    (out / "sweep.json").write_text("[" * 100_000)
    assert main(args) == 0, capsys.readouterr()
    capsys.readouterr()
    res = json.loads((out / "u1" / "bench.json").read_text())
    del res["levels"][0]["itl_s"]
    (out / "u1" / "bench.json").write_text(json.dumps(res))
    rc = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and "could not be read" in doc["checks"][0]["detail"], doc


def test_sweep_of_only_invalid_points_fails(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "sweep.yml"
    spec.write_text("host: b300-01\ngrid: {ddtree_speculative.budget: [0, -1]}\n")
    rc = main(["sweep", str(spec), "-i", str(_inventory(tmp_path)), "--out", str(tmp_path / "o"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and all(c["detail"].startswith("invalid") and not c["ok"] for c in doc["checks"]), doc


def test_side_requests_are_bounded_by_the_request_timeout() -> None:
    """/server_info and /metrics before and after each level used a fixed 10 s each;
    a server that accepts and never answers now costs at most request_timeout per side request."""
    srv = Hostile(lambda c, m, p: c.idle(), None)
    try:
        t0 = time.monotonic()
        res = run(BenchOptions(url=srv.url, concurrency=(1, 2), requests=1, max_new_tokens=8, warmup_requests=0,
                               request_timeout_s=0.5), [Prompt("p")])
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert [lv.failed for lv in res.levels] == [1, 1] and res.server == {}
    # identity (0.5) + per level: counters before/after (2 x 0.5) + the requests (0.5)
    assert took < 0.5 + 2 * 1.5 + 2.0, took
