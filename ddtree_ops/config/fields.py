"""The field types of the deployment models and their rules: safe argv and unit-file text,
absolute paths, host names (RFC 1123), ports, sizes, revisions, the loopback URL; the
models' base class (:mod:`.models`, :mod:`.service_models`)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

from .errors import (
    RULE_FIX_SEP,
    URL_CREDENTIALS,
    looks_like_token,
    register_secret,
)

_SAFE_ARG = re.compile(r"^[A-Za-z0-9._/@+:=,-]+$")
_SAFE_PATH = re.compile(r"(/[A-Za-z0-9._+-]+)+")
_SAFE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_SCOPE_ID = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]{0,62}$")

_AUTH_PREFIX = re.compile(r"(?i)(?:bearer|basic|digest|apikey)[:=][A-Za-z0-9._~+/=-]{4,}")
"""An HTTP authorization scheme glued to its credential (``Bearer:X``, ``token=X``): an argv token
holds no space, so the ``Bearer X`` shape (RFC 9110 §11.4) of :func:`ddtree_ops.config.errors.value_secret_reason`
never matches there."""


def _shown_int(x: int) -> str:
    """An integer for an error line: its digits, or how many there are (Python refuses to print
    more than 4300 digits, and a line must stay short)."""
    return str(x) if x.bit_length() < 200 else f"an integer of {x.bit_length()} bits"


MAX_PATH = 4096
"""Longest path or argv value, characters (Linux ``PATH_MAX``)."""
MAX_NAME = 253
"""Longest host name (RFC 1123 / RFC 1035 §2.3.4)."""
MAX_TEXT = 1024
"""Longest free text (risk reasons)."""
MAX_ITEMS = 64
"""Most entries in a list or mapping of the inventory (env, patches, accepted risks)."""


def _inet_aton(name: str) -> bool:
    """True when the C resolver reads ``name`` as an IPv4 address (``inet_aton``: hex, octal and
    short forms such as ``0x7f000001``, ``0177.1``, ``10.5``)."""
    import socket

    try:
        socket.inet_aton(name)
    except (OSError, ValueError):
        return False
    return True


def host_name_problem(name: object) -> str | None:
    """Why ``name`` is not an RFC 1123 host name, or ``None`` when it is one.

    Rule (RFC 1123 §2.1, RFC 1035 §2.3.4): dot-separated labels of ASCII letters, digits
    and ``-``, each 1-63 characters, not starting or ending with ``-``; 253 characters in all;
    the last label is not all digits (RFC 1123 §2.1: "the highest-level component label will
    be alphabetic"; RFC 3696 §2): resolvers read ``1234`` or ``0177.0.0.1`` as an IPv4
    address (``inet_aton``: 0.0.4.210, 127.0.0.1), not as a name. Addresses are given as IP
    addresses (fields that take one parse them before this check).
    """
    if not isinstance(name, str) or not name:
        return "must be a non-empty host name"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters; a host name has at most {MAX_NAME} (RFC 1123)"
    labels = name.split(".")
    if not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return ("must be an RFC 1123 host name: dot-separated labels of letters, digits and -, each 1-63 "
                "characters, not starting or ending with -")
    if labels[-1].isdigit() or _inet_aton(name):
        return ("is not a host name: its last label is all digits, so resolvers read it as an IPv4 address "
                "(1234 = 0.0.4.210, 0177.0.0.1 = 127.0.0.1; RFC 1123 §2.1, RFC 3696 §2)")
    return None


def inventory_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be an inventory host name, or ``None``: an RFC 1123 host name
    (:func:`host_name_problem`) or an IPv4 address in canonical dotted-quad form (``10.0.0.5``;
    Ansible inventories often name hosts by address, and it is safe in paths and labels),
    never a non-canonical numeric name (``010.0.0.5``, ``1234``)."""
    try:
        if isinstance(name, str) and str(ipaddress.IPv4Address(name)) == name:
            return None
    except ValueError:
        pass
    return host_name_problem(name)


def check_host_name(name: str) -> str:
    """``name`` if it is an RFC 1123 host name (:func:`host_name_problem`); else ``ValueError``
    (rule | fix, see :data:`~.errors.RULE_FIX_SEP`)."""
    problem = host_name_problem(name)
    if problem:
        raise _fail(problem, "rename the inventory host / address, e.g. b300-01 or b300-01.example.internal")
    return name


def _ip_or_host(v: str) -> str:
    """An IP address (no scope id, no port) or an RFC 1123 host name."""
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        problem = host_name_problem(v)
        if problem is None:
            return v
        if "all digits" in problem:
            raise _fail(f"{problem}; nor is it an IP address in canonical form (no leading zeros, four parts)",
                        "write the address as an IP address, e.g. 127.0.0.1, or use a host name") from None
        raise _fail("must be one IP address or RFC 1123 host name, without port, scheme, list or spaces",
                    "give one address, e.g. 10.0.0.5 or b300-01.example.internal (the port is configured separately)"
                    ) from None
        raise
    if getattr(ip, "scope_id", None):
        raise _fail("an IPv6 scope id cannot be used in a scrape target", "use a global or unique-local address")
    return v


def _url_credentials(v: str) -> bool:
    """True when URL ``v`` carries a secret in its userinfo (RFC 3986 §3.2.1): ``user:password@``
    with any scheme (:data:`~.errors.URL_CREDENTIALS`), or any user in an ``http(s)://`` / ``git://``
    URL (forges take a token as the user name: ``https://TOKEN@github.com/...``). An ssh user
    (``ssh://git@host/x``, ``git@host:path``) names an account, not a secret: allowed."""
    if URL_CREDENTIALS.search(v):
        return True
    return bool(re.match(r"(?i)(https?|git)://[^/?#]*@", v))


def _fail(rule: str, fix: str) -> ValueError:
    return ValueError(f"{rule}{RULE_FIX_SEP}{fix}")


def _safe_chars(v: str) -> str:
    """A non-empty value of argv-safe characters (:data:`_SAFE_ARG`); env values use this alone."""
    if not v:
        raise _fail("must not be empty", "give a value or remove the setting")
    if not _SAFE_ARG.fullmatch(v):
        bad = sorted({c for c in v if not re.match(r"[A-Za-z0-9._/@+:=,-]", c)})
        raise _fail(
            f"contains {', '.join(repr(c) for c in bad)}; argv values may hold only letters, digits and . _ / @ + : = "
            f", -"
            " (no whitespace, newline, %, $ or quotes: they would be read by systemd as specifiers, variables or a "
            "new directive)",
            "rename or symlink the model/path to a name without those characters",
        )
    return v


def _safe_arg(v: str) -> str:
    """An argv value: :func:`_safe_chars`, and not starting with ``-``: SGLang's argparse
    parser reads such a value as an option ("argument --model-path: expected one argument";
    Python ``argparse``, "Arguments containing -")."""
    _safe_chars(v)
    if URL_CREDENTIALS.search(v) or re.search(r"://[^/?#]*@", v):
        raise _fail("holds URL credentials (user info before @); argv values are shown in the unit, plan.json and "
                    "the process list", "give a Hugging Face repo id or a local path; put tokens in ddtree_hf_token")
    if v.startswith("-"):
        raise _fail(
            "starts with -, which SGLang's argument parser reads as an option, not as this flag's value",
            "give the real model name or path (a local checkpoint named like an option: give its absolute path)",
        )
    return v


NAME_MAX = 255
"""Longest path component, bytes (Linux ``NAME_MAX``; systemd refuses a unit path with a longer
one: "path has invalid length", and the unit is not started)."""


def _safe_path(v: str) -> str:
    if not _SAFE_PATH.fullmatch(v) or any(part in (".", "..") for part in v.split("/")):
        raise _fail(
            "must be an absolute path below / (not / itself) of letters, digits and . _ / + - only, without . or .. "
            "parts",
            "use a plain absolute path such as /var/lib/ddtree-ops/sglang",
        )
    if any(len(part) > NAME_MAX for part in v.split("/")):
        raise _fail(f"has a component longer than {NAME_MAX} characters (Linux NAME_MAX; systemd refuses the unit)",
                    "shorten the directory names")
    return v


_REVISION = re.compile(r"[0-9a-f]{40}|[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def _revision(v: str) -> str:
    """A Hugging Face revision: a full 40-hex commit (pins remote code and weights) or a safe
    branch / tag name (``[A-Za-z0-9][A-Za-z0-9._/-]*``, no ``..``, at most 128 characters; a ref
    moves, so :func:`~.rules.rule_remote_code_pinned` asks for a commit with trust_remote_code)."""
    if (kind := looks_like_token(v)) is not None:
        register_secret(v)  # never echoed
        raise _fail(
            f"holds {kind}, not a revision; the revision lands in the argv (process list), the unit and plan.json",
            "give the commit SHA or branch/tag; put the token in ddtree_hf_token (ansible-vault it)",
        )
    if not _REVISION.fullmatch(v) or ".." in v or v.endswith((".lock", "/")) or "//" in v:
        raise _fail("must be a 40-hex commit SHA or a branch/tag name of letters, digits and . _ / - (no '..')",
                    "pin the commit: the 'Files and versions' history of the model repo, or "
                    "huggingface_hub.model_info(REPO).sha")
    return v


Revision = Annotated[str, Field(max_length=128), AfterValidator(_revision)]


def _no_bool(v: object) -> object:
    if isinstance(v, bool):
        raise _fail("must be a number, not a boolean", "write the number itself, e.g. 8")
    return v


def _bounded(lo: int, hi: int, gt: bool = False):
    """An integer in [lo, hi] (or (lo, hi] with ``gt``); booleans refused."""
    limits = {"gt": lo} if gt else {"ge": lo}
    return Annotated[int, BeforeValidator(_no_bool), Field(le=hi, **limits)]


ArgText = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_safe_arg)]
EnvText = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_safe_chars)]
AbsPath = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_safe_path)]
HostText = Annotated[str, Field(max_length=MAX_NAME), AfterValidator(_ip_or_host)]
Port = _bounded(1024, 65535)
"""TCP port the service or exporter listens on: 1024-65535. The units run as an
unprivileged user without ``CAP_NET_BIND_SERVICE``, so ports below 1024 cannot be bound
(Linux ``ip(7)``, ``net.ipv4.ip_unprivileged_port_start`` default 1024)."""


