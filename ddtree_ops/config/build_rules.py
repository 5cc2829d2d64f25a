"""Rules that read the build table (:mod:`.build_table`): attention backend names and
per-arch backend rules of the pinned build, ``ddtree_server.extra_args``, and the
``SGLANG_*``/``SGL_*`` names of ``ddtree_service.env`` against the build's environ registry.

Each rule is ``(Deployment, Plan) -> Iterable[Finding]`` (registered in :data:`.rules.RULES`).
"""

from __future__ import annotations

from collections.abc import Iterator

from .build_table import (
    KV_FP8_E4M3,
    SKIP_SOFTMAX,
    arch_rules,
    backend_choices,
    closest,
    env_problem,
    owned_flag,
    secret_flag,
)
from .errors import Finding
from .models import Deployment
from .plan import Plan

SRV = "ddtree_server"
SPEC = "ddtree_speculative"
EXTRA = f"{SRV}.extra_args"
TABLE = "ddtree_ops/config/build_table.py"


def _first(value):
    return value[0] if isinstance(value, list) and value else value


def _conditions(d: Deployment) -> set[str]:
    """Conditions of :data:`.build_table.ARCH_RULES` that hold for ``d``."""
    out = set()
    if str(_first(d.server.extra_args.get("--kv-cache-dtype", ""))) == "fp8_e4m3":
        out.add(KV_FP8_E4M3)
    raw = d.service.env.get("SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR")
    try:
        if raw is not None and float(raw) > 0:
            out.add(SKIP_SOFTMAX)
    except ValueError:
        pass
    return out


def _backends(d: Deployment, p: Plan) -> list[tuple[str, str, str]]:
    """``[(field, backend, phase)]`` of every attention backend the server runs, phase
    ``prefill``/``decode``/``draft`` (``--attention-backend`` is both unless overridden): those
    the argv sets, and where ``attention_backend`` is unset the one the pinned release derives
    (:func:`.derived.derive_attention`), so a rule holds whether the value is given or derived."""
    extra = d.server.extra_args
    out: list[tuple[str, str, str]] = []
    main = p.attention_backend
    field = f"{SRV}.attention_backend"
    if main is None and "attention_backend" in p.derived:
        main = str(p.derived["attention_backend"]["value"])
    for phase in ("prefill", "decode"):
        flag = f"--{phase}-attention-backend"
        if flag in extra:
            out.append((f"{EXTRA}.{flag}", str(_first(extra[flag])), phase))
        elif main:
            out.append((field, main, phase))
    if d.speculative.enabled and d.speculative.draft_attention_backend:
        out.append((f"{SPEC}.draft_attention_backend", d.speculative.draft_attention_backend, "draft"))
    return out


