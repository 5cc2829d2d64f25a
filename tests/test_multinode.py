"""One SGLang server over several machines (``ddtree_server.multinode``, ``ddtree_ops.config.multinode``):
validation per node and across the nodes, the per-node argv and units, the router's workers, and the
simulator's rendezvous (rank 0 waits for the others; a missing node keeps it unready; a dying node
makes it exit as SGLang does)."""

from __future__ import annotations

import copy
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_hostvars

from ddtree_ops.cli import main
from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.fleet import fleet_findings
from ddtree_ops.config.router import validate_routers
from ddtree_ops.render.argv import build_argv
from ddtree_ops.render.files import prometheus_document, ready_commands, render_host
from ddtree_ops.render.monitoring import EXPORTER_JOB, SGLANG_JOB, absent_rules

NODES = {"b300-01": "10.0.0.1", "b300-02": "10.0.0.2"}


def _hv(host: str, server: dict | None = None, **sections) -> dict:
    hv = copy.deepcopy(base_hostvars())
    hv["ansible_host"] = NODES.get(host, "10.0.0.9")
    mn = {"nodes": list(NODES), "dist_init_addr": "10.0.0.1"}
    hv["ddtree_server"] = {**hv["ddtree_server"], "tp_size": 16, "multinode": mn, **(server or {})}
    for key, value in sections.items():
        hv[f"ddtree_{key}"] = {**hv.get(f"ddtree_{key}", {}), **value}
    return hv


def _both(server: dict | None = None, **sections):
    return [validate_hostvars(h, _hv(h, server, **sections)) for h in NODES]


def _errors(host: str, hv: dict) -> list:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars(host, hv)
    return [f for f in exc.value.findings if f.level == "error"]


def test_two_nodes_render_their_rank_and_rank_0s_store():
    v0, v1 = _both()
    a0, a1 = build_argv(v0.deployment, v0.plan), build_argv(v1.deployment, v1.plan)
    for argv, rank in ((a0, "0"), (a1, "1")):
        i = argv.index("--nnodes")
        assert argv[i:i + 8] == ["--nnodes", "2", "--node-rank", rank, "--dist-init-addr", "10.0.0.1:30200",
                                 "--dist-timeout", "3600"]
        assert argv[argv.index("--tp-size") + 1] == "16"
    # rank 0: health + warmup + exporter; rank 1: health only, no exporter, no exporter target
    assert [c[3] for c in ready_commands(v0)] == ["health", "warmup"]
    assert [c[3] for c in ready_commands(v1)] == ["health"]
    assert any(f.component == "exporter" for f in render_host(v0))
    assert not any(f.component == "exporter" for f in render_host(v1))
    jobs = {j["job_name"]: j for j in prometheus_document([v0, v1])["scrape_configs"]}
    assert [t["labels"]["host"] for t in jobs[EXPORTER_JOB]["static_configs"]] == ["b300-01"]
    # every node's SGLang /metrics (rank 1: the health-only server's) stays a target: up == 0 names a dead node
    assert [t["labels"]["host"] for t in jobs[SGLANG_JOB]["static_configs"]] == ["b300-01", "b300-02"]
    assert fleet_findings([v0, v1]) == []


def test_the_exporter_absent_rule_covers_the_exporters_prometheus_scrapes():
    """The kind: a per-host rule on a series no target of that host produces fires for as long as the
    server runs. Rank 1 runs no exporter, so ``absent(ddtree_up{host=rank 1})`` was always true; the
    rule's hosts are now the exporter job's hosts, for a fleet of one multi-node server and one
    ordinary server."""
    single = validate_hostvars("b300-09", base_hostvars())
    fleet = [*_both(), single]
    jobs = {j["job_name"]: j for j in prometheus_document(fleet)["scrape_configs"]}
    scraped = {t["labels"]["host"] for t in jobs[EXPORTER_JOB]["static_configs"]}
    [rule] = absent_rules(fleet)
    in_rule = set(re.findall(r'host="([^"]+)"', rule["expr"]))
    assert in_rule == scraped == {"b300-01", "b300-09"}


