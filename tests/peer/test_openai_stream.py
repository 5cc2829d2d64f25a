"""The OpenAI-compatible stream, both ways, against REAL SGLang's protocol models
(``sglang/srt/entrypoints/openai/protocol.py``: ``ChatCompletionStreamResponse``,
``CompletionStreamResponse``; 0.5.13.post1 from its import venv, 0.5.23 from its resolver venv,
the one that has ``openai`` installed):

* every ``data:`` payload the simulator (a test double) streams on ``/v1/chat/completions`` and
  ``/v1/completions`` -- plain, ``include_usage``, ``continuous_usage_stats`` -- validates with the
  real model and carries no key the real model does not declare;
* a stream built with the real classes and serialized the way SGLang's serving code does is read
  by ``ddtree-ops bench``'s parser (``ops/bench.py``) with the right token count and usage.
"""

from __future__ import annotations

import json

import httpx
import pytest
from peerutil import resolver_python, run_worker, sglang_python
from test_sim import DDTREE_8_32, Sim

from ddtree_ops.runtime.bench import RequestResult, _handle_event, _Tokens

pytestmark = pytest.mark.peer

STREAM_OPTIONS = [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}]


def _python(version: str):
    return sglang_python(version) if version == "0.5.13.post1" else resolver_python(version)


@pytest.fixture(scope="module")
def sim_payloads(tmp_path_factory):
    """{api: [payload, ...]} from one simulator run over every stream_options variant."""
    sim = Sim(tmp_path_factory.mktemp("sim"), [*DDTREE_8_32], env={"SGLANG_SIM_STEP_SECONDS": "0.001"},
              load=0.1, warmup=0.1)
    try:
        sim.wait_ready()
        out: dict[str, list[str]] = {"chat": [], "completions": []}
        with httpx.Client(base_url=sim.base, timeout=20) as client:
            for api, path in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
                for opts in STREAM_OPTIONS:
                    prompt = {"messages": [{"role": "user", "content": "hi"}]} if api == "chat" else {"prompt": "hi"}
                    body = {"model": "m", "max_tokens": 9, "stream": True, "ignore_eos": True, **prompt,
                            **({"stream_options": opts} if opts else {})}
                    with client.stream("POST", path, json=body) as r:
                        assert r.status_code == 200
                        lines = [ln[5:].strip() for ln in r.iter_lines() if ln.startswith("data:")]
                    assert lines[-1] == "[DONE]", lines[-3:]
                    out[api] += lines[:-1]
        return out
    finally:
        sim.stop()


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_sim_stream_chunks_are_real_sglang_chunks(version, api, sim_payloads, tmp_path):
    payloads = sim_payloads[api]
    assert len(payloads) >= 3 * 3  # three stream_options variants, a few chunks each (several tokens a chunk)
    [res] = run_worker(_python(version), [{"kind": "openai_stream", "api": api, "payloads": payloads}], tmp_path)
    bad = [(p[:160], r) for p, r in zip(payloads, res["results"], strict=True) if r["error"] or r["unknown"]]
    assert not bad, f"{res['model']} ({version}) refuses or does not know: {bad[:3]}"


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.23"])
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_bench_reads_a_stream_serialized_by_real_sglang(version, api, tmp_path):
    n = 7
    [res] = run_worker(_python(version), [{"kind": "openai_real_chunks", "api": api, "n": n}], tmp_path)
    payloads = res["payloads"]
    assert json.loads(payloads[0])["object"] == ("chat.completion.chunk" if api == "chat" else "text_completion")
    out = RequestResult(level=1, index=0, start_s=0.0)
    tok = _Tokens(out, 0.0)
    done = [_handle_event(p.encode(), api, tok, out, 0.01 * (i + 1)) for i, p in enumerate(payloads)]
    assert done == [False] * (len(payloads) - 1) + [True]
    assert (tok.count, out.completion_tokens, out.prompt_tokens) == (n, n, 5)
    assert out.ttft_s == pytest.approx(0.01) and len(out.itl_s) == n - 1
