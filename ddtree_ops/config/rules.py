"""Deployment rules. Each is one function ``(Deployment, Plan) -> Iterable[Finding]``.

Rule ids (the ``rule`` named in :class:`~.models.RiskAcceptance` for the one that can be
overridden) are the function names without ``rule_``, dashes for underscores.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from .build_rules import rule_attention_backends, rule_build_driver_floor, rule_extra_args, rule_sglang_env
from .derived import MODEL_OVERRIDES
from .env_dirs import rule_env_dirs
from .errors import Finding
from .instance import MULTIPROC_ENV, VISIBLE_ENV, GpuSetError, gpu_count_needed, rank_gpus, visible_gpus
from .memory_reserve import rule_memory_reserve
from .models import Deployment
from .multinode import rule_multinode
from .plan import EAGLE_SIZED, SPEC_DEFAULT_MAX_RUNNING_REQUESTS, Plan
from .sandbox import rule_sandbox_paths, rule_service_not_root
from .scrape import rule_sglang_scrape
from .service_models import NCCL_PORT_OFFSET
from .sglang_compat import rule_algorithm_in_release, rule_extra_args_parse, rule_speculation_compat
from .toolchain import ARCHS, CUDA_TOOLKITS, at_least, default_cuda, version_key
from .versions import DDTREE_SOURCES, KNOWN_ISSUES

Rule = Callable[[Deployment, Plan], Iterable[Finding]]
SPEC = "ddtree_speculative"
SRV = "ddtree_server"
MODEL = "ddtree_model"

INSTANCE_SOURCE = "SGLang --base-gpu-id / --tp-size; CUDA_VISIBLE_DEVICES (CUDA C Programming Guide)"

SM103_RISK = "sm103-ddtree-graph-capture"
SM103_MAX_CAPTURED_BUDGET = 8
OVERRIDABLE_RULES = frozenset({SM103_RISK})
SM103_ARCHS = frozenset(i.arch for i in KNOWN_ISSUES if i.rule == SM103_RISK)
"""The archs the known issue is recorded for (:data:`~.versions.KNOWN_ISSUES`): the host class's
``arch`` field decides, whatever the class is called."""


def _err(field: str, value, rule: str, fix: str, source: str = "") -> Finding:
    return Finding("error", field, value, rule, fix, source)


def _warn(field: str, value, rule: str, fix: str, source: str = "") -> Finding:
    return Finding("warning", field, value, rule, fix, source)


HOST_CLASS_SOURCE = "ddtree_ops/config/hosts.py (the host-class table)"


def rule_host_class(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Every ``ddtree_host_classes`` entry resolves to a complete, consistent class
    (:func:`~.hosts.resolve_host_classes`), and the host's class is in the table."""
    refused = set()
    for e in d.host_class_problems:
        refused.add(e.field.split(".")[1] if e.field.count(".") else "")
        yield _err(e.field, e.value, e.rule, e.fix, HOST_CLASS_SOURCE)
    table = d.host_class_table
    if d.host_class not in table and d.host_class not in refused:
        yield _err("ddtree_host_class", d.host_class, "unknown host class",
                   f"use one of {', '.join(sorted(table))}, or add it to ddtree_host_classes "
                   "(docs/configuration.md, 'Host classes')")


