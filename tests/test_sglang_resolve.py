"""SGLang's own resolution (``ddtree_ops.sglang.resolve``), controller side: the diff of
resolved settings against the plan, the wording (never "resolved" unless it ran), the
probe's ``sglang-resolution`` check, the child run's failure modes (real subprocesses:
deadline, output floods, process group, escapes and secrets), the static b300 Qwen3.5 rule,
drift of attention_backend / page_size, and ``plan --resolve-with`` argument errors and exit
codes. The real 0.5.23 resolver runs in ``tests/peer/test_resolve.py``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO

from ddtree_ops.config import validate_hostvars
from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.drift import find_drift
from ddtree_ops.sglang import resolve
from ddtree_ops.sglang.probe import resolution_check
from ddtree_ops.sglang.resolve import diff_plan, passes, planned_values, request_for, run_resolution, summary

QWEN35 = FIXTURES / "sglang" / "resolve" / "qwen3_5_moe-35b-a3b-fp8.config.json"


def qwen35_eagle(host_class: str = "b300", **server) -> dict:
    """b300, SGLang 0.5.23, Qwen3.5 MoE FP8 target, EAGLE topk 1, page_size 16 (the case the static
    b300 Qwen3.5 rule covers: SGLang's resolution changes attention_backend / page_size)."""
    return {
        "ddtree_host_class": host_class,
        "ddtree_sglang": {"source": "pypi", "version": "0.5.23"},
        "ddtree_model": {"path": "Qwen/Qwen3.5-35B-A3B-FP8"},
        "ddtree_speculative": {"algorithm": "EAGLE", "draft_model_path": "Qwen/Qwen3.5-35B-A3B-FP8",
                               "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "ddtree_server": {"tp_size": 8, "max_running_requests": 32, "page_size": 16, **server},
    }


def resolved(v, **changed) -> dict:
    """A ``resolved`` result whose fields equal the plan, except ``changed``."""
    p = v.plan
    got = {"attention_backend": p.attention_backend, "page_size": p.page_size, "decode_capture_bs": p.capture_bs,
           "decode_max_bs": p.cuda_graph_max_bs, "disable_cuda_graph": False,
           "max_running_requests": p.max_running_requests, "speculative_algorithm": p.algorithm,
           "speculative_num_steps": p.num_steps, "speculative_eagle_topk": p.topk,
           "speculative_num_draft_tokens": p.num_draft_tokens, "speculative_dflash_block_size": None,
           "disable_overlap_schedule": False, **changed}
    return {"state": "resolved", "version": "0.5.23", "how": "resolve_once", "resolved": got,
            "sources": {"attention_backend": "_qwen3_5_hybrid_overrides", "page_size": "_qwen3_5_hybrid_overrides"}}


# ---- diff -----------------------------------------------------------------------------

def test_diff_names_each_rewrite_with_sglangs_step():
    v = validate_hostvars("q1", qwen35_eagle())
    lines = diff_plan(planned_values(v.plan), resolved(v, attention_backend="triton", page_size=1))
    assert lines == [
        "SGLang 0.5.23 will change attention_backend unset (SGLang decides) → triton (set by SGLang's "
        "_qwen3_5_hybrid_overrides)",
        "SGLang 0.5.23 will change page_size 16 → 1 (set by SGLang's _qwen3_5_hybrid_overrides)",
    ]


def test_diff_is_empty_when_sglang_keeps_the_plan():
    v = validate_hostvars("q1", qwen35_eagle(attention_backend="trtllm_mha"))
    assert diff_plan(planned_values(v.plan), resolved(v)) == []


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        (
            "decode_capture_bs",
            [1, 2, 4, 8, 16, 32],
            "capture list (decode bs) [1 2 3 4 5 6 7 8 10 12 14 16 18 20 22 24 26 28 30 32] → [1 2 4 8 16 32]",
        ),
        ("max_running_requests", 48, "max_running_requests 32 → 48"),
        ("speculative_num_draft_tokens", 8, "speculative_num_draft_tokens 4 → 8"),
        ("speculative_eagle_topk", 4, "speculative_eagle_topk 1 → 4"),
        ("disable_overlap_schedule", True, "disable_overlap_schedule (overlap scheduling off) False → True"),
    ],
)
def test_diff_covers_capture_list_limits_speculation_and_overlap(field, value, expect):
    v = validate_hostvars("q1", qwen35_eagle(attention_backend="trtllm_mha"))
    lines = diff_plan(planned_values(v.plan), resolved(v, **{field: value}))
    assert lines == [f"SGLang 0.5.23 will change {expect}"]


