"""Pydantic models of one deployment (one SGLang instance on one host).

The inventory holds these as Ansible variables (the same YAML Ansible reads):

=========================  ===========================  =========================
inventory variable         model field                  what
=========================  ===========================  =========================
``ddtree_host_class``      :attr:`Deployment.host_class`  a class of :mod:`.hosts` (``b300``, ``h200x8``, ...)
``ddtree_host_classes``    :class:`HostClassSpec` map   classes added to / over the built-in table
``ddtree_sglang``          :class:`SGLangPin`           version and source
``ddtree_model``           :class:`ModelSpec`           target model
``ddtree_speculative``     :class:`Speculative`         algorithm and sizes
``ddtree_server``          :class:`Server`              SGLang server settings
``ddtree_service``         :class:`Service`             systemd unit, user, paths
``ddtree_ops``             :class:`Ops`                 health and exporter
``ddtree_accepted_risks``  :class:`RiskAcceptance` list reasoned rule overrides
``ddtree_toolchain``       :class:`Toolchain`           CUDA toolkit and Triton pins
``ddtree_hf_token``        :attr:`Deployment.hf_token`  secret (use ansible-vault)
``ddtree_secret_env``      :attr:`Deployment.secret_env`  other secret environment
=========================  ===========================  =========================

Host names (the inventory name, ``ansible_host``, ``ddtree_ops.scrape_host``) follow
RFC 1123 (:func:`check_host_name`); they reach file paths, unit files, labels and YAML.
Every string and container has a size bound, and :func:`deployment_vars` refuses a host
whose variables exceed :data:`MAX_VAR_NODES` nodes / :data:`MAX_VAR_CHARS` characters
before anything walks them (a YAML alias bomb fails in milliseconds).

Every string that reaches the SGLang argv or a unit file is checked against a safe
character set here, so no value can inject a systemd directive or a second command.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
)

from .._core.plandoc import MAX_INT
from .envchars import env_char_problem
from .errors import (
    REDACTED,
    RULE_FIX_SEP,
    URL_CREDENTIALS,
    ConfigError,
    Finding,
    is_secret_name,
    looks_like_token,
    register_secret,
    value_secret_reason,
)
from .hosts import HostClass, HostClassError, field_problem, resolve_host_classes
from .toolchain import CUDA_TOOLKITS, TRITONS
from .versions import DDTREE_SOURCES, version_info

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


class PatchPin(_Model):
    """One patch applied to a ``git`` source before its wheel is built.

    Attributes:
        path: patch file on the controller (``git apply`` format; relative: project root).
        sha256: its SHA-256 (a changed file is refused).
    """

    path: AbsPathOrRelative
    sha256: Sha256


class SGLangPin(_Model):
    """Which SGLang build runs.

    Attributes:
        version: the SGLang release, e.g. ``0.5.23`` (default :data:`DEFAULT_SGLANG_VERSION`);
            with ``ddtree_source`` it may be omitted and must otherwise equal the source's base.
        source: ``pypi`` | ``wheel`` | ``git`` — how the build is installed — or
            ``simulator``: ddtree-ops' SGLang-compatible test double (for hosts without GPUs).
        ddtree_source: key in :data:`ddtree_ops.config.versions.DDTREE_SOURCES`; required
            for algorithm ``DDTREE`` (DDTree is in no release).
        simulated_build: for ``source: simulator`` only: ``ddtree`` (sizes verify graphs
            correctly), ``ddtree-unpatched`` (the 0.5.13-generation bug) or ``release``.
        url, path, sha256: ``source: wheel``: the wheel's ``http(s)://`` URL or its path
            on the controller, and its SHA-256 (required; a mismatch stops the deploy).
        repo, commit: ``source: git``: repository URL or controller path, and the full
            40-hex commit SHA (a branch or tag name moves under you; it is refused).
        patches: ``source: git``: patch files on the controller applied in order before
            the wheel is built, each ``{path, sha256}``; all must apply or none is.
        requirements: a lock file on the controller (relative paths: from the project
            root). When set, SGLang is installed with ``--no-deps`` on top of exactly
            that lock (a reproducible install).
        install_release: ``source: simulator`` only: also install the real SGLang release
            ``version`` (from PyPI, with ``requirements``) into the SGLang venv, so the
            capability probe checks the rendered argv with its real parser (the flags a
            DDTree source adds are checked against the versions table instead).
    """

    version: Annotated[str, Field(max_length=64)] | None = None
    source: Literal["pypi", "wheel", "git", "simulator"] = "pypi"
    ddtree_source: Annotated[str, Field(max_length=64)] | None = None
    simulated_build: Literal["ddtree", "ddtree-unpatched", "release"] | None = None
    url: Url | None = None
    path: AbsPathOrRelative | None = None
    sha256: Sha256 | None = None
    repo: Url | None = None
    commit: Annotated[str, Field(max_length=256)] | None = None
    patches: Annotated[list[PatchPin], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    requirements: AbsPathOrRelative | None = None
    install_release: bool = False

    @property
    def installs_sglang(self) -> bool:
        """Whether the host gets a real SGLang build in its SGLang venv: every source but
        ``simulator``, and ``simulator`` with :attr:`install_release`. The one definition of that
        condition: the plan's build-CUDA floor, the wheelhouse builder, the ``sglang`` role (install
        or skip) and the ``triton`` role (check or skip) read it (the roles via ``ddtree_render``'s
        ``installs_sglang``)."""
        return self.source != "simulator" or self.install_release

    @field_validator("url", "repo")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        if v is not None and _url_credentials(v):
            raise _fail("holds credentials (user:password@ or a token as the user of an http(s)/git URL); the URL "
                        "lands in the 0644 plan.json and in logs",
                        "drop them from the URL and let git/pip find them on the controller: a git credential helper "
                        "or ~/.netrc (an ssh user as in git@host:path stays allowed)")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(https?|file)://[A-Za-z0-9._~:/?#@!&'()*+,;=%-]+\.whl", v):
            raise _fail("must be an http(s):// or file:// URL of a .whl file",
                        "give the wheel's full URL, e.g. https://example.org/sglang-0.5.23-py3-none-any.whl")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not (re.fullmatch(r"(https?|ssh|git|file)://[A-Za-z0-9._~:/@+-]+", v)
                                  or re.fullmatch(r"[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9._/~+-]+", v)
                                  or _SAFE_PATH.fullmatch(v)):
            raise _fail("must be a git URL (https://, ssh://, git://, file://, user@host:path) or an absolute "
                        "path on the controller", "e.g. https://github.com/sgl-project/sglang.git")
        return v

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-f]{40}", v):
            what = (
                "an abbreviated SHA"
                if re.fullmatch(r"[0-9a-fA-F]{4,39}", v)
                else "upper-case hex (write it as git prints it, in lower case)"
                if re.fullmatch(r"[0-9a-fA-F]{40}", v)
                else "a branch or tag name, which can move under you"
            )
            raise _fail(
                f"must be a full 40-hex commit SHA, not {what}",
                f"pin the commit itself: git rev-parse {v if _SAFE_ARG.fullmatch(v) else 'REF'} in the repository",
            )
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            version_info(v)
        except ValueError as exc:
            raise _fail(str(exc), "pin a release from 0.5.11 on, e.g. 0.5.23") from None
        return v

    @field_validator("ddtree_source")
    @classmethod
    def _ddtree_source(cls, v: str | None) -> str | None:
        if v is not None and v not in DDTREE_SOURCES:
            raise _fail(
                "unknown DDTree source",
                f"use one of {', '.join(sorted(DDTREE_SOURCES))}",
            )
        return v

    @property
    def base_version(self) -> str:
        """The release whose parser and flag dialect the build has."""
        if self.ddtree_source:
            return DDTREE_SOURCES[self.ddtree_source].base_version
        return self.version or DEFAULT_SGLANG_VERSION

    @property
    def launcher_module(self) -> str:
        """``python -m`` target: SGLang's launcher, or the test double's."""
        return "ddtree_ops.sim" if self.source == "simulator" else "sglang.launch_server"


class ModelSpec(_Model):
    """The target model.

    Attributes:
        path: Hugging Face repo id or absolute local path.
        served_model_name: name reported to clients (``--served-model-name``).
        trust_remote_code: pass ``--trust-remote-code``.
        context_length: tokens, 1..10,485,760 (10 Mi: the longest context of any released
            model, Llama 4 Scout; SGLang's ``--context-length`` only overrides the model
            config, and its req_to_token pool is max_running_requests x context_length int32);
            unset means the model's own.
        vision: the model takes images (warmup then sends one, to pay the vision tower's
            first-use cost before the unit is active).
        vision_min_pixels: smallest image (width x height, pixels) the model's image
            processor accepts; default 3136 = 56 x 56, Qwen2-VL's ``min_pixels``. When the
            checkpoint's ``preprocessor_config.json`` is read, its ``min_pixels`` is used instead
            (:mod:`ddtree_ops.config.checkpoint`).
        revision: Hugging Face revision of the model (``--revision``): a 40-hex commit pins the
            weights and any remote code; with ``trust_remote_code`` anything else is warned about.
    """

    path: ArgText
    served_model_name: ArgText | None = None
    trust_remote_code: bool = False
    revision: Revision | None = None
    context_length: _bounded(0, 10 * (1 << 20), gt=True) | None = None
    vision: bool = False
    vision_min_pixels: _bounded(1, 1 << 26) = 3136


class Speculative(_Model):
    """Speculative decoding settings.

    Attributes:
        algorithm: ``none``, ``EAGLE``, ``EAGLE3``, ``STANDALONE`` (a small model of the
            target's family as the draft, EAGLE sizes), ``DSPARK`` (0.5.17+), ``NGRAM`` (drafts
            from the request's own n-grams: no draft model), ``DFLASH`` or ``DDTREE``; one the
            pinned release lacks is refused naming both
            (:func:`ddtree_ops.config.sglang_compat.rule_algorithm_in_release`).
        draft_model_path: HF id or path of the draft (required unless ``none`` or ``NGRAM``).
        draft_model_revision: Hugging Face revision of the draft
            (``--speculative-draft-model-revision``; SGLang loads the draft with
            ``trust_remote_code`` too): a 40-hex commit, or a branch/tag name.
        block_size: DFlash block size, tokens per request the draft proposes
            (``--speculative-num-draft-tokens`` for DFLASH/DDTREE).
        budget: DDTree node budget; verify tokens per request are ``budget + 1``.
            Unset means SGLang's default ``block_size - 1`` (a plain chain).
        num_steps, topk, num_draft_tokens: EAGLE settings.
        draft_window_size: ``--speculative-draft-window-size``; >= block_size.
        draft_attention_backend: ``--speculative-draft-attention-backend``.
        draft_tokens_per_req, verify_tokens_per_req: optional assertions. They are derived
            (see :mod:`ddtree_ops.config.plan`); if given they must equal the derived value.

    Ranges (refused outside, each with the field, value, rule and fix):

    * ``block_size`` <= 64: a DFlash draft is trained for one block size, which SGLang
      takes as ``--speculative-num-draft-tokens``; public DFlash drafts and launch scripts
      use 2-16 (``-b16`` drafts; ``--speculative-num-draft-tokens ${DFLASH_BLOCK_SIZE:-8}``),
      and draft CUDA graphs hold block_size x batch tokens (1000 would plan 32,000-token
      draft graphs at batch 32). 64 is this toolkit's ceiling, 4x the largest seen, not an
      SGLang limit. The lower bound (>= 2) is :func:`~.rules.rule_draft_model`'s.
    * ``budget`` <= 512: DDTree verifies budget + 1 tokens per request in one target
      forward, with a (budget+1)^2 tree mask per request; the shipped inventories and reported
      DDTree runs use 16-32.
      512 is this toolkit's ceiling (16x the largest seen), not an SGLang limit.
    * ``num_steps`` 1..32, ``topk`` 1..32, ``num_draft_tokens`` 1..1024: EAGLE draft depth,
      branching and tree size; SGLang sizes the EAGLE tree buffers from topk x num_steps.
      These are this toolkit's ceilings, well above published EAGLE/EAGLE3 configs.
    * ``draft_window_size`` <= 1 Mi tokens (>= block_size: :func:`~.rules.rule_draft_window`).
    """

    algorithm: Literal["none", "EAGLE", "EAGLE3", "STANDALONE", "DSPARK", "NGRAM", "DFLASH", "DDTREE"] = "none"
    draft_model_path: ArgText | None = None
    draft_model_revision: Revision | None = None
    block_size: _bounded(-(1 << 20), 64) | None = None
    budget: _bounded(-(1 << 20), 512) | None = None
    num_steps: _bounded(0, 32, gt=True) | None = None
    topk: _bounded(0, 32, gt=True) | None = None
    num_draft_tokens: _bounded(0, 1024, gt=True) | None = None
    draft_window_size: Tokens | None = None
    draft_attention_backend: ArgText | None = None
    draft_tokens_per_req: _bounded(0, 1 << 20) | None = None
    verify_tokens_per_req: _bounded(0, 1 << 20) | None = None

    @property
    def enabled(self) -> bool:
        return self.algorithm != "none"


NCCL_PORT_OFFSET = 100
"""``--nccl-port`` of an instance without ``ddtree_server.nccl_port``: its SGLang port plus this
(30000 -> 30100). Consecutive instance ports (30000, 30001, ...) keep consecutive rendezvous
ports; a clash with another instance's port on the machine is refused by :mod:`~.fleet`."""


class Server(_Model):
    """SGLang server settings (metrics are always enabled).

    Attributes:
        host, port: listen address: an IP address (IPv6 link-local with a scope id that is
            an interface name, ``[A-Za-z0-9_.-]{1,15}``: Linux ``IFNAMSIZ`` is 16 with the
            NUL) and a port 1024-65535 (:data:`Port`). :attr:`local_url` is where the host
            itself reaches it.
        tp_size, dp_size: tensor / data parallel sizes (GPUs = tp_size * dp_size <= the host
            class' GPU count, :func:`~.rules.rule_tp_fits`).
        mem_fraction_static: fraction of GPU memory for weights + KV cache.
        max_running_requests: concurrent requests, 1..4096; unset under speculation means
            SGLang caps it at 48. (4096: the largest capturable batch, below.)
        cuda_graph: capture CUDA graphs (False: ``--disable-cuda-graph``, eager).
        cuda_graph_max_bs: largest captured decode batch, 1..4096; unset: max_running_requests.
            (SGLang's own default tops out at 512-1024 on 8-GPU hosts; each size is one graph.)
        cuda_graph_bs: explicit capture list (<= 512 sizes); unset: SGLang's default rule.
        attention_backend: ``--attention-backend``.
        page_size: KV cache page size, tokens, 1..1024 (FlashInfer/TRT-LLM kernels use
            1-128; larger pages only waste KV cache).
        disable_overlap_schedule: pass ``--disable-overlap-schedule``.
        log_level: SGLang log level.
        extra_args: SGLang flags the config has no field for (``{"--disable-custom-all-reduce":
            true, "--mm-attention-backend": "fa4"}``), appended
            to the argv: ``true`` -> the bare flag, a scalar -> ``FLAG VALUE``, a list ->
            ``FLAG V1 V2 ...``. <= 64 flags, <= 64 values each; flags ``--[a-z0-9-]``, values
            argv-safe (:func:`_safe_arg`: no whitespace/newline, no leading ``-``). Flags the
            toolkit owns, secret-taking flags and names unknown to the pinned build are refused
            by :func:`ddtree_ops.config.build_rules.rule_extra_args` and the probe / peer tier's
            parse with the build's own parser.
        nccl_port: port of the instance's torch.distributed rendezvous (SGLang
            ``--nccl-port``: the TCP store at ``127.0.0.1:<nccl_port>`` every TP rank joins, bound
            even at tp 1); unset: :attr:`rendezvous_port` derives ``port`` + :data:`NCCL_PORT_OFFSET`
            (SGLang's own default is a random free port, which two instances starting together
            on one machine can both pick). Always rendered, so instances on one machine
            never share it (:mod:`~.fleet`).
        base_gpu_id: first GPU of the instance (SGLang ``--base-gpu-id``; rank r uses GPU
            ``base_gpu_id + r``, counted among the GPUs ``CUDA_VISIBLE_DEVICES`` leaves
            visible); unset: 0, not rendered. See :func:`gpu_set`.
    """

    host: Annotated[str, Field(max_length=64)] = "0.0.0.0"
    port: Port = 30000
    tp_size: _bounded(0, 64, gt=True) = 8
    dp_size: _bounded(0, 64, gt=True) = 1
    mem_fraction_static: Annotated[float, BeforeValidator(_no_bool), Field(gt=0, lt=1)] | None = None
    max_running_requests: _bounded(0, 4096, gt=True) | None = None
    cuda_graph: bool = True
    cuda_graph_max_bs: BatchSize | None = None
    cuda_graph_bs: Annotated[list[BatchSize], Field(max_length=512)] | None = None
    attention_backend: ArgText | None = None
    page_size: _bounded(0, 1024, gt=True) | None = None
    disable_overlap_schedule: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    extra_args: Annotated[dict[str, Any], Field(max_length=MAX_ITEMS)] = Field(default_factory=dict)
    nccl_port: Port | None = None
    base_gpu_id: _bounded(0, 63) | None = None

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: dict[str, Any]) -> dict[str, Any]:
        from .multinode import FIX, describe, multinode_flag

        for flag, value in v.items():
            # before the spelling check: --nnodes=2 gets the multi-node rule, not "no =VALUE"
            if isinstance(flag, str) and (option := multinode_flag(flag)) is not None:
                raise _fail(describe(flag[:80], option), FIX)
            if not isinstance(flag, str) or not _FLAG.fullmatch(flag):
                raise _fail(f"flag {str(flag)[:80]!r} is not a long option of lower-case letters, digits and dashes "
                            "(--name, at most 64 characters; no =VALUE, no short options)",
                            'write it as SGLang spells it, e.g. "--mm-attention-backend": "fa4"')
            values = value if isinstance(value, list) else [value]
            if value is False or value is None or (isinstance(value, list) and not value):
                raise _fail(f"{flag}: {value!r} sets nothing", f"remove {flag} (or give true for a bare flag)")
            if len(values) > MAX_ITEMS:
                raise _fail(f"{flag} has {len(values)} values (at most {MAX_ITEMS})", "give fewer values")
            for x in values:
                if x is True and not isinstance(value, list):
                    continue
                if isinstance(x, bool) or not isinstance(x, (str, int, float)):
                    raise _fail(f"{flag}: each value must be a string or a number (true alone for a bare flag)",
                                f'e.g. "{flag}": 1 or "{flag}": [1, 2]')
                if isinstance(x, float) and not math.isfinite(x):
                    # json.dumps writes NaN/Infinity, which no reader of plan.json accepts (RFC 8259)
                    raise _fail(f"{flag}: {x!r} is not a finite number (plan.json is strict JSON and the host's "
                                "plan reader refuses it)", f"give {flag} a finite number, or remove it")
                if isinstance(x, int) and not -MAX_INT < x < MAX_INT:
                    raise _fail(f"{flag}: {_shown_int(x)} is out of range (integers in plan.json must lie strictly "
                                f"between -2**63 and 2**63: the host's plan reader's bound)",
                                f"give {flag} a smaller number, or remove it")
                text = str(x)
                if len(text) > MAX_PATH:
                    raise _fail(f"{flag}: a value is longer than {MAX_PATH} characters", "shorten it")
                kind = looks_like_token(text) or value_secret_reason(text)
                if kind is None and _AUTH_PREFIX.match(text):
                    kind = "an HTTP authorization credential (Bearer/Basic/Token ...)"
                if kind is not None:
                    register_secret(text)  # never echoed
                    raise _fail(
                        f"{flag}: a value holds {kind}; extra_args land in the argv (process list), the "
                        "0644 unit and plan.json",
                        "remove it; give secrets through ddtree_secret_env (0600 secrets.env) or ddtree_hf_token",
                    )
                try:
                    _safe_arg(text)
                except ValueError as exc:
                    rule = str(exc).split(RULE_FIX_SEP, 1)[0]
                    raise _fail(f"{flag}: a value {rule}",
                                f"give {flag} a value of those characters that does not start with - "
                                "(it is one argv token), or remove the flag") from None
        return v

    def extra_argv(self) -> list[str]:
        """:attr:`extra_args` as argv tokens, in the inventory's order."""
        out: list[str] = []
        for flag, value in self.extra_args.items():
            out.append(flag)
            if value is not True:
                out += [str(x) for x in (value if isinstance(value, list) else [value])]
        return out

    @property
    def rendezvous_port(self) -> int:
        """The ``--nccl-port`` rendered: :attr:`nccl_port`, else ``port`` + :data:`NCCL_PORT_OFFSET`
        (``port`` - the offset where that passes 65535)."""
        if self.nccl_port is not None:
            return self.nccl_port
        up = self.port + NCCL_PORT_OFFSET
        return up if up <= 65535 else self.port - NCCL_PORT_OFFSET

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        try:
            ip = ipaddress.ip_address(v)
        except ValueError:
            raise _fail("must be an IP address to listen on", "use 0.0.0.0, 127.0.0.1 or the host's IP") from None
        scope = getattr(ip, "scope_id", None)
        if scope is not None and not _SCOPE_ID.fullmatch(scope):
            raise _fail("an IPv6 scope id must be an interface name: 1-15 letters, digits, _ . - (Linux IFNAMSIZ)",
                        "write e.g. fe80::1%eth0, or listen on :: / 0.0.0.0")
        return v

    @property
    def local_url(self) -> str:
        """Where a process on the host itself reaches this server, e.g. ``http://127.0.0.1:30000``:
        0.0.0.0 -> 127.0.0.1, :: -> [::1], a specific address -> itself (IPv6 bracketed, a scope
        id percent-encoded as ``%25``, RFC 6874). Used by plan.json ``url``, the unit's readiness
        commands, the exporter's upstream and the roles' readiness checks."""
        ip = ipaddress.ip_address(self.host)
        if ip.is_unspecified:
            return loopback_url(self.port, ip.version)
        if ip.version == 6:
            return f"http://[{str(ip).replace('%', '%25')}]:{self.port}"
        return f"http://{ip}:{self.port}"

    @field_validator("cuda_graph_bs")
    @classmethod
    def _bs_list(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or v != sorted(set(v))):
            raise _fail("must be a non-empty, strictly increasing list of batch sizes", f"use {sorted(set(v)) or [1]}")
        return v


