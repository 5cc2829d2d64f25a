"""Host classes: the GPU machines this toolkit deploys to, as a table of data.

A host class is one kind of machine: the GPU as ``nvidia-smi`` names it, how many of them,
their CUDA arch, memory per GPU, how they are connected, and the oldest CUDA toolkit whose
ptxas knows the arch. Every rule that depends on the machine reads these fields (never a
class name): the validator (:mod:`.rules`, :mod:`.build_rules`, :mod:`.checkpoint`, the
plan's toolchain), the rendered units (GPU count of the device unit, the NVLink device group
of the sandbox) and the preflight on the host (:mod:`ddtree_ops.host.preflight`).

**The GPU count is part of the class.** An ``h200x1`` (one H200, e.g. a cloud slice of an HGX
board) and an ``h200x8`` (the whole board) are two classes, named ``<gpu><variant>x<count>``.
The count decides what a deployment may ask for (``tp_size`` x ``dp_size`` must fit it,
``CUDA_VISIBLE_DEVICES`` may name only its GPUs), what is rendered (one ``nvidia-modprobe -c=N``
per GPU) and what the preflight demands (exactly that many GPUs, an NVLink pair between every
two), so it belongs with the other facts of the machine: a class is then a complete
description, its name says it (the ``host_class`` label of every metric, the Ansible group),
two hosts of one group cannot silently differ, and the preflight can tell an 8-GPU server
that lost a GPU from a 1-GPU machine. A count set per host instead would be a second source
for a fact of the class and would make ``-l h200`` target machines the rules treat
differently. Another count of a known machine is one line of data: ``like: h200x8`` plus
``gpu_count: 4`` (see below).

**Operators add classes without editing Python**: the inventory variable
``ddtree_host_classes`` (group_vars), ``{name: {field: value}}``, is merged over the built-in
table (:func:`resolve_host_classes`). An entry named like a built-in class is merged field by
field over it; a new name gives every required field (:data:`REQUIRED_FIELDS`) or ``like:`` an
existing class and the fields that differ. The deployment's plan.json carries the resolved
entry of its own class (``deployment.host_classes``, written only for a class the inventory
defines), which is how it reaches the preflight on the host. Every field is checked here, with
the standard library only (this module is part of the preflight zipapp): the inventory's
pydantic model (:class:`ddtree_ops.config.models.HostClassSpec`) and the preflight's plan
reader apply the same :func:`field_problem`.

Sources of the built-in entries (each entry's comment names its own): NVIDIA's product
specifications and datasheets (memory, form factor, interconnect), the CUDA C++ Programming
Guide's compute-capability table (arch), ``nvidia-smi`` names and memory read off real
machines where we had them (``tests/fixtures/gpu/``; ``tests/fixtures/gpu/derived/`` holds
the hand-made 8-GPU variants and says so), and the measured ptxas facts of
:data:`ddtree_ops.config.toolchain.ARCHS` (``min_cuda``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .toolchain import ARCHS, CUDA_TOOLKITS, at_least, version_key

INTERCONNECTS = ("nvlink", "pcie")
"""``nvlink``: every GPU pair is joined by NVLink (NVSwitch or a full mesh; ``NV#`` in
``nvidia-smi topo -m``); ``pcie``: GPU peer traffic goes over PCIe, except between GPUs joined
by an NVLink bridge (:attr:`HostClass.nvlink_bridge_peers`)."""

NAME_MATCHES = ("prefix", "exact")
"""How :attr:`HostClass.gpu_name` is compared with the name ``nvidia-smi`` prints."""


@dataclass(frozen=True)
class HostClass:
    """One class of GPU host.

    Attributes:
        name: inventory name (``ddtree_host_class``; also the Ansible group of its hosts).
        gpu_name: the GPU's name as ``nvidia-smi`` prints it (``product_name``).
        gpu_count: GPUs per host.
        arch: CUDA arch, e.g. ``sm_103`` (a row of :data:`~ddtree_ops.config.toolchain.ARCHS`).
        interconnect: ``nvlink`` or ``pcie`` (:data:`INTERCONNECTS`).
        gpu_memory_gib: memory per GPU as NVIDIA markets it (141 for an H200's "141 GB").
        min_cuda: oldest CUDA toolkit whose ptxas knows ``{arch}a`` (at least the arch's
            :attr:`~ddtree_ops.config.toolchain.ArchToolchain.min_cuda`); the toolkit the
            host gets by default is never older, and a pinned one must not be.
        gpu_name_match: ``prefix`` (a name starting with :attr:`gpu_name` matches: ``NVIDIA B300
            SXM6`` matches ``NVIDIA B300 SXM6 AC``) or ``exact`` (``NVIDIA H200`` must not match
            ``NVIDIA H200 NVL``, another machine).
        nvlink_bridge_peers: ``pcie`` classes only: how many other GPUs one GPU may be joined to
            by NVLink bridges (0: none; 1: 2-way bridges; 3: 4-way). Bridges are optional: the
            preflight accepts pairs with or without one, up to this many per GPU.
        fabric_registration: ``nvlink`` classes whose GPUs join an NVSwitch fabric that
            nvidia-fabricmanager programs (HGX boards): CUDA refuses to start (error 802,
            ``cudaErrorSystemNotReady``) until every GPU's fabric registration is ``Completed``
            with status ``Success`` (``nvidia-smi -q`` "Fabric"; NVML ``nvmlGpuFabricInfo_t``), so
            the preflight requires that and reads the fabric manager's unit. On NVLink5 the
            driver can look ready while registration stays ``In Progress`` (NVIDIA/gpu-operator#2781).
        source: where the facts come from.

    The preflight (:mod:`ddtree_ops.host.preflight`) checks a machine against these: GPU
    count, name (:meth:`matches_name`), compute capability (:attr:`compute_cap`), memory per
    GPU (:attr:`min_memory_mib`) and interconnect (``nvlink``: every GPU pair ``NV#`` in
    ``nvidia-smi topo -m``; ``pcie``: no GPU ``NV#`` to more than :attr:`nvlink_bridge_peers`
    others).
    """

    name: str
    gpu_name: str
    gpu_count: int
    arch: str
    interconnect: str
    gpu_memory_gib: int
    min_cuda: str
    gpu_name_match: str = "prefix"
    nvlink_bridge_peers: int = 0
    source: str = ""
    fabric_registration: bool = False

    @property
    def compute_cap(self) -> str:
        """``sm_103`` -> ``10.3`` (``nvidia-smi --query-gpu=compute_cap``)."""
        digits = self.arch.split("_", 1)[1]
        return f"{int(digits[:-1])}.{digits[-1]}"

    @property
    def min_memory_mib(self) -> int:
        """Least ``fb_memory_usage/total`` (MiB) a GPU of this class reports: 90 % of the
        marketed size read as decimal GB. nvidia-smi reports the memory less what the driver
        reserves (real H200, 141 GB marketed: 143771 MiB; the 90 % leaves room for such
        reserves while no smaller GPU of another class passes)."""
        return int(self.gpu_memory_gib * 1e9 * 0.9) >> 20

    def matches_name(self, name: str) -> bool:
        """Whether a GPU ``nvidia-smi`` names ``name`` is this class's GPU (:attr:`gpu_name_match`)."""
        return name == self.gpu_name if self.gpu_name_match == "exact" else name.startswith(self.gpu_name)

    def as_dict(self) -> dict:
        """Every field but :attr:`name`, as an entry of ``ddtree_host_classes`` /
        ``deployment.host_classes`` in plan.json (:data:`CLASS_FIELDS` order)."""
        return {f: getattr(self, f) for f in CLASS_FIELDS}


HOST_CLASSES: dict[str, HostClass] = {
    h.name: h
    for h in (
        # 8x RTX PRO 6000 Blackwell Server Edition: 96 GB GDDR7, PCIe Gen5, no NVLink (NVIDIA RTX PRO
        # 6000 Blackwell Server Edition product specifications); compute capability 12.0 (CUDA
        # programming guide); nvidia-smi name "NVIDIA RTX PRO 6000 Blackwell Server Edition".
        HostClass("ct200", "NVIDIA RTX PRO 6000 Blackwell", 8, "sm_120", "pcie", 96, "12.8",
                  source="NVIDIA RTX PRO 6000 Blackwell Server Edition product specifications; CUDA "
                         "compute-capability table (12.0)"),
        # 8x B300 SXM6 (HGX B300): 288 GB HBM3e, NVLink 5 with 18 links per GPU through NVSwitch
        # (NVIDIA HGX B300 specifications); compute capability 10.3 (CUDA programming guide);
        # nvidia-smi name "NVIDIA B300 SXM6 AC".
        HostClass("b300", "NVIDIA B300 SXM6", 8, "sm_103", "nvlink", 288, "12.9", fabric_registration=True,
                  source="NVIDIA HGX B300 specifications; CUDA compute-capability table (10.3)"),
        # 8x H100 SXM5 80GB (HGX H100 8-GPU): 80 GB HBM3, NVLink 4 (900 GB/s per GPU) through
        # NVSwitch (NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM"); compute capability 9.0
        # (CUDA programming guide); nvidia-smi name "NVIDIA H100 80GB HBM3" (not read off a
        # machine of ours: the name other inventories of real H100 SXM hosts record).
        HostClass("h100x8", "NVIDIA H100 80GB HBM3", 8, "sm_90", "nvlink", 80, "12.0", fabric_registration=True,
                  source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM); CUDA compute-capability table (9.0)"),
        # 8x H100 PCIe 80GB: 80 GB HBM2e, PCIe Gen5; an optional NVLink bridge joins two cards
        # (NVIDIA H100 PCIe product brief: "NVLink bridge, 2-way"), so a GPU has at most one
        # NVLink peer and every other pair is PCIe; compute capability 9.0; nvidia-smi name
        # "NVIDIA H100 PCIe" (not read off a machine of ours). The H100 NVL (94 GB, "NVIDIA
        # H100 NVL") is another product and does not match.
        HostClass("h100pciex8", "NVIDIA H100 PCIe", 8, "sm_90", "pcie", 80, "12.0", nvlink_bridge_peers=1,
                  source="NVIDIA H100 PCIe product brief (80 GB, 2-way NVLink bridge optional); CUDA "
                         "compute-capability table (9.0)"),
        # H200 SXM5: 141 GB HBM3e, NVLink 4 (900 GB/s per GPU), 700 W (NVIDIA H200 Tensor Core GPU
        # datasheet, "H200 SXM"); compute capability 9.0. Read off the real machines we were
        # lent: nvidia-smi prints "NVIDIA H200" (exactly: "NVIDIA H200 NVL" is the PCIe card)
        # and 143771 MiB, power limit 700 W (tests/fixtures/gpu/h200x1_*); two of them are
        # NV18 to each other (tests/fixtures/gpu/h200x2_*). h200x8 is the HGX H200 8-GPU board.
        HostClass("h200x1", "NVIDIA H200", 1, "sm_90", "nvlink", 141, "12.0", gpu_name_match="exact",
                  source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM); nvidia-smi of a real 1x H200 "
                         "(tests/fixtures/gpu/h200x1_nvidia_smi_q.xml); CUDA compute-capability table (9.0)"),
        HostClass("h200x2", "NVIDIA H200", 2, "sm_90", "nvlink", 141, "12.0", gpu_name_match="exact",
                  source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM); nvidia-smi and topo -m of a real "
                         "2x H200 (tests/fixtures/gpu/h200x2_*, NV18); CUDA compute-capability table (9.0)"),
        HostClass("h200x8", "NVIDIA H200", 8, "sm_90", "nvlink", 141, "12.0", gpu_name_match="exact",
                  fabric_registration=True,
                  source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM, HGX H200 8-GPU); nvidia-smi name "
                         "and memory as on the real H200s (tests/fixtures/gpu/h200x1_*); CUDA "
                         "compute-capability table (9.0)"),
        # 8x H200 NVL: the PCIe card, 141 GB HBM3e, "2- or 4-way NVIDIA NVLink bridge" (NVIDIA H200
        # Tensor Core GPU datasheet, "H200 NVL"): up to three NVLink peers per GPU, PCIe between
        # the bridged groups; compute capability 9.0; nvidia-smi name "NVIDIA H200 NVL" (not
        # read off a machine of ours).
        HostClass("h200nvlx8", "NVIDIA H200 NVL", 8, "sm_90", "pcie", 141, "12.0", nvlink_bridge_peers=3,
                  source="NVIDIA H200 Tensor Core GPU datasheet (H200 NVL: PCIe, 2- or 4-way NVLink bridge); "
                         "CUDA compute-capability table (9.0)"),
    )
}
"""The built-in host classes. ``ddtree_host_classes`` in the inventory adds to and overrides
them (:func:`resolve_host_classes`)."""

