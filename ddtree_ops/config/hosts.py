"""Host classes: the GPU machines this toolkit deploys to, as a table of data.

A host class is one kind of machine: the GPU as ``nvidia-smi`` names it, how many of them,
their CUDA arch, memory per GPU, how they are connected, and the oldest CUDA toolkit whose
ptxas knows the arch. Every rule that depends on the machine reads these fields (never a
class name): the validator (:mod:`.rules`, :mod:`.build_rules`, :mod:`.checkpoint`, the
plan's toolchain), the rendered units (GPU count of the device unit, the NVLink device group
of the sandbox) and the preflight on the host (:mod:`ddtree_ops.ops.preflight`).

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
differently.

Sources of the built-in entries (each entry's comment names its own): NVIDIA's product
specifications and datasheets (memory, form factor, interconnect), the CUDA C++ Programming
Guide's compute-capability table (arch), ``nvidia-smi`` names and memory read off real
machines where we had them (``tests/fixtures/gpu/``; ``tests/fixtures/gpu/derived/`` holds
the hand-made 8-GPU variants and says so), and the measured ptxas facts of
:data:`ddtree_ops.config.toolchain.ARCHS` (``min_cuda``).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        source: where the facts come from.

    The preflight (:mod:`ddtree_ops.ops.preflight`) checks a machine against these: GPU
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
        """Every field but :attr:`name` (:data:`CLASS_FIELDS` order)."""
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
        HostClass("b300", "NVIDIA B300 SXM6", 8, "sm_103", "nvlink", 288, "12.9",
                  source="NVIDIA HGX B300 specifications; CUDA compute-capability table (10.3)"),
        # 8x H100 SXM5 80GB (HGX H100 8-GPU): 80 GB HBM3, NVLink 4 (900 GB/s per GPU) through
        # NVSwitch (NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM"); compute capability 9.0
        # (CUDA programming guide); nvidia-smi name "NVIDIA H100 80GB HBM3" (not read off a
        # machine of ours: the name other inventories of real H100 SXM hosts record).
        HostClass("h100x8", "NVIDIA H100 80GB HBM3", 8, "sm_90", "nvlink", 80, "12.0",
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
"""The built-in host classes."""

# Which attention backends each SGLang build refuses on which arch: config/build_table.py ARCH_RULES.

CLASS_FIELDS = ("gpu_name", "gpu_name_match", "gpu_count", "arch", "interconnect", "nvlink_bridge_peers",
                "gpu_memory_gib", "min_cuda", "source")
"""The fields of a class (:class:`HostClass` less its name), in the order plan.json writes them."""
