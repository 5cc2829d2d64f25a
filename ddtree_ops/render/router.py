"""The router's files: ``ddtree-router.service`` running ``smg launch`` (smg
:data:`~ddtree_ops.config.router.SMG_VERSION`) with the validated settings, and (with an API
key) the 0600 credential the unit hands smg through systemd's ``LoadCredential=``.

Every flag of :func:`router_argv` is an option of the pinned ``smg launch --help``
(``tests/fixtures/smg/launch-help-1.13.0.txt``; ``tests/test_router.py`` checks each).
"""

from __future__ import annotations

from ..config.router import Router
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
            "--health-check-endpoint", h.endpoint]
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
