"""The package's import layers: no import circle, no import from a lower layer to a higher one,
and nothing in the product imports the simulator. The layer order is the one written down in
``docs/architecture.md`` (its ``layers`` block); every import counts, the ones inside functions
and under ``TYPE_CHECKING`` too."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "ddtree_ops"
DOC = REPO / "docs/architecture.md"
SIM = "sim"


def read_layers(text: str) -> list[tuple[str, list[str]]]:
    """``[(layer, [module patterns])]``, lowest first, from the doc's fenced ``layers`` block:
    one ``name: pattern pattern ...`` per line; a pattern is a module (``ddtree_ops.python_tag``)
    or a subtree (``ddtree_ops.config.*``)."""
    m = re.search(r"^```text layers\n(.*?)^```", text, re.S | re.M)
    assert m, f"{DOC}: no ```text layers block"
    layers = []
    for line in m.group(1).splitlines():
        if line.strip():
            name, _, patterns = line.partition(":")
            layers.append((name.strip(), patterns.split()))
    return layers


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = p
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """``{module: {package modules it imports}}``: every ``import``/``from ... import`` of the
    file, at any depth (functions, ``TYPE_CHECKING`` blocks); ``from X import name`` counts as
    an import of ``X.name`` when that is a module, else of ``X``."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    out.add(sub if sub in mods else target)
        edges[name] = {t for t in out if t in mods} - {name}
    return edges


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> tuple[int, str] | None:
    best: tuple[int, int, str] | None = None
    for i, (name, patterns) in enumerate(layers):
        for p in patterns:
            hit = module.startswith(p[:-1]) or module == p[:-2] if p.endswith(".*") else module == p
            if hit and (best is None or len(p) > best[0]):
                best = (len(p), i, name)
    return None if best is None else (best[1], best[2])


def violations(edges: dict[str, set[str]], layers: list[tuple[str, list[str]]]) -> list[str]:
    """Every import that goes up the layer order or into the simulator from outside it."""
    found = []
    for src, targets in sorted(edges.items()):
        ls = layer_of(src, layers)
        for dst in sorted(targets):
            ld = layer_of(dst, layers)
            if ls is None or ld is None:
                continue
            if ld[1] == SIM and ls[1] != SIM:
                found.append(f"{src} ({ls[1]}) imports the simulator {dst}")
            elif ld[1] != SIM and ld[0] > ls[0]:
                found.append(f"{src} ({ls[1]}) imports {dst} of the higher layer {ld[1]}")
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module; Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


LAYERS = read_layers(DOC.read_text())
MODS = modules()
EDGES = imports(MODS)


def test_every_module_has_a_layer():
    assert [m for m in MODS if layer_of(m, LAYERS) is None] == []


def test_no_import_goes_up_a_layer_or_into_the_simulator():
    assert violations(EDGES, LAYERS) == []


def test_no_import_circle():
    assert circles(EDGES) == []


def test_the_core_uses_the_standard_library_only():
    """``ddtree_ops._core`` imports nothing outside the standard library and nothing else of the
    package (the preflight zipapp carries it onto hosts before ddtree-ops is installed)."""
    core = [m for m in MODS if m == "ddtree_ops._core" or m.startswith("ddtree_ops._core.")]
    assert core
    bad = [f"{m} imports {t}" for m in core for t in EDGES[m] if not t.startswith("ddtree_ops._core")]
    for m in core:
        for node in ast.walk(ast.parse(MODS[m].read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{m} imports {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"]
    assert bad == []


# --- the checker itself ------------------------------------------------------------------------

_PLANTED = [("low", ["pkg.low.*"]), ("high", ["pkg.high.*", "pkg.top"]), (SIM, ["pkg.sim.*"])]


@pytest.mark.parametrize(("edges", "expected"), [
    ({"pkg.high.a": {"pkg.low.b"}}, []),
    ({"pkg.low.b": {"pkg.high.a"}}, ["pkg.low.b (low) imports pkg.high.a of the higher layer high"]),
    ({"pkg.top": {"pkg.sim.x"}}, ["pkg.top (high) imports the simulator pkg.sim.x"]),
    ({"pkg.sim.x": {"pkg.high.a", "pkg.low.b"}}, []),
])
def test_the_checker_finds_a_planted_upward_import(edges, expected):
    assert violations(edges, _PLANTED) == expected


def test_the_checker_finds_a_planted_circle_and_function_local_imports(tmp_path):
    pkg = tmp_path / "ddtree_ops"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from .y import g\n")
    (pkg / "a" / "y.py").write_text("from ddtree_ops.a import x\n")
    edges = imports(modules(pkg))
    assert edges["ddtree_ops.a.x"] == {"ddtree_ops.a.y"} and edges["ddtree_ops.a.y"] == {"ddtree_ops.a.x"}
    assert circles(edges) == [["ddtree_ops.a.x", "ddtree_ops.a.y"]]


SIZE_LIMIT = 650
"""Lines a module may have before its docstring must say why it is one module ("about 600")."""


def test_a_long_module_says_why_at_its_top():
    long = {m: p for m, p in MODS.items() if len(p.read_text().splitlines()) > SIZE_LIMIT}
    silent = [m for m, p in long.items() if "Over 600 lines" not in (ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert silent == []
