"""Settings left unset are checked at the value the pinned release derives for them
(``ddtree_ops/config/derived.py``), not only when given explicitly."""

from __future__ import annotations

import json

import pytest
from helpers import FIXTURES

from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.derived import RELEASE_DEFAULTS, bucket_for, derive
from ddtree_ops.config.hosts import HOST_CLASSES

H200_0517 = FIXTURES / "gpu" / "sglang-0.5.17-h200-2026-12-01"


def h200(version: str = "0.5.17", **server) -> dict:
    """An H200 (141 GB) EAGLE3 deployment of a PyPI release."""
    return {
        "ddtree_host_class": "h200x1",
        "ddtree_sglang": {"source": "pypi", "version": version},
        "ddtree_model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "ddtree_speculative": {"algorithm": "EAGLE3", "draft_model_path": "jamesliu1/sglang-EAGLE3-Llama-3.1-8B",
                               "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "ddtree_server": {"tp_size": 1, **server},
    }


def errors(hv: dict) -> list:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    return [f for f in exc.value.findings if f.level == "error"]


def test_chunked_prefill_matches_a_real_h200_run():
    """SGLang 0.5.17 on a real H200 (tp 1, chunked prefill unset) ran with 8192: the plan says so,
    naming the release's function."""
    info = json.loads((H200_0517 / "eagle3" / "get_server_info.body").read_text())
    assert info["chunked_prefill_size"] == 8192 and info["tp_size"] == 1
    p = validate_hostvars("h1", h200(max_running_requests=16, cuda_graph_max_bs=16)).plan
    dv = p.derived["chunked_prefill_size"]
    assert dv["value"] == info["chunked_prefill_size"]
    assert "0.5.17" in dv["source"] and "_handle_gpu_memory_settings" in dv["source"]
    assert "cuda_graph_max_bs" not in p.derived  # explicit: nothing derived


@pytest.mark.parametrize("version", sorted(RELEASE_DEFAULTS))
def test_derived_capture_max_below_max_running_is_refused(version):
    """An explicit cuda_graph_max_bs below max_running_requests was refused, but leaving it
    unset passed: on an H200 at tp 1 every release derives 256, so 257..300 ran eagerly."""
    [f] = [f for f in errors(h200(version, max_running_requests=300)) if f.field.endswith("cuda_graph_max_bs")]
    assert f.value is None and "257..300" in f.rule and f"SGLang {version} derives 256" in f.rule
    assert version in f.source and "gpu_memory_settings" in f.source
    assert "cuda_graph_max_bs" in f.fix
    # the explicit form of the same fault is still refused
    [g] = [f for f in errors(h200(version, max_running_requests=300, cuda_graph_max_bs=256))
           if f.field.endswith("cuda_graph_max_bs")]
    assert g.value == 256 and "257..300" in g.rule


def test_tp_size_moves_the_bucket_value():
    """tp_size >= 4 on an H200 derives 512: 300 running requests are then captured."""
    hv = h200("0.5.13.post1", max_running_requests=300)
    hv["ddtree_host_class"] = "h200x8"
    hv["ddtree_server"]["tp_size"] = 4
    p = validate_hostvars("h1", hv).plan
    assert p.derived["cuda_graph_max_bs"]["value"] == 512
    assert p.cuda_graph_max_bs == 300 and p.capture_bs[-1] == 300  # trimmed to the request pool


def test_b300_bucket_and_h100_bucket():
    b300, h100 = HOST_CLASSES["b300"], HOST_CLASSES["h100x8"]
    for v, rd in RELEASE_DEFAULTS.items():
        assert bucket_for(rd, b300.min_memory_mib).chunked_prefill_size == 16384, v
        assert bucket_for(rd, h100.gpu_memory_gib * 1024).max_bs(1) == 256, v