def test_ipv6_store_address_is_bracketed():
    hv = _hv("b300-01", {"multinode": {"nodes": list(NODES), "dist_init_addr": "fd00::1", "dist_init_port": 25000}})
    v = validate_hostvars("b300-01", hv)
    argv = build_argv(v.deployment, v.plan)
    assert argv[argv.index("--dist-init-addr") + 1] == "[fd00::1]:25000"


def test_gpus_are_accounted_per_machine():
    # tp 16 over 2 b300 nodes: 8 each, fits; alone it is refused with the multinode fix
    validate_hostvars("b300-01", _hv("b300-01"))
    single = copy.deepcopy(base_hostvars())
    single["ddtree_server"]["tp_size"] = 16
    (f,) = _errors("b300-01", single)
    assert f.field == "ddtree_server.tp_size" and "must fit the 8 GPUs of a b300 host" in f.rule
    assert "ddtree_server.multinode" in f.fix
    # 32 over 2 nodes is 16 per node: refused, per node
    (f,) = _errors("b300-01", _hv("b300-01", {"tp_size": 32}))
    assert f.field == "ddtree_server.tp_size" and "each of the 2 nodes runs tp_size / nnodes = 16" in f.rule
    # not divisible by the node count: SGLang's own assertion
    three = _hv("b300-01", {"tp_size": 15})
    rules = [f.rule for f in _errors("b300-01", three)]
    assert any("tp_size must be divisible by number of nodes" in r for r in rules), rules


def test_node_must_be_listed_and_dp_stays_on_one_machine():
    fields = {f.field for f in _errors("b300-03", _hv("b300-03"))}
    assert "ddtree_server.multinode.nodes" in fields
    (f,) = [f for f in _errors("b300-01", _hv("b300-01", {"dp_size": 2})) if f.field == "ddtree_server.dp_size"]
    assert "across nodes is not modelled" in f.rule


@pytest.mark.parametrize("nodes, needle", [
    (["b300-01"], "lists 1 node(s); one server spans at least 2"),
    (["b300-01", "b300-01"], "twice"),
    (["b300-01", "Bad_Name"], "Bad_Name"),
    ([f"b300-{i:02}" for i in range(1, 18)], "lists 17 node(s); one server spans at least 2 and at most 16")])
def test_bad_node_lists(nodes, needle):
    hv = _hv("b300-01", {"multinode": {"nodes": nodes, "dist_init_addr": "10.0.0.1"}})
    found = [f for f in _errors("b300-01", hv) if f.field == "ddtree_server.multinode.nodes"]
    assert len(found) == 1 and needle in found[0].message(), [f.message() for f in found]
    assert "List should have" not in found[0].message()


def test_store_port_clashes_on_the_node_and_on_rank_0s_machine():
    hv = _hv("b300-01", {"multinode": {"nodes": list(NODES), "dist_init_addr": "10.0.0.1", "dist_init_port": 30100}})
    (f,) = _errors("b300-01", hv)
    assert f.field == "ddtree_server.multinode.dist_init_port" and "ddtree_server.nccl_port" in f.rule
    # another instance on rank 0's machine holding the store port (its own SGLang port)
    v0, v1 = _both()
    other = copy.deepcopy(base_hostvars())
    other.update(ansible_host="10.0.0.1")
    other["ddtree_server"] = {**other["ddtree_server"], "tp_size": 4, "port": 30200, "nccl_port": 30300}
    other["ddtree_ops"] = {"exporter_port": 19500}
    other["ddtree_service"] = {"name": "other", "user": "other"}
    o = validate_hostvars("b300-01-b", other)
    found = [f for f in fleet_findings([v0, v1, o]) if "30200" in f.message()]
    assert found and "ddtree_server.multinode.dist_init_port" in found[0].message(), [f.message() for f in found]


def test_every_node_same_build_class_and_settings():
    v0 = validate_hostvars("b300-01", _hv("b300-01"))
    hv1 = _hv("b300-02")
    hv1["ddtree_sglang"] = {**hv1["ddtree_sglang"], "commit": "0" * 40}
    v1 = validate_hostvars("b300-02", hv1)
    (f,) = fleet_findings([v0, v1])
    assert f.field == "ddtree_sglang" and f.host == "b300-02" and "same pinned build" in f.rule
    hv1 = _hv("b300-02", {"max_running_requests": 8})
    (f,) = fleet_findings([v0, validate_hostvars("b300-02", hv1)])
    assert f.field == "ddtree_server"


