"""``--json`` is strict JSON: ``validate --json`` / ``plan --json`` over inventories holding YAML
``.nan`` / ``.inf`` anywhere in a deployment variable print a document every strict parser reads
(no ``NaN`` / ``Infinity``), refusing the value in one finding that names the field; and no
``json.dumps`` / ``json.dump`` in the product may write a non-finite number.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_hostvars

from ddtree_ops.cli import main


def strict_loads(text: str):
    """``json.loads`` that refuses NaN, Infinity and -Infinity (as jq, Go and JSON.parse do)."""
    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def _inventory(tmp: Path, extra_yaml: str, drop: tuple[str, ...] = ()) -> Path:
    inv = tmp / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"b300-01": {}}}}}})
    )
    hv = {k: v for k, v in base_hostvars().items() if k not in drop}
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(hv) + extra_yaml)
    return inv


# (extra host_vars YAML, the field the one finding must name); YAML's spellings of NaN and infinity
CORPUS = {
    "fraction nan": ("ddtree_server: {tp_size: 8, max_running_requests: 16, attention_backend: triton, page_size: 1, "
                     "mem_fraction_static: .nan}\n", "ddtree_server.mem_fraction_static", ("ddtree_server",)),
    "fraction inf": ("ddtree_server: {tp_size: 8, max_running_requests: 16, attention_backend: triton, page_size: 1, "
                     "mem_fraction_static: .inf}\n", "ddtree_server.mem_fraction_static", ("ddtree_server",)),
    "seconds +inf": ("ddtree_ops: {health_timeout_s: +.Inf}\n", "ddtree_ops.health_timeout_s", ()),
    "floor -inf": ("ddtree_ops: {accept_length_floor: -.INF}\n", "ddtree_ops.accept_length_floor", ()),
    "floor NaN spelled .NaN": ("ddtree_ops: {accept_length_floor: .NaN}\n", "ddtree_ops.accept_length_floor", ()),
    "int field nan": ("ddtree_speculative: {algorithm: DDTREE, draft_model_path: z-lab/Kimi-K2.6-DFlash, "
                      "block_size: .nan, budget: 32}\n", "ddtree_speculative.block_size", ("ddtree_speculative",)),
    "nested in a list": ("ddtree_accepted_risks: [{rule: sm103-ddtree-graph-capture, reason: .inf}]\n",
                         "ddtree_accepted_risks[0].reason", ("ddtree_accepted_risks",)),
    "env value inf": ("ddtree_service: {env: {SOME_KNOB: .inf}}\n", "ddtree_service.env.SOME_KNOB", ()),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_json_of_non_finite_inputs_is_strict_and_names_the_field(tmp_path, capsys, name, command):
    extra, field, drop = CORPUS[name]
    inv = _inventory(tmp_path, extra, drop)
    rc = main([command, "-i", str(inv), "--json"])
    out = capsys.readouterr().out
    doc = strict_loads(out)  # the reproducer: NaN / Infinity in the output would raise here
    assert rc == 2 and doc["ok"] is False
    assert [e["field"] for e in doc["errors"]] == [field], doc["errors"]
    assert "not a finite number" in doc["errors"][0]["rule"]


def test_plain_output_is_one_line_naming_the_field(tmp_path, capsys):
    inv = _inventory(tmp_path, "ddtree_ops: {health_timeout_s: .inf}\n")
    assert main(["validate", "-i", str(inv)]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
    assert len(lines) == 1 and "ddtree_ops.health_timeout_s = 'inf': not a finite number" in lines[0]


@pytest.mark.parametrize("inventory", ["inventory/example", "inventory/dflash-example", "inventory/test"])
def test_shipped_inventories_give_strict_json(capsys, inventory):
    for command in ("validate", "plan"):
        main([command, "-i", str(REPO / inventory), "--json"])
        strict_loads(capsys.readouterr().out)


def test_every_json_writer_of_the_product_refuses_non_finite_numbers():
    """The kind: a json.dumps/json.dump without ``allow_nan=False`` anywhere in the product (not the
    simulator) could print NaN again from the next unchecked source."""
    loose = []
    for path in sorted((REPO / "ddtree_ops").rglob("*.py")):
        if path.relative_to(REPO / "ddtree_ops").parts[0] == "sim":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("dumps", "dump") and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "json":
                if not any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant) and k.value.value is False
                           for k in node.keywords):
                    loose.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert loose == []