class Service(_Model):
    """systemd service settings for one SGLang instance.

    Attributes:
        name: instance name; the unit is ``ddtree-<name>.service``.
        user, group: account the server runs as (created by the role).
        venv: the ops virtual environment: ddtree-ops and its deps (health, warmup,
            exporter, simulator); absolute path.
        sglang_venv: the SGLang virtual environment (the pinned build, its pinned deps and
            ddtree-ops installed ``--no-deps`` for the probe and plugin); default
            ``sglang-venv`` next to ``venv``.
        config_dir, state_dir, cache_dir: defaults ``/etc/ddtree-ops/<name>``,
            ``/var/lib/ddtree-ops/<name>``, ``/var/cache/ddtree-ops/<name>``; the cache dir
            holds per-instance HF, Triton, DeepGEMM and FlashInfer caches that survive restarts.
        start_timeout_s: seconds allowed for model load + graph capture (until ``/health``
            answers 200); the unit's ``TimeoutStartSec`` adds ``ddtree_ops.warmup_deadline_s``
            and a margin (:func:`ddtree_ops.render.files.timeout_start_s`).
        restart_sec: seconds between restarts after a failure.
        start_limit_burst, start_limit_interval_s: at most ``burst`` starts per interval,
            so a crash cannot loop forever.
        env: extra non-secret environment for SGLang (e.g. ``TRITON_PTXAS_PATH``), at most
            64 names. Secret-looking names (:data:`~.errors.SECRET_NAME`: token, key, password,
            secret, credential, auth) are refused: this env file is 0644 and copied into
            plan.json; put them in ``ddtree_secret_env``.
        keep_releases: previous releases kept on the host besides the current one (1..50;
            older ones are pruned at each activation, never the current or the previous one:
            :mod:`ddtree_ops.host.release`).
    """

    name: str = "sglang"
    user: str = "sglang"
    group: str = "sglang"
    venv: AbsPath = "/opt/ddtree-ops/venv"
    sglang_venv: AbsPath | None = None
    config_dir: AbsPath | None = None
    state_dir: AbsPath | None = None
    cache_dir: AbsPath | None = None
    start_timeout_s: _bounded(60, 86400) = 3600
    restart_sec: _bounded(1, 3600) = 30
    start_limit_burst: _bounded(1, 100) = 3
    start_limit_interval_s: _bounded(60, 86400) = 7200
    env: Annotated[dict[str, EnvText], Field(max_length=MAX_ITEMS)] = Field(default_factory=dict)
    keep_releases: _bounded(1, 50) = 3

    @field_validator("name", "user", "group")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _SAFE_NAME.fullmatch(v):
            raise _fail("must be lower-case letters, digits, _ or - (max 32, starting with a letter)", "e.g. sglang")
        return v

    @field_validator("name")
    @classmethod
    def _unit_name_free(cls, v: str) -> str:
        """The units ``ddtree-<name>.service``, ``ddtree-<name>-exporter.service`` and the
        host's ``ddtree-nvidia-devices.service`` must stay distinct: a service named
        ``nvidia-devices`` would overwrite the device unit, one named ``x-exporter`` the
        exporter unit of a service ``x``."""
        if v == "nvidia-devices" or v.endswith("-exporter"):
            raise _fail(f"unit ddtree-{v}.service would collide with ddtree-ops' own units "
                        "(ddtree-nvidia-devices.service, ddtree-<service>-exporter.service)",
                        "pick another service name, e.g. sglang or kimi")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_KEY.fullmatch(key):
                raise _fail(f"environment name {key!r} must match [A-Z_][A-Z0-9_]*", "use an upper-case name")
            if key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
                raise _fail("secrets never go in the plain env file", "set ddtree_hf_token (ansible-vault) instead")
            if is_secret_name(key):
                raise _fail(f"{key} looks like a secret (its name holds token, key, password, secret, credential or "
                            "auth); this env file is world-readable (0644) and copied into plan.json",
                            f"move it to ddtree_secret_env: {{{key}: ...}} (ansible-vault it); it then lands only in "
                            "the 0600 secrets.env")
            why = (value_secret_reason(v[key]) or looks_like_token(v[key])) if isinstance(v[key], str) else None
            if why:
                register_secret(v[key])
                raise _fail(f"the value of {key} holds {why}; this env file is world-readable (0644) and copied "
                            "into plan.json", f"move it to ddtree_secret_env: {{{key}: ...}} (ansible-vault it)")
            if key.startswith("DDTREE_OPS_"):  # the SGLang plugin's guard compares the server with these
                raise _fail(f"{key} is derived from the validated config (the SGLang plugin checks the server's "
                            "graph sizes against it; an override defeats that guard)",
                            "remove it; change ddtree_speculative (block_size, budget) instead")
        return v

    @property
    def unit_name(self) -> str:
        return f"ddtree-{self.name}.service"

    @property
    def sglang_venv_path(self) -> str:
        return self.sglang_venv or f"{self.venv.rsplit('/', 1)[0] or ''}/sglang-venv"

    @property
    def config_path(self) -> str:
        return self.config_dir or f"/etc/ddtree-ops/{self.name}"

    @property
    def state_path(self) -> str:
        return self.state_dir or f"/var/lib/ddtree-ops/{self.name}"

    @property
    def cache_path(self) -> str:
        return self.cache_dir or f"/var/cache/ddtree-ops/{self.name}"

    @property
    def runtime_path(self) -> str:
        """The unit's ``RuntimeDirectory`` (systemd removes it whenever the unit stops)."""
        return f"/run/ddtree-ops/{self.name}"

    @property
    def warm_marker_path(self) -> str:
        """Written by the unit's warmup when it succeeds; gone after any stop or crash."""
        return f"{self.runtime_path}/warm.json"