def test_planned_values_compare_ddtree_as_dflash():
    """DDTree rides on SGLang's DFlash worker: a DFLASH resolution of a DDTree plan is no change."""
    from helpers import base_hostvars

    v = validate_hostvars("h1", base_hostvars())
    planned = planned_values(v.plan)
    assert planned["speculative_algorithm"] == "DFLASH" and planned["speculative_dflash_block_size"] == 8
    assert planned["attention_backend"] == "triton" and planned["page_size"] == 1


# ---- wording: never "resolved" unless it ran --------------------------------------------

def test_summary_says_resolved_only_when_resolution_ran():
    v = validate_hostvars("q1", qwen35_eagle())
    assert summary(resolved(v)) == "resolved by SGLang 0.5.23 (resolve_once)"
    not_run = {"state": "not-run", "version": "0.5.23", "detail": "no GPU here and no known arch"}
    assert summary(not_run, parsed=True) == "parsed only; resolution not run: no GPU here and no known arch"
    assert summary(not_run) == "resolution not run: no GPU here and no known arch"
    refused = {"state": "refused", "version": "0.5.23", "how": "resolve_once", "detail": "ValueError: nope"}
    assert summary(refused) == "SGLang 0.5.23 refused the arguments during resolve_once: ValueError: nope"
    for r in (not_run, refused):
        assert "resolved by" not in summary(r, parsed=True)


def test_probe_check_fails_only_on_a_refusal_and_quotes_sglang():
    v = validate_hostvars("q1", qwen35_eagle())
    planned = planned_values(v.plan)
    ok = resolution_check(resolved(v, attention_backend="triton", page_size=1), planned)
    assert ok["ok"] and ok["name"] == "sglang-resolution" and ok["state"] == "resolved"
    assert ok["detail"].startswith("resolved by SGLang 0.5.23 (resolve_once); SGLang 0.5.23 will change")
    assert ok["changes"][1] == "SGLang 0.5.23 will change page_size 16 → 1 (set by SGLang's _qwen3_5_hybrid_overrides)"
    same = resolution_check(resolved(v, page_size=16, attention_backend=None), planned)
    assert same["detail"] == "resolved by SGLang 0.5.23 (resolve_once); every compared setting matches the plan"
    msg = "ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding."
    bad = resolution_check({"state": "refused", "version": "0.5.23", "how": "resolve_once", "detail": msg}, planned)
    assert not bad["ok"] and bad["detail"].endswith(msg) and "resolved by" not in bad["detail"]
    skipped = resolution_check({"state": "not-run", "version": "0.5.23", "detail": "no config.json for --model-path x"},
                               planned)
    assert skipped["ok"] and skipped["detail"] == "parsed only; resolution not run: no config.json for --model-path x"


# ---- the child run: real subprocesses; every failure of the child is "failed" with a reason

def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


def test_child_without_sglang_is_not_run(tmp_path):
    """The project venv has no SGLang: the real child says so (not a crash, not 'resolved'),
    and it is the venv's fault, not a limit of this machine: not ``cannot_run_here``."""
    v = validate_hostvars("q1", qwen35_eagle())
    res = run_resolution(sys.executable, request_for(v, {}), deadline_s=60)
    assert res["state"] == "not-run" and not res.ran and not passes(res)
    assert "SGLang is not importable" in res["detail"]


def _valid_line(**fields) -> str:
    doc = {"state": "resolved", "version": "0.5.23", "how": "resolve_once", "detail": "", "resolved": {},
           "sources": {}, "pretend": None, **fields}
    return "ddtree-resolve: " + json.dumps(doc)


