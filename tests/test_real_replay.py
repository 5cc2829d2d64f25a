"""The runtime tools against replays of REAL SGLang 0.5.17 answers (``tests/replay.py``).

The first real run (SGLang 0.5.17 on an H200, ``tests/fixtures/gpu/sglang-0.5.17-h200-2026-12-01``)
found that ``warmup`` without a plan sent a 1024-word prompt the server counted as 2085 tokens
(2089 with EAGLE3's reserved slots) against a 2048-token context, and that the exporter would
not start without ``--plan``. These tests replay what that server answered.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from replay import ACCEPTANCE_0517, REAL_0517, Replay

from ddtree_ops.cli import main
from ddtree_ops.runtime.warmup import (
    DEFAULT_LONG_PROMPT_WORDS,
    WarmupError,
    WarmupPlan,
    limits_from_server_info,
    long_prompt,
    long_prompt_limit,
    warmup,
)

SERVERS = ("eagle3", "dflash", "none")
RECORDINGS = (REAL_0517, ACCEPTANCE_0517)


def test_the_replay_reproduces_the_real_refusal():
    """The replay's length check gives the very answer the real servers gave to the old
    warmup's 1024-word prompt (recorded in each folder's ops_warmup.txt)."""
    for name, tokens in (("eagle3", 2089), ("dflash", 2085)):
        with Replay(REAL_0517 / name) as r:
            status, answer = r.answer_generate({"text": long_prompt(DEFAULT_LONG_PROMPT_WORDS),
                                                "sampling_params": {"max_new_tokens": 32}})
        recorded = (REAL_0517 / name / "ops_warmup.txt").read_text()
        assert status == 400
        assert answer["error"]["message"] == f"The input ({tokens} tokens) is longer than the model's context " \
                                             "length (2048 tokens)."
        assert json.dumps(answer["error"]["message"])[1:-1] in recorded.replace('\\"', '"')


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("name", SERVERS)
def test_warmup_without_a_plan_fits_the_real_servers_context(recording, name, capsys):
    """No plan, no --batch-sizes: the batch sizes and the context come from the server's
    /server_info (cuda_graph_max_bs_decode 8 -> 1, 2, 4, 8; context 2048), the long prompt is
    sized so that no tokenizer makes more tokens of it than fit, and the warmup passes."""
    with Replay(recording / name) as r:
        rc = main(["warmup", r.url, "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0, out
        report = out["report"]
        assert report["batch_sizes"] == [1, 2, 4, 8], report["batch_sizes_source"]
        assert "server /server_info" in report["batch_sizes_source"]
        assert (report["context_length"], report["context_source"]) == (2048, "server /server_info")
        assert report["long_prompt_backoffs"] == 0
        # still a long prefill: hundreds of real tokens, within the context with the answer
        assert 400 < report["long_prompt_tokens"] < 2048 - 32
        assert max(r.prompts) == report["long_prompt_tokens"]
        assert ("GET", "/server_info") in r.requests


def test_warmup_backs_off_when_the_context_is_not_known_in_advance():
    """A server whose /server_info says nothing of its context (or a plan that says more
    than the server has) refuses the long prompt; warmup cuts it to the count the refusal
    named and resends the round, within MAX_BACKOFFS, and still passes."""
    with Replay(REAL_0517 / "eagle3") as r:
        r.server_info.pop("context_length")
        served: list[int] = []
        orig = r.answer_generate

        def counting(body):
            status, answer = orig(body)
            served.append(status)
            return status, answer

        r.answer_generate = counting  # type: ignore[method-assign]
        report = warmup(r.url, WarmupPlan([1, 2], "given"), deadline_s=60)
    assert report.context_length is None and report.long_prompt_backoffs == 1
    assert served.count(400) == 1 and served[-1] == 200
    assert report.long_prompt_tokens is not None and report.long_prompt_tokens + 4 + 32 <= 2048


def test_warmup_takes_the_smaller_of_plan_and_server_context():
    with Replay(REAL_0517 / "dflash") as r:
        report = warmup(r.url, WarmupPlan([1], "given", context_length=512), deadline_s=60)
    assert (report.context_length, report.context_source) == (512, "plan")
    assert report.long_prompt_bytes <= long_prompt_limit(512, 32, 8)


def test_a_refusal_that_cutting_cannot_fix_fails_with_the_servers_words():
    """A server that refuses every prompt as too long (a tokenizer making several tokens per
    byte, or a lie) fails the warmup after MAX_BACKOFFS cuts, naming the server's answer."""
    with Replay(REAL_0517 / "dflash") as r:
        r.context = 3  # even the short prompt is too long
        with pytest.raises(WarmupError, match="longer than the model's context length"):
            warmup(r.url, WarmupPlan([1], "given"), deadline_s=30)