class Ops(_Model):
    """Health checks and exporter.

    Attributes:
        health_timeout_s: per-probe timeout, seconds; SGLang's fastest /health takes
            ~1 s, so under 3 s flaps.
        health_failures: consecutive failed probes before "unhealthy".
        ready_timeout_s: how long a deploy waits for the service to answer 200.
        warmup_deadline_s: bound on the warmup the unit runs before it is active, seconds.
        exporter_port: port of ``ddtree-ops exporter`` (19400: 9400 is dcgm-exporter's default; 9100-9999 is all taken).
        scrape_host: address Prometheus uses for this host: one IP address or RFC 1123 host
            name, no port (default: ``ansible_host``, else the inventory name).
        accept_length_floor: alert when acceptance length stays below this.
    """

    health_timeout_s: Seconds = 5.0
    health_failures: _bounded(1, 1000) = 3
    ready_timeout_s: _bounded(1, 86400) = 3600
    warmup_deadline_s: _bounded(10, 86400) = 600
    exporter_port: Port = 19400
    scrape_host: HostText | None = None
    accept_length_floor: Annotated[float, BeforeValidator(_no_bool), Field(ge=1, le=1024, allow_inf_nan=False)] = 1.5

    @property
    def exporter_url(self) -> str:
        """Where a process on the host reaches the exporter (it listens on every address):
        :func:`loopback_url` of :attr:`exporter_port`, e.g. ``http://127.0.0.1:19400``. Read by the
        ``ddtree_exporter`` role (``ddtree_render``'s ``exporter_url``) and ``fleet status``."""
        return loopback_url(self.exporter_port)


