"""The release's own parser and compatibility checks at validate time
(:mod:`ddtree_ops.config.sglang_args`, :mod:`ddtree_ops.config.sglang_checks`,
:mod:`ddtree_ops.config.sglang_compat`).

The generated module is checked against the real wheels where they are present:
``DDTREE_SGLANG_SITES`` names directories (``:``-separated) that each hold one released
``sglang`` (``pip download sglang==X --no-deps`` unzipped, or a ``scripts/sglang-venv.sh`` venv's
site-packages); without it those tests skip.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from helpers import REPO

from ddtree_ops.config import ConfigError, sglang_args, sglang_compat, validate_hostvars
from ddtree_ops.config.derived import ATTENTION_BRANCHES
from ddtree_ops.config.sglang_checks import CHECKS
from ddtree_ops.config.versions import RELEASES
from ddtree_ops.render.argv import build_argv

SITES = [Path(p) for p in os.environ.get("DDTREE_SGLANG_SITES", "").split(":") if p]


def _generator():
    spec = importlib.util.spec_from_file_location("sglang_args_facts", REPO / "scripts" / "sglang-args-facts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def spec_hv(version: str, algorithm: str, extra: dict | None = None, **spec) -> dict:
    """A 1x H200 (sm_90) deployment of release ``version`` with ``algorithm``."""
    sizes = {"DFLASH": {"block_size": 8}, "EAGLE": {"num_steps": 3, "topk": 1},
             "EAGLE3": {"num_steps": 3, "topk": 1}, "STANDALONE": {"num_steps": 3, "topk": 1},
             "DSPARK": {"num_steps": 1, "topk": 1, "num_draft_tokens": 5}, "NGRAM": {}}[algorithm]
    draft = {} if algorithm == "NGRAM" else {"draft_model_path": "org/draft"}
    return {
        "ddtree_host_class": "h200x1",
        "ddtree_sglang": {"source": "pypi", "version": version},
        "ddtree_model": {"path": "Qwen/Qwen3-8B"},
        "ddtree_speculative": {"algorithm": algorithm, **draft, **sizes, **spec},
        "ddtree_server": {"tp_size": 1, "max_running_requests": 16, "attention_backend": "triton",
                          "extra_args": extra or {}},
    }


def run(hv: dict):
    """``(errors, warnings, validated or None)``."""
    try:
        v = validate_hostvars("h1", hv)
    except ConfigError as exc:
        return ([f for f in exc.findings if f.level == "error"],
                [f for f in exc.findings if f.level == "warning"], None)
    return [], v.warnings, v


def ids(findings) -> set[str]:
    out = set()
    for f in findings:
        if f.rule.endswith("]") and "[" in f.rule:
            out.add(f.rule.rsplit("[", 1)[1][:-1])
    return out


# --- the generated parser facts -----------------------------------------------------------

def test_every_release_has_parser_facts():
    assert set(sglang_args.OPTIONS) == set(RELEASES) == set(sglang_args.ALLOW_ABBREV) == set(sglang_args.CHECK_LINES)
    for version, opts in sglang_args.OPTIONS.items():
        # the flags every rendered argv uses are in each release's parser, with the value counts we give
        assert opts["--model-path"][1] == "value" and opts["--enable-metrics"][1] == "flag", version
        assert opts["--speculative-algorithm"][0] == "speculative_algorithm", version


@pytest.mark.skipif(not SITES, reason="DDTREE_SGLANG_SITES names no released sglang packages")
def test_generated_module_equals_the_wheels():
    gen = _generator()
    for site in SITES:
        version = gen.version_of(site)
        opts, abbrev = gen.options_of(site)
        assert sglang_args.OPTIONS[version] == opts, f"{version}: regenerate with scripts/sglang-args-facts.py"
        assert sglang_args.ALLOW_ABBREV[version] is abbrev
        assert sglang_args.CHECK_LINES[version] == gen.evidence_lines(site, CHECKS)
        assert sglang_args.DERIVED_LINES[version] == gen.evidence_lines(site, ATTENTION_BRANCHES)


@pytest.mark.skipif(not SITES, reason="DDTREE_SGLANG_SITES names no released sglang packages")
def test_each_recorded_line_holds_sglang_s_text():
    gen = _generator()
    by_id = {c.id: c for c in CHECKS}
    for site in SITES:
        for cid, (file, _func, line) in sglang_args.CHECK_LINES[gen.version_of(site)].items():
            assert by_id[cid].evidence in (site / file).read_text().splitlines()[line - 1]


@pytest.mark.skipif(not SITES, reason="DDTREE_SGLANG_SITES names no released sglang packages")
def test_each_recorded_default_branch_holds_sglang_s_text():
    gen = _generator()
    by_id = {b.id: b for b in ATTENTION_BRANCHES}
    for site in SITES:
        for bid, (file, _func, line) in sglang_args.DERIVED_LINES[gen.version_of(site)].items():
            text = (site / file).read_text().splitlines()[line - 1]
            assert any(e in text for e in by_id[bid].evidence), (bid, text)


def test_default_branches_follow_the_release():
    """Read off the wheels: only 0.5.23 lets DFLASH take trtllm_mha on sm_100 (its hook forces topk 1
    after the default is chosen), and trtllm_mha takes pages of 128 from 0.5.17; every release has the
    sm_90 fa3 default and the page size of 1."""
    lines = sglang_args.DERIVED_LINES
    assert set(lines) == set(RELEASES)
    assert [v for v in lines if "mha-sm100-dflash-topk-one" in lines[v]] == ["0.5.23"]
    assert [v for v in lines if "trtllm-mha-page-128" in lines[v]] == ["0.5.17", "0.5.23"]
    for v, found in lines.items():
        assert {"mha-hopper-fa3", "mha-sm100-trtllm-mha", "mha-flashinfer", "page-default-1"} <= set(found), v


def test_checks_name_options_the_release_has():
    """A refusal applies where its text was found; its field's option is in that release (an
    extra_args field), or it names a typed inventory field."""
    from ddtree_ops.config.models import Speculative
    from ddtree_ops.config.service_models import Server

    typed = {"ddtree_server": Server.model_fields, "ddtree_speculative": Speculative.model_fields}
    for version, found in sglang_args.CHECK_LINES.items():
        for cid in found:
            [c] = [c for c in CHECKS if c.id == cid]
            if c.field.startswith("ddtree_server.extra_args."):
                option = c.field.rsplit(".", 1)[1]
                assert option in sglang_args.OPTIONS[version], (version, cid, option)
            else:
                section, name = c.field.split(".")
                assert name in typed[section], (version, cid, c.field)


def test_evidence_follows_the_release():
    """SGLang 0.5.23 lifted DFLASH's DP-attention refusal to 'needs --enable-dp-lm-head'; 0.5.13.post1
    has no DSPARK and no DCP hierarchical-cache check."""
    lines = sglang_args.CHECK_LINES
    assert "dflash-dp-attention" in lines["0.5.17"] and "dflash-dp-attention" not in lines["0.5.23"]
    assert "dflash-dp-attention-lm-head" in lines["0.5.23"] and "dflash-dp-attention-lm-head" not in lines["0.5.17"]
    assert "dspark-dp-attention-lm-head" not in lines["0.5.13.post1"]
    assert all(lines[v]["standalone-dp-attention"][1] == "_handle_eagle_family" for v in lines)


# --- extra_args against the release's parser -----------------------------------------------

def test_abbreviation_resolves_by_unique_prefix():
    """argparse accepts a unique prefix (allow_abbrev is True in every release read)."""
    assert all(sglang_args.ALLOW_ABBREV.values())
    for v in sglang_args.OPTIONS:
        assert sglang_compat.resolve(v, "--kv-cache-dtyp") == ("--kv-cache-dtype", [])
    errors, _w, ok = run(spec_hv("0.5.17", "EAGLE3", {"--kv-cache-dtyp": "fp8_e4m3"}))
    assert not errors and ok is not None


def test_abbreviation_off_refuses_prefixes(monkeypatch):
    monkeypatch.setitem(sglang_args.ALLOW_ABBREV, "0.5.17", False)
    assert sglang_compat.resolve("0.5.17", "--kv-cache-dtyp") == (None, [])
    [e] = run(spec_hv("0.5.17", "EAGLE3", {"--kv-cache-dtyp": "fp8_e4m3"}))[0]
    assert "has no option --kv-cache-dtyp" in e.rule and "--kv-cache-dtype" in e.fix


def test_ambiguous_prefix_refused_naming_the_candidates():
    [e] = run(spec_hv("0.5.23", "EAGLE3", {"--enable-dp": True}))[0]
    assert e.field == "ddtree_server.extra_args.--enable-dp" and "ambiguous" in e.rule
    assert "--enable-dp-attention" in e.rule and "--enable-dp-lm-head" in e.rule


@pytest.mark.parametrize("version", sorted(sglang_args.OPTIONS))
def test_unknown_flag_refused_at_validate_with_a_suggestion(version):
    [e] = run(spec_hv(version, "EAGLE3", {"--enable-hierarchical-cachee": True}))[0]
    assert e.field == "ddtree_server.extra_args.--enable-hierarchical-cachee"
    assert f"SGLang {version} has no option" in e.rule and "--enable-hierarchical-cache" in e.fix
    [e] = run(spec_hv(version, "EAGLE3", {"--no-such-flag-at-all": 3}))[0]
    assert "unrecognized arguments" in e.rule


def test_value_counts_follow_the_parser():
    errors = run(spec_hv("0.5.17", "EAGLE3", {"--enable-dp-attention": "yes", "--kv-cache-dtype": True,
                                              "--dtype": ["a", "b"]}))[0]
    by = {e.field.rsplit(".", 1)[1]: e.rule for e in errors}
    assert "takes no value" in by["--enable-dp-attention"]
    assert "takes exactly one value" in by["--kv-cache-dtype"] and "takes exactly one value" in by["--dtype"]


def test_unread_release_warns():
    hv = spec_hv("0.5.18", "EAGLE3", {"--enable-dp-attention": True})
    errors, warnings, _ = run(hv)
    assert any("parser was never read" in w.rule for w in warnings)


# --- features meeting speculation ----------------------------------------------------------

HICACHE_L3 = {"--enable-hierarchical-cache": True, "--hicache-storage-backend": "mooncake"}


@pytest.mark.parametrize("version", sorted(sglang_args.OPTIONS))
def test_hicache_storage_with_eagle_warns_with_the_issue(version):
    """sgl-project/sglang#31600: L2/L3 hits skip the draft's prefill, accept length 5.94 -> ~1.4."""
    errors, warnings, _ = run(spec_hv(version, "EAGLE3", dict(HICACHE_L3)))
    assert not errors
    [w] = [w for w in warnings if "hicache-storage-draft-kv" in w.rule]
    assert w.source == "sgl-project/sglang#31600"
    assert w.field == "ddtree_server.extra_args.--hicache-storage-backend"