def test_small_gpu_bucket_changed_in_0_5_23():
    """The 20-35 GiB bucket (RTX 5090): 0.5.17 derives chunked 2048 / max_bs 24, 0.5.23 4096 / 48."""
    mib = 32 * 1024 - 500
    assert (bucket_for(RELEASE_DEFAULTS["0.5.17"], mib).chunked_prefill_size,
            bucket_for(RELEASE_DEFAULTS["0.5.17"], mib).max_bs(1)) == (2048, 24)
    assert (bucket_for(RELEASE_DEFAULTS["0.5.23"], mib).chunked_prefill_size,
            bucket_for(RELEASE_DEFAULTS["0.5.23"], mib).max_bs(1)) == (4096, 48)


def test_0_5_23_lowers_derived_max_to_explicit_running():
    """0.5.23's memory hook lowers a derived decode max to an explicit max_running_requests;
    0.5.17 keeps 256 (the runtime then trims the capture list to the pool)."""
    new = validate_hostvars("h1", h200("0.5.23", max_running_requests=100)).plan
    old = validate_hostvars("h1", h200("0.5.17", max_running_requests=100)).plan
    assert new.derived["cuda_graph_max_bs"]["value"] == 100 and "lowered" in new.derived["cuda_graph_max_bs"]["why"]
    assert old.derived["cuda_graph_max_bs"]["value"] == 256
    assert new.capture_bs == old.capture_bs and new.capture_bs[-1] == 100


def test_speculation_derives_48_running_with_source():
    p = validate_hostvars("h1", h200("0.5.23")).plan
    dv = p.derived["max_running_requests"]
    assert dv["value"] == 48 == p.max_running_requests and "speculative_hook.py" in dv["source"]
    # the resolved 0.5.23 fixture (SGLang's own resolution) says 48 too
    resolved = json.loads((FIXTURES / "sglang/resolved_server_args-0.5.23-eagle-tp8.json").read_text())
    assert resolved["max_running_requests"] == dv["value"]


def test_mem_fraction_derived_is_an_upper_bound_with_source():
    """Unset mem_fraction_static: SGLang 0.5.13.post1 on an H200 (tp 1, EAGLE3) reserves at least
    512 + 8192 x 1.5 + 256 x 2 + 128 + 4096 (draft) MiB."""
    p = validate_hostvars("h1", h200("0.5.13.post1", max_running_requests=48)).plan
    dv = p.derived["mem_fraction_static"]
    gpu = 141 * 1024
    assert dv["value"] == round((gpu - (512 + 8192 * 1.5 + 256 * 2 + 128 + 4096)) / gpu, 3)
    assert "at most" in dv["why"]
    # 0.5.17 reserves nothing extra for the draft: a higher bound
    assert validate_hostvars("h1", h200("0.5.17", max_running_requests=48)).plan.derived[
        "mem_fraction_static"]["value"] > dv["value"]


def test_the_fraction_rule_and_the_derived_fraction_read_one_reserve():
    """The mem_fraction_static rule (``config/memory_reserve.py``) and the derived fraction model SGLang's
    reserve once (``derived.reserve_terms``): the draft model's 4 GiB of 0.5.13.post1 raises what the rule
    counts as SGLang's own reserve too, and a fraction SGLang's own choice would pick is no error."""
    from ddtree_ops.config.memory_reserve import reserve

    got = {}
    for version in ("0.5.13.post1", "0.5.17"):
        v = validate_hostvars("h1", h200(version, max_running_requests=48))
        r = reserve(v.deployment, v.plan)
        assert r is not None and "_handle_gpu_memory_settings" in r.source
        got[version] = r
    old, new = got["0.5.13.post1"], got["0.5.17"]
    assert old.reserve_mib - new.reserve_mib == 4 * 1024 and "draft model 4096 MiB" in old.parts
    assert old.max_fraction < new.max_fraction
    # the H200 is read at the most SGLang may see (141 GiB), the figure the derived fraction uses
    assert new.gpu_mib == 141 * 1024
    stated = validate_hostvars("h1", h200("0.5.17", max_running_requests=48, mem_fraction_static=new.max_fraction))
    assert not [f for f in stated.warnings if f.field == "ddtree_server.mem_fraction_static"]