class RiskAcceptance(_Model):
    """An explicit, reasoned override of a refusing rule.

    Attributes:
        rule: the rule id the finding names (e.g. ``sm103-ddtree-graph-capture``).
        reason: why this deployment is safe anyway (>= 20 characters, recorded).
    """

    rule: Annotated[str, Field(max_length=64)]
    reason: Annotated[str, Field(min_length=20, max_length=MAX_TEXT)]

    @field_validator("reason")
    @classmethod
    def _reasoned(cls, v: str) -> str:
        if len(v.strip()) < 20:
            raise _fail("the reason must say why, in at least 20 non-blank characters", "write down the evidence")
        return v.strip()


class Toolchain(_Model):
    """CUDA toolkit and Triton pins (inventory ``ddtree_toolchain``).

    Attributes:
        cuda: toolkit ``major.minor`` installed by the ``cuda_toolkit`` role (one of
            :data:`ddtree_ops.config.toolchain.CUDA_TOOLKITS`); unset: 13.0, or the host
            arch's minimum if newer. Must be >= the arch's minimum (sm_103: 12.9, sm_120: 12.8).
        triton: the Triton release in the service venv (one of
            :data:`ddtree_ops.config.toolchain.TRITONS`); decides whether the service env
            needs ``TRITON_PTXAS_PATH`` / ``TRITON_PTXAS_BLACKWELL_PATH``. Unset: both point at
            the toolkit's ptxas.
    """

    cuda: Annotated[str, Field(max_length=16)] | None = None
    triton: Annotated[str, Field(max_length=32)] | None = None

    @field_validator("cuda", mode="before")
    @classmethod
    def _cuda(cls, v: object) -> object:
        if v is not None and str(v) not in CUDA_TOOLKITS:
            raise _fail(f"unknown CUDA toolkit (known: {', '.join(CUDA_TOOLKITS)})",
                        "pin one of those as a quoted string, e.g. cuda: \"13.0\"")
        return None if v is None else str(v)

    @field_validator("triton", mode="before")
    @classmethod
    def _triton(cls, v: object) -> object:
        if v is not None and str(v) not in TRITONS:
            raise _fail(f"unknown Triton release: which ptxas it bundles is not recorded (known: {', '.join(TRITONS)})",
                        "pin one of those, or read the wheel's triton/backends/nvidia/bin and add it to "
                        "ddtree_ops/config/toolchain.py TRITONS")
        return None if v is None else str(v)


