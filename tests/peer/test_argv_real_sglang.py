"""Every shipped inventory's argv, parsed (and, for 0.5.23, resolved) by REAL SGLang.

For each host of each inventory under ``inventory/`` (example, test, dflash-example, ...):
our argv (``render.argv.build_argv`` on the validated deployment) goes through the pinned
base version's own parser, built exactly as ``prepare_server_args`` builds it: no
"unrecognized arguments", no "ambiguous option", no invalid choice.

DDTree is in no release: for DDTree hosts the flags the DDTree source adds
(``DDTREE_SOURCES[...].adds_flags``) are checked against the versions table (base version,
flag dialect, budget + 1 sizing), the release is shown to REJECT them (so they really are
DDTree-only), and every other flag must parse with the base version's real parser.

Every non-DDTree deployment is also re-pinned to each peer version, so each flag dialect is
rendered and parsed by each version, and the renderer's dialect choice is proven both ways
(the other version's dialect is rejected).

SGLang 0.5.23 constructs and RESOLVES server args without a GPU (``--device cuda`` added
for this CPU run, model paths replaced by local config-only directories of a small
Qwen3-style model; DDTREE replaced by DFLASH, which DDTree rides on): its resolved decode
capture list, max_running_requests and speculative fields must equal our plan. A second
resolution without our explicit ``--cuda-graph-bs-decode`` list checks our model of
SGLang's DEFAULT capture list. 0.5.13.post1 cannot construct ServerArgs without an
accelerator ("No accelerator ... is available"), so it is checked at the parser level only.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from helpers import REPO
from peerutil import PEER_VERSIONS, resolver_python, run_worker, sglang_python

from ddtree_ops.config import validate_hostvars
from ddtree_ops.config.inventory import load_hostvars
from ddtree_ops.config.versions import DDTREE_SOURCES, version_info
from ddtree_ops.render.argv import build_argv

INVENTORIES = sorted(p for p in (REPO / "inventory").iterdir() if p.is_dir())


def _cases():
    """``[(case_id, hostvars, Validated)]``: every shipped host, plus non-DDTree hosts
    re-pinned to every peer version (``@VERSION``) and one with speculation off."""
    out = []
    for inv in INVENTORIES:
        for host, hv in sorted(load_hostvars(inv).items()):
            v = validate_hostvars(host, hv)
            # a host pinned to a release the peer tier has no venv of (inventory/h200: 0.5.17, what
            # the lent GPU machine runs) is checked re-pinned to each peer version below
            if v.deployment.sglang.base_version in PEER_VERSIONS:
                out.append((f"{inv.name}/{host}", v))
            if v.deployment.speculative.algorithm == "DDTREE" or v.deployment.sglang.source == "simulator":
                continue
            for ver in PEER_VERSIONS:
                if ver != v.deployment.sglang.base_version:
                    hv2 = copy.deepcopy(hv)
                    hv2["ddtree_sglang"] = {**hv2.get("ddtree_sglang", {}), "version": ver}
                    out.append((f"{inv.name}/{host}@{ver}", validate_hostvars(host, hv2)))
            if (inv.name == "dflash-example" and v.deployment.sglang.base_version == "0.5.23"
                    and not any(c[0].endswith("@nospec") for c in out)):
                hv3 = copy.deepcopy(hv)
                hv3["ddtree_speculative"] = {"algorithm": "none"}
                out.append((f"{inv.name}/{host}@nospec", validate_hostvars(host, hv3)))
                # --revision / --speculative-draft-model-revision, pinned to each
                # version; the commit is parser input only, nothing is downloaded
                for ver in PEER_VERSIONS:
                    hv4 = copy.deepcopy(hv)
                    hv4["ddtree_sglang"] = {**hv4.get("ddtree_sglang", {}), "version": ver}
                    hv4["ddtree_model"] = {
                        **hv4["ddtree_model"],
                        "revision": "0123456789abcdef0123456789abcdef01234567",
                    }
                    hv4["ddtree_speculative"] = {**hv4["ddtree_speculative"], "draft_model_revision": "v1.0"}
                    out.append((f"{inv.name}/{host}@revision-{ver}", validate_hostvars(host, hv4)))
    return out


CASES = _cases()
IDS = [c[0] for c in CASES]


def strip_ddtree(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` without the DDTree-only flags and their values."""
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in flags:
            skip = True
            continue
        out.append(tok)
    return out


