"""Host-class profiles: the GPU boxes this toolkit deploys to.

Source: NVIDIA's product specifications (B300 SXM6, RTX PRO 6000 Blackwell Server Edition).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostClass:
    """One class of 8-GPU host.

    Attributes:
        name: inventory name (``ddtree_host_class``).
        gpu_name: marketing name as ``nvidia-smi`` prints it (prefix match).
        gpu_count: GPUs per host.
        arch: CUDA arch, e.g. ``sm_103``.
        interconnect: ``nvlink`` or ``pcie``.
        gpu_memory_gib: memory per GPU, GiB.
        min_cuda: oldest CUDA toolkit whose ptxas knows ``{arch}a``.
    """

    name: str
    gpu_name: str
    gpu_count: int
    arch: str
    interconnect: str
    gpu_memory_gib: int
    min_cuda: str


HOST_CLASSES: dict[str, HostClass] = {
    h.name: h
    for h in (
        HostClass("ct200", "NVIDIA RTX PRO 6000 Blackwell", 8, "sm_120", "pcie", 96, "12.8"),
        HostClass("b300", "NVIDIA B300 SXM6", 8, "sm_103", "nvlink", 288, "12.9"),
    )
}

# Which attention backends each SGLang build refuses on which arch: config/build_table.py ARCH_RULES.
