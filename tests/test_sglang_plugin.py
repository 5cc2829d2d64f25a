"""Unit tests of the SGLang plugin's own logic (no SGLang here; tests/peer runs it inside
real SGLang). The algorithm objects below are stand-ins with SGLang's ``.name`` interface."""

from __future__ import annotations

import ast
import sys
from types import SimpleNamespace

import pytest
from helpers import REPO

from ddtree_ops.sglang import plugin

SIZES = {"DDTREE_OPS_ALGORITHM": "DDTREE", "DDTREE_OPS_DRAFT_TOKENS_PER_REQ": "8",
         "DDTREE_OPS_VERIFY_TOKENS_PER_REQ": "33"}


def test_module_imports_only_the_standard_library():
    tree = ast.parse((REPO / "ddtree_ops/sglang/plugin.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
             for n in top for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


def test_sizes_from_env():
    assert plugin.sizes_from_env({}) is None
    assert plugin.sizes_from_env(SIZES) == {"algorithm": "DDTREE", "draft_tokens_per_req": 8,
                                            "verify_tokens_per_req": 33}
    with pytest.raises(plugin.DDTreeSizeMismatch, match="DDTREE_OPS_VERIFY_TOKENS_PER_REQ='x'"):
        plugin.sizes_from_env({**SIZES, "DDTREE_OPS_VERIFY_TOKENS_PER_REQ": "x"})


@pytest.mark.parametrize("server, n, words", [
    ({"block_size": 8, "budget": 16}, 8, "budget + 1 = 17"),
    ({"block_size": 16, "budget": 32}, 16, "block size"),
    (None, 4, "block size"),
])
def test_check_sizes_refuses_disagreement(server, n, words):
    sizes = plugin.sizes_from_env(SIZES)
    with pytest.raises(plugin.DDTreeSizeMismatch, match=words.replace("+", r"\+")) as exc:
        plugin.check_sizes(sizes, server, n)
    assert "Fix:" in str(exc.value)
    plugin.check_sizes(sizes, {"block_size": 8, "budget": 32}, 8)  # agreement passes


def _width(result):
    def original(self, num_draft_tokens, is_draft_worker):
        return result if not is_draft_worker else num_draft_tokens
    return original


def test_around_width(monkeypatch):
    monkeypatch.setitem(plugin._STATE, "sizes", plugin.sizes_from_env(SIZES))
    monkeypatch.setitem(plugin._STATE, "events", [])
    monkeypatch.setattr(plugin, "_server_spec", lambda: {"block_size": 8, "budget": 32})
    ddtree, dflash = SimpleNamespace(name="DDTREE"), SimpleNamespace(name="DFLASH")
    assert plugin._around_width(_width(8), ddtree, 8, False) == 33  # the 27509 bug, corrected
    assert plugin._around_width(_width(8), ddtree, 8, True) == 8
    assert plugin._around_width(_width(33), ddtree, 8, False) == 33  # sizes right: untouched
    assert plugin._around_width(_width(8), dflash, 8, False) == 8  # other algorithms untouched
    with pytest.raises(plugin.DDTreeSizeMismatch, match="at 12 tokens"):
        plugin._around_width(_width(12), ddtree, 8, False)  # unknown sizing: refuse
    assert any("corrected to 33" in e for e in plugin._STATE["events"])


def test_describe_without_sglang(monkeypatch):
    monkeypatch.setitem(plugin._STATE, "loaded", False)
    monkeypatch.setattr(plugin, "find_targets", lambda: (None, []))
    d = plugin.describe()
    assert set(d) >= {"installed", "active", "detail"} and d["active"] is None
    assert isinstance(d["installed"], bool) and d["targets"] == []


def test_env_names_match_what_the_unit_renders():
    """The plugin reads exactly the variables render/files.py:service_env writes."""
    import copy

    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.config.inventory import load_hostvars
    from ddtree_ops.render.files import service_env

    seen = set()
    for inv in ("inventory/example", "inventory/dflash-example"):
        for host, hv in load_hostvars(REPO / inv).items():
            for variant in (hv, {**copy.deepcopy(hv), "ddtree_speculative": {"algorithm": "none"}}):
                v = validate_hostvars(host, variant)
                sizes = plugin.sizes_from_env(service_env(v))
                assert sizes["algorithm"] == v.plan.algorithm
                seen.add(v.plan.algorithm)
                if v.plan.algorithm == "DDTREE":
                    assert (sizes["draft_tokens_per_req"], sizes["verify_tokens_per_req"]) == (
                        v.plan.block_size, v.plan.budget + 1)
    assert {"DDTREE", "DFLASH", "none"} <= seen
