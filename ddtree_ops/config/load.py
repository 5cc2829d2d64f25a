"""Load and validate deployments from Ansible variables.

:func:`validate_hostvars` is the single entry point used by the CLI and by the Ansible
action plugin, so both see exactly the same rules and derived values.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from .errors import ConfigError, Finding, findings_from_validation_error
from .fields import inventory_name_problem
from .hosts import class_names
from .hostvars import GROUPS_VAR, INVENTORY_VARS, is_deployment_var
from .models import Deployment
from .plan import Plan, make_plan
from .rules import RULES


@dataclass(frozen=True)
class Validated:
    """A deployment that passed every rule, with its plan and warnings."""

    deployment: Deployment
    plan: Plan
    warnings: list[Finding]


def deployment_from_hostvars(host: str, hostvars: dict[str, Any]) -> Deployment:
    """Build a :class:`Deployment` from one host's (templated) Ansible variables.

    The variables named in :data:`INVENTORY_VARS` are read; any other ``ddtree_*``
    variable (except role variables such as ``ddtree_service_*``) is an error, so a typo
    such as ``ddtree_speculatve`` cannot silently turn speculation off.

    The host name must be an RFC 1123 name (it becomes a path, a unit line, a label), and a
    host in more than one host-class group (a group named like a class of the table, built-in or
    ``ddtree_host_classes``: ``group_names``), or in one that disagrees with ``ddtree_host_class``,
    is refused.

    Raises:
        ConfigError: a variable has the wrong type, range or characters.
    """
    problem = inventory_name_problem(host)
    if problem:
        raise ConfigError([Finding("error", "inventory_hostname", host, problem,
                                   "rename the host in the inventory (put the address in ansible_host), "
                                   "e.g. b300-01")])
    _check_groups(host, hostvars)
    known = set(INVENTORY_VARS.values())
    unknown = sorted(k for k in hostvars if is_deployment_var(k) and k not in known)
    if unknown:
        raise ConfigError([_unknown_var(host, k, known) for k in unknown])
    non_finite = [f for var in INVENTORY_VARS.values() if var in hostvars
                  for f in non_finite_findings(host, var, hostvars[var])]
    if non_finite:
        raise ConfigError(non_finite)
    data: dict[str, Any] = {"host": host}
    for field, var in INVENTORY_VARS.items():
        if var in hostvars and hostvars[var] is not None:
            data[field] = hostvars[var]
    if "host_class" not in data or "model" not in data:
        missing = [INVENTORY_VARS[f] for f in ("host_class", "model") if f not in data]
        raise ConfigError(
            [
                Finding(
                    "error",
                    m,
                    None,
                    "required for every deployment host",
                    "set it in inventory group_vars (see inventory/example)",
                    host=host,
                )
                for m in missing
            ]
        )
    try:
        return Deployment.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(findings_from_validation_error(exc, host, INVENTORY_VARS)) from None


def non_finite_findings(host: str, name: str, value: Any) -> list[Finding]:
    """A finding for every NaN or infinity anywhere in ``value`` (variable ``name``; nested keys
    and list indexes named in the field, e.g. ``ddtree_server.mem_fraction_static``).

    YAML's ``.nan`` / ``.inf`` load as floats that no field means (a size, rate, time or
    fraction) and that strict JSON cannot carry: ``validate --json`` / ``plan --json`` and
    plan.json would print ``NaN`` / ``Infinity``, which every strict parser (jq, Go, JavaScript's
    JSON.parse) refuses. So they are refused where they enter, naming the field; a range check
    alone would let ``inf`` pass a lower bound and would echo ``NaN`` in its own finding. The
    value is shown as text so the finding itself stays strict JSON."""
    import math

    found: list[Finding] = []
    stack: list[tuple[str, Any, int]] = [(name, value, 0)]
    while stack:
        path, v, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            found.append(Finding("error", path, str(v), "not a finite number (YAML .nan/.inf): no setting means it, "
                                 "and strict JSON (plan.json, --json) cannot carry it",
                                 "give a finite number, or remove the key for the default", host=host))
        elif depth < 64 and isinstance(v, dict):
            stack.extend((f"{path}.{k}", x, depth + 1) for k, x in reversed(list(v.items())))
        elif depth < 64 and isinstance(v, (list, tuple)):
            stack.extend((f"{path}[{i}]", x, depth + 1) for i, x in reversed(list(enumerate(v))))
    return found


def _check_groups(host: str, hostvars: dict[str, Any]) -> None:
    groups = hostvars.get(GROUPS_VAR)
    if not isinstance(groups, (list, tuple)):
        return
    known = class_names(hostvars.get(INVENTORY_VARS["host_classes"]))  # built-in and the inventory's own
    classes = sorted({g for g in groups if g in known})
    declared = hostvars.get(INVENTORY_VARS["host_class"])
    if len(classes) > 1:
        raise ConfigError([Finding("error", "group_names", classes,
                                   f"the host is in {len(classes)} host-class groups ({' and '.join(classes)}); "
                                   f"ddtree_host_class would silently come from one of them ({declared!r})",
                                   "list the host under exactly one host-class group", host=host)])
    if classes and isinstance(declared, str) and declared != classes[0]:
        raise ConfigError([Finding("error", INVENTORY_VARS["host_class"], declared,
                                   f"disagrees with the host's group {classes[0]} (host-class groups fix the class)",
                                   f"move the host to group {declared} or set ddtree_host_class: {classes[0]} "
                                   "(not in host_vars)", host=host)])


def _unknown_var(host: str, name: str, known: set[str]) -> Finding:
    close = difflib.get_close_matches(name, known, 1, 0.6)
    fix = f"rename it to {close[0]}" if close else f"use one of {', '.join(sorted(known - {'ansible_host'}))}"
    return Finding("error", name, "...", "unknown deployment variable (it would be ignored)", fix, host=host)


def check(d: Deployment) -> tuple[Plan, list[Finding]]:
    """Run every rule; return the plan (warnings attached) and all findings."""
    plan = make_plan(d)
    findings = [replace(f, host=d.host) for rule in RULES for f in rule(d, plan)]
    warnings = [f for f in findings if f.level == "warning"]
    return replace(plan, warnings=[w.message() for w in warnings]), findings


def validate_hostvars(host: str, hostvars: dict[str, Any]) -> Validated:
    """Load, check and plan one host.

    Raises:
        ConfigError: any rule reports an error (all errors of the host are listed).
    """
    d = deployment_from_hostvars(host, hostvars)
    plan, findings = check(d)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise ConfigError(errors)
    return Validated(d, plan, [f for f in findings if f.level != "error"])