def _class_rule(field: str) -> BeforeValidator:
    """The rule of one host-class field (:func:`ddtree_ops.config.hosts.field_problem`, which the
    preflight's plan reader applies too); ``None`` is "not given"."""
    def check(v: object) -> object:
        problem = field_problem(field, v) if v is not None else None
        if problem:
            raise _fail(*problem)
        return v
    return BeforeValidator(check)


class HostClassSpec(_Model):
    """One entry of ``ddtree_host_classes``: a host class added to the built-in table
    (:data:`ddtree_ops.config.hosts.HOST_CLASSES`) or merged field by field over the built-in
    class of the same name. Every field is optional here; a new class must end up with
    ``gpu_name``, ``gpu_count``, ``arch``, ``interconnect`` and ``gpu_memory_gib``, given or taken
    from ``like`` (:func:`ddtree_ops.config.hosts.resolve_host_classes`, reported by
    :func:`ddtree_ops.config.rules.rule_host_class`).

    Attributes:
        like: the class to start from (built-in or another entry), e.g. ``h200x8``.
        gpu_name, gpu_name_match, gpu_count, arch, interconnect, nvlink_bridge_peers,
            gpu_memory_gib, min_cuda, source, fabric_registration: as
            :class:`ddtree_ops.config.hosts.HostClass`;
            each checked by :func:`ddtree_ops.config.hosts.field_problem` (e.g. ``gpu_count`` an
            integer 1..64, ``arch`` a row of ``toolchain.ARCHS``, ``min_cuda`` a quoted
            ``"major.minor"``).
    """

    like: Annotated[str | None, _class_rule("like")] = None
    gpu_name: Annotated[str | None, _class_rule("gpu_name")] = None
    gpu_name_match: Annotated[str | None, _class_rule("gpu_name_match")] = None
    gpu_count: Annotated[int | None, _class_rule("gpu_count")] = None
    arch: Annotated[str | None, _class_rule("arch")] = None
    interconnect: Annotated[str | None, _class_rule("interconnect")] = None
    nvlink_bridge_peers: Annotated[int | None, _class_rule("nvlink_bridge_peers")] = None
    gpu_memory_gib: Annotated[int | None, _class_rule("gpu_memory_gib")] = None
    min_cuda: Annotated[str | None, _class_rule("min_cuda")] = None
    source: Annotated[str | None, _class_rule("source")] = None
    fabric_registration: Annotated[bool | None, _class_rule("fabric_registration")] = None

    def given(self) -> dict[str, Any]:
        """The fields this entry sets (``None`` is not set)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


@functools.lru_cache(maxsize=256)
def _resolved(entries: tuple[tuple[str, HostClassSpec], ...]) -> tuple[dict[str, HostClass], list[HostClassError]]:
    return resolve_host_classes({name: spec.given() for name, spec in entries})


class Deployment(_Model):
    """One SGLang instance on one inventory host.

    Build with :func:`ddtree_ops.config.load.deployment_from_hostvars`; derived sizes live in
    :class:`ddtree_ops.config.plan.Plan`.

    Attributes:
        host: inventory host name: RFC 1123 or a canonical IPv4 address (:func:`inventory_name_problem`).
        address: ``ansible_host``: one IP address or RFC 1123 host name.
        host_class: ``ddtree_host_class``: a class of :attr:`host_class_table`.
        host_classes: ``ddtree_host_classes`` ``{name: HostClassSpec}`` (<= 64): classes added to
            the built-in table or merged over a built-in one (usually in group_vars, so every
            host sees the same table). Only the host's own class reaches its plan.json. The
            names (:func:`~.hosts.name_problem`) and what joins entries (``like``, required
            fields) are checked by :func:`~.rules.rule_host_class`.
        hf_token: ``ddtree_hf_token`` (vault it): lands as ``HF_TOKEN`` in the 0600 secrets.env.
        secret_env: ``ddtree_secret_env`` ``{NAME: value}`` (vault the values; <= 64 names
            ``[A-Z_][A-Z0-9_]*``, values <= 4096 characters without control characters):
            further secret environment (e.g. ``WANDB_API_KEY``); lands only in the 0600
            secrets.env, never in plan.json, and is redacted in every message.
    """

    host: Annotated[str, Field(max_length=MAX_NAME)]
    address: HostText | None = None
    host_class: str
    host_classes: Annotated[dict[str, HostClassSpec], Field(max_length=MAX_ITEMS)] = Field(default_factory=dict)
    sglang: SGLangPin = Field(default_factory=SGLangPin)
    model: ModelSpec
    speculative: Speculative = Field(default_factory=Speculative)
    server: Server = Field(default_factory=Server)
    service: Service = Field(default_factory=Service)
    ops: Ops = Field(default_factory=Ops)
    accepted_risks: Annotated[list[RiskAcceptance], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    toolchain: Toolchain = Field(default_factory=Toolchain)
    hf_token: SecretStr | None = None
    secret_env: Annotated[dict[str, SecretStr], Field(max_length=MAX_ITEMS)] = Field(default_factory=dict)

    @field_validator("host")
    @classmethod
    def _host_name(cls, v: str) -> str:
        problem = inventory_name_problem(v)
        if problem:
            raise _fail(problem, "rename the inventory host (put the address in ansible_host), e.g. b300-01")
        return v

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for key, value in v.items():
            if not _ENV_KEY.fullmatch(key):
                raise _fail("environment names must match [A-Z_][A-Z0-9_]* (at most 128 characters)",
                            "use an upper-case name")
            if key.startswith("DDTREE_OPS_") or key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
                raise _fail(f"{key} is set by ddtree-ops (DDTREE_OPS_* from the plan, HF_TOKEN from ddtree_hf_token)",
                            "remove it (set ddtree_hf_token for the HF token)")
            secret = value.get_secret_value()
            if len(secret) > MAX_PATH:
                raise _fail(f"the value of {key} must be at most {MAX_PATH} characters", "store the secret alone")
            problem = env_char_problem(secret)  # names the code point, never the secret
            if problem:
                raise _fail(f"the value of {key} {problem} (systemd EnvironmentFile= lines)",
                            "store the secret alone, without a newline or invisible characters")
        return v

    @field_validator("hf_token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{8,512}", v.get_secret_value()):
            raise _fail("an HF token is 8-512 letters, digits, _ . - (no whitespace or newline)",
                        "paste the token alone, without quotes or a trailing newline")
        return v

    @property
    def host_class_table(self) -> dict[str, HostClass]:
        """The built-in host classes with :attr:`host_classes` merged over them (entries that do
        not resolve are left out: :func:`~.rules.rule_host_class` reports them)."""
        return _resolved(tuple(self.host_classes.items()))[0]

    @property
    def host_class_problems(self) -> list[HostClassError]:
        """Why entries of :attr:`host_classes` do not resolve (one per entry)."""
        return _resolved(tuple(self.host_classes.items()))[1]

    @property
    def host_class_def(self) -> HostClass | None:
        """The host's class (:attr:`host_class` in :attr:`host_class_table`), or None when unknown."""
        return self.host_class_table.get(self.host_class)

    def risk_reason(self, rule: str) -> str | None:
        for r in self.accepted_risks:
            if r.rule == rule:
                return r.reason
        return None


