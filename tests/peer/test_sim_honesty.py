"""Keep the SGLang simulator (``ddtree_ops/sim``, a test double) honest against REAL SGLang.

For each peer version (0.5.13.post1, 0.5.23), with the real package's own answers
(``sglang_worker.py introspect``: its parser, its ServerArgs fields, its metrics collector
source, its scheduler's ``get_internal_state``):

* every ``sglang:`` metric name the simulator exports is defined in the real
  ``metrics_collector.py`` (and in ``tests/fixtures/sglang/metric_names-*.txt``);
* every ``/server_info`` key the simulator reports is a real ServerArgs field, a key real
  ``/server_info`` adds (``internal_states``, ``version``, scheduler info), or a DDTree-only
  field of a DDTree build; every ``internal_states`` key is one the real scheduler sets;
* every flag the simulator's parser knows for a release build exists in the real parser,
  and for every argv we render (all inventories, each dialect, each version) the simulator
  accepts exactly when the real parser accepts -- plus the DDTree-only flags, which only
  the simulator's DDTree builds accept;
* where 0.5.23 resolves without a GPU, the simulator resolves our argv to the same capture
  list, max_running_requests and overlap setting.

A drift fails the tier; the fix belongs in the simulator.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from helpers import FIXTURES
from peerutil import PEER_VERSIONS, sglang_python
from test_argv_real_sglang import (  # noqa: F401 - fixtures reused from the argv checks
    CASES,
    RESOLVE_CASES,
    as_dflash,
    parse_argv,
    parsed,
    resolved,
    sglang_args,
)

from ddtree_ops.config.versions import DDTREE_SOURCES
from ddtree_ops.sim.args import build_parser, parse_args
from ddtree_ops.sim.metrics import SimMetrics
from ddtree_ops.sim.server import SimApp

DDTREE_ONLY_FLAGS = sorted({f for s in DDTREE_SOURCES.values() for f in s.adds_flags})
DDTREE_ONLY_FIELDS = sorted(f.lstrip("-").replace("-", "_") for f in DDTREE_ONLY_FLAGS)
SERVER_INFO_EXTRA = ("internal_states", "version", "max_total_num_tokens", "max_req_input_len")
"""Non-ServerArgs keys of real ``/server_info``: ``internal_states`` and ``version`` (added by
``http_server.server_info``) and the scheduler info the DP controller/scheduler reports."""


def _info(introspection, version):
    sglang_python(version)  # skips, or fails under DDTREE_PEER=1, when the venv is missing
    return introspection[version]


def _sim_accepts(argv, version, build) -> str:
    """'' when the simulator's parser accepts ``argv``, else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser(version, build).parse_args(list(argv))
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return ""


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_sim_metric_names_are_real(version, introspection):
    real = {n.removesuffix("_total") for n in _info(introspection, version)["metric_names"]}
    sim = {fam.name.removesuffix("_total") for fam in SimMetrics("m", tp_size=2).registry.collect()}
    assert sim, "simulator exports no metrics"
    assert sim <= real, f"simulator metric names not in SGLang {version}: {sorted(sim - real)}"
    fixture = FIXTURES / "sglang" / f"metric_names-{version}.txt"
    if fixture.exists():
        names = {n.strip().removesuffix("_total") for n in fixture.read_text().splitlines() if n.strip()}
        assert sim <= names, sorted(sim - names)


