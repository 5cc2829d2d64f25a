"""Capability probe: what an installed SGLang build can do, checked inside its own venv.

Runs as ``<sglang-venv>/bin/python -m ddtree_ops.sglang.probe --request FILE [--json]``.
It imports only the standard library and SGLang (the SGLang venv holds ddtree-ops with
``--no-deps``), so nothing here may import pydantic, typer or ``ddtree_ops.config``.
The controller side (:func:`ddtree_ops.sglang.expect.probe_request`) renders the request:
our argv and what the versions table expects of the pinned build.

Request (JSON object)::

    {"argv": [server args, without python -m ...],      # our rendered argv
     "algorithm": "DDTREE" | "DFLASH" | ... | "none",
     "version": "0.5.23",                                # the pin's (base) release
     "extra_flags": ["--speculative-ddtree-budget"],     # flags the DDTree source adds
     "needs_verify_sizing": true,                        # DDTree with CUDA graphs on
     "sizes_verify_at_budget_plus_one": true | false | null,   # versions table
     "ddtree_optional": false,                           # simulator host: release build
     "fix": {"ddtree": "...", "flags": "...", "sizing": "...", "version": "..."},
     "arch": "sm_103", "gpu_memory_gib": 288,             # host class (used only without a GPU)
     "planned": {...},                                    # resolve.planned_values(plan)
     "models": {"target": {config.json}, "draft": {...}}} # optional; else a local model dir

Checks (stable names, each ``{name, ok, detail}``): ``sglang-version``,
``speculative-algorithms``, ``argv-parses``, ``sglang-resolution`` (the build's own
resolution, :mod:`ddtree_ops.sglang.resolve`; present when the argv parses),
``verify-graph-sizing``. The plugin's state
(:func:`ddtree_ops.sglang.plugin.describe` plus a one-line ``summary``) is reported under
``plugin``, informational: whether it is needed is the ``verify-graph-sizing`` check.
Exit codes: 0 every check ok, 1 a check failed, 2 bad request or SGLang not importable.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from typing import Any


class _ParseError(Exception):
    """argparse's error message, raised instead of ``SystemExit``."""


def _check(name: str, ok: bool, detail: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail, **extra}


def _strip_flags(argv: list[str], flags: set[str]) -> tuple[list[str], list[str]]:
    """Drop ``flags`` and their values from ``argv``; return (kept, dropped)."""
    kept: list[str] = []
    dropped: list[str] = []
    skipping = False
    for a in argv:
        if a.startswith("--"):
            skipping = a.split("=", 1)[0] in flags
            (dropped if skipping else kept).append(a)
        elif skipping:
            dropped.append(a)
        else:
            kept.append(a)
    return kept, dropped


def _option_of(message: str) -> str | None:
    for marker in ("ambiguous option: ", "unrecognized arguments: "):
        if marker in message:
            return message.split(marker, 1)[1].split()[0].split("=", 1)[0]
    return None


def parse_with_build(argv: list[str]) -> tuple[list[str], list[str], str | None]:
    """Parse ``argv`` with the installed build's own parser, the one
    ``sglang.srt.server_args.prepare_server_args`` builds (``ArgumentParser`` +
    ``ServerArgs.add_cli_args``), collecting every bad flag by name.

    Returns:
        (unrecognized flags, ambiguous flags, other error or None). An ambiguous
        option (e.g. ``--cuda-graph-max-bs`` on 0.5.20+, which prefixes two ``-decode``/
        ``-prefill`` flags) is removed with its values and parsing repeats, so one run
        names all of them.
    """
    from sglang.srt.server_args import ServerArgs

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # argparse would print usage and SystemExit(2)
            raise _ParseError(message)

    unrecognized: list[str] = []
    ambiguous: list[str] = []
    rest = list(argv)
    for _ in range(len(argv) + 1):
        parser = Parser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        try:
            _, unknown = parser.parse_known_args(rest)
        except _ParseError as exc:
            msg = str(exc)
            opt = _option_of(msg)
            if "ambiguous option" in msg and opt:
                ambiguous.append(opt)
                rest, _ = _strip_flags(rest, {opt})
                continue
            return unrecognized, ambiguous, msg
        unrecognized += [u.split("=", 1)[0] for u in unknown if u.startswith("-")]
        stray = [u for u in unknown if not u.startswith("-")]
        return unrecognized, ambiguous, (f"stray values {stray}" if stray and not unrecognized else None)
    return unrecognized, ambiguous, "parser did not settle"


