"""Config drift (``ddtree_ops.runtime.drift``): deployed plan.json vs a running server's
/server_info — against the simulator started with the argv our renderer builds, and against
SGLang 0.5.23's own resolved server args (fixture read off the real package)."""

from __future__ import annotations

import copy
import json

import pytest
from test_sim import FIXTURES, Sim, get_json

from ddtree_ops.config.load import validate_hostvars
from ddtree_ops.render.argv import build_argv
from ddtree_ops.render.files import plan_document
from ddtree_ops.runtime.drift import compared_settings, find_drift


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    from helpers import base_hostvars
    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    v = validate_hostvars("h1", hv)
    argv = build_argv(v.deployment, v.plan)
    launch = argv[argv.index("--model-path"):]
    # The Sim helper picks a free port; drop ours (argparse: the last --port would win).
    i = launch.index("--port")
    del launch[i:i + 2]
    sim = Sim(tmp_path_factory.mktemp("drift"), launch)
    sim.wait_ready()
    yield plan_document(v), get_json(sim.base + "/server_info")
    sim.stop()


def test_no_drift_when_running_what_was_deployed(deployed) -> None:
    doc, info = deployed
    drifts, missing = find_drift(doc, info)
    assert drifts == [], [str(d) for d in drifts]
    assert missing == []   # the simulator reports every setting compared (DDTree build)
    # ... attention_backend / page_size at the top level, as SGLang 0.5.23's build_server_info does
    assert (info["attention_backend"], info["page_size"]) == ("triton", 1)


@pytest.mark.parametrize(("key", "value", "name"), [
    ("speculative_ddtree_budget", 16, "budget"),
    ("speculative_dflash_block_size", 4, "block_size"),
    ("tp_size", 4, "tp_size"),
    ("disable_cuda_graph", True, "cuda_graphs"),
    ("speculative_algorithm", "DFLASH", "algorithm"),
    ("max_running_requests", 48, "max_running_requests"),
    # SGLang may rewrite these during resolution (0.5.23, b300, Qwen3.5: page 16 -> triton / 1)
    ("attention_backend", "trtllm_mha", "attention_backend"),
    ("page_size", 16, "page_size"),
])
def test_each_changed_setting_is_drift(deployed, key, value, name) -> None:
    doc, info = deployed
    info = copy.deepcopy(info)
    info[key] = value
    drifts, _ = find_drift(doc, info)
    assert [d.name for d in drifts] == [name]
    assert name in str(drifts[0]) and key in str(drifts[0])


def test_capture_list_drift_reads_the_resolved_list(deployed) -> None:
    doc, info = deployed
    info = copy.deepcopy(info)
    info["cuda_graph_config"]["decode"]["bs"] = info["cuda_graph_config"]["decode"]["bs"][:-1]
    assert [d.name for d in find_drift(doc, info)[0]] == ["capture_bs"]


def test_release_build_does_not_report_ddtree_keys(deployed) -> None:
    """Real 0.5.23 server args have no DDTree field: not drift, reported as missing."""
    doc, _ = deployed
    real = json.loads((FIXTURES / "resolved_server_args-0.5.23-eagle-tp8.json").read_text())
    assert "speculative_ddtree_budget" not in real
    drifts, missing = find_drift(doc, real)
    assert "budget" in missing and "budget" not in [d.name for d in drifts]
    # ... while what a release does report and differs (EAGLE, tp 8 vs DDTree) is drift
    assert "algorithm" in [d.name for d in drifts]
    assert set(missing) | {d.name for d in drifts} <= set(compared_settings())


def test_a_server_restarted_without_speculation_is_drift(deployed) -> None:
    """Real SGLang 0.5.17 without --speculative-algorithm reports ``speculative_algorithm: null``
    (tests/fixtures/gpu/sglang-0.5.17-h200-2026-12-01/none/server_info.body): a DDTREE deployment
    running so is drift on the algorithm, not "not reported"."""
    from replay import REAL_0517

    doc, info = deployed
    real_none = json.loads((REAL_0517 / "none" / "server_info.body").read_text())
    assert "speculative_algorithm" in real_none and real_none["speculative_algorithm"] is None
    info = copy.deepcopy(info)
    info["speculative_algorithm"] = None
    drifts, missing = find_drift(doc, info)
    assert [(d.name, d.running) for d in drifts if d.name == "algorithm"] == [("algorithm", "none")]
    assert "algorithm" not in missing
    # ... and the real no-speculation server itself, against the DDTREE plan
    assert "algorithm" in [d.name for d in find_drift(doc, real_none)[0]]


@pytest.mark.parametrize(("changes", "field_set"), [
    # 0.5.23 on b300 turns a Qwen3.5 MoE with page 16 and no backend into triton / page 1
    ({"attention_backend": "trtllm_mha", "page_size": 16},
     "ddtree_server.attention_backend: trtllm_mha, ddtree_server.page_size: 16"),
    ({"max_running_requests": 48}, "ddtree_server.max_running_requests: 48"),
    ({"disable_cuda_graph": True}, "ddtree_server.cuda_graph: false"),
])
def test_drift_that_sglangs_resolution_made_names_the_field_to_set_not_a_restart(deployed, changes, field_set):
    """The fix said 'redeploy or restart' where SGLang's own resolution made the difference: a restart starts
    the same server again."""
    from ddtree_ops.runtime.drift import drift_fix

    doc, info = deployed
    info = {**copy.deepcopy(info), **changes}
    drifts, _ = find_drift(doc, info)
    fix = drift_fix(drifts, "0.5.23")
    assert "SGLang 0.5.23 rewrote these itself" in fix and "a restart or redeploy starts the same" in fix
    assert f"set {field_set} in the inventory" in fix and "--resolve-with" in fix


@pytest.mark.parametrize("changes", [{"tp_size": 4}, {"tp_size": 4, "page_size": 16},
                                     {"speculative_algorithm": "DFLASH"}])
def test_drift_of_what_sglang_never_rewrites_is_a_server_not_started_from_the_config(deployed, changes):
    from ddtree_ops.runtime.drift import drift_fix

    doc, info = deployed
    drifts, _ = find_drift(doc, {**copy.deepcopy(info), **changes})
    assert drifts and drift_fix(drifts, "0.5.23").startswith("redeploy, or restart the unit")


def test_the_health_drift_check_carries_the_fix(deployed):
    from ddtree_ops.config.plandoc_model import as_plan_doc
    from ddtree_ops.runtime.health import _drift

    doc, info = deployed
    c = _drift({**copy.deepcopy(info), "page_size": 16}, as_plan_doc(doc))
    assert not c.ok and "set ddtree_server.page_size: 16 in the inventory" in c.detail
    assert "Fix: redeploy" not in c.detail
