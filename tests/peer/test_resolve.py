"""SGLang's OWN resolution of our argv, with the real 0.5.23 resolver.

``ddtree_ops.sglang.resolve`` runs ``prepare_server_args`` + ``ServerArgs.resolve_once()``
in the cached resolver venv (``scripts/sglang-resolve-venv.sh 0.5.23``) on config-only model
directories, with SGLang's device probes answering for the host class's arch (no GPU here;
the patch is described in the module docstring). What SGLang rewrites must reach the plan,
the probe and drift:

* b300 (sm_103), Qwen3.5 MoE FP8 target, EAGLE topk 1, ``page_size: 16``, no attention
  backend: SGLang switches to triton with page size 1 (``_qwen3_5_hybrid_overrides``); the
  static rule warns for exactly this deployment; setting ``attention_backend: trtllm_mha``
  (the rule's fix) keeps page 16.
* the same on ct200 (sm_120): flashinfer, page 16 kept.
* trtllm_mha with EAGLE topk 4: SGLang refuses; the probe's check fails quoting SGLang.
* 0.5.13.post1 (ServerArgs post-init needs more than its import venv has): "parsed only",
  never "resolved".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers import FIXTURES, REPO
from peerutil import resolver_python, sglang_python

from ddtree_ops.config import validate_hostvars
from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.drift import find_drift
from ddtree_ops.sglang.expect import probe_request, run_probe
from ddtree_ops.sglang.resolve import diff_plan, passes, planned_values, request_for, run_resolution

QWEN35_CONFIG = FIXTURES / "sglang" / "resolve" / "qwen3_5_moe-35b-a3b-fp8.config.json"
MODELS = {"target": json.loads(QWEN35_CONFIG.read_text()), "draft": json.loads(QWEN35_CONFIG.read_text())}
# Qwen3.5's draft for EAGLE is its own MTP head, served from the target checkpoint: same config.


def qwen35(host_class: str = "b300", topk: int = 1, **server) -> dict:
    return {
        "ddtree_host_class": host_class,
        "ddtree_sglang": {"source": "pypi", "version": "0.5.23"},
        "ddtree_model": {"path": "Qwen/Qwen3.5-35B-A3B-FP8"},
        "ddtree_speculative": {"algorithm": "EAGLE", "draft_model_path": "Qwen/Qwen3.5-35B-A3B-FP8",
                               "num_steps": 3, "topk": topk, "num_draft_tokens": 4 if topk == 1 else 8},
        "ddtree_server": {"tp_size": 8, "max_running_requests": 32, "page_size": 16, **server},
    }


def qwen35_dflash() -> dict:
    hv = qwen35()
    hv["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "Qwen/Qwen3.5-35B-A3B-FP8", "block_size": 8}
    return hv


CASES = {
    "b300-dflash-default": qwen35_dflash(),
    "b300-default": qwen35(),
    "b300-trtllm": qwen35(attention_backend="trtllm_mha"),
    "ct200-default": qwen35("ct200"),
}
REFUSED = "b300-trtllm-topk4"
"""trtllm_mha with EAGLE topk 4: validate refuses it now (the rule read from SGLang's own
_handle_eagle_family), so the resolver and the host probe, which check the build really installed,
are handed its argv directly: the topk-1 trtllm deployment's argv with topk 4 and 8 draft tokens."""


def _with_topk4(argv: list[str]) -> list[str]:
    out = list(argv)
    out[out.index("--speculative-eagle-topk") + 1] = "4"
    out[out.index("--speculative-num-draft-tokens") + 1] = "8"
    return out


def test_validate_refuses_the_combination_sglang_refuses_in_its_words():
    from ddtree_ops.config.errors import ConfigError

    with pytest.raises(ConfigError, match="trtllm_mha backend only supports topk = 1 for speculative decoding"):
        validate_hostvars("q1", qwen35(topk=4, attention_backend="trtllm_mha"))


@pytest.fixture(scope="module")
def results():
    python = str(resolver_python("0.5.23"))
    out = {}
    for name, hv in CASES.items():
        v = validate_hostvars("q1", hv)
        out[name] = (v, run_resolution(python, request_for(v, MODELS), deadline_s=300))
    v = validate_hostvars("q1", CASES["b300-trtllm"])
    req = request_for(v, MODELS)
    out[REFUSED] = (None, run_resolution(python, {**req, "argv": _with_topk4(req["argv"])}, deadline_s=300))
    return out