def resolve_with_build(argv: list[str], req: dict[str, Any]) -> dict[str, Any]:
    """Run the installed build's OWN resolution of ``argv`` (0.5.2x: ``prepare_server_args``
    then ``ServerArgs.resolve_once()``, the entry the server uses; 0.5.13.post1: the
    ``ServerArgs`` post-init) through :func:`ddtree_ops.sglang.resolve.resolve_in_build`.

    Args:
        argv: our argv as parsed (DDTree-only flags already set aside for a release build).
        req: the probe request; ``arch`` / ``gpu_memory_gib`` (the host class's, used only
            where no GPU is visible) and ``models`` (config.json of target/draft) are passed on.

    Returns:
        :func:`~ddtree_ops.sglang.resolve.resolve_in_build`'s result: ``state`` ``resolved``,
        ``refused`` (``detail`` quotes SGLang) or ``not-run`` (``detail`` says why).
    """
    from ddtree_ops.sglang.resolve import resolve_in_build

    return resolve_in_build({"argv": argv, "arch": req.get("arch"), "gpu_memory_gib": req.get("gpu_memory_gib"),
                             "models": req.get("models") or {}})


def resolution_check(res: dict[str, Any], planned: dict[str, Any] | None) -> dict[str, Any]:
    """The ``sglang-resolution`` check of a resolution result.

    Fails only when SGLang refused the arguments (its own message quoted). Resolved: ok,
    with every setting SGLang changed against ``planned`` (the request's
    :func:`ddtree_ops.sglang.resolve.planned_values`) listed under ``changes`` and in the
    detail. Not run: ok, and the detail says "parsed only; resolution not run: <why>"; it
    never claims a resolution that did not happen.
    """
    from ddtree_ops.sglang.resolve import diff_plan, summary

    changes = diff_plan(planned, res) if (planned and res.get("state") == "resolved") else []
    detail = summary(res, parsed=True)
    if changes:
        detail += "; " + "; ".join(changes)
    elif res.get("state") == "resolved" and planned:
        detail += "; every compared setting matches the plan"
    return _check("sglang-resolution", res.get("state") != "refused", detail, state=res.get("state"),
                  changes=changes, resolved=res.get("resolved"))


def speculative_algorithms() -> list[str]:
    """Members of ``SpeculativeAlgorithm`` in the installed build (``NONE`` included)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return list(SpeculativeAlgorithm.__members__)


def plugin_state() -> dict[str, Any]:
    """``ddtree_ops.sglang.plugin.describe()``, or ``installed: False`` when absent."""
    try:
        from ddtree_ops.sglang import plugin  # type: ignore[attr-defined]

        state = dict(plugin.describe())
    except (ImportError, AttributeError) as exc:
        return {"installed": False, "active": None, "detail": f"plugin not installed ({type(exc).__name__})"}
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not hide the other checks
        return {"installed": False, "active": None, "detail": f"plugin failed: {type(exc).__name__}: {exc}"}
    state.setdefault("installed", True)
    state.setdefault("active", None)
    state.setdefault("detail", "")
    return state


def probe(req: dict[str, Any]) -> dict[str, Any]:
    """Run every check for request ``req`` (see the module docstring).

    Returns:
        ``{"ok", "checks", "version", "algorithms", "plugin"}``.

    Raises:
        ImportError: SGLang is not importable in this interpreter.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the parser must never reach the network
    with contextlib.redirect_stderr(io.StringIO()):  # import-time warnings (no GPU, no Triton)
        import sglang
        import sglang.srt.server_args  # noqa: F401
        algos = speculative_algorithms()
    fix = req.get("fix") or {}
    version = getattr(sglang, "__version__", "unknown")
    has_ddtree = "DDTREE" in algos
    checks = [_version_check(version, req.get("version"), fix), _algorithm_check(req, algos, fix)]
    # before the resolution: where no GPU is visible it patches SGLang's device probes in
    # this process (ddtree_ops.sglang.resolve), which must not colour the plugin's report
    plugin = plugin_state()
    checks += _argv_checks(req, version, has_ddtree, fix)
    checks.append(_sizing_check(req, has_ddtree, plugin, fix))
    plugin["summary"] = (("installed" if plugin.get("installed") else "not installed")
                         + (f", active={plugin.get('active')}" if plugin.get("installed") else "")
                         + (f": {plugin.get('detail')}" if plugin.get("detail") else ""))
    return {"ok": all(c["ok"] for c in checks), "checks": checks, "version": version,
            "algorithms": algos, "plugin": plugin}


