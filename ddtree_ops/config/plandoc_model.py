"""``plan.json`` as a typed contract: :class:`PlanDoc`, read by :func:`load_plan`.

One writer, :func:`ddtree_ops.render.files.plan_document` (``ddtree-ops render`` and the deploy
play), and one reader for every command that takes ``--plan`` on a host with ddtree-ops
installed: ``health``, ``warmup``, ``bench`` (records the document), ``exporter``,
``probe-sglang``, and the drift comparison (:mod:`ddtree_ops.runtime.drift`). The layers:

1. bytes: :func:`ddtree_ops._core.plandoc.read_plan_doc` (regular file, 4 MiB, strict JSON, depth 64,
   integers below 2**63; standard library only);
2. the version: ``schema_version`` (an integer; a document without it was written before the
   field existed and is read as version 1: from 310472b, which added ``paths``, to dab7f1d the
   writer wrote every field below with the meaning it has here. Earlier documents lack
   ``paths``, which the preflight has always required: they are refused naming it).
   A version above :data:`SCHEMA_VERSION` is refused before any field is read (an incompatible
   change bumps it; ``tests/fixtures/plan/`` holds documents of earlier writers);
3. the fields readers use, typed with the inventory's own bounds (:mod:`ddtree_ops.config.models`)
   and, for the fields the preflight reads, with the preflight's own rules
   (:func:`ddtree_ops.config.plan_fields.plan_fields`: the preflight zipapp runs on hosts with a bare
   python3 and keeps its standard-library reader; ``tests/test_plan_contract.py`` proves both
   accept the same documents).

Unknown keys are ignored (``extra="ignore"``), on purpose: within one ``schema_version`` a newer
writer only adds fields (that is what keeps the version), and an older reader must read its
document; a field whose meaning changes bumps the version instead. ``forbid`` would make every
addition a version bump; ``allow`` would put untyped values back on the typed view and invite
hand-rolled access again. The whole document stays available as :attr:`PlanDoc.document` for the
two consumers that need it as written: ``bench`` records it, ``probe-sglang`` re-validates the
stored deployment with the inventory's rules (where unknown fields are refused).

Derived values are written once, by the writer: ``url`` (the server's loopback URL,
:attr:`~ddtree_ops.config.service_models.Server.local_url`) and ``sglang_base_version``
(:attr:`~ddtree_ops.config.models.SGLangPin.base_version`); a version-1 document from before
``sglang_base_version`` existed gets it from the same property when it is loaded.

Every problem is one :class:`PlanDocError` (a :class:`~ddtree_ops.config.errors.ConfigError`:
exit 2 through the CLI's config-error path), one line naming the file, the field, the value
(redacted and cut) and the rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)

from .._core.plandoc import SCHEMA_VERSION as SCHEMA_VERSION  # defined with the byte layer (the zipapp reads it too)
from .._core.plandoc import PlanFileError, newer_schema, read_plan_doc, shown
from .errors import ConfigError, Finding, scrub
from .fields import MAX_PATH, ArgText, BatchSize, Port, _bounded
from .hosts import resolve_host_classes
from .models import SGLangPin
from .service_models import MAX_TP_SIZE, Ops

FIX = "re-render it (ddtree-ops render / deploy.yml) or use the host's /etc/ddtree-ops/<name>/plan.json"
SOURCE = "plan.json contract: ddtree_ops.config.plandoc_model.PlanDoc"


@dataclass(frozen=True)
class _Line(Finding):
    """A finding whose whole line is given (a file-level problem: it has no field = value)."""

    def message(self) -> str:
        return scrub(self.rule).replace("\n", "\\n").replace("\r", "\\r")


class PlanDocError(ConfigError):
    """A plan.json that cannot be used: unreadable, not a plan document, a newer
    ``schema_version``, or a field that breaks its rule. ``str()`` is one line:
    ``OPTION PATH: FIELD = VALUE: RULE. Fix: ...`` (or ``OPTION PATH: PROBLEM. Fix: ...``).

    A :class:`~ddtree_ops.config.errors.ConfigError`, so the CLI maps it to exit 2 with its line
    (and ``--json``) like an inventory error.

    Attributes:
        path: the file (``<rendered>`` for a document built in memory).
        field: dotted field path, or ``""`` for a file-level problem.
        problem: what is wrong, without path and fix (for callers that word their own line).
    """

    def __init__(self, option: str, path: str, problem: str, field: str = "", value: Any = None,
                 line: str | None = None):
        self.path, self.field, self.problem = str(path), field, problem
        where = f"{option} {shown(path)}"
        if field:
            finding: Finding = Finding("error", f"{where}: {field}", value, f"not a plan.json rendered by ddtree-ops: "
                                       f"{problem}", FIX, SOURCE)
        else:
            finding = _Line("error", where, None, line or f"{where}: {problem}. Fix: {FIX}", FIX)
        super().__init__([finding])


# ---------------------------------------------------------------- field types
def _http_base_url(v: Any) -> str:
    """``http(s)://HOST[:PORT][/path]``: no user info, query or fragment (the rule of the CLI's
    server URL, ``ddtree_ops.cli._url``: those parts would carry tokens into reports)."""
    import httpx

    try:
        if not isinstance(v, str) or len(v) > MAX_PATH:
            raise TypeError
        u = httpx.URL(v)
        ok = u.scheme in ("http", "https") and bool(u.host) and (u.port is None or 0 < u.port < 65536)
        ok = ok and not u.userinfo and not u.query and not u.fragment and "?" not in v and "#" not in v
    except Exception:  # httpx raises several types for malformed URLs
        ok = False
    if not ok:
        raise ValueError("must be http(s)://HOST:PORT (a string of at most 4096 characters) without user info, "
                         "query or fragment (Server.local_url, e.g. http://127.0.0.1:30000)")
    return v


BaseUrl = Annotated[str, BeforeValidator(_http_base_url)]
Text = Annotated[str, Field(max_length=MAX_PATH)]
Algorithm = Literal["none", "EAGLE", "EAGLE3", "STANDALONE", "DSPARK", "NGRAM", "DFLASH", "DDTREE"]
"""As :attr:`ddtree_ops.config.models.Speculative.algorithm`."""


def _null_is_default(v: Any) -> Any:
    """``ops: null`` means every default (older hand edits; the readers always took it so)."""
    return {} if v is None else v


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PlanOps(Ops):
    """``deployment.ops``: :class:`~ddtree_ops.config.service_models.Ops` itself (same fields, bounds and
    defaults), unknown keys ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class PlanModelSpec(_Doc):
    """``deployment.model``: what warmup, the exporter and drift read.

    Attributes:
        path: Hugging Face repo id or local path (the exporter's ``model`` label without a
            served name; drift's ``model_path``).
        served_model_name: ``--served-model-name`` or None.
        context_length: tokens (1..10 Mi) or None; vision, vision_min_pixels: as
            :class:`~ddtree_ops.config.models.ModelSpec`.
    """

    path: Text
    served_model_name: ArgText | None = None
    context_length: _bounded(0, 10 * (1 << 20), gt=True) | None = None
    vision: StrictBool = False
    vision_min_pixels: _bounded(1, 1 << 26) = 3136


