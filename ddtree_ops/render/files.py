"""Render the files of a deployment from ``ddtree_ops/templates/*.j2`` (package data).

Templates hold layout only; every value comes from the validated config and its plan.
:func:`render_host` is what both ``ddtree-ops render`` and the Ansible action plugin call,
so their output is byte-identical.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from collections.abc import Sequence

    import jinja2

    from ..config.router import Router

from ..config.envchars import env_char_problem
from ..config.exporter_limits import NOFILE_LIMIT
from ..config.instance import MULTIPROC_ENV, cache_env, multiproc_dir
from ..config.load import Validated
from ..config.sandbox import unit_sandbox
from ..config.scrape import scrape_host, sglang_scrape_host, url_host
from .argv import build_argv

ROUTER_JOB = "smg"
"""Prometheus job of the routers' metrics (smg ``--prometheus-port``, families ``smg_*``)."""

MANAGED_BY = "Managed by ddtree-ops: do not edit"
"""The start of the header of every file ddtree-ops writes on a host: the rendered files'
(:data:`MANAGED`) and the ``cuda_toolkit`` role's own (``ddtree_render`` returns it as ``managed_by``)."""
MANAGED = f"{MANAGED_BY}; re-render with `ddtree-ops render` or deploy.yml."
"""Header comment of every file :func:`render_host` and :func:`render_prometheus` render."""

EXPORTER_JOB = "ddtree_exporter"
"""Prometheus job of the exporters (``prometheus.yml`` of :func:`prometheus_document`, the rules' selectors)."""
SGLANG_JOB = "sglang"
"""Prometheus job of the SGLang servers' own ``/metrics``."""

YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""The YAML emitter of rendered documents: libyaml's safe dumper where PyYAML has it (half
the time of the pure-Python one for a 1000-host prometheus.yml, the same bytes:
``tests/test_perf.py``), else PyYAML's ``SafeDumper`` (what ``yaml.safe_dump`` uses)."""

