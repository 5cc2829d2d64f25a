"""Findings and the error type every layer raises for bad configuration.

A :class:`Finding` names the field path (as written in the inventory, e.g.
``ddtree_speculative.budget``), the value found, the rule broken, the fix, and where the
rule comes from. The CLI prints them one per line; Ansible fails the play with them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from .._core import scrub as _scrub
from .._core.scrub import (  # noqa: F401  (re-exported: the scrubber lives in the standard-library core)
    REDACTED,
    SECRET_NAME,
    URL_CREDENTIALS,
    credential_shaped,
    is_secret_name,
    looks_like_token,
    register_secret,
    registered_secret_in,
    scrub,
    scrub_all,
    value_secret_reason,
)

MAX_SHOWN = 200
"""Characters of an offending value (or host name) echoed in a message; longer ones end in ``…``."""


def _is_vaulted(v: Any) -> bool:
    """True for a value that came from an Ansible vault: ansible-core 2.19 tags decrypted
    values with ``VaultedValue`` (and keeps undecrypted ones as ``EncryptedString``);
    2.17/2.18 hand out ``AnsibleVaultEncryptedUnicode``."""
    return _vault_check()(v)


@functools.cache
def _vault_check() -> Callable[[Any], bool]:
    """The test of :func:`_is_vaulted` for the installed ansible-core, its imports resolved
    once (they cost ~10 µs a call, called for every string of every host; ``scripts/bench-controller.py``
    measures validate)."""
    try:
        from ansible._internal._datatag._tags import VaultedValue
        from ansible.parsing.vault import EncryptedString
    except ImportError:  # ansible-core < 2.19, or not installed (CLI used on plain data)
        try:
            from ansible.parsing.yaml.objects import AnsibleVaultEncryptedUnicode
        except ImportError:
            return lambda v: False
        return lambda v: isinstance(v, AnsibleVaultEncryptedUnicode)
    return lambda v: isinstance(v, EncryptedString) or VaultedValue.is_tagged_on(v)


def redact(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` safe to print: values under secret-looking keys, vaulted values
    and registered secrets become ``(redacted)``; containers are cut at 50 items / depth 8."""
    if _is_vaulted(value):
        return REDACTED
    if isinstance(value, str):
        return scrub(value)
    if _depth > 8:
        return "…"
    if isinstance(value, dict):
        out = {}
        for i, (k, x) in enumerate(value.items()):
            if i >= 50:
                out["…"] = f"{len(value) - 50} more"
                break
            ks = scrub(str(k))
            out[ks] = REDACTED if is_secret_name(ks) else redact(x, _depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        items = [redact(x, _depth + 1) for x in list(value[:50])]
        return items + ([f"… {len(value) - 50} more"] if len(value) > 50 else [])
    return value


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters plus ``…``."""
    return text if len(text) <= limit else text[:limit] + "…"


def one_line(data: bytes | str, limit: int) -> str:
    """Host-controlled text as one safe line: decoded (invalid UTF-8 replaced), secrets scrubbed,
    terminal escapes removed and every run of control characters (tabs, newlines) one space
    (:func:`ddtree_ops._core.scrub.clean_text`), cut to ``limit`` characters plus ``…``."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else str(data)
    return shorten(_scrub.clean_text(text[: limit * 8]).strip(), limit)  # scrub sees a bounded text


_PLAIN_TYPES = (bool, int, float, complex, str, bytes, dict, list, tuple, set, frozenset)


def type_name(value: Any) -> str:
    """The name of ``value``'s type as the user wrote it: the plain built-in type a subclass extends
    (ansible-core 2.19 loads ``ddtree_router: "yes"`` as ``_AnsibleTaggedStr``, a ``str`` carrying its
    origin; a message says ``str``), else the class's own name."""
    for plain in _PLAIN_TYPES:  # bool before int: a bool is an int too
        if isinstance(value, plain):
            return plain.__name__
    return type(value).__name__


_PLAIN_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}")


def show_host(host: str) -> str:
    """A host name as messages print it: plain names as they are, anything else quoted
    (``repr``, so a newline prints as ``\\n``) and shortened."""
    return host if _PLAIN_HOST.fullmatch(host) else shorten(repr(scrub(host)))


