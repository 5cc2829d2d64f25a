#!/usr/bin/env python3
"""Write the DERIVED 8-GPU fixtures (tests/fixtures/gpu/derived/) from the real H200 ones.

No B300 or RTX PRO 6000 machine was at hand, so the preflight parsers are also tested on
hand-made variants of real outputs: the first <gpu> of the real 2x H200 `nvidia-smi -q -x` is
copied 8 times with the fields of the target GPU changed (name, architecture, memory, PCI bus
and device id, UUID, module id), and the real `nvidia-smi topo -m` layout is extended to 8 GPUs
(NV18 for B300's NVSwitch fabric; PIX/NODE/SYS for a 2-socket PCIe server). The README in that
directory lists what changed; SHA256SUMS records the result.

    python3 scripts/derive-gpu-fixtures.py     # rewrites the derived files (deterministic)
"""

from __future__ import annotations

import re
from pathlib import Path

GPU = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpu"
OUT = GPU / "derived"

VARIANTS = {
    # name, product_architecture, fb total MiB, PCI device id, compute capability
    "b300x8": ("NVIDIA B300 SXM6 AC", "Blackwell", 275040, "318210DE", "10.3"),
    "rtxpro6000x8": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "Blackwell", 97887, "2BB510DE", "12.0"),
}
BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
"""PCI buses of the 8 GPUs (4 below each CPU socket: buses < 0x80 on socket 0)."""


def derive_xml(real: str, name: str, arch: str, mib: int, devid: str) -> str:
    head, rest = real.split("\t<gpu id=", 1)
    gpu = "\t<gpu id=" + rest.split("\t</gpu>\n", 1)[0] + "\t</gpu>\n"
    tail = "\n</nvidia_smi_log>\n"
    gpus = []
    for i, bus in enumerate(BUSES):
        g = gpu.replace("00000000:00:06.0", f"00000000:{bus}:00.0")
        g = re.sub(r"<product_name>[^<]*<", f"<product_name>{name}<", g)
        g = re.sub(r"<product_architecture>[^<]*<", f"<product_architecture>{arch}<", g)
        g = re.sub(r"(<fb_memory_usage>\s*<total>)\d+ MiB", rf"\g<1>{mib} MiB", g)
        g = re.sub(r"(<fb_memory_usage>(?:(?!</fb_memory_usage>).)*?<free>)\d+ MiB", rf"\g<1>{mib - 616} MiB", g,
                   flags=re.S)
        g = re.sub(r"<pci_bus>[^<]*<", f"<pci_bus>{bus}<", g)
        g = re.sub(r"<pci_device>[^<]*<", "<pci_device>00<", g)
        g = re.sub(r"<pci_device_id>[^<]*<", f"<pci_device_id>{devid}<", g)
        g = re.sub(r"<uuid>GPU-[0-9a-f-]+<", f"<uuid>GPU-00000000-0000-4000-8000-0000000001{i:02d}<", g)
        g = re.sub(r"<minor_number>\d+<", f"<minor_number>{i}<", g)
        g = re.sub(r"<module_id>\d+<", f"<module_id>{i + 1}<", g)
        gpus.append(g)
    head = head.replace("<attached_gpus>2</attached_gpus>", "<attached_gpus>8</attached_gpus>")
    return head + "".join(gpus) + tail.lstrip("\n")


def derive_topo(real_misc: str, link) -> str:
    """8-GPU `topo -m` in the real output's layout (ANSI-underlined header, tab-separated)."""
    legend = real_misc[real_misc.index("Legend:"):real_misc.index("---")].rstrip("\n") + "\n"
    cols = "".join(f"GPU{i}\t" for i in range(8))
    lines = [f"\t\x1b[4m{cols}CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"]
    for i in range(8):
        cells = "\t".join(" X " if i == j else link(i, j) for j in range(8))
        numa = i // 4
        lines.append(f"GPU{i}\t{cells}\t{'0-55' if numa == 0 else '56-111'}\t{numa}\t\tN/A")
    return "\n".join(lines) + "\n\n" + legend


def pcie_link(i: int, j: int) -> str:
    if i // 4 != j // 4:
        return "SYS"
    return "PIX" if i // 2 == j // 2 else "NODE"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    real_xml = (GPU / "h200x2_nvidia_smi_q.xml").read_text()
    real_topo = (GPU / "h200x2_topo_and_ptxas.txt").read_text()
    topo_part = real_topo[real_topo.index("\t\x1b[4mGPU0"):]
    for key, (name, arch, mib, devid, cc) in VARIANTS.items():
        (OUT / f"{key}_nvidia_smi_q.xml").write_text(derive_xml(real_xml, name, arch, mib, devid))
        (OUT / f"{key}_query_gpu.csv").write_text("".join(f"580.159.04, {cc}\n" for _ in range(8)))
        link = (lambda i, j: "NV18") if key.startswith("b300") else pcie_link
        (OUT / f"{key}_topo.txt").write_text(derive_topo(topo_part, link))


if __name__ == "__main__":
    main()