def test_missing_node_wrong_store_address_and_shared_machine():
    v0, v1 = _both()
    (f,) = fleet_findings([v0])
    assert f.field == "ddtree_server.multinode.nodes" and f.value == "b300-02" and "not a valid host" in f.rule
    hv = {h: _hv(h, {"multinode": {"nodes": list(NODES), "dist_init_addr": "10.0.0.7"}}) for h in NODES}
    found = fleet_findings([validate_hostvars(h, x) for h, x in hv.items()])
    assert [f.field for f in found] == ["ddtree_server.multinode.dist_init_addr"] and "10.0.0.1" in found[0].fix
    hv = {h: _hv(h) for h in NODES}
    hv["b300-02"]["ansible_host"] = "10.0.0.1"
    found = fleet_findings([validate_hostvars(h, x) for h, x in hv.items()])
    assert any("each node is its own machine" in f.rule for f in found), [f.message() for f in found]


def _plain(host: str, address: str) -> dict:
    """An ordinary one-machine server (no multinode block) at ``address``."""
    hv = copy.deepcopy(base_hostvars())
    hv["ansible_host"] = address
    return hv


def _fleet(hvs: dict[str, dict], focus: set[str] | None = None) -> list:
    """fleet_findings of ``hvs`` in name order and in reverse: the same findings either way."""
    vs = [validate_hostvars(h, hv) for h, hv in sorted(hvs.items())]
    found = fleet_findings(vs, focus=focus)
    assert [f.message() for f in fleet_findings(vs[::-1], focus=focus)] == [f.message() for f in found]
    return found


def test_rank_0_listing_a_one_machine_server_is_refused_from_either_side():
    # b300-02 has no multinode block: rank 0 would render --nnodes 2 and wait for it forever
    hvs = {"b300-01": _hv("b300-01"), "b300-02": _plain("b300-02", "10.0.0.2")}
    for focus in (None, {"b300-01"}, {"b300-02"}):
        (f,) = _fleet(hvs, focus)
        assert f.field == "ddtree_server.multinode.nodes" and f.value == "b300-02", f.message()
        assert "ordinary one-machine server" in f.rule and "same ddtree_server.multinode" in f.fix
    assert _fleet(hvs, {"b300-09"}) == []  # a host of neither server in focus: nothing about them


def test_a_host_claimed_by_two_servers_is_refused():
    # b300-03 (rank 0 of its own server) lists b300-02, which is rank 1 of b300-01's server
    hvs = {h: _hv(h) for h in NODES}
    hvs["b300-03"] = _hv("b300-03", {"multinode": {"nodes": ["b300-03", "b300-02"], "dist_init_addr": "10.0.0.3"}})
    hvs["b300-03"]["ansible_host"] = "10.0.0.3"
    for focus in (None, {"b300-03"}, {"b300-02"}):
        (f,) = _fleet(hvs, focus)
        assert f.field == "ddtree_server.multinode.nodes" and f.value == "b300-02", f.message()
        assert "carries another ddtree_server.multinode" in f.rule and "nodes [b300-01, b300-02]" in f.rule
        assert "one server's nodes only" in f.fix
    assert _fleet(hvs, {"b300-01"}) == []  # b300-01's own server is consistent


def test_wrong_store_address_is_refused_when_the_last_node_is_not_multinode():
    three = {"nodes": [*NODES, "b300-03"], "dist_init_addr": "10.0.0.77"}
    hvs = {h: _hv(h, {"tp_size": 24, "multinode": three}) for h in NODES}
    hvs["b300-03"] = _plain("b300-03", "10.0.0.3")
    found = _fleet(hvs)
    assert sorted((f.field, f.value) for f in found) == [
        ("ddtree_server.multinode.dist_init_addr", "10.0.0.77"), ("ddtree_server.multinode.nodes", "b300-03")]
    (addr,) = [f for f in found if f.field.endswith("dist_init_addr")]
    assert "not rank 0's address (b300-01: 10.0.0.1)" in addr.rule and "10.0.0.1" in addr.fix


