"""Argv dialects, systemd escaping, rendered files and the CLI's exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from helpers import REPO
from hypothesis import given
from hypothesis import strategies as st

from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.render import build_argv, render_host, render_prometheus, systemd_quote
from ddtree_ops.render.files import env_value


def argv_of(hostvars: dict) -> list[str]:
    v = validate_hostvars("h1", hostvars)
    return build_argv(v.deployment, v.plan)


def flag(argv: list[str], name: str) -> list[str]:
    i = argv.index(name)
    out = []
    for a in argv[i + 1:]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def test_ddtree_argv(hostvars):
    argv = argv_of(hostvars)
    # the release's own SGLang build (content-keyed), not the shared sglang-venv symlink
    assert re.fullmatch(r"/opt/ddtree-ops/sglang-venv\.builds/cp[0-9]+-[0-9a-f]{16}-[0-9a-f]{12}/bin/python", argv[0])
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert flag(argv, "--speculative-algorithm") == ["DDTREE"]
    assert flag(argv, "--speculative-num-draft-tokens") == ["8"]
    assert flag(argv, "--speculative-ddtree-budget") == ["32"]
    assert flag(argv, "--cuda-graph-max-bs-decode") == ["16"]
    assert flag(argv, "--cuda-graph-bs-decode") == "1 2 3 4 5 6 7 8 10 12 14 16".split()
    assert "--enable-metrics" in argv and "--disable-overlap-schedule" in argv
    assert "--cuda-graph-max-bs" not in argv


@pytest.mark.parametrize("version,max_flag,bs_flag", [
    ("0.5.13.post1", "--cuda-graph-max-bs", "--cuda-graph-bs"),
    ("0.5.16", "--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode"),
    ("0.5.23", "--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode"),
])
def test_graph_flag_dialects(hostvars, version, max_flag, bs_flag):
    hostvars["ddtree_sglang"] = {"version": version}
    hostvars["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "z/d", "block_size": 16}
    argv = argv_of(hostvars)
    assert flag(argv, max_flag) == ["16"] and bs_flag in argv
    other = {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"} - {max_flag}
    assert not other & set(argv)


def test_ddtree_source_picks_base_dialect(hostvars):
    hostvars["ddtree_sglang"] = {"ddtree_source": "sglang-pr-27509"}
    hostvars["ddtree_server"]["cuda_graph"] = False
    argv = argv_of(hostvars)
    assert "--disable-cuda-graph" in argv and not any(a.startswith("--cuda-graph") for a in argv)


def test_eagle_argv(hostvars):
    hostvars.update(ddtree_speculative={"algorithm": "EAGLE", "draft_model_path": "d/e", "num_steps": 3, "topk": 1},
                    ddtree_sglang={"version": "0.5.23"}, ddtree_accepted_risks=[])
    argv = argv_of(hostvars)
    assert flag(argv, "--speculative-num-draft-tokens") == ["4"] and flag(argv, "--speculative-eagle-topk") == ["1"]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1))
def test_systemd_quote_keeps_one_word(arg):
    q = systemd_quote(arg)
    assert "\n" not in q
    if q.startswith('"'):
        body = q[1:-1]
        # every %, $, \ and " is escaped: unescaping gives the argument back
        out, i = [], 0
        while i < len(body):
            c = body[i]
            if c in "%$" :
                assert body[i + 1] == c
                out.append(c)
                i += 2
            elif c == "\\":
                out.append(body[i + 1])
                i += 2
            else:
                assert c != '"'
                out.append(c)
                i += 1
        assert "".join(out) == arg
    else:
        assert q == arg and not set(arg) & set(' "\\%$;')


@pytest.mark.parametrize("bad", ["a\nb", "x\x00", "tab\there"])
def test_control_characters_refused(bad):
    with pytest.raises(ValueError):
        systemd_quote(bad)
    with pytest.raises(ValueError):
        env_value(bad)


def test_rendered_files(hostvars):
    hostvars["ddtree_hf_token"] = "hf_secret_token_value"
    v = validate_hostvars("h1", hostvars)
    files = {f.path: f for f in render_host(v)}
    unit = files["/etc/systemd/system/ddtree-sglang.service"].content
    assert "--speculative-ddtree-budget 32" in unit and "hf_secret" not in unit
    directives = [line.split("=")[0] for line in unit.splitlines() if "=" in line and not line.startswith("#")]
    assert "ProtectSystem" in directives and "PrivateDevices" not in directives
    assert "MemoryDenyWriteExecute" not in directives
    assert "StartLimitBurst=3" in unit and "TimeoutStartSec=4260" in unit and "LimitMEMLOCK=infinity" in unit
    env = files["/etc/ddtree-ops/sglang/sglang.env"].content
    assert "DDTREE_OPS_VERIFY_TOKENS_PER_REQ=33" in env and "hf_secret" not in env
    secret = files["/etc/ddtree-ops/sglang/secrets.env"]
    assert secret.secret and secret.mode == "0600" and "HF_TOKEN=hf_secret_token_value" in secret.content
    plan = json.loads(files["/etc/ddtree-ops/sglang/plan.json"].content)
    assert plan["plan"]["verify_tokens_per_req"] == 33 and "hf_token" not in plan["deployment"]


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed (make setup installs it)")
def test_prometheus_config_passes_promtool(hostvars, tmp_path):
    v = validate_hostvars("h1", hostvars)
    p = tmp_path / "prometheus.yml"
    p.write_text(render_prometheus([v]))
    r = subprocess.run(["promtool", "check", "config", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(p.read_text())
    assert [c["static_configs"][0]["labels"]["host_class"] for c in doc["scrape_configs"]] == ["b300", "b300"]


def test_cli_plan_json(capsys):
    assert main(["plan", "-i", str(REPO / "inventory/example"), "-l", "b300", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    p = doc["hosts"]["b300-01"]
    assert (p["draft_tokens_per_req"], p["verify_tokens_per_req"]) == (8, 33)
    assert doc["checks"] == [{"name": "config:b300-01", "ok": True, "detail": "valid"}]


def test_cli_plan_table(capsys):
    assert main(["plan", "-i", str(REPO / "inventory/example"), "-l", "b300"]) == 0
    out = capsys.readouterr().out
    assert "verify_tokens_per_req" in out and "33" in out


def _bad_inventory(tmp_path, **server):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory/example", inv)
    gv = inv / "group_vars/b300.yml"
    import yaml

    data = yaml.safe_load(gv.read_text())
    data["ddtree_server"].update(server)
    gv.write_text(yaml.safe_dump(data))
    return inv


def test_cli_bad_input_exit_2_and_nothing_written(tmp_path, capsys):
    inv = _bad_inventory(tmp_path, tp_size=16)
    out = tmp_path / "out"
    assert main(["render", "--out", str(out), "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "ddtree_server.tp_size = 16" in err and "Fix:" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["validate", "-i", str(inv), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and {c["name"] for c in doc["checks"]} == {"config:b300-01", "config:ct200-01"}


def test_cli_usage_errors_exit_2(capsys, tmp_path):
    assert main(["plan", "-i", str(tmp_path / "missing")]) == 2
    assert "inventory not found" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2
    assert main(["plan", "-i", str(REPO / "inventory/example"), "-l", "nohost"]) == 2


def test_cli_render_writes_tree(tmp_path):
    assert main(["render", "--out", str(tmp_path), "-i", str(REPO / "inventory/example")]) == 0
    assert (tmp_path / "b300-01/etc/systemd/system/ddtree-sglang.service").is_file()
    assert (tmp_path / "prometheus/prometheus.yml").is_file()


@pytest.mark.parametrize("out", ["", "  "])
def test_cli_render_empty_out_refused_not_the_cwd(out, tmp_path, monkeypatch, capsys):
    """--out '' used to become Path('') == '.', writing the tree into the current directory."""
    monkeypatch.chdir(tmp_path)
    assert main(["render", "--out", out, "-i", str(REPO / "inventory/example")]) == 2
    assert "--out must name a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_console_script_no_traceback():
    r = subprocess.run([str(REPO / ".venv/bin/ddtree-ops"), "health", "http://127.0.0.1:9", "--timeout", "1", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    check = json.loads(r.stdout)["checks"][0]
    assert check["name"] == "reachable" and check["ok"] is False
    assert check["detail"].startswith("http://127.0.0.1:9/health: ConnectError (loading weights or down)")


def test_cli_markup_and_jinja_in_input_are_plain_errors(tmp_path, capsys):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory/test", inv)
    gv = inv / "group_vars/testhosts.yml"
    gv.write_text(gv.read_text().replace("path: /srv/models/kimi-k2.6-sim", 'path: "abc[/]"'))
    assert main(["validate", "-i", str(inv)]) == 2
    assert "ddtree_model.path = 'abc[/]'" in capsys.readouterr().err
    gv.write_text(gv.read_text().replace('path: "abc[/]"', 'path: "{{ undefined_var }}"'))
    assert main(["validate", "-i", str(inv), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "undefined_var" in doc["checks"][0]["detail"]


@pytest.mark.parametrize("args", [
    ["warmup", "not-a-url"],
    ["warmup", "http://127.0.0.1:1", "--batch-sizes", ","],
    ["warmup", "http://127.0.0.1:1", "--batch-sizes", "0"],
    ["warmup", "http://127.0.0.1:1", "--deadline", "0"],
    ["health", "ftp://x"],
    ["health", "http://127.0.0.1:1", "--timeout", "nan"],
])
def test_cli_bad_ops_arguments_exit_2(args, capsys):
    assert main([*args, "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["checks"][0]["name"] == "usage"


def _scrape_targets(v) -> dict[str, list[str]]:
    from ddtree_ops.render.files import prometheus_document

    return {c["job_name"]: [t for s in c["static_configs"] for t in s["targets"]]
            for c in prometheus_document([v])["scrape_configs"]}


@pytest.mark.parametrize(("server_host", "scrape_host", "sglang", "exporter"), [
    ("0.0.0.0", None, ["10.0.0.5:30000"], ["10.0.0.5:19400"]),
    ("10.0.1.5", None, ["10.0.1.5:30000"], ["10.0.0.5:19400"]),  # a second NIC: SGLang answers only there
    ("fd00::5", None, ["[fd00::5]:30000"], ["10.0.0.5:19400"]),
    ("127.0.0.1", None, [], ["10.0.0.5:19400"]),  # loopback, Prometheus elsewhere: cannot be scraped
    ("::1", None, [], ["10.0.0.5:19400"]),
    ("127.0.0.1", "127.0.0.1", ["127.0.0.1:30000"], ["127.0.0.1:19400"]),  # Prometheus on the machine itself
])
def test_the_sglang_scrape_target_is_where_sglang_listens(hostvars, server_host, scrape_host, sglang, exporter):
    """ddtree_server.host: 127.0.0.1 validated, but the sglang job scraped ansible_host:port, which nothing
    answers: DDTreeSGLangDown (critical) fired forever."""
    hostvars["ansible_host"] = "10.0.0.5"
    hostvars["ddtree_server"] = {**hostvars.get("ddtree_server", {}), "host": server_host}
    if scrape_host:
        hostvars["ddtree_ops"] = {**hostvars.get("ddtree_ops", {}), "scrape_host": scrape_host}
    v = validate_hostvars("h1", hostvars)
    assert _scrape_targets(v) == {"sglang": sglang, "ddtree_exporter": exporter}
    said = [w for w in v.warnings if w.field == "ddtree_server.host"]
    assert bool(said) is (not sglang)
    if said:
        assert "cannot scrape its /metrics" in said[0].message() and "scrape_host: 127.0.0.1" in said[0].message()


def test_cli_plan_table_says_why_a_checkpoint_was_not_read_and_shows_each_row_once(capsys, monkeypatch):
    """'model checkpoint │ not read: None' (validate gave the reason) and block_size printed twice."""
    monkeypatch.delenv("DDTREE_HUB", raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["plan", "-i", str(REPO / "inventory/example"), "-l", "b300"]) == 0
    out = capsys.readouterr().out
    assert "not read: None" not in out
    assert re.search(r"model checkpoint\s*│\s*not read: offline \(pass --hub", out), out
    assert re.search(r"draft checkpoint\s*│\s*not read: offline", out)
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") >= 2]
    named = [r for r in rows if r]
    assert named.count("block_size") == 1 and named.count("budget") == 1
    assert re.search(r"block_size\s*│\s*8 \(from inventory\)", out)


def test_cli_plan_table_checkpoint_rows_with_a_local_draft(tmp_path, capsys, monkeypatch):
    """A draft read from disk decides block_size: one row, with its source."""
    from ddtree_ops.cli.inventory import _checkpoint_rows

    ck = {"derived": {"ddtree_speculative.block_size": {"value": 16, "source": "draft config.json (local)"}},
          "checkpoints": {"model": {"read": None}, "draft": {"read": "local", "ref": "/m"}}}
    rows = dict(_checkpoint_rows(ck, {"ddtree_model.path": "checkpoint config not read: the path is not on this "
                                      "controller (x); rules y not checked"}))
    assert rows["block_size"] == "16 (from draft config.json (local))"
    assert rows["model checkpoint"].startswith("not read: the path is not on this controller")
    assert rows["draft checkpoint"] == "read (local)"
    assert dict(_checkpoint_rows(ck))["model checkpoint"] == "not read: see ddtree-ops validate"
