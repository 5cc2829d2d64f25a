"""``ddtree-ops diagnose``: known failure signatures in real-shaped logs, logs that must not
match, hostile input, the CLI's exit codes and JSON, journalctl through a stand-in on PATH."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from helpers import FIXTURES, base_hostvars

from ddtree_ops.cli import main
from ddtree_ops.host import diagnose as dg

LOGS = FIXTURES / "logs"
IMA = "RuntimeError: CUDA error: an illegal memory access was encountered"


def run(lines: list[str] | str, plan: dg.PlanFacts | None = None) -> dict[str, dg.Finding]:
    text = lines if isinstance(lines, str) else "\n".join(lines)
    return {f.name: f for f in dg.diagnose(dg.split_lines(text.encode()), plan)}


def fixture_findings(name: str, plan: dg.PlanFacts | None = None) -> dict[str, dg.Finding]:
    return {f.name: f for f in dg.diagnose(dg.split_lines(dg.read_file(LOGS / name)), plan)}


@pytest.fixture(scope="module")
def plan_doc() -> dict:
    """plan.json of a graphs-on DDTree 8/32 deployment, rendered by the real pipeline."""
    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render.files import plan_document

    hv = base_hostvars()
    hv["ddtree_server"] = dict(hv["ddtree_server"], mem_fraction_static=0.85, cuda_graph_max_bs=16)
    return plan_document(validate_hostvars("b300-01", hv))


@pytest.fixture()
def plan_file(tmp_path: Path, plan_doc: dict) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_doc))
    return p


# ------------------------------------------------------------------ every signature, real-shaped


@pytest.mark.parametrize(
    "log, name, values",
    [
        ("graph-size-mismatch-ddtree.log", "graph-size-mismatch", {"a": 8, "b": 33, "dim": "1"}),
        ("graph-batch-overflow-dflash-sglang-37531.log", "graph-batch-overflow", {"a": 8, "b": 9}),
        ("ptxas-sm103a-triton-bundled.log", "ptxas-unknown-arch", {"arch": "sm_103a", "need": "CUDA >= 12.9"}),
        ("ima-capture-sglang-5029.log", "illegal-memory-access-capture", {}),
        ("ima-replay-eagle-sglang-6309.log", "illegal-memory-access-replay", {}),
        ("capture-oom-sglang-5285.log", "capture-oom", {"tried": "448.00 MiB"}),
        ("nccl-timeout-sglang-1693.log", "nccl-timeout", {"what": "_ALLGATHER_BASE after 600 s"}),
        ("port-in-use-uvicorn-vllm-8204.log", "port-in-use", {"portnum": "44319"}),
        ("device-uvm-missing-nvidia-docker-139.log", "nvidia-uvm-missing", {}),
        ("health-timeout-sglang-10856.log", "health-timeout", {}),
        (
            "own-unit-start-post-timeout.log",
            "health-timeout",
            {"what": "the unit's readiness checks and warmup (ExecStartPost) ran past TimeoutStartSec"},
        ),
        ("own-unit-warmup-failed.log", "warmup-failed", {}),
    ],
)
def test_each_signature_in_a_real_shaped_log(log: str, name: str, values: dict) -> None:
    found = fixture_findings(log)
    assert list(found) == [name], f"{log}: {[f.message() for f in found.values()]}"
    f = found[name]
    for k, v in values.items():
        assert f.values[k] == v, (k, f.values)
    assert f.cause and f.fix and f.source and f.quote
    msg = f.message()
    assert "\n" not in msg and msg.startswith(f"{name} (line {f.line}") and "Fix: " in msg


def test_every_signature_has_a_fixture_or_an_inline_case() -> None:
    covered = {"graph-batch-overflow", "graph-size-mismatch", "ptxas-unknown-arch", "illegal-memory-access-capture",
               "illegal-memory-access-replay", "capture-oom", "nccl-timeout", "port-in-use", "device-nodes-missing",
               "health-timeout", "warmup-failed", "cuda-oom", "scheduler-watchdog", "illegal-memory-access",
               # tests/test_diagnose_kinds.py
               "cuda-graph-capture-failed", "xid-node-reboot", "xid-gpu-reset", "xid-app-fault", "xid-other",
               "nvidia-uvm-missing", "batch-qo-indptr-mismatch"}
    assert covered == set(dg.NAMES)
    assert len(set(dg.NAMES)) == len(dg.NAMES)
    for sig in dg.SIGNATURES:
        assert sig.source and all(n == n.lower() for n in sig.needles)


@pytest.mark.parametrize("log", ["nearmiss-vocab-mismatch-sglang-12420.log", "nearmiss-pp-tensor-sglang-25887.log",
                                 "nearmiss-healthy-startup-sglang-11716.log"])
def test_near_miss_logs_do_not_match(log: str) -> None:
    assert fixture_findings(log) == {}


def test_near_misses_stay_unmatched_with_the_plan(plan_doc: dict) -> None:
    """With the plan's widths 8/33: 4 vs 8 (pipeline parallel) and 32000 vs 151936 (vocabularies) still
    are not the draft/verify mismatch."""
    plan = dg.plan_facts(plan_doc)
    assert fixture_findings("nearmiss-pp-tensor-sglang-25887.log", plan) == {}
    assert fixture_findings("nearmiss-vocab-mismatch-sglang-12420.log", plan) == {}


def test_the_gpu_fixture_of_our_own_host_names_sm_103a_once() -> None:
    """tests/fixtures/gpu/h200x2_topo_and_ptxas.txt: Triton's bundled 12.8 ptxas refused sm_103a; the
    `PTX .version 8.0 does not support .target` lines (another failure) are not this signature."""
    found = {f.name: f for f in dg.diagnose(dg.split_lines(dg.read_file(FIXTURES / "gpu/h200x2_topo_and_ptxas.txt")))}
    assert list(found) == ["ptxas-unknown-arch"] and found["ptxas-unknown-arch"].count == 1
    assert found["ptxas-unknown-arch"].values["arch"] == "sm_103a"


# ------------------------------------------------------------------ the simulator's own crash


def test_the_simulators_mis_sized_verify_crash_is_recognised(plan_doc: dict) -> None:
    """The traceback our SGLang simulator prints when verify graphs were captured at block_size (8) and
    the verify forward needs budget + 1 (33): produced live, not copied."""
    from ddtree_ops.sim import _crash

    try:
        _crash.run_batch(8, 1, 1, 33)
    except RuntimeError:
        tb = traceback.format_exc()
    else:  # pragma: no cover
        pytest.fail("the simulator did not crash")
    log = f"[2026-11-30 10:00:00 TP0] Scheduler hit an exception: {tb}"
    found = run(log)
    assert list(found) == ["graph-size-mismatch"]
    assert (found["graph-size-mismatch"].values["a"], found["graph-size-mismatch"].values["b"]) == (8, 33)
    msg = run(log, dg.plan_facts(plan_doc))["graph-size-mismatch"].message()
    assert "draft graphs use block_size tokens per request, DDTree target-verify graphs budget + 1" in msg
    assert "this plan: draft 8, verify 33 tokens/req (block_size 8, budget 32 + 1)" in msg


def test_sglang_0_5_23_capture_lines_set_the_phase_and_the_logged_width() -> None:
    """0.5.23 (model_runner_components/cuda_graph_setup.py) logs ``Capture target verify CUDA graph begin.
    backend=..., num_tokens_per_req=N``: the mismatch names the width the log says was captured."""
    begin = ("[2026-01-01 00:00:00 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=8, "
             "avail mem=40.10 GB")
    end = "[2026-01-01 00:00:05 TP0] Capture target verify CUDA graph end. elapsed=5.01 s, mem usage=0.61 GB."
    crash = ['  File "/venv/sglang/srt/speculative/ddtree_worker.py", line 412, in forward_batch_generation',
             '  File "/venv/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", line 801, in replay',
             "RuntimeError: The size of tensor a (8) must match the size of tensor b (33) at non-singleton dimension 1"]
    f = run([begin, end, *crash])["graph-size-mismatch"]
    assert "at replay" in f.cause and "captured at num_tokens_per_req=8" in f.cause
    assert list(run([begin, IMA])) == ["illegal-memory-access-capture"]  # no end line yet: capturing
    assert list(run([begin, end, *crash[:2], IMA])) == ["illegal-memory-access-replay"]


def test_the_simulator_process_log_end_to_end(tmp_path: Path, plan_file: Path, capsys) -> None:
    """The SGLang simulator run as the unit runs it, as an unpatched DDTree build (verify graphs captured
    at block_size): it dies on the first verify; diagnose reads its whole log and names 8 vs 33."""
    import socket

    from helpers import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "sim.log"
    env = {**os.environ, "SGLANG_SIM_BUILD": "ddtree-unpatched", "SGLANG_SIM_VERSION": "0.5.13",
           "SGLANG_SIM_LOAD_SECONDS": "0.2", "SGLANG_SIM_WARMUP_SECONDS": "0.2",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as out:
        rc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ddtree_ops.sim",
                "--model-path",
                "models/target",
                "--port",
                str(port),
                "--speculative-algorithm",
                "DDTREE",
                "--speculative-draft-model-path",
                "models/draft",
                "--speculative-dflash-block-size",
                "8",
                "--speculative-ddtree-budget",
                "32",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            timeout=60,
        ).returncode
    assert rc == 1
    rc, out, _ = cli(capsys, ["--file", str(log), "--plan", str(plan_file)])
    assert rc == 1
    (line,) = out.splitlines()
    assert line.startswith("FAIL graph-size-mismatch (line ") and "captured width a (8) vs needed b (33)" in line
    assert "this plan: draft 8, verify 33 tokens/req (block_size 8, budget 32 + 1)" in line


def test_batch_overflow_by_the_plan_is_not_a_width_mismatch(plan_doc: dict) -> None:
    """A batch past cuda_graph_max_bs (16) under a DDTree plan: 16 vs 17 requests, no sampler frame in
    sight; the plan's limits tell it from the draft/verify width mismatch."""
    lines = ['  File "/venv/sglang/srt/speculative/dflash_worker_v2.py", line 900, in forward_batch_generation',
             '  File "/venv/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", line 700, in replay',
             "RuntimeError: The size of tensor a (16) must match the size of tensor b (17)"]
    doc = json.loads(json.dumps(plan_doc))
    doc["plan"]["max_running_requests"] = 24
    found = run(lines, dg.plan_facts(doc))
    assert list(found) == ["graph-batch-overflow"]
    assert "this plan: max_running_requests 24, cuda_graph_max_bs 16" in found["graph-batch-overflow"].fix
    # without the plan the lines alone cannot tell 16-vs-17 requests from widths: read as the width mismatch (a
    # stated limit; the plan or the sampler frame decides)
    assert list(run(lines)) == ["graph-size-mismatch"]


