"""Config model, rules and plan: derived sizes and every bad input gets a clear finding."""

from __future__ import annotations

import json

import pytest
from helpers import FIXTURES, REPO

from ddtree_ops.config import ConfigError, default_capture_bs, validate_hostvars
from ddtree_ops.config.inventory import load_hostvars


def errors_of(hostvars: dict) -> list:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hostvars)
    return exc.value.findings


def test_ddtree_plan_sizes(hostvars):
    v = validate_hostvars("h1", hostvars)
    p = v.plan
    assert (p.draft_tokens_per_req, p.verify_tokens_per_req) == (8, 33)
    assert p.full_tree and p.budget == 32
    assert p.capture_bs == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
    assert (p.max_draft_graph_tokens, p.max_verify_graph_tokens) == (16 * 8, 16 * 33)


def test_capture_list_matches_sglang_fixture():
    resolved = json.loads((FIXTURES / "sglang/resolved_server_args-0.5.23-eagle-tp8.json").read_text())
    flat = json.dumps(resolved)
    assert default_capture_bs(16) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
    assert "[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]" in flat


def test_capture_list_steps():
    bs = default_capture_bs(300)
    assert bs[:8] == list(range(1, 9))
    assert 30 in bs and 31 not in bs and 32 in bs and 36 not in bs and 40 in bs and 44 in bs
    assert 256 in bs and 264 not in bs and 272 in bs and 288 in bs and 300 in bs
    assert default_capture_bs(4, tokens_per_req=3, alignment=2) == [2, 4]


def test_budget_default_is_chain(hostvars):
    del hostvars["ddtree_speculative"]["budget"]
    hostvars["ddtree_accepted_risks"] = []
    p = validate_hostvars("h1", hostvars).plan
    assert p.budget == 7 and not p.full_tree and p.verify_tokens_per_req == 8


def test_verify_sized_to_block_size_is_refused(hostvars):
    hostvars["ddtree_speculative"]["verify_tokens_per_req"] = 8
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_speculative.verify_tokens_per_req" and f.value == 8
    assert "budget + 1 = 33" in f.rule and "size of tensor a (8)" in f.rule
    assert "budget + 1" in f.fix


def test_negative_budget(hostvars):
    hostvars["ddtree_speculative"]["budget"] = -3
    [f] = errors_of(hostvars)
    assert (f.field, f.value) == ("ddtree_speculative.budget", -3)
    assert ">= 1" in f.rule


def test_unknown_host_class(hostvars):
    hostvars["ddtree_host_class"] = "h100"
    fs = errors_of(hostvars)
    assert fs[0].field == "ddtree_host_class" and "b300" in fs[0].fix and "ct200" in fs[0].fix


def test_tp16_on_8_gpus(hostvars):
    hostvars["ddtree_server"]["tp_size"] = 16
    [f] = errors_of(hostvars)
    assert (f.field, f.value) == ("ddtree_server.tp_size", 16) and "8 GPUs" in f.rule


def test_port_clash(hostvars):
    hostvars["ddtree_ops"] = {"exporter_port": 30000}
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_ops.exporter_port" and "clashes" in f.rule


@pytest.mark.parametrize("path", ["models/kimi\nExecStartPre=/bin/rm -rf /", "models/100%", "a b", "x$HOME", 'q"uote'])
def test_model_path_injection_refused(hostvars, path):
    hostvars["ddtree_model"]["path"] = path
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_model.path" and f.value == path
    assert "argv values may hold only" in f.rule and f.fix


def test_full_tree_needs_triton_and_page_1(hostvars):
    hostvars["ddtree_server"].update(attention_backend="flashinfer", page_size=16)
    fields = {f.field for f in errors_of(hostvars)}
    assert fields == {"ddtree_server.attention_backend", "ddtree_server.page_size"}


def test_full_tree_derives_backend_with_warning(hostvars):
    del hostvars["ddtree_server"]["attention_backend"]
    del hostvars["ddtree_server"]["page_size"]
    v = validate_hostvars("h1", hostvars)
    assert (v.plan.attention_backend, v.plan.page_size, v.plan.disable_overlap_schedule) == ("triton", 1, True)
    assert any("derived" in w.rule for w in v.warnings)


