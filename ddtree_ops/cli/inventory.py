"""``ddtree-ops validate``, ``plan`` and ``render``: the controller's commands over an inventory
(inventory -> Validated -> plan -> rendered files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from .common import (
    DEFAULT_INVENTORY,
    HubOpt,
    InventoryOpt,
    JsonOpt,
    LimitOpt,
    VaultOpt,
    _require_valid,
    _validate_all,
    err,
    out,
    say,
)

# Each command imports what it uses (pydantic + the config models, httpx, Ansible, rich tables):
# `--help` and the light commands start without them (`--help` target <= 0.3 s CPU,
# measured by scripts/bench-controller.py; tests/test_perf.py checks the imports).

app = typer.Typer()


@app.command()
def validate(inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None, as_json: JsonOpt = False,
             vault: VaultOpt = None, hub: HubOpt = False) -> None:
    """Validate every server host of an inventory (exit 2 on any error)."""
    from ..config.errors import show_host

    ok, errors = _validate_all(inventory, limit, vault, hub)
    warnings = [w for v in ok for w in v.warnings if w.level == "warning"]
    infos = [w for v in ok for w in v.warnings if w.level == "info"]
    # one check per host: a host that passed alone but clashes with another instance of its machine
    # (config/fleet.py) is not valid, so it is not also reported "ok"
    failed: dict[str, list[str]] = {}
    for f in errors:
        failed.setdefault(f"config:{show_host(f.host) or f.field}", []).append(f.message())
    passed = [v for v in ok if f"config:{show_host(v.deployment.host)}" not in failed]
    checks = [{"name": f"config:{v.deployment.host}", "ok": True, "detail": "valid"} for v in passed]
    checks += [{"name": name, "ok": False, "detail": "; ".join(lines)} for name, lines in failed.items()]
    if as_json:
        print(json.dumps({"ok": not errors, "checks": checks, "warnings": [w.as_dict() for w in warnings],
                          "info": [i.as_dict() for i in infos], "errors": [f.as_dict() for f in errors]}, indent=2,
                              allow_nan=False))
    else:
        for v in passed:
            say(out, "ok  ", "green", v.deployment.host)
        from ..config.shared import collapsed_lines  # one line per finding many hosts share

        for line in collapsed_lines(warnings):
            say(out, "warn", "yellow", line)
        for line in collapsed_lines(infos):
            say(out, "info", "cyan", line)
        for f in errors:
            say(err, "error", "red", f.message())
    if errors:
        raise typer.Exit(2)


def _model_config(option: str, path: str | None) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a model's ``config.json``; read as the checkpoint reader reads
    one: :func:`ddtree_ops.config.checkpoint.parse_json_object`), or a one-line BadParameter."""
    from ..config.checkpoint import parse_json_object, read_bounded
    from ..config.errors import shorten

    if path is None:
        return None
    try:  # bounded, strict, regular file only (CheckpointFileError is a ValueError)
        doc = parse_json_object(read_bounded(path), "config.json")
        if not isinstance(doc.get("architectures", []), list):
            raise ValueError("not a JSON object with an 'architectures' list")
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise typer.BadParameter(f"{option} {shorten(str(path))}: {shorten(why)}; give the model's "
                                 "config.json (Hugging Face checkpoint)") from None
    return doc