class PlanServer(_Doc):
    """``deployment.server``: ``port`` (:data:`~ddtree_ops.config.fields.Port`) and ``tp_size``
    (1.. :data:`~ddtree_ops.config.service_models.MAX_TP_SIZE`, the inventory's bound; drift's
    ``tp_size`` and the exporter's info label)."""

    port: Port
    tp_size: _bounded(0, MAX_TP_SIZE, gt=True)


class PlanDeployment(_Doc):
    """``deployment``: the inventory deployment without its secrets; the parts readers use.

    Attributes:
        host_classes: the deployment's own host class when the inventory defines it
            (``ddtree_host_classes``: ``{name: every field}``, resolved; absent for a built-in
            class and in every document written before the field existed; null: none). Checked
            with the inventory's rules by the preflight's reader (:func:`_preflight_fields`),
            except that a field this version does not know is ignored (a newer writer's).
    """

    host: Annotated[str, Field(min_length=1, max_length=253)]
    host_classes: Annotated[dict[str, dict[str, Any]], BeforeValidator(_null_is_default)] = Field(default_factory=dict)
    model: PlanModelSpec
    server: PlanServer
    sglang: dict[str, Any] = Field(default_factory=dict)
    ops: Annotated[PlanOps, BeforeValidator(_null_is_default)] = Field(default_factory=PlanOps)


