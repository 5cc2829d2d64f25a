"""Parsers for what a GPU host says about itself (standard library only).

These run on the host inside the preflight zipapp (:mod:`.preflight`), before ddtree-ops is
installed there, so they import nothing outside the standard library. Every parser takes
the text a command printed (or a file's content) and either returns facts or raises
:class:`FactsError` with one line naming what was wrong; none of them runs anything.

Sources (outputs read off real hosts, ``tests/fixtures/gpu/``):

* ``nvidia-smi -q -x``: ``<nvidia_smi_log>`` with ``driver_version``, ``cuda_version`` and one
  ``<gpu id="BUS">`` per GPU holding ``product_name``, ``product_architecture``,
  ``persistence_mode`` (``Enabled``/``Disabled``), ``fb_memory_usage/total`` (``143771 MiB``)
  and ``pci/pci_bus_id``. Driver 580 prints no compute capability there (older drivers
  neither); it comes from ``--query-gpu=compute_cap`` (:mod:`.toolkit`).
* ``nvidia-smi topo -m``: a tab-separated matrix whose header row names ``GPU0 .. GPUn`` (the
  real output wraps the header in ANSI underline escapes ``ESC[4m .. ESC[0m``), then one row
  per GPU (and NIC) with ``X`` on the diagonal and ``NV#`` / ``PIX`` / ``PXB`` / ``PHB`` /
  ``NODE`` / ``SYS`` between devices (legend printed below the matrix).
* ``/proc/driver/nvidia/version``: ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
  580.159.04 ...`` (open GPU kernel modules) or ``NVRM version: NVIDIA UNIX x86_64 Kernel
  Module  580.159.04 ...`` (proprietary).
* PCIe extended configuration space (PCI Express Base Specification, section 7.7.11 "ACS
  Extended Capability"): extended capabilities are chained from offset 0x100, each header a
  little-endian dword (bits 0-15 id, 16-19 version, 20-31 next offset); ACS is id 0x000D,
  its control register the word at +6: bit 2 P2P Request Redirect, bit 3 P2P Completion
  Redirect. With either set on a bridge, peer-to-peer traffic below it is sent up to the
  root complex (and through the IOMMU), which NCCL's troubleshooting guide names as the cause
  of hangs and low bandwidth ("PCI Access Control Services (ACS)").
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

MAX_XML_BYTES = 16 << 20
"""Largest ``nvidia-smi -q -x`` accepted (8 GPUs print ~ 0.4 MB)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|N/A)$")
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""``topo -m`` values for a path over PCIe only, nearest first (``SOC`` is the old name of SYS)."""


class FactsError(Exception):
    """Output that is not what the named command prints. ``str()`` is one line."""


@dataclass(frozen=True)
class GpuFacts:
    """One GPU from ``nvidia-smi -q -x``.

    Attributes:
        index: position in the output (nvidia-smi's GPU index).
        name: ``product_name``, e.g. ``NVIDIA H200``.
        architecture: ``product_architecture``, e.g. ``Hopper`` (``""`` if absent).
        bus_id: ``pci_bus_id``, e.g. ``00000000:00:06.0``.
        memory_mib: ``fb_memory_usage/total`` in MiB (0 if unreadable).
        persistence: persistence mode enabled.
        compute_cap: ``major.minor`` when known (from ``--query-gpu``), else ``""``.
    """

    index: int
    name: str
    architecture: str
    bus_id: str
    memory_mib: int
    persistence: bool
    compute_cap: str = ""


@dataclass(frozen=True)
class FabricInfo:
    """One GPU's NVSwitch fabric registration: ``<gpu><fabric>`` of ``nvidia-smi -q -x`` (the
    "Fabric" section of ``nvidia-smi -q``: State, Status, CliqueId, ClusterUUID).

    nvidia-smi words NVML's ``nvmlGpuFabricInfo_t`` (NVML API reference, "Fabric definitions"):
    ``state`` ``N/A`` (not supported), ``Not Started``, ``In Progress`` or ``Completed``;
    ``status`` ``Success`` or the error, to be read only once the state is ``Completed``. Each is
    ``""`` when the element is absent (a driver older than fabric reporting).
    """

    index: int
    state: str
    status: str
    clique: str
    cluster: str


@dataclass(frozen=True)
class SmiReport:
    """``nvidia-smi -q -x`` of one host.

    Attributes:
        driver_version: e.g. ``580.159.04``.
        cuda_version: highest CUDA the driver supports, e.g. ``13.0`` (``""`` if absent).
        gpus: the GPUs in index order.
        fabric: each GPU's fabric registration, in the same order.
    """

    driver_version: str
    cuda_version: str
    gpus: list[GpuFacts] = field(default_factory=list)
    fabric: list[FabricInfo] = field(default_factory=list)


def _mib(text: str | None) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*MiB\s*", text or "")
    return int(m.group(1)) if m else 0


def parse_smi_xml(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q -x``.

    The document is parsed with :mod:`xml.etree.ElementTree` (expat: the ``<!DOCTYPE ...
    SYSTEM "nvsmi_device_v13.dtd">`` line is never fetched); a document declaring entities
    (``<!ENTITY``), which nvidia-smi never prints, is refused before parsing.

    Raises:
        FactsError: over :data:`MAX_XML_BYTES`, declares entities, not XML, or not an
            ``nvidia_smi_log`` with a dotted ``driver_version`` (2-4 parts of at most 9 digits).
    """
    if len(text) > MAX_XML_BYTES:
        raise FactsError(f"nvidia-smi -q -x printed {len(text)} bytes, more than the {MAX_XML_BYTES} accepted")
    if "<!ENTITY" in text:
        raise FactsError("nvidia-smi -q -x output declares XML entities, which nvidia-smi never prints: refused")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise FactsError(f"nvidia-smi -q -x output is not XML ({exc})") from None
    drv = (root.findtext("driver_version") or "").strip()
    if root.tag != "nvidia_smi_log" or not re.fullmatch(r"\d{1,9}(\.\d{1,9}){1,3}", drv):
        raise FactsError("not an nvidia-smi -q -x document (no <nvidia_smi_log> with a driver_version)")
    gpus, fabric = [], []
    for i, g in enumerate(root.findall("gpu")):
        gpus.append(GpuFacts(
            index=i,
            name=(g.findtext("product_name") or "").strip(),
            architecture=(g.findtext("product_architecture") or "").strip(),
            bus_id=(g.findtext("pci/pci_bus_id") or g.get("id") or "").strip(),
            memory_mib=_mib(g.findtext("fb_memory_usage/total")),
            persistence=(g.findtext("persistence_mode") or "").strip().lower() == "enabled",
        ))
        fabric.append(FabricInfo(i, *((g.findtext(f"fabric/{k}") or "").strip()[:64]
                                      for k in ("state", "status", "cliqueId", "clusterUuid"))))
    return SmiReport(drv, (root.findtext("cuda_version") or "").strip(), gpus, fabric)


