"""The fields of a rendered ``plan.json`` that the host-side preflight reads, checked for type
and range in one place (standard library only: the preflight zipapp carries it). The typed
reader of the same document (:class:`ddtree_ops.config.plandoc_model.PlanDoc`) runs this check
first, so the two accept the same documents (``tests/test_plan_contract.py``)."""

from __future__ import annotations

import json
import re

from .hosts import resolve_host_classes


class PlanFieldError(Exception):
    """A field of the plan that breaks its rule: the message is one line naming the field, its
    value (cut to 200 characters), the rule and the fix; ``field``, ``value`` and ``rule`` apart."""

    def __init__(self, message: str, field: str = "", value: object = None, rule: str = "") -> None:
        super().__init__(message)
        self.field, self.value, self.rule = field, value, rule


PORT_MIN = 1024
"""Lowest port a plan may name: the units run unprivileged (``ddtree_ops.config.fields.Port``,
Linux ``ip(7)`` ``ip_unprivileged_port_start``); the same bound as the plan.json contract."""
_UNIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9:_.@\\-]{0,240}\.service")
"""A systemd service unit name (systemd.unit(5): ASCII letters, digits, ``:-_.\\``, ``@``), not
starting with ``-`` (it is passed to ``systemctl show``)."""
_VERSION = re.compile(r"\d{1,6}(\.\d{1,6}){0,3}")
_SM = re.compile(r"sm_\d{2,3}[af]?")