def test_hicache_storage_abbreviated_and_with_dflash_still_warns():
    """Same kind, other spellings: abbreviated flags, another draft-model algorithm."""
    hv = spec_hv("0.5.17", "DFLASH", {"--enable-hierarchical-cach": True, "--hicache-storage-backend": "file"})
    errors, warnings, _ = run(hv)
    assert not errors
    [w] = [w for w in warnings if "hicache-storage-draft-kv" in w.rule]
    assert w.field == "ddtree_server.extra_args.--hicache-storage-backend"
    # a prefix of several options is argparse's "ambiguous option", refused before anything runs
    hv["ddtree_server"]["extra_args"]["--hicache-storage-back"] = "file"
    [e] = run(hv)[0]
    assert "ambiguous" in e.rule and "--hicache-storage-backend-extra-config" in e.rule


def test_hicache_without_storage_or_with_ngram_is_quiet():
    assert not ids(run(spec_hv("0.5.17", "EAGLE3", {"--enable-hierarchical-cache": True}))[1])
    assert "hicache-storage-draft-kv" not in ids(run(spec_hv("0.5.17", "NGRAM", dict(HICACHE_L3)))[1])


@pytest.mark.parametrize("version", sorted(sglang_args.OPTIONS))
def test_dp_attention_with_eagle_warns_with_the_issue(version):
    """sgl-project/sglang#16274: accept length -37 % with --enable-dp-attention."""
    hv = spec_hv(version, "EAGLE", {"--enable-dp-attention": True})
    hv["ddtree_server"]["dp_size"] = 1
    errors, warnings, _ = run(hv)
    assert not errors
    [w] = [w for w in warnings if "dp-attention-eagle-accept" in w.rule]
    assert w.source == "sgl-project/sglang#16274"