def test_sm103_large_budget_graphs_refused_without_risk(hostvars):
    hostvars["ddtree_accepted_risks"] = []
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_speculative.budget" and "sm_103" in f.rule and "sm103-ddtree-graph-capture" in f.fix
    hostvars["ddtree_server"]["cuda_graph"] = False
    assert validate_hostvars("h1", hostvars).plan.capture_bs == []


def test_risk_reason_must_be_reasoned(hostvars):
    hostvars["ddtree_accepted_risks"] = [{"rule": "sm103-ddtree-graph-capture", "reason": "ok"}]
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_accepted_risks.0.reason"


def test_unknown_risk_rule(hostvars):
    hostvars["ddtree_accepted_risks"].append({"rule": "sm130-typo", "reason": "a long enough reason here"})
    [f] = errors_of(hostvars)
    assert (f.field, f.value) == ("ddtree_accepted_risks.1.rule", "sm130-typo")


def test_sm120_refuses_trtllm(hostvars):
    hostvars["ddtree_host_class"] = "ct200"
    hostvars["ddtree_speculative"]["draft_attention_backend"] = "fa3"
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_speculative.draft_attention_backend" and "sm_120" in f.rule


def test_unpatched_ddtree_build_with_graphs_needs_the_plugin(hostvars):
    """sglang-pr-27509 sizes verify graphs from block_size: on a real build the plugin rides
    along (warning, the probe checks it); on the simulator nothing would, so it is refused."""
    hostvars["ddtree_sglang"] = {"source": "git", "ddtree_source": "sglang-pr-27509"}
    v = validate_hostvars("h1", hostvars)
    [w] = [w for w in v.warnings if w.field == "ddtree_sglang.ddtree_source"]
    assert "size of tensor a (8)" in w.rule and "(33)" in w.rule and "plugin" in w.rule
    # an SGLANG_PLUGINS whitelist without our plugin would switch the guard off: refused
    hostvars["ddtree_service"] = {"env": {"SGLANG_PLUGINS": "other_plugin"}}
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_service.env.SGLANG_PLUGINS" and "ddtree_ops_verify_graph" in f.fix
    hostvars["ddtree_service"] = {"env": {"SGLANG_PLUGINS": "other_plugin,ddtree_ops_verify_graph"}}
    validate_hostvars("h1", hostvars)
    del hostvars["ddtree_service"]
    hostvars["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-27509",
                                 "simulated_build": "ddtree-unpatched"}
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_sglang.ddtree_source" and "size of tensor a (8)" in f.rule and "(33)" in f.rule
    hostvars["ddtree_server"]["cuda_graph"] = False
    validate_hostvars("h1", hostvars)


def test_ddtree_needs_a_ddtree_source(hostvars):
    del hostvars["ddtree_sglang"]["ddtree_source"]
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_sglang.ddtree_source" and "no SGLang release" in f.rule


def test_uncaptured_batches_refused(hostvars):
    hostvars["ddtree_server"].update(max_running_requests=64, cuda_graph_max_bs=32)
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_server.cuda_graph_max_bs" and "33..64" in f.rule


def test_typo_in_variable_name_refused(hostvars):
    hostvars["ddtree_speculatve"] = hostvars.pop("ddtree_speculative")
    hostvars["ddtree_service_python"] = "/usr/bin/python3"  # a role variable: fine
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_speculatve" and "ddtree_speculative" in f.fix


def test_version_must_match_ddtree_source(hostvars):
    hostvars["ddtree_sglang"]["version"] = "0.5.13.post1"
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_sglang.version" and "0.5.23" in f.rule


@pytest.mark.parametrize("section,key,value", [
    ("ddtree_model", "path", "models/kimi\n"),
    ("ddtree_service", "venv", "/"),
    ("ddtree_service", "config_dir", "/opt/v\n"),
    ("ddtree_server", "tp_size", True),
    ("ddtree_server", "cuda_graph_max_bs", 10**9),
    ("ddtree_server", "max_running_requests", 1e30),
    ("ddtree_ops", "health_timeout_s", float("inf")),
    ("ddtree_speculative", "draft_window_size", -5),
])
def test_out_of_range_and_smuggled_values(hostvars, section, key, value):
    hostvars.setdefault(section, {})[key] = value
    fs = errors_of(hostvars)
    assert any(f.field == f"{section}.{key}" for f in fs), [f.message() for f in fs]


