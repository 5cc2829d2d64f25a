"""The commands against running servers: ``health``, ``warmup``, ``bench``, ``bench-compare``,
``sweep`` (deploys, then benches, each setting), ``probe-sglang`` and the ``exporter``.

Over 600 lines by a few: seven commands kept in one module so ``--help`` lists them in the
order it always has (Typer lists a sub-app's commands together, in definition order)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    DEFAULT_INVENTORY,
    DeployInvOpt,
    InventoryOpt,
    JsonOpt,
    LimitOpt,
    PlanOpt,
    UrlArg,
    VaultOpt,
    _deployed,
    _positive,
    _print_checks,
    _require_valid,
    _target,
    _url,
    err,
    out,
    say,
)

# Each command imports what it uses (pydantic + the config models, httpx, Ansible, rich tables):
# `--help` and the light commands start without them (`--help` target <= 0.3 s CPU,
# measured by scripts/bench-controller.py; tests/test_perf.py checks the imports).

app = typer.Typer()


@app.command()
def health(
    url: UrlArg = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds per probe (>= 3: /health generates a token). Default: ddtree_ops.health_timeout_s, else 5."
        ),
    ] = None,
    failures: Annotated[
        int | None,
        typer.Option(
            help="Consecutive failed probes before a check fails. Default: ddtree_ops.health_failures, else 3."
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between /health probes.")] = 1.0,
    progress_window: Annotated[
        float, typer.Option(help="Seconds between two /metrics samples of the progress check.")
    ] = 2.0,
    sglang_health_timeout: Annotated[
        int | None,
        typer.Option(
            "--sglang-health-timeout",
            help="The server's SGLANG_HEALTH_CHECK_TIMEOUT (s): each /health probe waits past it, one at a time. "
            "Default: the deployed unit's env (--plan), else SGLang's 20.",
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            help="Poll until ready for up to this many seconds, then run the deep checks once (0: one round)."
        ),
    ] = 0.0,
    plan_file: PlanOpt = None,
    inventory: DeployInvOpt = None,
    limit: LimitOpt = None,
    vault: VaultOpt = None,
    warm_marker: Annotated[
        Path | None,
        typer.Option(
            "--warm-marker", help="Check the unit's warm marker (on the host: /run/ddtree-ops/<name>/warm.json)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Liveness, readiness and deep checks (drift from the deployed config, progress).

    Checks (stable names): reachable, ready, warm, drift, progress, accept_length.
    Exit 0 healthy, 1 a check failed, 2 usage or configuration error.
    """
    from ..runtime.health import HealthOptions, bound_s, check_health, pid_alive, wait_ready

    doc, default_url = _deployed(plan_file, inventory, limit, vault)
    target = _target(url, default_url)
    ops = doc.deployment.ops if doc is not None else None
    timeout = _positive("--timeout", timeout if timeout is not None else ops.health_timeout_s if ops else 5.0, 300)
    failures = failures if failures is not None else ops.health_failures if ops else 3
    if not 1 <= failures <= 1000:
        raise typer.BadParameter(f"--failures {failures}: must be 1..1000")
    _positive("--interval", interval, 3600, zero_ok=True)
    _positive("--progress-window", progress_window, 3600)
    _positive("--wait", wait, zero_ok=True)
    if sglang_health_timeout is not None and not 1 <= sglang_health_timeout <= 3600:
        raise typer.BadParameter(f"--sglang-health-timeout {sglang_health_timeout}: must be 1..3600 (seconds, as "
                                 "SGLANG_HEALTH_CHECK_TIMEOUT)")
    o = HealthOptions(timeout=timeout, failures=failures, interval_s=interval, progress_window_s=progress_window,
                      plan_doc=doc, warm_marker=warm_marker,
                      sglang_health_timeout_s=float(sglang_health_timeout) if sglang_health_timeout else None)
    # systemd gives ExecStartPost= its unit's main PID (systemd.exec(5), $MAINPID): stop waiting once it is gone
    main_pid = os.environ.get("MAINPID", "")
    alive = (lambda: pid_alive(int(main_pid))) if main_pid.isdigit() and int(main_pid) > 1 else None
    checks = wait_ready(target, wait, options=o, alive=alive) if wait > 0 else check_health(target, options=o)
    _print_checks([c.as_dict() for c in checks], as_json, {"url": target, "bound_s": round(bound_s(o) + wait, 3)})