def test_dp_attention_0523_spelling_counts_too():
    """0.5.23 spells DP attention --attn-dp-size N (--enable-dp-attention deprecated)."""
    warnings = run(spec_hv("0.5.23", "EAGLE3", {"--attn-dp-size": 2}))[1]
    assert "dp-attention-eagle-accept" in ids(warnings)


def test_dflash_dp_attention_refused_as_sglang_does_per_release():
    [e] = run(spec_hv("0.5.17", "DFLASH", {"--enable-dp-attention": True}))[0]
    assert "[dflash-dp-attention]" in e.rule
    assert e.source.startswith("SGLang 0.5.17 sglang/srt/arg_groups/speculative_hook.py:157 _handle_dflash")
    # 0.5.23 runs it once the LM head is DP too
    [e] = run(spec_hv("0.5.23", "DFLASH", {"--enable-dp-attention": True}))[0]
    assert "[dflash-dp-attention-lm-head]" in e.rule and "--enable-dp-lm-head" in e.fix
    assert not run(spec_hv("0.5.23", "DFLASH", {"--enable-dp-attention": True, "--enable-dp-lm-head": True}))[0]
    [e] = run(spec_hv("0.5.23", "DFLASH", {"--attn-dp-size": 2}))[0]
    assert "[dflash-dp-attention-lm-head]" in e.rule and e.field == "ddtree_server.extra_args.--enable-dp-attention"