# Which attention backends each SGLang build refuses on which arch: config/build_table.py ARCH_RULES.

CLASS_FIELDS = ("gpu_name", "gpu_name_match", "gpu_count", "arch", "interconnect", "nvlink_bridge_peers",
                "gpu_memory_gib", "min_cuda", "source", "fabric_registration")
"""The fields of a class (:class:`HostClass` less its name), in the order plan.json writes them."""
ENTRY_FIELDS = ("like", *CLASS_FIELDS)
"""What one ``ddtree_host_classes`` entry may set."""
REQUIRED_FIELDS = ("gpu_name", "gpu_count", "arch", "interconnect", "gpu_memory_gib")
"""What a new class (neither ``like`` nor a built-in of its name to start from) must give; the
others default: ``gpu_name_match`` prefix, ``nvlink_bridge_peers`` 0, ``fabric_registration``
false, ``min_cuda`` the arch's
(:data:`~ddtree_ops.config.toolchain.ARCHS`), ``source`` empty."""

MAX_CLASSES = 64
"""Most entries ``ddtree_host_classes`` may hold."""
MAX_GPUS = 64
"""Most GPUs one class may have (one machine's ``dp_size`` and ``base_gpu_id`` are bounded by it, and
``tp_size`` by it times the most nodes of one server: :data:`~.service_models.MAX_TP_SIZE`)."""

