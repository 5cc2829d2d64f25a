"""Host-class profiles: the GPU boxes this toolkit deploys to.

Sources: NVIDIA's product specifications (B300 SXM6: 288 GB HBM3e, NVLink 5 with 18 links per
GPU; RTX PRO 6000 Blackwell Server Edition: 96 GB GDDR7, PCIe Gen5, no NVLink), the CUDA
programming guide's compute-capability table (Blackwell B300 10.3, RTX PRO 6000 12.0) and the
``nvidia-smi`` strings of those GPUs (``tests/fixtures/gpu/derived/README.md`` says which of our
fixtures are read off real machines and which are derived).
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

    The preflight (:mod:`ddtree_ops.ops.preflight`) checks a machine against these: GPU
    count, name prefix, compute capability (:attr:`compute_cap`), memory per GPU
    (:attr:`min_memory_mib`) and interconnect (``nvlink``: every GPU pair ``NV#`` in
    ``nvidia-smi topo -m``; ``pcie``: none is).
    """

    name: str
    gpu_name: str
    gpu_count: int
    arch: str
    interconnect: str
    gpu_memory_gib: int
    min_cuda: str

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


HOST_CLASSES: dict[str, HostClass] = {
    h.name: h
    for h in (
        HostClass("ct200", "NVIDIA RTX PRO 6000 Blackwell", 8, "sm_120", "pcie", 96, "12.8"),
        HostClass("b300", "NVIDIA B300 SXM6", 8, "sm_103", "nvlink", 288, "12.9"),
    )
}

# Which attention backends each SGLang build refuses on which arch: config/build_table.py ARCH_RULES.