def _version_check(version: str, want: str | None, fix: dict[str, Any]) -> dict[str, Any]:
    """``sglang-version``: the importable SGLang is the pinned one (any, when nothing is pinned)."""
    if not want or version == want:
        return _check("sglang-version", True, f"SGLang {version}")
    return _check("sglang-version", False,
                  f"SGLang {version}, but the pin says {want}. Fix: {fix.get('version', 're-run the sglang role')}")


def _algorithm_check(req: dict[str, Any], algos: list[str], fix: dict[str, Any]) -> dict[str, Any]:
    """``speculative-algorithms``: the build knows the planned algorithm (or DDTree may be absent)."""
    algorithm = req.get("algorithm") or "none"
    if algorithm in ("none", "NONE"):
        ok, detail = True, "no speculative algorithm needed"
    elif algorithm in algos:
        ok, detail = True, f"{algorithm} is known"
    elif algorithm == "DDTREE" and req.get("ddtree_optional"):
        ok, detail = True, "DDTREE absent (a release build; this host serves through the simulator)"
    else:
        ok = False
        detail = (f"this build does not know {algorithm}. Fix: "
                  f"{fix.get('ddtree' if algorithm == 'DDTREE' else 'algorithm', 'pin a build that has it')}")
    return _check("speculative-algorithms", ok, f"{detail}; build knows {', '.join(algos)}",
                  algorithms=algos, ddtree=("DDTREE" in algos))


def _argv_checks(req: dict[str, Any], version: str, has_ddtree: bool, fix: dict[str, Any]) -> list[dict[str, Any]]:
    """``argv-parses`` and, when it parses, the resolution check (:func:`resolution_check`).

    A build without DDTREE parses the argv without the DDTree-only ``extra_flags`` (those are
    checked against the versions table instead).
    """
    argv = [str(a) for a in req.get("argv", [])]
    extra = set(req.get("extra_flags") or [])
    to_parse, set_aside = (argv, []) if has_ddtree else _strip_flags(argv, extra)
    unrecognized, ambiguous, other = parse_with_build(to_parse)
    if unrecognized or ambiguous or other:
        parts = []
        if unrecognized:
            parts.append(f"unrecognized: {' '.join(unrecognized)}")
        if ambiguous:
            parts.append(f"ambiguous: {' '.join(ambiguous)}")
        if other:
            parts.append(other)
        detail = (f"SGLang {version}'s parser rejects our argv ({'; '.join(parts)}). "
                  f"Fix: {fix.get('flags', 'pin the version whose dialect the renderer emits')}")
        return [_check("argv-parses", False, detail, unrecognized=unrecognized, ambiguous=ambiguous)]
    aside = (f"; {' '.join(f for f in set_aside if f.startswith('--'))} checked against the versions table "
             "(this build has no DDTREE)") if set_aside else ""
    parses = _check("argv-parses", True,
                    f"{len([a for a in to_parse if a.startswith('--')])} flags accepted by SGLang {version}'s "
                    f"parser{aside}", unrecognized=[], ambiguous=[])
    if (req.get("algorithm") or "none") == "DDTREE" and not has_ddtree:
        res = {"state": "not-run", "version": version, "detail": "this build has no DDTREE to resolve it with "
               "(release build; the simulator serves DDTree)", "resolved": None, "sources": {}}
    else:
        res = resolve_with_build(to_parse, req)
    return [parses, resolution_check(res, req.get("planned"))]