def rule_attention_backends(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Attention backends are names the pinned build's parser accepts, and none is refused
    on the host's GPU arch by that build (:data:`.build_table.ARCH_RULES`, keyed by version
    range, each read off the real package)."""
    version = d.sglang.base_version
    choices = backend_choices(version)
    backends = _backends(d, p)
    seen: set[tuple[str, str]] = set()
    unset = p.attention_backend is None  # the main backend, if any, is the release's own choice
    for field, name, phase in backends:
        if (field, name) in seen or choices is None or (unset and field == f"{SRV}.attention_backend"):
            continue
        seen.add((field, name))
        valid = choices.draft_names if phase == "draft" else choices.attention
        if name not in valid:
            near = closest(name, valid)
            yield Finding("error", field, name, f"SGLang {version} has no {'draft ' if phase == 'draft' else ''}"
                          f"attention backend {name!r}" + (f" (did you mean {near}?)" if near else ""),
                          f"use one of {', '.join(valid)}", choices.source)
    if choices is None and any(not (unset and f == f"{SRV}.attention_backend") for f, _n, _p in backends):
        yield Finding("warning", backends[0][0], backends[0][1],
                      f"SGLang {version}'s attention backends were never read off its package: names and per-arch "
                      "rules are not checked", "pin a release of the build table (" + ", ".join(_read_versions())
                      + ") or let the capability probe parse the argv", TABLE)
    hc = d.host_class_def
    if hc is None:
        return
    conditions = _conditions(d)
    shown: set[tuple[str, str]] = set()
    for field, name, phase in backends:
        for r in arch_rules(version, hc.arch, name, "prefill" if phase == "prefill" else phase):
            if r.when is not None and r.when not in conditions:
                continue
            if (field, r.rule) in shown:
                continue
            shown.add((field, r.rule))
            cond = f" with {r.when}" if r.when else ""
            derived = unset and field == f"{SRV}.attention_backend"
            how = f" (derived: attention_backend is unset; {p.derived['attention_backend']['source']})" \
                if derived else ""
            yield Finding("error", field, None if derived else name,
                          f"SGLang {version} ({r.versions}) refuses {name}{how} as the {phase} attention backend on "
                          f"{hc.arch} ({hc.name}){cond}: {r.detail} [{r.rule}]",
                          ("set attention_backend: flashinfer or triton" if derived else "use flashinfer or triton")
                          + (f", or drop {r.when}" if r.when else ""), r.source)


def _read_versions() -> list[str]:
    from .build_table import BACKEND_CHOICES
    return sorted(BACKEND_CHOICES)


def rule_extra_args(d: Deployment, p: Plan) -> Iterator[Finding]:
    """``ddtree_server.extra_args`` sets no flag the toolkit owns (the plan derives them:
    graph sizes, speculative settings, host/port, modelled fields) and no secret-taking flag;
    a ``--*-port`` (``--nccl-port``) is an unprivileged port clashing with no port of the host's;
    with full-tree DDTree the per-phase attention backends stay triton (the tree-verify mask,
    as :func:`.rules.rule_full_tree` requires of ``attention_backend``)."""
    if p.full_tree:
        for flag in ("--prefill-attention-backend", "--decode-attention-backend"):
            value = d.server.extra_args.get(flag)
            if value is not None and value != "triton":
                yield Finding("error", f"{EXTRA}.{flag}", value,
                              f"full-tree DDTree (budget {p.budget} > block_size - 1 = {p.block_size - 1}) verifies a "
                              f"tree mask that only the triton backend applies; {flag} would run another kernel",
                              f"remove {flag} (or set it to triton), or lower budget to block_size - 1",
                              "DDTree worker: tree-verify attention mask")
    if d.sglang.source == "simulator" and d.server.extra_args:
        yield from _simulator_parse(d)
    taken = {d.server.port: "ddtree_server.port", d.ops.exporter_port: "ddtree_ops.exporter_port",
             d.server.rendezvous_port: "ddtree_server.nccl_port (the rendezvous --nccl-port)"}
    for flag, value in d.server.extra_args.items():
        if not flag.endswith("-port") or isinstance(value, (bool, list)) or owned_flag(flag) is not None:
            continue
        try:
            port = int(str(value))
        except ValueError:
            port = None
        if port is None or not 1024 <= port <= 65535:
            yield Finding("error", f"{EXTRA}.{flag}", value, f"{flag} must be a TCP port 1024-65535 (the service runs "
                          "unprivileged, without CAP_NET_BIND_SERVICE)", "give a free port in 1024-65535")
        elif port in taken:
            yield Finding(
                "error",
                f"{EXTRA}.{flag}",
                value,
                f"{flag} {port} clashes with {taken[port]} on the same host",
                "pick another port",
            )
    for flag in d.server.extra_args:
        field = f"{EXTRA}.{flag}"
        if (secret := secret_flag(flag)) is not None:
            how = "takes" if secret == flag else f"abbreviates (argparse accepts unique prefixes) {secret}, which takes"
            yield Finding("error", field, "(not shown)",
                          f"{flag} {how} a secret; argv is shown in the unit file, plan.json and the process list",
                          "remove it; give secrets through ddtree_secret_env (0600 secrets.env), e.g. the "
                          "variable the flag reads", TABLE)
            continue
        owned = owned_flag(flag)
        if owned is not None:
            how = "is" if owned == flag else f"abbreviates (argparse accepts unique prefixes) {owned}, which is"
            yield Finding("error", field, d.server.extra_args[flag],
                          f"{flag} {how} set by ddtree-ops from the modelled fields (graph sizes, speculative "
                          "settings, host/port, rendezvous port, GPUs, model, parallelism); a second value would "
                          "override the plan",
                          "remove it and set the matching ddtree_server / ddtree_speculative / ddtree_model field",
                          "ddtree_ops/render/argv.py")


def _simulator_parse(d: Deployment) -> Iterator[Finding]:
    """A simulator host runs ``ddtree_ops.sim``: its own parser (SGLang's flag names of the
    simulated version) is the pinned build's parser, so ``extra_args`` are parsed here."""
    import contextlib
    import io

    from .sim_parser import build_parser

    build = d.sglang.simulated_build or ("ddtree" if d.sglang.ddtree_source else "release")
    parser = build_parser(d.sglang.base_version, build)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _ns, unknown = parser.parse_known_args(["--model-path", "m", *d.server.extra_argv()])
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        unknown, problem = [], (lines[-1] if lines else "the parser rejected them")
    else:
        problem = ""
    flags = [u for u in unknown if u.startswith("--")]
    if flags or problem:
        yield Finding("error", EXTRA, list(d.server.extra_args),
                      f"the SGLang simulator of {d.sglang.base_version} ({build} build) "
                      + (f"does not know {', '.join(flags)}" if flags else f"refuses them: {problem}"),
                      "remove the flags the simulator does not model (ddtree_ops/config/sim_parser.py), "
                      "or deploy a real build",
                      "ddtree_ops/config/sim_parser.py build_parser")