@app.command()
def warmup(
    url: UrlArg = None,
    plan_file: PlanOpt = None,
    inventory: DeployInvOpt = None,
    limit: LimitOpt = None,
    vault: VaultOpt = None,
    batch_sizes: Annotated[
        str | None, typer.Option("--batch-sizes", help="Comma-separated batch sizes instead of the plan's.")
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(help="Seconds for the whole warmup. Default: ddtree_ops.warmup_deadline_s, else 600."),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 32,
    long_prompt_words: Annotated[
        int, typer.Option(help="Most words of the long prompt (the server's context length cuts it further).")
    ] = 1024,
    marker: Annotated[
        Path | None, typer.Option("--marker", help="On success, write the report here (the unit's warm marker).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Drive the server through every captured batch size (concurrency = batch size),
    short and long prompts, greedy and sampled, and an image for vision models."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..runtime.warmup import WarmupError, WarmupPlan, warmup_plan, write_marker
    from ..runtime.warmup import warmup as run_warmup

    doc, default_url = _deployed(plan_file, inventory, limit, vault)
    target = _target(url, default_url)
    deadline = _positive("--deadline", deadline if deadline is not None
                         else doc.deployment.ops.warmup_deadline_s if doc is not None else 600.0)
    if not 1 <= max_new_tokens <= 1 << 20:
        raise typer.BadParameter(f"--max-new-tokens {max_new_tokens}: must be 1..{1 << 20}")
    if not 1 <= long_prompt_words <= 1 << 20:
        raise typer.BadParameter(f"--long-prompt-words {long_prompt_words}: must be 1..{1 << 20}")
    wp = warmup_plan(doc) if doc is not None else WarmupPlan([1], "no plan, and the server reports no batch sizes",
                                                               from_server=True)
    if batch_sizes is not None:
        try:
            sizes = sorted({int(x) for x in batch_sizes.split(",")})
        except ValueError:
            raise typer.BadParameter(f"--batch-sizes {batch_sizes!r}: comma-separated integers, e.g. 1,2,4,8") from None
        wp = WarmupPlan(sizes, "--batch-sizes", wp.vision_min_pixels, wp.context_length)
    if not wp.batch_sizes or any(not 1 <= x <= 4096 for x in wp.batch_sizes):
        raise typer.BadParameter(f"batch sizes {wp.batch_sizes}: each must be 1..4096")

    bar = Progress(TextColumn("warmup"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeElapsedColumn(), console=err, disable=as_json, transient=False)
    task = bar.add_task("", total=None)

    def started(final: WarmupPlan, report) -> None:
        bar.update(task, total=len(final.batch_sizes) + (1 if final.vision_min_pixels else 0))
        if not as_json:
            bar.console.print(
                f"batch sizes {final.batch_sizes} ({final.source})"
                + (f"; vision image >= {final.vision_min_pixels} pixels" if final.vision_min_pixels else "")
                + f"; context {report.context_length if report.context_length else 'unknown'} tokens "
                  f"({report.context_source})", highlight=False)

    def progress(r) -> None:
        what = f"bs={r.batch_size}" if r.kind == "text" else "vision"
        bar.update(task, advance=1, description=f"{what} {r.latency_s:.2f} s")
        if not as_json:
            bar.console.print(
                f"{what:<8} {r.latency_s:7.3f} s  {r.completion_tokens:6d} tokens  "
                f"accept_length={r.accept_length if r.accept_length is not None else '-'}"
                + (f" (mean of these {r.requests} requests)" if r.accept_length is not None else ""),
                highlight=False,
            )

    try:
        with bar:
            report = run_warmup(target, wp, deadline, max_new_tokens, progress, long_prompt_words, on_start=started)
    except WarmupError as exc:
        _print_checks([{"name": "warmup", "ok": False, "detail": f"warmup failed: {exc}"}], as_json, {"url": target})
        return
    if marker is not None:
        try:
            write_marker(marker, report)
        except OSError as exc:
            _print_checks([{"name": "warmup", "ok": False, "detail": f"warmed, but cannot write --marker {marker}: "
                            f"{exc.strerror or exc}"}], as_json, {"url": target})
            return
    _print_checks([{"name": "warmup", "ok": True,
                    "detail": f"{len(report.results)} steps ({len(report.batch_sizes)} batch sizes"
                              f"{' + vision' if wp.vision_min_pixels else ''}) in {report.elapsed_s:.2f} s; long "
                              f"prompt {report.long_prompt_bytes} bytes = {report.long_prompt_tokens or '?'} tokens"
                              + (f" after {report.long_prompt_backoffs} cut(s)" if report.long_prompt_backoffs
                                 else "")}],
                  as_json, {"url": target, "report": report.as_dict()})


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"--concurrency {text[:200]!r}: comma-separated integers 1..4096, e.g. 1,8,32"
        ) from None
    if not levels or any(not 1 <= x <= 4096 for x in levels) or len(set(levels)) != len(levels):
        raise typer.BadParameter(f"--concurrency {text[:200]!r}: distinct integers 1..4096, e.g. 1,8,32")
    return levels


@app.command()
def bench(
    url: UrlArg = None,
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for bench.json, levels.csv, requests.csv.")
    ] = Path("bench-results"),
    plan_file: PlanOpt = None,
    inventory: DeployInvOpt = None,
    limit: LimitOpt = None,
    vault: VaultOpt = None,
    api: Annotated[
        str,
        typer.Option(help="generate (SGLang /generate), chat (/v1/chat/completions) or completions (/v1/completions)."),
    ] = "generate",
    concurrency: Annotated[
        str, typer.Option(help="Concurrency levels (requests in flight), comma-separated.")
    ] = "1,8,32",
    requests: Annotated[int | None, typer.Option(help="Requests per level (default 32 unless --duration).")] = None,
    duration: Annotated[
        float | None, typer.Option(help="Seconds per level during which requests start (instead of --requests).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per request (a prompt file's output_len wins).")] = 256,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Sampling top_p.")] = 1.0,
    ignore_eos: Annotated[
        bool,
        typer.Option(
            "--fixed-output/--stop-at-eos", help="Generate exactly --max-new-tokens (ignore_eos), or stop at EOS."
        ),
    ] = True,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='JSONL/JSON prompt file ({"prompt"} or ShareGPT {"conversations"}); default: the shipped set.',
        ),
    ] = None,
    request_timeout: Annotated[float, typer.Option(help="Total seconds per request (deadline, not per read).")] = 600.0,
    warmup_requests: Annotated[int, typer.Option("--warmup", help="Unmeasured requests before the first level.")] = 2,
    model: Annotated[str | None, typer.Option(help="model field of OpenAI requests (default: the server's).")] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="URL of an autoregressive baseline of the same model: benchmarked after URL with the same options; "
                 "--out then gets spec/, baseline/ and report/ (bench-compare).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark one server: TTFT, ITL, E2E, tok/s per request and aggregate, acceptance length
    (meta_info and the server's counters) at each concurrency level; writes JSON + CSV.
    With --baseline URL, the baseline too and the speedup report (as bench-compare).

    The API key (SGLang --api-key), if any, is read from DDTREE_API_KEY and never written.
    Exit 0 all requests answered, 1 some failed (the results are written all the same), 2 usage.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .._core.write import UnsafeOutput, check_out_dir
    from ..runtime.bench import BenchInputError, BenchOptions, bound_s, load_prompts, write_results
    from ..runtime.bench import run as run_bench

    try:  # a --out that cannot be written safely is refused before the benchmark, not after it
        check_out_dir(out_dir)
    except UnsafeOutput as exc:
        raise typer.BadParameter(str(exc)) from None

    doc, default_url = _deployed(plan_file, inventory, limit, vault)
    target = _target(url, default_url)
    opts = BenchOptions(url=target, api=api, concurrency=_concurrency(concurrency),
                        requests=requests if requests is not None or duration is not None else 32,
                        duration_s=duration, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        ignore_eos=ignore_eos, request_timeout_s=request_timeout, warmup_requests=warmup_requests,
                        model=model, api_key=os.environ.get("DDTREE_API_KEY") or None)
    try:
        opts.check()
        prompt_list = load_prompts(prompts)
    except BenchInputError as exc:
        raise typer.BadParameter(str(exc)) from None
    total = len(opts.concurrency) * opts.requests if opts.requests else None
    bar = Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                   TimeElapsedColumn(), console=err, disable=as_json, transient=False)
    task = bar.add_task("", total=total)

    def on_request(r) -> None:
        bar.update(task, advance=1, description=f"c={r.level}" + ("" if r.ok else " (failed)"))

    def on_level(lv) -> None:
        if not as_json:
            acc = lv.accept_length if lv.accept_length is not None else lv.accept_length_server
            itl = lv.itl_s["mean"]
            bar.console.print(f"c={lv.concurrency:<5} {lv.ok}/{lv.requests} ok  {lv.output_tok_s:9.1f} tok/s  "
                              f"TTFT {1000 * (lv.ttft_s['mean'] or 0):8.1f} ms  "
                              f"ITL {'-' if itl is None else f'{1000 * itl:.2f}'} ms  "
                              f"accept_length={'-' if acc is None else f'{acc:.3f}'}", highlight=False)

    recorded = doc.document if doc is not None else None  # the plan.json as written
    runs = [("requests", target, out_dir, recorded)]
    if baseline is not None:
        runs = [("requests", target, out_dir / "spec", recorded),
                ("baseline requests", _url(baseline), out_dir / "baseline", None)]
    bound = round(len(runs) * bound_s(opts), 3)  # each run within bound_s, whatever the servers do
    if not as_json:
        say(err, "bench", "bold", f"at most {bound:g} s (every request and side request has its deadline)")
    checks, extra = [], {"url": target, "bound_s": bound}
    for name, url_, dest, plan_doc in runs:
        o = BenchOptions(**{**opts.__dict__, "url": url_})
        if name != "requests":
            task = bar.add_task("", total=total)  # a bar of its own (on_request reads the newest)
        if not as_json and baseline is not None:
            say(err, "bench", "bold", f"{'baseline' if name != 'requests' else 'speculative'}: {url_}")
        with bar:
            result = run_bench(o, prompt_list, plan_doc, on_request, on_level)
        try:
            files = write_results(dest, result)
        except (OSError, UnsafeOutput) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            _print_checks([{"name": "bench", "ok": False, "detail": f"ran, but cannot write --out {dest}: "
                            f"{why}"}], as_json, {"url": url_})
            return
        failed = result.failed
        total_n = sum(lv.requests for lv in result.levels)
        first = next((e for lv in result.levels for e in lv.errors), "")
        checks.append({"name": name, "ok": not failed, "detail": (
            f"{total_n} requests to {url_} at concurrency {list(opts.concurrency)} in {result.elapsed_s:.1f} s; "
            f"results in {dest}" if not failed else
            f"{failed} of {total_n} requests to {url_} failed (first: {first}); results in {dest}")})
        key = "levels" if name == "requests" else "baseline_levels"
        extra[key] = [{k: v for k, v in vars(lv).items() if k != "itl_samples_s"} for lv in result.levels]
        extra.setdefault("files", []).extend(str(f) for f in files)
    if baseline is not None:
        from ..runtime.bench import load_result
        from ..runtime.bench_report import write_report

        try:
            path, rows = write_report(out_dir / "report", load_result(out_dir / "spec"),
                                      load_result(out_dir / "baseline"))
        except (OSError, UnsafeOutput) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            _print_checks([*checks, {"name": "compare", "ok": False, "detail": f"cannot write the report in "
                                     f"{out_dir / 'report'}: {why}"}], as_json, extra)
            return
        extra["rows"] = rows
        checks.append({"name": "compare", "ok": True, "detail": "speedup " + ", ".join(
            f"c={r['concurrency']} {r['speedup']:.2f}x" if r["speedup"] is not None else f"c={r['concurrency']} -"
            for r in rows) + f"; report in {path}"})
    _print_checks(checks, as_json, extra)


@app.command("bench-compare")
def bench_compare(
    spec: Annotated[Path, typer.Argument(help="bench.json (or its directory) of the speculative deployment.")],
    baseline: Annotated[Path, typer.Argument(help="bench.json (or its directory) of the autoregressive baseline.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for report.md and the PNG plots.")] = Path(
        "bench-report"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Speedup of a speculative run over a baseline run per concurrency level: report.md and
    PNG plots (tok/s and acceptance length vs concurrency, ITL distribution; matplotlib: the report extra)."""
    from .._core.write import UnsafeOutput
    from ..runtime.bench import BenchInputError, load_result
    from ..runtime.bench_report import write_report

    try:
        s, b = load_result(spec), load_result(baseline)
        path, rows = write_report(out_dir, s, b)
    except (BenchInputError, UnsafeOutput) as exc:
        raise typer.BadParameter(str(exc)) from None
    except OSError as exc:
        raise typer.BadParameter(f"{exc.filename or spec}: {exc.strerror or exc}") from None
    if not rows:
        _print_checks([{"name": "compare", "ok": False, "detail": "no concurrency level is in both runs; run both "
                        "with the same --concurrency"}], as_json)
        return
    if not as_json:
        for r in rows:
            sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
            say(
                out,
                f"c={r['concurrency']:<5}",
                "bold",
                f"speedup {sp}  ({r['spec_tok_s']:.1f} vs {r['base_tok_s']:.1f} tok/s)",
            )
    _print_checks([{"name": "compare", "ok": True, "detail": f"{len(rows)} levels; report in {path}"}], as_json,
                  {"rows": rows})


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep file (YAML: host, points and/or grid, urls).")],
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    vault: VaultOpt = None,
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for sweep.json, sweep.md and one result directory per point.")
    ] = Path("sweep-results"),
    api: Annotated[str, typer.Option(help="generate, chat or completions.")] = "generate",
    concurrency: Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")] = "1,8,32",
    requests: Annotated[int, typer.Option(help="Requests per level and point.")] = 32,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 256,
    request_timeout: Annotated[float, typer.Option(help="Total seconds per request.")] = 600.0,
    warmup_requests: Annotated[int, typer.Option("--warmup", help="Unmeasured requests before each point.")] = 4,
    deploy: Annotated[
        Path | None,
        typer.Option(
            "--deploy",
            help="Deploy playbook (deploy.yml): deploy each point without a url to the sweep's host through "
            "Ansible before benchmarking it, and the inventory's own settings after the last.",
        ),
    ] = None,
    deploy_timeout: Annotated[
        float, typer.Option(help="Total seconds for one deploy (its process group is killed after).")
    ] = 3600.0,
    as_json: JsonOpt = False,
) -> None:
    """Validate, render, deploy (--deploy) and benchmark each point of a grid of deployment
    settings, or benchmark endpoints already serving them (url). Invalid points are reported
    and skipped, never deployed; a re-run resumes; sweep.md ranks points by tok/s."""
    from ..config.inventory import load_hostvars
    from ..fleet.sweep import Deployer, SweepError, load_sweep, run_sweep
    from ..runtime.bench import BenchInputError, BenchOptions, load_prompts

    try:
        host, points = load_sweep(spec)
        opts = BenchOptions(
            url="http://127.0.0.1:1",
            api=api,
            concurrency=_concurrency(concurrency),
            requests=requests,
            max_new_tokens=max_new_tokens,
            request_timeout_s=request_timeout,
            warmup_requests=warmup_requests,
            api_key=os.environ.get("DDTREE_API_KEY") or None,
        )
        opts.check()
    except (SweepError, BenchInputError) as exc:
        raise typer.BadParameter(str(exc)) from None
    deployer = None
    if deploy is not None:
        if not deploy.is_file():
            from ..config.errors import shorten

            raise typer.BadParameter(
                f"--deploy {shorten(str(deploy))!r}: not a file; give the deploy playbook, e.g. deploy.yml"
            )
        deployer = Deployer(inventory, deploy, _positive("--deploy-timeout", deploy_timeout), tuple(vault or ()))
    hostvars = load_hostvars(inventory, host, vault or ())
    if host not in hostvars:
        raise typer.BadParameter(f"sweep host {host!r}: not a server host of inventory {inventory!r}")

    def on_point(p) -> None:
        if not as_json:
            say(err, f"{p.status:<9}", "bold", f"{p.name}: {p.detail}")

    from .._core.write import UnsafeOutput

    try:
        done = run_sweep(host, hostvars[host], points, opts, load_prompts(None), out_dir, on_point, deployer)
    except UnsafeOutput as exc:
        raise typer.BadParameter(f"--out: {exc}") from None
    nothing_valid = all(p.status == "invalid" for p in done)  # a sweep that can measure nothing fails
    checks = [
        {"name": f"point {p.name}", "ok": p.status != "failed" and not nothing_valid,
         "detail": f"{p.status}: {p.detail}"} for p in done
    ]
    from ..fleet.sweep import REPORT_FILE

    _print_checks(checks, as_json, {"report": str(out_dir / REPORT_FILE)})


@app.command("probe-sglang")
def probe_sglang(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    limit: LimitOpt = None,
    vault: VaultOpt = None,
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="plan.json rendered for the host (instead of -i/-l).")
    ] = None,
    python: Annotated[
        str | None,
        typer.Option("--python", help="The SGLang venv's python (default: the deployment's sglang_venv/bin/python)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds for the probe.")] = 300.0,
    as_json: JsonOpt = False,
) -> None:
    """Check an installed SGLang build against one deployment: version, speculative
    algorithms (DDTREE?), our rendered argv with the build's own parser, verify-graph sizing."""
    from ..sglang.expect import probe_request, run_probe, validated_from_plan

    _positive("--timeout", timeout, 3600)
    if plan_file is not None:
        from ..config.plandoc_model import load_plan

        v = validated_from_plan(load_plan(plan_file))
    else:
        validated = _require_valid(inventory, limit, vault)
        if len(validated) != 1:
            names = ", ".join(x.deployment.host for x in validated) or "none"
            raise typer.BadParameter(
                f"-l {limit!r} selects {len(validated)} hosts ({names}); the probe checks one "
                "deployment: limit to one host, e.g. -l b300-01"
            )
        v = validated[0]
    interpreter = python or f"{v.deployment.service.sglang_venv_path}/bin/python"
    rc, result = run_probe(interpreter, probe_request(v), timeout)
    if rc == 2:
        if as_json:
            print(json.dumps(result, indent=2, allow_nan=False))
        else:
            for c in result["checks"]:
                say(err, "error:", "red", f"{c['name']}: {c['detail']}")
        raise typer.Exit(2)
    if not as_json:
        say(err, "info:", "cyan", f"plugin: {result.get('plugin', {}).get('summary', 'unknown')}")
    _print_checks(
        result["checks"],
        as_json,
        {k: val for k, val in result.items() if k not in ("ok", "checks")} | {"host": v.deployment.host},
    )


@app.command()
def exporter(
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="The host's plan.json (labels, sizes, floor, drift).")
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(help="SGLang base URL (default: plan.json's url). Alone, without --plan: labels from the "
                     "server's /server_info, no floor or drift series."),
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="HOST:PORT to serve /metrics on (default: 0.0.0.0:<ddtree_ops.exporter_port>).")
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between upstream polls.")] = 5.0,
    window: Annotated[float, typer.Option(help="Seconds of the acceptance-length window.")] = 60.0,
    timeout: Annotated[float, typer.Option(help="Total seconds per upstream request (deadline, not per read).")] = 3.0,
    stuck_after: Annotated[
        float | None,
        typer.Option(
            "--stuck-after",
            help="Seconds of busy polls with frozen progress counters before ddtree_scheduler_stuck is 1 (default: "
            "--window).",
        ),
    ] = None,
) -> None:
    """Serve ddtree_* metrics (acceptance length, up/ready/drift) for one SGLang server
    (give --plan, --upstream, or both)."""
    import signal
    import threading

    from ..config.plandoc_model import load_plan
    from ..runtime.exporter import Exporter, serve

    _positive("--poll-interval", poll_interval, 3600)
    _positive("--window", window)
    _positive("--timeout", timeout, 300)
    if stuck_after is not None:
        _positive("--stuck-after", stuck_after)
    if plan_file is None and upstream is None:
        raise typer.BadParameter("give --plan (the host's plan.json), --upstream URL (any SGLang server), or both")
    doc = load_plan(plan_file) if plan_file is not None else None
    if upstream is not None:
        upstream = _url(upstream)
    if listen is None:
        if doc is None:
            raise typer.BadParameter("--listen HOST:PORT is needed without --plan (the plan names the exporter port)")
        listen = f"0.0.0.0:{doc.deployment.ops.exporter_port}"
    host, _, port_s = listen.rpartition(":")
    if not host or not port_s.isascii() or not port_s.isdigit() or not 0 <= int(port_s) < 65536:
        raise typer.BadParameter(f"--listen {listen!r}: give HOST:PORT, e.g. 0.0.0.0:19400")
    exp = Exporter(
        doc,
        upstream=upstream,
        poll_interval_s=poll_interval,
        window_s=window,
        timeout_s=timeout,
        stuck_after_s=stuck_after,
        plan_path=plan_file,
    )
    try:
        server, _thread = serve(exp, host.strip("[]"), int(port_s))
    except OSError as exc:
        raise typer.BadParameter(f"--listen {listen}: cannot bind: {exc.strerror or exc}") from None
    exp.start()
    say(err, "exporter", "green", f"serving http://{host}:{server.server_port}/metrics for {exp.upstream}")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    exp.stop(join_timeout=exp.poll_bound_s + 1)
    server.shutdown()