INVENTORY_VARS: dict[str, str] = {
    "address": "ansible_host",
    "host_class": "ddtree_host_class",
    "host_classes": "ddtree_host_classes",
    "sglang": "ddtree_sglang",
    "model": "ddtree_model",
    "speculative": "ddtree_speculative",
    "server": "ddtree_server",
    "service": "ddtree_service",
    "ops": "ddtree_ops",
    "accepted_risks": "ddtree_accepted_risks",
    "hf_token": "ddtree_hf_token",
    "toolchain": "ddtree_toolchain",
    "secret_env": "ddtree_secret_env",
}
"""Model field -> inventory variable name."""

ROLE_VAR_PREFIXES = ("ddtree_service_", "ddtree_exporter_")
"""``ddtree_*`` variables that belong to roles (their defaults), not to the deployment model."""


def is_deployment_var(name: str) -> bool:
    """Variables the config loader looks at: every ``ddtree_*`` except role variables."""
    return name.startswith("ddtree_") and not name.startswith(ROLE_VAR_PREFIXES)


GROUPS_VAR = "group_names"
"""Ansible's magic variable listing a host's groups; :func:`deployment_vars` passes it on so the
loader can refuse a host in two host-class groups."""

MAX_VAR_NODES = 20_000
"""Most values (scalars, list items, mapping entries) one host's deployment variables may hold."""
MAX_VAR_CHARS = 1 << 20
"""Most characters (strings and keys together) one host's deployment variables may hold (1 MiB)."""


