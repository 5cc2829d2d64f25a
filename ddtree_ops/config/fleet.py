"""Checks across the deployments of one inventory (the fleet), after each passed on its own.

One machine, one instance per port and unit: two inventory hosts that reach the same
machine (the same ``ansible_host``, else inventory name, or the same scrape address) with
the same SGLang or exporter port, or the same service name, would install the same unit
name and listen on one port twice, and Prometheus would get duplicate targets for two
hosts (each ``host:port`` is one target; the second job's labels would be attributed to the
first). Refused at validate time naming both hosts. Modelling several instances on one
machine (shared devices, per-instance units) is a later issue; this is the clash check.

Machines are compared by name as written (IP addresses in canonical form, host names
case-insensitively: RFC 4343); no DNS lookup is made, so two different names of one machine
are not recognised.

Callers: ``ddtree-ops validate/plan/render`` (:func:`ddtree_ops.cli._validate_all`) and the
``ddtree_prometheus`` action plugin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ..render.files import scrape_address
from .errors import Finding
from .load import Validated

SOURCE = "one listener per address and port (ip(7) EADDRINUSE); Prometheus static_configs targets"


def _norm(address: str) -> str:
    """A machine name for comparison: IP addresses canonical (``[::1]``, ``0:0::1`` -> ``::1``),
    names lower-case (DNS names compare case-insensitively, RFC 4343)."""
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return bare.lower()
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:10.0.0.5 is 10.0.0.5 (RFC 4291 §2.5.5.2)
    return (mapped or ip).compressed


def machine_names(v: Validated) -> tuple[str, ...]:
    """The names under which ``v``'s machine is reached: the deploy address (``ansible_host``,
    else the inventory name, as Ansible connects) and the scrape address (:func:`scrape_address`)."""
    d = v.deployment
    return tuple(dict.fromkeys((_norm(d.address or d.host), _norm(scrape_address(v)))))


def _claims(v: Validated) -> list[tuple[str, str, object]]:
    """(kind, field, value) each deployment holds exclusively on its machine."""
    d = v.deployment
    return [("port", "ddtree_server.port", d.server.port), ("port", "ddtree_ops.exporter_port", d.ops.exporter_port),
            ("unit", "ddtree_service.name", d.service.name)]


def fleet_findings(validated: Iterable[Validated], focus: set[str] | None = None) -> list[Finding]:
    """Clashes between deployments on one machine (see the module docstring).

    Args:
        validated: deployments that each passed validation (a host listed twice counts once).
        focus: report only clashes involving these hosts (``--limit``); ``None``: all. A
            clash is reported on the later host in name order, or on the focused one.

    Returns:
        One error finding per clashing (host, field), naming both hosts, the shared machine
        name and the value; empty when there is none.
    """
    unique = {v.deployment.host: v for v in validated}
    owner: dict[tuple[str, str, object], tuple[str, str]] = {}
    out: list[Finding] = []
    reported: set[tuple[str, str]] = set()
    for host in sorted(unique):
        v = unique[host]
        names = machine_names(v)
        for kind, field, value in _claims(v):
            for name in names:
                key = (name, kind, value)
                first = owner.get(key)
                if first is None:
                    owner[key] = (host, field)
                    continue
                other_host, other_field = first
                if other_host == host:
                    continue  # rule_ports covers a deployment clashing with itself
                if focus is not None and host not in focus:
                    if other_host not in focus:
                        continue
                    host_r, field_r, other_r, other_field_r = other_host, other_field, host, field
                else:
                    host_r, field_r, other_r, other_field_r = host, field, other_host, other_field
                if (host_r, field_r) in reported:
                    continue
                reported.add((host_r, field_r))
                what = (f"port {value}" if kind == "port" else f"unit ddtree-{value}.service (and its directories)")
                out.append(Finding(
                    "error", field_r, value,
                    f"{host_r} and {other_r} both reach machine {name} and both claim {what} ({host_r}: {field_r}, "
                    f"{other_r}: {other_field_r}); one machine cannot serve both (the second start fails or replaces "
                    "the first, and Prometheus would scrape one target for two hosts)",
                    f"give {host_r} its own ansible_host / ddtree_ops.scrape_host, or (several instances on one "
                    "machine) another ddtree_server.port, ddtree_ops.exporter_port and ddtree_service.name",
                    SOURCE, host=host_r))
    out += _class_clashes(unique, focus)
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