def _sizing_check(req: dict[str, Any], has_ddtree: bool, plugin: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """``verify-graph-sizing``: DDTree target-verify graphs are sized at budget + 1 (by the
    pinned source, per the versions table, or by the active ddtree-ops plugin)."""
    if not req.get("needs_verify_sizing"):
        ok, detail = True, "not needed (no DDTree target-verify graphs)"
    elif not has_ddtree and req.get("ddtree_optional"):
        ok, detail = True, "not applicable (release build; the simulator sizes its verify graphs)"
    elif req.get("sizes_verify_at_budget_plus_one"):
        ok, detail = True, "the pinned DDTree source sizes target-verify graphs at budget + 1 (versions table)"
    elif plugin.get("installed") and plugin.get("active") is not False:
        ok = True
        detail = f"the build sizes from block_size; the ddtree-ops plugin resizes them ({plugin.get('detail')})"
    else:
        ok = False
        detail = (
            "this build sizes DDTree target-verify graphs from block_size, not budget + 1 (the "
            "'size of tensor a (8) must match ... (33)' crash on the first verify), and the ddtree-ops "
            f"plugin is not active ({plugin.get('detail')}). Fix: "
            f"{fix.get('sizing', 'pin a DDTree source that sizes at budget + 1')}"
        )
    return _check("verify-graph-sizing", ok, detail)


REPORT_CAP = 1 << 20
"""Characters of the probe's stdout the controller reads (a real report is a few KB)."""
DETAIL_CAP = 2000
"""Characters of one check's name or detail kept by :func:`read_report` (longer: cut, with ``…``)."""


def _cut(text: str, cap: int) -> str:
    return text if len(text) <= cap else text[:cap] + "…"


def read_report(stdout: str, stderr: str = "") -> dict[str, Any]:
    """The probe's ``--json`` output as the controller reads it (the ``ddtree_probe`` action of
    the ``sglang`` role): ``{"ok", "checks", "plugin", ...}`` as printed, each check's name and
    detail as text cut to :data:`DETAIL_CAP`. Output that is not such an object (the process died
    before printing, e.g. SGLang's import killed it; a cut or hostile stdout) is a failed report
    with one ``probe`` check whose detail is the last line of ``stderr`` (or what was wrong).
    Never raises; ``stdout`` beyond :data:`REPORT_CAP` characters is refused, not parsed."""
    def failed(detail: str) -> dict[str, Any]:
        return {"ok": False, "checks": [_check("probe", False, _cut(detail, DETAIL_CAP))], "plugin": {}}

    last = next((ln.strip() for ln in reversed(str(stderr)[-REPORT_CAP:].splitlines()) if ln.strip()), "no output")
    text = str(stdout)
    if len(text) > REPORT_CAP:
        return failed(f"the probe printed more than {REPORT_CAP} characters; last line of its stderr: {last}")
    if not text.lstrip().startswith("{"):
        return failed(last)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return failed(f"the probe's output is not JSON ({exc}); last line of its stderr: {last}")
    checks = doc.get("checks") if isinstance(doc, dict) else None
    if (not isinstance(checks, list) or not checks or not isinstance(doc.get("ok"), bool)
            or not all(isinstance(c, dict) and isinstance(c.get("ok"), bool) for c in checks)):
        return failed("the probe's output is not a report ({ok, checks: [{name, ok, detail}]}); "
                      f"last line of its stderr: {last}")
    doc["checks"] = [_check(_cut(str(c.get("name", "?")), DETAIL_CAP), c["ok"],
                            _cut(str(c.get("detail", "")), DETAIL_CAP)) for c in checks]
    doc["ok"] = doc["ok"] and all(c["ok"] for c in doc["checks"])
    if not isinstance(doc.get("plugin"), dict):
        doc["plugin"] = {}
    return doc


def report_lines(result: dict[str, Any]) -> list[str]:
    """The text form of a probe result: ``ok   NAME: DETAIL`` / ``FAIL NAME: DETAIL`` per check,
    then ``info plugin: SUMMARY`` (``unknown`` when the result has none). What ``--json``-less
    runs print and what the ``sglang`` role shows."""
    lines = [f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}" for c in result["checks"]]
    return lines + [f"info plugin: {_cut(str(result.get('plugin', {}).get('summary', 'unknown')), DETAIL_CAP)}"]


def failure_detail(result: dict[str, Any]) -> str:
    """The details of the failed checks of a probe result, joined with `` | `` (``""`` when none failed)."""
    return " | ".join(c["detail"] for c in result["checks"] if not c["ok"])


def main(argv: list[str] | None = None) -> int:
    """``python -m ddtree_ops.sglang.probe``; see the module docstring for exit codes."""
    ap = argparse.ArgumentParser(prog="python -m ddtree_ops.sglang.probe",
                                 description="Check what this SGLang build can do for a rendered deployment.")
    ap.add_argument("--request", required=True, help="request JSON file ('-' for stdin)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        text = sys.stdin.read() if args.request == "-" else open(args.request, encoding="utf-8").read()
        req = json.loads(text)
        if not isinstance(req, dict) or not isinstance(req.get("argv", []), list):
            raise ValueError("the request must be a JSON object with an 'argv' list")
    except (OSError, ValueError) as exc:
        return _fatal(args.json, "request", f"--request {args.request}: {exc}")
    try:
        result = probe(req)
    except ImportError as exc:
        return _fatal(args.json, "sglang-import", f"SGLang is not importable by {sys.executable}: {exc}")
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print("\n".join(report_lines(result)))
    return 0 if result["ok"] else 1


def _fatal(as_json: bool, name: str, detail: str) -> int:
    if as_json:
        print(json.dumps({"ok": False, "checks": [_check(name, False, detail)]}, indent=2, allow_nan=False))
    else:
        print(f"error: {detail}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