@pytest.mark.parametrize("focus", [None, {"b300-01"}, {"b300-02"}])
def test_wrong_store_address_is_refused_whichever_node_is_in_focus(focus):
    wrong = {"multinode": {"nodes": list(NODES), "dist_init_addr": "10.0.0.77"}}
    (f,) = _fleet({h: _hv(h, wrong) for h in NODES}, focus)
    assert f.field == "ddtree_server.multinode.dist_init_addr" and f.value == "10.0.0.77"
    assert f.host in (focus or {"b300-01"})


def test_validate_limit_to_rank_0_refuses_a_wrong_store_address(tmp_path, capsys):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    hosts = {h: {"ansible_host": a} for h, a in NODES.items()}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": hosts}}}}))
    gv = _hv("b300-01", {"multinode": {"nodes": list(NODES), "dist_init_addr": "10.0.0.77"}})
    gv.pop("ansible_host")
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(gv))
    assert main(["validate", "-i", str(inv), "-l", "b300-01"]) == 2
    assert "dist_init_addr" in capsys.readouterr().err


def test_dflash_pipeline_rule_applies_to_a_multinode_server():
    hv = _hv("b300-01", {"extra_args": {"--pp-size": 2}})
    text = " ".join(f.message() for f in _errors("b300-01", hv))
    assert "pipeline parallel size 1" in text, text


def test_dist_timeout_warns_below_the_start_window_and_is_not_an_extra_arg():
    hv = _hv("b300-01", {"multinode": {"nodes": list(NODES), "dist_init_addr": "10.0.0.1", "dist_timeout_s": 60}})
    v = validate_hostvars("b300-01", hv)
    assert any(w.field == "ddtree_server.multinode.dist_timeout_s" for w in v.warnings)
    (f,) = _errors("b300-01", _hv("b300-01", {"extra_args": {"--dist-timeout": 60}}))
    assert f.field == "ddtree_server.extra_args.--dist-timeout" and "dist_timeout_s" in f.fix
    single = copy.deepcopy(base_hostvars())  # on one machine --dist-timeout stays an ordinary extra arg
    single["ddtree_server"]["extra_args"] = {"--dist-timeout": 60}
    validate_hostvars("b300-01", single)


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr", "--nnodes=2"])
def test_multi_node_flags_in_extra_args_point_at_the_fields(flag):
    hv = copy.deepcopy(base_hostvars())
    hv["ddtree_server"] = {**hv["ddtree_server"], "extra_args": {flag: 2}}
    (f,) = _errors("h1", hv)
    assert f.field == "ddtree_server.extra_args" and flag in f.rule
    assert "ddtree_server.multinode.nodes" in f.fix and "router" not in f.fix


def test_router_fronts_rank_0_only():
    v0, v1 = _both()
    routers = {"gw": {"ansible_host": "10.0.0.50", "ddtree_router": {}}}
    (r,), found = validate_routers(routers, [v0, v1])
    assert found == [] and len(r.workers) == 1 and "10.0.0.1" in r.workers[0]
    routers = {"gw": {"ansible_host": "10.0.0.50", "ddtree_router": {"instances": ["b300-02"]}}}
    _, found = validate_routers(routers, [v0, v1])
    assert any("list b300-01 (rank 0)" in f.fix for f in found), [f.message() for f in found]


def test_only_rank_0_registers_itself_at_its_routers():
    from ddtree_ops.config.router import routers_for
    from ddtree_ops.render.router import render_join

    v0, v1 = _both()
    routers = {"gw": {"ansible_host": "10.0.0.50", "ddtree_router": {}}}
    (r0,), found0 = routers_for(routers, v0)
    none, found1 = routers_for(routers, v1)
    assert found0 == found1 == [] and none == [] and render_join(v1, [r0]) == []
    assert len(render_join(v0, [r0])) == 3 and r0.workers == (validate_routers(routers, [v0, v1])[0][0].workers)