@pytest.mark.parametrize(("body", "why"), [
    ("exec sleep 30", "did not finish within 1 s (killed with its process group)"),
    ("exec >&- 2>&-; exec sleep 30", "did not finish within 1 s (killed with its process group)"),
    ('echo "ddtree-resolve: {\\"state\\": \\"resolved\\"" ; exit 3', "could not run the resolver (exit 3)"),
    ("echo 'not json {'", "printed no 'ddtree-resolve:' result line (exit 0)"),
    ("echo 'ddtree-resolve: [1, 2, 3]'", "malformed result line: the result is a JSON list, not an object"),
    ("echo 'ddtree-resolve: {\"ok\": true}'", "malformed result line: state None is not resolved"),
    ("echo 'ddtree-resolve: {\"state\": \"resolved\", \"version\": 7}'", "version is a int, not a string"),
    ("echo 'ddtree-resolve: {\"state\": \"resolved\"}'", "a resolved result without a 'resolved' object"),
    ("python3 -c 'print(\"ddtree-resolve: \" + \"[\" * 100000)'", "malformed result line"),
])
def test_child_failures_are_failed_with_the_reason(tmp_path, body, why):
    """Hang, garbage, non-object, wrong shapes, non-zero exit: ``failed`` (never 'not run')."""
    req = request_for(validate_hostvars("q1", qwen35_eagle()), {})
    res = run_resolution(_script(tmp_path, body), req, deadline_s=1 if "sleep" in body else 30)
    assert res["state"] == "failed" and not passes(res) and why in res["detail"], res
    assert summary(res).startswith("resolution failed: ")


def test_missing_or_not_executable_interpreter_is_failed(tmp_path):
    req = request_for(validate_hostvars("q1", qwen35_eagle()), {})
    res = run_resolution(str(tmp_path / "nope"), req)
    assert res["state"] == "failed" and res["detail"].endswith("no such interpreter (give the python of a venv "
                                                                "holding the pinned SGLang)")
    junk = tmp_path / "junk"
    junk.write_text("junk")
    res = run_resolution(str(junk), req)
    assert res["state"] == "failed" and res["detail"].startswith(f"{junk}: not executable")


def test_a_valid_result_with_a_nonzero_exit_is_failed(tmp_path):
    res = run_resolution(_script(tmp_path, f"echo '{_valid_line()}'; exit 3"), {"argv": []})
    assert res["state"] == "failed" and "(exit 3)" in res["detail"]
    ok = run_resolution(_script(tmp_path, f"echo chatter; echo '{_valid_line()}'"), {"argv": []})
    assert ok["state"] == "resolved" and passes(ok)


