"""``ddtree-ops preflight`` (:mod:`ddtree_ops.host.preflight`, parsers in :mod:`ddtree_ops.host.gpu_facts`).

Parsers run on every real fixture (``tests/fixtures/gpu/``) and on the derived 8x B300 /
8x RTX PRO 6000 variants (``tests/fixtures/gpu/derived/``, documented as hand-made). The
end-to-end tests run the real preflight with a stand-in ``nvidia-smi`` (a shell script that
prints those fixture files) and a machine tree (``proc``/``sys``/``dev``) built in tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from tempfile import gettempdir as tempfile_dir

import pytest
from helpers import FIXTURES

from ddtree_ops.cli import main as cli_main
from ddtree_ops.config.hosts import HOST_CLASSES
from ddtree_ops.host import gpu_facts as gf
from ddtree_ops.host import preflight as pf

GPU = FIXTURES / "gpu"
DERIVED = GPU / "derived"
REAL_QUERY_LINE = "580.159.04, 9.0\n"  # h200x1_ptxas_triton_2026-11-30.txt, --query-gpu=driver_version,compute_cap


def standin_smi(tmp: Path, xml: Path, topo: Path, query: str) -> str:
    """A stand-in nvidia-smi printing the given fixture files for -q -x / topo -m / --query-gpu."""
    (tmp / "query.csv").write_text(query)
    smi = tmp / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$*" in
  "-q -x") cat '{xml}' ;;
  "topo -m") cat '{topo}' ;;
  --query-gpu=*) cat '{tmp / "query.csv"}' ;;
  *) echo "stand-in: unknown args $*" >&2; exit 2 ;;
esac
""")
    smi.chmod(0o755)
    return str(smi)


def machine(tmp: Path, gpus: int, module: str | None = None, nr_open: int = 1048576, uvm: bool = True) -> Path:
    """A ``proc``/``sys``/``dev`` tree: kernel module version file, fs.nr_open, device nodes."""
    root = tmp / "root"
    (root / "proc/sys/fs").mkdir(parents=True)
    (root / "proc/sys/fs/nr_open").write_text(f"{nr_open}\n")
    if module is not None:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text(module)
    (root / "dev/shm").mkdir(parents=True)
    (root / "sys").mkdir()
    names = ["nvidiactl", *[f"nvidia{i}" for i in range(gpus)]] + (["nvidia-uvm"] if uvm else [])
    for n in names:
        os.mknod(root / "dev" / n, stat.S_IFCHR | 0o666, os.makedev(195, 0))
    return root


# ---------------------------------------------------------------- parsers on real and derived fixtures

def test_smi_xml_real_h200_fixtures():
    one = gf.parse_smi_xml((GPU / "h200x1_nvidia_smi_q.xml").read_text())
    assert (one.driver_version, one.cuda_version, len(one.gpus)) == ("580.159.04", "13.0", 1)
    g = one.gpus[0]
    assert (g.name, g.architecture, g.bus_id, g.memory_mib, g.persistence) == (
        "NVIDIA H200", "Hopper", "00000000:00:06.0", 143771, True)
    two = gf.parse_smi_xml((GPU / "h200x2_nvidia_smi_q.xml").read_text())
    assert [x.name for x in two.gpus] == ["NVIDIA H200"] * 2 and len({x.bus_id for x in two.gpus}) == 2


@pytest.mark.parametrize("key,name,mib", [("b300x8", "NVIDIA B300 SXM6 AC", 275040),
                                          ("rtxpro6000x8", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)])
def test_smi_xml_derived_fixtures(key, name, mib):
    r = gf.parse_smi_xml((DERIVED / f"{key}_nvidia_smi_q.xml").read_text())
    assert len(r.gpus) == 8 and {g.name for g in r.gpus} == {name} and {g.memory_mib for g in r.gpus} == {mib}
    assert len({gf.parse_bdf(g.bus_id) for g in r.gpus}) == 8


def test_smi_xml_refuses_entities_non_xml_and_other_documents():
    with pytest.raises(gf.FactsError, match="entities"):
        gf.parse_smi_xml('<!DOCTYPE a [<!ENTITY x "y">]><nvidia_smi_log>&x;</nvidia_smi_log>')
    with pytest.raises(gf.FactsError, match="not XML"):
        gf.parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    with pytest.raises(gf.FactsError, match="driver_version"):
        gf.parse_smi_xml("<other><driver_version>580</driver_version></other>")
    with pytest.raises(gf.FactsError, match="more than"):
        gf.parse_smi_xml("<a/>" + " " * gf.MAX_XML_BYTES)


def test_topo_real_and_derived():
    real = gf.parse_topo((GPU / "h200x2_topo_and_ptxas.txt").read_text())  # ANSI header, ptxas log around it
    assert real.gpus == ["GPU0", "GPU1"] and real.links == {(0, 1): "NV18", (1, 0): "NV18"}
    single = gf.parse_topo((GPU / "h200x1_misc.txt").read_text())
    assert single.gpus == ["GPU0"] and single.links == {}
    b300 = gf.parse_topo((DERIVED / "b300x8_topo.txt").read_text())
    assert len(b300.links) == 56 and b300.kinds() == {"NV"}
    rtx = gf.parse_topo((DERIVED / "rtxpro6000x8_topo.txt").read_text())
    assert rtx.kinds() == {"PIX", "NODE", "SYS"} and rtx.links[(0, 7)] == "SYS" and rtx.links[(0, 1)] == "PIX"


def test_topo_refuses_garbage():
    with pytest.raises(gf.FactsError, match="GPU0"):
        gf.parse_topo("No devices were found")
    with pytest.raises(gf.FactsError, match="not a link"):
        gf.parse_topo("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n")


def test_proc_version_real_fixture_and_proprietary():
    m = gf.parse_proc_version((GPU / "h200x1_proc_driver_version.txt").read_text())
    assert (m.flavor, m.version) == ("open", "580.159.04")
    assert gf.parse_proc_version((GPU / "h200x1_misc.txt").read_text()) == m  # the same line, other session
    p = gf.parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 2025\n")
    assert (p.flavor, p.version) == ("proprietary", "570.86.15")
    with pytest.raises(gf.FactsError):
        gf.parse_proc_version("garbage")


def _config_space(acs_ctrl: int | None, readable: int = 4096) -> bytes:
    """PCIe config space with an extended capability chain at 0x100: AER (id 1) -> ACS (id 0xD)."""
    cfg = bytearray(4096)
    cfg[0x100:0x104] = (0x0001 | (1 << 16) | (0x140 << 20)).to_bytes(4, "little")
    if acs_ctrl is not None:
        cfg[0x140:0x144] = (0x000D | (1 << 16)).to_bytes(4, "little")
        cfg[0x146:0x148] = acs_ctrl.to_bytes(2, "little")
    return bytes(cfg[:readable])