_PLAIN = re.compile(r"^[A-Za-z0-9._/@+:=,-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""A control character (C0 or DEL): no quoting keeps it on one unit or env-file line."""


def systemd_quote(arg: str) -> str:
    """Quote one argv element for a systemd ``Exec*=`` line.

    Plain words stay as they are. Anything else is double-quoted with ``\\`` and ``"``
    escaped; ``%`` becomes ``%%`` (specifier) and ``$`` becomes ``$$`` (variable
    expansion), per systemd.service(5) "Command lines" and systemd.unit(5) "Specifiers".

    Raises:
        ValueError: the argument holds a newline or another control character, which no
            quoting can keep on one ``Exec`` line.
    """
    if _CONTROL.search(arg):
        raise ValueError(f"argument {arg!r} holds a control character; refusing to put it in a unit file")
    if _PLAIN.match(arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def systemd_exec(argv: list[str]) -> str:
    """An argv list as one ``ExecStart=`` value (see :func:`systemd_quote`)."""
    return " ".join(systemd_quote(a) for a in argv)


def env_value(value: str) -> str:
    """Quote a value for an ``EnvironmentFile=`` line (systemd.exec(5)).

    Raises:
        ValueError: a character :func:`ddtree_ops.config.envchars.env_char_problem` refuses
            (control, format, line/paragraph separator): the last check before any env file,
            whatever produced the value.
    """
    problem = env_char_problem(value)
    if problem:
        raise ValueError(problem)
    if _PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


@functools.cache
def _env() -> jinja2.Environment:
    """The one Jinja environment of this process (built on first use; it caches the compiled
    templates and re-reads a template whose file changed). Building one per host cost ~20 ms
    a host (render's time: ``scripts/bench-controller.py``). Jinja is imported here: validate,
    which imports this module for :func:`scrape_address`, never renders."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ddtree_ops", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["env_value"] = env_value
    return env


@dataclass(frozen=True)
class RenderedFile:
    """One file to install.

    Attributes:
        path: absolute path on the target host.
        content: exact bytes as text (UTF-8).
        mode: octal mode string, e.g. ``"0644"``.
        secret: True for files that hold secrets (never logged; mode 0600).
        component: which role installs it: ``service`` (ddtree_service) or ``exporter``
            (ddtree_exporter), so a changed exporter unit never restarts SGLang.
    """

    path: str
    content: str
    mode: str = "0644"
    secret: bool = False
    component: str = "service"


def service_env(v: Validated) -> dict[str, str]:
    """Environment of the SGLang unit: per-instance caches and Prometheus multiprocess
    directory (the unit's ``RuntimeDirectory``), sizes for our SGLang plugin,
    simulator knobs, the Triton ptxas override of the plan (``TRITON_PTXAS_PATH`` /
    ``TRITON_PTXAS_BLACKWELL_PATH``, see :func:`ddtree_ops.config.toolchain.plan_toolchain`),
    then the operator's ``ddtree_service.env`` (which wins)."""
    d, p = v.deployment, v.plan
    env = {
        "PYTHONUNBUFFERED": "1",
        **cache_env(d),
        "DDTREE_OPS_ALGORITHM": p.algorithm,
        "DDTREE_OPS_DRAFT_TOKENS_PER_REQ": str(p.draft_tokens_per_req),
        "DDTREE_OPS_VERIFY_TOKENS_PER_REQ": str(p.verify_tokens_per_req),
        # per-instance, created and wiped by the unit (RuntimeDirectory=): config.instance
        MULTIPROC_ENV: multiproc_dir(d),
    }
    if d.sglang.source == "simulator":
        env["SGLANG_SIM_VERSION"] = d.sglang.base_version
        env["SGLANG_SIM_BUILD"] = d.sglang.simulated_build or ("ddtree" if d.sglang.ddtree_source else "release")
        if d.model.vision:
            env["SGLANG_SIM_VISION_MIN_PIXELS"] = str(d.model.vision_min_pixels)
    env.update(p.toolchain.get("ptxas_env", {}))  # Triton -> toolkit ptxas where its own is too old
    env.update(d.service.env)
    return env


SECRET_FIELDS = frozenset({"hf_token", "secret_env"})
"""Deployment fields that never reach plan.json, the action result or any log."""


def secrets_path(v: Validated) -> str:
    """Path of the 0600 secrets file on the host (rendered only with a secret to hold)."""
    return f"{v.deployment.service.config_path}/secrets.env"


def plan_document(v: Validated) -> dict:
    """What ``plan.json`` on the host holds: the deployment (no secrets: :data:`SECRET_FIELDS`
    left out) and its plan. ``exporter_unit`` is the exporter's unit (the preflight lets it hold
    ``exporter_port``). ``url`` is :attr:`~ddtree_ops.config.service_models.Server.local_url`;
    ``paths.secrets`` is where the secrets file lives (present or not). ``schema_version``,
    ``url``, ``rendezvous_port`` (the ``--nccl-port`` rendered: the host's preflight checks it is
    free) and ``sglang_base_version`` are the contract's version and derived values
    (:class:`ddtree_ops.config.plandoc_model.PlanDoc` reads them)."""
    from ..config.plandoc_model import SCHEMA_VERSION

    d = v.deployment
    return {
        "schema_version": SCHEMA_VERSION,
        "sglang_base_version": d.sglang.base_version,
        "host": d.host,
        "host_class": d.host_class,
        "unit": d.service.unit_name,
        "exporter_unit": exporter_unit_name(v),
        "url": d.server.local_url,
        "rendezvous_port": d.server.rendezvous_port,
        "node_rank": d.node_rank,
        "dist_init_port": d.server.dist_init_port if d.serves_http else None,
        "nnodes": d.server.nnodes,
        "paths": {"config": d.service.config_path, "state": d.service.state_path,
                  "cache": d.service.cache_path, "venv": d.service.venv,
                  "sglang_venv": d.service.sglang_venv_path,
                  "warm_marker": d.service.warm_marker_path, "secrets": secrets_path(v)},
        "deployment": deployment_document(d),
        "plan": v.plan.as_dict(),
    }


def plan_json(v: Validated) -> str:
    """plan.json's text, read back through every reader of it on the host before it is written:
    the byte layer (:func:`ddtree_ops._core.plandoc.parse_plan_doc`: size, depth, strict JSON, integer
    range) and the typed contract (:class:`ddtree_ops.config.plandoc_model.PlanDoc`, which runs the
    preflight's standard-library reader :func:`ddtree_ops.host.preflight.plan_fields` first). One set of
    bounds: a document a reader would refuse on the host is refused here, at validate and render,
    before a release is made of it.

    Raises:
        ConfigError: one finding naming the inventory (the document as a whole), the reader's
            rule and the fix.
    """
    from .._core.plandoc import MAX_BYTES, parse_plan_doc
    from ..config.errors import ConfigError, Finding
    from ..config.plandoc_model import PlanDoc, PlanDocError

    # NaN and infinities are refused when the inventory is loaded; one that got past that is refused
    # here like any other document the readers would refuse (strict JSON), never written as NaN
    text = ""
    try:
        text = json.dumps(plan_document(v), indent=2, sort_keys=True, allow_nan=False) + "\n"
        doc = parse_plan_doc(text.encode())
        PlanDoc.of(doc)
    except (ValueError, PlanDocError) as exc:
        raise ConfigError([Finding(
            "error", "plan.json", f"{len(text.encode())} bytes", f"the rendered plan.json must pass the host's plan "
            f"readers (at most {MAX_BYTES >> 20} MiB, strict JSON, integers within +-2**63); it does not: "
            f"{str(exc)[:300]}", "make the inventory's lists and values smaller (ddtree_server.extra_args, "
            "ddtree_service.env, ddtree_accepted_risks)", host=v.deployment.host)]) from None
    return text


def deployment_document(d) -> dict:
    """plan.json's ``deployment``: the deployment without :data:`SECRET_FIELDS`, and of
    ``ddtree_host_classes`` only the host's own class, resolved (every field: the preflight on
    the host reads it there, and re-validating the stored deployment finds it), right after
    ``host_class``; nothing when the class is a built-in one the inventory does not change (so a
    deployment of a built-in class renders as before the field existed)."""
    doc = d.model_dump(mode="json", exclude=set(SECRET_FIELDS) | {"host_classes"})
    if d.host_class not in d.host_classes:
        return doc
    out = {}
    for k, val in doc.items():
        out[k] = val
        if k == "host_class":
            out["host_classes"] = {d.host_class: d.host_class_def.as_dict()}
    return out


START_MARGIN_S = 60
"""Seconds ``TimeoutStartSec`` adds on top of load and warmup (process start, probe timeouts)."""


def timeout_start_s(v: Validated) -> int:
    """``TimeoutStartSec`` of the unit, seconds: it covers ``ExecStart`` and every
    ``ExecStartPost`` (systemd.service(5)), i.e. load + capture (``start_timeout_s``), the
    warmup (``warmup_deadline_s``) and :data:`START_MARGIN_S`."""
    d = v.deployment
    return d.service.start_timeout_s + d.ops.warmup_deadline_s + START_MARGIN_S


def ready_commands(v: Validated) -> list[list[str]]:
    """The unit's ``ExecStartPost`` argvs, run in order; the unit is "active" only when all
    succeed, and a failure fails the start (``Restart=`` then applies):

    1. ``ddtree-ops health --wait start_timeout_s --plan plan.json``: SGLang answers
       ``/health`` 200 and runs the deployed settings (no drift);
    2. ``ddtree-ops warmup --plan plan.json --marker warm.json``: every batch size of the
       plan, bounded by ``warmup_deadline_s``; writes the warm marker in the unit's
       ``RuntimeDirectory`` when it succeeds.

    A node of rank >= 1 of a multi-node server (``ddtree_server.multinode``) gets only the first:
    SGLang answers its ``/health`` once its scheduler ranks have joined rank 0 (0.5.23
    ``entrypoints/engine.py``, ``launch_dummy_health_check_server``); rank 0 is warmed up and
    serves the API, and is ready only once every node has joined.
    """
    d, svc = v.deployment, v.deployment.service
    url = d.server.local_url
    py = [f"{svc.venv}/bin/python", "-m", "ddtree_ops"]
    plan_json = f"{svc.config_path}/plan.json"
    health = [*py, "health", url, "--wait", str(svc.start_timeout_s), "--timeout", str(d.ops.health_timeout_s),
              "--plan", plan_json]
    if not d.serves_http:  # a node of rank >= 1: SGLang's health-only server once its ranks joined rank 0
        return [health]
    return [
        [*py, "health", url, "--wait", str(svc.start_timeout_s), "--timeout", str(d.ops.health_timeout_s),
         "--plan", plan_json],
        [*py, "warmup", url, "--plan", plan_json, "--deadline", str(d.ops.warmup_deadline_s),
         "--marker", svc.warm_marker_path],
    ]


def render_host(v: Validated) -> list[RenderedFile]:
    """All files of one host's deployment, in install order.

    Returns:
        Unit file, env file, plan.json, the exporter unit (``component="exporter"``), the
        host's NVIDIA device-node unit (``component="devices"``, :func:`devices_unit`) and
        (only with ``ddtree_hf_token`` or ``ddtree_secret_env``) the 0600 secrets file
        (``secret=True``: ``HF_TOKEN`` and every ``ddtree_secret_env`` entry).
    """
    d, p = v.deployment, v.plan
    svc = d.service
    cfg = svc.config_path
    env_file, secrets_file = f"{cfg}/{svc.name}.env", secrets_path(v)
    jenv = _env()
    argv = build_argv(d, p)
    ctx = {
        "managed": MANAGED,
        "host": d.host,
        "host_class": d.host_class_def,
        "plan": p,
        "service": svc,
        "unit_name": svc.unit_name,
        "model_path": d.model.path,
        "state_path": svc.state_path,
        "cache_path": svc.cache_path,
        "env_file": env_file,
        "secrets_file": secrets_file,
        "exec_start": systemd_exec(argv),
        "exec_ready": [systemd_exec(c) for c in ready_commands(v)],
        "timeout_start_s": timeout_start_s(v),
        "runtime_dir": svc.runtime_path.removeprefix("/run/"),
        "sandbox": unit_sandbox(d),
        "devices_unit": DEVICES_UNIT,
    }
    files = [
        RenderedFile(f"/etc/systemd/system/{svc.unit_name}", jenv.get_template("sglang.service.j2").render(ctx)),
        RenderedFile(env_file, jenv.get_template("sglang.env.j2").render(ctx, env=service_env(v))),
        RenderedFile(f"{cfg}/plan.json", plan_json(v)),
    ]
    if d.serves_http:  # the exporter reads /server_info, which only rank 0 of a multi-node server serves
        files.append(exporter_unit(v))
    files.append(devices_unit(v))
    secrets = {k: s.get_secret_value() for k, s in d.secret_env.items()}
    if d.hf_token is not None:
        secrets["HF_TOKEN"] = d.hf_token.get_secret_value()
    if secrets:
        files.append(RenderedFile(secrets_file, jenv.get_template("secrets.env.j2").render(ctx, secrets=secrets),
                                  mode="0600", secret=True))
    return files


def exporter_unit_name(v: Validated) -> str:
    """Unit name of the host's ``ddtree-ops exporter`` (one per SGLang service)."""
    return f"ddtree-{v.deployment.service.name}-exporter.service"


def exporter_unit(v: Validated) -> RenderedFile:
    """The exporter's systemd unit: ``ddtree-ops exporter --plan plan.json`` on
    ``0.0.0.0:<ddtree_ops.exporter_port>``, polling the SGLang server at its
    :attr:`~ddtree_ops.config.service_models.Server.local_url`."""
    d = v.deployment
    svc = d.service
    argv = [f"{svc.venv}/bin/python", "-m", "ddtree_ops", "exporter", "--plan", f"{svc.config_path}/plan.json",
            "--upstream", d.server.local_url, "--listen", f"0.0.0.0:{d.ops.exporter_port}"]
    ctx = {"managed": MANAGED, "host": d.host, "service": svc, "unit_name": svc.unit_name,
           "listen": f"0.0.0.0:{d.ops.exporter_port}", "exec_start": systemd_exec(argv),
           "nofile": NOFILE_LIMIT}
    return RenderedFile(f"/etc/systemd/system/{exporter_unit_name(v)}",
                        _env().get_template("exporter.service.j2").render(ctx), component="exporter")


DEVICES_UNIT = "ddtree-nvidia-devices.service"
"""One per host: creates the NVIDIA device nodes before any SGLang unit starts."""
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"
"""Where the NVIDIA driver packages install ``nvidia-modprobe`` (Debian/Ubuntu and NVIDIA's repos)."""
MIG_CAPABILITIES = ("/proc/driver/nvidia/capabilities/mig/config", "/proc/driver/nvidia/capabilities/mig/monitor")
"""Capabilities whose ``/dev/nvidia-caps/nvidia-cap*`` nodes ``nvidia-modprobe -f`` creates
(NVIDIA MIG user guide, "Device nodes (devfs)")."""


def devices_commands(v: Validated) -> list[list[str]]:
    """The device unit's ``ExecStart`` argvs, run in order (systemd.service(5): a oneshot
    runs every ``ExecStart``): ``nvidia-modprobe -u -c=0`` loads nvidia-uvm and creates
    ``/dev/nvidia-uvm`` + ``/dev/nvidia0`` + ``/dev/nvidiactl``; ``-c=N`` the node of every
    further GPU of the host class; ``-f <proc capability>`` the ``/dev/nvidia-caps`` nodes
    (those lines run with systemd's ``-`` prefix: a driver or GPU without MIG has no such
    capability file, which must not fail the unit). Source: ``nvidia-modprobe --help`` (NVIDIA/nvidia-modprobe)."""
    n = v.deployment.host_class_def.gpu_count
    return ([[NVIDIA_MODPROBE, "-u", "-c=0"]] + [[NVIDIA_MODPROBE, f"-c={i}"] for i in range(1, n)]
            + [[NVIDIA_MODPROBE, "-f", cap] for cap in MIG_CAPABILITIES])


def devices_unit(v: Validated) -> RenderedFile:
    """``ddtree-nvidia-devices.service`` (:data:`DEVICES_UNIT`): ``Type=oneshot``,
    ``RemainAfterExit=yes``, ordered before the host's SGLang unit (which ``Wants=`` and is
    ``After=`` it). Installed and enabled by the ``cuda_toolkit`` role."""
    d = v.deployment
    # one file per machine, shared by its instances (config.fleet): nothing instance-specific in it,
    # else each instance's deploy would rewrite the other's and restart the unit
    ctx = {"managed": MANAGED, "host_class": d.host_class_def,
           # "-": a driver without MIG capability files must not fail the unit (systemd.service(5))
           "exec_start": [("-" if c[1] == "-f" else "") + systemd_exec(c) for c in devices_commands(v)]}
    return RenderedFile(f"/etc/systemd/system/{DEVICES_UNIT}",
                        _env().get_template("nvidia-devices.service.j2").render(ctx), component="devices")


def scrape_address(v: Validated) -> str:
    """Address Prometheus (and ``ddtree-ops`` run from the controller) uses for a host's exporter:
    :func:`ddtree_ops.config.scrape.scrape_host`, IPv6 bracketed (SGLang's own: :func:`sglang_target`)."""
    return url_host(scrape_host(v.deployment))


def sglang_target(v: Validated) -> str | None:
    """``host:port`` of SGLang's ``/metrics`` for Prometheus, or None when it cannot be scraped from
    elsewhere (bound to loopback: :func:`ddtree_ops.config.scrape.sglang_scrape_host`)."""
    host = sglang_scrape_host(v.deployment)
    return None if host is None else f"{url_host(host)}:{v.deployment.server.port}"


def prometheus_document(validated: list[Validated], scrape_interval: str = "15s", scrape_timeout: str = "5s",
                        rule_files: tuple[str, ...] | list[str] = (), evaluation_interval: str | None = None,
                        routers: Sequence[Router] = ()) -> dict:
    """``prometheus.yml`` as data (see :func:`render_prometheus`): one ``static_configs``
    entry with one target per host and job; with ``routers`` (:mod:`..config.router`) a
    job :data:`ROUTER_JOB` of their ``smg_*`` metrics ports (none: the document is unchanged)."""
    def static(target_of) -> list[dict]:
        return [{"targets": [target],
                 "labels": {"host": v.deployment.host, "host_class": v.deployment.host_class,
                            "model": v.deployment.model.served_model_name or v.deployment.model.path,
                            "algorithm": v.plan.algorithm, "service": v.deployment.service.name}}
                for v in sorted(validated, key=lambda v: v.deployment.host) if (target := target_of(v)) is not None]

    doc: dict = {"global": {"scrape_interval": str(scrape_interval),
                            "evaluation_interval": str(evaluation_interval or scrape_interval)}}
    if rule_files:
        doc["rule_files"] = [str(f) for f in rule_files]
    doc["scrape_configs"] = [
        {"job_name": SGLANG_JOB, "metrics_path": "/metrics", "scrape_timeout": str(scrape_timeout),
         "static_configs": static(sglang_target)},
        # the exporter sets host/host_class/model itself; keep its values
        {"job_name": EXPORTER_JOB, "metrics_path": "/metrics", "scrape_timeout": str(scrape_timeout),
         "honor_labels": True,
         "static_configs": static(lambda v: f"{scrape_address(v)}:{v.deployment.ops.exporter_port}"
                                  if v.deployment.serves_http else None)},
    ]
    if routers:
        doc["scrape_configs"].append(
            {"job_name": ROUTER_JOB, "metrics_path": "/metrics", "scrape_timeout": str(scrape_timeout),
             "static_configs": [{"targets": [f"{url_host(r.address or r.host)}:{r.settings.metrics_port}"],
                                 "labels": {"host": r.host, "service": "router"}}
                                for r in sorted(routers, key=lambda r: r.host)]})
    return doc


def render_prometheus(validated: list[Validated], scrape_interval: str = "15s", scrape_timeout: str = "5s",
                      rule_files: tuple[str, ...] | list[str] = (), evaluation_interval: str | None = None,
                      routers: Sequence[Router] = ()) -> str:
    """A ``prometheus.yml`` scraping every SGLang instance's ``/metrics`` (job ``sglang``) and
    its ``ddtree-ops exporter`` (job ``ddtree_exporter``, ``ddtree_ops.exporter_port``).

    Labels: host, host_class, model, algorithm, service. ``rule_files``: paths for
    ``rule_files:`` (e.g. the rules of :func:`ddtree_ops.render.monitoring.render_rules`).
    ``evaluation_interval`` defaults to ``scrape_interval``.

    Injection-proof by construction: the document is built as data
    (:func:`prometheus_document`) and emitted by ``yaml.safe_dump``; the template only adds
    the header comment, so no value (label, address, interval) can add a key or a target.
    """
    doc = prometheus_document(validated, scrape_interval, scrape_timeout, rule_files, evaluation_interval, routers)
    body = yaml.dump(doc, Dumper=YAML_DUMPER, sort_keys=False, default_flow_style=False, allow_unicode=False,
                     width=1 << 16)
    return _env().get_template("prometheus.yml.j2").render(managed=MANAGED, body=body)