def _gone(pid: int, within_s: float = 3.0) -> bool:
    """``pid`` no longer runs (gone, or a zombie awaiting its new parent's reaping)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X"):
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_deadline_kills_the_whole_process_group(tmp_path):
    """A child and its grandchild (which holds
    the stdout pipe) both die at the deadline, which bounds the wall time."""
    pidfile = tmp_path / "pid"
    py = _script(tmp_path, f"sleep 60 & echo $! > {pidfile}; exec sleep 60")
    t0 = time.monotonic()
    res = run_resolution(py, {"argv": []}, deadline_s=1.5)
    assert time.monotonic() - t0 < 2.5, "the deadline must bound the wall time"
    assert res["state"] == "failed" and "did not finish within 1.5 s" in res["detail"]
    assert _gone(int(pidfile.read_text()))


def test_leftovers_die_when_the_child_exits(tmp_path):
    """A descendant left behind (holding stdout, or not) is killed once the child exited;
    the result is read without waiting for the deadline."""
    held, quiet = tmp_path / "held", tmp_path / "quiet"
    py = _script(tmp_path, f"sleep 60 & echo $! > {held}; sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {quiet}; "
                           f"echo '{_valid_line()}'")
    t0 = time.monotonic()
    res = run_resolution(py, {"argv": []}, deadline_s=30)
    assert time.monotonic() - t0 < 5 and res["state"] == "resolved", res
    assert _gone(int(held.read_text())) and _gone(int(quiet.read_text()))


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_an_output_flood_is_killed_and_memory_stays_bounded(tmp_path, stream):
    """An output flood (`exec yes`: 15.7 GB, 29 s before): bounded buffers, killed early."""
    py = _script(tmp_path, "exec yes '{\"a\":1}'" + (" >&2" if stream == "stderr" else ""))
    t0 = time.monotonic()
    rc, out, err, why = resolve.run_child([py], dict(os.environ), 20)
    assert time.monotonic() - t0 < 10 and rc is None and f"on {stream} (killed)" in why
    assert len(out) <= resolve.STDOUT_MAX_BYTES + 65536 and len(err) <= resolve.STDERR_TAIL_BYTES
    res = run_resolution(py, {"argv": []}, deadline_s=20)
    assert res["state"] == "failed" and "printed more than" in res["detail"]


OSC = "boom \x1b]52;c;cm0gLXJmIH4K\x1b\\ \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x1b[2J"


def test_child_text_is_cleaned_scrubbed_and_cut(tmp_path):
    """Terminal escapes (OSC 52) and secrets in a failing child's output: the stderr line and the
    result's text fields reach the table/JSON without escapes or secrets, ~200 chars."""
    err = tmp_path / "err.txt"
    err.write_text(OSC + " Authorization: Bearer SEKRITresolver " + "x" * 500 + "\n")
    res = run_resolution(_script(tmp_path, f"cat {err} >&2; exit 3"), {"argv": []})
    d = res["detail"]
    assert res["state"] == "failed" and "\x1b" not in d and "SEKRIT" not in d and "boom" in d and "click" in d
    assert d.endswith("…") and len(d) < 400
    line = _valid_line(version="0.5.23\x1b[2J", detail="", pretend="no GPU \x1b]52;c;eA==\x07here",
                       resolved={"attention_backend": "triton\x1b]8;;http://evil/\x1b\\", "page_size": 1,
                                 "not_a_field": "x"}, sources={"page_size": "step\x07"})
    out = tmp_path / "out.txt"
    out.write_text(line + "\n")
    res = run_resolution(_script(tmp_path, f"cat {out}"), {"argv": []})
    assert res["state"] == "resolved" and res["version"] == "0.5.23"
    assert res["resolved"] == {"attention_backend": "triton", "page_size": 1}
    # (a control character becomes a space)
    assert res["pretend"] == "no GPU here" and res["sources"] == {"page_size": "step "}


def test_passes_only_resolved_or_a_documented_no_gpu_limit():
    assert passes({"state": "resolved"})
    assert passes({"state": "not-run", "cannot_run_here": True})
    for res in ({"state": "not-run"}, {"state": "not-run", "cannot_run_here": "yes"}, {"state": "refused"},
                {"state": "failed"}):
        assert not passes(res), res


