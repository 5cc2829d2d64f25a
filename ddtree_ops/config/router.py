"""Settings of the model gateway in front of the fleet: SGLang's router, published on PyPI as
``smg`` (Shepherd Model Gateway; formerly ``sglang-router``), pinned to :data:`SMG_VERSION`.

An inventory group :data:`ROUTER_GROUP` lists the router hosts; each sets
``ddtree_router:`` (:class:`RouterSettings`). The worker list is not written by hand: it is
derived from the inventory's validated instances (:func:`worker_urls`), so a router never
points at a port or address the instances do not have. Every check here is one finding
(field, value, rule, fix); an inventory without the group yields no router and no finding,
so everything rendered for it stays as it was.

Source of every flag and default: ``smg launch --help`` of smg 1.13.0 (the wheel
:data:`SMG_WHEEL`, recorded in ``tests/fixtures/smg/launch-help-1.13.0.txt``), whose
``--port`` defaults to 30000 — SGLang's own default port — hence the port checks against
every instance port on the router's machine.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from .errors import Finding, findings_from_validation_error, type_name
from .fields import HostText, Port, _bounded, _fail, _Model, inventory_name_problem
from .hostvars import ENTRY_NAME
from .instance import DP_ATTENTION_FLAG, listen_ports
from .load import Validated
from .multinode import ENGINE_SOURCE as MULTINODE_SOURCE

ROUTER_GROUP = "routers"
"""Inventory group of the router hosts (each needs ``ddtree_router``)."""
ROUTER_VAR = "ddtree_router"
SECRET_VAR = "ddtree_secret_env"
"""Where a router's API key lives (vault the value); ``ddtree_router.api_key_secret`` names its entry."""

SMG_VERSION = "1.13.0"
SMG_WHEEL = "smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
SMG_SHA256 = "cfae8171dac68a74b4822263b1864fa79952992ee472a25ba7266ccd200399b4"
"""sha256sum of :data:`SMG_WHEEL` as PyPI serves it (``pip download smg==1.13.0 --no-deps``)."""
SMG_SOURCE = f"smg {SMG_VERSION} `smg launch --help` (tests/fixtures/smg/launch-help-{SMG_VERSION}.txt)"

LEAVE_DEADLINE_S = 15
"""Seconds the join unit's stop (``router_worker leave``) may take at each router: ``DELETE``, then
smg's ``--drain-settle-secs`` (5 s by default) until the router no longer lists the worker. A restart
of the SGLang unit after a crash waits for it (systemd runs a stop job before a start job of two
units ordered against each other), so it is short."""

POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
            "consistent_hashing", "prefix_hash")
"""``--policy`` choices of smg 1.13.0."""

Policy = Literal["random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
                 "consistent_hashing", "prefix_hash"]
_SECRET_NAME = ENTRY_NAME
_ENDPOINT = re.compile(r"/[A-Za-z0-9._~/-]{0,127}")


def _listen_ip(v: str) -> str:
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        raise _fail("must be an IP address to listen on (no host name, no scope id)",
                    "use 0.0.0.0, :: or one of the router host's addresses") from None
    if getattr(ip, "scope_id", None):
        raise _fail("must be an IP address without a scope id", "listen on :: or a global address")
    return v


ListenIP = Annotated[str, AfterValidator(_listen_ip)]


class HealthCheck(_Model):
    """Worker health probing (smg ``--health-*``; smg requires each at least 1)."""

    failure_threshold: _bounded(1, 100) = 3
    success_threshold: _bounded(1, 100) = 2
    timeout_secs: _bounded(1, 300) = 5
    interval_secs: _bounded(1, 3600) = 10
    endpoint: str = "/health"

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not _ENDPOINT.fullmatch(v):
            raise _fail("must be an absolute URL path of letters, digits and ._~/- (at most 128 characters)",
                        "use /health (SGLang's health route) or /health_generate")
        return v

    @model_validator(mode="after")
    def _timeout_below_interval(self) -> HealthCheck:
        if self.timeout_secs > self.interval_secs:
            raise _fail(f"timeout_secs {self.timeout_secs} exceeds interval_secs {self.interval_secs}: probes of one "
                        "worker would overlap", "make timeout_secs <= interval_secs")
        return self