@app.command()
def plan(inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None, as_json: JsonOpt = False,
         vault: VaultOpt = None, hub: HubOpt = False,
         resolve_with: Annotated[str | None, typer.Option(
             "--resolve-with", help="Python of a venv holding the pinned SGLang: run SGLang's own server-args "
             "resolution (0.5.23: resolve_once) on each host's argv and show every setting it rewrites.")] = None,
         model_config: Annotated[str | None, typer.Option(
             "--model-config", help="With --resolve-with: the target's config.json (used for every selected host; "
             "default: the model path's own, if it is a local directory or in the Hugging Face cache).")] = None,
         draft_config: Annotated[str | None, typer.Option(
             "--draft-config", help="With --resolve-with: the draft's config.json.")] = None,
         resolve_timeout: Annotated[float, typer.Option(
             "--resolve-timeout", min=5, max=600, help="Seconds for each host's resolution, all included.")] = 180.0,
         ) -> None:
    """Show what each host will run: sizes per request, capture list, graph token maxima, and the
    per-GPU memory estimate from the checkpoints' configs (when read).

    With ``--resolve-with``, the pinned SGLang build resolves each host's argv
    (:mod:`ddtree_ops.sglang.resolve`) and every setting it changes against the plan is
    listed; exit 1 if SGLang refuses a host's arguments (its own message is shown) or the
    resolution does not run (the interpreter hangs, floods, fails, prints no result, lacks
    SGLang, ...), except where SGLang's own resolver cannot run without a GPU
    (:func:`ddtree_ops.sglang.resolve.passes`).
    """
    from rich.table import Table

    if (model_config or draft_config) and not resolve_with:
        raise typer.BadParameter("--model-config/--draft-config need --resolve-with PYTHON")
    models = {k: c for k, c in (("target", _model_config("--model-config", model_config)),
                                ("draft", _model_config("--draft-config", draft_config))) if c is not None}
    validated = _require_valid(inventory, limit, vault, hub)
    resolutions: dict[str, dict[str, Any]] = {}
    if resolve_with:
        from ..sglang.resolve import (
            DETAIL_MAX,
            diff_plan,
            passes,
            planned_values,
            request_for,
            run_resolution,
            shown,
            summary,
        )

        for v in validated:
            res = run_resolution(resolve_with, request_for(v, models), deadline_s=resolve_timeout)
            changes = [shown(c, DETAIL_MAX) for c in diff_plan(planned_values(v.plan), res)] \
                if res.get("state") == "resolved" else []
            pin = v.deployment.sglang.base_version
            if res.get("version") and res["version"] != pin:
                changes.insert(0, f"{shown(resolve_with)} holds SGLang {res['version']}, but the pin says {pin}: "
                                  "these rewrites are that build's")
            resolutions[v.deployment.host] = {"state": res.get("state"), "version": res.get("version"),
                                              "detail": summary(res), "changes": changes,
                                              "resolved": res.get("resolved"), "ok": passes(res)}
    refused = [h for h, r in resolutions.items() if not r["ok"]]  # refused, failed, or not run for a fixable reason
    if as_json:
        checks = [{"name": f"config:{v.deployment.host}", "ok": True, "detail": "valid"} for v in validated]
        checks += [{"name": f"sglang-resolution:{h}", "ok": r["ok"], "detail": r["detail"]}
                   for h, r in resolutions.items()]
        print(json.dumps({"ok": not refused, "checks": checks,
                          "hosts": {v.deployment.host: {"host_class": v.deployment.host_class, **v.plan.as_dict(),
                                                        **({"sglang_resolution": resolutions[v.deployment.host]}
                                                           if v.deployment.host in resolutions else {})}
                                    for v in validated}}, indent=2, allow_nan=False))
        if refused:
            raise typer.Exit(1)
        return
    for v in validated:
        d, p = v.deployment, v.plan
        t = Table(title=f"{d.host} ({d.host_class}) — {d.service.unit_name}", show_header=False, title_justify="left")
        t.add_column("field", style="bold")
        t.add_column("value")
        rows: list[tuple[str, Any]] = [
            ("model", d.model.path),
            (
                "sglang",
                f"{d.sglang.base_version} "
                f"({d.sglang.source}{', ' + d.sglang.ddtree_source if d.sglang.ddtree_source else ''})",
            ),
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
        rows += [(f"{k} (derived)", f"{v['value']} (derived by {v['source']}; {v['why']})")
                 for k, v in p.derived.items()]
        # a value the checkpoints decide (block_size from the draft's config.json) replaces its row, with its
        # source, rather than a second row of the same name; a checkpoint not read says why (validate's reason)
        extra = _checkpoint_rows(p.checkpoint, {w.field: w.rule for w in v.warnings if w.level == "info"})
        names = {k for k, _ in rows}
        shown = dict(extra)
        rows = [(k, shown.get(k, val)) for k, val in rows] + [(k, val) for k, val in extra if k not in names]
        for k, val in rows:
            t.add_row(k, Text("-" if val is None else str(val)))
        for w in p.warnings:
            t.add_row(Text("warning", style="yellow"), Text(w))
        r = resolutions.get(d.host)
        if r:
            t.add_row(Text("sglang resolution", style="bold" if r["ok"] else "red"), Text(r["detail"]))
            for c in r["changes"]:
                t.add_row(Text("rewrite", style="yellow"), Text(c))
        out.print(t)
    if refused:
        raise typer.Exit(1)


def _checkpoint_rows(ck: dict, info: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    """Plan rows for the checkpoint facts: each derived value with its source, each checkpoint's
    read status (why not, from ``info``: the info findings' rules by field, as validate prints them;
    plan.json keeps no reason, so it stays the same wherever it is rendered), the memory estimate
    (GiB per GPU) and its error bound."""
    from ..config.checkpoint import CheckpointFacts

    rows: list[tuple[str, Any]] = []
    for name, v in ck.get("derived", {}).items():
        rows.append((name.split(".", 1)[1], f"{v['value']} (from {v['source']})"))
    for role, st in ck.get("checkpoints", {}).items():
        if st.get("read"):
            rows.append((f"{role} checkpoint", f"read ({st['read']})"))
            continue
        why = (info or {}).get(CheckpointFacts(role, "").field, "")
        why = why.removeprefix("checkpoint config not read: ") or "see ddtree-ops validate"
        rows.append((f"{role} checkpoint", f"not read: {why}"))
    mem = ck.get("memory") or {}
    gib = mem.get("gib", {})
    for key, label in (("weights_per_gpu", "weights/GPU"), ("kv_needed", "KV needed/GPU"),
                       ("graph_bound", "graph buffers/GPU (rough)"), ("budget", "mem_fraction_static budget")):
        if key in gib:
            extra = f" ({mem['kv_for']})" if key == "kv_needed" else ""
            rows.append((label, f"{gib[key]} GiB{extra}"))
    if "error_bound" in mem:
        rows.append(("estimate error", mem["error_bound"]))
    return rows


@app.command()
def render(out_dir: Annotated[str, typer.Option("--out", "-o", help="Directory to write into.")],
           inventory: InventoryOpt = DEFAULT_INVENTORY, limit: LimitOpt = None, vault: VaultOpt = None,
           hub: HubOpt = False) -> None:
    """Write each host's files under OUT/<host>/<absolute path>, and OUT/prometheus/ (prometheus.yml,
    alert rules, Grafana dashboard).

    Nothing is written unless every host validates. Files are written only under OUT, each
    atomically with its final mode and never through a symlink (:mod:`ddtree_ops._core.write`);
    a directory on the way (OUT and each level below it) that is not ours or is writable by
    group/others is refused before the first write, and created directories are 0755.
    """
    from .._core.write import OpenDirs, UnsafeOutput, check_out_dir, check_targets, write_under
    from ..render import render_host, render_prometheus

    if not str(out_dir).strip():  # a str option: Path("") would be "." (the current directory)
        raise typer.BadParameter("--out must name a directory")
    out_dir = Path(out_dir)
    try:
        check_out_dir(out_dir)
    except UnsafeOutput as exc:
        raise typer.BadParameter(str(exc)) from None
    validated = _require_valid(inventory, limit, vault, hub)
    writes = [(f"{v.deployment.host}/{f.path.lstrip('/')}", f.content, int(f.mode, 8), f.secret)
              for v in validated for f in render_host(v)]
    from ..render.monitoring import (
        DASHBOARD_FILE,
        PROMETHEUS_CONFIG_DIR,
        RULES_FILE,
        monitoring_paths,
        render_dashboard,
        render_rules,
    )

    routers: list = []
    if not limit:  # the routers' files (config/router.py); an inventory without group routers has none
        from ..config.router import load_router_vars, validate_routers, worker_url
        from ..render.router import render_router

        routers = validate_routers(load_router_vars(inventory, vault or ()), validated)[0]
        for r in routers:
            writes += [(f"{r.host}/{f.path.lstrip('/')}", f.content, int(f.mode, 8), f.secret)
                       for f in render_router(r)]
        from ..render.router import render_join

        for v in validated:  # each warm instance registers itself at the routers in front of it
            mine = [r for r in routers if any(w == worker_url(v) for w in r.workers)]
            writes += [(f"{v.deployment.host}/{f.path.lstrip('/')}", f.content, int(f.mode, 8), f.secret)
                       for f in render_join(v, mine)]
    rules_path = monitoring_paths(PROMETHEUS_CONFIG_DIR)["rules_path"]
    writes.append(("prometheus/prometheus.yml", render_prometheus(validated, rule_files=[rules_path], routers=routers),
                   0o644, False))
    writes.append((f"prometheus/{RULES_FILE}", render_rules(validated=validated), 0o644, False))
    writes.append((f"prometheus/{DASHBOARD_FILE}", render_dashboard(validated), 0o644, False))
    try:
        check_targets(out_dir, [rel for rel, *_ in writes])  # every directory on the way, before the first write
    except UnsafeOutput as exc:
        raise typer.BadParameter(str(exc)) from None
    with OpenDirs() as dirs:
        for rel, content, mode, secret in writes:
            try:
                target = write_under(out_dir, rel, content, mode, dirs)
            except UnsafeOutput as exc:
                raise typer.BadParameter(f"--out {out_dir}: {exc}") from None
            except OSError as exc:
                raise typer.BadParameter(f"--out {out_dir}: cannot write {rel}: {exc.strerror or exc}") from None
            say(out, "wrote", "", f"{target}{' (secret, 0600)' if secret else ''}")
    from ..render.release import build_release

    for v in validated:  # the same id the deploy play installs under (ddtree_render's `release`)
        say(out, "release", "bold", f"{v.deployment.host}: {build_release(v).id}")