@pytest.mark.parametrize("name", ["port", "health_port", "metrics_port"])
def test_router_on_rank_0s_machine_clashes_with_the_store_port(name):
    v0, v1 = _both()  # the store: rank 0's port + 200 = 30200 on 10.0.0.1
    routers = {"gw": {"ansible_host": "10.0.0.1", "ddtree_router": {name: 30200}}}
    _, found = validate_routers(routers, [v0, v1])
    assert any(f.field == f"ddtree_router.{name}" and "ddtree_server.multinode.dist_init_port" in f.rule
               for f in found), [f.message() for f in found]
    routers = {"gw": {"ansible_host": "10.0.0.2", "ddtree_router": {name: 30200}}}  # rank 1 holds no store
    _, found = validate_routers(routers, [v0, v1])
    assert not any("dist_init_port" in f.rule for f in found), [f.message() for f in found]


def test_validate_accepts_a_two_node_inventory(tmp_path, capsys):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    hosts = {h: {"ansible_host": a} for h, a in NODES.items()}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": hosts}}}}))
    gv = _hv("b300-01")
    gv.pop("ansible_host")
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(gv))
    assert main(["validate", "-i", str(inv)]) == 0, capsys.readouterr()
    (inv / "hosts.yml").write_text(yaml.safe_dump(
        {"sglang_servers": {"children": {"b300": {"hosts": {"b300-01": hosts["b300-01"]}}}}}))
    assert main(["validate", "-i", str(inv)]) == 2
    assert "node b300-02 of b300-01's server is not a valid host" in " ".join(capsys.readouterr().err.split())


