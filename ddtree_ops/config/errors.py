"""Findings and the error type every layer raises for bad configuration.

A :class:`Finding` names the field path (as written in the inventory, e.g.
``ddtree_speculative.budget``), the value found, the rule broken, the fix, and where the
rule comes from. The CLI prints them one per line; Ansible fails the play with them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import ValidationError


@dataclass(frozen=True)
class Finding:
    """One rule outcome for one field.

    Attributes:
        level: ``error`` stops a deployment; ``warning`` is printed and kept in the plan.
        field: inventory path, e.g. ``ddtree_server.tp_size``.
        value: the value found (``None`` when the field is unset).
        rule: what must hold, in one sentence.
        fix: what the operator should change.
        source: where the rule comes from (SGLang file, upstream issue), if anywhere.
        host: the inventory host the finding is about.
    """

    level: Literal["error", "warning"]
    field: str
    value: Any
    rule: str
    fix: str
    source: str = ""
    host: str = ""

    def message(self) -> str:
        where = f"{self.host}: " if self.host else ""
        src = f" [{self.source}]" if self.source else ""
        return f"{where}{self.field} = {self.value!r}: {self.rule}. Fix: {self.fix}{src}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["value"] = _jsonable(self.value)
        return d


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


@dataclass
class ConfigError(Exception):
    """Raised when a deployment config breaks one or more rules (exit code 2)."""

    findings: list[Finding] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(f.message() for f in self.findings)


RULE_FIX_SEP = " | fix: "
"""Custom pydantic validators raise ``ValueError(rule + RULE_FIX_SEP + fix)``."""


def findings_from_validation_error(
    exc: ValidationError, host: str, prefix_of: dict[str, str]
) -> list[Finding]:
    """Turn pydantic's errors into findings with inventory field paths.

    Args:
        exc: the pydantic error.
        host: inventory host name.
        prefix_of: maps the model's top-level field name to its inventory variable
            (``speculative`` -> ``ddtree_speculative``).
    """
    out: list[Finding] = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        if loc:
            loc[0] = prefix_of.get(loc[0], loc[0])
        path = ".".join(loc) or "<deployment>"
        msg = str(err.get("msg", ""))
        for pfx in ("Value error, ", "Assertion failed, "):
            if msg.startswith(pfx):
                msg = msg[len(pfx):]
        if RULE_FIX_SEP in msg:
            rule, fix = msg.split(RULE_FIX_SEP, 1)
        elif err.get("type") == "extra_forbidden":
            rule, fix = "unknown setting", "remove it or check its spelling against the documented fields"
        elif err.get("type") == "missing":
            rule, fix = "this setting is required", "set it in group_vars or host_vars"
        else:
            rule, fix = msg, "give a value of the documented type and range"
        value = err.get("input") if err.get("type") != "missing" else None
        if path.startswith(prefix_of.get("hf_token", "hf_token")):
            value = "<redacted>"
        out.append(Finding("error", path, value, rule, fix, host=host))
    return out
