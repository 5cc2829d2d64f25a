"""SGLang's own resolution (``ddtree_ops.sglang.resolve``), controller side: the diff of
resolved settings against the plan, the wording (never "resolved" unless it ran), the
probe's ``sglang-resolution`` check, the child run's failure modes (real subprocesses), the
static b300 Qwen3.5 rule, drift of attention_backend / page_size, and ``plan --resolve-with``
argument errors. The real 0.5.23 resolver runs in ``tests/peer/test_resolve.py``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddtree_ops.config import validate_hostvars
from ddtree_ops.ops.drift import find_drift
from ddtree_ops.render.files import plan_document
from ddtree_ops.sglang.probe import resolution_check
from ddtree_ops.sglang.resolve import diff_plan, planned_values, request_for, run_resolution, summary
from helpers import FIXTURES, REPO

QWEN35 = FIXTURES / "sglang" / "resolve" / "qwen3_5_moe-35b-a3b-fp8.config.json"


def qwen35_eagle(host_class: str = "b300", **server) -> dict:
    """b300, SGLang 0.5.23, Qwen3.5 MoE FP8 target, EAGLE topk 1, page_size 16 (issue 10's case)."""
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


@pytest.mark.parametrize(("field", "value", "expect"), [
    ("decode_capture_bs", [1, 2, 4, 8, 16, 32], "capture list (decode bs) [1 2 3 4 5 6 7 8 10 12 14 16 18 20 22 24 26 28 "
                                                "30 32] → [1 2 4 8 16 32]"),
    ("max_running_requests", 48, "max_running_requests 32 → 48"),
    ("speculative_num_draft_tokens", 8, "speculative_num_draft_tokens 4 → 8"),
    ("speculative_eagle_topk", 4, "speculative_eagle_topk 1 → 4"),
    ("disable_overlap_schedule", True, "disable_overlap_schedule (overlap scheduling off) False → True"),
])
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


# ---- the child run: real subprocesses, every failure is "not run" with a reason --------

def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


def test_child_without_sglang_is_not_run(tmp_path):
    """The project venv has no SGLang: the real child says so (not a crash, not 'resolved')."""
    v = validate_hostvars("q1", qwen35_eagle())
    res = run_resolution(sys.executable, request_for(v, {}), deadline_s=60)
    assert res["state"] == "not-run" and not res.ran
    assert "SGLang is not importable" in res["detail"]


def test_missing_interpreter_hung_child_and_garbage_are_not_run(tmp_path):
    v = validate_hostvars("q1", qwen35_eagle())
    req = request_for(v, {})
    res = run_resolution(str(tmp_path / "nope"), req)
    assert res["state"] == "not-run" and res["detail"].endswith("no such interpreter (give the python of a venv "
                                                                 "holding the pinned SGLang)")
    res = run_resolution(_script(tmp_path, "exec sleep 30"), req, deadline_s=1)
    assert res["state"] == "not-run" and res["detail"] == "SGLang's resolution did not finish within 1 s (killed)"
    res = run_resolution(_script(tmp_path, 'echo "ddtree-resolve: {\\"state\\": \\"resolved\\"" ; exit 3'), req)
    assert res["state"] == "not-run" and "could not run the resolver (exit 3)" in res["detail"]


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
    bad.write_text("[" * 200_000)  # attack pass 4: RecursionError (exit 70) before
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--model-config", str(bad))
    assert proc.returncode == 2 and "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr
    proc = _plan("-i", str(qwen_inventory), "--model-config", str(QWEN35))
    assert proc.returncode == 2 and "--model-config/--draft-config need --resolve-with PYTHON" in proc.stderr
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--draft-config", str(tmp_path))
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_plan_resolve_with_a_python_without_sglang_says_not_run(qwen_inventory):
    proc = _plan("-i", str(qwen_inventory), "--resolve-with", sys.executable, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    res = doc["hosts"]["q1"]["sglang_resolution"]
    assert res["state"] == "not-run" and res["detail"].startswith("resolution not run: SGLang is not importable")
    assert {"name": "sglang-resolution:q1", "ok": True, "detail": res["detail"]} in doc["checks"]


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