def _size_problem(name: str, value: Any, budget: list[int]) -> str | None:
    """Walk ``value`` charging ``budget`` = [nodes, chars]; return the path where it ran out.
    Stops at the first overrun, so an alias bomb costs at most MAX_VAR_NODES steps."""
    stack: list[tuple[str, Any]] = [(name, value)]
    while stack:
        path, v = stack.pop()
        budget[0] -= 1
        if isinstance(v, (str, bytes)):
            budget[1] -= len(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                budget[1] -= len(k) if isinstance(k, str) else 1
                stack.append((f"{path}.{k}" if isinstance(k, str) and len(k) < 64 else f"{path}.<key>", x))
                if budget[0] - len(stack) < 0:
                    break
        elif isinstance(v, (list, tuple, set, frozenset)):
            for i, x in enumerate(v):
                stack.append((f"{path}.{i}", x))
                if budget[0] - len(stack) < 0:
                    break
        if budget[0] < 0 or budget[1] < 0:
            return path
    return None


def _check_size(host: str, variables: dict[str, Any], memo: dict | None = None) -> None:
    budget = [MAX_VAR_NODES, MAX_VAR_CHARS]
    for name in sorted(variables, key=str):
        value = variables[name]
        cost = _memo_get(memo, "size", value)
        # a value walked whole before costs the same again; it cannot overrun while the budget
        # left covers that cost (the walk's early stops test the budget left after pending items)
        if cost is not None and budget[0] >= cost[0] and budget[1] >= cost[1]:
            budget[0] -= cost[0]
            budget[1] -= cost[1]
            continue
        before = tuple(budget)
        where = _size_problem(str(name), value, budget)
        if where is None:
            _memo_put(memo, "size", value, (before[0] - budget[0], before[1] - budget[1]))
        if where is not None:
            raise ConfigError([Finding(
                "error", where, "…", f"the host's deployment variables exceed {MAX_VAR_NODES} values or "
                f"{MAX_VAR_CHARS // 1024} KiB of text (a YAML alias bomb or a runaway value)",
                "shorten it: no deployment setting needs that much (paths are <= 4096 characters)", host=host)])


def _secret_key(name: str) -> bool:
    """:func:`is_secret_name`, remembered for names up to 128 characters: every host repeats
    the same few dozen keys (a long, odd key is checked each time and not kept)."""
    return _secret_key_cached(name) if len(name) <= 128 else is_secret_name(name)


@functools.lru_cache(maxsize=4096)
def _secret_key_cached(name: str) -> bool:
    return is_secret_name(name)


def _register_secrets(name: str, value: Any, secret: bool = False, memo: dict | None = None) -> None:
    """Register every string that is secret: under a secret-looking name or key, or vaulted.
    With ``memo`` (one load's, :func:`deployment_vars`), a container seen before under the same
    name registers the strings its first walk found, without walking it again."""
    from .errors import _is_vaulted

    known = _memo_get(memo, ("secrets", name, secret), value)
    if known is not None:
        for v in known:
            register_secret(v)
        return
    found: list[str] = []
    stack = [(name, value, secret)]
    while stack:
        key, v, sec = stack.pop()
        sec = sec or _secret_key(key) or _is_vaulted(v)
        if isinstance(v, str):
            if sec:
                register_secret(v)
                found.append(v)
        elif isinstance(v, dict):
            stack.extend((str(k), x, sec) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((key, x, sec) for x in v)
    _memo_put(memo, ("secrets", name, secret), value, found)


def _memo_get(memo: dict | None, kind: Any, value: Any) -> Any:
    """What ``kind`` of walk found in the container ``value`` earlier in this load, or None.

    ``memo`` belongs to one inventory load (:func:`deployment_vars`' ``memo``): the hosts of a
    group share their group_vars values as the very same objects, and nothing mutates them while
    loading, so a walk's result is kept per object (the memo holds the object, so its ``id``
    cannot be reused). Strings and scalars are not kept (checking them is as cheap)."""
    if memo is None or not isinstance(value, (dict, list, tuple)):
        return None
    hit = memo.get((kind, id(value)))
    return hit[1] if hit is not None and hit[0] is value else None


def _memo_put(memo: dict | None, kind: Any, value: Any, result: Any) -> None:
    if memo is not None and isinstance(value, (dict, list, tuple)):
        memo[(kind, id(value))] = (value, result)


SECRET_VARS = ("ddtree_hf_token", "ddtree_secret_env")
"""The only deployment variables that may hold a secret (they land in the 0600 secrets.env alone)."""

SKIP_VARS = frozenset({"hostvars", "vars", "groups", "omit", "play_hosts", "ansible_play_hosts",
                       "ansible_play_hosts_all", "ansible_play_batch"})
"""Ansible magic variables the vault walk skips (other hosts' variables, group lists)."""

MAX_VAULT_NODES = 200_000
"""Most values the vault walk over all of one host's variables visits."""

_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
_LITERAL = re.compile(r"'([^'\\]*)'|\"([^\"\\]*)\"")


def _strings(value: Any, limit: int = MAX_VAR_NODES) -> Iterator[tuple[str, Any]]:
    """``(path-suffix, leaf)`` for every leaf of ``value`` (keys included as leaves), bounded."""
    stack: list[tuple[str, Any]] = [("", value)]
    n = 0
    while stack and n < limit:
        path, v = stack.pop()
        n += 1
        if isinstance(v, dict):
            for k, x in v.items():
                yield path, k
                stack.append((f"{path}.{k}" if isinstance(k, str) and len(k) < 64 else f"{path}.<key>", x))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{path}.{i}", x) for i, x in enumerate(v))
        else:
            yield path, v


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _nodes(value: Any) -> int:
    """How many values :func:`_strings` pops walking all of ``value`` (its ``limit`` counts these)."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return n


def _reachable_vars(all_vars: dict[str, Any], memo: dict | None = None) -> set[str]:
    """Names of the variables whose values can reach the loader's output: the deployment
    variables (:data:`INVENTORY_VARS`, ``ddtree_*``) and, transitively, every variable named
    anywhere inside their Jinja (``{{ x }}``, ``hostvars[h]['x']``, ``lookup('vars', 'x')``).
    A name computed at run time (``lookup('vars', 'a' ~ 'b')``) is not followed
    (docs/configuration.md: the limit of the secret check).
    ``memo``: one load's (:func:`_memo_get`); a container walked whole before gives its names again."""
    known = {str(n) for n in all_vars if n not in SKIP_VARS}
    todo = [n for n in known if n in INVENTORY_VARS.values() or is_deployment_var(n)]
    seen = set(todo)
    budget = MAX_VAULT_NODES
    while todo and budget > 0:
        value = all_vars[todo.pop()]
        hit = _memo_get(memo, "names", value)  # (values popped, leaves yielded, names) of a whole walk
        if hit is not None and hit[0] <= budget:
            budget -= hit[1]
            words = hit[2]
        else:
            start = budget
            words = set()
            for _, leaf in _strings(value, budget):
                budget -= 1
                if isinstance(leaf, str) and ("{{" in leaf or "{%" in leaf):
                    words.update(w for expr in _JINJA.findall(leaf) for w in _NAME.findall(expr))
            if memo is not None and isinstance(value, (dict, list, tuple)) and _nodes(value) <= start:
                _memo_put(memo, "names", value, (_nodes(value), start - budget, frozenset(words)))
        for w in (words & known) - seen:
            seen.add(w)
            todo.append(w)
    return seen


def _vault_plaintexts(all_vars: dict[str, Any], template: Callable[[Any], Any],
                      memo: dict | None = None) -> tuple[set[str], set[str]]:
    """Walk every variable of the host (not :data:`SKIP_VARS`; at most :data:`MAX_VAULT_NODES`
    values) for vaulted values; return (the plaintexts of those in :func:`_reachable_vars`,
    registered as secrets; the names of the variables that hold one or whose Jinja refers to
    one, transitively).

    Only reachable values are decrypted: each vaulted string costs a key derivation (PBKDF2,
    ~3 ms), so 2,000 of them in an unrelated variable took 7-12 s, and a value no deployment
    variable refers to cannot reach a field. A deadline firing while decrypting (inventory's
    ``TemplateTimeout``) gets ``cause``, ``variable`` and ``fix`` attributes naming decryption,
    not Jinja, as the cause.

    ``memo`` (one load's, :func:`_memo_get`): a container walked whole before without a vaulted
    value in it is charged to the budget as before and not walked again (the hosts of a group
    share their group_vars values)."""
    from .errors import _is_vaulted

    plain: set[str] = set()
    holders: set[str] = set()
    reachable = _reachable_vars(all_vars, memo)
    budget = MAX_VAULT_NODES
    done = 0
    for name, value in list(all_vars.items()):
        if name in SKIP_VARS or budget <= 0:
            continue
        if isinstance(value, (dict, list, tuple)):
            clean = _memo_get(memo, "unvaulted", value)  # (values popped, leaves yielded) of a whole walk
            if clean is not None and clean[0] <= budget:
                budget -= clean[1]
                continue
            leaves: Any = _strings(value, budget)
        elif not _is_vaulted(value):  # a scalar: the walk would yield it alone (most per-host variables)
            budget -= 1
            continue
        else:
            leaves = (("", value),)
        start, vaulted = budget, False
        for _, leaf in leaves:
            budget -= 1
            if _is_vaulted(leaf):
                vaulted = True
                holders.add(str(name))
                if str(name) not in reachable:
                    continue
                try:
                    text = template(leaf)
                except Exception:  # noqa: BLE001 - undecryptable here: no plaintext to leak
                    continue
                except BaseException as exc:  # a deadline while decrypting: say so, not "Jinja"
                    exc.__dict__.setdefault("variable", str(name))
                    exc.__dict__.setdefault("cause", f"decrypting the vaulted values the deployment variables refer to "
                                                     f"({done} done; one key derivation each)")
                    exc.__dict__.setdefault("fix", "vault fewer separate values the ddtree_* variables refer to (one "
                                                   "vaulted file, ansible-vault encrypt, costs one key derivation)")
                    raise
                done += 1
                if isinstance(text, str):
                    register_secret(text)
                    plain.add(text)
        if not vaulted and memo is not None and isinstance(value, (dict, list, tuple)) and _nodes(value) <= start:
            _memo_put(memo, "unvaulted", value, (_nodes(value), start - budget))
    if holders:
        _add_jinja_holders(all_vars, holders)
    return plain, holders


def _add_jinja_holders(all_vars: dict[str, Any], holders: set[str]) -> None:
    """Add to ``holders`` (names of variables holding a vaulted value) every variable whose Jinja
    refers to one, transitively (a variable whose Jinja names a holder holds the secret too)."""
    jinja_of = {str(n): " ".join(_JINJA.findall(" ".join(x for _, x in _strings(v) if isinstance(x, str))))
                for n, v in all_vars.items() if n not in SKIP_VARS and str(n) not in holders}
    changed = True
    while changed and holders:
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b")
        changed = False
        for n, expr in jinja_of.items():
            if n not in holders and expr and pattern.search(expr):
                holders.add(n)
                changed = True


def _secret_in_plain_field(host: str, raw: dict[str, Any], out: dict[str, Any], plain: set[str],
                           holders: set[str], memo: dict | None = None) -> None:
    """Refuse a non-secret deployment field whose templated value is vaulted, contains a vault
    plaintext (or a registered secret of this host), or whose Jinja refers to a vault-holding variable.
    With no such secret to look for, the vaulted paths of a container are kept in ``memo`` (one
    load's, :func:`_memo_get`)."""
    from .errors import _is_vaulted

    own = {s for k in SECRET_VARS for _, s in _strings(out.get(k)) if isinstance(s, str)}
    # a secret is one by provenance, whatever its length: secrets of >= 8 characters anywhere in a value,
    # shorter ones (>= 4, as register_secret keeps) as a whole word of it (a vaulted "qw3n7" reused as
    # served_model_name); Jinja naming a vaulted variable is caught by name below
    secrets = [s for s in plain | own if len(s) >= 8]
    short = [s for s in plain | own if 4 <= len(s) < 8]
    word = (re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, sorted(short))) + r")(?![A-Za-z0-9])")
            if short else None)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b") if holders else None
    found: list[Finding] = []
    for k, v in out.items():
        if k in SECRET_VARS:
            continue
        hits = None if secrets or short else _memo_get(memo, "vaulted-paths", v)
        if hits is None:
            hits = [path for path, leaf in _strings(v)
                    if _is_vaulted(leaf) or (isinstance(leaf, str) and (any(s in leaf for s in secrets)
                                                                       or (word is not None and word.search(leaf))
                                                                       or looks_like_token(leaf)))]
            if not secrets and not short:
                _memo_put(memo, "vaulted-paths", v, tuple(hits))
        hits = list(hits)
        if pattern is not None:  # Jinja naming a vault-holding variable (a filter may have changed the text)
            hits += [path for path, leaf in _strings(raw.get(k))
                     if isinstance(leaf, str) and any(pattern.search(e) for e in _JINJA.findall(leaf))]
        if hits:
            found.append(Finding(
                "error", f"{k}{hits[0]}", REDACTED,
                "holds a secret (a vaulted value, or text made from one); only ddtree_hf_token and "
                "ddtree_secret_env may: this field would land in plan.json / 0644 files and in messages",
                "put the secret in ddtree_secret_env (or ddtree_hf_token); they land only in the 0600 "
                "secrets.env", host=host))
    if found:
        raise ConfigError(found)