class RouterSettings(_Model):
    """``ddtree_router:`` of one router host.

    Attributes:
        policy: smg ``--policy``.
        host: address the gateway listens on (``--host``; also the probe and metrics listeners).
        port: client port (``--port``; smg's default 30000 is SGLang's, so ours is 30080).
        health_port: dedicated liveness/readiness listener (``--health-check-port``).
        metrics_port: Prometheus ``smg_*`` metrics (``--prometheus-port``).
        request_timeout_secs, shutdown_grace_secs: ``--request-timeout-secs`` and the SIGTERM
            drain (``--shutdown-grace-period-secs``; the unit's stop timeout is longer).
        max_concurrent_requests, queue_size, queue_timeout_secs: admission (``-1``: smg derives it).
        retry_max_retries, cb_failure_threshold, cb_timeout_secs: retries and circuit breaker.
        health: :class:`HealthCheck`.
        join_deadline_s: total seconds a warm worker's host keeps trying to register itself here
            (``ddtree-<name>-router-join.service``, :func:`ddtree_ops.render.router.render_join`)
            before it gives up and logs why; long enough to ride out a router restart.
        api_key_secret: name of the ``ddtree_secret_env`` entry holding the workers' API key
            (never the key itself; it reaches smg through a 0600 credential, never argv).
        instances: inventory names of the instances to front; empty: every instance.
        user: the service account (its own; not root).
        venv: the virtualenv the router role installs smg into.
    """

    policy: Policy = "cache_aware"
    host: ListenIP = "0.0.0.0"
    port: Port = 30080
    health_port: Port = 30081
    metrics_port: Port = 29000
    request_timeout_secs: _bounded(1, 86400) = 1800
    shutdown_grace_secs: _bounded(1, 3600) = 180
    max_concurrent_requests: Annotated[int, Field(ge=-1, le=1_000_000)] = -1
    queue_size: _bounded(0, 1_000_000) = 100
    queue_timeout_secs: _bounded(1, 3600) = 60
    retry_max_retries: _bounded(1, 20) = 5
    cb_failure_threshold: _bounded(1, 10_000) = 10
    cb_timeout_secs: _bounded(1, 3600) = 60
    join_deadline_s: _bounded(10, 3600) = 300
    health: HealthCheck = Field(default_factory=HealthCheck)
    api_key_secret: str | None = None
    instances: Annotated[list[HostText], Field(max_length=256)] = Field(default_factory=list)
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,30}$")] = "ddtree-router"
    venv: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]{1,200}$")] = "/opt/ddtree-router/venv"

    @field_validator("api_key_secret")
    @classmethod
    def _secret_name(cls, v: str | None) -> str | None:
        if v is not None and not _SECRET_NAME.fullmatch(v):
            raise _fail("must be the NAME of a ddtree_secret_env entry (upper-case letters, digits, _), not a key",
                        "put the key in ddtree_secret_env (ansible-vault it) and give its name, e.g. ROUTER_API_KEY")
        return v

    @field_validator("user")
    @classmethod
    def _not_root(cls, v: str) -> str:
        if v == "root":
            raise _fail("the router runs as its own unprivileged account, never root", "use ddtree-router")
        return v


@dataclass(frozen=True)
class Router:
    """One validated router host with the workers it fronts (in inventory-name order)."""

    host: str
    address: str | None
    settings: RouterSettings
    workers: tuple[str, ...]
    dp_aware: bool
    api_key: str | None


_FIELD_PREFIX = {"settings": ROUTER_VAR}


def _finding(host: str, field: str, value: Any, rule: str, fix: str, source: str = SMG_SOURCE) -> Finding:
    return Finding("error", field, value, rule, fix, source, host=host)


def worker_url(v: Validated) -> str:
    """The URL a router reaches instance ``v`` at: ``http://<ansible_host or name>:<port>``
    (SGLang serves plain HTTP; IPv6 bracketed)."""
    from .scrape import url_host

    d = v.deployment
    return f"http://{url_host(d.address or d.host)}:{d.server.port}"