def _shown(v: object) -> str:
    try:
        t = json.dumps(v, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        t = repr(v)
    return t if len(t) <= 200 else t[:200] + "…"


def plan_fields(plan: dict) -> dict:
    """Every field of a ``plan.json`` (:func:`ddtree_ops.render.files` writes it) that the
    preflight reads, checked for type and range in one place.

    Returns:
        ``{host_class, classes, unit, exporter_unit, port, host, exporter_port, model_path, state,
        cache, toolchain}``: ``classes`` the built-in table with ``deployment.host_classes`` (absent:
        none; each entry checked by :func:`ddtree_ops.config.hosts.resolve_host_classes`, the
        inventory's own rules) merged over it; ``host_class`` a name of it; ``unit`` (``exporter_unit``
        or None) a service unit name (:data:`_UNIT`); ``port``/``exporter_port`` ints
        :data:`PORT_MIN`..65535 (``exporter_port`` None when absent, refused when null); ``host`` str
        or None; ``model_path`` str (``deployment.model`` an object); ``state``, ``cache`` absolute
        paths or None; ``toolchain`` a dict whose ``arch``/``target``
        are ``sm_NN[a|f]``, ``cuda``/``min_driver``/``ptx_version`` dotted numbers, ``ptxas``
        an absolute path, ``package`` a str, ``ptxas_env`` a ``{NAME: absolute path}`` (each
        may be absent or null). The typed reader of the same document,
        :class:`ddtree_ops.config.plandoc_model.PlanDoc`, runs this check first, and
        ``tests/test_plan_contract.py`` proves the two accept the same documents.

    Raises:
        PlanFieldError: one line naming the first bad field, its value (cut to 200
            characters), the rule and the fix.
    """
    fix = "not a plan.json rendered by ddtree-ops: use the host's /etc/ddtree-ops/<name>/plan.json"

    def get(path: str, rule: str, ok) -> object:
        cur: object = plan
        parts = path.split(".")
        for i, k in enumerate(parts):
            if not isinstance(cur, dict):
                parent = ".".join(parts[:i])
                raise PlanFieldError(f"--plan: {path}: its parent is {_shown(cur)}, not an object; {fix}",
                                          parent, cur, "must be an object")
            cur = cur.get(k)
        if not ok(cur):
            raise PlanFieldError(f"--plan: {path} is {_shown(cur)}: must be {rule}; {fix}", path, cur,
                                      f"must be {rule}")
        return cur

    def opt(check):
        return lambda v: v is None or check(v)

    def text(rx=None, limit=4096):
        return lambda v: isinstance(v, str) and len(v) <= limit and "\x00" not in v and (
            rx is None or rx.fullmatch(v) is not None)

    def absolute(v: object) -> bool:
        return text()(v) and v.startswith("/")

    def port(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and PORT_MIN <= v <= 65535

    dicts = ("deployment", "deployment.server", "plan", "paths")
    for d in dicts:
        get(d, "an object", lambda v: isinstance(v, dict))
    for d in ("deployment.ops", "plan.toolchain"):
        get(d, "an object or null", opt(lambda v: isinstance(v, dict)))
    get("deployment.model", "an object", lambda v: isinstance(v, dict))
    classes, problems = resolve_host_classes(plan["deployment"].get("host_classes"), where="deployment.host_classes",
                                             ignore_unknown=True)
    if problems:  # the writer writes only resolved entries: this is no plan.json of ours
        e = problems[0]
        raise PlanFieldError(f"--plan: {e.field} is {_shown(e.value)}: {e.rule} ({e.fix}); {fix}", e.field,
                                  e.value, e.rule)
    ops = plan["deployment"].get("ops")
    out = {
        "classes": classes,
        "host_class": get("host_class", f"one of {', '.join(sorted(classes))}",
                          lambda v: isinstance(v, str) and v in classes),
        "unit": get("unit", "a systemd service name such as ddtree-sglang.service", text(_UNIT, 256)),
        "exporter_unit": get("exporter_unit", "a systemd service name or null", opt(text(_UNIT, 256))),
        "port": get("deployment.server.port", f"an integer {PORT_MIN}..65535", port),
        "host": get("deployment.server.host", "a host name or address (string) or null", opt(text(limit=253))),
        # absent: the default (Ops.exporter_port); null is no port
        "exporter_port": get("deployment.ops.exporter_port", f"an integer {PORT_MIN}..65535", port)
        if isinstance(ops, dict) and "exporter_port" in ops else None,
        # the --nccl-port rendered (derived by the writer); absent in plans written before it was
        "rendezvous_port": get("rendezvous_port", f"an integer {PORT_MIN}..65535", port)
        if "rendezvous_port" in plan else None,
        # rank 0 of a multi-node server: its torch.distributed store (null elsewhere; absent before it was)
        "dist_init_port": get("dist_init_port", f"an integer {PORT_MIN}..65535 or null", opt(port))
        if "dist_init_port" in plan else None,
        "model_path": get("deployment.model.path", "a string", text()),
        "state": get("paths.state", "an absolute path or null", opt(absolute)),
        "cache": get("paths.cache", "an absolute path or null", opt(absolute)),
    }
    tc = plan["plan"].get("toolchain") or {}
    if tc:
        for k, rule, ok in (("arch", "sm_NN such as sm_103", text(_SM, 8)),
                            ("target", "sm_NN[a|f] such as sm_103a", text(_SM, 8)),
                            ("cuda", "a dotted version such as 13.0 (a string)", text(_VERSION, 40)),
                            ("min_driver", "a dotted driver version such as 580.65.06 (a string)", text(_VERSION, 40)),
                            ("toolkit_min_driver", "a dotted driver version such as 570.26 (a string)",
                             text(_VERSION, 40)),
                            ("min_driver_reason", "a string", text(limit=500)),
                            ("ptx_version", "a dotted PTX ISA version such as 8.8 (a string)", text(_VERSION, 40)),
                            ("ptxas", "an absolute path", absolute),
                            ("package", "a string", text(limit=200)),
                            ("ptxas_env", "an object {TRITON_PTXAS_*: absolute path}",
                             lambda v: isinstance(v, dict) and len(v) <= 8 and all(
                                 text(re.compile(r"[A-Z][A-Z0-9_]{0,63}"))(n) and absolute(x) for n, x in v.items()))):
            get(f"plan.toolchain.{k}", f"{rule} or null", opt(ok))
    out["toolchain"] = dict(tc)
    return out