def rule_draft_model(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Speculative algorithms need a draft model, except NGRAM, which drafts from the request's
    own tokens and has none (``_handle_ngram`` of ``sglang/srt/arg_groups/speculative_hook.py``
    never reads ``--speculative-draft-model-path``); DFlash/DDTree need a block size."""
    s = d.speculative
    if s.algorithm == "NGRAM":
        if s.draft_model_path or s.draft_model_revision:
            yield _err(f"{SPEC}.draft_model_path", s.draft_model_path,
                       "NGRAM drafts from n-grams of the request itself and loads no draft model",
                       "remove draft_model_path / draft_model_revision (or pick a draft-model algorithm)",
                       "sglang/srt/arg_groups/speculative_hook.py _handle_ngram")
    elif s.enabled and not s.draft_model_path:
        yield _err(f"{SPEC}.draft_model_path", None, f"{s.algorithm} needs a draft model",
                   "set the draft checkpoint (HF id or path)" + (
                       "; a target that bundles its DSpark draft takes its own path" if s.algorithm == "DSPARK"
                       else ""))
    if s.algorithm in ("DFLASH", "DDTREE") and (s.block_size is None or s.block_size < 2):
        yield _err(
            f"{SPEC}.block_size",
            s.block_size,
            f"{s.algorithm} needs block_size >= 2 (tokens the draft proposes per request)",
            "set it to the block size the DFlash draft was trained with, e.g. 8 or 16 (or let ddtree-ops read "
            "it from the draft's config.json: a local path, --hub, or deploy.yml on the host)",
        )
    if s.algorithm in EAGLE_SIZED:
        for name in ("num_steps", "topk"):
            if getattr(s, name) is None or getattr(s, name) < 1:
                yield _err(f"{SPEC}.{name}", getattr(s, name), f"{s.algorithm} needs {name} >= 1",
                           "set it explicitly so the plan matches what SGLang runs")
        if s.topk not in (None, 1) and (s.num_draft_tokens is None or s.num_draft_tokens < 2):
            yield _err(
                f"{SPEC}.num_draft_tokens",
                s.num_draft_tokens,
                f"{s.algorithm} with topk > 1 needs num_draft_tokens >= 2",
                "set num_draft_tokens (tree size verified per request)",
            )


def rule_ddtree_sizes(d: Deployment, p: Plan) -> Iterator[Finding]:
    """DDTree: budget >= 1; verify graphs use budget + 1, draft graphs block_size."""
    s = d.speculative
    if s.algorithm != "DDTREE":
        if s.budget is not None:
            yield _err(f"{SPEC}.budget", s.budget, "budget only applies to algorithm DDTREE",
                       "remove it or set algorithm: DDTREE")
        return
    if s.budget is not None and s.budget < 1:
        yield _err(f"{SPEC}.budget", s.budget, "the DDTree node budget must be >= 1",
                   "use e.g. 32 (full tree) or block_size - 1 (plain chain)")
        return
    if s.verify_tokens_per_req is not None and s.verify_tokens_per_req != p.verify_tokens_per_req:
        yield _err(
            f"{SPEC}.verify_tokens_per_req",
            s.verify_tokens_per_req,
            f"DDTree target-verify graphs run over budget + 1 = {p.verify_tokens_per_req} tokens per request, "
            f"not block_size; sizing them otherwise crashes with 'The size of tensor a ({s.verify_tokens_per_req}) "
            f"must match the size of tensor b ({p.verify_tokens_per_req})'",
            "remove verify_tokens_per_req (it is derived) or set it to budget + 1",
            "sgl-project/sglang#29907",
        )
    if s.draft_tokens_per_req is not None and s.draft_tokens_per_req != p.draft_tokens_per_req:
        yield _err(f"{SPEC}.draft_tokens_per_req", s.draft_tokens_per_req,
                   f"draft graphs run over block_size = {p.draft_tokens_per_req} tokens per request",
                   "remove draft_tokens_per_req (it is derived) or set it to block_size")


def rule_declared_sizes(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Declared per-request sizes of non-DDTree algorithms match the derived ones."""
    s = d.speculative
    if s.algorithm == "DDTREE":
        return
    for name in ("draft_tokens_per_req", "verify_tokens_per_req"):
        given = getattr(s, name)
        if given is not None and given != getattr(p, name):
            yield _err(f"{SPEC}.{name}", given, f"{s.algorithm} runs {getattr(p, name)} tokens per request here",
                       "remove it (it is derived)")


def rule_full_tree(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Full-tree DDTree (budget > block_size - 1) needs triton attention and page_size 1."""
    if not p.full_tree:
        return
    srv = d.server
    src = "DDTree worker: tree-verify attention mask"
    if srv.attention_backend not in (None, "triton"):
        yield _err(
            f"{SRV}.attention_backend",
            srv.attention_backend,
            f"full-tree DDTree (budget {p.budget} > block_size - 1 = {p.block_size - 1}) needs the triton attention "
            f"backend",
            "set attention_backend: triton (or remove it), or lower budget to block_size - 1",
            src,
        )
    if srv.page_size not in (None, 1):
        yield _err(f"{SRV}.page_size", srv.page_size, "full-tree DDTree needs page_size 1",
                   "set page_size: 1 (or remove it)", src)
    derived = [n for n, v in (("attention_backend", srv.attention_backend), ("page_size", srv.page_size)) if v is None]
    if derived:
        yield _warn(
            f"{SRV}",
            None,
            f"full-tree DDTree: derived {', '.join(derived)} (triton / 1) and overlap scheduling off",
            "set them explicitly to silence this",
        )


def rule_draft_window(d: Deployment, p: Plan) -> Iterator[Finding]:
    """``--speculative-draft-window-size`` must be >= block size (SGLang server_args)."""
    s = d.speculative
    if s.draft_window_size is not None and p.block_size is not None and s.draft_window_size < p.block_size:
        yield _err(f"{SPEC}.draft_window_size", s.draft_window_size, f"must be >= block_size ({p.block_size})",
                   f"set it to at least {p.block_size} or remove it", "sglang/srt/server_args.py")


def _sglang_plugin_whitelist(d: Deployment) -> set[str]:
    """Plugins SGLang will load: every installed one, unless ``SGLANG_PLUGINS`` (a
    comma-separated whitelist read by ``sglang.srt.plugins.load_plugins``) names a subset."""
    if not d.service.env.get("SGLANG_PLUGINS", "").strip():   # unset or empty: no whitelist
        return {"ddtree_ops_verify_graph"}
    return {x.strip() for x in d.service.env["SGLANG_PLUGINS"].split(",") if x.strip()}


def rule_ddtree_build(d: Deployment, p: Plan) -> Iterator[Finding]:
    """DDTree is in no release: the pin must name a DDTree source. With graphs on, a source
    that sizes target-verify graphs from block_size (sglang-pr-27509) runs only with the
    ddtree-ops SGLang plugin, which the simulator cannot load (refused there)."""
    pin = d.sglang
    if pin.ddtree_source and pin.version and pin.version != DDTREE_SOURCES[pin.ddtree_source].base_version:
        yield _err("ddtree_sglang.version", pin.version,
                   f"{pin.ddtree_source} is built on SGLang {DDTREE_SOURCES[pin.ddtree_source].base_version}",
                   "remove version (the DDTree source fixes it) or set it to that base version")
    if d.speculative.algorithm != "DDTREE":
        return
    if pin.ddtree_source is None:
        yield _err("ddtree_sglang.ddtree_source", None,
                   "DDTree is in no SGLang release; the pin must name the DDTree source it is built from",
                   f"set ddtree_source to one of {', '.join(sorted(DDTREE_SOURCES))}")
        return
    if pin.source == "simulator" and pin.simulated_build == "release":
        yield _err("ddtree_sglang.simulated_build", "release", "a release build does not know DDTREE",
                   "use simulated_build: ddtree")
    src = DDTREE_SOURCES[pin.ddtree_source]
    if p.cuda_graphs and not src.sizes_verify_at_budget_plus_one and p.verify_tokens_per_req != p.block_size:
        crash = (f"this build sizes target-verify graphs from block_size ({p.block_size}) but DDTree verifies "
                 f"budget + 1 = {p.verify_tokens_per_req} tokens per request: unguarded, the first verify crashes with "
                 f"'The size of tensor a ({p.block_size}) must match the size of tensor b ({p.verify_tokens_per_req})'")
        if pin.source == "simulator":
            # The simulator loads no SGLang plugins: nothing would correct the width.
            yield _err("ddtree_sglang.ddtree_source", pin.ddtree_source, crash,
                       "pin sglang-pr-29907 (DFlashWorkerV2, sized correctly), or set ddtree_server.cuda_graph: false",
                       src.reference)
        elif "ddtree_ops_verify_graph" not in _sglang_plugin_whitelist(d):
            yield _err("ddtree_service.env.SGLANG_PLUGINS", d.service.env["SGLANG_PLUGINS"],
                       crash + "; SGLANG_PLUGINS (SGLang's plugin whitelist) leaves out the ddtree-ops plugin "
                       "that would resize them",
                       "add ddtree_ops_verify_graph to SGLANG_PLUGINS (comma-separated), or remove the variable",
                       src.reference)
        else:
            yield _warn("ddtree_sglang.ddtree_source", pin.ddtree_source,
                        crash + "; the ddtree-ops SGLang plugin (installed into the SGLang venv by the sglang role, "
                        "ddtree_ops/sglang/plugin.py) resizes them to budget + 1, and the capability probe stops the "
                        "deploy if the plugin is missing",
                        "nothing, if the sglang role installs this build; or pin sglang-pr-29907, "
                        "or set ddtree_server.cuda_graph: false", src.reference)


def rule_capture_plan(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Every batch a verify or draft step can take is captured (graphs on), so nothing
    silently falls back to eager: an explicit capture maximum, or the one the pinned release
    derives when it is unset (per GPU-memory bucket and tp_size: :func:`~.derived.derive`,
    ``_handle_gpu_memory_settings`` of ``sglang/srt/server_args.py`` / ``arg_groups/memory_hook.py``)."""
    srv = d.server
    if not p.cuda_graphs:
        return
    if srv.cuda_graph_bs and srv.cuda_graph_max_bs is not None and srv.cuda_graph_max_bs != srv.cuda_graph_bs[-1]:
        yield _err(f"{SRV}.cuda_graph_max_bs", srv.cuda_graph_max_bs,
                   f"disagrees with the largest size of cuda_graph_bs ({srv.cuda_graph_bs[-1]})",
                   "remove one of them or make them agree")
    if p.max_running_requests is None:
        if srv.cuda_graph_max_bs is None and not srv.cuda_graph_bs:
            dv = p.derived.get("cuda_graph_max_bs")
            how = f" (SGLang {d.sglang.base_version} captures up to {dv['value']} for {dv['why']})" if dv else ""
            yield _warn(
                f"{SRV}.max_running_requests",
                None,
                f"without max_running_requests or cuda_graph_max_bs, SGLang picks both from GPU memory{how} and the "
                "plan cannot prove every batch is captured",
                "set max_running_requests",
                dv["source"] if dv else "",
            )
        return
    if p.cuda_graph_max_bs is not None and p.cuda_graph_max_bs < p.max_running_requests:
        field = "cuda_graph_bs" if srv.cuda_graph_bs else "cuda_graph_max_bs"
        dv = p.derived.get("cuda_graph_max_bs") if getattr(srv, field) is None else None
        how = (f" (unset: SGLang {d.sglang.base_version} derives {dv['value']} for {dv['why']})" if dv else "")
        yield _err(
            f"{SRV}.{field}",
            getattr(srv, field),
            f"batches of {p.cuda_graph_max_bs + 1}..{p.max_running_requests} running requests are not captured{how} "
            "and would silently run eagerly",
            f"set cuda_graph_max_bs to max_running_requests ({p.max_running_requests}), lower max_running_requests, "
            "or set cuda_graph: false",
            dv["source"] if dv else "",
        )


def rule_sm103_tree_capture(d: Deployment, p: Plan) -> Iterator[Finding]:
    """sm_103: tree-verify graph capture with budget > 8 has hit illegal memory accesses."""
    hc = _host_class(d)
    if not (hc and hc.arch in SM103_ARCHS and p.algorithm == "DDTREE"):
        return
    if not p.cuda_graphs:
        if p.budget is not None and p.budget > SM103_MAX_CAPTURED_BUDGET:
            yield _warn(f"{SRV}.cuda_graph", False,
                        f"on sm_103 DDTree budget {p.budget} runs eagerly (CUDA graphs measured ~3.8x faster on b300)",
                        f"keep it eager, lower budget to {SM103_MAX_CAPTURED_BUDGET} to capture graphs, or record "
                        f"the risk {SM103_RISK} once a pinned build captures safely",
                        "field reports of DDTree on 8x B300 (sm_103); no upstream issue filed")
        return
    if p.budget is not None and p.budget > SM103_MAX_CAPTURED_BUDGET and d.risk_reason(SM103_RISK) is None:
        yield _err(
            f"{SPEC}.budget",
            p.budget,
            f"on sm_103 ({hc.name}) DDTree tree-verify CUDA-graph capture with budget > {SM103_MAX_CAPTURED_BUDGET} "
            "has hit illegal memory accesses",
            f"set ddtree_server.cuda_graph: false (eager), lower budget to {SM103_MAX_CAPTURED_BUDGET}, or record "
            f"ddtree_accepted_risks: [{{rule: {SM103_RISK}, reason: '...'}}]",
            "field reports of DDTree on 8x B300 (sm_103); no upstream issue filed",
        )


def rule_tp_fits(d: Deployment, p: Plan) -> Iterator[Finding]:
    """The instance's ranks (tp_size x dp_size, x ``--pp-size``; DP attention shares the TP GPUs:
    :func:`~.instance.rank_gpus`) fit the host's GPUs, and tp_size divides them."""
    hc = _host_class(d)
    if not hc:
        return
    try:
        gpus = len(rank_gpus(d))
    except GpuSetError:
        return  # rule_gpu_set names the bad flag
    n = d.server.nnodes
    tp_here = max(1, d.server.tp_size // n)
    if n > 1:
        if gpus > hc.gpu_count or hc.gpu_count % tp_here:
            yield _err(f"{SRV}.tp_size", d.server.tp_size,
                       f"each of the {n} nodes runs tp_size / nnodes = {tp_here} TP ranks ({gpus} GPUs with pp_size), "
                       f"which must fit the {hc.gpu_count} GPUs of a {hc.name} host and divide {hc.gpu_count}",
                       f"use tp_size = {n} x (1, 2, 4 or {hc.gpu_count}), e.g. {n * hc.gpu_count}",
                       "sglang/srt/entrypoints/engine.py _launch_subprocesses (tp_size_per_node)")
        return
    if gpus > hc.gpu_count or hc.gpu_count % d.server.tp_size:
        yield _err(
            f"{SRV}.tp_size",
            d.server.tp_size,
            f"the instance's {gpus} GPUs (tp_size x "
            f"dp_size{' x pp_size' if gpus != d.server.tp_size * d.server.dp_size else ''}) "
            f"must fit the {hc.gpu_count} GPUs of a {hc.name} host and tp_size must divide {hc.gpu_count}",
            f"use tp_size in 1, 2, 4, {hc.gpu_count} with tp_size x dp_size <= {hc.gpu_count}, or spread the "
            "server over several machines (ddtree_server.multinode)",
        )


def rule_ports(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Ports are unique on a host: SGLang, exporter and rendezvous (``--nccl-port``)."""
    if d.server.port == d.ops.exporter_port:
        yield _err("ddtree_ops.exporter_port", d.ops.exporter_port,
                   f"clashes with ddtree_server.port ({d.server.port}) on the same host", "pick another port")
    nccl = d.server.rendezvous_port
    for field, port in ((f"{SRV}.port", d.server.port), ("ddtree_ops.exporter_port", d.ops.exporter_port)):
        if nccl == port:
            how = "" if d.server.nccl_port is not None else f" (derived: port + {NCCL_PORT_OFFSET})"
            yield _err(f"{SRV}.nccl_port", nccl, f"the rendezvous port{how} is also {field}; SGLang's TP ranks "
                       "would meet on a port another listener holds", f"set {SRV}.nccl_port to a free port")


def rule_gpu_set(d: Deployment, p: Plan) -> Iterator[Finding]:
    """The instance's GPUs (``CUDA_VISIBLE_DEVICES`` / ``base_gpu_id`` / extra_args ``--pp-size``,
    ``--gpu-id-step``, ``--enable-dp-attention``: :func:`~.instance.gpu_set`) exist on the host
    class; ``CUDA_VISIBLE_DEVICES`` is in ``ddtree_service.env``, where these checks see it."""
    hc = _host_class(d)
    if not hc:
        return
    field = f"ddtree_service.env.{VISIBLE_ENV}"
    if VISIBLE_ENV in d.secret_env and VISIBLE_ENV not in d.service.env:
        field = f"ddtree_secret_env.{VISIBLE_ENV}"
    try:
        visible = visible_gpus(d)
        need, base = gpu_count_needed(d), d.server.base_gpu_id or 0
    except GpuSetError as exc:
        rule, fix = str(exc).split("|", 1)
        yield _err(field, d.service.env.get(VISIBLE_ENV, "(not shown)" if VISIBLE_ENV in d.secret_env else None),
                   rule, fix, INSTANCE_SOURCE)
        return
    if visible is not None and max(visible) >= hc.gpu_count:
        yield _err(field, d.service.env[VISIBLE_ENV], f"a {hc.name} host has GPUs 0-{hc.gpu_count - 1}",
                   f"list only indices 0-{hc.gpu_count - 1}", INSTANCE_SOURCE)
        return
    if len(rank_gpus(d)) > hc.gpu_count:
        return  # rule_tp_fits says so
    have = len(visible) if visible is not None else hc.gpu_count
    if base + need > have:
        where = (f"{VISIBLE_ENV}={d.service.env[VISIBLE_ENV]} leaves {have} GPUs visible" if visible is not None
                 else f"a {hc.name} host has {have} GPUs")
        yield _err(f"{SRV}.base_gpu_id" if base else f"{SRV}.tp_size", base if base else d.server.tp_size,
                   f"the instance's ranks span {need} GPUs (tp_size x dp_size; x pp_size, x gpu_id_step) from "
                   f"base_gpu_id {base}: they need {base + need} GPUs, but {where} "
                   "(SGLang would fail with 'invalid device ordinal')",
                   f"list {base + need} GPUs in {VISIBLE_ENV}, lower base_gpu_id, tp_size x dp_size or the extra_args "
                   "--pp-size / --gpu-id-step", INSTANCE_SOURCE)


def rule_runtime_state(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Per-instance runtime state lives in the unit's ``RuntimeDirectory`` (created at start,
    removed at stop by systemd: systemd.exec(5)), never in a directory another unit shares."""
    value = d.service.env.get(MULTIPROC_ENV)
    if value is not None and not (value.rstrip("/") + "/").startswith(d.service.runtime_path + "/"):
        yield _err(f"ddtree_service.env.{MULTIPROC_ENV}", value,
                   f"the Prometheus multiprocess directory must lie in the unit's RuntimeDirectory "
                   f"{d.service.runtime_path}, which systemd creates and wipes with each start; elsewhere stale "
                   "files of an earlier run or another instance are summed into this one's metrics",
                   f"remove it (ddtree-ops sets {MULTIPROC_ENV}={d.service.runtime_path})",
                   "prometheus_client multiprocess mode; SGLang set_prometheus_multiproc_dir")


def rule_health_timeout(d: Deployment, p: Plan) -> Iterator[Finding]:
    """/health is a 1-token generation (~1 s at best): probe timeouts under 3 s flap."""
    if d.ops.health_timeout_s < 3:
        yield _err("ddtree_ops.health_timeout_s", d.ops.health_timeout_s,
                   "health probes under 3 s flap (SGLang's /health runs a 1-token generation, ~1 s at best)",
                   "use at least 3 (default 5)", "sglang/srt/entrypoints/http_server.py health_generate")
    if d.ops.health_timeout_s > 300:  # the unit's ExecStartPost passes it as `ddtree-ops health --timeout`
        yield _err("ddtree_ops.health_timeout_s", d.ops.health_timeout_s,
                   "the unit's readiness check runs `ddtree-ops health --timeout` with it, which accepts at most "
                   "300 s (SGLang's /health answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s)",
                   "use 3..300 (default 5)", "ddtree_ops/cli/__init__.py health")


def rule_silent_rewrites(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Surface SGLang's silent rewrites (sglang/srt/server_args.py)."""
    s = d.speculative
    src = "sglang/srt/server_args.py"
    if s.algorithm in ("DFLASH", "DDTREE"):
        for name in ("num_steps", "topk"):
            v = getattr(s, name)
            if v not in (None, 1):
                yield _warn(f"{SPEC}.{name}", v, f"{s.algorithm} forces {name} = 1", f"remove {name}", src)
        if s.num_draft_tokens not in (None, s.block_size):
            yield _err(
                f"{SPEC}.num_draft_tokens",
                s.num_draft_tokens,
                f"{s.algorithm} uses block_size ({s.block_size}) as num_draft_tokens",
                "remove num_draft_tokens",
                src,
            )
    if (
        s.algorithm in ("EAGLE", "EAGLE3")
        and s.topk == 1
        and s.num_steps
        and s.num_draft_tokens not in (None, s.num_steps + 1)
    ):
        yield _warn(f"{SPEC}.num_draft_tokens", s.num_draft_tokens,
                    f"EAGLE with topk 1 forces num_draft_tokens = num_steps + 1 = {s.num_steps + 1}",
                    f"set num_draft_tokens: {s.num_steps + 1}", src)
    if s.enabled and d.server.max_running_requests is None:
        yield _warn(
            f"{SRV}.max_running_requests",
            None,
            f"with speculation on and no max_running_requests SGLang caps it at {SPEC_DEFAULT_MAX_RUNNING_REQUESTS}",
            "set max_running_requests explicitly",
            src,
        )


def rule_sglang_attention_rewrite(d: Deployment, p: Plan) -> Iterator[Finding]:
    """SGLang 0.5.23 on sm_100/sm_103 rewrites a Qwen3.5-family deployment's page_size > 1
    (attention_backend unset) to triton attention with page size 1."""
    hc = _host_class(d)
    if not hc or d.server.attention_backend is not None or not (p.page_size and p.page_size > 1):
        return
    for versions, arches, name, src in MODEL_OVERRIDES:
        if d.sglang.base_version in versions and hc.arch in arches and name.search(str(d.model.path)):
            yield _warn(f"{SRV}.page_size", p.page_size,
                        f"SGLang {d.sglang.base_version} on {hc.arch} ({hc.name}) silently switches this model "
                        f"({d.model.path}) to triton attention with page_size 1 when attention_backend is unset "
                        "(reported ~2.6x slower than trtllm_mha)",
                        "set attention_backend: trtllm_mha (EAGLE topk 1 / DFlash) to keep page_size, or remove "
                        "page_size (SGLang then picks trtllm_mha with page 64); check with "
                        "`ddtree-ops plan --resolve-with PYTHON`", src)
            return


def rule_page_size_rewrite(d: Deployment, p: Plan) -> Iterator[Finding]:
    """A given ``page_size`` that the pinned release replaces because of the attention backend,
    set or derived (:func:`~.derived.derive_attention`): trtllm_mha takes pages of 16, 32, 64 and
    (from 0.5.17) 128 and turns another into 64 (``_mla_backend_page_constraints`` of
    ``sglang/srt/arg_groups/overrides.py``; ``_handle_attention_backend_compatibility`` in
    0.5.13.post1). The server then runs another KV layout than the one deployed, and drift reports it."""
    dv = p.derived.get("page_size")
    given = d.server.page_size
    if given is None or not dv or dv["value"] == given:
        return
    backend = p.attention_backend
    how = "set"
    if backend is None and "attention_backend" in p.derived:
        backend, how = p.derived["attention_backend"]["value"], "derived, attention_backend unset"
    yield _warn(f"{SRV}.page_size", given,
                f"SGLang {d.sglang.base_version} runs page_size {dv['value']} instead of {given} with attention "
                f"backend {backend} ({how}): {dv['why']}",
                f"set page_size: {dv['value']} (or another size {backend} takes), or set attention_backend to "
                f"one that takes page_size {given}", dv["source"])


def rule_accepted_risks_known(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Risk acceptances name a rule that can be overridden (a typo would be ignored)."""
    for i, r in enumerate(d.accepted_risks):
        if r.rule not in OVERRIDABLE_RULES:
            yield _err(f"ddtree_accepted_risks.{i}.rule", r.rule, "not a rule that can be accepted as a risk",
                       f"use one of {', '.join(sorted(OVERRIDABLE_RULES))}")


def rule_toolchain(d: Deployment, p: Plan) -> Iterator[Finding]:
    """The pinned CUDA toolkit's ptxas knows the host arch (sm_103a: >= 12.9, sm_120a: >= 12.8),
    and the Triton ptxas override (if one is needed) can be set in a systemd env file."""
    hc = _host_class(d)
    if not hc or hc.arch not in ARCHS:
        return
    a = ARCHS[hc.arch]
    need = max(a.min_cuda, hc.min_cuda, key=version_key)  # the class may ask for more than the arch
    cuda = d.toolchain.cuda
    if cuda is not None and not at_least(cuda, need):
        newer = [v for v in CUDA_TOOLKITS if at_least(v, need)]
        why = (f"ptxas cannot assemble {a.target} (CUDA {a.min_cuda} or newer can; 12.8 answers \"Value 'sm_103a' "
               "is not defined for option 'gpu-name'\")" if need == a.min_cuda else
               f"the host class asks for CUDA {need} or newer (min_cuda; {a.target} itself needs {a.min_cuda})")
        yield _err(
            "ddtree_toolchain.cuda",
            cuda,
            f"{hc.name} GPUs are {hc.arch}: CUDA {cuda} {why}",
            f'pin cuda: "{newer[-1]}" (any of {", ".join(newer)}) or remove it '
            f"(default {default_cuda(hc.arch, hc.min_cuda)})",
            "ddtree_ops/config/toolchain.py ARCHS (measured with real ptxas)" if need == a.min_cuda else
            HOST_CLASS_SOURCE,
        )
    for key in p.toolchain.get("ptxas_env", {}):
        if not key.replace("_", "a").isalnum():
            yield _err("ddtree_toolchain.triton", d.toolchain.triton,
                       f"Triton {d.toolchain.triton} uses a {a.target}-incapable bundled ptxas and reads its override "
                       f"from {key}, a name a systemd environment file cannot set",
                       "pin Triton 3.6.0 or newer (ptxas-blackwell 12.9+)", "triton/backends/nvidia/compiler.py")


_COMMIT = re.compile(r"[0-9a-f]{40}")


def rule_remote_code_pinned(d: Deployment, p: Plan) -> Iterator[Finding]:
    """``trust_remote_code: true`` runs Python from the model (and draft) repositories: without a
    40-hex ``revision`` each start may run new code. SGLang passes ``--revision`` /
    ``--speculative-draft-model-revision`` to the config and weight loaders
    (``sglang/srt/server_args.py``, 0.5.13.post1 and 0.5.23; a draft revision defaults to ``main``)."""
    if not d.model.trust_remote_code:
        return
    src = "sglang/srt/server_args.py --revision, --speculative-draft-model-revision"
    pins = [(f"{MODEL}.revision", d.model.path, d.model.revision)]
    if d.speculative.enabled and d.speculative.draft_model_path:
        pins.append(
            (f"{SPEC}.draft_model_revision", d.speculative.draft_model_path, d.speculative.draft_model_revision)
        )
    for field, path, rev in pins:
        if path.startswith("/"):
            continue  # a local directory: its code is what is on disk
        if rev is None or not _COMMIT.fullmatch(rev):
            yield _warn(field, rev, f"trust_remote_code runs code from {path} and this revision does not pin it "
                        "(a branch or tag moves; unset means main)",
                        "set it to the 40-hex commit you tested (the repo's 'Files and versions' history)", src)


def _host_class(d: Deployment):
    return d.host_class_def


_PIN_FIELDS = {
    "pypi": ({"version"}, set()),
    "wheel": ({"sha256"}, {"url", "path", "sha256"}),
    "git": ({"repo", "commit"}, {"repo", "commit", "patches"}),
    "simulator": (set(), set()),
}
_PIN_HOW = {
    "pypi": "a PyPI release: version (+ optional requirements)",
    "wheel": "a wheel: url or path, and sha256",
    "git": "a git repository: repo, commit (40-hex SHA) and optional patches",
    "simulator": "the SGLang simulator (test double)",
}


def rule_sglang_pin(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Each SGLang source names exactly what pins it: ``pypi`` a version,
    ``wheel`` a URL or controller path plus its sha256, ``git`` a repository plus a full
    commit SHA (and checksummed patches); fields of another source are refused."""
    pin = d.sglang
    _required, allowed = _PIN_FIELDS[pin.source]
    allowed = (
        allowed
        | {"version", "requirements"}
        | ({"install_release", "simulated_build"} if pin.source == "simulator" else set())
    )
    given = {f for f in ("url", "path", "sha256", "repo", "commit", "requirements", "simulated_build")
             if getattr(pin, f) is not None} | ({"patches"} if pin.patches else set()) | (
        {"install_release"} if pin.install_release else set())
    for f in sorted(given - allowed):
        yield _err(f"ddtree_sglang.{f}", getattr(pin, f) if f != "patches" else [x.path for x in pin.patches],
                   f"does not apply to source {pin.source} ({_PIN_HOW[pin.source]})",
                   "remove it, or set source to the kind of pin it belongs to")
    if pin.source == "wheel":
        if (pin.url is None) == (pin.path is None):
            yield _err("ddtree_sglang.url", pin.url, "source wheel needs exactly one of url and path",
                       "give the wheel's URL or its path on the controller, not both")
        if pin.sha256 is None:
            yield _err(
                "ddtree_sglang.sha256",
                None,
                "source wheel needs the wheel's SHA-256 (it is verified before install)",
                "add sha256: the output of sha256sum on the wheel",
            )
    if pin.source == "git":
        # A warning here (plan, render and the peer tier work on unpinned examples); the
        # sglang role's wheelhouse build refuses to install an unpinned git source.
        for f in ("repo", "commit"):
            if getattr(pin, f) is None:
                yield _warn(f"ddtree_sglang.{f}", None, "source git needs repo and commit (a full 40-hex SHA) "
                            "before the sglang role can install it",
                            "set repo to the repository and commit to the SHA you tested (git rev-parse HEAD)")
    if pin.requirements is not None and not pin.installs_sglang:
        yield _err("ddtree_sglang.requirements", pin.requirements,
                   "a simulator installs no SGLang unless install_release is true",
                   "set install_release: true to also install the real release, or remove requirements")


RULES: list[Rule] = [
    rule_host_class,
    rule_draft_model,
    rule_ddtree_sizes,
    rule_declared_sizes,
    rule_full_tree,
    rule_draft_window,
    rule_ddtree_build,
    rule_capture_plan,
    rule_sm103_tree_capture,
    rule_attention_backends,  # backend names + per-arch rules of the build table (was rule_sm120_attention)
    rule_extra_args,
    rule_extra_args_parse,  # flags, abbreviations and value counts of the release's own parser
    rule_speculation_compat,  # features SGLang refuses with speculation, or that silently slow it
    rule_algorithm_in_release,
    rule_sglang_env,
    rule_build_driver_floor,
    rule_tp_fits,
    rule_multinode,  # one node's view of a server over several machines (fleet: multinode_findings)
    rule_gpu_set,
    rule_ports,
    rule_runtime_state,
    rule_health_timeout,
    rule_silent_rewrites,
    rule_sglang_attention_rewrite,
    rule_page_size_rewrite,
    rule_accepted_risks_known,
    rule_sglang_pin,
    rule_toolchain,
    rule_sandbox_paths, rule_service_not_root,
    rule_env_dirs,
    rule_sglang_scrape,
    rule_memory_reserve,
    rule_remote_code_pinned,
]