@pytest.mark.parametrize("version", sorted(sglang_args.OPTIONS))
def test_standalone_and_ngram_with_dp_attention_refused(version):
    for alg, cid in (("STANDALONE", "standalone-dp-attention"), ("NGRAM", "ngram-dp-attention")):
        errors = run(spec_hv(version, alg, {"--enable-dp-attention": True}))[0]
        assert cid in ids(errors), (version, alg)


def test_dflash_pipeline_parallel_and_dcp_hicache_refused():
    hv = spec_hv("0.5.13.post1", "DFLASH", {"--pp-size": 2})
    hv["ddtree_host_class"] = "h200x8"
    assert "dflash-pipeline-parallel" in ids(run(hv)[0])
    hv = spec_hv("0.5.17", "EAGLE3", {"--enable-hierarchical-cache": True, "--dcp-size": 2})
    assert "hicache-dcp-speculative" in ids(run(hv)[0])


def test_no_speculation_no_interaction_findings():
    hv = spec_hv("0.5.17", "EAGLE3", {"--enable-dp-attention": True, **HICACHE_L3})
    hv["ddtree_speculative"] = {"algorithm": "none"}
    errors, warnings, _ = run(hv)
    assert not errors and not ids(warnings) & {c.id for c in CHECKS}


# --- algorithms of the release -------------------------------------------------------------

def test_dspark_only_where_the_release_has_it():
    [e] = run(spec_hv("0.5.13.post1", "DSPARK"))[0]
    assert e.field == "ddtree_speculative.algorithm" and "SGLang 0.5.13.post1 has no speculative algorithm DSPARK" \
        in e.rule
    assert "0.5.17" in e.fix and "0.5.23" in e.fix
    errors, _w, v = run(spec_hv("0.5.17", "DSPARK"))
    assert not errors
    argv = build_argv(v.deployment, v.plan)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DSPARK" and "--speculative-draft-model-path" in argv


@pytest.mark.parametrize("version", sorted(sglang_args.OPTIONS))
def test_ngram_needs_no_draft_model(version):
    errors, _w, v = run(spec_hv(version, "NGRAM", num_draft_tokens=8))
    assert not errors
    argv = build_argv(v.deployment, v.plan)
    assert "--speculative-draft-model-path" not in argv
    assert argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    assert v.plan.verify_tokens_per_req == 8
    # unset: SGLang's own default of 12 verify tokens (graphs are sized for it)
    assert run(spec_hv(version, "NGRAM"))[2].plan.verify_tokens_per_req == 12
    [e] = run(spec_hv(version, "NGRAM", draft_model_path="org/draft"))[0]
    assert e.field == "ddtree_speculative.draft_model_path" and "loads no draft model" in e.rule


def test_standalone_needs_a_draft_and_eagle_sizes():
    errors, _w, v = run(spec_hv("0.5.23", "STANDALONE"))
    assert not errors
    argv = build_argv(v.deployment, v.plan)
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    hv = spec_hv("0.5.23", "STANDALONE")
    del hv["ddtree_speculative"]["draft_model_path"]
    hv["ddtree_speculative"].pop("num_steps")
    fields = {e.field for e in run(hv)[0]}
    assert {"ddtree_speculative.draft_model_path", "ddtree_speculative.num_steps"} <= fields


def test_algorithm_outside_any_release_still_refused_by_the_model():
    hv = spec_hv("0.5.23", "EAGLE3")
    hv["ddtree_speculative"]["algorithm"] = "MEDUSA"
    with pytest.raises(ConfigError):
        validate_hostvars("h1", hv)
