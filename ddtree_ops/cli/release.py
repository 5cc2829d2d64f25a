"""The ``ddtree-ops release`` CLI (registered in ``ddtree_ops/cli/__init__.py``) over the host-side
release operations of :mod:`ddtree_ops.host.release` (interface and exit codes documented there).

Kept apart so :mod:`ddtree_ops.host.release` imports only the standard library: the SGLang
build's venv (ddtree-ops installed without its dependencies) runs
``python -m ddtree_ops.host.release prune-builds`` during a deploy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..host.release import (
    GATE_DEADLINE_MAX_S,
    GATE_DEADLINE_MIN_S,
    GATE_MAX_NEW_TOKENS,
    GATE_MIN_TIMEOUT_S,
    KEEP_MAX,
    GateOptions,
    ReleaseError,
    _shown,
    activate,
    gate,
    list_releases,
    prune_builds,
    rollback,
)

# --- the CLI (registered in ddtree_ops/cli/__init__.py as `ddtree-ops release`) -----------------------

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Releases on this host: list, activate, rollback, gate (run on the host, as root).")

ROOT_MAX = 4096
"""Longest ``--root`` (PATH_MAX)."""


def _root_ok(root: Path) -> Path:
    """``--root`` as given, if it is a path that can be named in one line: no control or format
    character (a newline, a terminal escape or a bidi override would forge or garble the
    output), at most :data:`ROOT_MAX` characters."""
    import unicodedata

    text = str(root)
    # Cc: C0/C1 controls (newline, ESC); Cf: format characters (bidi overrides reorder a line);
    # Zl/Zp: line and paragraph separators
    if len(text) > ROOT_MAX or any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise typer.BadParameter(f"--root {_shown(text)}: must be a path of at most {ROOT_MAX} characters without "
                                 "control characters (the service's {config_dir}/releases)")
    return root


RootOpt = Annotated[Path, typer.Option("--root", help="The release root, {config_dir}/releases "
                                                      "(e.g. /etc/ddtree-ops/sglang/releases).", callback=_root_ok)]
KeepOpt = Annotated[int, typer.Option(
    "--keep", help=f"Previous releases to keep (1..{KEEP_MAX}; ddtree_service.keep_releases).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _emit(ok: bool, name: str, detail: str, as_json: bool, extra: dict | None = None) -> None:
    from .common import _print_checks

    _print_checks([{"name": name, "ok": ok, "detail": detail}], as_json, extra)


def _refused(name: str, exc: ReleaseError, as_json: bool, extra: dict | None = None) -> None:
    _emit(False, name, str(exc), as_json, extra)


def _pruned(res: dict) -> str:
    """The pruned ids for the one-line summary (at most 10 named) and any that could not be removed."""
    ids, failed = res["pruned"], res.get("prune_failed") or {}
    text = f"; pruned {', '.join(ids[:10])}" + (f" and {len(ids) - 10} more" if len(ids) > 10 else "") if ids else ""
    if failed:
        rid, why = next(iter(failed.items()))
        text += (f"; could not prune {len(failed)} release(s), e.g. {rid} ({_shown(why, 120)}): remove by hand "
                 "(the switch itself is done)")
    return text


def _keep(keep: int) -> int:
    if not 1 <= keep <= KEEP_MAX:
        raise typer.BadParameter(f"--keep {keep}: must be 1..{KEEP_MAX} (ddtree_service.keep_releases)")
    return keep


@app.command("list")
def list_cmd(root: RootOpt, as_json: JsonOpt = False) -> None:
    """The releases under ROOT: which is current, which is previous, the history."""
    try:
        info = list_releases(root)
    except ReleaseError as exc:
        return _refused("release-list", exc, as_json, {"root": str(root)})
    if as_json:
        _emit(True, "release-list", f"{len(info['releases'])} releases, current {info['current']}", True, info)
        return
    from .common import out

    for r in info["releases"]:
        mark = "current " if r["current"] else ("previous" if r["id"] == info["previous"] else "        ")
        out.print(f"{mark} {r['id']}", highlight=False)
    if not info["releases"]:
        out.print(f"no releases under {root}", highlight=False)


@app.command("activate")
def activate_cmd(root: RootOpt, rid: Annotated[str, typer.Option("--id", help="The release id (12 hex digits).")],
                 keep: KeepOpt = 3, as_json: JsonOpt = False) -> None:
    """Make release ID (installed under ROOT) current; prune beyond --keep. Then: daemon-reload + restart."""
    _keep(keep)
    try:
        res = activate(root, rid, keep)
    except ReleaseError as exc:
        return _refused("release-activate", exc, as_json, {"root": str(root)})
    what = f"{res['from']} -> {res['id']}" if res["changed"] else f"{res['id']} was already current"
    _emit(True, "release-activate", what + _pruned(res), as_json, res)


@app.command("rollback")
def rollback_cmd(root: RootOpt, keep: KeepOpt = 3, as_json: JsonOpt = False) -> None:
    """Switch ROOT's current release back to the previous one. Then: daemon-reload + restart + gate."""
    _keep(keep)
    try:
        res = rollback(root, keep)
    except ReleaseError as exc:
        return _refused("release-rollback", exc, as_json, {"root": str(root)})
    _emit(True, "release-rollback", f"{res['from']} -> {res['to']}{_pruned(res)}", as_json, res)