def test_graph_mismatch_needs_context_or_the_plan(plan_doc: dict) -> None:
    line = "RuntimeError: The size of tensor a (32) must match the size of tensor b (99) at non-singleton dimension 0"
    assert run([line]) == {}  # a bare tensor mismatch could be anything
    found = run([line], dg.plan_facts(plan_doc))  # padded 4 x 8 vs raw 3 x 33: the plan's widths
    assert found["graph-size-mismatch"].values["a"] == 32


# ------------------------------------------------------------------ capture vs replay, OOM, plan


def test_illegal_access_capture_and_replay_are_told_apart_by_context() -> None:
    capture = ["[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
               '  File "/venv/sglang/srt/model_executor/cuda_graph_runner.py", line 380, in capture', IMA]
    replay = ["[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
              "[2026-01-01 00:00:09 TP0] Capture cuda graph end. Time elapsed: 9.10 s.",
              '  File "/venv/sglang/srt/speculative/eagle_worker.py", line 306, in forward_batch_generation',
              '  File "/venv/sglang/srt/model_executor/cuda_graph_runner.py", line 801, in replay', IMA]
    assert list(run(capture)) == ["illegal-memory-access-capture"]
    found = run(replay)
    assert list(found) == ["illegal-memory-access-replay"]
    assert (
        "eager" in found["illegal-memory-access-replay"].fix
        and "cuda_graph: false" in found["illegal-memory-access-replay"].fix
    )