def rule_sglang_env(d: Deployment, p: Plan) -> Iterator[Finding]:
    """``SGLANG_*``/``SGL_*`` names of ``ddtree_service.env`` / ``ddtree_secret_env`` are
    variables the pinned build reads (its ``Envs`` registry or a direct read, per release
    read off the package: :mod:`.sglang_env`); renamed ones name their current name."""
    from .sglang_env import ENV_REGISTRY

    version = d.sglang.base_version
    sim = d.sglang.source == "simulator"
    if version not in ENV_REGISTRY:
        names = [n for n in (*d.service.env, *d.secret_env) if n.startswith(("SGLANG_", "SGL_"))
                 and not (sim and n.startswith("SGLANG_SIM_"))]
        if names:
            yield Finding("warning", "ddtree_service.env", names,
                          f"SGLang {version}'s environment registry was never read off its package: these names are "
                          "not checked", "pin a release of the build table (" + ", ".join(sorted(ENV_REGISTRY))
                          + "), or check them against that release's sglang/srt/environ.py", TABLE)
        return
    for section, names in (("ddtree_service.env", list(d.service.env)), ("ddtree_secret_env", list(d.secret_env))):
        for name in names:
            if sim and name.startswith("SGLANG_SIM_"):
                continue  # the simulator's own knobs (ddtree_ops/sim)
            problem = env_problem(version, name)
            if problem is not None:
                rule, fix = problem
                yield Finding("warning", f"{section}.{name}", name, rule, fix, "sglang/srt/environ.py")


def rule_build_driver_floor(d: Deployment, p: Plan) -> Iterator[Finding]:
    """A toolkit pinned below the pinned build's CUDA major does not lower the driver it
    needs: the plan's ``toolchain.min_driver`` is the build's (cu13 wheels: >= 580.65.06), and
    the ``cuda_toolkit`` role refuses an older driver. Said at validate time (a warning), so a
    12.x toolkit is not mistaken for a way to stay on a 57x driver."""
    tc = p.toolchain
    if tc and tc.get("min_driver") != tc.get("toolkit_min_driver"):
        yield Finding("warning", "ddtree_toolchain.cuda", tc.get("cuda"),
                      f"toolkit {tc.get('cuda')} alone runs on driver >= {tc.get('toolkit_min_driver')}, but "
                      f"{tc.get('min_driver_reason')}; the cuda_toolkit role requires driver >= {tc.get('min_driver')}",
                      f"make sure the hosts run driver >= {tc.get('min_driver')} (or pin an SGLang build whose wheels "
                      "need an older CUDA)",
                      "NVIDIA CUDA Toolkit Release Notes, table 3; the build's METADATA Requires-Dist")