LOOPBACK = {4: "127.0.0.1", 6: "::1"}
"""The loopback address of each IP version (RFC 1122 §3.2.1.3, RFC 4291 §2.5.3): where a process
on a host reaches a server listening on every address (``0.0.0.0`` / ``::``)."""


def loopback_url(port: int, version: int = 4) -> str:
    """``http://`` URL of ``port`` on the loopback address of IP ``version`` (4 or 6, IPv6
    bracketed), e.g. ``http://127.0.0.1:30000``, ``http://[::1]:30000``: the one place the
    loopback URL is written (:attr:`Server.local_url`, :attr:`Ops.exporter_url`)."""
    host = LOOPBACK[version]
    return f"http://{host if version == 4 else f'[{host}]'}:{port}"


Tokens = _bounded(0, 1 << 20, gt=True)
BatchSize = _bounded(0, 4096, gt=True)
Seconds = Annotated[float, BeforeValidator(_no_bool), Field(gt=0, le=86400, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_SGLANG_VERSION = "0.5.23"


def _sha256(v: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", v):
        raise _fail("must be a SHA-256: 64 lower-case hex digits", "compute it with sha256sum FILE")
    return v


def _path_or_relative(v: str) -> str:
    rel = v[2:] if v.startswith("./") else v
    if v.startswith("/"):
        return _safe_path(v)
    if not _SAFE_PATH.fullmatch("/" + rel) or any(part in (".", "..") for part in rel.split("/")):
        raise _fail("must be a path of letters, digits and . _ / + - only, without . or .. parts",
                    "give an absolute controller path or one relative to the project root")
    return v


Sha256 = Annotated[str, Field(max_length=64), AfterValidator(_sha256)]
AbsPathOrRelative = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_path_or_relative)]
Url = Annotated[str, Field(max_length=MAX_PATH)]