def test_acs_control_walks_the_capability_chain():
    assert gf.acs_control(_config_space(0x001C)) == 0x001C
    assert gf.acs_control(_config_space(None)) is None
    assert gf.acs_control(_config_space(0x1C, readable=256)) is None
    loop = bytearray(4096)
    loop[0x100:0x104] = (0x0001 | (0x100 << 20)).to_bytes(4, "little")
    with pytest.raises(gf.FactsError, match="loops"):
        gf.acs_control(bytes(loop))


def test_host_class_facts():
    assert HOST_CLASSES["b300"].compute_cap == "10.3" and HOST_CLASSES["ct200"].compute_cap == "12.0"
    assert 97887 >= HOST_CLASSES["ct200"].min_memory_mib > 0
    assert 143771 < HOST_CLASSES["b300"].min_memory_mib <= 275040  # an H200 is not a B300


# ---------------------------------------------------------------- preflight end to end (stand-in nvidia-smi)

def _names(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"]}


BLACKWELL_ONLY = {n: HOST_CLASSES[n] for n in ("b300", "ct200")}
"""The table before the Hopper classes: what the real 2x H200 recordings (2026-11-30) were matched against."""


def _expect(host_class=None, plan=None, classes=None):
    e = pf.expect_from(host_class, plan)
    if classes is not None:
        e.classes = dict(classes)
    return e


def test_real_h200_matches_neither_blackwell_class(tmp_path):
    smi = standin_smi(tmp_path, GPU / "h200x2_nvidia_smi_q.xml", GPU / "h200x2_topo_and_ptxas.txt", REAL_QUERY_LINE * 2)
    root = machine(tmp_path, 2, (GPU / "h200x1_proc_driver_version.txt").read_text())
    r = pf.preflight(_expect(classes=BLACKWELL_ONLY), smi, root=root)
    c = _names(r)
    assert not r["ok"] and not c["host_class"]["ok"]
    assert "matches no host class" in c["host_class"]["detail"] and "not b300" in c["host_class"]["detail"]
    assert r["matches"]["b300"] and r["matches"]["ct200"]
    assert c["nvidia_smi"]["ok"] and c["kernel_module"]["ok"] and c["driver"]["ok"], c
    assert c["compute_capability"]["detail"] == "9.0" and c["interconnect"]["detail"] == "NV18"
    assert c["pcie_acs"]["skipped"] and c["device_nodes"]["ok"]
    assert [x["name"] for x in r["checks"]] == [n for n in pf.CHECK_NAMES if n != "nccl"]
    assert r["facts"]["gpus"][0]["compute_cap"] == "9.0" and r["facts"]["kernel_module"]["flavor"] == "open"


def test_real_2x_h200_matches_h200x2_and_no_other_class(tmp_path):
    """The real 2x H200 (NV18 between the two) against the whole built-in table: it is an h200x2,
    and only that (not h200x1/h200x8: count; not h200nvlx8/h100*: name; not the Blackwells)."""
    smi = standin_smi(tmp_path, GPU / "h200x2_nvidia_smi_q.xml", GPU / "h200x2_topo_and_ptxas.txt", REAL_QUERY_LINE * 2)
    root = machine(tmp_path, 2, (GPU / "h200x1_proc_driver_version.txt").read_text())
    r = pf.preflight(pf.expect_from(None, None), smi, root=root)
    assert [n for n, why in r["matches"].items() if not why] == ["h200x2"]
    assert _names(r)["host_class"]["detail"] == "matches h200x2"
    assert "2 GPU(s); h200x8 has 8" in r["matches"]["h200x8"]
    c = _names(pf.preflight(pf.expect_from("h200x2", None), smi, root=root))
    bad = {n: x["detail"] for n, x in c.items() if not x["ok"]}
    assert bad == {}, bad
    assert c["interconnect"]["detail"] == "GPU pairs: NV; h200x2 needs NVLink (NV#) between every pair"
    assert c["pcie_acs"]["skipped"]


def test_real_h200_against_b300_fails_each_fact_with_its_fix(tmp_path):
    smi = standin_smi(tmp_path, GPU / "h200x1_nvidia_smi_q.xml", GPU / "h200x1_misc.txt",
                      (GPU / "h200x1_query_gpu.csv").read_text())
    root = machine(tmp_path, 1, (GPU / "h200x1_proc_driver_version.txt").read_text())
    c = _names(pf.preflight(pf.expect_from("b300", None), smi, root=root))
    for n in ("host_class", "gpu_count", "gpu_name", "compute_capability", "gpu_memory", "interconnect"):
        assert not c[n]["ok"] and c[n]["remediation"], n
    assert "1 GPU(s); b300 has 8" in c["gpu_count"]["detail"]
    assert "9.0" in c["compute_capability"]["detail"] and "10.3" in c["compute_capability"]["detail"]
    assert c["persistence_mode"]["ok"]


def test_derived_b300_passes_as_b300_and_not_as_ct200(tmp_path):
    smi = standin_smi(tmp_path, DERIVED / "b300x8_nvidia_smi_q.xml", DERIVED / "b300x8_topo.txt",
                      (DERIVED / "b300x8_query_gpu.csv").read_text())
    root = machine(tmp_path, 8, (GPU / "h200x1_proc_driver_version.txt").read_text())
    r = pf.preflight(pf.expect_from(None, None), smi, root=root)
    assert r["matches"]["b300"] == [] and r["matches"]["ct200"]
    assert _names(r)["host_class"]["detail"] == "matches b300"
    c = _names(pf.preflight(pf.expect_from("b300", None), smi, root=root))
    bad = {n: x["detail"] for n, x in c.items() if not x["ok"]}
    assert bad == {}, bad
    assert c["interconnect"]["ok"] and c["pcie_acs"]["skipped"]


def _real_h200x1(tmp_path: Path) -> tuple[str, Path]:
    """The real 1x H200's outputs (tests/fixtures/gpu/h200x1_*) behind a stand-in nvidia-smi, and its
    /proc/driver/nvidia/version in a machine tree."""
    smi = standin_smi(tmp_path, GPU / "h200x1_nvidia_smi_q.xml", GPU / "h200x1_misc.txt",
                      (GPU / "h200x1_query_gpu.csv").read_text())
    return smi, machine(tmp_path, 1, (GPU / "h200x1_proc_driver_version.txt").read_text())


def test_real_h200_passes_as_h200x1_and_matches_no_other_class(tmp_path):
    """The lent machine, read through the preflight's own parsers (nvidia-smi -q -x, --query-gpu,
    topo -m of one GPU, the open kernel module's version line): every check passes as h200x1."""
    smi, root = _real_h200x1(tmp_path)
    r = pf.preflight(pf.expect_from("h200x1", None), smi, root=root)
    c = _names(r)
    bad = {n: x["detail"] for n, x in c.items() if not x["ok"]}
    assert bad == {}, bad
    assert r["ok"] and r["host_class"] == "h200x1" and c["host_class"]["detail"] == "machine matches h200x1"
    assert c["gpu_count"]["detail"] == "1 GPU(s); h200x1 has 1"
    assert c["gpu_name"]["detail"] == "NVIDIA H200; h200x1 is NVIDIA H200"  # exact: no "*"
    assert c["compute_capability"]["detail"] == "compute capability 9.0; h200x1 is 9.0 (sm_90)"
    assert c["gpu_memory"]["detail"].startswith("least GPU memory 143771 MiB; h200x1 needs >= ")
    assert c["kernel_module"]["detail"] == "open kernel module 580.159.04"
    assert c["driver"]["detail"] == "driver 580.159.04 (CUDA 13.0) >= 580.65.06 for CUDA 13.0"
    assert c["pcie_acs"]["skipped"] and c["iommu"]["skipped"]  # one GPU: no peer traffic
    assert [n for n, why in r["matches"].items() if not why] == ["h200x1"]
    assert "1 GPU(s); h200x8 has 8" in r["matches"]["h200x8"]
    assert any("h200nvlx8 is NVIDIA H200 NVL*" in why for why in r["matches"]["h200nvlx8"])
    assert _names(pf.preflight(pf.expect_from(None, None), smi, root=root))["host_class"]["detail"] == \
        "matches h200x1"


def test_cli_and_zipapp_preflight_host_class_h200x1_on_the_real_h200(tmp_path, capsys):
    """`ddtree-ops preflight --host-class h200x1 --json` and the zipapp on the real outputs: the GPU
    checks pass (the kernel module, device nodes and disk are this test machine's, not the H200's)."""
    smi, _ = _real_h200x1(tmp_path)
    gpu = ("host_class", "gpu_count", "gpu_name", "compute_capability", "gpu_memory", "persistence_mode",
           "interconnect", "driver")
    cli_main(["preflight", "--host-class", "h200x1", "--nvidia-smi", smi, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["host_class"] == "h200x1" and all(_names(doc)[n]["ok"] for n in gpu), doc
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))
    r = subprocess.run([sys.executable, "-I", "-S", app, "--host-class", "h200x1", "--nvidia-smi", smi, "--json"],
                       capture_output=True, text=True, timeout=60)
    z = json.loads(r.stdout)
    assert z["host_class"] == "h200x1" and all(_names(z)[n]["ok"] for n in gpu), r.stdout[-2000:]
    assert [c["name"] for c in z["checks"]] == [c["name"] for c in doc["checks"]]


def test_blackwell_needs_the_open_kernel_module(tmp_path):
    smi = standin_smi(tmp_path, DERIVED / "b300x8_nvidia_smi_q.xml", DERIVED / "b300x8_topo.txt",
                      (DERIVED / "b300x8_query_gpu.csv").read_text())
    root = machine(tmp_path, 8, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build\n")
    c = _names(pf.preflight(pf.expect_from("b300", None), smi, root=root))
    assert not c["kernel_module"]["ok"] and "open kernel module" in c["kernel_module"]["remediation"]


def _pcie_sysfs(root: Path, buses: list[str], acs_ctrl: int, iommu_type: str) -> None:
    """sysfs for GPUs below one bridge each: devices/pci0000:00/<bridge>/<gpu>, bus/pci/devices links,
    IOMMU groups."""
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for i, bus in enumerate(buses):
        bridge = root / f"sys/devices/pci0000:00/0000:00:{i + 1:02x}.0"
        gpu = bridge / f"0000:{bus.lower()}:00.0"
        gpu.mkdir(parents=True)
        (bridge / "config").write_bytes(_config_space(acs_ctrl))
        (gpu / "config").write_bytes(_config_space(None))
        group = root / f"sys/kernel/iommu_groups/{i}"
        group.mkdir(parents=True)
        (group / "type").write_text(iommu_type + "\n")
        (gpu / "iommu_group").symlink_to(group)
        (root / "sys/bus/pci/devices" / gpu.name).symlink_to(gpu)


@pytest.mark.parametrize("acs,iommu,ok", [(0x0000, "identity", True), (0x001D, "identity", False),
                                          (0x0000, "DMA-FQ", False)])
def test_derived_rtx_pro_6000_acs_and_iommu(tmp_path, acs, iommu, ok):
    smi = standin_smi(tmp_path, DERIVED / "rtxpro6000x8_nvidia_smi_q.xml", DERIVED / "rtxpro6000x8_topo.txt",
                      (DERIVED / "rtxpro6000x8_query_gpu.csv").read_text())
    root = machine(tmp_path, 8, (GPU / "h200x1_proc_driver_version.txt").read_text())
    _pcie_sysfs(root, ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"], acs, iommu)
    c = _names(pf.preflight(pf.expect_from("ct200", None), smi, root=root))
    assert c["gpu_name"]["ok"] and c["compute_capability"]["ok"] and c["gpu_memory"]["ok"] and c["interconnect"]["ok"]
    assert (c["pcie_acs"]["ok"] and c["iommu"]["ok"]) is ok
    if acs:
        assert "ACS P2P redirect is on at 0000:00:01.0" in c["pcie_acs"]["detail"]
        assert "ECAP_ACS+6.w=0000" in c["pcie_acs"]["remediation"]
    if iommu != "identity":
        assert "DMA-FQ" in c["iommu"]["detail"] and "iommu=pt" in c["iommu"]["remediation"]
    b300 = _names(pf.preflight(pf.expect_from("b300", None), smi, root=root))
    assert not b300["interconnect"]["ok"] and not b300["gpu_name"]["ok"]


def test_missing_nvidia_smi_is_a_failed_check_not_a_traceback(tmp_path):
    root = machine(tmp_path, 0, uvm=False)
    r = pf.preflight(pf.expect_from("b300", None), str(tmp_path / "absent" / "nvidia-smi"), root=root)
    c = _names(r)
    assert not c["nvidia_smi"]["ok"] and "not found" in c["nvidia_smi"]["detail"]
    assert "install the NVIDIA driver" in c["nvidia_smi"]["remediation"]
    assert not c["kernel_module"]["ok"] and "not loaded" in c["kernel_module"]["detail"]
    assert not c["device_nodes"]["ok"] and "nvidia-uvm" in c["device_nodes"]["detail"]
    assert "nvidia-modprobe" in c["device_nodes"]["remediation"]


def test_nvidia_smi_that_hangs_or_floods_is_killed(tmp_path):
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")
    hang.chmod(0o755)
    t = time.monotonic()
    r = pf.run_bounded([str(hang)], timeout=0.5)
    assert r.rc == 124 and "deadline" in r.note and time.monotonic() - t < 5
    flood = pf.run_bounded(["yes"], timeout=10, max_bytes=1 << 16)
    assert flood.rc == 125 and len(flood.stdout) <= 1 << 16


def test_driver_older_than_the_toolkit_and_half_done_upgrade(tmp_path):
    xml = (GPU / "h200x1_nvidia_smi_q.xml").read_text().replace("580.159.04", "575.57.08")
    (tmp_path / "old.xml").write_text(xml)
    smi = standin_smi(tmp_path, tmp_path / "old.xml", GPU / "h200x1_misc.txt", "575.57.08, 9.0\n")
    root = machine(tmp_path, 1, (GPU / "h200x1_proc_driver_version.txt").read_text())
    c = _names(pf.preflight(pf.expect_from("b300", None), smi, root=root))
    assert not c["driver"]["ok"]
    assert "older than CUDA 13.0 needs (>= 580.65.06" in c["driver"]["detail"]
    assert "kernel module 580.159.04 but nvidia-smi (user space) 575.57.08" in c["driver"]["detail"]


def test_shm_64mb_fails_with_the_fix():
    c = pf.shm_check(64 << 20)
    assert not c["ok"] and "64 MiB" in c["detail"] and "remount,size=" in c["remediation"]
    assert pf.shm_check(128 << 30)["ok"]


def test_limits_below_the_units_fail():
    c = pf.limits_check(65536)
    assert not c["ok"] and "fs.nr_open is 65536" in c["detail"] and "sysctl -w fs.nr_open=1048576" in c["remediation"]
    unit = "ddtree-sglang.service"
    low = pf.limits_check(1048576, {"LimitNOFILE": "4096", "LimitMEMLOCK": "8388608"}, unit)
    assert (
        not low["ok"] and "LimitNOFILE=4096" in low["detail"] and "LimitMEMLOCK=8388608, not infinity" in low["detail"]
    )
    assert pf.limits_check(1048576, {"LimitNOFILE": "1048576", "LimitMEMLOCK": "infinity"}, unit)["ok"]
    assert pf.limits_check(1048576, None, unit)["ok"]  # not loaded yet: the unit file sets both


def test_disk_check_low_space_fails(monkeypatch, tmp_path):
    monkeypatch.setattr(pf, "DISK_MIN_FREE_BYTES", 1 << 60)  # more than any disk here
    c = pf.disk_check([str(tmp_path / "not" / "yet" / "created")])
    assert not c["ok"] and "GiB free" in c["detail"]


def _plan(port: int, exporter_port: int, host_class: str = "b300") -> dict:
    from helpers import base_hostvars

    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render.files import plan_document

    hv = base_hostvars() | {"ddtree_host_class": host_class, "ddtree_server": {
        **base_hostvars()["ddtree_server"], "port": port}, "ddtree_ops": {"exporter_port": exporter_port}}
    return plan_document(validate_hostvars("h1", hv))


def test_taken_port_fails_naming_the_holder_and_the_fix(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import socket,sys,time\ns=socket.socket()\n"
                               "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0',0))\n"
                               "s.listen()\nprint(s.getsockname()[1], flush=True)\ntime.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        e = pf.expect_from(None, _plan(port, free if free >= 1024 else 19400))
        c = pf.ports_check(e.ports)
        assert not c["ok"] and f"port {port} is already in use by pid {holder.pid}" in c["detail"]
        assert "set another port in the inventory" in c["remediation"]
    finally:
        holder.kill()
        holder.wait()


def _listener() -> tuple[subprocess.Popen, int]:
    holder = subprocess.Popen([sys.executable, "-c", "import socket,sys,time\ns=socket.socket()\n"
                               "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0',0))\n"
                               "s.listen()\nprint(s.getsockname()[1], flush=True)\ntime.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    return holder, int(holder.stdout.readline())


@pytest.mark.parametrize("nccl", ["set", "derived"])
def test_a_stray_listener_on_the_rendezvous_port_fails_the_preflight_naming_nccl_port(nccl):
    """SGLang's TP ranks meet on --nccl-port: a holder there made the start crash-loop with
    EADDRINUSE after `current` had switched; the host preflight (before any change) must see it."""
    from helpers import base_hostvars

    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render.files import plan_document

    holder, taken = _listener()
    try:
        if taken < 1124 or taken > 65435:
            pytest.skip(f"ephemeral port {taken} leaves no room for the derived offset")
        hv = base_hostvars()
        server = dict(hv["ddtree_server"], port=taken - 100) if nccl == "derived" else dict(
            hv["ddtree_server"], nccl_port=taken)
        doc = plan_document(validate_hostvars("h1", hv | {"ddtree_server": server}))
        assert doc["rendezvous_port"] == taken
        c = pf.ports_check(pf.expect_from(None, doc).ports)
        assert not c["ok"] and f"port {taken} is already in use by pid {holder.pid}" in c["detail"], c
        assert "ddtree_server.nccl_port" in c["detail"] and "ddtree_server.nccl_port" in c["remediation"], c
    finally:
        holder.kill()
        holder.wait()


def test_plan_gives_class_toolchain_ports_and_dirs():
    doc = _plan(31000, 19401)
    e = pf.expect_from(None, doc)
    assert e.host_class.name == "b300" and e.toolchain["target"] == "sm_103a"
    assert e.ports[0] == (31000, "ddtree-sglang.service", "0.0.0.0", "ddtree_server.port")
    # every port the instance binds: the rendezvous port (derived 31000 + 100) too
    assert [p[0] for p in e.ports] == [31000, 31100, 19401]
    assert doc["paths"]["cache"] in e.dirs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert pf.ports_check([(free, "ddtree-sglang.service", "1host.example")])["ok"]  # a name: any address
    with pytest.raises(pf.PreflightUsageError, match="contradicts"):
        pf.expect_from("ct200", doc)
    with pytest.raises(pf.PreflightUsageError, match="not a plan.json"):
        pf.expect_from(None, {"plan": {}})
    with pytest.raises(pf.PreflightUsageError, match="use one of"):
        pf.expect_from("h200", None)


def test_ptxas_check_skips_until_the_toolkit_is_installed():
    c = pf.ptxas_check({"arch": "sm_103", "cuda": "13.0", "ptxas": "/nonexistent/ptxas", "target": "sm_103a",
                        "ptx_version": "8.8"})
    assert c["ok"] and c["skipped"] and "not installed yet" in c["detail"]


def test_nccl_smoke_skips_cleanly_without_torch():
    c = pf.nccl_check(sys.executable, 2, 30)  # the project venv has no torch
    assert c["ok"] and c["skipped"] and "no torch" in c["detail"]


def test_nccl_smoke_killed_at_the_deadline_reports_the_acs_fix(tmp_path):
    fake = tmp_path / "python"  # answers the torch probe, then hangs as a stuck all-reduce does
    fake.write_text("#!/bin/sh\ncase \"$1\" in -c) echo 8; exit 0;; esac\nsleep 30 & sleep 30\n")
    fake.chmod(0o755)
    t = time.monotonic()
    c = pf.nccl_check(str(fake), 8, 1.0)
    assert time.monotonic() - t < 10
    assert not c["ok"] and "did not finish in 1 s (killed)" in c["detail"] and "iommu=pt" in c["remediation"]


def test_nccl_smoke_torch_without_cuda_fails(tmp_path):
    fake = tmp_path / "python"  # a torch that imports but sees no device (CPU wheel, wrong CUDA)
    fake.write_text("#!/bin/sh\necho 0\n")
    fake.chmod(0o755)
    c = pf.nccl_check(str(fake), 2, 5)
    assert not c["ok"] and "sees no CUDA device" in c["detail"] and "torch build" in c["remediation"]


# ---------------------------------------------------------------- CLI and zipapp

def test_cli_json_exit_codes(tmp_path, capsys, monkeypatch):
    smi = standin_smi(tmp_path, GPU / "h200x1_nvidia_smi_q.xml", GPU / "h200x1_misc.txt",
                      (GPU / "h200x1_query_gpu.csv").read_text())
    assert cli_main(["preflight", "--nvidia-smi", smi, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["host_class"] is None and {c["name"] for c in doc["checks"]} >= {"host_class"}
    assert cli_main(["preflight", "--host-class", "h200", "--json"]) == 2
    assert "use one of" in json.loads(capsys.readouterr().out)["checks"][0]["detail"]
    assert cli_main(["preflight", "--skip", "bogus", "--json"]) == 2
    assert cli_main(["preflight", "--disk-min-free-gib", "nan", "--json"]) == 2
    assert "--disk-min-free-gib nan: must be 0.." in capsys.readouterr().out


def test_zipapp_runs_with_the_standard_library_only(tmp_path):
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))
    assert Path(app).read_bytes() == Path(pf.build_zipapp(str(tmp_path / "again.pyz"))).read_bytes()
    smi = standin_smi(tmp_path, DERIVED / "b300x8_nvidia_smi_q.xml", DERIVED / "b300x8_topo.txt",
                      (DERIVED / "b300x8_query_gpu.csv").read_text())
    # -I -S: no site-packages (no pydantic, typer, rich): what a fresh GPU host has
    r = subprocess.run([sys.executable, "-I", "-S", app, "--host-class", "b300", "--nvidia-smi", smi, "--json"],
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(r.stdout)
    c = _names(doc)
    assert r.returncode in (0, 1) and c["gpu_count"]["ok"] and c["interconnect"]["ok"] and c["gpu_name"]["ok"], r.stderr


# ---------------------------------------------------------------- the deploy play

def test_deploy_play_stops_an_unfit_host_before_anything_changes(tmp_path):
    """deploy.yml on a host reached over the local connection: this machine has no GPU, so the
    preflight play fails the host with the remediation and no later play touches it."""
    import yaml
    from helpers import REPO, base_hostvars

    plays = yaml.safe_load((REPO / "deploy.yml").read_text())
    pre = next(p for p in plays if p.get("name") == "Preflight")
    assert pre["any_errors_fatal"] is False  # one unfit host never stops the fleet
    assert plays.index(pre) < next(
        i for i, p in enumerate(plays) if "service.yml" in str(p.get("ansible.builtin.import_playbook"))
    )
    hv = base_hostvars()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = max(s.getsockname()[1], 1024)
    hv["ddtree_server"] = {**hv["ddtree_server"], "port": port}
    hv.update(ansible_connection="local", ansible_python_interpreter=sys.executable,
              ddtree_service_preflight_zipapp=str(tmp_path / "preflight.pyz"))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"hosts": {"pf-local": hv}}}))
    before = set(Path(tempfile_dir()).glob("*-ddtree-preflight"))
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                        "deploy.yml"], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    out = r.stdout
    assert r.returncode != 0, out[-3000:]
    assert "preflight failed on pf-local (nothing was changed on it)" in out
    assert "[nvidia_smi] nvidia-smi not found" in out and "Fix: install the NVIDIA driver" in out
    assert "TASK [cuda_toolkit" not in out and "PLAY [Install and start the SGLang service]" not in out
    assert re.search(r"pf-local\s+:.*changed=0\s.*failed=1", out), out[-2000:]
    assert set(Path(tempfile_dir()).glob("*-ddtree-preflight")) == before  # its temporary directory is gone


def test_limits_are_the_rendered_units():
    """The preflight's limits are the ones the SGLang unit sets (ddtree_ops/templates/sglang.service.j2)."""
    from helpers import base_hostvars

    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.render import render_host

    v = validate_hostvars("h1", base_hostvars())
    unit = next(f.content for f in render_host(v) if f.path.endswith("/" + v.deployment.service.unit_name))
    assert f"\nLimitNOFILE={pf.SERVICE_NOFILE}\n" in unit and f"\nLimitMEMLOCK={pf.SERVICE_MEMLOCK}\n" in unit


def test_driver_without_a_cuda_version_is_read(tmp_path):
    """vGPU hosts print ``CUDA Version: Not Found``: the driver check still runs, no crash."""
    xml = (GPU / "h200x1_nvidia_smi_q.xml").read_text().replace("<cuda_version>13.0<", "<cuda_version>Not Found<")
    (tmp_path / "vgpu.xml").write_text(xml)
    smi = standin_smi(tmp_path, tmp_path / "vgpu.xml", GPU / "h200x1_misc.txt", REAL_QUERY_LINE)
    root = machine(tmp_path, 1, (GPU / "h200x1_proc_driver_version.txt").read_text())
    c = _names(pf.preflight(pf.expect_from(None, None), smi, root=root))
    assert c["driver"]["ok"] and "driver 580.159.04 (CUDA Not Found) >= 580.65.06" in c["driver"]["detail"]


# ---------------------------------------------------------------- the real-GPU run (2x H200, 2026-11-30)

def _section(text: str, command: str) -> str:
    """One command's output from scripts/record-gpu-facts.sh's facts.txt."""
    head = f"===== $ {command}\n"
    start = text.index(head) + len(head)
    return text[start:text.index("\n[rc=", start)] + "\n"


def test_recorded_host_gives_the_facts_and_verdicts_of_the_real_run(tmp_path):
    """The same machine twice: `ddtree-ops preflight` ran on the real 2x H200 host (its --json is
    the fixture), and the parsers here read that host's own recording (nvidia-smi -q -x, topo -m
    with its ANSI underline, the query CSV, /proc/driver/nvidia/version). Facts and the verdict of
    every GPU check must agree; the real run also proved the NCCL smoke test on real GPUs."""
    real = json.loads((GPU / "h200x2_2026-11-30_preflight.json").read_text())
    real_b300 = json.loads((GPU / "h200x2_2026-11-30_preflight_as_b300.json").read_text())
    facts = (GPU / "h200x2_2026-11-30_facts.txt").read_text()
    (tmp_path / "topo.txt").write_text(_section(facts, "nvidia-smi topo -m"))
    csv = _section(facts, "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,compute_cap,memory.total,memory.used,"
                          "driver_version,persistence_mode,power.limit,clocks.max.sm --format=csv")
    query = "".join(f"{row.split(', ')[7]}, {row.split(', ')[4]}\n" for row in csv.splitlines()[1:])
    smi = standin_smi(tmp_path, GPU / "h200x2_2026-11-30_nvidia_smi_q.xml", tmp_path / "topo.txt", query)
    root = machine(tmp_path, 2, _section(facts, "cat /proc/driver/nvidia/version"))

    here = pf.preflight(_expect(classes=BLACKWELL_ONLY), smi, root=root)  # the table of the recording
    here_b300 = pf.preflight(_expect("b300", classes=BLACKWELL_ONLY), smi, root=root)
    assert real["host_class"] is None and not real["ok"]
    assert here["facts"] == real["facts"]
    assert here["matches"] == real["matches"]
    gpu_checks = ("nvidia_smi", "host_class", "gpu_count", "gpu_name", "compute_capability", "gpu_memory",
                  "persistence_mode", "interconnect", "kernel_module", "driver", "pcie_acs", "iommu")
    for ours, theirs in ((here, real), (here_b300, real_b300)):
        got = {c["name"]: (c["ok"], c["detail"]) for c in ours["checks"] if c["name"] in gpu_checks}
        want = {c["name"]: (c["ok"], c["detail"]) for c in theirs["checks"] if c["name"] in gpu_checks}
        assert got == want
    nccl = next(c for c in real["checks"] if c["name"] == "nccl")
    assert nccl["ok"] and "over 2 GPU(s)" in nccl["detail"] and "NCCL_NVLS_ENABLE=0" in nccl["detail"]


# ---------------------------------------------------------------- hostile commands and plans

HOSTILE_TEXT = ("boom \x1b]52;c;cm0gLXJmIH4K\x1b\\ \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x1b[2J"
                "\x9b31m\x07\u202e Authorization: Bearer SEKRITsmi\nok   fake: line")
SECRET_SHAPES = ["hf_AbCdEfGhIjKlMnOpQrStUvWx", "--api-key SEKRIT1", "export OPENAI_API_KEY=\"SEKRIT2\"",
                 "ServerArgs(api_key='SEKRIT3', port=30000)", '{"hf_token": "SEKRIT4"}', "HF_TOKEN = SEKRIT5",
                 "token: SEKRIT6", "https://user:SEKRIT7@host.example/x", "GET /m?access_token=SEKRIT8&x=1",
                 "X-Api-Key: SEKRIT9", "--admin-api-key=SEKRIT10"]


def test_clean_strips_escapes_and_redacts_secret_shapes(monkeypatch):
    """The zipapp and the CLI clean with the one standard-library scrubber, which also knows the
    registered (vaulted) secrets."""
    from ddtree_ops._core import scrub as core_scrub

    monkeypatch.setattr(core_scrub, "_known_secrets", set())
    out = pf.clean(HOSTILE_TEXT)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202e]", out) and "SEKRIT" not in out
    assert out.startswith("boom") and "click" in out and "Authorization:" in out and "ok   fake: line" in out
    for shape in SECRET_SHAPES:
        assert "SEKRIT" not in pf.clean(shape) and "hf_AbCd" not in pf.clean(shape), shape
    for keep in ("GPU0 NV18 PIX", "draft_tokens_per_req=4", "--port 30000", "the key to success", "580.159.04, 10.3"):
        assert pf.clean(keep) == keep
    assert pf.clean("A" * 5000).endswith("…") and len(pf.clean("A" * 5000)) == pf.MAX_DETAIL + 1
    core_scrub.register_secret("vaulted-opaque-XYZ")
    assert "vaulted-opaque-XYZ" not in pf.clean("value vaulted-opaque-XYZ here")


def test_nvidia_smi_escapes_and_secrets_never_reach_the_report(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' '{HOSTILE_TEXT.splitlines()[0]}' >&2\nexit 1\n")
    smi.chmod(0o755)
    root = machine(tmp_path, 0, uvm=False)
    c = _names(pf.preflight(pf.expect_from("b300", None), str(smi), root=root))["nvidia_smi"]
    assert not c["ok"] and "boom" in c["detail"] and "SEKRIT" not in c["detail"] and "\x1b" not in c["detail"]
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))  # the zipapp: its own scrub, text output
    r = subprocess.run([sys.executable, "-I", "-S", app, "--host-class", "b300", "--nvidia-smi", str(smi)],
                       capture_output=True, timeout=60)
    assert r.returncode == 1 and b"boom" in r.stdout, r.stderr
    assert b"SEKRIT" not in r.stdout + r.stderr and b"\x1b" not in r.stdout + r.stderr