def test_a_restart_ends_an_unfinished_capture() -> None:
    """A run that died in capture (a begin, no end), then a restart that serves and faults at replay."""
    lines = ["[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
             "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.00 GiB.",
             "[2026-01-01 00:01:00 TP0] Load weight begin. avail mem=78.38 GB",
             '  File "/venv/sglang/srt/speculative/eagle_worker.py", line 306, in forward_batch_generation', IMA]
    assert list(run(lines)) == ["illegal-memory-access-replay", "capture-oom"]


def test_replay_illegal_access_without_speculation_is_not_claimed(plan_doc: dict) -> None:
    lines = ['  File "/venv/sglang/srt/managers/scheduler.py", line 1060, in event_loop_normal', IMA]
    assert list(run(lines)) == ["illegal-memory-access"]  # named, its phase unknown (not claimed as replay)
    assert "phase unknown" in run(lines)["illegal-memory-access"].cause
    found = run(lines, dg.plan_facts(plan_doc))  # the deployment runs DDTREE
    assert "speculative decoding (DDTREE)" in found["illegal-memory-access-replay"].cause
    assert "ddtree-sglang.service" in found["illegal-memory-access-replay"].fix


def test_capture_oom_quotes_the_plans_sizes_and_memory_estimate(plan_doc: dict) -> None:
    doc = json.loads(json.dumps(plan_doc))
    doc["plan"]["memory_estimate"] = {"weights_gib_per_gpu": 74.2, "kv_gib_per_gpu": 31.5, "note": "±15 %"}
    f = fixture_findings("capture-oom-sglang-5285.log", dg.plan_facts(doc))["capture-oom"]
    assert "cuda_graph_max_bs 16, mem_fraction_static 0.85" in f.fix
    assert "e.g. 8" in f.fix
    assert "memory estimate: weights_gib_per_gpu=74.2, kv_gib_per_gpu=31.5, note=±15 %" in f.fix
    # the checkpoint reader's estimate (plan.checkpoint.memory, from the checkpoint's own config): GiB figures quoted
    doc["plan"].pop("memory_estimate")
    doc["plan"]["checkpoint"] = {"memory": {"weights_per_gpu": 79_671_214_899, "error_bound": "weights +-3 %",
                                            "kv_for": "16 requests x 8192 tokens",
                                            "gib": {"weights_per_gpu": 74.2, "kv_needed": 31.5, "graph_bound": 0.5,
                                                    "budget": 234.6, "gpu_memory": 276.0}}}
    f = fixture_findings("capture-oom-sglang-5285.log", dg.plan_facts(doc))["capture-oom"]
    assert ("memory estimate: weights_per_gpu 74.2 GiB, kv_needed 31.5 GiB (16 requests x 8192 tokens), graph_bound "
            "0.5 GiB, budget 234.6 GiB, gpu_memory 276 GiB (weights +-3 %)") in f.fix
    without = fixture_findings("capture-oom-sglang-5285.log")["capture-oom"]
    assert "this plan" not in without.fix and "cuda_graph_max_bs" in without.fix


def test_oom_outside_capture_is_its_own_signature() -> None:
    lines = ['  File "/venv/sglang/srt/mem_cache/memory_pool.py", line 120, in _create_buffers',
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "79.19 GiB of which 1.25 GiB is free."]
    assert list(run(lines)) == ["cuda-oom"]
    assert run(lines)["cuda-oom"].values["tried"] == "2.00 GiB"