def _dp_attention(v: Validated) -> bool:
    return v.deployment.server.extra_args.get(DP_ATTENTION_FLAG) is True


def _machine(address: str) -> str:
    from .scrape import machine_name

    return machine_name(address)


def validate_routers(router_vars: dict[str, dict[str, Any]], validated: Iterable[Validated]
                     ) -> tuple[list[Router], list[Finding]]:
    """Validate every router host against the fleet's validated instances.

    Args:
        router_vars: ``{router host: its variables}`` (``ddtree_router``, ``ansible_host``,
            ``ddtree_secret_env``), as :func:`load_router_vars` returns them.
        validated: the instances that passed validation (the whole inventory's).

    Returns:
        ``(routers, errors)``: a router is returned only when it has no error.
    """
    instances = {v.deployment.host: v for v in validated}
    routers: list[Router] = []
    errors: list[Finding] = []
    claimed: dict[tuple[str, int], str] = {}  # (machine, port) -> "host's field" of earlier routers
    for host in sorted(router_vars):
        found: list[Finding] = []
        router = _one_router(host, router_vars[host], instances, claimed, found)
        errors.extend(found)
        if router is not None and not found:
            routers.append(router)
    return routers, errors


def _one_router(host: str, hv: dict[str, Any], instances: dict[str, Validated], claimed: dict[tuple[str, int], str],
                found: list[Finding]) -> Router | None:
    problem = inventory_name_problem(host)
    if problem:
        found.append(_finding(host, "inventory_hostname", host, problem,
                              "rename the router host (put the address in ansible_host)", ""))
        return None
    if host in instances:
        found.append(_finding(host, "group_names", ROUTER_GROUP,
                              "a host is either an SGLang instance or a router, not both (each inventory host "
                              "is one service)", "add a second inventory name for the router with the same "
                              "ansible_host", ""))
        return None
    raw = hv.get(ROUTER_VAR)
    if not isinstance(raw, dict):
        found.append(_finding(host, ROUTER_VAR, None if raw is None else type_name(raw),
                              f"every host of group {ROUTER_GROUP} needs {ROUTER_VAR} as a mapping",
                              f"set {ROUTER_VAR}: {{policy: cache_aware}} in its group_vars/host_vars"))
        return None
    try:
        settings = RouterSettings.model_validate(raw)
    except ValidationError as exc:
        found.extend(_prefixed(f) for f in findings_from_validation_error(exc, host, {}))
        return None
    address = hv.get("ansible_host")
    if address is not None:
        from .errors import RULE_FIX_SEP
        from .fields import _ip_or_host  # one definition of a host name / address

        try:
            address = _ip_or_host(str(address))
        except ValueError as exc:
            rule, _, fix = str(exc).partition(RULE_FIX_SEP)
            found.append(_finding(host, "ansible_host", address, rule, fix or "give an IP address or name", ""))
            return None
    chosen = _chosen(host, settings, instances, found)
    machine = _machine(address or host)
    _port_clashes(host, settings, machine, instances, claimed, found)
    for v in chosen:
        if _machine(v.deployment.address or v.deployment.host) != machine and \
                ipaddress.ip_address(v.deployment.server.host).is_loopback:
            found.append(_finding(host, f"{ROUTER_VAR}.instances", v.deployment.host,
                                  f"{v.deployment.host} listens on {v.deployment.server.host} (loopback only): a "
                                  f"router on machine {machine} cannot reach it",
                                  f"set {v.deployment.host}'s ddtree_server.host to 0.0.0.0 (or its address), or "
                                  "leave it out of instances", ""))
    models = sorted({v.deployment.model.served_model_name or v.deployment.model.path for v in chosen})
    if len(models) > 1:
        found.append(_finding(host, f"{ROUTER_VAR}.instances", models,
                              "one router in single-model mode sends any request to any worker: its instances "
                              f"must serve one model, these serve {len(models)}",
                              "give each model its own router (list its instances in instances)"))
    return Router(host, address, settings, tuple(worker_url(v) for v in chosen),
                  any(_dp_attention(v) for v in chosen), _api_key(host, settings, hv, found))