def _gone(pid: int, within: float = 3.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_run_bounded_kills_left_behind_children_after_a_normal_exit(tmp_path):
    pidfile = tmp_path / "pid"
    t = time.monotonic()  # a child detached from the pipes, as `(cmd &)` / nohup leave one
    r = pf.run_bounded(["sh", "-c", f"(sleep 30 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}); echo done"], 10)
    assert r.rc == 0 and r.stdout.strip() == "done" and time.monotonic() - t < 5
    assert _gone(int(pidfile.read_text()))
    t = time.monotonic()  # a child that keeps the pipes open: the run ends soon after the command does
    r = pf.run_bounded(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; echo done"], 10)
    assert r.rc == 0 and "done" in r.stdout and time.monotonic() - t < 3
    assert _gone(int(pidfile.read_text()))


def test_nccl_probe_that_hangs_fails_within_the_total_deadline(tmp_path):
    fake = tmp_path / "python"  # `import torch` / CUDA init that never returns
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    t = time.monotonic()
    c = pf.nccl_check(str(fake), 8, 1.5)
    assert time.monotonic() - t < 5
    assert not c["ok"] and not c.get("skipped") and "did not answer within the 1.5 s deadline" in c["detail"]
    slow = tmp_path / "slow"  # the probe answers, then the all-reduce gets only what is left of the total
    slow.write_text("#!/bin/sh\ncase \"$1\" in -c) sleep 1; echo 8; exit 0;; esac\nsleep 30\n")
    slow.chmod(0o755)
    t = time.monotonic()
    c = pf.nccl_check(str(slow), 8, 2.0)
    assert time.monotonic() - t < 4 and not c["ok"] and "did not finish in 2 s" in c["detail"]


@pytest.mark.parametrize("line", ['{"correct": true}', '{"correct": true, "bytes": "x", "world": 8, "seconds": 1}',
                                  '{"correct": true, "bytes": 1, "world": 8, "seconds": 1, "busbw_gbps": "fast"}',
                                  '{"correct": "yes", "bytes": 1, "world": 8, "seconds": 1}', "[1, 2]", "7" * 5000,
                                  "[" * 100000 + "]" * 100000],
                         # short ids: a 200 000-character id in PYTEST_CURRENT_TEST makes every exec of the
                         # test's fake python fail with "Argument list too long"
                         ids=["no-bytes", "bytes-str", "busbw-str", "correct-str", "list", "long-number",
                              "deep-list"])
def test_nccl_result_of_the_wrong_shape_is_a_failed_check(tmp_path, line):
    fake = tmp_path / "python"
    (tmp_path / "line").write_text(line + "\n")
    fake.write_text(f"#!/bin/sh\ncase \"$1\" in -c) echo 8; exit 0;; esac\ncat {tmp_path / 'line'}\n")
    fake.chmod(0o755)
    c = pf.nccl_check(str(fake), 8, 10)
    assert not c["ok"] and "printed no result of the expected shape" in c["detail"]


def test_nccl_result_of_the_right_shape_passes(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\ncase "$1" in -c) echo 2; exit 0;; esac\necho \'{"world": 2, "bytes": 67108864, '
        '"seconds": 0.001, "correct": true, "busbw_gbps": 67.1, "nccl": "2.27.3", "torch": "2.9"}\'\n'
    )
    fake.chmod(0o755)
    c = pf.nccl_check(str(fake), 2, 10)
    assert c["ok"] and "64 MiB over 2 GPU(s)" in c["detail"] and "67.1 GB/s" in c["detail"]



def test_nccl_result_from_fewer_ranks_than_gpus_fails(tmp_path):
    """8 GPUs probed, a result of world 1 passed as "over 1 GPU(s)"."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\ncase \"$1\" in -c) echo 8; exit 0;; esac\necho '{\"world\": 1, \"bytes\": 268435456, "
                    "\"seconds\": 0.001, \"correct\": true, \"busbw_gbps\": null}'\n")
    fake.chmod(0o755)
    c = pf.nccl_check(str(fake), 8, 10)
    assert not c["ok"] and "over 8 GPU(s) reported 1 rank(s)" in c["detail"]

@pytest.mark.parametrize("csv, topo, check, words", [
    ("580.159.04, 10.3.1\n" * 8, None, "compute_capability", "unknown"),
    ("index, driver_version, compute_cap\n" + "x, 580.159.04, 10.3\n" * 8, None, "compute_capability", "unknown"),
    ('"' + "A" * 200_000 + '", 10.3\n', None, "compute_capability", "unknown"),
    (None, "\tGPU0\tNIC0\tGPU1\nGPU0\tX\tNV18\nGPU1\tNV18\tX\n", "interconnect", "fewer cells than the header"),
    (None, "\tGPU0\tGPU0\tGPU1\nGPU0\tX\tX\tNV18\nGPU1\tNV18\tNV18\tX\n", "interconnect", "names a GPU twice"),
], ids=["three-part-cap", "bad-index", "huge-csv-field", "topo-misaligned", "topo-duplicate-gpu"])
def test_hostile_nvidia_smi_output_is_a_failed_check(tmp_path, csv, topo, check, words):
    topo_file = DERIVED / "b300x8_topo.txt"
    if topo is not None:
        topo_file = tmp_path / "topo.txt"
        topo_file.write_text(topo)
    smi = standin_smi(tmp_path, DERIVED / "b300x8_nvidia_smi_q.xml", topo_file,
                      csv if csv is not None else (DERIVED / "b300x8_query_gpu.csv").read_text())
    r = pf.preflight(pf.expect_from("b300", None), smi, root=machine(tmp_path, 8))
    c = _names(r)[check]
    assert not r["ok"] and not c["ok"] and words in c["detail"], c
    if check == "compute_capability":  # and the nvidia_smi check says why
        assert "compute capability unknown: " in _names(r)["nvidia_smi"]["detail"]
    r = pf.preflight(pf.expect_from(None, None), smi, root=machine(tmp_path / "n", 8))  # no class: arch guessed
    assert not _names(r)["host_class"]["ok"]


def _mutated(path: str, value) -> dict:
    doc = _plan(31000, 19401)
    *parents, last = path.split(".")
    cur = doc
    for k in parents:
        cur = cur[k]
    cur[last] = value
    return doc


@pytest.mark.parametrize("path, value", [
    ("host_class", ["b300"]), ("host_class", 7), ("unit", "--host=root@127.0.0.1"), ("unit", 5),
    ("exporter_unit", [1, "a"]), ("deployment.server.port", 10**30), ("deployment.server.port", True),
    ("deployment.server.port", 1.5), ("deployment.server.host", {}), ("deployment.ops.exporter_port", "x"),
    ("deployment.model", []), ("deployment.model.path", 3), ("paths.state", ["/x"]), ("paths.cache", 7),
    ("paths.cache", "relative/dir"), ("plan.toolchain", []), ("plan.toolchain.cuda", 1.5),
    ("plan.toolchain.min_driver", 5), ("plan.toolchain.min_driver", "5" * 5000), ("plan.toolchain.arch", {}),
    ("plan.toolchain.ptx_version", ["8.8"]), ("plan.toolchain.ptxas", "ptxas"), ("plan.toolchain.target", "sm_x"),
    ("plan.toolchain.ptxas_env", {"TRITON_PTXAS_PATH": True}), ("plan.toolchain.ptxas_env", ["x"]),
    ("plan", None), ("deployment.server", "x"),
])
def test_hostile_plan_fields_are_a_usage_error_naming_the_field(path, value):
    with pytest.raises(pf.PreflightUsageError) as exc:
        pf.expect_from(None, _mutated(path, value))
    msg = str(exc.value)
    assert msg.startswith("--plan: ") and "not a plan.json rendered by ddtree-ops" in msg and len(msg) < 600
    assert path.split(".")[-1] in msg or path.rsplit(".", 1)[0] in msg


def test_plan_nulls_for_optional_fields_are_accepted_a_null_exporter_port_is_not():
    e = pf.expect_from(None, _mutated("plan.toolchain.ptx_version", None))
    assert e.host_class.name == "b300" and pf.ptxas_check(e.toolchain)["skipped"]
    doc = _mutated("deployment.ops.exporter_port", None)
    with pytest.raises(pf.PreflightUsageError, match="exporter_port is null"):  # the writer never writes null
        pf.expect_from(None, doc)
    del doc["deployment"]["ops"]["exporter_port"]  # absent: no exporter port to check
    assert [p[3] for p in pf.expect_from(None, doc).ports] == ["ddtree_server.port", "ddtree_server.nccl_port"]
    del doc["rendezvous_port"]  # a plan written before the field: nothing more to check
    assert pf.expect_from(None, doc).ports[1:] == []
    with pytest.raises(pf.PreflightUsageError, match="rendezvous_port is 80"):
        pf.expect_from(None, doc | {"rendezvous_port": 80})


@pytest.mark.parametrize("text, words", [
    ('{"deployment": {"server": {"port": Infinity}}}', "Infinity is not JSON"),
    ('{"a": NaN}', "NaN is not JSON"), ("[" * 200_000 + "]" * 200_000, "nested deeper than"),
    ('{"a": ' + "9" * 5000 + "}", "out of range"), ('"\\u001b]52;c;eA==\\u0007"', "not a plan.json"),
])
def test_load_plan_refuses_what_json_accepts_but_a_plan_is_not(tmp_path, text, words):
    f = tmp_path / "plan.json"
    f.write_text(text)
    with pytest.raises(pf.PreflightUsageError, match=re.escape(words)):
        pf.load_plan(str(f))


def test_cli_and_zipapp_exit_2_on_a_hostile_plan_and_json_on_a_bug(tmp_path, capsys, monkeypatch):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_mutated("deployment.server.port", 10**9)))  # JSON the reader takes; no port
    assert cli_main(["preflight", "--plan", str(plan), "--json"]) == 2
    assert "deployment.server.port" in capsys.readouterr().out
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))
    r = subprocess.run([sys.executable, "-I", "-S", app, "--plan", str(plan), "--json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "deployment.server.port" in json.loads(r.stdout)["checks"][0]["detail"], r.stderr

    def boom(*a, **k):
        raise RuntimeError("unexpected \x1b[2J Bearer SEKRITbug")

    monkeypatch.setattr(pf, "preflight", boom)
    assert pf.main(["--host-class", "b300", "--json"]) == 70
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["checks"][0]["name"] == "internal"
    assert "RuntimeError: unexpected" in doc["checks"][0]["detail"] and "SEKRIT" not in doc["checks"][0]["detail"]


def test_gpu_facts_quoted_from_nvidia_smi_are_cleaned(tmp_path):
    xml = (DERIVED / "b300x8_nvidia_smi_q.xml").read_text()
    name = re.search(r"<product_name>([^<]*)</product_name>", xml)[1]
    (tmp_path / "q.xml").write_text(
        xml.replace(name, name + " &#x9b;2J&#x9d;52;c;eA==&#x9c;&#x202e; token: SEKRITname")
    )  # XML 1.0 admits C1, not ESC
    smi = standin_smi(tmp_path, tmp_path / "q.xml", DERIVED / "b300x8_topo.txt",
                      (DERIVED / "b300x8_query_gpu.csv").read_text())
    r = pf.preflight(pf.expect_from(None, None), smi, root=machine(tmp_path, 8))
    text = json.dumps(r, ensure_ascii=False)
    assert name in text and "SEKRIT" not in text and not re.search("[\x80-\x9f\u202e]", text)


@pytest.mark.parametrize("host_class, cuda, drv", [("ct200", "12.8", "575.57.08"), ("b300", "12.9", "576.02.01")])
def test_a_driver_floor_set_by_the_builds_cuda_wheels_names_the_build_not_the_toolkit(tmp_path, host_class, cuda, drv):
    """SGLang's CUDA 13 wheels (0.5.23's Requires-Dist: cuda-python>=13.0, flashinfer_python[cu13]) need a CUDA 13
    driver whatever toolkit is pinned: 'pin an older toolkit' was the fix printed, which cannot help."""
    from ddtree_ops.config.build_table import BUILD_REQUIRES_CUDA
    from ddtree_ops.config.toolchain import plan_toolchain

    row = BUILD_REQUIRES_CUDA["0.5.23"]
    xml = (GPU / "h200x1_nvidia_smi_q.xml").read_text().replace("580.159.04", drv)
    (tmp_path / "old.xml").write_text(xml)
    smi = standin_smi(tmp_path, tmp_path / "old.xml", GPU / "h200x1_misc.txt", f"{drv}, 9.0\n")
    root = machine(tmp_path, 1, (GPU / "h200x1_proc_driver_version.txt").read_text().replace("580.159.04", drv))
    e = pf.expect_from(host_class, None)
    e.toolchain = plan_toolchain(HOST_CLASSES[host_class].arch, cuda, None, row.cuda_major,
                                 f"SGLang {row.version}: {', '.join(row.requires)}")
    c = _names(pf.preflight(e, smi, root=root))["driver"]
    assert not c["ok"]
    assert f"driver {drv} is older than the SGLang build needs (>= 580.65.06" in c["detail"]
    assert "CUDA 13 wheels" in c["detail"] and f"older than CUDA {cuda} needs" not in c["detail"]
    assert "install driver >= 580.65.06" in c["remediation"]
    assert "pin an older toolkit" not in c["remediation"]
    assert "cannot lower" in c["remediation"] and "ddtree_sglang.version" in c["remediation"]
