"""The build table (``ddtree_ops/config/build_table.py``, ``sglang_env.py``) against the REAL
released packages of every peer version: each fact copied into Python is re-read here from
the package (with SGLang's own code where it can run without a GPU) and must agree.

* attention backend names == the real parser's ``--attention-backend`` choices and
  ``server_args``' lists (``DRAFT_ATTENTION_BACKEND_CHOICES`` where the release has one);
* each arch rule's evidence text is in the package of every peer version inside its version
  range and in none outside it (so a range that is wrong for a peer version fails);
* the ``Envs`` registry == the names SGLang's own ``sglang.srt.environ.Envs`` defines; every
  rename the table records is one SGLang performs at import (the new variable appears, or a
  deprecation warning names the old one); the generated module is what
  ``scripts/sglang-env-facts.py`` writes from the packages now;
* ``Requires-Dist`` of the installed ``sglang`` gives the CUDA major of the table;
* every option string of a destination the toolkit owns is refused in ``extra_args``;
* ``extra_args`` go through the real parser with the rest of our argv (an unknown flag is
  named by the parser, as in the capability probe).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from peerutil import PEER_VERSIONS, run_worker, sglang_python

from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.build_table import (
    ARCH_RULES,
    BACKEND_CHOICES,
    BUILD_REQUIRES_CUDA,
    OWNED_ALIASES,
    OWNED_FLAGS,
    SECRET_DEST,
    SECRET_FLAGS,
    SECRET_PREFIX_EXACT,
    cuda_major_of_requires,
    owned_flag,
    secret_flag,
)
from ddtree_ops.config.sglang_env import ENV_DEPRECATION_NOTES, ENV_REGISTRY, ENV_RENAMED
from ddtree_ops.render.argv import build_argv

PROBE_SGL = "SGL_DDTREE_PEER_PROBE"


@pytest.fixture(scope="module")
def facts(peer_tmp) -> dict[str, dict]:
    """``buildfacts`` of each peer version, every deprecated name of the table set to 1000
    before SGLang's import (one fresh worker process per version)."""
    out = {}
    for v in PEER_VERSIONS:
        set_env = {old: "1000" for old in ENV_RENAMED[v]} | {PROBE_SGL: "1000"}
        out[v] = run_worker(sglang_python(v), [{"kind": "buildfacts", "set_env": set_env}],
                            peer_tmp / f"buildfacts-{v}")[0]
    return out


def test_every_peer_version_has_rows():
    for v in PEER_VERSIONS:
        assert v in BACKEND_CHOICES and v in ENV_REGISTRY and v in BUILD_REQUIRES_CUDA


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_backend_names_equal_the_package_s(version, introspection, facts):
    """``--attention-backend``'s parser choices and ``server_args``' lists; the draft list is
    not a parser choice in either release (0.5.23 enforces it in the draft worker)."""
    row = BACKEND_CHOICES[version]
    f = facts[version]
    assert introspection[version]["choices"]["--attention-backend"] == list(row.attention) == f["attention_choices"]
    assert "--speculative-draft-attention-backend" not in introspection[version]["choices"]
    assert f["draft_attention_choices"] == (list(row.draft) if row.draft is not None else None)
    if row.draft is not None:
        site = Path(f["site_packages"])
        assert _has(site, "sglang/srt/speculative/draft_worker_common.py", "not in DRAFT_ATTENTION_BACKEND_CHOICES")


def _has(site: Path, rel: str, text: str | None) -> bool:
    p = site / rel
    return p.is_file() and (text is None or text in p.read_text(errors="replace"))