def _fake_build(monkeypatch, *, cuda: str | None, raise_in_parse: Exception | None = None, staged: bool = True):
    """Stand-in ``sglang``/``torch`` modules (no GPU) for :func:`resolve_in_build`'s not-run paths."""
    torch = types.ModuleType("torch")
    torch.__version__ = "2.9.1+cpu"
    torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    torch.version = types.SimpleNamespace(cuda=cuda)
    sglang, srt, sa = (types.ModuleType(n) for n in ("sglang", "sglang.srt", "sglang.srt.server_args"))
    sglang.__version__ = "0.5.23" if staged else "0.5.13.post1"
    srt.server_args = sa

    class ServerArgs:
        if staged:
            def resolve_once(self):
                raise AssertionError("not reached")

    def prepare_server_args(argv):
        raise raise_in_parse

    sa.ServerArgs, sa.prepare_server_args = ServerArgs, prepare_server_args
    common = types.ModuleType("sglang.srt.utils.common")
    utils = types.ModuleType("sglang.srt.utils")
    utils.common, srt.utils = common, utils
    for name, mod in (("torch", torch), ("sglang", sglang), ("sglang.srt", srt), ("sglang.srt.server_args", sa),
                      ("sglang.srt.utils", utils), ("sglang.srt.utils.common", common)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_child_marks_only_the_documented_no_gpu_paths_cannot_run_here(monkeypatch):
    """No GPU and no arch to pretend for, or 0.5.13.post1's post-init stopping: a limit of this
    machine (``cannot_run_here``, plan exit 0). A CPU-only torch: the venv's fault (exit 1)."""
    argv = ["--model-path", "m"]
    models = {"target": {"architectures": ["X"]}}
    _fake_build(monkeypatch, cuda=None)
    res = resolve.resolve_in_build({"argv": argv, "arch": None, "models": models})
    assert res["state"] == "not-run" and res["cannot_run_here"] is True and "no known arch" in res["detail"]
    res = resolve.resolve_in_build({"argv": argv, "arch": "sm_103", "models": models})
    assert res["state"] == "not-run" and res["cannot_run_here"] is False and "CPU build" in res["detail"]
    _fake_build(monkeypatch, cuda="12.8", staged=False, raise_in_parse=RuntimeError("no accelerator"))
    res = resolve.resolve_in_build({"argv": argv, "arch": "sm_103", "models": models})
    assert res["state"] == "not-run" and res["cannot_run_here"] is True and "post-init stopped" in res["detail"]
    _fake_build(monkeypatch, cuda="12.8", raise_in_parse=ImportError("no module named triton"))
    res = resolve.resolve_in_build({"argv": argv, "arch": "sm_103", "models": models})
    assert res["state"] == "not-run" and res["cannot_run_here"] is False and "cannot run" in res["detail"]


def test_request_carries_host_class_arch_and_memory():
    v = validate_hostvars("q1", qwen35_eagle())
    req = request_for(v, {"target": {"architectures": ["X"]}})
    assert (req["arch"], req["gpu_memory_gib"]) == ("sm_103", 288)
    assert req["argv"][:2] == ["--model-path", "Qwen/Qwen3.5-35B-A3B-FP8"] and "--page-size" in req["argv"]
    ct = request_for(validate_hostvars("c1", qwen35_eagle("ct200")), {})
    assert (ct["arch"], ct["gpu_memory_gib"]) == ("sm_120", 96)


# ---- static rule (plain `plan`, no venv) -----------------------------------------------

def _rule_warnings(hv: dict) -> list[str]:
    return [w for w in validate_hostvars("q1", hv).plan.warnings if "triton attention with page_size 1" in w]


def test_static_rule_warns_for_the_b300_qwen35_case():
    (w,) = _rule_warnings(qwen35_eagle())
    assert "ddtree_server.page_size = 16" in w and "SGLang 0.5.23 on sm_103 (b300)" in w
    assert "attention_backend: trtllm_mha" in w and "model_overrides/qwen3_5.py" in w


@pytest.mark.parametrize("change", [
    {"ddtree_server": {"tp_size": 8, "max_running_requests": 32, "page_size": 16, "attention_backend": "trtllm_mha"}},
    {"ddtree_server": {"tp_size": 8, "max_running_requests": 32, "page_size": 1}},
    {"ddtree_model": {"path": "Qwen/Qwen3-30B-A3B-FP8"}},
    {"ddtree_host_class": "ct200"},
    {"ddtree_sglang": {"source": "pypi", "version": "0.5.13.post1"}},
])
def test_static_rule_stays_quiet_outside_its_case(change):
    hv = {**qwen35_eagle(), **change}
    assert _rule_warnings(hv) == []


# ---- drift ------------------------------------------------------------------------------

def test_drift_compares_attention_backend_and_page_size():
    """SGLang 0.5.23's own resolved server args (fixture; /server_info reports them at the
    top level) against a plan with trtllm_mha / page 16: both are drift."""
    v = validate_hostvars("q1", qwen35_eagle(attention_backend="trtllm_mha"))
    real = json.loads((FIXTURES / "sglang" / "resolved_server_args-0.5.23-eagle-tp8.json").read_text())
    drifts, missing = find_drift(plan_document(v), real)
    by = {d.name: d for d in drifts}
    assert str(by["attention_backend"]) == ("attention_backend: deployed 'trtllm_mha', running 'triton' "
                                            "(server_info.attention_backend)")
    assert str(by["page_size"]) == "page_size: deployed 16, running 1 (server_info.page_size)"
    info = copy.deepcopy(real)
    info.update(attention_backend="trtllm_mha", page_size=16)
    assert not {"attention_backend", "page_size"} & {d.name for d in find_drift(plan_document(v), info)[0]}


def test_drift_skips_what_the_plan_leaves_to_sglang():
    v = validate_hostvars("q1", qwen35_eagle())   # attention_backend unset
    real = json.loads((FIXTURES / "sglang" / "resolved_server_args-0.5.23-eagle-tp8.json").read_text())
    names = {d.name for d in find_drift(plan_document(v), real)[0]}
    assert "attention_backend" not in names and "page_size" in names


# ---- plan --resolve-with: argument errors ----------------------------------------------

@pytest.fixture()
def qwen_inventory(tmp_path) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"q1": {}}}}}}))
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(qwen35_eagle()))
    return inv


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddtree_ops", "plan", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_plan_warns_statically_without_a_venv(qwen_inventory):
    proc = _plan("-i", str(qwen_inventory), "--json")
    assert proc.returncode == 0, proc.stderr
    (w,) = [w for w in json.loads(proc.stdout)["hosts"]["q1"]["warnings"] if "triton attention" in w]
    assert "page_size = 16" in w