@pytest.mark.parametrize("info, context, reserved", [
    ({"context_length": 2048, "speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1,
      "speculative_num_steps": 3, "speculative_num_draft_tokens": 4}, 2048, 4),
    ({"context_length": 2048, "speculative_algorithm": None, "speculative_num_draft_tokens": 64}, 2048, 0),
    ({"context_length": True}, None, 0),
    ({"context_length": -5}, None, 0),
    ({"context_length": 10**30}, None, 0),
    ([1, 2], None, 0),
])
def test_server_limits_read_only_sane_values(info, context, reserved):
    limits = limits_from_server_info(info)
    assert (limits.context_length, limits.reserved_tokens) == (context, reserved)


def test_long_prompt_is_cut_at_a_word_boundary_within_its_bytes():
    text = long_prompt(1024, 300)
    assert len(text.encode()) <= 300 and text == long_prompt(1024)[:len(text)]
    assert long_prompt(5, 1) == long_prompt(1)  # at least one word


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("name", SERVERS)
def test_exporter_runs_from_the_upstream_alone(recording, name):
    """``exporter --upstream URL`` without a plan: labels from the server (model from
    served_model_name, sglang_version from /server_info), plan-only series (floor, drift)
    absent rather than invented; up/ready/speculative from the real answers."""
    from prometheus_client.parser import text_string_to_metric_families

    from ddtree_ops.runtime.exporter import Exporter

    with Replay(recording / name) as r:
        e = Exporter(None, upstream=r.url, poll_interval_s=0.2, window_s=60, timeout_s=3)
        for _ in range(3):
            e.poll_once()
            time.sleep(0.05)
        assert e.probe_health() is True  # the recorded /health: 200 (its own thread in the service)
        from prometheus_client import generate_latest

        text = generate_latest(e.registry).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    value = {n: [s.value for s in f.samples] for n, f in fams.items()}
    assert value["ddtree_up"] == [1.0] and value["ddtree_ready"] == [1.0]
    assert value["ddtree_speculative_enabled"] == [0.0 if name == "none" else 1.0]
    assert value["ddtree_accept_length_floor"] == [] and value["ddtree_config_drift"] == []
    info = fams["ddtree_deployment_info"].samples[0].labels
    assert info["model"] == "tiny-llama" and info["sglang_version"] == "0.5.17"
    assert info["algorithm"] == {"eagle3": "EAGLE3", "dflash": "DFLASH", "none": "none"}[name]
    # metrics_before -> under_load -> after: generation tokens moved, so the rate is there,
    # with or without speculation (a server without speculation has no verify counter)
    assert value["ddtree_generation_tokens_per_second"] and value["ddtree_generation_tokens_per_second"][0] > 0
    if name == "none":  # real 0.5.17 exports spec_accept_length 0.0 without speculation: absent here
        assert value["ddtree_accept_length"] == [] and value["ddtree_accept_length_sglang"] == []


@pytest.mark.parametrize("name, words", [("none", "no speculative decoding"), ("eagle3", "tokens per verify pass")])
def test_health_says_when_a_real_server_runs_no_speculation(name, words):
    from ddtree_ops.runtime.health import HealthOptions, check_health

    with Replay(REAL_0517 / name) as r:
        checks = check_health(r.url, options=HealthOptions(timeout=3, failures=1, interval_s=0, progress_window_s=0.1))
    acc = {c.name: c for c in checks}["accept_length"]
    assert acc.ok and words in acc.detail, acc