def test_post_capture_sizing_reserves_only_the_constant_and_the_slack():
    """With SGLANG_ENABLE_POST_CAPTURE_KV_SIZING (0.5.17+) SGLang reserves 512 MiB + the parallel slack up
    front and sizes the KV pool after graph capture: the rule's least estimate follows it."""
    from ddtree_ops.config.memory_reserve import reserve

    hv = h200("0.5.17", max_running_requests=48)
    hv["ddtree_service"] = {"env": {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}}
    v = validate_hostvars("h1", hv)
    r = reserve(v.deployment, v.plan)
    assert r is not None and r.least_mib == r.estimate_mib == 512 + 128 and r.floor_mib == 0
    assert "post-capture" in r.parts


def test_unread_release_derives_nothing():
    """A release whose derivation was never read off its wheel gets no derived value (the
    plan keeps SGLang's speculative cap of 48 as before)."""
    v = validate_hostvars("h1", h200("0.5.14"))
    assert derive(v.deployment) == {} and v.plan.derived == {} and v.plan.max_running_requests == 48


def test_plan_json_carries_derived_values_with_source():
    p = validate_hostvars("h1", h200("0.5.23", max_running_requests=48)).plan
    assert p.as_dict()["derived"]["chunked_prefill_size"]["source"].startswith("SGLang 0.5.23 ")


def test_plan_command_shows_each_derived_value_with_its_source(capsys, monkeypatch):
    from helpers import REPO

    from ddtree_ops.cli import main

    monkeypatch.setenv("COLUMNS", "400")
    assert main(["plan", "-i", str(REPO / "inventory" / "example"), "--limit", "ct200-01"]) == 0
    out = capsys.readouterr().out
    # the table wraps a long value onto lines whose first column is blank: read the rows flattened
    flat = " ".join(" ".join(line.replace("\u2502", " ").split()) for line in out.splitlines())
    row = flat[flat.index("chunked_prefill_size (derived)"):]
    assert "8192 (derived by SGLang 0.5.23 sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings" in row


def on(host_class: str, version: str, algorithm: str | None = None, topk: int = 1, **server) -> dict:
    """A Llama deployment (multi-head attention, no model override) on ``host_class``."""
    hv = h200(version, max_running_requests=16, tp_size=1 if host_class == "h200x1" else 8, **server)
    hv["ddtree_host_class"] = host_class
    if algorithm is None:
        del hv["ddtree_speculative"]
    elif algorithm == "DFLASH":
        hv["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "z-lab/Llama-3.1-8B-DFlash",
                                    "block_size": 8}
    else:
        hv["ddtree_speculative"].update(topk=topk, num_draft_tokens=4 if topk == 1 else 8)
    return hv


def attention(hv: dict) -> tuple:
    p = validate_hostvars("h1", hv).plan
    return tuple(p.derived.get(k, {}).get("value") for k in ("attention_backend", "page_size"))