def _port_clashes(host: str, settings: RouterSettings, machine: str, instances: dict[str, Validated],
                  claimed: dict[tuple[str, int], str], found: list[Finding]) -> None:
    """The router's three ports: distinct, used by no instance of its machine (server, exporter,
    rendezvous port) and by no earlier router of it."""
    own: dict[int, str] = {}
    on_machine = [v for v in instances.values()
                  if machine in {_machine(v.deployment.address or v.deployment.host),
                                 _machine(v.deployment.ops.scrape_host or v.deployment.address or v.deployment.host)}]
    for name in ("port", "health_port", "metrics_port"):
        port = getattr(settings, name)
        field = f"{ROUTER_VAR}.{name}"
        if port in own:
            found.append(_finding(host, field, port, f"{field} {port} is also {ROUTER_VAR}.{own[port]}: one "
                                  "listener per port (ip(7) EADDRINUSE)",
                                  "give port, health_port and metrics_port three different ports"))
            continue
        own[port] = name
        for v in on_machine:
            for ifield, iport in listen_ports(v.deployment):
                if iport == port:
                    found.append(_finding(host, field, port,
                                          f"{field} {port} clashes with {v.deployment.host}'s {ifield} on machine "
                                          f"{machine} (one listener per address and port, ip(7) EADDRINUSE; smg's "
                                          "default port 30000 is SGLang's too)",
                                          f"give {field} a port no instance of {machine} uses"))
        other = claimed.get((machine, port))
        if other is not None:
            found.append(_finding(host, field, port, f"{field} {port} is also {other} on machine {machine}",
                                  "give each router of one machine its own ports"))
        claimed.setdefault((machine, port), f"{host}'s {field}")


def _api_key(host: str, settings: RouterSettings, hv: dict[str, Any], found: list[Finding]) -> str | None:
    """The key ``api_key_secret`` names in the router host's ``ddtree_secret_env``."""
    if settings.api_key_secret is None:
        return None
    secrets = hv.get(SECRET_VAR) or {}
    value = secrets.get(settings.api_key_secret) if isinstance(secrets, dict) else None
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if not isinstance(value, str) or not value:
        found.append(Finding.naming("error", f"{ROUTER_VAR}.api_key_secret", settings.api_key_secret,
                                    f"names no non-empty entry of the router host's {SECRET_VAR}",
                                    f"add {settings.api_key_secret} to {SECRET_VAR} (ansible-vault it) for "
                                    f"{host}, or remove api_key_secret", host=host))
        return None
    return value


def _prefixed(f: Finding) -> Finding:
    from dataclasses import replace

    return replace(f, field=f"{ROUTER_VAR}.{f.field}" if f.field != "<deployment>" else ROUTER_VAR)


def _chosen(host: str, s: RouterSettings, instances: dict[str, Validated], found: list[Finding]) -> list[Validated]:
    """The workers: every instance (``instances`` empty) or the listed ones; of a multi-node server
    (``ddtree_server.multinode``) only rank 0, the one node serving the API (a node of rank >= 1
    answers only ``/health``: :mod:`.multinode`)."""
    if not s.instances:
        if not instances:
            found.append(_finding(host, f"{ROUTER_VAR}.instances", [], "no valid SGLang instance to route to",
                                  "fix the instances' errors first, or add instances under sglang_servers", ""))
        return [instances[h] for h in sorted(instances) if instances[h].deployment.serves_http]
    out = []
    for name in s.instances:
        if name in instances and not instances[name].deployment.serves_http:
            rank0 = instances[name].deployment.server.multinode.nodes[0]
            found.append(_finding(host, f"{ROUTER_VAR}.instances", name,
                                  f"is node rank {instances[name].deployment.node_rank} of a multi-node server: it "
                                  "serves no API (SGLang's health-only server), only rank 0 does",
                                  f"list {rank0} (rank 0) instead", MULTINODE_SOURCE))
        elif name not in instances:
            found.append(_finding(host, f"{ROUTER_VAR}.instances", name,
                                  "names no valid SGLang instance of this inventory",
                                  "list inventory names of hosts under sglang_servers (ddtree-ops validate lists "
                                  "them)", ""))
        else:
            out.append(instances[name])
    if len(set(s.instances)) != len(s.instances):
        found.append(_finding(host, f"{ROUTER_VAR}.instances", s.instances, "lists an instance twice",
                              "list each instance once", ""))
    return out