def sglang_args(v) -> list[str]:
    return build_argv(v.deployment, v.plan)[3:]


def as_dflash(argv: list[str]) -> list[str]:
    """DDTree rides on DFlash: the release sees the DFLASH algorithm."""
    return ["DFLASH" if (tok == "DDTREE" and argv[i - 1] == "--speculative-algorithm") else tok
            for i, tok in enumerate(argv)]


def parse_argv(v) -> list[str]:
    """The argv the base version's real parser must accept whole."""
    argv = sglang_args(v)
    if v.deployment.speculative.algorithm == "DDTREE":
        argv = strip_ddtree(argv, DDTREE_SOURCES[v.deployment.sglang.ddtree_source].adds_flags)
    return argv


@pytest.fixture(scope="module")
def parsed(peer_tmp) -> dict[str, dict]:
    """One worker run per version: results keyed by ``case_id`` (+ suffixes)."""
    jobs_by_version: dict[str, list[tuple[str, dict]]] = {v: [] for v in PEER_VERSIONS}
    for cid, v in CASES:
        base = v.deployment.sglang.base_version
        jobs_by_version[base].append((cid, {"kind": "parse", "argv": parse_argv(v)}))
        if v.deployment.speculative.algorithm == "DDTREE":
            jobs_by_version[base].append((cid + "#unstripped", {"kind": "parse", "argv": sglang_args(v)}))
        for other in PEER_VERSIONS:  # the argv of this dialect parsed by the other version
            if other != base:
                jobs_by_version[other].append((cid + f"#by-{other}", {"kind": "parse", "argv": parse_argv(v)}))
    results = {}
    for ver, jobs in jobs_by_version.items():
        if not jobs:
            continue
        res = run_worker(sglang_python(ver), [j for _, j in jobs], peer_tmp / f"parse-{ver}")
        results.update({cid: r for (cid, _), r in zip(jobs, res, strict=True)})
    return results


@pytest.mark.parametrize("cid, v", CASES, ids=IDS)
def test_rendered_argv_parses_with_real_sglang(cid, v, parsed):
    r = parsed[cid]
    assert r["ok"], f"SGLang {v.deployment.sglang.base_version} rejects our argv for {cid}: {r['error']}"


@pytest.mark.parametrize("cid, v", [c for c in CASES if c[1].deployment.speculative.algorithm == "DDTREE"],
                         ids=[c[0] for c in CASES if c[1].deployment.speculative.algorithm == "DDTREE"])
def test_ddtree_only_flags_match_versions_table(cid, v, parsed, introspection):
    d, plan = v.deployment, v.plan
    sglang_python(d.sglang.base_version)
    src = DDTREE_SOURCES[d.sglang.ddtree_source]
    base = d.sglang.base_version
    assert base == src.base_version and base in PEER_VERSIONS
    argv = sglang_args(v)
    real = set(introspection[base]["options"])
    unknown = {t for t in argv if t.startswith("--") and t not in real}
    assert unknown == set(src.adds_flags), f"flags unknown to SGLang {base}: {unknown}"
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == str(plan.budget)
    assert plan.verify_tokens_per_req == plan.budget + 1 and plan.draft_tokens_per_req == plan.block_size
    if not src.sizes_verify_at_budget_plus_one:  # shipped only eager (validator), the plugin's case
        assert not plan.cuda_graphs
    # the release rejects them: they really are DDTree-only
    r = parsed[cid + "#unstripped"]
    assert not r["ok"] and "unrecognized arguments: --speculative-ddtree-budget" in r["error"], r
    assert "DDTREE" not in introspection[base]["spec_algorithms"]


@pytest.mark.parametrize("cid, v", CASES, ids=IDS)
def test_dialect_is_the_versions(cid, v, parsed):
    """The graph flags are the base version's dialect, and the other version rejects them."""
    base = v.deployment.sglang.base_version
    dialect = version_info(base).dialect
    argv = sglang_args(v)
    if v.plan.cuda_graphs and v.plan.cuda_graph_max_bs is not None:
        assert dialect.max_bs_flag in argv and dialect.bs_flag in argv
        for other in PEER_VERSIONS:
            if other != base and version_info(other).dialect != dialect:
                r = parsed[cid + f"#by-{other}"]
                assert not r["ok"] and ("ambiguous option" in r["error"] or "unrecognized" in r["error"]), r