@pytest.mark.parametrize(("host_class", "version", "algorithm", "want"), [
    # sm_90 (H200): fa3 whenever speculation runs topk 1 (or none)
    ("h200x1", "0.5.17", None, ("fa3", 1)),
    ("h200x1", "0.5.17", "EAGLE3", ("fa3", 1)),
    ("h200x1", "0.5.17", "DFLASH", ("fa3", 1)),
    ("h200x1", "0.5.13.post1", "EAGLE3", ("fa3", 1)),
    # sm_103 (B300): trtllm_mha, which takes no page of 1 (64); DFLASH only from 0.5.23
    ("b300", "0.5.17", None, ("trtllm_mha", 64)),
    ("b300", "0.5.17", "EAGLE3", ("trtllm_mha", 64)),
    ("b300", "0.5.17", "DFLASH", ("flashinfer", 1)),
    ("b300", "0.5.13.post1", "DFLASH", ("flashinfer", 1)),
    ("b300", "0.5.23", "DFLASH", ("trtllm_mha", 64)),
    # sm_120 (RTX PRO 6000): flashinfer in every release, with and without speculation
    ("ct200", "0.5.17", None, ("flashinfer", 1)),
    ("ct200", "0.5.17", "DFLASH", ("flashinfer", 1)),
    ("ct200", "0.5.23", "EAGLE3", ("flashinfer", 1)),
])
def test_attention_backend_and_page_size_derived_per_arch(host_class, version, algorithm, want):
    """Unset attention_backend and page_size: the plan carries what the release picks, with the
    function of that release that picks it (read off the wheels into DERIVED_LINES)."""
    p = validate_hostvars("h1", on(host_class, version, algorithm)).plan
    got = p.derived["attention_backend"], p.derived["page_size"]
    assert (got[0]["value"], got[1]["value"]) == want
    assert got[0]["source"].startswith(f"SGLang {version} ")
    assert "default_attn_backend" in got[0]["source"]
    page_fn = "_mla_backend_page_constraints" if want[1] == 64 and version != "0.5.13.post1" else (
        "_handle_attention_backend_compatibility" if want[1] == 64 else "page_size")
    assert page_fn in got[1]["source"]
    assert p.attention_backend is None and p.page_size is None  # derived values are not rendered


def test_topk_one_with_pages_is_not_fa3_on_hopper():
    """SGLang's fa3 default needs topk 1 with page_size 1 (is_no_spec_infer_or_topk_one): EAGLE3 with
    pages of 16 gets flashinfer, the same pages without speculation keep fa3."""
    assert attention(on("h200x1", "0.5.17", "EAGLE3", page_size=16)) == ("flashinfer", None)
    assert attention(on("h200x1", "0.5.17", None, page_size=16)) == ("fa3", None)
    assert attention(on("b300", "0.5.17", "EAGLE3", topk=4)) == ("flashinfer", 1)


def test_fp8_e5m2_kv_cache_turns_derived_fa3_into_triton():
    p = validate_hostvars("h1", on("h200x1", "0.5.17", extra_args={"--kv-cache-dtype": "fp8_e5m2"})).plan
    dv = p.derived["attention_backend"]
    assert dv["value"] == "triton" and "_attention_backend_fa3_fp8_fallback" in dv["source"]
    assert attention(on("h200x1", "0.5.17", extra_args={"--kv-cache-dtype": "fp8_e4m3"}))[0] == "fa3"


def test_a_model_override_derives_nothing():
    """Qwen3.5 on sm_100/sm_103 with 0.5.23 chooses in its own override: nothing is claimed; the same
    model on 0.5.17 (no such override) takes the generic default."""
    hv = on("b300", "0.5.23", None)
    hv["ddtree_model"] = {"path": "Qwen/Qwen3.5-35B-A3B-FP8"}
    assert attention(hv) == (None, None)
    hv["ddtree_sglang"]["version"] = "0.5.17"
    assert attention(hv) == ("trtllm_mha", 64)


@pytest.mark.parametrize(("version", "page", "backend", "runs"), [
    ("0.5.17", 1, None, 64),             # derived trtllm_mha replaces a page of 1
    ("0.5.23", 8, "trtllm_mha", 64),     # a set trtllm_mha replaces a page of 8
    ("0.5.13.post1", 128, "trtllm_mha", 64),  # 128 only from 0.5.17
])
def test_a_given_page_size_the_backend_replaces_is_warned(version, page, backend, runs):
    server = {"page_size": page, **({"attention_backend": backend} if backend else {})}
    v = validate_hostvars("h1", on("b300", version, None, **server))
    [w] = [w for w in v.warnings if w.field == "ddtree_server.page_size"]
    assert w.value == page and f"runs page_size {runs} instead of {page}" in w.rule
    assert ("derived" in w.rule) is (backend is None) and f"SGLang {version}" in w.source
    assert v.plan.page_size == page  # the argv still says what was given
    # a page the backend takes is kept, and nothing is said
    ok = validate_hostvars("h1", on("b300", "0.5.17", None, page_size=128))
    assert not [w for w in ok.warnings if w.field == "ddtree_server.page_size"] and "page_size" not in ok.plan.derived


