"""The SGLang launch argv, built from a validated deployment (pure function).

The flag dialect follows the pinned version (:mod:`ddtree_ops.config.versions`): up to
0.5.13 ``--cuda-graph-max-bs``/``--cuda-graph-bs``, from 0.5.14 the ``-decode`` names
(the old ones are rejected from 0.5.20). ``--revision`` and
``--speculative-draft-model-revision`` exist in both 0.5.13.post1 and 0.5.23
(``sglang/srt/server_args.py``).
"""

from __future__ import annotations

from ..config.models import Deployment
from ..config.multinode import node_argv
from ..config.plan import Plan
from ..config.versions import GraphFlagDialect, version_info


def sglang_build_path(d: Deployment) -> str | None:
    """The SGLang build a release of ``d`` runs: ``<sglang_venv>.builds/<build name>``, the name
    content-keyed by :func:`ddtree_ops.config.build_id.build_name` (pin, lock, controller
    Python tag, ddtree-ops source id), the same directory the ``sglang`` role installs into;
    None when no build is installed (:attr:`ddtree_ops.config.models.SGLangPin.installs_sglang`).

    The unit runs this path, not the ``sglang_venv`` symlink (which points at the newest
    build), so a rolled-back release runs the build it was rendered for.

    Raises:
        ConfigError: ``ddtree_sglang.requirements`` names no file on the controller.
    """
    if not d.sglang.installs_sglang:
        return None
    from ..config.build_id import PROJECT_ROOT, WheelhouseError, build_name, ops_source_id
    from ..python_tag import current

    pin = d.sglang.model_dump(mode="json")
    try:
        name = build_name(pin, PROJECT_ROOT, current(), ops_source_id(PROJECT_ROOT))
    except WheelhouseError:
        from ..config.errors import ConfigError, Finding

        raise ConfigError([Finding(
            "error", "ddtree_sglang.requirements", pin.get("requirements"),
            "no such file on the controller: the SGLang build (and so the release) is named by the lock's sha256",
            f"give an existing lock file (relative paths start at the project root, {PROJECT_ROOT.name}/)",
            host=d.host)]) from None
    return f"{d.service.sglang_venv_path}.builds/{name}"


def unit_sglang_build(d: Deployment) -> str | None:
    """The SGLang build the unit runs, and so the one its release pins
    (``identity.sglang_build``): :func:`sglang_build_path` for a real SGLang source; None for
    the simulator, which runs from the ops venv (an ``install_release`` build only serves the
    deploy-time probe, so no release keeps it)."""
    return None if d.sglang.source == "simulator" else sglang_build_path(d)


def build_argv(d: Deployment, plan: Plan) -> list[str]:
    """``[python, -m, module, ARGS...]`` for ``python -m sglang.launch_server``.

    Args:
        d: a deployment that passed :func:`ddtree_ops.config.validate_hostvars`.
        plan: its plan.

    Returns:
        The argv as a list of strings (no shell quoting; see
        :func:`ddtree_ops.render.files.systemd_exec` for the unit file form).
    """
    dialect = version_info(d.sglang.base_version).dialect
    # Real SGLang runs from the release's own SGLang build; the simulator (ddtree-ops) from the ops venv.
    venv = unit_sglang_build(d) or d.service.venv
    argv = [f"{venv}/bin/python", "-m", d.sglang.launcher_module]
    argv += _model_flags(d)
    argv += _server_flags(d, plan)
    if d.speculative.enabled:
        argv += _speculative_flags(d, plan)
    argv += _cuda_graph_flags(plan, dialect)
    # Flags the config does not model (validated, none the toolkit owns: config.build_rules).
    argv += d.server.extra_argv()
    return argv


def _model_flags(d: Deployment) -> list[str]:
    """The target model: path, revision, served name, remote code, context length."""
    argv = ["--model-path", d.model.path]
    if d.model.revision:
        argv += ["--revision", d.model.revision]
    if d.model.served_model_name:
        argv += ["--served-model-name", d.model.served_model_name]
    if d.model.trust_remote_code:
        argv.append("--trust-remote-code")
    if d.model.context_length:
        argv += ["--context-length", str(d.model.context_length)]
    return argv


def _server_flags(d: Deployment, plan: Plan) -> list[str]:
    """Listen address, parallelism, GPUs, memory, scheduling, attention, metrics and logging."""
    srv = d.server
    argv = ["--host", srv.host, "--port", str(srv.port), "--tp-size", str(srv.tp_size)]
    if srv.dp_size > 1:
        argv += ["--dp-size", str(srv.dp_size)]
    # fixed per instance, never SGLang's random free port: instances on one machine (config.fleet)
    argv += ["--nccl-port", str(srv.rendezvous_port)]
    if srv.base_gpu_id:
        argv += ["--base-gpu-id", str(srv.base_gpu_id)]
    # one server over several machines: this node's rank and rank 0's store (config.multinode)
    argv += node_argv(d)
    if srv.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", repr(srv.mem_fraction_static)]
    if srv.max_running_requests is not None:
        argv += ["--max-running-requests", str(srv.max_running_requests)]
    if plan.attention_backend:
        argv += ["--attention-backend", plan.attention_backend]
    if plan.page_size is not None:
        argv += ["--page-size", str(plan.page_size)]
    if plan.disable_overlap_schedule:
        argv.append("--disable-overlap-schedule")
    argv.append("--enable-metrics")
    argv += ["--log-level", srv.log_level]
    return argv


def _speculative_flags(d: Deployment, plan: Plan) -> list[str]:
    """Speculative decoding (the deployment has it enabled): algorithm, draft model, sizes."""
    s = d.speculative
    argv = ["--speculative-algorithm", s.algorithm]
    if s.algorithm == "NGRAM":  # no draft model (config.rules.rule_draft_model refuses one)
        if plan.num_draft_tokens is not None:
            argv += ["--speculative-num-draft-tokens", str(plan.num_draft_tokens)]
        return argv
    argv += ["--speculative-draft-model-path", s.draft_model_path]
    if s.draft_model_revision:
        argv += ["--speculative-draft-model-revision", s.draft_model_revision]
    if s.algorithm in ("DFLASH", "DDTREE"):
        argv += ["--speculative-num-draft-tokens", str(plan.block_size)]
        if s.algorithm == "DDTREE":
            argv += ["--speculative-ddtree-budget", str(plan.budget)]
    else:
        argv += ["--speculative-num-steps", str(plan.num_steps), "--speculative-eagle-topk", str(plan.topk)]
        if plan.num_draft_tokens is not None:
            argv += ["--speculative-num-draft-tokens", str(plan.num_draft_tokens)]
    if s.draft_window_size is not None:
        argv += ["--speculative-draft-window-size", str(s.draft_window_size)]
    if s.draft_attention_backend:
        argv += ["--speculative-draft-attention-backend", s.draft_attention_backend]
    return argv


def _cuda_graph_flags(plan: Plan, dialect: GraphFlagDialect) -> list[str]:
    """CUDA graphs off, or the planned capture list in the pinned version's flag dialect."""
    if not plan.cuda_graphs:
        return ["--disable-cuda-graph"]
    if plan.cuda_graph_max_bs is None:
        return []
    return [dialect.max_bs_flag, str(plan.cuda_graph_max_bs), dialect.bs_flag, *map(str, plan.capture_bs)]
