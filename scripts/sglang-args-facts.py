#!/usr/bin/env python3
"""Write ``ddtree_ops/config/sglang_args.py`` from released SGLang packages (standard library only).

Usage: ``python scripts/sglang-args-facts.py SITE [SITE ...] > ddtree_ops/config/sglang_args.py``
where each SITE holds one released ``sglang`` (a ``scripts/sglang-venv.sh VERSION`` venv's
site-packages, or ``pip download sglang==VERSION --no-deps`` unzipped).

Read per version, by parsing (never importing: the release's import chain needs torch) the
files its ``ServerArgs.add_cli_args`` builds the ``sglang serve`` parser from:

* every ``parser.add_argument("--x", ...)`` call in ``sglang/srt/server_args.py`` and
  ``sglang/srt/arg_groups/*.py``: its option strings, and whether it takes no value
  (``store_true``/``store_false``/``store_const``/``nargs=0``), one, an optional one (``?``)
  or several (``+``/``*``/N);
* every ``name: A[T, "help" | Arg(...)]`` field of ``sglang/srt/server_args.py`` and
  ``sglang/srt/arg_groups/fields/*.py``, turned into options the way the release's own
  ``add_cli_args_from_dataclass`` (``sglang/srt/arg_groups/arg_utils.py``) does:
  ``--`` + name with ``-`` for ``_`` (or ``Arg(cli_name=)``), plus ``Arg(aliases=)``;
  ``Arg(no_cli=True)`` adds none; a ``bool`` field is ``store_true``; ``List[X]`` without
  ``type_parser`` is ``nargs="+"`` (or ``Arg(nargs=)``);
* the renames of ``ServerArgs.from_cli_args`` (``args.pp_size = args.pipeline_parallel_size``):
  each option is recorded under the ``ServerArgs`` field it ends up in;
* ``allow_abbrev`` of the ``argparse.ArgumentParser(...)`` that ``prepare_server_args`` makes
  (argparse's default is True: unique prefixes of long options are accepted);
* where each compatibility check of :data:`ddtree_ops.config.sglang_compat.CHECKS` stands in
  the release: the line of its evidence text inside the named function (a check whose text
  is not found is not in that release, and is not applied to it);
* the same for each branch of the attention-backend and page-size defaults that
  :data:`ddtree_ops.config.derived.ATTENTION_BRANCHES` models (``DERIVED_LINES``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FLAG_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def _const_strs(nodes) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _nargs_kind(nargs) -> str | None:
    if nargs is None:
        return None
    if isinstance(nargs, ast.Constant):
        v = nargs.value
        if v == 0:
            return "flag"
        if v == "?":
            return "optional"
        if v in ("+", "*") or (isinstance(v, int) and v > 1):
            return "list"
        if v == 1:
            return "list"
    return "list"


def action_kinds(path: Path) -> dict[str, str]:
    """``argparse.Action`` subclasses of ``sglang/srt/arg_groups/argparse_actions.py`` whose
    ``__init__`` defaults ``nargs`` to 0: used without ``nargs=``, they take no value."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for cls in ast.parse(path.read_text()).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                args = fn.args
                pos = args.args[len(args.args) - len(args.defaults):]
                pairs = [*zip(pos, args.defaults, strict=True), *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
                for a, dflt in pairs:
                    if a.arg == "nargs" and dflt is not None:
                        out[cls.name] = _nargs_kind(dflt) or "value"
    return out


ACTION_KINDS: dict[str, str] = {}


def _add_argument_options(tree: ast.AST, out: dict[str, tuple[str, str]]) -> None:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        opts = [s for s in _const_strs(node.args) if s.startswith("--")]
        if not opts:
            continue
        action = _kw(node, "action")
        dest_kw = _kw(node, "dest")
        dest = dest_kw.value if isinstance(dest_kw, ast.Constant) else opts[0][2:].replace("-", "_")
        kind = _nargs_kind(_kw(node, "nargs"))
        if kind is None:
            if isinstance(action, ast.Constant) and action.value in FLAG_ACTIONS:
                kind = "flag"
            elif isinstance(action, ast.Name) and action.id in ACTION_KINDS:
                kind = ACTION_KINDS[action.id]
            else:
                kind = "value"
        for o in opts:
            out[o] = (dest, kind)


def _unwrap(t: ast.AST) -> ast.AST:
    """``Optional[X]`` -> X (the field's value type)."""
    while isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "Optional":
        t = t.slice
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "Union":
        elts = [e for e in getattr(t.slice, "elts", []) if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(elts) == 1:
            return _unwrap(elts[0])
    if isinstance(t, ast.BinOp) and isinstance(t.op, ast.BitOr):
        for side in (t.left, t.right):
            if not (isinstance(side, ast.Constant) and side.value is None):
                return _unwrap(side)
    return t


def _field_options(tree: ast.AST, out: dict[str, tuple[str, str]]) -> None:
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                    and isinstance(st.annotation, ast.Subscript) and isinstance(st.annotation.value, ast.Name)
                    and st.annotation.value.id == "A" and isinstance(st.annotation.slice, ast.Tuple)):
                continue
            typ, meta = st.annotation.slice.elts[0], st.annotation.slice.elts[1]
            call = meta if isinstance(meta, ast.Call) else None
            if call is not None and isinstance(_kw(call, "no_cli"), ast.Constant) and _kw(call, "no_cli").value:
                continue
            cli = _kw(call, "cli_name") if call is not None else None
            name = cli.value if isinstance(cli, ast.Constant) else "--" + st.target.id.replace("_", "-")
            aliases = _kw(call, "aliases") if call is not None else None
            names = [name, *(_const_strs(aliases.elts) if isinstance(aliases, (ast.List, ast.Tuple)) else [])]
            inner = _unwrap(typ)
            action = _kw(call, "action") if call is not None else None
            nargs = _nargs_kind(_kw(call, "nargs")) if call is not None else None
            type_parser = _kw(call, "type_parser") if call is not None else None
            if action is not None:
                akw = _kw(call, "action_kwargs")
                kind = "value"
                if isinstance(action, ast.Constant) and action.value in FLAG_ACTIONS:
                    kind = "flag"
                elif isinstance(action, ast.Name) and action.id in ACTION_KINDS:
                    kind = ACTION_KINDS[action.id]
                if isinstance(akw, ast.Dict):
                    for k, v in zip(akw.keys, akw.values, strict=True):
                        if isinstance(k, ast.Constant) and k.value == "nargs":
                            kind = _nargs_kind(v) or kind
            elif isinstance(inner, ast.Name) and inner.id == "bool":
                kind = "flag"
            elif (isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name)
                  and inner.value.id in ("List", "list") and type_parser is None):
                kind = nargs or "list"
            else:
                kind = nargs or "value"
            for n in names:
                out[n] = (st.target.id, kind)


