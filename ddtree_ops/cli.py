"""``ddtree-ops`` command line (Typer + rich).

Exit codes (DESIGN.md §4): 0 ok, 1 a check failed, 2 usage or configuration error.
``--json`` prints one object with a stable ``checks`` list of ``{name, ok, detail}``.
Every error is mapped to a one-line message in :func:`main`; no traceback reaches users.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import math

import httpx
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .config import ConfigError, Validated, validate_hostvars
from .config.errors import Finding

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Deploy and operate SGLang with DFlash/DDTree speculative decoding.")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_INVENTORY = os.environ.get("DDTREE_INVENTORY", "inventory/example")
InventoryOpt = Annotated[str, typer.Option("--inventory", "-i", help="Ansible inventory file or directory.")]
LimitOpt = Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern, e.g. b300.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


class CheckFailed(Exception):
    """A check ran and failed (exit 1)."""


def say(console: Console, label: str, style: str, message: str) -> None:
    """Print ``label message`` with no rich markup parsing of ``message`` (user input)."""
    console.print(Text.assemble((label, style), " ", message), highlight=False)


def _url(url: str) -> str:
    try:
        u = httpx.URL(url)
        ok = u.scheme in ("http", "https") and bool(u.host) and (u.port is None or 0 < u.port < 65536)
    except Exception:  # httpx raises several types for malformed URLs
        ok = False
    if not ok:
        raise typer.BadParameter(f"URL {url!r}: give http(s)://HOST:PORT, e.g. http://127.0.0.1:30000")
    return url


def _positive(name: str, value: float, hi: float = 86400.0, zero_ok: bool = False) -> float:
    if math.isnan(value) or value > hi or value < 0 or (value == 0 and not zero_ok):
        raise typer.BadParameter(f"{name} {value!r}: must be {'>= 0' if zero_ok else '> 0'} and <= {hi:g}")
    return value


def _validate_all(inventory: str, limit: str | None) -> tuple[list[Validated], list[Finding]]:
    from .config.inventory import load_hostvars

    hostvars = load_hostvars(inventory, limit)
    ok: list[Validated] = []
    errors: list[Finding] = []
    for host, hv in sorted(hostvars.items()):
        try:
            ok.append(validate_hostvars(host, hv))
        except ConfigError as exc:
            errors.extend(exc.findings)
    return ok, errors


def _require_valid(inventory: str, limit: str | None) -> list[Validated]:
    ok, errors = _validate_all(inventory, limit)
    if errors:
        raise ConfigError(errors)
    return ok


@app.command()
def validate(inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None, as_json: JsonOpt = False) -> None:
    """Validate every server host of an inventory (exit 2 on any error)."""
    ok, errors = _validate_all(inventory, limit)
    warnings = [w for v in ok for w in v.warnings]
    checks = [{"name": f"config:{v.deployment.host}", "ok": True, "detail": "valid"} for v in ok]
    checks += [{"name": f"config:{f.host}", "ok": False, "detail": f.message()} for f in errors]
    if as_json:
        print(json.dumps({"ok": not errors, "checks": checks, "warnings": [w.as_dict() for w in warnings],
                          "errors": [f.as_dict() for f in errors]}, indent=2))
    else:
        for v in ok:
            say(out, "ok  ", "green", v.deployment.host)
        for w in warnings:
            say(out, "warn", "yellow", w.message())
        for f in errors:
            say(err, "error", "red", f.message())
    if errors:
        raise typer.Exit(2)


@app.command()
def plan(inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None, as_json: JsonOpt = False) -> None:
    """Show what each host will run: sizes per request, capture list, graph token maxima."""
    validated = _require_valid(inventory, limit)
    if as_json:
        print(json.dumps({"ok": True, "checks": [{"name": f"config:{v.deployment.host}", "ok": True, "detail": "valid"}
                                                 for v in validated],
                          "hosts": {v.deployment.host: {"host_class": v.deployment.host_class, **v.plan.as_dict()}
                                    for v in validated}}, indent=2))
        return
    for v in validated:
        d, p = v.deployment, v.plan
        t = Table(title=f"{d.host} ({d.host_class}) — {d.service.unit_name}", show_header=False, title_justify="left")
        t.add_column("field", style="bold")
        t.add_column("value")
        rows: list[tuple[str, Any]] = [
            ("model", d.model.path),
            ("sglang", f"{d.sglang.base_version} ({d.sglang.source}{', ' + d.sglang.ddtree_source if d.sglang.ddtree_source else ''})"),
            ("algorithm", p.algorithm),
            ("block_size", p.block_size),
            ("budget", f"{p.budget}{' (full tree)' if p.full_tree else ''}" if p.budget is not None else None),
            ("draft_tokens_per_req", p.draft_tokens_per_req),
            ("verify_tokens_per_req", p.verify_tokens_per_req),
            ("tp_size", d.server.tp_size),
            ("max_running_requests", p.max_running_requests),
            ("cuda_graphs", "on" if p.cuda_graphs else "off (eager)"),
            ("capture_bs", " ".join(map(str, p.capture_bs)) or "-"),
            ("max_draft_graph_tokens", p.max_draft_graph_tokens),
            ("max_verify_graph_tokens", p.max_verify_graph_tokens),
            ("attention_backend", p.attention_backend or "SGLang default"),
            ("page_size", p.page_size or "SGLang default"),
        ]
        for k, val in rows:
            t.add_row(k, Text("-" if val is None else str(val)))
        for w in p.warnings:
            t.add_row(Text("warning", style="yellow"), Text(w))
        out.print(t)


@app.command()
def render(out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory to write into.")],
           inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None) -> None:
    """Write each host's files under OUT/<host>/<absolute path>, and OUT/prometheus/prometheus.yml.

    Nothing is written unless every host validates.
    """
    from .render import render_host, render_prometheus

    if not str(out_dir).strip():
        raise typer.BadParameter("--out must name a directory")
    validated = _require_valid(inventory, limit)
    writes = [(out_dir / v.deployment.host / f.path.lstrip("/"), f.content, int(f.mode, 8), f.secret)
              for v in validated for f in render_host(v)]
    writes.append((out_dir / "prometheus" / "prometheus.yml", render_prometheus(validated), 0o644, False))
    for target, content, mode, secret in writes:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
            target.chmod(mode)
        except OSError as exc:
            raise typer.BadParameter(f"--out {out_dir}: cannot write {target}: {exc.strerror or exc}") from None
        say(out, "wrote", "", f"{target}{' (secret, 0600)' if secret else ''}")


def _print_checks(checks: list[dict], as_json: bool, extra: dict | None = None) -> None:
    ok = all(c["ok"] for c in checks)
    if as_json:
        print(json.dumps({"ok": ok, "checks": checks, **(extra or {})}, indent=2))
    else:
        for c in checks:
            say(out, "ok  " if c["ok"] else "FAIL", "green" if c["ok"] else "red", f"{c['name']}: {c['detail']}")
    if not ok:
        raise CheckFailed()


@app.command()
def health(url: Annotated[str, typer.Argument(help="Server base URL, e.g. http://127.0.0.1:30000")],
           timeout: Annotated[float, typer.Option(help="Seconds per probe (>= 3: /health generates a token).")] = 5.0,
           wait: Annotated[float, typer.Option(help="Poll until healthy for up to this many seconds (0: one round).")] = 0.0,
           as_json: JsonOpt = False) -> None:
    """Liveness and readiness of a running server, and its acceptance length."""
    from .ops.health import check_health, wait_ready

    _url(url)
    _positive("--timeout", timeout, 300)
    _positive("--wait", wait, zero_ok=True)
    checks = wait_ready(url, wait, timeout) if wait > 0 else check_health(url, timeout)
    _print_checks([c.as_dict() for c in checks], as_json)


@app.command()
def warmup(url: Annotated[str, typer.Argument(help="Server base URL.")],
           plan_file: Annotated[Path | None, typer.Option("--plan", help="plan.json rendered for the host (capture list).")] = None,
           batch_sizes: Annotated[str | None, typer.Option("--batch-sizes", help="Comma-separated batch sizes instead of --plan.")] = None,
           deadline: Annotated[float, typer.Option(help="Seconds for the whole warmup.")] = 600.0,
           max_new_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 32,
           as_json: JsonOpt = False) -> None:
    """Drive the server through every captured batch size (concurrency = batch size)."""
    from .ops.warmup import WarmupError
    from .ops.warmup import warmup as run_warmup

    _url(url)
    _positive("--deadline", deadline)
    if not 1 <= max_new_tokens <= 1 << 20:
        raise typer.BadParameter(f"--max-new-tokens {max_new_tokens}: must be 1..{1 << 20}")
    if batch_sizes is not None:
        try:
            sizes = [int(x) for x in batch_sizes.split(",")]
        except ValueError:
            raise typer.BadParameter(f"--batch-sizes {batch_sizes!r}: comma-separated integers, e.g. 1,2,4,8") from None
    elif plan_file:
        try:
            sizes = json.loads(plan_file.read_text())["plan"]["capture_bs"] or [1]
            if not isinstance(sizes, list) or not all(type(x) is int for x in sizes):
                raise TypeError("plan.capture_bs is not a list of integers")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise typer.BadParameter(f"--plan {plan_file}: not a plan.json rendered by ddtree-ops ({exc})") from None
    else:
        sizes = [1]
    if not sizes or any(not 1 <= x <= 4096 for x in sizes):
        raise typer.BadParameter(f"batch sizes {sizes}: each must be 1..4096")

    def progress(r) -> None:
        if not as_json:
            out.print(f"bs={r.batch_size:<4} {r.latency_s:7.3f} s  {r.completion_tokens:6d} tokens  "
                      f"accept_length={r.accept_length if r.accept_length is not None else '-'}", highlight=False)

    try:
        report = run_warmup(url, sizes, deadline, max_new_tokens, progress)
    except WarmupError as exc:
        _print_checks([{"name": "warmup", "ok": False, "detail": str(exc)}], as_json)
        return
    _print_checks([{"name": "warmup", "ok": True,
                    "detail": f"{len(report.results)} batch sizes in {report.elapsed_s:.2f} s"}],
                  as_json, {"report": report.as_dict()})


@app.command("check-ptxas")
def check_ptxas(arch: Annotated[str, typer.Option(help="GPU arch, e.g. sm_103 (assembles .target sm_103a).")],
                ptxas: Annotated[str | None, typer.Option(help="The ptxas binary to check.")] = None,
                python: Annotated[str | None, typer.Option(help="A venv's python: check the ptxas Triton there would use "
                                                                "(honours TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH).")] = None,
                as_json: JsonOpt = False) -> None:
    """Assemble a tiny PTX (.version of the arch, .target sm_XYZa) with one ptxas (exit 1 if it cannot)."""
    from .config.toolchain import ARCHS
    from .ops.ptxas import PtxasUsageError, check

    a = ARCHS.get(arch)
    if a is None:
        raise typer.BadParameter(f"--arch {arch!r}: use one of {', '.join(ARCHS)}")
    try:
        result = check(a.target, a.ptx_version, ptxas, python)
    except PtxasUsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    _print_checks(result["checks"], as_json, {"ptxas": result["ptxas"], "triton": result["triton"]})


def main(argv: list[str] | None = None) -> int:
    """Entry point; maps every error to a one-line message and an exit code."""
    try:
        rc = app(args=argv, standalone_mode=False)  # click returns typer.Exit's code here
        return rc if isinstance(rc, int) else 0
    except ConfigError as exc:
        if _wants_json(argv):
            print(json.dumps({"ok": False, "checks": [{"name": f"config:{f.host or f.field}", "ok": False,
                                                       "detail": f.message()} for f in exc.findings],
                              "errors": [f.as_dict() for f in exc.findings]}, indent=2))
        for f in exc.findings:
            say(err, "error", "red", f.message())
        return 2
    except CheckFailed:
        return 1
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err.print("aborted")
        return 2
    except typer.exceptions.TyperException as exc:  # usage errors (bad option, unknown command)
        msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return _usage(argv, msg)
    except Exception as exc:  # anything unexpected: one line, no traceback
        return _usage(argv, f"{type(exc).__name__}: {exc}")


def _wants_json(argv: list[str] | None) -> bool:
    return "--json" in (sys.argv[1:] if argv is None else argv)


def _usage(argv: list[str] | None, msg: str) -> int:
    if msg:
        if _wants_json(argv):
            print(json.dumps({"ok": False, "checks": [{"name": "usage", "ok": False, "detail": msg}]}, indent=2))
        say(err, "error:", "red", msg)
    return 2


def run() -> None:
    sys.exit(main())
