"""Validate the server hosts of an inventory, once per distinct deployment.

At a thousand hosts most hosts of a group differ only in their name and address; the rules,
the plan and the checkpoint facts of such hosts are the same. :func:`validate_hosts` validates
the first host of each distinct deployment in full (:func:`~.checkpoint.validate_with_checkpoints`)
and gives every further host with the same deployment variables that result, bound to its own
name and address.

Which variables cannot change a finding, read off the rules:

* the inventory host name (``inventory_hostname``, :attr:`Deployment.host`) and ``ansible_host``
  (:attr:`Deployment.address`): no deployment rule (:data:`~.rules.RULES`), no checkpoint rule
  (:data:`~.checkpoint.CHECKPOINT_RULES`), neither :func:`~.plan.make_plan` nor
  :func:`~.checkpoint.apply_facts` nor the checkpoint reader reads ``Deployment.host`` or
  ``Deployment.address`` (the clash checks between hosts, :mod:`~.fleet`, do and still run on
  every host); the host name reaches a finding only as its ``host`` (the ``host:`` prefix of
  the message and the plan's warnings), which is re-bound per host.

Everything else of the host's variables (:func:`~.hostvars.deployment_vars`: every ``ddtree_*``
variable, ``group_names``, and whether ``ansible_host`` is set) is the key, compared by value
and type (:func:`share_key`), vaulted strings told apart from plain ones. Each host's name and
address are still validated by :class:`~.models.Deployment`'s own fields; a host whose name or
address does not validate, or whose deployment has errors, is validated alone, so its findings
are exactly the ones it gets alone (``tests/test_perf.py`` compares ``validate --json`` and
``plan --json`` byte for byte with and without sharing on mixed inventories).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .errors import ConfigError, Finding, _is_vaulted

SHARE = True
"""Give hosts with the same deployment variables one validation (False: validate each host alone;
the tests compare both)."""

ADDRESS_VAR = "ansible_host"
"""The inventory variable of :attr:`Deployment.address` (``hostvars.INVENTORY_VARS['address']``)."""


class _Unkeyable(Exception):
    """A value :func:`share_key` does not compare (the host is validated alone)."""


def share_key(hostvars: dict[str, Any], memo: dict[int, tuple[Any, Any]] | None = None) -> tuple | None:
    """A hashable form of ``hostvars`` (one host's :func:`~.hostvars.deployment_vars`) without
    ``ansible_host``'s value (only whether it is set), or ``None`` when a value is of a type not
    compared here (the host is then validated alone).

    Scalars are compared by type and value (``1``, ``1.0``, ``True`` and ``"1"`` differ; floats by
    ``repr``, so ``-0.0`` is not ``0.0``), strings also by whether they are vaulted
    (:func:`~.errors._is_vaulted`: findings redact those), dicts in their order. ``memo`` maps
    ``id`` of a container to (the container, its form): the hosts of a group share their
    group_vars values as the same objects, so each is walked once; the container is kept in the
    memo so its ``id`` is not reused while the memo lives.
    """
    memo = {} if memo is None else memo

    def form(v: Any, depth: int) -> Any:
        if depth > 64:
            raise _Unkeyable
        if v is None:
            return None
        if isinstance(v, bool):
            return ("bool", type(v).__name__, bool(v))
        if isinstance(v, int):
            return ("int", type(v).__name__, int(v))
        if isinstance(v, float):
            return ("float", type(v).__name__, repr(v))
        if isinstance(v, str):
            return (type(v).__name__, str(v), _is_vaulted(v))
        if isinstance(v, (dict, list, tuple)):
            known = memo.get(id(v))
            if known is not None and known[0] is v:
                return known[1]
            if isinstance(v, dict):
                out: Any = (type(v).__name__, tuple((form(k, depth + 1), form(x, depth + 1)) for k, x in v.items()))
            else:
                out = (type(v).__name__, tuple(form(x, depth + 1) for x in v))
            memo[id(v)] = (v, out)
            return out
        raise _Unkeyable

    try:
        return (hostvars.get(ADDRESS_VAR) is None,
                tuple((k, form(v, 0)) for k, v in hostvars.items() if k != ADDRESS_VAR))
    except _Unkeyable:
        return None


def rebind(v: Any, host: str, hostvars: dict[str, Any]) -> Any:
    """The :class:`~.load.Validated` of another host with the same deployment variables as ``v``'s
    (:func:`share_key`), for ``host`` with ``hostvars``: the deployment re-validated with this
    host's name and address (its other fields passed as the validated objects they are), each
    finding's and plan warning's host replaced. ``None`` when the name or address does not
    validate (then the host must be validated alone, which names the field)."""
    from pydantic import ValidationError

    from .load import Validated
    from .models import Deployment

    d = v.deployment
    data = {name: getattr(d, name) for name in d.model_fields_set if name not in ("host", "address")}
    data["host"] = host
    if hostvars.get(ADDRESS_VAR) is not None:
        data["address"] = hostvars[ADDRESS_VAR]
    try:
        d2 = Deployment.model_validate(data)
    except ValidationError:
        return None
    findings = [f.for_host(host) for f in v.warnings]
    warnings = [f.message() for f in findings if f.level == "warning"]
    return Validated(d2, replace(v.plan, warnings=warnings), findings)


def _shareable(v: Any, hostvars: dict[str, Any]) -> bool:
    """Whether ``v`` (a host validated alone) may be given to other hosts: every finding is about
    its host, the plan's warnings are exactly its warning findings' messages, and re-binding it to
    its own name and address gives back the same deployment (fields set included)."""
    host = v.deployment.host
    if any(f.host != host for f in v.warnings):
        return False
    if v.plan.warnings != [f.message() for f in v.warnings if f.level == "warning"]:
        return False
    again = rebind(v, host, hostvars)
    return (again is not None and again.deployment == v.deployment
            and again.deployment.model_fields_set == v.deployment.model_fields_set and again.plan == v.plan)


def validate_hosts(hostvars: dict[str, dict[str, Any]], reader: Any) -> tuple[list[Any], list[Finding]]:
    """Validate every host of ``hostvars`` (``{host: deployment variables}``, from
    :func:`~.inventory.load_hostvars`) with the checkpoint facts of ``reader``
    (:class:`~.checkpoint.CheckpointReader`), in host-name order.

    Returns:
        ``(validated, errors)``: a :class:`~.load.Validated` per host without errors (the same,
        field for field and finding for finding, as :func:`~.checkpoint.validate_with_checkpoints`
        gives for it alone), and the error findings of the other hosts.
    """
    from .checkpoint import validate_with_checkpoints

    ok: list[Any] = []
    errors: list[Finding] = []
    seen: dict[tuple, Any] = {}
    memo: dict[int, tuple[Any, Any]] = {}
    for host, hv in sorted(hostvars.items()):
        key = share_key(hv, memo) if SHARE else None
        first = seen.get(key) if key is not None else None
        if first is not None:
            v = rebind(first, host, hv)
            if v is not None:
                ok.append(v)
                continue
        try:
            v = validate_with_checkpoints(host, hv, reader)
        except ConfigError as exc:
            errors.extend(exc.findings)
            continue
        ok.append(v)
        if key is not None and key not in seen and _shareable(v, hv):
            seen[key] = v
    return ok, errors


NAMES_SHOWN = 5
"""Host names a collapsed line (:func:`collapsed_lines`) lists before ``… and N more``."""


def collapsed_lines(findings: list[Finding]) -> list[str]:
    """One line per distinct finding, for the text output of ``validate``: a finding that only one
    host has is its own :meth:`~.errors.Finding.message` (``host: field = value: ...``); one that
    several hosts have (the same level, field, value as shown, rule, fix and source) is one line
    ``N hosts (h1, h2, ... and M more; --json lists each): field = value: ...``, with the first
    :data:`NAMES_SHOWN` names (:func:`~.errors.show_host`), at the place of its first host's line.
    A finding without a host is its own line. ``--json`` keeps every finding."""
    from .errors import show_host

    groups: dict[tuple, list[Finding]] = {}
    for i, f in enumerate(findings):
        key = (f.level, f.field, f._shown_value(), f.rule, f.fix, f.source) if f.host else (i,)
        groups.setdefault(key, []).append(f)
    lines = []
    for same in groups.values():
        hosts = list(dict.fromkeys(f.host for f in same))
        if len(hosts) < 2:
            lines.extend(f.message() for f in same)
            continue
        names = ", ".join(show_host(h) for h in hosts[:NAMES_SHOWN])
        more = f" and {len(hosts) - NAMES_SHOWN} more" if len(hosts) > NAMES_SHOWN else ""
        lines.append(f"{len(hosts)} hosts ({names}{more}; --json lists each): {same[0].for_host('').message()}")
    return lines