@pytest.mark.parametrize("rule", ARCH_RULES, ids=[r.rule for r in ARCH_RULES])
def test_arch_rule_evidence_matches_its_version_range(rule, facts):
    for v in PEER_VERSIONS:
        site = Path(facts[v]["site_packages"])
        inside = rule.covers(v)
        present = _has(site, *rule.evidence)
        assert present == (inside if rule.evidence_present else not inside), (
            f"{rule.rule}: evidence {rule.evidence} {'found' if present else 'missing'} in SGLang {v}, "
            f"which is {'inside' if inside else 'outside'} {rule.versions}")
        if inside:
            src = rule.source.split()[0]
            assert (site / src).is_file(), f"{rule.rule}: source {src} is not in SGLang {v}"


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_sm120_allowed_backends_still_allowed(version, facts):
    """The table refuses nothing else on sm_120: trtllm_mla's guard admits SM12x, and
    0.5.13.post1's decode guard admits SM120 for trtllm_mha."""
    site = Path(facts[version]["site_packages"])
    mla = "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)"
    assert _has(site, "sglang/srt/server_args.py", mla) or _has(site, "sglang/srt/arg_groups/overrides.py", mla)
    decode = "TRTLLM MHA backend for decode is only supported on Hopper (SM90), Blackwell (SM100) and (SM120) GPUs"
    assert _has(site, "sglang/srt/server_args.py", decode) or _has(site, "sglang/srt/arg_groups/attention_hook.py",
                                                                     decode)


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_env_registry_equals_sglang_envs(version, facts):
    assert sorted(ENV_REGISTRY[version]) == facts[version]["env_registry"]


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_env_renames_are_what_sglang_does(version, facts):
    f = facts[version]
    for old, new in ENV_RENAMED[version].items():
        if old in f["env_aliases"]:
            assert f["env_aliases"][old] == new, old
        elif new is not None:
            assert new in f["env_added"], f"SGLang {version} did not forward {old} to {new}"
        else:
            note = ENV_DEPRECATION_NOTES[version].get(old, "")
            assert any(old in w and note in w for w in f["warnings"]), (
                f"SGLang {version} gave no deprecation warning for {old} (with {note!r})")
    assert set(f["env_aliases"]) <= set(ENV_RENAMED[version])
    # env_problem's SGL_ -> SGLANG_ advice is what SGLang does
    assert f["env_added"].get("SGLANG_" + PROBE_SGL[len("SGL_"):]) == "1000"


def test_generated_env_module_is_current(facts):
    sites = [facts[v]["site_packages"] for v in PEER_VERSIONS]
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "sglang-env-facts.py"), *sites],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == (REPO / "ddtree_ops" / "config" / "sglang_env.py").read_text(), (
        "regenerate: python scripts/sglang-env-facts.py SITE... > ddtree_ops/config/sglang_env.py")


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_requires_dist_gives_the_table_s_cuda(version, facts):
    row = BUILD_REQUIRES_CUDA[version]
    major, why = cuda_major_of_requires(facts[version]["requires"])
    assert (major, sorted(why)) == (row.cuda_major, sorted(row.requires))


def test_owned_flags_cover_every_alias(facts):
    everything: set[str] = set()
    for v in PEER_VERSIONS:
        for dest, options in facts[v]["dests"].items():
            everything.update(options)
            if any(o in OWNED_FLAGS for o in options):
                loose = [o for o in options if o.startswith("--") and owned_flag(o) is None]
                assert not loose, f"SGLang {v}: {loose} set owned {dest} but extra_args would accept them"
    stale = [f for f in (*OWNED_FLAGS, *OWNED_ALIASES) if f not in everything]
    assert not stale, f"owned flags no peer parser has: {stale}"