def test_plan_model_config_errors_are_one_line(qwen_inventory, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--model-config", str(bad))
    assert proc.returncode == 2
    assert f"--model-config {bad}: must be a JSON object, not list" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad.write_text('{"architectures": "X"}')
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--model-config", str(bad))
    assert proc.returncode == 2 and "not a JSON object with an 'architectures' list" in proc.stderr
    bad.write_text("[" * 200_000)  # RecursionError (exit 70) before
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--model-config", str(bad))
    assert proc.returncode == 2 and "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr
    proc = _plan("-i", str(qwen_inventory), "--model-config", str(QWEN35))
    assert proc.returncode == 2 and "--model-config/--draft-config need --resolve-with PYTHON" in proc.stderr
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--draft-config", str(tmp_path))
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_plan_resolve_with_a_python_without_sglang_fails(qwen_inventory):
    """The operator asked for a resolution and it did not run: exit 1,
    a failed ``sglang-resolution:<host>`` check naming why."""
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    res = doc["hosts"]["q1"]["sglang_resolution"]
    assert res["state"] == "not-run" and res["detail"].startswith("resolution not run: SGLang is not importable")
    assert {"name": "sglang-resolution:q1", "ok": False, "detail": res["detail"]} in doc["checks"]
    assert doc["ok"] is False


@pytest.mark.parametrize("as_json", [True, False])
def test_plan_fails_on_a_misbehaving_resolver_without_escapes(qwen_inventory, tmp_path, as_json):
    """A resolver that exits non-zero with terminal escapes: exit 1, the reason shown, no
    terminal escape and no secret printed, in the table and in the JSON."""
    err = tmp_path / "err.txt"
    err.write_text(OSC + " Authorization: Bearer SEKRITresolver\n")
    py = _script(tmp_path, f"cat {err} >&2; exit 3")
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", py, *(["--json"] if as_json else []))
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "SEKRIT" not in proc.stdout + proc.stderr
    assert "could not run the resolver (exit 3): boom" in " ".join(proc.stdout.split())
    if as_json:
        (check,) = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "sglang-resolution:q1"]
        assert not check["ok"] and check["detail"].startswith("resolution failed: ")