@pytest.mark.parametrize("cid, v", CASES, ids=IDS)
def test_rendered_names_are_real_choices(cid, v, introspection):
    base = v.deployment.sglang.base_version
    sglang_python(base)  # skips, or fails under DDTREE_PEER=1, when the venv is missing
    info = introspection[base]
    backends = info["choices"]["--attention-backend"]
    for name in (v.plan.attention_backend, v.deployment.speculative.draft_attention_backend):
        if name:
            assert name in backends, f"{name!r} is no attention backend of SGLang {base}: {backends}"
    alg = v.deployment.speculative.algorithm
    if alg not in ("none", "DDTREE"):
        assert alg in info["spec_algorithms"]


# ---- 0.5.23: construct + resolve, compare with our plan ---------------------------------

RESOLVE_VERSION = "0.5.23"
TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8, "num_hidden_layers": 2,
    "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
RESOLVE_CASES = [c for c in CASES if c[1].deployment.sglang.base_version == RESOLVE_VERSION]


def local_models(argv: list[str], root: Path) -> list[str]:
    """Replace model paths by local config-only directories (no download, no weights)."""
    out = list(argv)
    for flag, name in (("--model-path", "target"), ("--speculative-draft-model-path", "draft")):
        if flag in out:
            d = root / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(TINY_CONFIG))
            out[out.index(flag) + 1] = str(d)
    return out


def without_bs_list(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return argv
    i = argv.index(flag)
    j = i + 1
    while j < len(argv) and not argv[j].startswith("--"):
        j += 1
    return argv[:i] + argv[j:]


@pytest.fixture(scope="module")
def resolved(peer_tmp) -> dict[str, dict]:
    python = resolver_python(RESOLVE_VERSION)
    root = peer_tmp / "models"
    jobs, keys = [], []
    bs_flag = version_info(RESOLVE_VERSION).dialect.bs_flag
    for cid, v in RESOLVE_CASES:
        argv = local_models(as_dflash(parse_argv(v)), root) + ["--device", "cuda"]
        jobs.append({"kind": "resolve", "argv": argv})
        keys.append(cid)
        jobs.append({"kind": "resolve", "argv": without_bs_list(argv, bs_flag)})
        keys.append(cid + "#default-list")
    return dict(zip(keys, run_worker(python, jobs, peer_tmp / "resolve"), strict=True))


@pytest.mark.parametrize("cid, v", RESOLVE_CASES, ids=[c[0] for c in RESOLVE_CASES])
def test_resolved_server_args_match_plan(cid, v, resolved):
    r = resolved[cid]
    assert r["ok"], f"SGLang {RESOLVE_VERSION} refuses {cid}: {r['error']}\n{r.get('trace', '')}"
    got, plan, s = r["resolved"], v.plan, v.deployment.speculative
    assert got["max_running_requests"] == plan.max_running_requests
    if plan.cuda_graphs:
        assert got["decode_backend"] == "full"
        assert got["decode_max_bs"] == plan.cuda_graph_max_bs
        assert got["decode_capture_bs"] == plan.capture_bs
    else:
        assert got["disable_cuda_graph"] is True
    if s.enabled:
        assert got["speculative_num_steps"] == plan.num_steps
        assert got["speculative_eagle_topk"] == plan.topk
        assert got["speculative_num_draft_tokens"] == plan.num_draft_tokens
        assert got["speculative_draft_window_size"] == s.draft_window_size
    else:
        assert got["speculative_algorithm"] is None
    if plan.attention_backend:
        assert got["attention_backend"] == plan.attention_backend
    if plan.page_size is not None:
        assert got["page_size"] == plan.page_size
    if plan.disable_overlap_schedule:
        assert got["disable_overlap_schedule"] is True
    assert (got["tp_size"], got["dp_size"]) == (v.deployment.server.tp_size, v.deployment.server.dp_size)


@pytest.mark.parametrize("cid, v", [c for c in RESOLVE_CASES if c[1].plan.cuda_graphs],
                         ids=[c[0] for c in RESOLVE_CASES if c[1].plan.cuda_graphs])
def test_default_capture_list_model_matches_sglang(cid, v, resolved):
    """Without our explicit list SGLang generates its default one: it must be ours."""
    r = resolved[cid + "#default-list"]
    assert r["ok"], r["error"]
    assert r["resolved"]["decode_capture_bs"] == v.plan.capture_bs, (
        f"SGLang {RESOLVE_VERSION} default list for max_bs {v.plan.cuda_graph_max_bs} differs from plan.py")