@app.command("running")
def running_cmd(root: RootOpt, unit: Annotated[str, typer.Option("--unit", help="The service unit, e.g. "
                                                                "ddtree-sglang.service.")],
                as_json: JsonOpt = False) -> None:
    """Does UNIT run the release ROOT's current names? ("stale": restart it; exit 0 either way)."""
    from ..host.release_running import running

    try:
        res = running(root, unit)
    except ReleaseError as exc:
        return _refused("release-running", exc, as_json, {"root": str(root)})
    _emit(True, "release-running", ("stale: " if res["stale"] else "") + res["why"], as_json, res)


@app.command("prune-builds")
def prune_builds_cmd(root: RootOpt,
                     builds: Annotated[Path, typer.Option(
                         "--builds", help="The SGLang builds directory, <sglang_venv>.builds "
                                          "(e.g. /opt/ddtree-ops/sglang-venv.builds).")],
                     keep: Annotated[list[str] | None, typer.Option(
                         "--keep", help="A build name to keep besides those the releases run (repeatable).")] = None,
                     as_json: JsonOpt = False) -> None:
    """Remove SGLang builds no release (of ROOT, or of another root sharing BUILDS) runs (the
    ``sglang`` role runs the same function as ``python -m ddtree_ops.host.release prune-builds``)."""
    try:
        res = prune_builds(root, builds, tuple(keep or ()))
    except ReleaseError as exc:
        return _refused("release-prune-builds", exc, as_json, {"root": str(root), "builds": str(builds)})
    except OSError as exc:
        return _emit(False, "release-prune-builds", f"{builds}: {exc.strerror or exc}", as_json, {"root": str(root)})
    what = f"removed {', '.join(res['removed'])}" if res["removed"] else "nothing to remove"
    _emit(True, "release-prune-builds", f"{what}; in use: {', '.join(res['in_use']) or 'none'}", as_json, res)


@app.command("gate")
def gate_cmd(plan_file: Annotated[Path, typer.Option(
                 "--plan", help="The host's plan.json (/etc/ddtree-ops/<name>/plan.json).")],
             url: Annotated[str | None, typer.Option(help="Server base URL (default: the plan's url).")] = None,
             deadline: Annotated[float, typer.Option(help="Total seconds for the whole gate.")] = 120.0,
             requests: Annotated[int, typer.Option(help="Requests of the synthetic load (1..1000).")] = 16,
             concurrency: Annotated[int, typer.Option(help="Requests in flight (1..256).")] = 4,
             max_new_tokens: Annotated[int, typer.Option(help="Tokens per request (1..4096).")] = GATE_MAX_NEW_TOKENS,
             as_json: JsonOpt = False) -> None:
    """The rolling upgrade's gate: health (drift, warm), a short synthetic load, acceptance
    length >= the deployment's floor; all within --deadline seconds. Exit 0 pass, 1 fail."""
    from .common import _deployed, _positive, _print_checks, _target

    _positive("--deadline", deadline, GATE_DEADLINE_MAX_S)
    if deadline < GATE_DEADLINE_MIN_S:  # refused, not overrun: health and one request cannot fit
        raise typer.BadParameter(f"--deadline {deadline:g}: at least {GATE_DEADLINE_MIN_S:g} s (the health checks "
                                 f"need {GATE_MIN_TIMEOUT_S:g} s a request and the load one request); give "
                                 f"--deadline {GATE_DEADLINE_MIN_S:g} or more")
    for name, value, hi in (("--requests", requests, 1000), ("--concurrency", concurrency, 256),
                            ("--max-new-tokens", max_new_tokens, 4096)):
        if not 1 <= value <= hi:
            raise typer.BadParameter(f"{name} {value}: must be 1..{hi}")
    doc, default_url = _deployed(plan_file, None, None)
    target = _target(url, default_url)
    checks, extra = gate(doc, target, GateOptions(deadline, requests, concurrency, max_new_tokens))
    _print_checks(checks, as_json, {"url": target, **extra})