def test_secret_never_echoed(hostvars):
    hostvars["ddtree_hf_token"] = {"x": "hf_SECRETDICT"}
    [f] = errors_of(hostvars)
    assert "hf_SECRETDICT" not in f.message() and f.value == "(redacted)"


def test_blank_risk_reason(hostvars):
    hostvars["ddtree_accepted_risks"][0]["reason"] = " " * 25
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_accepted_risks.0.reason"


def test_health_timeout_floor(hostvars):
    hostvars["ddtree_ops"] = {"health_timeout_s": 1}
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_ops.health_timeout_s" and "3 s" in f.rule


def test_health_timeout_ceiling_matches_the_cli(hostvars):
    """A health_timeout_s the CLI refuses (> 300) would make every start of the unit fail in
    ExecStartPost (`ddtree-ops health --timeout 600.0` exits 2); the validator refuses it."""
    from ddtree_ops.cli import main

    hostvars["ddtree_ops"] = {"health_timeout_s": 600}
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_ops.health_timeout_s" and "at most 300 s" in f.rule
    hostvars["ddtree_ops"] = {"health_timeout_s": 300}
    v = validate_hostvars("h1", hostvars)
    assert main(["health", "http://127.0.0.1:9", "--timeout", str(v.deployment.ops.health_timeout_s),
                 "--failures", "1"]) == 1  # accepted by the CLI (the check fails: nothing listens)


def test_service_env_cannot_override_the_plugin_sizes(hostvars):
    """ddtree_service.env wins over the rendered env; DDTREE_OPS_VERIFY_TOKENS_PER_REQ=8 there would
    make the plugin size DDTree verify graphs at 8 (the tensor 8 vs 33 crash) — refused."""
    hostvars["ddtree_service"] = {
        **hostvars.get("ddtree_service", {}),
        "env": {"DDTREE_OPS_VERIFY_TOKENS_PER_REQ": "8"},
    }
    [f] = errors_of(hostvars)
    assert f.field == "ddtree_service.env" and "derived from the validated config" in f.rule


def test_silent_rewrites_are_warnings(hostvars):
    hostvars.update(ddtree_speculative={"algorithm": "EAGLE", "draft_model_path": "d/e", "num_steps": 3, "topk": 1,
                                        "num_draft_tokens": 6},
                    ddtree_server={"tp_size": 8}, ddtree_sglang={"version": "0.5.23"}, ddtree_accepted_risks=[])
    v = validate_hostvars("h1", hostvars)
    rules = " ".join(w.rule for w in v.warnings)
    assert "num_steps + 1 = 4" in rules and "caps it at 48" in rules
    assert v.plan.num_draft_tokens == 4 and v.plan.max_running_requests == 48
    assert v.plan.capture_bs[-1] == 48


def test_dflash_forces_steps_and_topk(hostvars):
    hostvars["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "d/e", "block_size": 16,
                                      "num_steps": 4, "topk": 2}
    hostvars["ddtree_sglang"] = {"version": "0.5.13.post1"}
    v = validate_hostvars("h1", hostvars)
    assert {w.field for w in v.warnings} >= {"ddtree_speculative.num_steps", "ddtree_speculative.topk"}
    assert (v.plan.draft_tokens_per_req, v.plan.verify_tokens_per_req) == (16, 16)


def test_unknown_setting_and_type_errors(hostvars):
    hostvars["ddtree_server"]["tp_sise"] = 8
    hostvars["ddtree_server"]["port"] = "eighty"
    fs = {f.field: f for f in errors_of(hostvars)}
    assert "unknown setting" in fs["ddtree_server.tp_sise"].rule
    assert fs["ddtree_server.port"].value == "eighty"


def test_example_inventory_plans():
    hv = load_hostvars(REPO / "inventory/example")
    assert set(hv) == {"b300-01", "ct200-01"}
    b300 = validate_hostvars("b300-01", hv["b300-01"])
    assert (b300.plan.draft_tokens_per_req, b300.plan.verify_tokens_per_req) == (8, 33)
    ct200 = validate_hostvars("ct200-01", hv["ct200-01"])
    assert ct200.plan.capture_bs[-1] == 32 and ct200.plan.attention_backend == "triton"
    assert load_hostvars(REPO / "inventory/example", "b300").keys() == {"b300-01"}