def test_b300_qwen35_eagle_topk1_page16_is_switched_to_triton_page1(results):
    v, res = results["b300-default"]
    assert res["state"] == "resolved", res
    assert res["version"] == "0.5.23" and res["how"] == "resolve_once"
    assert "answer for sm_103" in res["pretend"]
    assert (res["resolved"]["attention_backend"], res["resolved"]["page_size"]) == ("triton", 1)
    assert res["sources"]["page_size"] == "_qwen3_5_hybrid_overrides"
    assert diff_plan(planned_values(v.plan), res) == [
        "SGLang 0.5.23 will change attention_backend unset (SGLang decides) → triton "
        "(set by SGLang's _qwen3_5_hybrid_overrides)",
        "SGLang 0.5.23 will change page_size 16 → 1 (set by SGLang's _qwen3_5_hybrid_overrides)",
    ]
    # the static rule (plain `plan`, no venv) warns for exactly this deployment
    assert [w for w in v.plan.warnings if "triton attention with page_size 1" in w]
    # and drift on a server running what SGLang resolved names page_size
    drifts, _ = find_drift(plan_document(v), res["resolved"])
    assert [str(d) for d in drifts if d.name == "page_size"] == [
        "page_size: deployed 16, running 1 (server_info.page_size)"]


def test_the_rules_fix_keeps_page_size(results):
    v, res = results["b300-trtllm"]
    assert res["state"] == "resolved", res
    assert (res["resolved"]["attention_backend"], res["resolved"]["page_size"]) == ("trtllm_mha", 16)
    assert diff_plan(planned_values(v.plan), res) == []
    assert not [w for w in v.plan.warnings if "triton attention with page_size 1" in w]


def test_ct200_takes_the_sm120_path(results):
    v, res = results["ct200-default"]
    assert res["state"] == "resolved" and "answer for sm_120" in res["pretend"]
    assert (res["resolved"]["attention_backend"], res["resolved"]["page_size"]) == ("flashinfer", 16)
    # the plan derives that backend itself (config/derived.py), so SGLang's own pick is no change
    assert v.plan.attention_backend is None and v.plan.derived["attention_backend"]["value"] == "flashinfer"
    assert diff_plan(planned_values(v.plan), res) == []


def test_a_path_needing_cuda_kernels_is_not_run_and_says_why(results):
    """DFLASH with SGLang picking trtllm_mha on b300: the draft-backend step imports
    sgl_kernel, a CUDA binary that needs libcuda: not resolvable here, and said so."""
    _, res = results["b300-dflash-default"]
    assert res["state"] == "not-run" and "sgl_kernel" in res["detail"] and "GPU host" in res["detail"]
    assert res["cannot_run_here"] is True and passes(res)   # a limit of this machine: plan exits 0


def test_a_refused_combination_quotes_sglang(results):
    _, res = results[REFUSED]
    assert res["state"] == "refused"
    assert res["detail"] == "ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding."


@pytest.fixture()
def probe_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def _probe(name: str):
    v = validate_hostvars("q1", CASES["b300-trtllm" if name == REFUSED else name])
    req = {**probe_request(v), "models": MODELS}
    if name == REFUSED:
        req["argv"] = _with_topk4(req["argv"])
    rc, result = run_probe(str(resolver_python("0.5.23")), req, timeout_s=300)
    return rc, {c["name"]: c for c in result["checks"]}


def test_probe_says_resolved_only_when_resolve_once_ran(probe_env):
    rc, checks = _probe("b300-default")
    assert rc == 0, checks
    res = checks["sglang-resolution"]
    assert res["ok"] and res["detail"].startswith("resolved by SGLang 0.5.23 (resolve_once); no GPU here: ")
    assert "SGLang 0.5.23 will change page_size 16 → 1 (set by SGLang's _qwen3_5_hybrid_overrides)" in res["changes"]


def test_probe_fails_on_a_refusal_with_sglangs_message(probe_env):
    rc, checks = _probe(REFUSED)
    assert rc == 1
    res = checks["sglang-resolution"]
    assert not res["ok"] and res["state"] == "refused"
    assert res["detail"] == ("SGLang 0.5.23 refused the arguments during resolve_once: ValueError: trtllm_mha backend "
                             "only supports topk = 1 for speculative decoding.")
    assert checks["argv-parses"]["ok"]   # the parser accepted it: only resolution refuses


def test_0_5_13_post1_is_parsed_only(tmp_path):
    hv = {**qwen35(), "ddtree_sglang": {"source": "pypi", "version": "0.5.13.post1"}}
    v = validate_hostvars("q1", hv)
    res = run_resolution(str(sglang_python("0.5.13.post1")), request_for(v, MODELS), deadline_s=300)
    assert res["version"] == "0.5.13.post1" and res["how"] == "ServerArgs post-init"
    assert res["state"] == "not-run", res
    assert "post-init stopped on this host" in res["detail"]
    assert res["cannot_run_here"] is True and passes(res)


def test_plan_resolve_with_shows_the_rewrites(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"q1": {}}}}}}))
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(CASES["b300-default"]))
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "plan", "-i", str(inv), "--json",
                           "--resolve-with", str(resolver_python("0.5.23")),
                           "--model-config", str(QWEN35_CONFIG), "--draft-config", str(QWEN35_CONFIG)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)["hosts"]["q1"]["sglang_resolution"]
    assert res["state"] == "resolved" and res["detail"].startswith("resolved by SGLang 0.5.23 (resolve_once)")
    assert "SGLang 0.5.23 will change page_size 16 → 1 (set by SGLang's _qwen3_5_hybrid_overrides)" in res["changes"]