def routers_for(router_vars: dict[str, dict[str, Any]], v: Validated) -> tuple[list[Router], list[Finding]]:
    """The routers in front of instance ``v`` alone (what its host needs to register itself there
    once warm): each router of ``router_vars`` whose ``instances`` is empty or names ``v``, with
    ``workers`` just ``v``'s URL. A node of rank >= 1 of a multi-node server has none: only rank 0
    serves the API (:mod:`.multinode`). The fleet-wide checks (ports of a machine, instances
    that do not exist, one model per router) are :func:`validate_routers`' (deploy.yml's fleet
    check runs them first); this only refuses what it cannot render: bad settings, a bad
    ``ansible_host``, a missing key."""
    if not v.deployment.serves_http:
        return [], []
    out: list[Router] = []
    found: list[Finding] = []
    for host in sorted(router_vars):
        hv = router_vars[host]
        raw = hv.get(ROUTER_VAR)
        if not isinstance(raw, dict):  # never the defaults (every instance) for a router without settings
            found.append(_finding(host, ROUTER_VAR, None if raw is None else type(raw).__name__,
                                  f"every host of group {ROUTER_GROUP} needs {ROUTER_VAR} as a mapping",
                                  f"set {ROUTER_VAR}: {{policy: cache_aware}} in its group_vars/host_vars"))
            continue
        try:
            settings = RouterSettings.model_validate(raw)
        except ValidationError as exc:
            found.extend(_prefixed(f) for f in findings_from_validation_error(exc, host, {}))
            continue
        if settings.instances and v.deployment.host not in settings.instances:
            continue
        address = hv.get("ansible_host")
        if address is not None:
            from .errors import RULE_FIX_SEP
            from .fields import _ip_or_host

            try:
                address = _ip_or_host(str(address))
            except ValueError as exc:
                rule, _, fix = str(exc).partition(RULE_FIX_SEP)
                found.append(_finding(host, "ansible_host", address, rule, fix or "give an IP address or name", ""))
                continue
        key = _api_key(host, settings, hv, found)
        if settings.api_key_secret is None or key is not None:
            out.append(Router(host, address, settings, (worker_url(v),), _dp_attention(v), key))
    return out, found


def load_router_vars(inventory: str, vault_password_files: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """``{router host: variables}`` of group :data:`ROUTER_GROUP`; ``{}`` when there is none.

    The same loader as the instances' (:func:`.inventory.load_hostvars`: vault, templating
    deadline, size bounds), pointed at the router group."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    from .errors import ConfigError
    from .hostvars import deployment_vars
    from .inventory import (
        TEMPLATE_DEADLINE_S,
        TemplateTimeout,
        _ansible_failures,
        _deadline,
        _template_if_marked,
        _vault_secrets,
    )

    loader = DataLoader()
    with _ansible_failures([], []):
        _vault_secrets(loader, list(vault_password_files))
        inv = InventoryManager(loader=loader, sources=[str(inventory)])
        if ROUTER_GROUP not in inv.groups:
            return {}
        vm = VariableManager(loader=loader, inventory=inv)
        out: dict[str, dict[str, Any]] = {}
        memo: dict = {}
        for h in inv.get_hosts(ROUTER_GROUP):
            all_vars = vm.get_vars(host=h, include_hostvars=False)
            templar = Templar(loader=loader, variables=all_vars)
            try:
                with _deadline(TEMPLATE_DEADLINE_S):
                    out[str(h.name)] = deployment_vars(all_vars, _template_if_marked(templar, memo), str(h.name), memo)
            except TemplateTimeout:
                raise ConfigError([Finding("error", ROUTER_VAR, "…", f"templating took longer than "
                                           f"{TEMPLATE_DEADLINE_S:g} s", "simplify the Jinja of its variables",
                                           host=h.name)]) from None
        return out
