"""Checks across the deployments of one inventory (the fleet), after each passed on its own.

Several instances on one machine: an *instance* is one inventory host (one
deployment, one ``ddtree-<name>.service``); a *machine* is what the inventory hosts reach:
inventory hosts sharing one ``ansible_host`` (else inventory name) or scrape address are
instances of one machine, as in Ansible's own model (several inventory names, one
``ansible_host``). ``inventory/multi-example`` is a ct200 with two tp-4 instances.

Instances of one machine must hold disjoint resources, else refused at validate time with
one finding naming both instances:

* ports: SGLang ``ddtree_server.port``, ``ddtree_ops.exporter_port`` and the rendezvous
  port (``--nccl-port``, :attr:`~.service_models.Server.rendezvous_port`), all against all (one
  listener per address and port, ip(7) EADDRINUSE; Prometheus gets one target per instance);
* unit names (``ddtree_service.name``: units, env files and default directories derive from it);
* directories: config, state, cache, runtime (``RuntimeDirectory``) and the Prometheus
  multiprocess directory (:func:`~.instance.state_dirs`); one inside another also clashes;
* GPUs: :func:`~.instance.gpu_set` (``CUDA_VISIBLE_DEVICES`` / ``base_gpu_id``, tp x dp);
* rank 0 of a multi-node server also holds its torch.distributed store port
  (``ddtree_server.multinode.dist_init_port``) on its machine; the nodes of one such server are
  checked against each other by :func:`~.multinode_fleet.multinode_findings`;
* the service account (``ddtree_service.user``: its home is the instance's state directory);
* a shared SGLang venv (``ddtree_service.sglang_venv``) must hold one SGLang pin.

Machines are compared by name as written (IP addresses in canonical form, IPv4-mapped IPv6
as IPv4, host names case-insensitively: RFC 4343; every loopback address and ``localhost``
are one machine, RFC 6761 §6.3); no DNS lookup is made, so two different names of one
machine are not recognised.

Callers: ``ddtree-ops validate/plan/render`` (:func:`ddtree_ops.cli._validate_all`) and the
``ddtree_prometheus`` action plugin (deploy.yml's first play).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .errors import Finding
from .instance import VISIBLE_ENV, GpuSetError, gpu_set, listen_ports, paths_overlap, state_dirs
from .load import Validated
from .multinode_fleet import multinode_findings
from .scrape import machine_name, scrape_host

SOURCE = "one listener per address and port (ip(7) EADDRINUSE); Prometheus static_configs targets"


def machine_names(v: Validated) -> tuple[str, ...]:
    """The names under which ``v``'s machine is reached: the deploy address (``ansible_host``,
    else the inventory name, as Ansible connects) and the scrape address (:func:`~.scrape.scrape_host`)."""
    d = v.deployment
    return tuple(dict.fromkeys((machine_name(d.address or d.host), machine_name(scrape_host(d)))))


def machines(validated: Iterable[Validated]) -> dict[str, list[str]]:
    """Machine name -> the inventory hosts (instances) that reach it, in name order."""
    unique = {v.deployment.host: v for v in validated}
    out: dict[str, list[str]] = {}
    for host in sorted(unique):
        for name in machine_names(unique[host]):
            out.setdefault(name, []).append(host)
    return out


MAX_WAVES = 8
"""Most instances one machine can hold: each needs at least one GPU of its own and the largest
built-in host class has 8 (:data:`~.hosts.HOST_CLASSES`; a larger class of ``ddtree_host_classes``
still takes at most this many instances); deploy.yml has one service play per wave."""


def instance_waves(validated: Iterable[Validated]) -> dict[str, int]:
    """Inventory host -> its deploy wave: its position among the instances of its machine
    (0 for the first in name order). deploy.yml deploys wave 0 of every machine in parallel,
    then wave 1, ...: instances of one machine never run the role at once (they share apt,
    the venvs and the wheelhouse), distinct machines still do. At most :data:`MAX_WAVES`
    waves for a fleet :func:`fleet_findings` accepts (disjoint GPUs)."""
    waves: dict[str, int] = {}
    for hosts in machines(validated).values():
        for i, host in enumerate(hosts):
            waves[host] = max(waves.get(host, 0), i)
    return waves


def _gpus(v: Validated) -> tuple[int, ...]:
    try:
        return gpu_set(v.deployment)
    except GpuSetError:  # refused by rule_gpu_set already; nothing to compare
        return ()


def _clashes(a: Validated, b: Validated) -> Iterator[tuple[str, object, str, str]]:
    """(field of a, value, what both claim, b's side) for each resource ``a`` and ``b`` share."""
    da, db = a.deployment, b.deployment
    for field, port in listen_ports(da):
        for other, oport in listen_ports(db):
            if port == oport:
                yield field, port, f"port {port}", other
                break
    if da.service.name == db.service.name:
        yield ("ddtree_service.name", da.service.name,
               f"unit {da.service.unit_name} (and its env file and default directories)", "ddtree_service.name")
    if da.service.user == db.service.user:
        yield ("ddtree_service.user", da.service.user,
               f"service account {da.service.user} (its home is one instance's state directory; the other instance "
               "could read its cache and state)", "ddtree_service.user")
    for field, path in dict(state_dirs(da)).items():
        for other, opath in state_dirs(db):
            if paths_overlap(path, opath):
                yield field, path, f"directory {path}" + ("" if path == opath else f" (overlapping {opath})"), other
                break
    shared = sorted(set(_gpus(a)) & set(_gpus(b)))
    if shared:
        yield ("ddtree_server.base_gpu_id", da.server.base_gpu_id or 0,
               f"GPU {','.join(map(str, shared))} ({da.host}: {_gpu_text(da)}, {db.host}: {_gpu_text(db)})",
               "ddtree_server.base_gpu_id")
    if da.service.sglang_venv_path == db.service.sglang_venv_path and da.sglang != db.sglang:
        yield ("ddtree_service.sglang_venv", da.service.sglang_venv_path,
               f"SGLang venv {da.service.sglang_venv_path} with different ddtree_sglang pins (the second install "
               "replaces the first's build)", "ddtree_service.sglang_venv")


def _as_set(d, field: str, value: object) -> tuple[object, str]:
    """``(value as the inventory sets it, how it came about)`` of a clashing ``field``: the value and
    ``""`` when the inventory sets it; ``None`` and ``" (not set: derived VALUE)"`` when the value is a
    default or derived from other fields (the rendezvous port from ``ddtree_server.port``, the directories
    from ``ddtree_service.name``), so no message shows a value the operator never wrote as theirs."""
    parts = field.split(" ", 1)[0].split(".")
    sections = {"ddtree_server": d.server, "ddtree_ops": d.ops, "ddtree_service": d.service}
    section = sections.get(parts[0])
    if section is None or len(parts) < 2:
        return value, ""
    if parts[1] == "env" and len(parts) > 2:
        written = parts[2] in section.env
    else:
        written = parts[1] in section.model_fields_set and getattr(section, parts[1], None) is not None
    if written and " " not in field:
        return value, ""
    return None, f" (not set: derived {value})"


def _gpu_text(d) -> str:
    env = d.service.env.get(VISIBLE_ENV)
    return (f"tp {d.server.tp_size} x dp {d.server.dp_size} from base_gpu_id {d.server.base_gpu_id or 0}"
            + (f" of {VISIBLE_ENV}={env}" if env else ""))


_FIX = {
    "ddtree_service.name": "give each instance of the machine its own ddtree_service.name",
    "ddtree_service.user": "give each instance of the machine its own ddtree_service.user (e.g. the service name)",
    "ddtree_server.base_gpu_id": "give each instance its own GPUs: ddtree_server.base_gpu_id or "
                                 "ddtree_service.env.CUDA_VISIBLE_DEVICES (e.g. 0,1,2,3 and 4,5,6,7)",
    "ddtree_service.sglang_venv": "pin the same ddtree_sglang for both, or give one its own ddtree_service.sglang_venv",
}


def fleet_findings(validated: Iterable[Validated], focus: set[str] | None = None) -> list[Finding]:
    """Clashes between instances on one machine (see the module docstring).

    Args:
        validated: deployments that each passed validation (a host listed twice counts once).
        focus: report only clashes involving these hosts (``--limit``); ``None``: all. A
            clash is reported on the later host in name order, or on the focused one.

    Returns:
        One error finding per clashing (host, field), naming both hosts, the shared machine
        name and the value; empty when there is none.
    """
    unique = {v.deployment.host: v for v in validated}
    pairs: dict[tuple[str, str], str] = {}
    for name, hosts in machines(unique.values()).items():
        for i, later in enumerate(hosts):
            for earlier in hosts[:i]:
                pairs.setdefault((later, earlier), name)
    out: list[Finding] = []
    reported: set[tuple[str, str]] = set()
    for (later, earlier), name in sorted(pairs.items()):
        if focus is not None and later not in focus:
            if earlier not in focus:
                continue
            host_r, other_r = earlier, later
        else:
            host_r, other_r = later, earlier
        for field_r, value, what, other_field_r in _clashes(unique[host_r], unique[other_r]):
            if (host_r, field_r) in reported:
                continue
            reported.add((host_r, field_r))
            fix = _FIX.get(field_r) or (
                f"give {host_r} its own ansible_host / ddtree_ops.scrape_host, or (several instances on one machine) "
                "its own ddtree_server.port, ddtree_ops.exporter_port, ddtree_server.nccl_port and directories")
            shown, how = _as_set(unique[host_r].deployment, field_r, value)
            other_how = _as_set(unique[other_r].deployment, other_field_r, value)[1]
            out.append(Finding(
                "error", field_r, shown,
                f"{host_r} and {other_r} both reach machine {name} and both claim {what} ({host_r}: {field_r}{how}, "
                f"{other_r}: {other_field_r}{other_how}); one machine cannot serve both (the second start fails or "
                "replaces the first, and Prometheus would scrape one target for two hosts)", fix, SOURCE,
                host=host_r))
    out += _class_clashes(unique, focus)
    out += multinode_findings(unique.values(), {h: machine_names(v)[0] for h, v in unique.items()}, focus)
    return out


def _class_clashes(unique: dict[str, Validated], focus: set[str] | None) -> list[Finding]:
    """One machine is one host class: two hosts reaching the same machine with different
    ``ddtree_host_class`` would render different GPU counts, arches and device units for it."""
    first: dict[str, tuple[str, str]] = {}
    out: list[Finding] = []
    for host in sorted(unique):
        d = unique[host].deployment
        for name in machine_names(unique[host]):
            other = first.setdefault(name, (host, d.host_class))
            if other[1] == d.host_class or (focus is not None and host not in focus and other[0] not in focus):
                continue
            out.append(Finding(
                "error", "ddtree_host_class", d.host_class,
                f"{host} and {other[0]} both reach machine {name} but say it is a {d.host_class} and a {other[1]}",
                "list the machine under one host-class group only (one inventory name, or the same class for both)",
                SOURCE, host=host))
            break
    return out
