"""The commands that check the GPU host itself: ``port-check``, ``check-ptxas``, ``diagnose`` and
``preflight`` (the zipapp of the same checks runs before ddtree-ops is installed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    CheckFailed,
    JsonOpt,
    PlanOpt,
    _positive,
    _print_checks,
    out,
    say,
)

# Each command imports what it uses (pydantic + the config models, httpx, Ansible, rich tables):
# `--help` and the light commands start without them (`--help` target <= 0.3 s CPU,
# measured by scripts/bench-controller.py; tests/test_perf.py checks the imports).

app = typer.Typer()


@app.command("port-check")
def port_check(
    port: Annotated[int, typer.Option(help="TCP port the service is about to listen on.")],
    unit: Annotated[str, typer.Option(help="The service unit allowed to hold it, e.g. ddtree-sglang.service.")],
    host: Annotated[str | None, typer.Option(help="IP address the service binds (default: any address).")] = None,
    field_name: Annotated[str | None, typer.Option("--field", help="The inventory field that sets PORT, named in "
                                                   "the fix (e.g. ddtree_server.nccl_port).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Exit 0 when PORT is free or held only by UNIT, 1 (naming the holder) otherwise; run as root."""
    from ..host.ports import check_port

    try:
        result = check_port(port, unit, host=host, field_name=field_name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    _print_checks(
        [{"name": "port", "ok": result.ok, "detail": result.detail}],
        as_json,
        {"holders": [h.__dict__ for h in result.holders]},
    )


@app.command("check-ptxas")
def check_ptxas(
    arch: Annotated[str, typer.Option(help="GPU arch, e.g. sm_103 (assembles .target sm_103a).")],
    ptxas: Annotated[str | None, typer.Option(help="The ptxas binary to check.")] = None,
    python: Annotated[
        str | None,
        typer.Option(
            help="A venv's python: check the ptxas Triton there would use "
            "(honours TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Assemble a tiny PTX (.version of the arch, .target sm_XYZa) with one ptxas (exit 1 if it cannot)."""
    from ..config.toolchain import ARCHS
    from ..host.ptxas import PtxasUsageError, check

    a = ARCHS.get(arch)
    if a is None:
        raise typer.BadParameter(f"--arch {arch!r}: use one of {', '.join(ARCHS)}")
    try:
        result = check(a.target, a.ptx_version, ptxas, python)
    except PtxasUsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    _print_checks(result["checks"], as_json, {"ptxas": result["ptxas"], "triton": result["triton"]})


@app.command("diagnose")
def diagnose_cmd(
    stdin: Annotated[
        str | None, typer.Argument(metavar="[FILE|-]", help="A log file to read (as --file), or '-' for stdin.")
    ] = None,
    unit: Annotated[
        str | None,
        typer.Option("--unit", help="Read this boot's journal of the unit (journalctl -u UNIT -b -o cat) and the "
                     "boot's kernel journal (journalctl -k -b: NVIDIA Xid lines)."),
    ] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Read a log file (its last --max-mib).")] = None,
    plan_file: PlanOpt = None,
    lines: Annotated[
        int | None,
        typer.Option("--lines", show_default=False, help="Examine the last N lines (journalctl -n N). Default: 50000."),
    ] = None,
    max_mib: Annotated[
        int | None, typer.Option("--max-mib", show_default=False, help="Read the last N MiB of input. Default: 16.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Recognise known failures (graph-size mismatch, CUDA graph capture failures, ptxas arch, illegal
    memory access at capture or replay, OOM, NVIDIA Xid errors, missing nvidia_uvm, health/NCCL timeouts,
    port in use, missing device nodes) in a log: one line of cause and fix each. Exit 0 none found, 1
    found, 2 usage."""
    from ..host import diagnose as dg

    lines = dg.DEFAULT_LINES if lines is None else lines  # the defaults live in host/diagnose.py; help repeats them
    max_mib = dg.DEFAULT_MAX_MIB if max_mib is None else max_mib
    given = [x for x in (unit is not None, file is not None, stdin is not None) if x]
    if len(given) != 1:
        raise typer.BadParameter("give exactly one input: --unit NAME, --file PATH, or - (stdin)")
    file_option = "--file"
    if stdin is not None and stdin != "-":  # a path, as grep and journalctl --file take one
        file, stdin, file_option = Path(stdin), None, "FILE"
    if not 1 <= lines <= 10_000_000:
        raise typer.BadParameter(f"--lines {lines}: must be 1..10000000")
    if not 1 <= max_mib <= 1024:
        raise typer.BadParameter(f"--max-mib {max_mib}: must be 1..1024")
    try:
        plan = dg.load_plan(plan_file) if plan_file is not None else None
        if unit is not None:
            data, what = dg.read_journal(unit, lines, max_mib << 20), f"journalctl -u {unit}"
        elif file is not None:
            data, what = dg.read_file(file, max_mib << 20, file_option), "file"
        else:
            data, what = dg.read_stream(sys.stdin.buffer, max_mib << 20), "stdin"
    except dg.DiagnoseError as exc:
        raise typer.BadParameter(str(exc)) from None
    # with --unit, the same boot's kernel messages too: a GPU that failed shows there, not in the unit's journal
    kernel, kernel_note = dg.read_kernel_lines(lines, max_mib << 20) if unit is not None else (None, "")
    text = dg.split_lines(data, lines)
    findings = dg.diagnose(text, plan) + dg.diagnose(kernel or [], plan, origin="kernel")
    doc = dg.report(findings, len(text), what + dg.kernel_source(kernel))
    doc["checks"][-1]["detail"] += kernel_note
    if not text and unit is not None:  # journalctl answers nothing, and exit 0, for an unknown unit or a non-root user
        doc["checks"][0]["detail"] += (
            f"; journalctl had no entries of {unit} in this boot (unit name? run as root or in group systemd-journal)"
        )
    if as_json:
        print(json.dumps(doc, indent=2, allow_nan=False))
    elif findings:
        for f in findings:
            say(out, "FAIL", "red", f.message())
    else:
        say(out, "ok  ", "green", doc["checks"][0]["detail"])
    if findings:
        raise CheckFailed()


@app.command()
def preflight(
    host_class: Annotated[
        str | None,
        typer.Option("--host-class", help="A built-in class (b300, ct200, h200x8, ...: ddtree_ops/config/hosts.py; "
                     "a class of ddtree_host_classes comes with --plan). Default: report which class the machine "
                     "matches."),
    ] = None,
    plan_file: Annotated[
        str | None, typer.Option("--plan", help="The deployment's plan.json: class, toolkit, ports, directories.")
    ] = None,
    nvidia_smi: Annotated[str, typer.Option("--nvidia-smi", help="The nvidia-smi to run.")] = "nvidia-smi",
    skip: Annotated[list[str] | None, typer.Option("--skip", help="Report this check as skipped (repeatable).")] = None,
    nccl_smoke: Annotated[
        bool,
        typer.Option(
            "--nccl-smoke", help="Run an NCCL all-reduce over the visible GPUs (torch needed; skipped without)."
        ),
    ] = False,
    nccl_python: Annotated[
        str, typer.Option("--nccl-python", help="Interpreter with torch for --nccl-smoke.")
    ] = sys.executable,
    nccl_deadline: Annotated[
        float,
        typer.Option(
            "--nccl-deadline",
            help="Total seconds for the smoke test (torch probe + all-reduce); past it the check fails.",
        ),
    ] = 120.0,
    disk_min_free_gib: Annotated[
        float | None, typer.Option("--disk-min-free-gib", help="GiB the disk check needs free (default 20).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Is this machine fit for the host class / deployment? GPUs, links, driver, ptxas, /dev/shm,
    limits, disk, ports (run ON the host; exit 0 fit, 1 a check failed, 2 usage)."""
    from ..host.preflight import PreflightUsageError, disk_bytes, expect_from, load_plan, parse_skip
    from ..host.preflight import preflight as run_preflight

    _positive("--nccl-deadline", nccl_deadline, 3600)
    try:
        exp = expect_from(host_class, load_plan(plan_file) if plan_file else None)
        result = run_preflight(
            exp,
            nvidia_smi,
            parse_skip(skip or []),
            nccl_python if nccl_smoke else None,
            nccl_deadline,
            disk_min_free=disk_bytes(disk_min_free_gib),
        )
    except PreflightUsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not as_json:
        for c in result["checks"]:
            say(out, "ok  " if c["ok"] else "FAIL", "green" if c["ok"] else "red", f"{c['name']}: {c['detail']}")
            if c.get("remediation"):
                say(out, "     fix:", "yellow", c["remediation"])
        if not result["ok"]:
            raise CheckFailed()
        return
    _print_checks(result["checks"], True, {k: v for k, v in result.items() if k not in ("ok", "checks")})