@dataclass(frozen=True)
class Topology:
    """``nvidia-smi topo -m`` between GPUs.

    Attributes:
        gpus: GPU labels in order (``GPU0`` ..).
        links: ``{(i, j): value}`` for every ordered pair ``i != j`` of GPU indices, e.g. ``NV18``.
    """

    gpus: list[str]
    links: dict[tuple[int, int], str]

    def kinds(self) -> set[str]:
        """Link values with the NVLink count dropped (``NV18`` -> ``NV``)."""
        return {"NV" if v.startswith("NV") else v for v in self.links.values()}


MAX_TOPO_GPUS = 256
"""Most GPUs a ``topo -m`` matrix may name: one host shows its own GPUs (8 on the largest HGX/DGX
boards, 4 a node of GB200 NVL72); the links are every ordered pair, so this bounds them to 65280."""
MAX_TOPO_BYTES = 1 << 20
"""Largest ``topo -m`` output parsed, bytes (an 8-GPU, 8-NIC host prints ~3 KB; a 256-GPU matrix
with as many NIC columns fits as well)."""


def parse_topo(text: str) -> Topology:
    """Parse the GPU-to-GPU part of ``nvidia-smi topo -m`` (NIC rows and columns ignored), in
    time linear in the text: each header column's position is looked up once (a ``list.index``
    per cell made a crafted 3.9 MB matrix take 29 s of CPU), the GPUs are at most
    :data:`MAX_TOPO_GPUS` and the text at most :data:`MAX_TOPO_BYTES`.

    Raises:
        FactsError: the text is over :data:`MAX_TOPO_BYTES`, no header with ``GPU0``, a GPU named
            twice in it or more than :data:`MAX_TOPO_GPUS`, a GPU row missing or shorter than the
            header's GPU columns, or a cell that is not a link value of the legend.
    """
    if len(text) > MAX_TOPO_BYTES:
        raise FactsError(f"nvidia-smi topo -m printed {len(text)} characters, over {MAX_TOPO_BYTES}: not the "
                         "matrix of one host")
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    head_i = next((i for i, ln in enumerate(lines) if re.match(r"^\s*GPU0(\s|$)", ln)), None)
    if head_i is None:
        raise FactsError("nvidia-smi topo -m output has no matrix header naming GPU0")
    header = [c.strip() for c in lines[head_i].strip().split("\t")]
    gpus = [c for c in header if re.fullmatch(r"GPU\d{1,4}", c)]
    if len(gpus) > MAX_TOPO_GPUS:
        raise FactsError(f"nvidia-smi topo -m: the header names {len(gpus)} GPUs, over {MAX_TOPO_GPUS}: not the "
                         "matrix of one host")
    if len(set(gpus)) != len(gpus):
        raise FactsError(f"nvidia-smi topo -m: the header names a GPU twice ({' '.join(gpus)[:200]})")
    gpu_set = set(gpus)
    column = {c: k for k, c in enumerate(header) if c in gpu_set}  # the header's column of each GPU
    cols = [column[g] for g in gpus]
    last_col = max(cols, default=0)
    rows: dict[str, list[str]] = {}
    for ln in lines[head_i + 1:]:
        if not ln.strip() or ln.startswith("Legend"):
            break
        cells = [c.strip() for c in ln.split("\t")]
        rows[cells[0]] = cells[1:]
    links: dict[tuple[int, int], str] = {}
    for i, gi in enumerate(gpus):
        row = rows.get(gi)
        if row is None or len(row) <= last_col:
            raise FactsError(
                f"nvidia-smi topo -m: no complete row for {gi} (fewer cells than the header's GPU columns)"
            )
        for j, _gj in enumerate(gpus):
            cell = row[cols[j]]
            if not _LINK.match(cell):
                raise FactsError(f"nvidia-smi topo -m: {gi}-{_gj} is {cell[:40]!r}, not a link of the legend "
                                 "(X, NV#, PIX, PXB, PHB, NODE, SYS)")
            if i != j:
                links[(i, j)] = "SYS" if cell == "SOC" else cell
    return Topology(gpus, links)


