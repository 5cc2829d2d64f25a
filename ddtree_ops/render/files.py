"""Render the files of a deployment from ``templates/*.j2``.

Templates hold layout only; every value comes from the validated config and its plan.
:func:`render_host` is what both ``ddtree-ops render`` and the Ansible action plugin call,
so their output is byte-identical.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ..config.hosts import HOST_CLASSES
from ..config.load import Validated
from .argv import build_argv

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
MANAGED = "Managed by ddtree-ops: do not edit; re-render with `ddtree-ops render` or deploy.yml."

_PLAIN = re.compile(r"^[A-Za-z0-9._/@+:=,-]+$")


def systemd_quote(arg: str) -> str:
    """Quote one argv element for a systemd ``Exec*=`` line.

    Plain words stay as they are. Anything else is double-quoted with ``\\`` and ``"``
    escaped; ``%`` becomes ``%%`` (specifier) and ``$`` becomes ``$$`` (variable
    expansion), per systemd.service(5) "Command lines" and systemd.unit(5) "Specifiers".

    Raises:
        ValueError: the argument holds a newline or another control character, which no
            quoting can keep on one ``Exec`` line.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
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
        ValueError: newline or control character.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("environment values may not hold newlines or control characters")
    if _PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
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
    """

    path: str
    content: str
    mode: str = "0644"
    secret: bool = False


def service_env(v: Validated) -> dict[str, str]:
    """Environment of the SGLang unit: per-instance caches, sizes for our SGLang plugin,
    simulator knobs, the Triton ptxas override of the plan (``TRITON_PTXAS_PATH`` /
    ``TRITON_PTXAS_BLACKWELL_PATH``, see :func:`ddtree_ops.config.toolchain.plan_toolchain`),
    then the operator's ``ddtree_service.env`` (which wins)."""
    d, p = v.deployment, v.plan
    cache = d.service.cache_path
    env = {
        "PYTHONUNBUFFERED": "1",
        "HOME": d.service.state_path,
        "XDG_CACHE_HOME": cache,
        "HF_HOME": f"{cache}/huggingface",
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "DG_JIT_CACHE_DIR": f"{cache}/deepgemm",
        "FLASHINFER_WORKSPACE_BASE": f"{cache}/flashinfer",
        "DDTREE_OPS_ALGORITHM": p.algorithm,
        "DDTREE_OPS_DRAFT_TOKENS_PER_REQ": str(p.draft_tokens_per_req),
        "DDTREE_OPS_VERIFY_TOKENS_PER_REQ": str(p.verify_tokens_per_req),
    }
    if d.sglang.source == "simulator":
        env["SGLANG_SIM_VERSION"] = d.sglang.base_version
        env["SGLANG_SIM_BUILD"] = d.sglang.simulated_build or ("ddtree" if d.sglang.ddtree_source else "release")
    env.update(p.toolchain.get("ptxas_env", {}))  # Triton -> toolkit ptxas where its own is too old
    env.update(d.service.env)
    return env


def plan_document(v: Validated) -> dict:
    """What ``plan.json`` on the host holds: the deployment (no secrets) and its plan."""
    d = v.deployment
    return {
        "host": d.host,
        "host_class": d.host_class,
        "unit": d.service.unit_name,
        "url": f"http://127.0.0.1:{d.server.port}",
        "paths": {"config": d.service.config_path, "state": d.service.state_path,
                  "cache": d.service.cache_path, "venv": d.service.venv},
        "deployment": d.model_dump(mode="json", exclude={"hf_token"}),
        "plan": v.plan.as_dict(),
    }


def render_host(v: Validated) -> list[RenderedFile]:
    """All files of one host's deployment, in install order.

    Returns:
        Unit file, env file, plan.json, and (only with ``ddtree_hf_token``) the 0600
        secrets file.
    """
    d, p = v.deployment, v.plan
    svc = d.service
    cfg = svc.config_path
    env_file, secrets_file = f"{cfg}/{svc.name}.env", f"{cfg}/secrets.env"
    jenv = _env()
    argv = build_argv(d, p)
    ready = [f"{svc.venv}/bin/python", "-m", "ddtree_ops", "health", f"http://127.0.0.1:{d.server.port}",
             "--wait", str(svc.start_timeout_s), "--timeout", str(d.ops.health_timeout_s)]
    ctx = {
        "managed": MANAGED,
        "host": d.host,
        "host_class": HOST_CLASSES[d.host_class],
        "plan": p,
        "service": svc,
        "unit_name": svc.unit_name,
        "model_path": d.model.path,
        "state_path": svc.state_path,
        "cache_path": svc.cache_path,
        "env_file": env_file,
        "secrets_file": secrets_file,
        "exec_start": systemd_exec(argv),
        "exec_ready": systemd_exec(ready),
    }
    files = [
        RenderedFile(f"/etc/systemd/system/{svc.unit_name}", jenv.get_template("sglang.service.j2").render(ctx)),
        RenderedFile(env_file, jenv.get_template("sglang.env.j2").render(ctx, env=service_env(v))),
        RenderedFile(f"{cfg}/plan.json", json.dumps(plan_document(v), indent=2, sort_keys=True) + "\n"),
    ]
    if d.hf_token is not None:
        secrets = {"HF_TOKEN": d.hf_token.get_secret_value()}
        files.append(RenderedFile(secrets_file, jenv.get_template("secrets.env.j2").render(ctx, secrets=secrets),
                                  mode="0600", secret=True))
    return files


def render_prometheus(validated: list[Validated], scrape_interval: str = "15s", scrape_timeout: str = "5s") -> str:
    """A ``prometheus.yml`` scraping every SGLang instance's ``/metrics``.

    Labels: host, host_class, model, algorithm, service.
    """
    targets = [
        {
            "address": f"{v.deployment.ops.scrape_host or v.deployment.address or v.deployment.host}:{v.deployment.server.port}",
            "host": v.deployment.host,
            "host_class": v.deployment.host_class,
            "model": v.deployment.model.served_model_name or v.deployment.model.path,
            "algorithm": v.plan.algorithm,
            "service": v.deployment.service.name,
        }
        for v in sorted(validated, key=lambda v: v.deployment.host)
    ]
    return _env().get_template("prometheus.yml.j2").render(
        managed=MANAGED, targets=targets, scrape_interval=scrape_interval, scrape_timeout=scrape_timeout
    )
