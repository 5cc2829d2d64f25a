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
from rich.console import Console
from rich.table import Table

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
            out.print(f"[green]ok[/green]   {v.deployment.host}")
        for w in warnings:
            out.print(f"[yellow]warn[/yellow] {w.message()}", highlight=False)
    if errors:
        raise ConfigError(errors)


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
            ("sglang", f"{d.sglang.version} ({d.sglang.source}{', ' + d.sglang.ddtree_source if d.sglang.ddtree_source else ''})"),
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
            t.add_row(k, "-" if val is None else str(val))
        for w in p.warnings:
            t.add_row("[yellow]warning[/yellow]", w)
        out.print(t)


@app.command()
def render(out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory to write into.")],
           inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None) -> None:
    """Write each host's files under OUT/<host>/<absolute path>, and OUT/prometheus/prometheus.yml.

    Nothing is written unless every host validates.
    """
    from .render import render_host, render_prometheus

    validated = _require_valid(inventory, limit)
    rendered = {v.deployment.host: render_host(v) for v in validated}
    prom = render_prometheus(validated)
    for host, files in rendered.items():
        for f in files:
            target = out_dir / host / f.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f.content, encoding="utf-8")
            target.chmod(int(f.mode, 8))
            out.print(f"wrote {target}{' (secret, 0600)' if f.secret else ''}", highlight=False)
    p = out_dir / "prometheus" / "prometheus.yml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(prom, encoding="utf-8")
    out.print(f"wrote {p}", highlight=False)


def _print_checks(checks: list[dict], as_json: bool, extra: dict | None = None) -> None:
    ok = all(c["ok"] for c in checks)
    if as_json:
        print(json.dumps({"ok": ok, "checks": checks, **(extra or {})}, indent=2))
    else:
        for c in checks:
            mark = "[green]ok[/green]  " if c["ok"] else "[red]FAIL[/red]"
            out.print(f"{mark} {c['name']}: {c['detail']}", highlight=False)
    if not ok:
        raise CheckFailed()


@app.command()
def health(url: Annotated[str, typer.Argument(help="Server base URL, e.g. http://127.0.0.1:30000")],
           timeout: Annotated[float, typer.Option(help="Seconds per probe (>= 3: /health generates a token).")] = 5.0,
           wait: Annotated[float, typer.Option(help="Poll until healthy for up to this many seconds (0: one round).")] = 0.0,
           as_json: JsonOpt = False) -> None:
    """Liveness and readiness of a running server, and its acceptance length."""
    from .ops.health import check_health, wait_ready

    if timeout <= 0 or wait < 0:
        raise typer.BadParameter("--timeout must be > 0 and --wait >= 0")
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

    if batch_sizes:
        try:
            sizes = [int(x) for x in batch_sizes.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(f"--batch-sizes {batch_sizes!r}: comma-separated integers, e.g. 1,2,4,8") from None
    elif plan_file:
        try:
            sizes = json.loads(plan_file.read_text())["plan"]["capture_bs"] or [1]
        except (OSError, ValueError, KeyError) as exc:
            raise typer.BadParameter(f"--plan {plan_file}: not a plan.json rendered by ddtree-ops ({exc})") from None
    else:
        sizes = [1]
    if any(s < 1 for s in sizes):
        raise typer.BadParameter("batch sizes must be >= 1")

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


def main(argv: list[str] | None = None) -> int:
    """Entry point; maps every error to a one-line message and an exit code."""
    try:
        app(args=argv, standalone_mode=False)
        return 0
    except ConfigError as exc:
        for f in exc.findings:
            err.print(f"[red]error[/red] {f.message()}", highlight=False)
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
        err.print(f"error: {msg}", highlight=False)
        return 2
    except Exception as exc:  # anything unexpected: one line, no traceback
        err.print(f"error: {type(exc).__name__}: {exc}", highlight=False)
        return 2


def run() -> None:
    sys.exit(main())