@dataclass(frozen=True)
class KernelModule:
    """``/proc/driver/nvidia/version``.

    Attributes:
        flavor: ``open`` (NVIDIA open GPU kernel modules) or ``proprietary``.
        version: driver version, e.g. ``580.159.04``.
    """

    flavor: str
    version: str


def parse_proc_version(text: str) -> KernelModule:
    """Parse ``/proc/driver/nvidia/version`` (first line, ``NVRM version: ...``).

    Raises:
        FactsError: no ``NVRM version`` line with a driver version.
    """
    line = next((ln for ln in text.splitlines() if ln.startswith("NVRM version:")), "")
    m = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
    if not m:
        raise FactsError("/proc/driver/nvidia/version has no 'NVRM version: ... <driver version>' line")
    return KernelModule("open" if "Open Kernel Module" in line else "proprietary", m.group(1))


ACS_CAP_ID = 0x000D
ACS_REQUEST_REDIRECT = 1 << 2
ACS_COMPLETION_REDIRECT = 1 << 3


def acs_control(config: bytes) -> int | None:
    """The ACS control register of a PCIe function's configuration space, or None when it
    has no ACS capability (or only the first 256 bytes were readable: non-root readers).

    Raises:
        FactsError: an extended-capability chain that loops.
    """
    off, seen = 0x100, set()
    while 0x100 <= off <= len(config) - 8:
        if off in seen:
            raise FactsError(f"PCIe extended capability list loops at offset {off:#x}")
        seen.add(off)
        header = int.from_bytes(config[off:off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAP_ID:
            return int.from_bytes(config[off + 6:off + 8], "little")
        off = (header >> 20) & 0xFFC
    return None


def parse_bdf(bus_id: str) -> str:
    """``00000000:00:06.0`` (nvidia-smi, 8-digit domain) -> ``0000:00:06.0`` (sysfs), lower case.

    Raises:
        FactsError: not a PCI bus id.
    """
    m = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])", bus_id.strip())
    if not m:
        raise FactsError(f"{bus_id[:40]!r} is not a PCI bus id such as 00000000:00:06.0")
    return f"{m.group(1)[-4:]}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower()