def test_exporter_cli_starts_without_a_plan(tmp_path):
    """The CLI accepts --upstream alone (it used to stop with "Missing option '--plan'") and
    refuses neither-given with one line."""
    import subprocess
    import sys

    from helpers import REPO

    with Replay(REAL_0517 / "eagle3") as r:
        p = subprocess.Popen([sys.executable, "-m", "ddtree_ops", "exporter", "--upstream", r.url,
                              "--listen", "127.0.0.1:0", "--poll-interval", "0.2"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = ""
            deadline = time.monotonic() + 20
            while "serving" not in line and time.monotonic() < deadline:
                line = p.stderr.readline()
            assert "serving http://127.0.0.1:" in line, line
            port = int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
            time.sleep(0.8)
            text = _get(f"http://127.0.0.1:{port}/metrics")
        finally:
            p.terminate()
            p.wait(10)
    assert 'ddtree_up{host="127.0.0.1:' in text and 'model="tiny-llama"' in text
    assert main(["exporter", "--listen", "127.0.0.1:0"]) == 2


def test_the_acceptance_run_on_the_gpu_passed_warmup_and_exported_what_the_server_did():
    """What the product itself did against the real servers in the recorded GPU acceptance run
    (scripts/gpu-acceptance/run.sh): warmup without a plan passed on all three servers with the
    context read from the server, and the exporters run from --upstream alone exported the real
    acceptance (EAGLE3 with random draft weights ~1.0: a collapse; DFLASH forced to 3.0) and a
    token rate for the baseline, which has no verify counter."""
    from prometheus_client.parser import text_string_to_metric_families

    steps = {line.split("\t")[0]: line.split("\t")[1] for line in
             (ACCEPTANCE_0517 / "steps.tsv").read_text().splitlines() if line.count("\t") == 2}
    for n in SERVERS:
        assert steps[f"warmup_{n}"] == "0" and steps[f"health_{n}"] == "0"
        report = json.loads((ACCEPTANCE_0517 / f"warmup_{n}.txt").read_text())["report"]
        assert report["context_source"] == "server /server_info" and report["long_prompt_backoffs"] == 0
        assert report["long_prompt_tokens"] + 32 < report["context_length"]

    def seen(port: int, family: str) -> list[float]:
        vals = []
        for f in sorted(ACCEPTANCE_0517.glob(f"exporter_{port}_*.txt")):
            for fam in text_string_to_metric_families(f.read_text()):
                vals += [s.value for s in fam.samples if fam.name == family]
        return vals

    eagle3, dflash = seen(19400, "ddtree_accept_length"), seen(19402, "ddtree_accept_length")
    assert eagle3 and all(0.9 <= v < 1.1 for v in eagle3), eagle3
    assert dflash and all(2.9 <= v <= 3.1 for v in dflash), dflash
    assert seen(19401, "ddtree_accept_length") == []
    assert max(seen(19401, "ddtree_generation_tokens_per_second")) > 0


RENDERED = ACCEPTANCE_0517 / "rendered"
"""The deployment the product rendered from inventory/h200, run on real SGLang 0.5.17 by
scripts/gpu-acceptance/run-rendered.sh (the device's checkout path recorded as /CHECKOUT)."""


def test_the_rendered_deployment_matches_what_real_sglang_runs():
    """The plan rendered for h200-01 against the /server_info real SGLang answered for the
    rendered argv: no drift on any compared setting, every one of them reported."""
    from ddtree_ops.runtime.drift import find_drift

    plan = json.loads((RENDERED / "plan.json").read_text())
    info = json.loads((RENDERED / "server_info.json").read_text())
    drifts, missing = find_drift(plan, info)
    assert drifts == [], [str(d) for d in drifts]
    assert "algorithm" not in missing and "max_running_requests" not in missing
    # the unit's argv, exactly as launched, is the rendered ExecStart from -m sglang.launch_server on
    unit = (RENDERED / "ddtree-sglang.service").read_text()
    execstart = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    launched = (RENDERED / "argv.txt").read_text().strip()
    assert launched.startswith("-m sglang.launch_server --model-path ") and execstart.endswith(" " + launched)


def test_the_rendered_run_verdicts_on_real_hardware():
    """What the tools said of the rendered deployment on the H200: the unit's own ExecStartPost
    steps (health --wait, warmup with the marker) passed over the plan's 12 capture sizes; the
    release gate failed on the floor alone (random draft weights: acceptance ~1.0 < 1.5); the
    capability probe passed once it read 0.5.17's CudaGraphConfig dataclass (before: exit 2)."""
    def checks(folder, name):
        text = (folder / f"{name}.txt").read_text()
        return {c["name"]: c for c in json.loads(text[text.index("{"):])["checks"]}

    steps = dict(line.split("\t")[:2] for line in (RENDERED / "steps.tsv").read_text().splitlines())
    assert steps["unit_post_1"] == steps["unit_post_2"] == steps["health_plan"] == steps["probe_sglang"] == "0"
    warm = json.loads((RENDERED / "warm.json").read_text())
    assert warm["batch_sizes"] == json.loads((RENDERED / "plan.json").read_text())["plan"]["capture_bs"]
    gate = checks(RENDERED, "release_gate")
    assert [n for n, c in gate.items() if not c["ok"]] == ["accept_length_floor"]
    assert "< the floor 1.5" in gate["accept_length_floor"]["detail"]
    before = ACCEPTANCE_0517 / "rendered-probe-before-fix"
    assert "'CudaGraphConfig' object has no attribute 'get'" in (before / "probe_sglang.txt").read_text()
    probe = checks(RENDERED, "probe_sglang")
    assert probe["sglang-resolution"]["ok"] and "resolved by SGLang 0.5.17" in probe["sglang-resolution"]["detail"]
