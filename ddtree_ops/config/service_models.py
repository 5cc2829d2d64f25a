"""How one deployment is served: the SGLang server's settings (:class:`Server`,
``ddtree_server``), its systemd service (:class:`Service`, ``ddtree_service``) and the ops tools
beside it (:class:`Ops`, ``ddtree_ops``). Field types: :mod:`.fields`."""

from __future__ import annotations

import ipaddress
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
)

from .._core.plandoc import MAX_INT
from .errors import (
    RULE_FIX_SEP,
    is_secret_name,
    looks_like_token,
    register_secret,
    value_secret_reason,
)
from .fields import (
    _AUTH_PREFIX,
    _ENV_KEY,
    _FLAG,
    _SAFE_NAME,
    _SCOPE_ID,
    MAX_ITEMS,
    MAX_NAME,
    MAX_PATH,
    AbsPath,
    ArgText,
    BatchSize,
    EnvText,
    HostText,
    Port,
    Seconds,
    _bounded,
    _fail,
    _Model,
    _no_bool,
    _safe_arg,
    _shown_int,
    inventory_name_problem,
    loopback_url,
)
from .hosts import MAX_GPUS

NCCL_PORT_OFFSET = 100
"""``--nccl-port`` of an instance without ``ddtree_server.nccl_port``: its SGLang port plus this
(30000 -> 30100). Consecutive instance ports (30000, 30001, ...) keep consecutive rendezvous
ports; a clash with another instance's port on the machine is refused by :mod:`~.fleet`."""


MAX_NODES = 16
"""Most nodes one ``ddtree_server.multinode`` lists (:class:`MultiNode`)."""

MAX_TP_SIZE = MAX_NODES * MAX_GPUS
"""Largest ``ddtree_server.tp_size``: the most nodes of one server, each with the most GPUs one host
class may have. Only the field's bound: the ranks must still fit the deployment's own class, per
machine (``rules.rule_tp_fits``: ``tp_size / nnodes`` on each node, all of ``tp_size`` on one machine)."""


class MultiNode(_Model):
    """One SGLang server spread over several machines of one host class
    (:mod:`~.multinode` has the rules and their sources).

    Attributes:
        nodes: the inventory hosts that run the server, in node-rank order (2-16 distinct
            names); this host's position is its ``--node-rank``. Rank 0 serves HTTP; the others
            run only their scheduler ranks and SGLang's health-only server.
        dist_init_addr: rank 0's address as the other nodes reach it (its ``ansible_host``;
            checked against it across the inventory): SGLang ``--dist-init-addr`` host part.
        dist_init_port: port of the torch.distributed TCP store rank 0 listens on (SGLang
            ``--dist-init-addr`` port part); unset: ``ddtree_server.port`` +
            :data:`~.multinode_flags.DIST_INIT_PORT_OFFSET`.
        dist_timeout_s: SGLang ``--dist-timeout`` (torch.distributed's timeout for the
            rendezvous and the collectives); unset: ``ddtree_service.start_timeout_s``, so a node
            started anywhere inside the start window still joins.
    """

    nodes: list[Annotated[str, Field(max_length=MAX_NAME)]]
    dist_init_addr: HostText
    dist_init_port: Port | None = None
    dist_timeout_s: _bounded(0, 86400, gt=True) | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[str]) -> list[str]:
        if not 2 <= len(v) <= MAX_NODES:  # ahead of the names: one line naming the count and the limit
            raise _fail(f"lists {len(v)} node(s); one server spans at least 2 and at most {MAX_NODES}",
                        f"list 2 to {MAX_NODES} nodes (rank 0 first); on one machine remove ddtree_server.multinode")
        for name in v:
            problem = inventory_name_problem(name)
            if problem:
                raise _fail(f"{name[:80]!r}: {problem}", "list the inventory host names of the nodes, rank 0 first")
        if len(set(v)) != len(v):
            raise _fail("lists a host twice (each node is one machine with one rank)", "list each node once")
        return v


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
        multinode: the server spans several machines (:class:`MultiNode`); ``tp_size`` is then
            the total over all nodes (tp_size / nnodes GPUs on each).
    """

    host: Annotated[str, Field(max_length=64)] = "0.0.0.0"
    port: Port = 30000
    tp_size: _bounded(0, MAX_TP_SIZE, gt=True) = 8
    dp_size: _bounded(0, MAX_GPUS, gt=True) = 1
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
    base_gpu_id: _bounded(0, MAX_GPUS - 1) | None = None
    multinode: MultiNode | None = None

    @property
    def nnodes(self) -> int:
        """Machines the server spans (SGLang ``--nnodes``): 1 unless :attr:`multinode` is set."""
        return len(self.multinode.nodes) if self.multinode else 1

    @property
    def dist_init_port(self) -> int | None:
        """Rank 0's torch.distributed store port of a multi-node server; None on one machine."""
        from .multinode_flags import DIST_INIT_PORT_OFFSET

        if self.multinode is None:
            return None
        if self.multinode.dist_init_port is not None:
            return self.multinode.dist_init_port
        up = self.port + DIST_INIT_PORT_OFFSET
        return up if up <= 65535 else self.port - DIST_INIT_PORT_OFFSET

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: dict[str, Any]) -> dict[str, Any]:
        from .multinode_flags import FIX, describe, multinode_flag

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


SWITCH_VALUES = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off"})
"""Environment values that set a switch (case-insensitive): no credential, under any name."""


def _is_switch(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() in SWITCH_VALUES


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
            # a switch is no secret whatever its name: huggingface_hub's HF_HUB_DISABLE_IMPLICIT_TOKEN=1
            # (huggingface_hub/constants.py) turns the implicit token off
            if is_secret_name(key) and not _is_switch(v[key]):
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


