"""The router's files: ``ddtree-router.service`` running ``smg launch`` (smg
:data:`~ddtree_ops.config.router.SMG_VERSION`) with the validated settings, and (with an API
key) the 0600 credential the unit hands smg through systemd's ``LoadCredential=``.

Every flag of :func:`router_argv` is an option of the pinned ``smg launch --help``
(``tests/fixtures/smg/launch-help-1.13.0.txt``; ``tests/test_router.py`` checks each).
"""

from __future__ import annotations

import json

from ..config.router import LEAVE_DEADLINE_S, Router
from .files import MANAGED, RenderedFile, _env, systemd_exec

UNIT_NAME = "ddtree-router.service"
CONFIG_DIR = "/etc/ddtree-router"
CREDENTIAL = "api-key"
"""Name of the API key credential (``$CREDENTIALS_DIRECTORY/api-key``, systemd.exec(5))."""
STOP_MARGIN_S = 30
"""The unit waits this long past smg's own drain (``--shutdown-grace-period-secs``) before SIGKILL."""


def router_argv(r: Router) -> list[str]:
    """``smg launch`` argv: listeners, workers, policy, limits, retries, circuit breaker, health.

    The API key is never in it: with one, the unit runs :mod:`ddtree_ops.router_launch`, which
    reads the credential and hands it to smg's own parser (argv is world-readable in
    ``/proc/PID/cmdline`` and lands in the unit file)."""
    s = r.settings
    h = s.health
    argv = ["--host", s.host, "--port", str(s.port), "--worker-urls", *r.workers, "--policy", s.policy,
            "--health-check-port", str(s.health_port), "--prometheus-host", s.host,
            "--prometheus-port", str(s.metrics_port),
            "--request-timeout-secs", str(s.request_timeout_secs),
            "--shutdown-grace-period-secs", str(s.shutdown_grace_secs),
            "--max-concurrent-requests", str(s.max_concurrent_requests), "--queue-size", str(s.queue_size),
            "--queue-timeout-secs", str(s.queue_timeout_secs),
            "--retry-max-retries", str(s.retry_max_retries),
            "--cb-failure-threshold", str(s.cb_failure_threshold),
            "--cb-timeout-duration-secs", str(s.cb_timeout_secs),
            "--health-failure-threshold", str(h.failure_threshold),
            "--health-success-threshold", str(h.success_threshold),
            "--health-check-timeout-secs", str(h.timeout_secs),
            "--health-check-interval-secs", str(h.interval_secs),
            "--health-check-endpoint", h.endpoint,
            # a worker whose health checks fail is dropped from the registry (after smg's
            # --drain-settle-secs), not kept to be readmitted when SGLang's /health answers again,
            # which is before its warmup: it comes back only when its host registers it once warm
            # (render_join). smg 1.13.0 `smg launch --help`: "unhealthy workers are removed so
            # service discovery re-registers and re-probes them".
            "--remove-unhealthy-workers"]
    if r.dp_aware:  # a DP-attention instance is one URL with dp_size ranks; smg routes to each rank
        argv.append("--dp-aware")
    return argv


def exec_argv(r: Router) -> list[str]:
    """The unit's ``ExecStart`` argv: ``smg launch ...``, or with an API key the launcher that
    adds it from the credential."""
    venv = r.settings.venv
    if r.api_key is None:
        return [f"{venv}/bin/smg", "launch", *router_argv(r)]
    return [f"{venv}/bin/python", "-m", "ddtree_ops.router_launch", CREDENTIAL, *router_argv(r)]


def render_router(r: Router) -> list[RenderedFile]:
    """The router host's files: its unit and (with an API key) the 0600 key file."""
    key_file = f"{CONFIG_DIR}/{CREDENTIAL}"
    ctx = {"managed": MANAGED, "host": r.host, "settings": r.settings, "workers": r.workers,
           "exec_start": systemd_exec(exec_argv(r)), "stop_timeout_s": r.settings.shutdown_grace_secs + STOP_MARGIN_S,
           "credential": f"{CREDENTIAL}:{key_file}" if r.api_key is not None else None}
    files = [RenderedFile(f"/etc/systemd/system/{UNIT_NAME}", _env().get_template("router.service.j2").render(ctx),
                          component="router")]
    if r.api_key is not None:
        files.append(RenderedFile(key_file, r.api_key, mode="0600", secret=True, component="router"))
    return files


def local_url(host: str, port: int) -> str:
    """``http://ADDRESS:PORT`` at which a process on the router host reaches a listener bound to
    ``host``: the wildcard addresses through loopback (``0.0.0.0`` -> ``127.0.0.1``, ``::`` ->
    ``[::1]``), any other address as itself (IPv6 bracketed)."""
    import ipaddress

    ip = ipaddress.ip_address(host)
    if ip.is_unspecified:
        ip = ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1")
    return f"http://[{ip}]:{port}" if ip.version == 6 else f"http://{ip}:{port}"