def _secret_named_vars(all_vars: dict[str, Any]) -> set[str]:
    """Names of the host's variables (not :data:`SKIP_VARS`, not :data:`SECRET_VARS`) whose name looks
    secret (:func:`~.errors.is_secret_name`) and whose value is text or holds text."""
    return {str(n) for n, v in all_vars.items()
            if n not in SKIP_VARS and n not in SECRET_VARS and isinstance(n, str) and len(n) <= 128
            and isinstance(v, (str, dict, list, tuple)) and _secret_key(n)}


_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def template_error(name: str, raw: Any, exc: BaseException, host: str = "",
                   holders: set[str] | None = None) -> Finding:
    """A finding for a variable whose Jinja failed: Ansible's first line, with every quoted
    literal of the template source (and the source itself) replaced by ``…`` (a literal may be
    a secret: ``mandatory('<s>')``, ``lookup('file', '<s>')``). When the Jinja names a variable
    that holds a secret (``holders``: vaulted, or under a secret-looking name), every quoted value
    of Ansible's text goes too: a value the expression computed from the secret (``vault_x | upper``,
    ``vault_x ~ '!'``) is no registered string, and Ansible quotes the value it could not use."""
    from .errors import shorten

    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    if holders:
        names = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b")
        if any(names.search(e) for _, src in _strings(raw) if isinstance(src, str) for e in _JINJA.findall(src)):
            text = _QUOTED.sub("…", text)
    sources = [x for _, x in _strings(raw) if isinstance(x, str)]
    literals = {m[0] or m[1] for src in sources for expr in _JINJA.findall(src) + [src]
                for m in _LITERAL.findall(expr)}
    if name in SECRET_VARS or is_secret_name(name):  # even a name in a secret's Jinja may be the secret
        literals |= {w for src in sources for expr in _JINJA.findall(src) for w in re.findall(r"\w{3,}", expr)}
    for lit in sorted(literals | set(sources) | {lit for src in sources for lit in _JINJA.findall(src)},
                      key=len, reverse=True):
        if len(lit) >= 2 and lit in text:
            text = text.replace(lit, "…")
    fix = ("give the vault password: --vault-password-file FILE (or ANSIBLE_VAULT_PASSWORD_FILE / ansible.cfg)"
           if "undecryptable" in text or "vault" in text.lower() else
           "fix the Jinja expression of this variable (ansible-inventory -i INV --host HOST shows the same)")
    return Finding("error", name, "…", f"templating failed: {shorten(text, 300)}", fix, host=host)


def deployment_vars(all_vars: dict[str, Any], template: Callable[[Any], Any], host: str = "",
                    memo: dict | None = None) -> dict[str, Any]:
    """The variables of one host the config loader reads (:data:`INVENTORY_VARS` and every
    ``ddtree_*`` deployment variable), each passed through ``template`` (Ansible's Templar),
    plus ``group_names`` (:data:`GROUPS_VAR`) when present.

    Before anything walks them, their size is bounded (:data:`MAX_VAR_NODES`,
    :data:`MAX_VAR_CHARS`; again after templating). Every vaulted value the deployment variables
    can reach (ansible-core 2.19 ``EncryptedString`` / ``VaultedValue``; 2.17/18
    ``AnsibleVaultEncryptedUnicode``; :func:`_vault_plaintexts`) is decrypted and its plaintext
    registered for redaction, as is every string under a secret-looking name,
    ``ddtree_hf_token`` or ``ddtree_secret_env``.

    ``memo``: a dict the caller keeps for one inventory load and passes for every host (or None):
    walks over the same container objects (the group_vars values the hosts of a group share) are
    done once and their results kept there (:func:`_memo_get`); every check still runs per host.

    Raises:
        ConfigError: the variables are too large (one finding naming the path where the bound
            ran out); a variable's Jinja fails (:func:`template_error`); a field other than
            :data:`SECRET_VARS` holds a vaulted value or text made from one.
    """
    names = [k for k in all_vars if k in INVENTORY_VARS.values() or is_deployment_var(k)]
    raw = {k: all_vars[k] for k in names}
    _check_size(host, raw, memo)
    plain, holders = _vault_plaintexts(all_vars, template, memo)
    # a plain variable under a secret-looking name (my_api_key, db_password) is a secret by its name: Jinja
    # that names it in a plain field writes it out, as Jinja naming a vaulted variable would
    holders = holders | _secret_named_vars(all_vars)
    out = {}
    for k, v in raw.items():
        try:
            out[k] = template(v)
        except Exception as exc:  # noqa: BLE001 - Ansible raises many types; each is one finding
            raise ConfigError([template_error(k, v, exc, host, holders)]) from None
        except BaseException as exc:  # a deadline (inventory.TemplateTimeout): say which variable
            exc.__dict__.setdefault("variable", k)
            raise
    if any(out[k] is not raw[k] for k in raw):  # templating changed something (else: checked above)
        _check_size(host, out, memo)
    for k, v in out.items():
        _register_secrets(k, v, secret=k in SECRET_VARS, memo=memo)
    _secret_in_plain_field(host, raw, out, plain, holders, memo)
    groups = all_vars.get(GROUPS_VAR)
    if isinstance(groups, (list, tuple)) and len(groups) <= 1000:
        out[GROUPS_VAR] = [str(g) for g in groups if isinstance(g, str)]
    return out