MAX_CAPTURE_SIZES = 512
"""Most entries of ``plan.capture_bs`` (the inventory's bound); warmup holds a server's own
capture list to it too (:func:`ddtree_ops.runtime.warmup.limits_from_server_info`)."""


class PlanSizes(_Doc):
    """``plan``: :class:`ddtree_ops.config.plan.Plan` as written (tokens per request, batch sizes
    in requests), the fields readers use.

    Attributes:
        capture_bs: captured batch sizes, each 1..4096 (at most 512: the inventory's bound).
    """

    algorithm: Algorithm
    block_size: _bounded(0, 64, gt=True) | None = None
    budget: _bounded(0, 512) | None = None
    draft_tokens_per_req: _bounded(0, 1 << 20)
    verify_tokens_per_req: _bounded(0, 1 << 20, gt=True)
    max_running_requests: _bounded(0, 4096, gt=True) | None = None
    cuda_graphs: StrictBool
    cuda_graph_max_bs: BatchSize | None = None
    capture_bs: Annotated[list[BatchSize], Field(max_length=MAX_CAPTURE_SIZES)]
    attention_backend: ArgText | None = None
    page_size: _bounded(0, 1024, gt=True) | None = None
    toolchain: dict[str, Any] | None = None


class PlanPaths(_Doc):
    """``paths``: the host directories the preflight checks for disk space (absolute or null)."""

    state: Text | None = None
    cache: Text | None = None


class PlanDoc(_Doc):
    """A deployed ``plan.json`` (see the module docstring for the contract).

    Attributes:
        schema_version: :data:`SCHEMA_VERSION` when written by this ddtree-ops; 1 when absent.
        host, host_class: inventory host and its class (a name of the built-in table
            :data:`~ddtree_ops.config.hosts.HOST_CLASSES` or of ``deployment.host_classes``).
        unit, exporter_unit: systemd unit names (``exporter_unit`` None in documents before d9fe312).
        url: the server's base URL as a process on the host reaches it (derived by the writer).
        sglang_base_version: the SGLang release the build is based on (derived by the writer).
        paths: state and cache directories.
        deployment: the parts of the deployment readers use.
        plan: the derived plan.
        node_rank, nnodes: this node's rank and the node count of a multi-node server
            (``ddtree_server.multinode``; 0 and 1 on one machine and in documents written
            before the fields existed). A node of rank >= 1 serves only SGLang's health-only
            server, so health skips the checks that read ``/server_info``.
        dist_init_port: rank 0's torch.distributed store port (``--dist-init-addr``) on rank 0 of a
            multi-node server; null elsewhere (the preflight checks it is free).
        document: (property) the whole document as read, unknown keys included.
    """

    schema_version: Annotated[StrictInt, Field(ge=1)] = 1
    host: Annotated[str, Field(min_length=1, max_length=253)]
    host_class: str
    unit: Text
    exporter_unit: Text | None = None
    url: BaseUrl
    paths: PlanPaths
    deployment: PlanDeployment
    plan: PlanSizes
    sglang_base_version: Annotated[str, Field(min_length=1, max_length=64)]
    node_rank: Annotated[StrictInt, Field(ge=0, le=15)] = 0
    nnodes: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    dist_init_port: Port | None = None
    _document: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _known_class(self) -> PlanDoc:
        table = resolve_host_classes(self.deployment.host_classes, where="deployment.host_classes",
                                     ignore_unknown=True)[0]
        if self.host_class not in table:
            raise ValueError(f"host_class must be one of {', '.join(sorted(table))}")
        return self

    @property
    def document(self) -> dict[str, Any]:
        """The document as read (a copy is not made: do not change it)."""
        return self._document

    @property
    def model_name(self) -> str:
        """The model as clients name it: ``served_model_name``, else ``path``."""
        return self.deployment.model.served_model_name or self.deployment.model.path

    @classmethod
    def of(cls, document: Any, path: str | os.PathLike[str] = "<rendered>", option: str = "--plan") -> PlanDoc:
        """The typed view of a plan document already in memory (``render``'s, or one read by
        :func:`ddtree_ops._core.plandoc.read_plan_doc`).

        Raises:
            PlanDocError: a newer ``schema_version``, or a field that breaks its rule (the first
                one, with how many more).
        """
        path = str(path)
        if not isinstance(document, dict) or not isinstance(document.get("plan"), dict):
            raise PlanDocError(option, path,
                               "no 'plan' object at the top level: not a plan.json rendered by ddtree-ops")
        problem = newer_schema(document)
        if problem:
            raise PlanDocError(option, path, problem, line=f"{option} {shown(path)}: {problem}")
        _preflight_fields(document, option, path)
        data = document
        if "sglang_base_version" not in document:  # version 1 before the field: the writer's own property
            base = _base_version(document, option, path)
            data = document if base is None else {**document, "sglang_base_version": base}
        try:
            doc = cls.model_validate(data)
        except ValidationError as exc:
            errs = exc.errors(include_url=False)
            first = errs[0]
            loc = ".".join(str(p) for p in first.get("loc", ())) or "<document>"
            msg = str(first.get("msg", "")).removeprefix("Value error, ")
            if first.get("type") == "missing":
                msg = "is absent: it is required"
            more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
            raise PlanDocError(option, path, msg + more, field=loc,
                               value=first.get("input") if first.get("type") != "missing" else None) from None
        doc._document = document
        return doc