def field_renames(server_args: ast.AST) -> dict[str, str]:
    """``args.FIELD = args.DEST`` assignments of ``ServerArgs.from_cli_args``: the parser's
    destination (``pipeline_parallel_size``) -> the ``ServerArgs`` field SGLang reads (``pp_size``)."""
    out: dict[str, str] = {}
    for node in ast.walk(server_args):
        if isinstance(node, ast.FunctionDef) and node.name == "from_cli_args":
            for st in ast.walk(node):
                if (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Attribute)
                        and isinstance(st.value, ast.Attribute) and isinstance(st.value.value, ast.Name)
                        and isinstance(st.targets[0].value, ast.Name)
                        and st.value.value.id == st.targets[0].value.id == "args"):
                    out[st.value.attr] = st.targets[0].attr
    return out


def _allow_abbrev(server_args: ast.AST) -> bool:
    for node in ast.walk(server_args):
        if isinstance(node, ast.FunctionDef) and node.name == "prepare_server_args":
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "ArgumentParser"):
                    v = _kw(call, "allow_abbrev")
                    return True if v is None else bool(v.value)
    raise SystemExit("no argparse.ArgumentParser(...) in prepare_server_args")


def options_of(site: Path) -> tuple[dict[str, tuple[str, str]], bool]:
    srt = site / "sglang" / "srt"
    server_args = ast.parse((srt / "server_args.py").read_text())
    ACTION_KINDS.clear()
    ACTION_KINDS.update(action_kinds(srt / "arg_groups" / "argparse_actions.py"))
    out: dict[str, tuple[str, str]] = {}
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").glob("*.py"))]
    for f in files:
        _add_argument_options(ast.parse(f.read_text()), out)
    for f in [srt / "server_args.py", *sorted((srt / "arg_groups" / "fields").glob("*.py"))]:
        if f.exists():
            _field_options(ast.parse(f.read_text()), out)
    renames = field_renames(server_args)
    out = {o: (renames.get(dest, dest), kind) for o, (dest, kind) in out.items()}
    return dict(sorted(out.items())), _allow_abbrev(server_args)