@pytest.mark.parametrize("version", PEER_VERSIONS)
@pytest.mark.parametrize("build", ["ddtree", "release"])
def test_sim_server_info_keys_are_real(version, build, introspection):
    info = _info(introspection, version)
    fields, literals = set(info["fields"]), set(info["string_literals"])
    state_keys = set(info["internal_state_keys"])
    for extra in SERVER_INFO_EXTRA:
        assert extra in literals, f"{extra!r} is not a key real SGLang {version} reports"
    allowed = fields | set(SERVER_INFO_EXTRA) | (set(DDTREE_ONLY_FIELDS) if build == "ddtree" else set())
    checked = 0
    for cid, v in CASES:
        argv = sglang_args(v)
        if build == "release":
            if v.deployment.speculative.algorithm == "DDTREE":
                continue
        try:
            cfg = parse_args(argv, version=version, build=build)
        except (SystemExit, ValueError):
            continue  # argv of the other dialect: covered by the flag test
        si = SimApp(cfg).server_info()
        assert not set(si) - allowed, (
            f"{cid}: sim /server_info keys unknown to SGLang {version}: {sorted(set(si) - allowed)}"
        )
        for state in si["internal_states"]:
            bad = set(state) - state_keys - fields
            assert not bad, f"{cid}: sim internal_states keys the real scheduler never sets: {sorted(bad)}"
        checked += 1
    assert checked, "no argv of this version to check"


@pytest.mark.parametrize("version", PEER_VERSIONS)
def test_sim_parser_flags_exist_in_real_parser(version, introspection):
    info = _info(introspection, version)
    real = set(info["options"])
    for build in ("release", "ddtree"):
        sim = {o for a in build_parser(version, build)._actions for o in a.option_strings if o.startswith("--")}
        sim.discard("--help")
        extra = sim - real - (set(DDTREE_ONLY_FLAGS) if build == "ddtree" else set())
        assert not extra, f"simulator ({build} build) accepts flags SGLang {version} does not have: {sorted(extra)}"
    assert set(DDTREE_ONLY_FLAGS).isdisjoint(real)  # they really are DDTree-only


@pytest.mark.parametrize("cid, v", CASES, ids=[c[0] for c in CASES])
def test_sim_accepts_exactly_what_real_parser_accepts(cid, v, parsed):  # noqa: F811 - the fixture imported above
    base = v.deployment.sglang.base_version
    runs = [(base, cid)] + [(o, f"{cid}#by-{o}") for o in PEER_VERSIONS if o != base]
    for version, key in runs:
        real = parsed[key]
        sim_err = _sim_accepts(parse_argv(v), version, "release")
        assert (sim_err == "") == real["ok"], (
            f"{key}: real SGLang {version} {'accepts' if real['ok'] else 'rejects: ' + real['error']}, "
            f"simulator {'accepts' if not sim_err else 'rejects: ' + sim_err}")
        if not real["ok"]:  # same kind of refusal
            kind = "ambiguous option" if "ambiguous option" in real["error"] else "unrecognized arguments"
            assert kind in sim_err, (real["error"], sim_err)
    if v.deployment.speculative.algorithm == "DDTREE":
        full = sglang_args(v)
        assert _sim_accepts(full, base, "ddtree") == ""
        assert "unrecognized arguments: --speculative-ddtree-budget" in _sim_accepts(full, base, "release")
        assert not parsed[cid + "#unstripped"]["ok"]


@pytest.mark.parametrize("cid, v", RESOLVE_CASES, ids=[c[0] for c in RESOLVE_CASES])
def test_sim_resolution_matches_real_resolver(cid, v, resolved):  # noqa: F811 - the fixture imported above
    real = resolved[cid]
    assert real["ok"], real["error"]
    got = real["resolved"]
    sim = parse_args(as_dflash(parse_argv(v)), version="0.5.23", build="release")
    sa = sim.server_args
    assert sa["max_running_requests"] == got["max_running_requests"]
    assert sa["disable_overlap_schedule"] == got["disable_overlap_schedule"], (
        f"overlap: sim {sa['disable_overlap_schedule']}, SGLang {got['disable_overlap_schedule']}")
    assert (sa["speculative_num_steps"], sa["speculative_eagle_topk"], sa["speculative_num_draft_tokens"]) == (
        got["speculative_num_steps"], got["speculative_eagle_topk"], got["speculative_num_draft_tokens"])
    decode = sa.get("cuda_graph_config", {}).get("decode", {})
    if got["decode_backend"] == "full":
        assert decode.get("bs") == got["decode_capture_bs"] and decode.get("max_bs") == got["decode_max_bs"]
    assert sa["attention_backend"] == got["attention_backend"] and sa["page_size"] == got["page_size"]