@dataclass(frozen=True)
class Finding:
    """One rule outcome for one field.

    Secrets never leave a finding: the value of a secret-looking field (:data:`SECRET_NAME`,
    e.g. ``ddtree_hf_token``, ``ddtree_service.env.WANDB_API_KEY``), any vaulted value and
    any registered secret string (:func:`register_secret`) is replaced by ``(redacted)`` when
    the finding is made, and ``message()`` / ``as_dict()`` scrub registered secrets out of
    every text field and cut echoed values to :data:`MAX_SHOWN` characters.

    Attributes:
        level: ``error`` stops a deployment; ``warning`` is printed and kept in the plan;
            ``info`` says what was not checked (e.g. a checkpoint that could not be read).
        field: inventory path, e.g. ``ddtree_server.tp_size``.
        value: the value found (``None`` when the field is unset).
        rule: what must hold, in one sentence.
        fix: what the operator should change.
        source: where the rule comes from (SGLang file, upstream issue), if anywhere.
        host: the inventory host the finding is about.
    """

    level: Literal["error", "warning", "info"]
    field: str
    value: Any
    rule: str
    fix: str
    source: str = ""
    host: str = ""

    def __post_init__(self) -> None:
        value = REDACTED if (is_secret_name(self.field) and self.value is not None) else redact(self.value)
        object.__setattr__(self, "value", value)

    @classmethod
    def naming(cls, level: Literal["error", "warning", "info"], field: str, name: str, rule: str, fix: str,
               source: str = "", host: str = "") -> Finding:
        """A finding whose value is only a NAME: the key of a ``ddtree_secret_env`` entry
        (``ddtree_router.api_key_secret: ROUTER_API_KEY``). A name is no secret, so it is shown though the
        field's own name looks secret; it is scrubbed like any text (a token-shaped name is still redacted)."""
        f = cls(level, field, None, rule, fix, source, host)
        object.__setattr__(f, "value", redact(name))
        return f

    def _shown_value(self) -> str:
        """The value as messages show it, kept like :meth:`message`'s line (it does not depend on
        the host, so :meth:`for_host` copies keep it)."""
        cached = self.__dict__.get("_shown")
        if cached is not None and cached[0] is _scrub._known_secrets and cached[1] == len(_scrub._known_secrets):
            return cached[2]
        shown = REDACTED if self.value == REDACTED else shorten(scrub(repr(self.value)))
        object.__setattr__(self, "_shown", (_scrub._known_secrets, len(_scrub._known_secrets), shown))
        return shown

    def message(self) -> str:
        """One line: ``host: field = value: rule. Fix: fix [source]`` (no newline inside).

        Built when first asked for and kept while the registered secrets stay the same (the
        plan's warnings and the printed line ask twice); a secret registered later
        makes the next call build (and scrub) it again."""
        cached = self.__dict__.get("_message")
        if cached is not None and cached[0] is _scrub._known_secrets and cached[1] == len(_scrub._known_secrets):
            return cached[2]
        # the host is scrubbed apart (a token-shaped name is still redacted): scrubbing
        # "monkey-01: field = ..." whole would read the host as a secret's name and eat the field
        where = f"{scrub(show_host(self.host))}: " if self.host else ""
        # the value apart too (it is scrubbed already, and redacted where the field is secret): scrubbing
        # "api_key_secret = 'ROUTER_API_KEY'" whole would redact a value that is only a name (Finding.naming)
        src = f" [{self.source}]" if self.source else ""
        rest = f": {shorten(self.rule, 2000)}. Fix: {shorten(self.fix, 1000)}{src}"
        text = f"{scrub(shorten(self.field, 300))} = {self._shown_value()}{scrub(rest)}"
        line = where + text.replace("\n", "\\n").replace("\r", "\\r")
        object.__setattr__(self, "_message", (_scrub._known_secrets, len(_scrub._known_secrets), line))
        return line

    def for_host(self, host: str) -> Finding:
        """This finding about ``host`` instead: every other field as it is (the value is not redacted
        again, as ``dataclasses.replace`` would; its shown form kept), the message built anew when asked for
        (:mod:`~.shared`: hosts with the same deployment share one validation)."""
        other = object.__new__(Finding)
        fields = dict(self.__dict__)
        fields.pop("_message", None)
        fields["host"] = host
        object.__setattr__(other, "__dict__", fields)
        return other

    def as_dict(self) -> dict[str, Any]:
        """The finding as JSON-safe data (value shortened, secrets scrubbed)."""
        d = asdict(self)
        d["value"] = _jsonable(self.value)
        d["host"] = show_host(self.host) if self.host else ""
        for k in ("field", "rule", "fix", "source"):
            d[k] = scrub(shorten(str(d[k]), 2000))
        return d


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return shorten(scrub(v))
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {shorten(str(k)): _jsonable(x) for k, x in v.items()}
    return shorten(scrub(repr(v)))


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
            value = REDACTED
        elif isinstance(value, dict) and path.endswith(".env"):
            # an environment map is refused as a whole for one bad name: show its names, never its
            # values (a name the secret check misses, e.g. lower-case "tokens", may hold a secret)
            value = dict.fromkeys(value, REDACTED)
        out.append(Finding("error", path, value, rule, fix, host=host))
    return out