@pytest.mark.parametrize(("cannot_run_here", "rc"), [(True, 0), (False, 1)])
def test_plan_not_run_passes_only_for_a_documented_no_gpu_limit(qwen_inventory, tmp_path, cannot_run_here, rc):
    """SGLang's own resolver cannot run without a GPU (sgl_kernel needs libcuda; 0.5.13.post1's
    post-init): exit 0, said so. Any other not-run (the venv's or the request's fault): exit 1."""
    line = _valid_line(state="not-run", resolved=None, detail="SGLang 0.5.23's resolver imports sgl_kernel",
                       cannot_run_here=cannot_run_here)
    out = tmp_path / "out.txt"
    out.write_text(line + "\n")
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", _script(tmp_path, f"cat {out}"), "--json")
    assert proc.returncode == rc, proc.stdout + proc.stderr
    (check,) = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "sglang-resolution:q1"]
    assert check == {"name": "sglang-resolution:q1", "ok": cannot_run_here,
                     "detail": "resolution not run: SGLang 0.5.23's resolver imports sgl_kernel"}


def test_resolve_module_imports_only_the_stdlib():
    """The child half runs in SGLang venvs without ddtree-ops' dependencies (and by path,
    without ddtree-ops installed at all): importing it must pull no third-party module."""
    code = ("import sys; before = set(sys.modules); import ddtree_ops.sglang.resolve; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(m for m in new if m != 'ddtree_ops' and m not in sys.stdlib_module_names))")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_picked_reads_the_dataclass_cuda_graph_config_of_0_5_17():
    """SGLang 0.5.17 keeps ``cuda_graph_config`` as a ``CudaGraphConfig`` dataclass (one
    ``PhaseConfig`` per phase) in ``vars(ServerArgs)``; the probe met it on the real H200 run and
    stopped with "'CudaGraphConfig' object has no attribute 'get'". The shape below is 0.5.17's
    (``sglang/srt/model_executor/cuda_graph_config.py``: backend, max_bs, bs per phase)."""
    from dataclasses import dataclass, field

    from ddtree_ops.sglang.resolve import _picked

    @dataclass
    class PhaseConfig:
        backend: str = "disabled"
        max_bs: int | None = None
        bs: list[int] | None = None

    @dataclass
    class CudaGraphConfig:
        decode: PhaseConfig = field(default_factory=lambda: PhaseConfig("full", 16, [1, 2, 4, 8, 16]))
        prefill: PhaseConfig = field(default_factory=lambda: PhaseConfig("breakable"))

    out = _picked({"cuda_graph_config": CudaGraphConfig()})
    assert (out["decode_capture_bs"], out["decode_max_bs"]) == ([1, 2, 4, 8, 16], 16)
    off = _picked({"cuda_graph_config": CudaGraphConfig(decode=PhaseConfig("disabled", 8, [1]))})
    assert off["disable_cuda_graph"] is True
    assert _picked({"cuda_graph_config": {"decode": {"bs": [1], "max_bs": 1}}})["decode_capture_bs"] == [1]


def test_a_derived_backend_is_compared_as_the_plan_derived_it():
    """An unset backend and page size the plan derives (fa3, page 1 on sm_90 with EAGLE3 topk 1,
    what real SGLang 0.5.17 derived on an H200) are no change when SGLang lands there, and a
    resolution elsewhere names the derived value it contradicts instead of "SGLang decides"."""
    from test_derived_defaults import on

    v = validate_hostvars("h1", on("h200x1", "0.5.17", "EAGLE3"))
    assert (v.plan.attention_backend, v.plan.page_size) == (None, None)
    planned = planned_values(v.plan)
    assert (planned["attention_backend"], planned["page_size"]) == ("fa3", 1)
    assert json.loads(json.dumps(planned))["attention_backend"] == "fa3"   # the host probe's copy
    same = {"version": "0.5.17", "resolved": {"attention_backend": "fa3", "page_size": 1}, "sources": {}}
    assert diff_plan(planned, same) == []
    other = {"version": "0.5.17", "resolved": {"attention_backend": "flashinfer", "page_size": 1},
             "sources": {"attention_backend": "_handle_attention_backend_compatibility"}}
    assert diff_plan(planned, other) == [
        "SGLang 0.5.17 will change attention_backend unset (ddtree-ops derived fa3, as `plan` shows) → "
        "flashinfer (set by SGLang's _handle_attention_backend_compatibility)"]