@pytest.mark.parametrize(
    "line, name",
    [
        # sglang/srt/utils/watchdog.py (0.5.23):
        #   f"{self.debug_name} watchdog timeout ({self.watchdog_timeout=}, {self.soft=})"
        (
            "[2026-01-01 00:00:00] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
            "scheduler-watchdog",
        ),
        ("RuntimeError: No CUDA GPUs are available", "device-nodes-missing"),
        ("RuntimeError: CUDA error: no CUDA-capable device is detected", "device-nodes-missing"),
        (
            "CUDA Error CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected while calling init (cuInit)",
            "device-nodes-missing",
        ),
        (
            "RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: "
            "0, "
            "code: -98, name: EADDRINUSE, message: address already in use",
            "port-in-use",
        ),
        ("OSError: [Errno 98] Address already in use", "port-in-use"),
        ("FAIL port: port 30000 is held by python3 (pid 4242, unit other.service). Fix: stop it", "port-in-use"),
        ("FAIL ready: /health failed 3 consecutive probe(s), 1 s apart: answered 503 (starting)", "health-timeout"),
        (
            "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, "
            "Timeout(ms)=600000) ran for 600061 milliseconds before timing out.",
            "nccl-timeout",
        ),
    ],
)
def test_other_shapes_of_each_signature(line: str, name: str) -> None:
    assert list(run([line])) == [name]


@pytest.mark.parametrize("line", [
    '[2025-05-26 07:52:49] INFO:     10.0.0.3:60288 - "GET /health HTTP/1.1" 200 OK',
    "NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7",
    "[2026-01-01 00:00:00 TP0] Load weight end. type=DeepseekV3ForCausalLM, avail mem=37.21 GB",
    "the port 30000 is free",
    "ok   port: port 30000 is held by ddtree-sglang.service itself",
    "RuntimeError: The size of tensor a (32000) must match the size of tensor b (151936) at non-singleton dimension 1",
    "ptxas fatal   : Ptx assembly aborted due to errors",
    "warmup   bs=4     0.097 s     32 tokens  accept_length=3.10",
    "lxd.service: Start-post operation completed.",
])
def test_ordinary_lines_do_not_match(line: str) -> None:
    assert run([line]) == {}


def test_ptxas_fix_names_the_triton_variables_and_the_plans_override(plan_doc: dict) -> None:
    f = fixture_findings("ptxas-sm103a-triton-bundled.log")["ptxas-unknown-arch"]
    assert "TRITON_PTXAS_PATH" in f.fix and "TRITON_PTXAS_BLACKWELL_PATH" in f.fix and "--arch sm_103" in f.fix
    with_plan = fixture_findings("ptxas-sm103a-triton-bundled.log", dg.plan_facts(plan_doc))["ptxas-unknown-arch"]
    env = plan_doc["plan"]["toolchain"]["ptxas_env"]
    assert env and all(f"{k}={v}" in with_plan.fix for k, v in env.items())


@pytest.mark.parametrize("log", sorted(p.name for p in LOGS.glob("*.log") if not p.name.startswith("nearmiss")))
def test_line_numbers_are_the_files(log: str) -> None:
    """Blank lines and CRLF endings count as in the file: ``line`` points at the quoted line."""
    raw = (LOGS / log).read_bytes()
    for data in (raw, raw.replace(b"\n", b"\r\n")):
        file_lines = data.decode().splitlines()
        for f in dg.diagnose(dg.split_lines(data)):
            assert f.quote[:60] in file_lines[f.line - 1].replace('"', "'"), (log, f.line)


def test_one_finding_per_signature_with_count_and_first_line() -> None:
    found = fixture_findings("ima-replay-eagle-sglang-6309.log")["illegal-memory-access-replay"]
    assert (found.line, found.count) == (17, 2)  # the error line and the cudaErrorIllegalAddress hint


# ------------------------------------------------------------------ hostile input, secrets


