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
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
)

from .envchars import env_char_problem
from .fields import (
    _ENV_KEY,
    _SAFE_ARG,
    _SAFE_PATH,
    DEFAULT_SGLANG_VERSION,
    MAX_ITEMS,
    MAX_NAME,
    MAX_PATH,
    MAX_TEXT,
    AbsPathOrRelative,
    ArgText,
    HostText,
    Revision,
    Sha256,
    Tokens,
    Url,
    _bounded,
    _fail,
    _Model,
    _url_credentials,
    inventory_name_problem,
)
from .hosts import HostClass, HostClassError, field_problem, resolve_host_classes
from .service_models import Ops, Server, Service
from .toolchain import CUDA_TOOLKITS, TRITONS
from .versions import DDTREE_SOURCES, version_info


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

    @property
    def node_rank(self) -> int:
        """This host's SGLang ``--node-rank``: its position in ``ddtree_server.multinode.nodes``
        (0 on one machine, or when the host is not listed: :func:`~.multinode.rule_multinode`
        refuses that)."""
        mn = self.server.multinode
        return mn.nodes.index(self.host) if mn and self.host in mn.nodes else 0

    @property
    def serves_http(self) -> bool:
        """Whether this host's SGLang serves the API (rank 0); a non-zero rank serves only
        SGLang's health-only server (:mod:`~.multinode`)."""
        return self.node_rank == 0

    def risk_reason(self, rule: str) -> str | None:
        for r in self.accepted_risks:
            if r.rule == rule:
                return r.reason
        return None