def test_trtllm_mha_with_topk_above_one_is_refused_set_or_per_phase():
    """SGLang's _handle_eagle_family refuses trtllm_mha with topk > 1; the refusal reads the backend
    the server runs (set, per phase in extra_args, or derived), never only the typed field."""
    for server in ({"attention_backend": "trtllm_mha"}, {"extra_args": {"--decode-attention-backend": "trtllm_mha"}}):
        fs = errors(on("b300", "0.5.17", "EAGLE3", topk=4, **server))
        [f] = [f for f in fs if "trtllm-mha-eagle-topk" in f.rule]
        assert f.field == "ddtree_speculative.topk" and f.value == 4 and "_handle_eagle_family" in f.source
    # topk 1 on the same backend passes; unset, SGLang derives flashinfer for topk 4 and it passes too
    validate_hostvars("h1", on("b300", "0.5.17", "EAGLE3", topk=1, attention_backend="trtllm_mha", page_size=64))
    validate_hostvars("h1", on("b300", "0.5.17", "EAGLE3", topk=4))


@pytest.mark.parametrize("version", sorted(RELEASE_DEFAULTS))
@pytest.mark.parametrize("host_class", ["h200x1", "b300", "ct200"])
def test_the_arch_rules_read_the_derived_backend(version, host_class):
    """The per-arch backend rules see the derived backend as they see a set one (both phases), and
    the release's own choice is never refused on its own arch."""
    from ddtree_ops.config.build_rules import _backends, rule_attention_backends

    v = validate_hostvars("h1", on(host_class, version, "EAGLE3"))
    derived = v.plan.derived["attention_backend"]["value"]
    assert [(f, n, ph) for f, n, ph in _backends(v.deployment, v.plan)] == [
        ("ddtree_server.attention_backend", derived, "prefill"), ("ddtree_server.attention_backend", derived, "decode")]
    assert list(rule_attention_backends(v.deployment, v.plan)) == []


def test_plan_command_shows_the_derived_backend_and_page_with_source(capsys, monkeypatch):
    from helpers import REPO

    from ddtree_ops.cli import main

    monkeypatch.setenv("COLUMNS", "400")
    assert main(["plan", "-i", str(REPO / "inventory" / "dflash-example"), "--limit", "ct200-21"]) == 0
    flat = " ".join(" ".join(line.replace("\u2502", " ").split()) for line in capsys.readouterr().out.splitlines())
    assert ("page_size (derived) 1 (derived by SGLang 0.5.23 sglang/srt/arg_groups/overrides.py "
            "_page_size_default") in flat


REAL_DERIVED = FIXTURES / "gpu/router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02/derived.txt"


@pytest.mark.parametrize(("case", "algorithm", "topk"), [
    ("none", None, 1), ("eagle3_topk1", "EAGLE3", 1), ("eagle3_topk4", "EAGLE3", 4), ("dflash", "DFLASH", 1)])
def test_the_derived_backend_is_what_real_sglang_derived_on_an_h200(case, algorithm, topk):
    """SGLang 0.5.17's own ServerArgs post-init, run on a real H200 (sm_90) with the backend and
    page size unset (scripts/gpu-acceptance/derived_probe.py): the plan derives the same."""
    real = {d["case"]: d for d in map(json.loads, (ln for ln in REAL_DERIVED.read_text().splitlines()
                                                    if ln.startswith("{")))}
    want = real[case]["derived"]
    assert attention(on("h200x1", "0.5.17", algorithm, topk=topk)) == (want["attention_backend"], want["page_size"])