CLASS_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
"""A class name: lower-case letters, digits and ``_`` (it is also an Ansible group name, which
takes letters, digits and underscores, and a Prometheus label value)."""
RESERVED_NAMES = frozenset({"all", "ungrouped", "sglang_servers", "monitoring"})
"""Group names the inventory already gives a meaning (Ansible's own two, the server group, the
Prometheus group): a class of that name would make every host of the group one of its class."""
GPU_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9 ._()/+-]{0,126}[A-Za-z0-9)])?")
"""A GPU name as nvidia-smi prints it (``NVIDIA A100-SXM4-80GB``, ``NVIDIA H200 NVL``): letters,
digits, space and ``. _ ( ) / + -``, no leading or trailing space; it lands in a unit file comment."""
_CUDA = re.compile(r"\d{1,2}\.\d{1,2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_SOURCE = 1024
"""Longest ``source`` text."""

_SEE = "see docs/configuration.md, 'Host classes'"


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def name_problem(name: object) -> tuple[str, str] | None:
    """Why ``name`` cannot name a host class: ``(rule, fix)``, or None."""
    if not isinstance(name, str) or not CLASS_NAME.fullmatch(name):
        return ("must be a class name: a lower-case letter, then up to 31 lower-case letters, digits or _ "
                "(it is also an Ansible group name)", "rename it, e.g. h200x4 (<gpu><variant>x<count>)")
    if name in RESERVED_NAMES:
        return (f"is a group name the inventory already uses ({', '.join(sorted(RESERVED_NAMES))})",
                "give the class another name, e.g. h200x4")
    return None


_CHOICES = {
    "gpu_name_match": (lambda v: v in NAME_MATCHES, "must be prefix or exact",
                       "prefix: names that start with gpu_name match; exact: only gpu_name itself"),
    "interconnect": (lambda v: v in INTERCONNECTS, "must be nvlink or pcie",
                     "nvlink: every GPU pair NV# in `nvidia-smi topo -m`; pcie: PCIe, optionally with NVLink "
                     "bridges (nvlink_bridge_peers)"),
    "fabric_registration": (lambda v: isinstance(v, bool), "must be true or false",
                            "true for NVSwitch boards whose GPUs nvidia-fabricmanager registers (HGX: `nvidia-smi -q` "
                            "shows Fabric State Completed); false for PCIe cards and hosts without NVSwitch"),
}
"""Fields that take one of a few values: ``(accepts, rule, fix)``."""


def field_problem(field: str, value: object) -> tuple[str, str] | None:
    """Why ``value`` is no valid ``field`` of a ``ddtree_host_classes`` entry, on its own:
    ``(rule, fix)``, or None. ``None`` values are "not given" and are not passed here. The
    rules that join fields (``like`` names a class, ``min_cuda`` against the arch,
    ``nvlink_bridge_peers`` against the count and interconnect) are :func:`resolve_host_classes`'s."""
    if field in _CHOICES:
        ok, rule, fix = _CHOICES[field]
        return None if ok(value) else (rule, fix)
    if field == "like":
        return name_problem(value) and ("must be the name of another host class (built-in or in "
                                        "ddtree_host_classes)", f"name one of them, e.g. like: h200x8 ({_SEE})")
    if field == "gpu_name":
        if isinstance(value, str) and GPU_NAME.fullmatch(value):
            return None
        return ("must be the GPU's name as nvidia-smi prints it (1-128 characters: letters, digits, space and "
                ". _ ( ) / + -)", "copy it from `nvidia-smi --query-gpu=name --format=csv,noheader` on the machine")
    if field == "gpu_count":
        return None if _int(value) and 1 <= value <= MAX_GPUS else (
            f"must be an integer 1..{MAX_GPUS} (GPUs per machine)",
            "give the count `nvidia-smi -L` lists on one machine of the class")
    if field == "arch":
        if isinstance(value, str) and value in ARCHS:
            return None
        return (f"must be a CUDA arch whose ptxas facts are measured ({', '.join(ARCHS)})",
                "use the machine's arch (`nvidia-smi --query-gpu=compute_cap`: 9.0 is sm_90); a new arch needs its "
                "row in ddtree_ops/config/toolchain.py ARCHS (target, oldest CUDA, PTX version, measured with ptxas)")
    if field == "nvlink_bridge_peers":
        return None if _int(value) and 0 <= value < MAX_GPUS else (
            f"must be an integer 0..{MAX_GPUS - 1} (GPUs one GPU may be bridged to)",
            "0: no NVLink bridges; 1: 2-way bridges; 3: 4-way bridges")
    if field == "gpu_memory_gib":
        return None if _int(value) and 1 <= value <= 4096 else (
            "must be an integer 1..4096 (GB per GPU, as NVIDIA markets it: 141 for an H200)",
            "give the marketed memory per GPU")
    if field == "min_cuda":
        if isinstance(value, str) and _CUDA.fullmatch(value):
            return None
        return ("must be a CUDA toolkit version major.minor as a string, e.g. \"12.9\"",
                "quote it in YAML (min_cuda: \"12.9\"), or leave it out for the arch's own minimum")
    if field == "source":
        if isinstance(value, str) and len(value) <= MAX_SOURCE and not _CONTROL.search(value):
            return None
        return (f"must be text of at most {MAX_SOURCE} characters without control characters",
                "name where the facts come from (datasheet, the machine's nvidia-smi) in one line")
    return ("is not a field of a host class", f"use {', '.join(ENTRY_FIELDS)}")


class HostClassError(ValueError):
    """One problem of a host-class entry: the field path, the value, the rule and the fix."""

    def __init__(self, field: str, value: object, rule: str, fix: str) -> None:
        super().__init__(f"{field} = {value!r}: {rule}. Fix: {fix}")
        self.field, self.value, self.rule, self.fix = field, value, rule, fix


def entry_problems(name: object, entry: object, where: str, ignore_unknown: bool = False) -> list[HostClassError]:
    """The problems of one entry on its own: its name, its type, unknown (unless
    ``ignore_unknown``) and bad fields."""
    path = f"{where}.{name}" if isinstance(name, str) and len(name) <= 64 else f"{where}.<name>"
    problem = name_problem(name)
    if problem:
        return [HostClassError(path, name, *problem)]
    if not isinstance(entry, Mapping):
        return [HostClassError(path, entry, "must be an object {field: value}",
                               f"give the class's fields, e.g. {{like: h200x8, gpu_count: 4}} ({_SEE})")]
    out = []
    for field, value in entry.items():
        if value is None or (ignore_unknown and field not in ENTRY_FIELDS):
            continue
        problem = field_problem(field, value) if isinstance(field, str) else ("is not a field of a host class",
                                                                                f"use {', '.join(ENTRY_FIELDS)}")
        if problem:
            out.append(HostClassError(f"{path}.{field}" if field in ENTRY_FIELDS else f"{path}.{str(field)[:64]}",
                                      value, *problem))
    return out


def resolve_host_classes(entries: object, builtin: Mapping[str, HostClass] | None = None,
                         where: str = "ddtree_host_classes",
                         ignore_unknown: bool = False) -> tuple[dict[str, HostClass], list[HostClassError]]:
    """The built-in table with ``entries`` (``{name: {field: value}}``, as ``ddtree_host_classes``
    or plan.json's ``deployment.host_classes`` hold them) merged over it.

    An entry starts from ``like`` (another class, built-in or in ``entries``), else from the
    built-in class of its own name if there is one, else from nothing; the fields it gives
    replace the start's (``None``: not given). It is then complete and consistent, or refused:
    every required field (:data:`REQUIRED_FIELDS`) set, ``min_cuda`` (default: the arch's) no
    older than the arch's and no newer than the newest installable toolkit
    (:data:`~ddtree_ops.config.toolchain.CUDA_TOOLKITS`), ``nvlink_bridge_peers`` 0 on an
    ``nvlink`` class and below the GPU count. ``ignore_unknown``: fields this version does not
    know are skipped instead of refused (plan.json's readers: a newer writer may add a field
    within one ``schema_version``; the inventory refuses them, a typo must not pass).

    Returns:
        ``(table, problems)``: every class that resolved (the built-ins always), and one
        :class:`HostClassError` per refused entry (the first problem of each; field paths below
        ``where``). Never raises.
    """
    builtin = HOST_CLASSES if builtin is None else builtin
    table: dict[str, HostClass] = dict(builtin)
    if entries is None:
        return table, []
    if not isinstance(entries, Mapping):
        return table, [HostClassError(where, entries, "must be an object {class name: {field: value}}",
                                      f"e.g. ddtree_host_classes: {{h200x4: {{like: h200x8, gpu_count: 4}}}} ({_SEE})")]
    if len(entries) > MAX_CLASSES:
        return table, [HostClassError(where, f"{len(entries)} entries", f"must hold at most {MAX_CLASSES} classes",
                                      "keep the classes this inventory deploys to")]
    r = _Resolver(builtin, where)
    for name, entry in entries.items():
        bad = entry_problems(name, entry, where, ignore_unknown)
        if bad:
            r.problems.append(bad[0])
        else:
            r.good[name] = {k: v for k, v in entry.items() if k in ENTRY_FIELDS}
    for name in r.good:
        hc = r.resolve(name, ())
        if hc is not None:
            table[name] = hc
    return table, r.problems


class _Resolver:
    """One run of :func:`resolve_host_classes` over entries already checked on their own."""

    def __init__(self, builtin: Mapping[str, HostClass], where: str) -> None:
        self.builtin, self.where = builtin, where
        self.good: dict[str, dict] = {}
        self.done: dict[str, HostClass | None] = {}
        self.problems: list[HostClassError] = []

    def refuse(self, name: str, field: str, value: object, rule: str, fix: str) -> None:
        self.done[name] = None
        self.problems.append(HostClassError(f"{self.where}.{name}.{field}", value, rule, fix))
        return None

    def start(self, name: str, chain: tuple[str, ...]) -> tuple[bool, HostClass | None]:
        """``(ok, the class the entry starts from or None)``; not ok: refused (said so)."""
        like = self.good[name].get("like")
        if like is None:
            return True, self.builtin.get(name)
        if like in self.good and like != name:
            if like in chain:
                return False, self.refuse(name, "like", like, f"makes a loop ({' -> '.join((*chain, name, like))})",
                                          "let one of them start from a built-in class or give all its fields")
            base = self.resolve(like, (*chain, name))
            if base is None:
                return False, self.refuse(name, "like", like, f"names {like}, which is refused itself (its own line "
                                          "says why)", f"fix {self.where}.{like} first")
            return True, base
        if like in self.builtin:
            return True, self.builtin[like]
        return False, self.refuse(name, "like", like, "names no host class",
                                  f"use one of {', '.join(sorted(set(self.builtin) | set(self.good) - {name}))}")

    def resolve(self, name: str, chain: tuple[str, ...]) -> HostClass | None:
        if name in self.done:
            return self.done[name]
        ok, base = self.start(name, chain)
        if not ok:
            return None
        given = {k: v for k, v in self.good[name].items() if k != "like" and v is not None}
        fields = base.as_dict() if base is not None else {}
        if base is not None:
            if given.get("arch", base.arch) != base.arch and "min_cuda" not in given:
                del fields["min_cuda"]  # the start's minimum is another arch's: the new arch's own applies
            how = "over the built-in" if base.name == name else "like"
            fields["source"] = f"ddtree_host_classes: {name} {how} {base.name} ({base.source})"[:MAX_SOURCE]
        fields.update(given)
        missing = [f for f in REQUIRED_FIELDS if f not in fields]
        if missing:
            return self.refuse(name, missing[0], None, f"is required for a new class (missing: {', '.join(missing)})",
                               f"give {', '.join(missing)}, or start from a class that has them: like: h200x8 ({_SEE})")
        fields.setdefault("min_cuda", ARCHS[fields["arch"]].min_cuda)
        fields.setdefault("gpu_name_match", "prefix")
        fields.setdefault("nvlink_bridge_peers", 0)
        fields.setdefault("source", "")
        fields.setdefault("fabric_registration", False)
        problem = _consistency(fields)
        if problem is not None:
            return self.refuse(name, *problem)
        self.done[name] = HostClass(name=name, **{f: fields[f] for f in CLASS_FIELDS})
        return self.done[name]


def _consistency(f: dict) -> tuple[str, object, str, str] | None:
    """The rules between the fields of a complete entry (:func:`resolve_host_classes`):
    ``(field, value, rule, fix)`` of the first one broken, or None."""
    arch_min = ARCHS[f["arch"]].min_cuda
    if not at_least(f["min_cuda"], arch_min):
        return ("min_cuda", f["min_cuda"], f"is older than the oldest CUDA whose ptxas knows {ARCHS[f['arch']].target} "
                f"({arch_min}, measured: ddtree_ops/config/toolchain.py ARCHS)", f"raise it to {arch_min} or newer, or "
                "leave it out")
    newest = max(CUDA_TOOLKITS, key=version_key)
    if not at_least(newest, f["min_cuda"]):
        return ("min_cuda", f["min_cuda"], "is newer than every toolkit the cuda_toolkit role installs "
                f"({', '.join(CUDA_TOOLKITS)})", f"use {newest} or older, or add the toolkit to "
                "ddtree_ops/config/toolchain.py CUDA_TOOLKITS")
    if f["interconnect"] == "nvlink" and f["nvlink_bridge_peers"]:
        return ("nvlink_bridge_peers", f["nvlink_bridge_peers"], "must be 0 on an nvlink class (every pair is "
                "already NVLink)", "remove it, or make the class interconnect: pcie")
    if f["fabric_registration"] and f["interconnect"] != "nvlink":
        return ("fabric_registration", True, "needs interconnect: nvlink (a fabric manager registers GPUs of an "
                "NVSwitch board only)", "remove it, or make the class interconnect: nvlink")
    if f["nvlink_bridge_peers"] and f["nvlink_bridge_peers"] >= f["gpu_count"]:
        return ("nvlink_bridge_peers", f["nvlink_bridge_peers"], f"must be below gpu_count ({f['gpu_count']}): a GPU "
                "has at most gpu_count - 1 peers", "give the bridge width less one (2-way: 1, 4-way: 3)")
    return None


def class_names(entries: object) -> set[str]:
    """The class names the built-in table and ``entries`` (raw ``ddtree_host_classes``) give,
    valid or not yet checked (the loader's host-class group check runs before validation)."""
    names = set(HOST_CLASSES)
    if isinstance(entries, Mapping):
        names |= {n for n in entries if isinstance(n, str)}
    return names