def evidence_lines(site: Path, checks) -> dict[str, tuple[str, str, int]]:
    """``{check id: (file, function, line)}`` for each check whose text the release has (a tuple
    of texts: any of them, where the release reworded it)."""
    found = {}
    for c in checks:
        texts = c.evidence if isinstance(c.evidence, tuple) else (c.evidence,)
        for rel, func in c.where:
            path = site / rel
            if not path.exists():
                continue
            src = path.read_text()
            tree = ast.parse(src)
            lines = src.splitlines()
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func:
                    for i in range(node.lineno - 1, node.end_lineno):
                        if any(t in lines[i] for t in texts):
                            found[c.id] = (rel, func, i + 1)
                            break
                if c.id in found:
                    break
            if c.id in found:
                break
    return found


def _fit(line: str) -> str:
    """A data line as written; a few SGLang option names make it longer than the lint's limit."""
    return line if len(line) <= 120 else line + "  # noqa: E501"


def version_of(site: Path) -> str:
    metas = sorted(site.glob("sglang-*.dist-info/METADATA"))
    for line in metas[0].read_text().splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit(f"no Version in {metas[0]}")


def main(sites: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ddtree_ops.config.derived import ATTENTION_BRANCHES
    from ddtree_ops.config.sglang_checks import CHECKS

    rows, branches = [], {}
    for s in sites:
        site = Path(s)
        opts, abbrev = options_of(site)
        rows.append((version_of(site), opts, abbrev, evidence_lines(site, CHECKS)))
        branches[version_of(site)] = evidence_lines(site, ATTENTION_BRANCHES)
    out = ['"""The ``sglang serve`` parser per release: GENERATED by ``scripts/sglang-args-facts.py``, do not edit.',
           "",
           "Read off the released packages (``ServerArgs.add_cli_args``: ``add_argument`` calls and ``A[...]``",
           "fields of ``sglang/srt/server_args.py``, ``sglang/srt/arg_groups/``) of:", ""]
    for v, opts, abbrev, ev in rows:
        out.append(f"* SGLang {v}: {len(opts)} option strings, allow_abbrev={abbrev}, "
                   f"{len(ev)} compatibility checks found.")
    out += ["", "``tests/test_sglang_args.py`` proves this equals the generator's output where the wheels are",
            "present (``DDTREE_SGLANG_SITES``).", "",
            "Over 600 lines: generated tables (one parser per release), written by the script named above, "
            "not by hand.",
            '"""', "", "from __future__ import annotations", ""]
    out.append("OPTIONS: dict[str, dict[str, tuple[str, str]]] = {")
    for v, opts, _a, _e in rows:
        out.append(f'    "{v}": {{')
        out += [_fit(f"        {k!r}: {kind!r},") for k, kind in opts.items()]
        out.append("    },")
    out += ["}", '"""Option string -> (destination, how many values it takes: ``flag`` none, ``value`` one,',
            '``optional`` zero or one, ``list`` one or more)."""', "", ""]
    out.append("ALLOW_ABBREV: dict[str, bool] = {")
    out += [f'    "{v}": {a!r},' for v, _o, a, _e in rows]
    out += ["}", '"""``allow_abbrev`` of the parser ``prepare_server_args`` builds (argparse default True)."""', "", ""]
    out.append("CHECK_LINES: dict[str, dict[str, tuple[str, str, int]]] = {")
    for v, _o, _a, ev in rows:
        out.append(f'    "{v}": {{')
        out += [f"        {k!r}: {loc!r}," for k, loc in sorted(ev.items())]
        out.append("    },")
    out += ["}", '"""Check id -> (file, function, line) where the release has the check\'s evidence text."""', "", ""]
    out.append("DERIVED_LINES: dict[str, dict[str, tuple[str, str, int]]] = {")
    for v, found in branches.items():
        out.append(f'    "{v}": {{')
        out += [f"        {k!r}: {loc!r}," for k, loc in sorted(found.items())]
        out.append("    },")
    out += ["}", '"""Branch id of the attention-backend/page-size defaults -> (file, function, line) where the',
            'release has its text."""']
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