# ---- the simulator ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sim(tmp: Path, rank: int, port: int, store: int, timeout: int = 30) -> subprocess.Popen:
    argv = [sys.executable, "-m", "ddtree_ops.sim", "--model-path", "m", "--tp-size", "2", "--nnodes", "2",
            "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{store}", "--dist-timeout", str(timeout),
            "--port", str(port), "--nccl-port", str(_free_port()), "--enable-metrics"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SGLANG_SIM_LOAD_SECONDS": "0.2",
           "SGLANG_SIM_WARMUP_SECONDS": "0.1"}
    log = open(tmp / f"rank{rank}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def _status(port: int, path: str = "/health") -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _until(pred, deadline_s: float = 20.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_sim_rank_0_waits_for_the_other_node_and_dies_with_it(tmp_path):
    p0, p1, store = _free_port(), _free_port(), _free_port()
    r0 = _sim(tmp_path, 0, p0, store)
    procs = [r0]
    try:
        time.sleep(2.0)
        assert r0.poll() is None and _status(p0) is None  # waiting at the store: port closed, not ready
        r1 = _sim(tmp_path, 1, p1, store)
        procs.append(r1)
        assert _until(lambda: _status(p0) == 200), (tmp_path / "rank0.log").read_text()
        assert _until(lambda: _status(p1) == 200)
        assert _status(p1, "/server_info") == 404 and _status(p1, "/metrics") == 200  # health-only server
        from ddtree_ops.config.plandoc_model import load_plan
        from ddtree_ops.render.files import plan_json
        from ddtree_ops.runtime.health import HealthOptions, check_health

        v0, v1 = _both()
        for v in (v0, v1):
            (tmp_path / f"{v.deployment.host}.json").write_text(plan_json(v))
        doc1 = load_plan(str(tmp_path / "b300-01.json")), load_plan(str(tmp_path / "b300-02.json"))
        checks = check_health(f"http://127.0.0.1:{p1}", options=HealthOptions(failures=1, plan_doc=doc1[1]))
        assert [(c.name, c.ok) for c in checks] == [("reachable", True), ("ready", True), ("node", True)], checks
        r1.terminate()
        assert r0.wait(timeout=20) == 1
        log = (tmp_path / "rank0.log").read_text()
        assert "ncclRemoteError" in log and "node rank 1" in log
        checks = check_health(f"http://127.0.0.1:{p0}", options=HealthOptions(failures=1, plan_doc=doc1[0]))
        assert not checks[-1].ok and "b300-02 (rank 1)" in checks[-1].detail, checks
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_sim_rank_0_gives_up_after_dist_timeout_naming_the_missing_node(tmp_path):
    r0 = _sim(tmp_path, 0, _free_port(), _free_port(), timeout=2)
    assert r0.wait(timeout=30) == 1
    log = (tmp_path / "rank0.log").read_text()
    # the real line (SGLang 0.5.17, --dist-timeout 60, tests/fixtures/gpu/multinode-sglang-0.5.17-h200-2026-12-02)
    real = (REPO / "tests/fixtures/gpu/multinode-sglang-0.5.17-h200-2026-12-02/A_rank0_alone.log").read_text()
    line = re.compile(r"torch\.distributed\.DistStoreError: Timed out after (\d+) seconds waiting for clients\. "
                      r"1/2 clients joined\.")
    assert [int(x) for x in line.findall(real)] == [61]
    assert [int(x) for x in line.findall(log)] == [3], log
    assert "node ranks 1 never joined rank 0" in log


def test_preflight_checks_rank_0s_store_port_and_health_skips_server_info_on_rank_1(tmp_path):
    import json as _json

    from ddtree_ops.config.plandoc_model import load_plan
    from ddtree_ops.host.preflight import expect_from
    from ddtree_ops.render.files import plan_json

    v0, v1 = _both()
    e0 = expect_from(None, _json.loads(plan_json(v0)))
    e1 = expect_from(None, _json.loads(plan_json(v1)))
    assert (30200, "ddtree-sglang.service", None, "ddtree_server.multinode.dist_init_port") in e0.ports
    assert not any(p[3] == "ddtree_server.multinode.dist_init_port" for p in e1.ports)
    path = tmp_path / "plan.json"
    path.write_text(plan_json(v1))
    doc = load_plan(str(path))
    assert (doc.node_rank, doc.nnodes, doc.dist_init_port) == (1, 2, None)


def _wide(host: str, n: int, tp: int) -> dict:
    """Node ``host`` of an ``n``-node server b300-01..b300-NN (8 GPUs each) of total ``tp_size`` ``tp``."""
    nodes = [f"b300-{i:02}" for i in range(1, n + 1)]
    hv = _hv(host, {"tp_size": tp, "multinode": {"nodes": nodes, "dist_init_addr": "10.0.0.1"}})
    hv["ansible_host"] = f"10.0.0.{nodes.index(host) + 1}"
    return hv


@pytest.mark.parametrize("n, host", [(16, "b300-01"), (16, "b300-16"), (12, "b300-07")])
def test_tp_size_over_the_most_nodes_of_full_hosts_is_accepted(n, host, tmp_path):
    """tp_size is bounded by the node limit times a host's GPUs, not by one machine's GPUs: 16 nodes x 8
    GPUs = 128 validates on every node, and its plan.json reads back (health and the exporter load it)."""
    import json

    from ddtree_ops.config.hosts import MAX_GPUS
    from ddtree_ops.config.plandoc_model import load_plan
    from ddtree_ops.config.service_models import MAX_NODES, MAX_TP_SIZE
    from ddtree_ops.render.files import plan_document

    assert MAX_TP_SIZE == MAX_NODES * MAX_GPUS
    v = validate_hostvars(host, _wide(host, n, 8 * n))
    assert v.deployment.server.tp_size == 8 * n
    argv = build_argv(v.deployment, v.plan)
    assert argv[argv.index("--tp-size") + 1] == str(8 * n)
    (tmp_path / "plan.json").write_text(json.dumps(plan_document(v)))
    assert load_plan(tmp_path / "plan.json").deployment.server.tp_size == 8 * n


@pytest.mark.parametrize("tp", [128, 16])
def test_a_one_machine_server_still_fits_its_hosts_gpus(tp):
    """The bound over the nodes does not loosen one machine: tp_size above its class's GPUs is refused by
    the host-class rule, naming the GPUs and the multi-node fix."""
    single = copy.deepcopy(base_hostvars())
    single["ddtree_server"]["tp_size"] = tp
    (f,) = _errors("b300-01", single)
    assert f.field == "ddtree_server.tp_size" and "must fit the 8 GPUs of a b300 host" in f.rule, f.message()


@pytest.mark.parametrize("over", [1, 64])
def test_tp_size_above_the_bound_is_refused(over):
    from ddtree_ops.config.service_models import MAX_TP_SIZE

    hv = _wide("b300-01", 16, MAX_TP_SIZE + over)
    found = [f for f in _errors("b300-01", hv) if f.field == "ddtree_server.tp_size"]
    assert found and str(MAX_TP_SIZE) in found[0].message(), [f.message() for f in found]