def router_facts(routers: list[Router], validated: list) -> dict:
    """What the ``router`` role and ``playbooks/rolling.yml`` need, from the validated routers:

    * ``routers``: router host -> ``{unit, unit_path, unit_content, key_path, user, venv, api,
      health, workers}``: the unit exactly as :func:`render_router` renders it (the role copies
      these bytes), the key file's path (its content is not here: the role writes the secret
      itself, under no_log), the local URLs of smg's API (``--port``) and health listener
      (``--health-check-port``);
    * ``router_fronts``: instance host -> ``[{router, api, worker, key_path}]`` (the routers that
      list it and its URL there).
    """
    from ..config.router import worker_url

    out: dict[str, dict] = {}
    fronts: dict[str, list[dict]] = {}
    by_url = {worker_url(v): v.deployment.host for v in validated}
    for r in routers:
        files = render_router(r)
        unit = next(f for f in files if f.path.endswith(UNIT_NAME))
        key = next((f.path for f in files if f.secret), None)
        api = local_url(r.settings.host, r.settings.port)
        out[r.host] = {"unit": UNIT_NAME, "unit_path": unit.path, "unit_content": unit.content, "key_path": key,
                       "user": r.settings.user, "venv": r.settings.venv, "api": api,
                       "health": local_url(r.settings.host, r.settings.health_port), "workers": list(r.workers),
                       "config_dir": CONFIG_DIR}
        for url in r.workers:
            if url in by_url:
                fronts.setdefault(by_url[url], []).append({"router": r.host, "api": api, "worker": url,
                                                           "key_path": key, "python": f"{r.settings.venv}/bin/python"})
    return {"routers": out, "router_fronts": fronts}


JOIN_DIR = "/etc/ddtree-router-join"
"""On an instance host: each SGLang unit's join config (0600, root: it holds the routers' keys)
and the rollout's hold marker."""
JOIN_CREDENTIAL = "join"
"""Name of the join config credential (``$CREDENTIALS_DIRECTORY/join``, systemd.exec(5))."""
JOIN_MARGIN_S = 30
"""``TimeoutStartSec`` of the join unit past its longest router deadline."""
JOIN_DROPIN = "ddtree-router-join.conf"


def join_unit_name(v) -> str:
    """The unit that registers instance ``v`` at its routers once warm (one per SGLang unit)."""
    return f"ddtree-{v.deployment.service.name}-router-join.service"


def join_paths(v) -> dict[str, str]:
    """Where the join files of instance ``v`` live on its host: ``unit``, ``dropin`` (the SGLang
    unit's drop-in that upholds the join unit), ``config`` (0600) and ``hold`` (present: a
    rollout holds the instance out of its routers; ``playbooks/rolling.yml``)."""
    unit = v.deployment.service.unit_name
    base = unit.removesuffix(".service")
    return {"unit_name": join_unit_name(v), "unit": f"/etc/systemd/system/{join_unit_name(v)}",
            "dropin": f"/etc/systemd/system/{unit}.d/{JOIN_DROPIN}", "config": f"{JOIN_DIR}/{base}.json",
            "hold": f"{JOIN_DIR}/{base}.hold"}


def remote_api(r: Router) -> str:
    """``http://ADDRESS:PORT`` of router ``r``'s API as another machine reaches it: its
    ``ansible_host`` (or name) when smg listens on a wildcard address, else the address it listens on."""
    import ipaddress

    from ..config.scrape import url_host

    ip = ipaddress.ip_address(r.settings.host)
    return f"http://{url_host(r.address or r.host) if ip.is_unspecified else url_host(r.settings.host)}:" \
           f"{r.settings.port}"


def join_config(v, routers: list[Router]) -> dict:
    """The join config of instance ``v`` (its worker URL, each router's API, key and deadline, the
    hold marker): what ``python -m ddtree_ops.fleet.router_worker join`` reads."""
    from ..config.router import worker_url

    return {"worker": worker_url(v), "hold": join_paths(v)["hold"],
            "routers": [{"name": r.host, "api": remote_api(r), "key": r.api_key,
                         "deadline_s": r.settings.join_deadline_s} for r in routers]}


def render_join(v, routers: list[Router]) -> list[RenderedFile]:
    """The files that register warm instance ``v`` at ``routers`` (component ``router_join``,
    installed by the ``ddtree_service`` role; none without a router in front of it):

    * ``ddtree-<name>-router-join.service``: a oneshot that runs ``router_worker join`` with the
      config as a credential; ``BindsTo=``/``After=`` the SGLang unit;
    * a drop-in of the SGLang unit, ``Upholds=`` the join unit, so every time the SGLang unit
      turns ``active`` (warm, after its ``ExecStartPost`` warmup), systemd starts the join again,
      automatic restarts after a crash included;
    * the config (0600, ``secret``): the routers' keys, never in argv or a world-readable file.

    None of them is the SGLang unit or part of its release: a changed router list rewrites these
    and restarts only the join, never the GPU server."""
    if not routers or not v.deployment.serves_http:
        return []
    paths = join_paths(v)
    svc = v.deployment.service
    argv = [f"{svc.venv}/bin/python", "-m", "ddtree_ops.fleet.router_worker", "join", "--credential", JOIN_CREDENTIAL]
    leave = [*argv[:3], "leave", "--credential", JOIN_CREDENTIAL, "--deadline", f"{LEAVE_DEADLINE_S:g}"]
    ctx = {"managed": MANAGED, "host": v.deployment.host, "sglang_unit": svc.unit_name, "join_unit": paths["unit_name"],
           "user": svc.user, "group": svc.group, "exec_start": systemd_exec(argv), "exec_stop": systemd_exec(leave),
           "timeout_stop_s": int(LEAVE_DEADLINE_S) + JOIN_MARGIN_S,
           "credential": f"{JOIN_CREDENTIAL}:{paths['config']}", "routers": [r.host for r in routers],
           "timeout_start_s": max(r.settings.join_deadline_s for r in routers) + JOIN_MARGIN_S}
    env = _env()
    return [
        RenderedFile(paths["unit"], env.get_template("router-join.service.j2").render(ctx), component="router_join"),
        RenderedFile(paths["dropin"], env.get_template("router-join.conf.j2").render(ctx), component="router_join"),
        RenderedFile(paths["config"],
                     json.dumps(join_config(v, routers), indent=1, sort_keys=True, allow_nan=False) + "\n",
                     mode="0600", secret=True, component="router_join"),
    ]