def as_plan_doc(doc: PlanDoc | dict[str, Any], option: str = "--plan") -> PlanDoc:
    """``doc`` if it is a :class:`PlanDoc`, else :meth:`PlanDoc.of` it (a document rendered in
    memory, e.g. ``plan_document(v)``). Raises PlanDocError."""
    return doc if isinstance(doc, PlanDoc) else PlanDoc.of(doc, "<rendered>", option)


def _base_version(document: dict[str, Any], option: str, path: str) -> str | None:
    """:attr:`~ddtree_ops.config.models.SGLangPin.base_version` of ``deployment.sglang`` (None:
    no such object; the model then names the missing field)."""
    dep = document.get("deployment")
    pin = dep.get("sglang", {}) if isinstance(dep, dict) else None
    if not isinstance(pin, dict):
        return None
    try:
        return SGLangPin.model_validate(pin).base_version
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(["deployment", "sglang", *(str(p) for p in first.get("loc", ()))])
        raise PlanDocError(option, path, str(first.get("msg", "")).removeprefix("Value error, "), field=loc,
                           value=first.get("input")) from None


def _preflight_fields(document: dict[str, Any], option: str, path: str) -> None:
    """The preflight's own check of the fields it reads (:func:`ddtree_ops.config.plan_fields.plan_fields`),
    so this model accepts no document the preflight refuses."""
    from .plan_fields import PlanFieldError, plan_fields

    try:
        plan_fields(document)
    except PlanFieldError as exc:
        field = exc.field or "<document>"
        cur: Any = document
        for k in exc.field.split(".") if exc.field else ():
            cur = cur.get(k, _ABSENT) if isinstance(cur, dict) else None
        absent = "is absent: " if cur is _ABSENT else ""
        raise PlanDocError(option, path, absent + (exc.rule or str(exc)), field=field, value=exc.value) from None


_ABSENT = object()


def load_plan(path: str | os.PathLike[str], option: str = "--plan") -> PlanDoc:
    """Read, check and type the plan.json at ``path``.

    Args:
        path: the file (symlinks followed; see :mod:`ddtree_ops._core.plandoc` for the byte-level rules).
        option: the option that named it, for the message.

    Returns:
        The document's typed view (:attr:`PlanDoc.document` holds it as read).

    Raises:
        PlanDocError: everything :func:`~ddtree_ops._core.plandoc.read_plan_doc` refuses, a newer
            ``schema_version``, or a field that breaks its rule.
    """
    try:
        document = read_plan_doc(path, option)
    except PlanFileError as exc:
        raise PlanDocError(option, str(path), exc.problem, line=str(exc)) from None
    return PlanDoc.of(document, path, option)
