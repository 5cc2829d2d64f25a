#!/usr/bin/env python3
"""Write ``ddtree_ops/config/sglang_env.py`` from released SGLang packages (standard library only).

Usage: ``python scripts/sglang-env-facts.py SITE_PACKAGES [SITE_PACKAGES ...] > ddtree_ops/config/sglang_env.py``
where each SITE_PACKAGES holds one released ``sglang`` (``scripts/sglang-venv.sh VERSION`` venvs).

Read per version, from ``sglang/srt/environ.py``:

* the ``Envs`` registry: every ``NAME = Env*(...)`` in ``class Envs``;
* renamed/deprecated names (and SGLang's note for them): ``Env*WithAlias(..., deprecated_name=OLD)`` (OLD -> NAME),
  ``_print_deprecated_env(OLD, NEW)`` and ``_deprecated_ms_to_s`` (0.5.1x),
  ``_warn_deprecated_env_to_cli_flag(OLD, ...)`` (0.5.1x, replaced by a CLI flag) and the
  ``_DEPRECATED_ENVS`` dict (0.5.2x, ``_DeprecatedEnv(replacement=NEW)``);

and from every ``sglang/srt/**/*.py``: ``SGLANG_*``/``SGL_*`` names read directly
(``os.getenv("X")``, ``os.environ.get("X")``, ``os.environ["X"]``, ``get_*_env_var("X")``),
outside the registry. The peer tier (``tests/peer/test_versions_table.py``) checks the
written module against the packages with SGLang's own import of ``Envs``.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

DIRECT = re.compile(r"""(?:getenv|environ\.get|environ\[|_env_var)\(?\s*["']((?:SGLANG_|SGL_)[A-Z0-9_]+)["']""")


def registry(src: str) -> tuple[list[str], dict[str, str | None], dict[str, str]]:
    tree = ast.parse(src)
    names: set[str] = set()
    renamed: dict[str, str | None] = {}
    notes: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Envs":
            _envs_class(node, names, renamed)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            _deprecation_call(node, renamed, notes)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            _deprecation_table(node, renamed, notes)
    return sorted(names), dict(sorted(renamed.items())), dict(sorted(notes.items()))


def _envs_class(node: ast.ClassDef, names: set[str], renamed: dict[str, str | None]) -> None:
    """``class Envs``: each ``NAME = Env...(...)``, and its ``deprecated_name=`` if any."""
    for st in node.body:
        if (isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
                and isinstance(st.value.func, ast.Name) and st.value.func.id.startswith("Env")):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
                    for kw in st.value.keywords:
                        if kw.arg == "deprecated_name":
                            renamed[kw.value.value] = t.id


def _deprecation_call(node: ast.Call, renamed: dict[str, str | None], notes: dict[str, str]) -> None:
    """``_print_deprecated_env(OLD, NEW)`` and ``_warn_deprecated_env_to_cli_flag(OLD, NOTE)``."""
    args = [a.value for a in node.args if isinstance(a, ast.Constant)]
    if node.func.id == "_print_deprecated_env" and args:
        renamed[args[0]] = args[1] if len(args) > 1 else None
    elif node.func.id == "_warn_deprecated_env_to_cli_flag" and args:
        renamed[args[0]] = None
        if len(args) > 1:
            notes[args[0]] = args[1]


def _deprecation_table(node: ast.Assign | ast.AnnAssign, renamed: dict[str, str | None],
                       notes: dict[str, str]) -> None:
    """The ``_deprecated_ms_to_s`` / ``_DEPRECATED_ENVS`` dicts: OLD -> NEW or a call with
    ``replacement=`` / ``note=``."""
    tgt = node.targets[0] if isinstance(node, ast.Assign) else node.target
    if not (isinstance(tgt, ast.Name) and tgt.id in ("_deprecated_ms_to_s", "_DEPRECATED_ENVS")):
        return
    for k, v in zip(node.value.keys, node.value.values, strict=True):
        if isinstance(v, ast.Constant):
            renamed[k.value] = v.value
        elif isinstance(v, ast.Call):
            rep = v.args[0].value if v.args and isinstance(v.args[0], ast.Constant) else None
            for kw in v.keywords:
                if kw.arg == "replacement":
                    rep = kw.value.value
                elif kw.arg == "note" and isinstance(kw.value, ast.Constant):
                    notes[k.value] = kw.value.value
            renamed[k.value] = rep


def direct_reads(srt: Path) -> list[str]:
    found: set[str] = set()
    for p in sorted(srt.rglob("*.py")):
        found.update(DIRECT.findall(p.read_text(errors="replace")))
    return sorted(found)


def version_of(site: Path) -> str:
    metas = sorted(site.glob("sglang-*.dist-info/METADATA"))
    for line in metas[0].read_text().splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit(f"no Version in {metas[0]}")


def _names(names: list[str], indent: str = "    ") -> str:
    lines, cur = [], ""
    for n in names:
        if len(cur) + len(n) + 1 > 100:
            lines.append(cur)
            cur = ""
        cur = f"{cur} {n}".strip()
    if cur:
        lines.append(cur)
    return "\n".join(indent + ln for ln in lines)


def main(sites: list[str]) -> int:
    out = ['"""SGLang environment variables per release: GENERATED by ``scripts/sglang-env-facts.py``, do not edit.',
           "",
           "Read off the released packages (``sglang/srt/environ.py`` ``class Envs`` and its deprecation",
           "tables; direct ``SGLANG_*``/``SGL_*`` reads in ``sglang/srt/**/*.py``) of:", ""]
    rows = []
    for s in sites:
        site = Path(s)
        v = version_of(site)
        names, renamed, notes = registry((site / "sglang/srt/environ.py").read_text())
        direct = sorted(set(direct_reads(site / "sglang/srt")) - set(names))
        rows.append((v, names, renamed, direct, notes))
        out.append(f"* SGLang {v}: {len(names)} registry names, {len(renamed)} renamed/deprecated, "
                   f"{len(direct)} read directly.")
    out += ["", "The peer tier (``tests/peer/test_versions_table.py``) proves these equal the packages'.",
            '"""', "", "from __future__ import annotations", "", "",
            "def _set(text: str) -> frozenset[str]:", "    return frozenset(text.split())", "", ""]
    out.append("ENV_REGISTRY: dict[str, frozenset[str]] = {")
    for v, names, _r, _d, _n in rows:
        out += [f'    "{v}": _set("""', _names(names, "        "), '    """),']
    out += ["}", '"""``Envs`` registry names per release (``sglang/srt/environ.py``)."""', "", ""]
    out.append("ENV_READ_DIRECTLY: dict[str, frozenset[str]] = {")
    for v, _n, _r, direct, _no in rows:
        out += [f'    "{v}": _set("""', _names(direct, "        "), '    """),']
    out += ["}", '"""``SGLANG_*``/``SGL_*`` names read outside the registry (``os.getenv`` etc. in ``sglang/srt``)."""',
            "", ""]
    out.append("ENV_RENAMED: dict[str, dict[str, str | None]] = {")
    for v, _n, renamed, _d, _no in rows:
        out.append(f'    "{v}": {{')
        out += [f"        {k!r}: {r!r}," for k, r in renamed.items()]
        out.append("    },")
    out += ["}", '"""Deprecated name -> its replacement (None: removed, or replaced by a CLI flag) per release',
            '(``sglang/srt/environ.py`` deprecation tables and ``deprecated_name=`` aliases)."""', "", ""]
    out.append("ENV_DEPRECATION_NOTES: dict[str, dict[str, str]] = {")
    for v, _n, _r, _d, notes in rows:
        out.append(f'    "{v}": {{')
        out += [f"        {k!r}: {t!r}," for k, t in notes.items()]
        out.append("    },")
    out += ["}", '"""What SGLang tells the operator of a deprecated name (its warning text) per release."""', ""]
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
