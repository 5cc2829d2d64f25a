"""Our SGLang plugin (``ddtree_ops/sglang/plugin.py``) loaded by REAL SGLang.

Each test runs ``plugin_scenario.py`` with the python of a cached real-SGLang venv
(0.5.13.post1: the import venv; 0.5.23: the resolver child venv, whose extra packages the
0.5.23 server-args and ``spec_utils`` imports need), with ddtree-ops installed ``--no-deps``
by real pip into a directory on ``PYTHONPATH`` (the entry point is discovered from its real
``entry_points.txt``). What is real and what is constructed is spelled out in
``plugin_scenario.py``'s docstring: the loader, hook registry, algorithm registry and width
functions are the releases' own; the DDTREE algorithm and the DDTree server arguments are
set the way the DDTree pull requests set them, because no release has DDTree.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from peerutil import _clean_env, resolver_python, sglang_python

SCENARIO = Path(__file__).with_name("plugin_scenario.py")
SIZES = {"DDTREE_OPS_ALGORITHM": "DDTREE", "DDTREE_OPS_DRAFT_TOKENS_PER_REQ": "8",
         "DDTREE_OPS_VERIFY_TOKENS_PER_REQ": "33"}
LAYOUT = {  # version -> (python getter, width function the release defines)
    "0.5.13.post1": (lambda: sglang_python("0.5.13.post1"), "get_num_tokens_per_bs_for_target_verify"),
    "0.5.23": (lambda: resolver_python("0.5.23"), "get_num_tokens_per_req_for_target_verify"),
}


def scenario(version: str, name: str, site: Path, env: dict[str, str], *args: str) -> dict:
    python = LAYOUT[version][0]()
    r = subprocess.run([str(python), str(SCENARIO), name, *args], capture_output=True, text=True, timeout=300,
                       env={**_clean_env(), "PYTHONPATH": str(site), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"] = r.stderr
    return out


@pytest.fixture(scope="module")
def all_scenario(plugin_site):
    """One SGLang process per version, sizes 8 / 33 in the unit environment (cached)."""
    cache: dict[str, dict] = {}

    def get(version: str) -> dict:
        if version not in cache:
            cache[version] = scenario(version, "all", plugin_site, SIZES)
        return cache[version]
    return get


@pytest.mark.parametrize("version", list(LAYOUT))
def test_load_plugins_discovers_and_hooks_width_functions(version, all_scenario, plugin_site):
    out = all_scenario(version)
    width = LAYOUT[version][1]
    assert out["sglang"] == version
    assert out["plugin_file"].startswith(str(plugin_site))  # our installed copy, not the checkout
    assert out["width_function"] == width
    # SGLang's loader found the entry point and patched exactly the width functions of this layout
    assert "Loaded plugin ddtree_ops_verify_graph" in out["stderr"]
    assert out["patched"] == sorted([
        f"sglang.srt.speculative.spec_info.SpeculativeAlgorithm.{width}",
        f"sglang.srt.speculative.spec_registry.CustomSpecAlgo.{width}",
    ])
    assert out["describe"]["active"] is True and out["describe"]["layout"] == (
        "<=0.5.13" if version.startswith("0.5.13") else "0.5.23")


@pytest.mark.parametrize("version", list(LAYOUT))
def test_release_without_ddtree_is_pass_through(version, all_scenario):
    out = all_scenario(version)
    assert "build has no DDTREE" in out["describe"]["detail"]
    assert out["widths"] == {"DFLASH/target": 8, "DFLASH/draft": 8, "EAGLE/target": 4}


@pytest.mark.parametrize("version", list(LAYOUT))
def test_ddtree_target_gets_budget_plus_one_draft_keeps_block_size(version, all_scenario):
    out = all_scenario(version)
    w = out["ddtree_widths"]
    assert (w["DDTREE/target"], w["DDTREE/draft"]) == (33, 8)
    assert any("corrected to 33 tokens per request" in e for e in out["ddtree_events"])
    assert "corrected to 33" in out["stderr"]  # logged where SGLang's log goes
    if version == "0.5.23":  # through the function the decode CUDA-graph runner calls
        assert w["DDTREE/target via resolve_num_tokens_per_req"] == 33
        assert w["DDTREE/draft via resolve_num_tokens_per_req"] == 8


@pytest.mark.parametrize("version", list(LAYOUT))
def test_noop_on_build_that_sizes_correctly(version, all_scenario):
    out = all_scenario(version)
    assert out["fixed_widths"]["DDTREE/target"] == 33
    assert any("already sizes DDTree graphs at 33" in e for e in out["fixed_events"])
    assert not any("corrected" in e for e in out["fixed_events"])


@pytest.mark.parametrize("version", list(LAYOUT))
def test_describe_outside_a_server_process(version, all_scenario):
    d = all_scenario(version)["before"]
    assert d["installed"] is True and d["active"] is None
    assert len(d["targets"]) == 2 and LAYOUT[version][1] in d["targets"][0]
    assert "not loaded in this process" in d["detail"]


@pytest.mark.parametrize("version", list(LAYOUT))
def test_non_ddtree_deployment_registers_nothing(version, plugin_site):
    env = {**SIZES, "DDTREE_OPS_ALGORITHM": "DFLASH", "DDTREE_OPS_VERIFY_TOKENS_PER_REQ": "8"}
    out = scenario(version, "no-ddtree", plugin_site, env)
    assert out["patched"] == []
    assert out["describe"]["active"] is False and "not DDTREE: no-op" in out["describe"]["detail"]
    assert out["widths"] == {"DFLASH/target": 8, "DFLASH/draft": 8, "EAGLE/target": 4}


@pytest.mark.parametrize("version", list(LAYOUT))
@pytest.mark.parametrize("env, words", [
    ({"DDTREE_OPS_VERIFY_TOKENS_PER_REQ": "17"}, "--speculative-ddtree-budget is 32"),
    ({"DDTREE_OPS_DRAFT_TOKENS_PER_REQ": "16"}, "block size"),
])
def test_disagreeing_sizes_refuse(version, env, words, plugin_site):
    out = scenario(version, "ddtree", plugin_site, {**SIZES, **env})
    assert "build knows DDTREE" in out["describe"]["detail"]
    w = out["widths"]
    for key in ("DDTREE/target", "DDTREE/draft"):
        assert isinstance(w[key], str) and w[key].startswith("DDTreeSizeMismatch") and words in w[key], w[key]
        assert "Fix:" in w[key]
    assert w["DFLASH/target"] == 8  # other algorithms never refused