def test_secret_flags_are_the_parsers_secret_destinations(facts):
    """Every option of a destination whose name looks secret (``api_key``, ``*_token``,
    ``*_password``...) in a peer parser is in :data:`SECRET_FLAGS` (so any abbreviation of it
    is refused in ``extra_args``), none is stale, and the parser options that prefix one are
    exactly :data:`SECRET_PREFIX_EXACT`."""
    secret: set[str] = set()
    options: set[str] = set()
    for v in PEER_VERSIONS:
        for dest, opts in facts[v]["dests"].items():
            long = [o for o in opts if o.startswith("--")]
            options.update(long)
            if SECRET_DEST.search(dest):
                secret.update(long)
    assert secret == set(SECRET_FLAGS)
    assert {o for o in options if o not in secret and any(s.startswith(o) for s in secret)} == set(SECRET_PREFIX_EXACT)
    for flag in SECRET_FLAGS:
        loose = [flag[:n] for n in range(3, len(flag) + 1) if flag[:n] not in options and secret_flag(flag[:n]) is None]
        assert not loose, f"{loose} abbreviate {flag} but extra_args would accept them"


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_extra_args_parse_with_the_real_parser(version, peer_tmp):
    hv = {
        "ddtree_host_class": "b300",
        "ddtree_sglang": {"source": "pypi", "version": version},
        "ddtree_model": {"path": "Qwen/Qwen3-8B"},
        "ddtree_speculative": {"algorithm": "none"},
        "ddtree_server": {"tp_size": 8, "max_running_requests": 16, "attention_backend": "flashinfer",
                          "nccl_port": 30012, "base_gpu_id": 0,
                          "extra_args": {"--disaggregation-bootstrap-port": 30011, "--disable-custom-all-reduce": True,
                                         "--kv-cache-dtype": "fp8_e4m3",
                                         "--decode-attention-backend": "trtllm_mha"}},
    }
    v = validate_hostvars("h1", hv)
    good = build_argv(v.deployment, v.plan)[3:]
    # validate refuses a flag the release's parser does not have (its parser facts, generated from
    # this same release); the real parser must refuse it too, so the two agree
    hv["ddtree_server"]["extra_args"]["--no-such-flag"] = 1
    with pytest.raises(ConfigError, match=f"SGLang {re.escape(version)} has no option --no-such-flag"):
        validate_hostvars("h1", hv)
    bad = [*good, "--no-such-flag", "1"]
    ok, rejected = run_worker(sglang_python(version), [{"kind": "parse", "argv": good}, {"kind": "parse", "argv": bad}],
                              peer_tmp / f"extra-{version}")
    assert ok["ok"], ok["error"]
    assert not rejected["ok"] and "--no-such-flag" in rejected["error"]


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_extra_args_reach_the_probe_s_parse(version, peer_tmp):
    """The capability probe (``python -m ddtree_ops.sglang.probe``, run in the real venv as
    the sglang role runs it) parses ``extra_args`` with the build's own parser: every
    modelled and extra flag is recognized except the one the build does not have."""
    import json

    from peerutil import _clean_env

    from ddtree_ops.sglang.expect import probe_request

    hv = {
        "ddtree_host_class": "b300",
        "ddtree_sglang": {"source": "pypi", "version": version},
        "ddtree_model": {"path": "Qwen/Qwen3-8B"},
        "ddtree_speculative": {"algorithm": "none"},
        "ddtree_server": {"tp_size": 8, "max_running_requests": 16, "attention_backend": "flashinfer",
                          "nccl_port": 30012,
                          "extra_args": {"--disaggregation-bootstrap-port": 30011,
                                         "--kv-cache-dtype": "fp8_e4m3"}},
    }
    req = probe_request(validate_hostvars("h1", hv))
    # validate refuses an unknown flag now; the probe is the host's own check of the build that is
    # really installed (a patched build, a release without parser facts), so it is handed one directly
    req["argv"][-2:-2] = ["--no-such-flag", "1"]
    assert req["argv"][-6:] == ["--disaggregation-bootstrap-port", "30011", "--no-such-flag", "1",
                                "--kv-cache-dtype", "fp8_e4m3"]
    assert req["argv"][req["argv"].index("--nccl-port") + 1] == "30012"  # the modelled field, rendered
    work = peer_tmp / f"probe-{version}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "request.json").write_text(json.dumps(req))
    env = {**_clean_env(), "PYTHONPATH": str(REPO)}
    r = subprocess.run([str(sglang_python(version)), "-m", "ddtree_ops.sglang.probe", "--request",
                        str(work / "request.json"), "--json"], capture_output=True, text=True, timeout=300,
                       env=env, cwd=work)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["argv-parses"]["ok"] is False
    assert checks["argv-parses"]["unrecognized"] == ["--no-such-flag"], checks["argv-parses"]
