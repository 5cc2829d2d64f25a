"""Hosts with the same deployment share one validation (``config/shared.py``): the
output is byte for byte the output of validating every host alone, on mixed inventories; the text
output of ``validate`` gives one line per finding many hosts share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from ddtree_ops.cli import main
from ddtree_ops.config import checkpoint as checkpoint_mod
from ddtree_ops.config import shared
from ddtree_ops.config.errors import Finding


def _mixed_inventory(tmp_path: Path, n: int = 40, errors: bool = True) -> Path:
    """inventory/example's group_vars and ``n`` hosts of both classes, most alike, with the cases
    that must not share a result: host_vars that change the deployment (port and graphs, budget, a
    local model path, an HF token), no ``ansible_host``, an IP address, an IPv6 address, an IPv4 host
    name; with ``errors``, also an address that does not
    validate, a host name that does not, a host_vars error and two hosts on one machine (a fleet
    clash)."""
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example" / "group_vars", inv / "group_vars")
    hv_dir = inv / "host_vars"
    hv_dir.mkdir()
    hosts: dict[str, dict[str, dict]] = {"b300": {}, "ct200": {}}
    for i in range(1, n + 1):
        cls = "b300" if i % 2 else "ct200"
        hosts[cls][f"{cls}-{i:02d}"] = {"ansible_host": f"{cls}-{i:02d}.example.internal"}
    hosts["b300"]["b300-03"] = {}  # no ansible_host
    hosts["b300"]["b300-05"] = {"ansible_host": "10.0.0.5"}
    hosts["ct200"]["ct200-06"] = {"ansible_host": "fd00::6"}
    hosts["b300"]["10.1.2.3"] = {"ansible_host": "10.1.2.3"}
    (hv_dir / "b300-07.yml").write_text("ddtree_server:\n  port: 31000\n  tp_size: 8\n  cuda_graph: false\n")
    (hv_dir / "ct200-08.yml").write_text(yaml.safe_dump({"ddtree_hf_token": "hf_" + "A1b2C3d4" * 4}))
    (hv_dir / "b300-09.yml").write_text(
        yaml.safe_dump({"ddtree_model": {"path": "/models/not-here", "revision": "a" * 40}}))
    (hv_dir / "b300-11.yml").write_text(
        "ddtree_speculative:\n  algorithm: DDTREE\n  draft_model_path: z-lab/Kimi-K2.6-DFlash\n"
        "  block_size: 8\n  budget: 16\n")
    if errors:
        hosts["b300"]["b300-13"] = {"ansible_host": "bad host!"}
        hosts["ct200"]["Bad_Name"] = {"ansible_host": "10.0.0.99"}
        hosts["ct200"]["ct200-14"] = {"ansible_host": "ct200-12.example.internal"}  # one machine with ct200-12
        (hv_dir / "b300-15.yml").write_text("ddtree_server:\n  tp_size: 3\n")
    lines = ["sglang_servers:", "  children:"]
    for cls, members in hosts.items():
        lines += [f"    {cls}:", "      hosts:"]
        for h, v in members.items():
            lines.append(f"        {h}:" + ("" if v else " {}"))
            lines += [f"          {k}: {json.dumps(x)}" for k, x in v.items()]
    (inv / "hosts.yml").write_text("\n".join(lines) + "\n")
    return inv


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("errors", [False, True])
@pytest.mark.parametrize("argv", [["validate", "--json"], ["plan", "--json"], ["validate"],
                                  ["validate", "--json", "-l", "b300"]])
def test_sharing_gives_byte_identical_output(tmp_path, capsys, monkeypatch, argv, errors):
    inv = str(_mixed_inventory(tmp_path, errors=errors))
    calls: list[str] = []
    alone = checkpoint_mod.validate_with_checkpoints

    def counted(host, hv, reader):
        calls.append(host)
        return alone(host, hv, reader)

    monkeypatch.setattr(checkpoint_mod, "validate_with_checkpoints", counted)
    with_sharing = _run(capsys, [argv[0], "-i", inv, *argv[1:]])
    shared_calls = len(calls)
    monkeypatch.setattr(shared, "SHARE", False)
    calls.clear()
    without = _run(capsys, [argv[0], "-i", inv, *argv[1:]])
    assert with_sharing == without
    assert with_sharing[0] == (2 if errors else 0)
    # the check is not vacuous: most hosts were given a shared result, every host validated alone without
    assert len(calls) > 2 * shared_calls, (shared_calls, len(calls))
    if errors and argv[0] == "validate" and "--json" in argv and "-l" not in argv:
        doc = json.loads(with_sharing[1])
        fields = {(e["host"], e["field"]) for e in doc["errors"]}
        assert ("b300-13", "ansible_host") in fields and ("ct200-14", "ansible_host") not in fields
        assert ("", "inventory_hostname") in fields and any(e["host"] == "ct200-14" for e in doc["errors"])


def test_sharing_renders_the_same_files(tmp_path, capsys, monkeypatch):
    inv = str(_mixed_inventory(tmp_path, errors=False))
    assert main(["render", "-i", inv, "--out", str(tmp_path / "a")]) == 0
    monkeypatch.setattr(shared, "SHARE", False)
    assert main(["render", "-i", inv, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b and len(files_a) > 20
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_shared_results_equal_each_host_alone_field_for_field(tmp_path):
    from ddtree_ops.config.checkpoint import CheckpointReader, validate_with_checkpoints
    from ddtree_ops.config.inventory import load_hostvars

    hostvars = load_hostvars(str(_mixed_inventory(tmp_path, errors=False)))
    ok, errors = shared.validate_hosts(hostvars, CheckpointReader(hub=False))
    assert not errors and len(ok) == len(hostvars)
    for v in ok:
        alone = validate_with_checkpoints(v.deployment.host, hostvars[v.deployment.host], CheckpointReader(hub=False))
        assert v.deployment == alone.deployment
        assert v.deployment.model_fields_set == alone.deployment.model_fields_set
        assert v.deployment.address == alone.deployment.address and v.deployment.host == alone.deployment.host
        assert v.plan == alone.plan
        assert [(f.as_dict(), f.message()) for f in v.warnings] == [(f.as_dict(), f.message()) for f in alone.warnings]


def test_share_key_tells_types_vaulting_and_addresses_apart():
    base = {"ddtree_host_class": "b300", "ddtree_server": {"port": 30000, "x": 1.0}, "ansible_host": "a.example"}
    key = shared.share_key(base)
    assert key == shared.share_key({**base, "ansible_host": "b.example"})  # the address is not in it
    assert key != shared.share_key({**base, "ansible_host": None})  # whether it is set is
    assert key != shared.share_key({**base, "ddtree_server": {"port": "30000", "x": 1.0}})
    assert key != shared.share_key({**base, "ddtree_server": {"port": 30000, "x": 1}})
    assert key != shared.share_key({**base, "ddtree_server": {"port": 30000, "x": True}})
    assert shared.share_key({"a": -0.0}) != shared.share_key({"a": 0.0})
    assert shared.share_key({"a": [1, 2]}) != shared.share_key({"a": [2, 1]})
    assert shared.share_key({"a": object()}) is None  # not compared: the host is validated alone


def test_share_key_tells_a_vaulted_string_from_a_plain_one(tmp_path):
    from test_trust_inventory import _vaulted

    from ddtree_ops.config.errors import _is_vaulted

    _, enc = _vaulted(tmp_path, "CANARY-vaulted-token-1234")
    assert _is_vaulted(enc)
    plain = {"ddtree_hf_token": "CANARY-vaulted-token-1234"}
    assert shared.share_key({"ddtree_hf_token": enc}) != shared.share_key(plain)


def _f(host: str, field: str = "ddtree_x", level: str = "warning") -> Finding:
    return Finding(level, field, None, "a rule", "a fix", host=host)


def test_collapsed_lines_one_line_per_shared_finding():
    hosts = [f"h{i}" for i in range(1, 8)]
    findings = [f for h in hosts for f in (_f(h), _f(h, "ddtree_y"))] + [_f("h9", "ddtree_z"), _f("", "--inventory")]
    lines = shared.collapsed_lines(findings)
    assert lines == [
        "7 hosts (h1, h2, h3, h4, h5 and 2 more; --json lists each): ddtree_x = None: a rule. Fix: a fix",
        "7 hosts (h1, h2, h3, h4, h5 and 2 more; --json lists each): ddtree_y = None: a rule. Fix: a fix",
        "h9: ddtree_z = None: a rule. Fix: a fix",
        "--inventory = None: a rule. Fix: a fix",
    ]
    assert shared.collapsed_lines([_f("h1"), _f("h2")])[0].startswith("2 hosts (h1, h2; --json lists each): ")
    assert shared.collapsed_lines([_f("h1")]) == [_f("h1").message()]  # one host: its own line, as before


def test_validate_text_collapses_and_json_keeps_each_host(tmp_path, capsys):
    inv = str(_mixed_inventory(tmp_path, errors=False))
    rc, out, _ = _run(capsys, ["validate", "-i", inv])
    assert rc == 0
    info = [ln for ln in out.splitlines() if ln.startswith("info ")]
    assert [ln for ln in info if " hosts (" not in ln] == [  # the one host whose model is a local path
        next(ln for ln in info if ln.startswith("info b300-09: ddtree_model.path = '/models/not-here'"))]
    assert len(info) == 3  # draft not read (all 41), target not read (40), target not on the controller (b300-09)
    rc, js, _ = _run(capsys, ["validate", "-i", inv, "--json"])
    doc = json.loads(js)
    n_ok = sum(1 for c in doc["checks"] if c["ok"])
    assert len({i["host"] for i in doc["info"]}) == n_ok and len(doc["info"]) >= 2 * n_ok - 2


def test_for_host_keeps_the_value_and_builds_the_message_anew():
    f = Finding("warning", "ddtree_x", {"a": [1, 2]}, "a rule", "a fix", host="h1")
    assert f.message().startswith("h1: ")
    g = f.for_host("h2")
    assert g.value is f.value and g.host == "h2" and g.message().startswith("h2: ") and f.message().startswith("h1: ")
    assert g.as_dict() == {**f.as_dict(), "host": "h2"}


def test_a_kept_shown_value_is_built_again_once_a_secret_is_registered(monkeypatch):
    from ddtree_ops._core import scrub as core_scrub
    from ddtree_ops.config import errors

    monkeypatch.setattr(core_scrub, "_known_secrets", set())
    f = Finding("warning", "ddtree_model.path", "/models/CANARY-later-secret", "a rule", "a fix", host="h1")
    g = f.for_host("h2")
    assert "CANARY" in f.message() and "CANARY" in g.message()
    errors.register_secret("CANARY-later-secret")
    assert "CANARY" not in f.message() and "CANARY" not in g.message()
    assert "CANARY" not in f.for_host("h3").message()
    assert "CANARY" not in shared.collapsed_lines([f, g])[0]