def test_hostile_megabyte_lines_are_linear(tmp_path: Path) -> None:
    """1 MB lines built from every signature's prefixes (the worst case for a backtracking regex) are
    scanned in bounded time (each line is cut to MAX_LINE before any regex runs)."""
    pieces = ["The size of tensor a (", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=A",
              "[Errno 98] error while attempting to bind on address ('", "ptxas fatal : Value 'sm_",
              "/dev/nvidia-uvm ", "Health check failed. ", " watchdog timeout (", "CUDA out of memory. Tried to ",
              "NCCL WARN ", "FAIL warmup: warmup failed: ", "\x1b[", "\x1b]"]
    lines = []
    for p in pieces:
        lines.append((p * (1_000_000 // len(p) + 1))[:1_000_000])
    data = "\n".join(lines).encode()
    t0 = time.process_time()
    text = dg.split_lines(data)
    found = dg.diagnose(text)
    elapsed = time.process_time() - t0
    assert elapsed < 3.0, elapsed
    assert all(len(x) <= dg.MAX_LINE for x in text)
    # two pieces are, honestly, whole failure lines ("CUDA out of memory.", "FAIL warmup: warmup failed: ...");
    # no other prefix completes into a match
    assert [f.name for f in found] == ["cuda-oom", "warmup-failed"]


HOSTILE = ["The size of tensor a (", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=A",
           "[Errno 98] error while attempting to bind on address ('", "ptxas fatal : Value 'sm_", "/dev/nvidia-uvm ",
           "Health check failed. ", " watchdog timeout (", "Scheduler ", "NCCL WARN ",
           "failed to listen on any local network address. port: 1", "FAIL port: port 1", "a"]


def test_every_regex_is_linear_on_uncut_megabyte_lines() -> None:
    """Without the MAX_LINE cut: every pattern on 1 MB lines of repeated prefixes costs about 4x what it
    costs on 256 KB lines (linear; a backtracking blow-up would be 16x or worse). Measured on a 2-core VM:
    ~0.5 s and ~1.9 s CPU for all patterns together."""
    def cost(n: int) -> float:
        t0 = time.process_time()
        for sig in dg.SIGNATURES:
            for pat in sig.patterns:
                for p in HOSTILE:
                    pat.search((p * (n // len(p) + 1))[:n])
        return time.process_time() - t0

    small, big = cost(250_000), cost(1_000_000)
    assert big < 15.0, big
    assert big < 10 * max(small, 0.05), (small, big)


def test_a_flood_of_matching_lines_costs_bounded_time() -> None:
    """140k matching lines (each needing its context) among 210k: each line's context flags are computed
    once, and a signature is examined MAX_EVALUATIONS times at most (its count then a lower bound)."""
    frame = '  File "/venv/sglang/srt/speculative/eagle_worker.py", line 306, in forward_batch_generation'
    lines = [frame, IMA, "RuntimeError: The size of tensor a (8) must match the size of tensor b (33)"] * 70_000
    t0 = time.process_time()
    found = dg.diagnose(lines)
    assert time.process_time() - t0 < 5.0
    # the bare 8-vs-33 headline (no graph lines near it) is the likely width mismatch, the access a replay fault
    assert [f.name for f in found] == ["graph-size-mismatch", "illegal-memory-access-replay"]
    f = found[1]
    assert (f.name, f.count, f.count_capped) == ("illegal-memory-access-replay", dg.MAX_EVALUATIONS, True)
    assert f", {dg.MAX_EVALUATIONS}+x)" in f.message()


def test_nul_bytes_invalid_utf8_and_ansi_colour_are_tolerated() -> None:
    data = (b"\x00\x00\xff\xfe garbage \xc3\x28\n"
            b"\x1b[31mptxas fatal   : Value 'sm_103a' is not defined for option 'gpu-name'\x1b[0m\x00\n"
            b"\x1b]0;title\x07plain line\r\nprogress 10%\rprogress 100%\n")
    text = dg.split_lines(data)
    assert all("\x1b" not in x and "\x00" not in x for x in text)
    found = dg.diagnose(text)
    assert [f.name for f in found] == ["ptxas-unknown-arch"]
    assert found[0].quote == "ptxas fatal   : Value 'sm_103a' is not defined for option 'gpu-name'"


def test_quotes_are_scrubbed_and_cut() -> None:
    line = ("Exception: Capture cuda graph failed: CUDA out of memory. HF_TOKEN=hf_SECRETSECRETSECRET "
            "https://user:pa55word@example.com/x " + "x" * 500)
    f = run([line])["capture-oom"]
    assert "hf_SECRET" not in f.quote and "pa55word" not in f.quote and "(redacted)" in f.quote
    assert len(f.quote) <= dg.QUOTE_CHARS + 1 and f.quote.endswith("…")
    assert "hf_SECRET" not in f.message() and "pa55word" not in json.dumps(f.as_dict())


def test_registered_secrets_never_appear() -> None:
    from ddtree_ops.config.errors import register_secret

    register_secret("s3cr3t-vault-value-xyz")
    f = run(["lstat /dev/nvidia-uvm: no such file or directory s3cr3t-vault-value-xyz"])["nvidia-uvm-missing"]
    assert "s3cr3t-vault-value-xyz" not in f.message()
    f = run(["/dev/nvidia0 s3cr3t-vault-value-xyz: No such file or directory"])["device-nodes-missing"]
    assert "s3cr3t" not in f.message() and "s3cr3t" not in json.dumps(f.as_dict())


def test_tail_of_large_input_only(tmp_path: Path) -> None:
    """A file larger than the byte bound: only its last bytes count (a partial first line dropped)."""
    log = tmp_path / "big.log"
    head = b"ptxas fatal   : Value 'sm_103a' is not defined for option 'gpu-name'\n"
    filler = (b"INFO ordinary line\n" * 70_000)  # ~1.3 MB
    log.write_bytes(head + filler + b"OSError: [Errno 98] Address already in use\n")
    data = dg.read_file(log, max_bytes=1 << 20)
    assert len(data) <= 1 << 20 and data.startswith(b"INFO")
    assert [f.name for f in dg.diagnose(dg.split_lines(data))] == ["port-in-use"]
    assert len(dg.split_lines(data, max_lines=10)) == 10


def test_split_lines_keeps_the_last_lines_as_a_plain_split_would() -> None:
    """split_lines only splits the tail it keeps; its answer equals splitting everything, then taking
    the last N (2000 random inputs of a, b, CR and LF; empty input has no line, a lone LF one empty line)."""
    import random

    rnd = random.Random(7)
    cases = [b"", b"\n", b"a", b"a\n", b"\n\n", b"a\r\n\r\nb"]
    cases += [bytes(rnd.choice(b"ab\r\n") for _ in range(rnd.randint(0, 14))) for _ in range(2000)]
    for data in cases:
        raw = data.split(b"\n")
        if raw and raw[-1] == b"":
            raw.pop()
        whole = [dg._clean(r.rstrip(b"\r").decode()) for r in raw]
        for n in (1, 2, 5, 50):
            assert dg.split_lines(data, n) == whole[-n:], (data, n)


def test_many_short_lines_stay_cheap() -> None:
    data = b"ab\n" * (5 << 20)  # 15 MiB, 5 M lines: only the last 1000 are split
    t0 = time.process_time()
    assert len(dg.split_lines(data, 1000)) == 1000
    assert time.process_time() - t0 < 1.0


def test_stream_is_bounded(tmp_path: Path) -> None:
    src = tmp_path / "s"
    src.write_bytes(b"a line\n" * 400_000)  # 2.8 MB
    with open(src, "rb") as f:
        data = dg.read_stream(f, max_bytes=1 << 20, cap=2 << 20)
    assert len(data) <= 1 << 20 and data.startswith(b"a line")


# ------------------------------------------------------------------ CLI


def cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(["diagnose", *argv])
    o = capsys.readouterr()
    return rc, o.out, o.err


def test_cli_exit_codes_and_lines(capsys, tmp_path: Path, plan_file: Path) -> None:
    rc, out, _ = cli(capsys, ["--file", str(LOGS / "graph-size-mismatch-ddtree.log"), "--plan", str(plan_file)])
    assert rc == 1
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("FAIL graph-size-mismatch (line 23)")
    assert "(8)" in lines[0] and "(33)" in lines[0] and "draft 8, verify 33" in lines[0]

    unknown = tmp_path / "unknown.log"
    unknown.write_text("hello\nworld\n")
    rc, out, _ = cli(capsys, ["--file", str(unknown)])
    assert (rc, out) == (0, "ok   no known failure signature in 2 lines\n")

    unknown.write_text("one line, no newline")
    rc, out, _ = cli(capsys, ["--file", str(unknown)])
    assert (rc, out) == (0, "ok   no known failure signature in 1 line\n")

    empty = tmp_path / "empty.log"
    empty.write_text("")
    rc, out, _ = cli(capsys, ["--file", str(empty)])
    assert (rc, out) == (0, "ok   no known failure signature in 0 lines\n")


@pytest.mark.parametrize("argv, needle", [
    ([], "exactly one input"),
    (["-", "--file", "x.log"], "exactly one input"),
    (["/nonexistent/app.log"], "FILE '/nonexistent/app.log': No such file"),
    (["LOG", "--file", "LOG"], "exactly one input"),
    (["--unit", "-rf"], "not a systemd unit name"),
    (["--unit", "a b.service"], "not a systemd unit name"),
    (["--file", "/nonexistent/x.log"], "No such file"),
    (["--file", "/dev/null"], "not a regular file"),
    (["--file", "LOG", "--lines", "0"], "--lines 0"),
    (["--file", "LOG", "--max-mib", "0"], "--max-mib 0"),
    (["--file", "LOG", "--plan", "/dev/null"], "not a regular file"),
])
def test_cli_usage_errors_exit_2(capsys, argv: list[str], needle: str) -> None:
    argv = [str(LOGS / "health-timeout-sglang-10856.log") if a == "LOG" else a for a in argv]
    rc, out, err = cli(capsys, argv)
    assert rc == 2, (out, err)
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_help_states_the_modules_defaults(capsys) -> None:
    rc = main(["diagnose", "--help"])
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert rc == 0
    assert f"Default: {dg.DEFAULT_LINES}." in text and f"Default: {dg.DEFAULT_MAX_MIB}." in text


def test_cli_bad_plan_json_exit_2(capsys, tmp_path: Path) -> None:
    for text in ("{not json", "[]", '{"plan": 3}'):
        p = tmp_path / "plan.json"
        p.write_text(text)
        rc, _, err = cli(capsys, ["--file", str(LOGS / "health-timeout-sglang-10856.log"), "--plan", str(p)])
        assert rc == 2 and "--plan" in err and "plan.json" in err


def test_cli_stdin(capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO((LOGS / "nccl-timeout-sglang-1693.log").read_bytes()))
    )
    rc, out, _ = cli(capsys, ["-"])
    assert rc == 1 and out.startswith("FAIL nccl-timeout (line 7)")


def test_cli_json_shape(capsys, plan_file: Path) -> None:
    rc, out, _ = cli(capsys, ["--file", str(LOGS / "capture-oom-sglang-5285.log"), "--plan", str(plan_file), "--json"])
    assert rc == 1
    doc = json.loads(out)
    assert set(doc) == {"ok", "checks", "findings", "lines", "source", "signatures"}
    assert doc["ok"] is False and doc["lines"] == 18 and doc["source"] == "file"
    assert doc["signatures"] == list(dg.NAMES)
    assert doc["checks"] == [{"name": "diagnose:capture-oom", "ok": False, "detail": doc["checks"][0]["detail"]}]
    (f,) = doc["findings"]
    assert set(f) == {"name", "line", "origin", "count", "count_capped", "cause", "fix", "source", "quote", "values"}
    assert f["count_capped"] is False
    assert (f["name"], f["line"], f["count"]) == ("capture-oom", 18, 1)
    assert "cuda_graph_max_bs 16, mem_fraction_static 0.85" in f["fix"]

    rc, out, _ = cli(capsys, ["--file", str(LOGS / "nearmiss-healthy-startup-sglang-11716.log"), "--json"])
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True and doc["findings"] == []
    assert doc["checks"] == [{"name": "diagnose", "ok": True, "detail": "no known failure signature in 9 lines"}]


# ------------------------------------------------------------------ journalctl (a stand-in on PATH)


def stand_in(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "journalctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_cli_unit_reads_the_journal(capsys, tmp_path: Path, monkeypatch) -> None:
    argv_file = tmp_path / "argv"
    bindir = stand_in(tmp_path, f'[ "$1" = -k ] && exit 0\nprintf "%s\\n" "$@" > {argv_file}\n'
                                f'cat {LOGS / "own-unit-warmup-failed.log"}\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc, out, _ = cli(capsys, ["--unit", "ddtree-sglang.service", "--lines", "500", "--json"])
    assert rc == 1
    doc = json.loads(out)
    assert doc["source"] == "journalctl -u ddtree-sglang.service + journalctl -k -b (0 lines)"
    assert [f["name"] for f in doc["findings"]] == ["warmup-failed"]
    assert argv_file.read_text().split("\n")[:-1] == ["-u", "ddtree-sglang.service", "-b", "--no-pager", "-o", "cat",
                                                       "-n", "500"]


def test_cli_unit_without_entries_says_so(capsys, tmp_path: Path, monkeypatch) -> None:
    bindir = stand_in(tmp_path, "exit 0\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc, out, _ = cli(capsys, ["--unit", "nosuch.service"])
    assert rc == 0
    assert out == ("ok   no known failure signature in 0 lines; journalctl had no entries of nosuch.service in this "
                   "boot (unit name? run as root or in group systemd-journal)\n")


def test_journal_failures_and_deadline(tmp_path: Path, monkeypatch, capsys) -> None:
    bindir = stand_in(tmp_path, 'echo "Failed to add match \'x\': Invalid argument" >&2\nexit 1\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc, _, err = cli(capsys, ["--unit", "ddtree-sglang.service"])
    assert rc == 2 and "failed (exit 1): Failed to add match" in err

    slow = tmp_path / "slow"
    slow.mkdir()
    sbin = stand_in(slow, "echo started\nexec sleep 30\n")
    t0 = time.monotonic()
    with pytest.raises(dg.DiagnoseError, match="ran past 1 s"):
        dg.read_journal("ddtree-sglang.service", journalctl=str(sbin / "journalctl"), timeout_s=1.0)
    assert time.monotonic() - t0 < 5

    with pytest.raises(dg.DiagnoseError, match="cannot run journalctl"):
        dg.read_journal("x.service", journalctl=str(tmp_path / "missing"))


def test_cli_subprocess_end_to_end() -> None:
    """The installed entry point: the process exits 1 with one line, no traceback."""
    p = subprocess.run([sys.executable, "-m", "ddtree_ops", "diagnose", "--file",
                        str(LOGS / "port-in-use-uvicorn-vllm-8204.log")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr == ""
    assert p.stdout.startswith("FAIL port-in-use (line 4): port 44319 is already in use")


# ------------------------------------------------------------------ inputs that hung, crashed or leaked


def test_plan_that_is_a_fifo_is_refused_at_once(capsys, tmp_path: Path) -> None:
    """A FIFO as --plan was opened blocking and waited for a writer forever."""
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    rc, _, err = cli(capsys, ["--file", str(LOGS / "health-timeout-sglang-10856.log"), "--plan", str(fifo)])
    assert rc == 2 and "--plan" in err and "plan.fifo" in err and "not a regular file" in err
    assert time.monotonic() - t0 < 5


def test_plan_nested_too_deeply_is_a_usage_error(capsys, tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    rc, _, err = cli(capsys, ["--file", str(LOGS / "health-timeout-sglang-10856.log"), "--plan", str(p)])
    assert rc == 2 and "--plan" in err and "nested deeper" in err and "Traceback" not in err


def test_out_of_range_memory_figures_in_the_plan_are_ignored(capsys, tmp_path: Path) -> None:
    """A finite but absurd GiB figure (1e300) is ignored and the sane ones still quoted; what the
    shared plan.json reader refuses (NaN, a 4000-digit integer) is one usage line (exit 2)."""
    p = tmp_path / "plan.json"
    p.write_text('{"plan": {"cuda_graph_max_bs": 16, "checkpoint": {"memory": {"gib": {"weights_per_gpu": 1e300, '
                 '"budget": 70.5}}}}}')
    log = tmp_path / "log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    rc, out, err = cli(capsys, ["--file", str(log), "--plan", str(p)])
    assert rc == 1 and err == "" and "memory estimate: budget 70.5 GiB" in out and "weights_per_gpu" not in out
    for bad in ('{"plan": {"checkpoint": {"memory": {"gib": {"kv_needed": NaN}}}}}',
                '{"plan": {"gpu_memory": %s, "max_running_requests": 5}}' % ("9" * 4000)):
        p.write_text(bad)
        rc, out, err = cli(capsys, ["--file", str(log), "--plan", str(p)])
        assert rc == 2 and out == "" and err.count("\n") == 1 and "--plan" in err


def test_file_that_is_a_directory_names_the_option_and_path(capsys, tmp_path: Path) -> None:
    rc, _, err = cli(capsys, ["--file", str(tmp_path)])
    assert rc == 2 and f"--file '{tmp_path}': a directory" in err and err.count("\n") == 1


def _gone(pid: int, within_s: float = 3.0) -> bool:
    """The process is gone (or a zombie awaiting its new parent) within ``within_s`` seconds."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_journal_deadline_kills_the_process_group(tmp_path: Path) -> None:
    """journalctl's background child kept the pipe open past the deadline (40 s for 30): the whole group
    is killed at the deadline, and nothing of it survives."""
    pidfile = tmp_path / "child.pid"
    sbin = stand_in(tmp_path, f"echo 'CUDA out of memory.'\nsleep 30 &\necho $! > {pidfile}\nexec sleep 30\n")
    t0 = time.monotonic()
    with pytest.raises(dg.DiagnoseError, match="ran past 1 s"):
        dg.read_journal("ddtree-sglang.service", journalctl=str(sbin / "journalctl"), timeout_s=1.0)
    assert time.monotonic() - t0 < 4
    assert _gone(int(pidfile.read_text()))


def test_journal_read_stops_at_the_deadline_when_an_escaped_child_holds_the_pipe(tmp_path: Path) -> None:
    """A child in its own session (out of reach of the group kill) holding stdout: reading stops at the
    deadline all the same."""
    pidfile = tmp_path / "child.pid"
    sbin = stand_in(tmp_path, f"setsid sleep 30 &\necho $! > {pidfile}\necho started\nexit 0\n")
    t0 = time.monotonic()
    try:
        with pytest.raises(dg.DiagnoseError, match="ran past 1 s"):
            dg.read_journal("ddtree-sglang.service", journalctl=str(sbin / "journalctl"), timeout_s=1.0)
        assert time.monotonic() - t0 < 4
    finally:
        os.kill(int(pidfile.read_text()), 9)  # the escaped child this test started


@pytest.mark.parametrize("line, name", [
    ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", "illegal-memory-access"),
    ("RuntimeError: CUDA driver error: out of memory", "cuda-oom"),
    ("RuntimeError: CUDA error: an  illegal memory access was\tencountered", "illegal-memory-access"),
    ("torch.OutOfMemoryError: CUDA  out of memory. Tried to allocate 20.00 GiB", "cuda-oom"),
    ("RuntimeError: CUDA error: out of memory", "cuda-oom"),
    ("[2026-01-01 00:00:00 TP3] CUDA out of memory. Tried to allocate 1.00 GiB", "cuda-oom"),
    ("RuntimeError: The size of tensor a (8) must match the size of tensor b (33) at non-singleton dimension 1",
     "graph-size-mismatch"),
    ("ncclUnhandledCudaError: Call to CUDA function failed.", "nccl-timeout"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled "
     "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "nccl-timeout"),
    ('ptxas fatal   : Value "sm_103a" is not defined for option "gpu-name"', "ptxas-unknown-arch"),
    ('{"MESSAGE":"ptxas fatal   : Value \\u0027sm_103a\\u0027 is not defined for option \\u0027gpu-name\\u0027"}',
     "ptxas-unknown-arch"),
])
def test_real_error_shapes_without_context_are_found(line: str, name: str) -> None:
    found = run([line])
    assert list(found) == [name]
    if name == "graph-size-mismatch":
        assert "likely" in found[name].cause and "unconfirmed" in found[name].cause


@pytest.mark.parametrize("line", [
    "INFO: NCCL_DEBUG=WARN; no timeout set, ncclInternalError handlers installed",
    "INFO docs: see https://docs.sglang.ai/ for 'CUDA out of memory' troubleshooting tips",
    "RuntimeError: The size of tensor a (32) must match the size of tensor b (99) at non-singleton dimension 0",
    "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 0",
])
def test_words_of_a_signature_in_ordinary_lines_are_not_findings(line: str) -> None:
    assert run([line]) == {}


@pytest.mark.parametrize("tail, secret", [
    ("loading with hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567 from cache", "hf_AbCd"),
    ("argv: --api-key SEKRIT1 --port 1", "SEKRIT1"), ('export OPENAI_API_KEY="SEKRIT2"', "SEKRIT2"),
    ("ServerArgs(api_key='SEKRIT3', port=30000)", "SEKRIT3"), ('{"hf_token": "SEKRIT4", "x": 1}', "SEKRIT4"),
    ("HF_TOKEN = SEKRIT5", "SEKRIT5"), ("token: SEKRIT6", "SEKRIT6"),
])
def test_quoted_lines_leak_no_secret_shape(capsys, monkeypatch, tail: str, secret: str) -> None:
    import io

    log = f"torch.OutOfMemoryError: CUDA out of memory. {tail}\n".encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(log)))
    rc, out, _ = cli(capsys, ["-", "--json"])
    assert rc == 1 and json.loads(out)["findings"][0]["quote"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert secret not in out and "(redacted)" in out
