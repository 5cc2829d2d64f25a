"""The preflight's NVSwitch fabric check (``fabric``: :func:`ddtree_ops.host.preflight.fabric_check`)
and the host-class field that asks for it (``fabric_registration``).

The inputs replay ``nvidia-smi -q -x`` in the shape the real hosts printed it
(``tests/fixtures/gpu/h200x2_2026-11-30_nvidia_smi_q.xml``: ``<fabric><state>Completed</state>
<status>Success</status><cliqueId>0</cliqueId><clusterUuid>…``) with the ``state`` words NVML's
``nvmlGpuFabricState_t`` has and nvidia-smi prints (NVML API reference, "Fabric definitions":
not supported ``N/A``, ``Not Started``, ``In Progress``, ``Completed``); the failure is the one of
NVIDIA/gpu-operator#2781 (HGX B200: fabric manager exited, every GPU "In Progress", CUDA error
802). ``systemctl show`` is replayed in its ``KEY=value`` form (systemctl(1), ``show -p``).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from helpers import FIXTURES

from ddtree_ops.config.hosts import HOST_CLASSES, field_problem, resolve_host_classes
from ddtree_ops.host import gpu_facts as gf
from ddtree_ops.host import preflight as pf

GPU = FIXTURES / "gpu"
B300_XML = (GPU / "derived" / "b300x8_nvidia_smi_q.xml").read_text()
H200X2_XML = (GPU / "h200x2_2026-11-30_nvidia_smi_q.xml").read_text()
H200X1_XML = (GPU / "h200x1_nvidia_smi_q.xml").read_text()


def _systemctl(tmp: Path, out: str, rc: int = 0) -> str:
    """A stand-in systemctl whose ``show`` prints ``out`` (systemctl show -p KEY's ``KEY=value`` lines)."""
    p = tmp / "systemctl"
    p.write_text(f"#!/bin/sh\ncat <<'EOF'\n{out}\nEOF\nexit {rc}\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


FM_RUNNING = "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success"
FM_FAILED = "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code"
FM_MISSING = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success"


def _with_states(xml: str, states: list[str], status: str | None = None) -> str:
    """``xml`` with the GPUs' fabric ``<state>`` replaced in order (and every ``<status>`` when given)."""
    parts = xml.split("<fabric>")
    out = [parts[0]]
    for part, state in zip(parts[1:], states, strict=True):
        part = part.replace("<state>Completed</state>", f"<state>{state}</state>", 1)
        if status is not None:
            part = part.replace("<status>Success</status>", f"<status>{status}</status>", 1)
        out.append(part)
    return "<fabric>".join(out)


def test_the_parser_reads_each_gpus_fabric_registration():
    smi = gf.parse_smi_xml(H200X2_XML)
    assert [(f.index, f.state, f.status, f.clique) for f in smi.fabric] == [(0, "Completed", "Success", "0"),
                                                                          (1, "Completed", "Success", "0")]
    assert [f.state for f in gf.parse_smi_xml(H200X1_XML).fabric] == ["N/A"]
    no_fabric = gf.parse_smi_xml(H200X1_XML.replace("<fabric>", "<not_fabric>").replace("</fabric>", "</not_fabric>"))
    assert [f.state for f in no_fabric.fabric] == [""]


def test_the_classes_that_need_the_fabric_are_the_nvswitch_ones():
    need = sorted(n for n, hc in HOST_CLASSES.items() if hc.fabric_registration)
    assert need == ["b300", "h100x8", "h200x8"]
    assert all(HOST_CLASSES[n].interconnect == "nvlink" for n in need)


def test_registered_fabric_with_a_running_manager_passes(tmp_path):
    c = pf.fabric_check(HOST_CLASSES["b300"], gf.parse_smi_xml(B300_XML), _systemctl(tmp_path, FM_RUNNING))
    assert c["ok"] and "8 GPU(s) registered" in c["detail"] and "active (running)" in c["detail"], c


def test_in_progress_on_nvlink5_fails_naming_the_fabric_manager_fix(tmp_path):
    """NVIDIA/gpu-operator#2781: the manager exited, every GPU stays In Progress, the driver looks ready."""
    smi = gf.parse_smi_xml(_with_states(B300_XML, ["In Progress"] * 8, status="N/A"))
    c = pf.fabric_check(HOST_CLASSES["b300"], smi, _systemctl(tmp_path, FM_FAILED))
    assert not c["ok"]
    assert "not completed on GPU 0, 1, 2, 3, 4, 5, 6, 7 (State In Progress)" in c["detail"]
    assert "the fabric manager failed (failed (exit-code))" in c["detail"]
    for words in ("systemctl enable --now nvidia-fabricmanager", "mlx5_ib", "error 802", "nvidia-smi -r"):
        assert words in c["remediation"], words


def test_one_gpu_not_started_and_no_fabric_manager_installed(tmp_path):
    states = ["Completed"] * 7 + ["Not Started"]
    c = pf.fabric_check(HOST_CLASSES["h200x8"], gf.parse_smi_xml(_with_states(_eight_h200(), states)),
                        _systemctl(tmp_path, FM_MISSING))
    assert not c["ok"] and "GPU 7 (State Not Started)" in c["detail"] and "is not installed" in c["detail"], c


def test_completed_with_an_error_status_fails(tmp_path):
    smi = gf.parse_smi_xml(_with_states(B300_XML, ["Completed"] * 8, status="Insufficient Resources"))
    c = pf.fabric_check(HOST_CLASSES["b300"], smi, _systemctl(tmp_path, FM_RUNNING))
    assert not c["ok"] and "failed on GPU 0 (Status Insufficient Resources)" in c["detail"], c


def test_a_failed_manager_fails_even_while_the_gpus_are_still_registered(tmp_path):
    c = pf.fabric_check(HOST_CLASSES["b300"], gf.parse_smi_xml(B300_XML), _systemctl(tmp_path, FM_FAILED))
    assert not c["ok"] and c["detail"].startswith("the fabric manager failed"), c


def test_registered_gpus_pass_where_the_manager_runs_elsewhere(tmp_path):
    """A VM given the whole board: the fabric may be managed outside it (no unit here, no systemd)."""
    smi = gf.parse_smi_xml(B300_XML)
    assert pf.fabric_check(HOST_CLASSES["b300"], smi, _systemctl(tmp_path, FM_MISSING))["ok"]
    assert pf.fabric_check(HOST_CLASSES["b300"], smi, str(tmp_path / "no-systemctl"))["ok"]


def test_classes_without_the_field_skip_the_check_whatever_the_gpus_say(tmp_path):
    pending = gf.parse_smi_xml(_with_states(H200X2_XML, ["In Progress"] * 2))
    for hc in (HOST_CLASSES["h200x2"], HOST_CLASSES["ct200"], None):
        c = pf.fabric_check(hc, pending, _systemctl(tmp_path, FM_FAILED))
        assert c["ok"] and c["skipped"], c
    assert not pf.fabric_check(HOST_CLASSES["b300"], None)["ok"]


def test_the_whole_preflight_reports_the_fabric_check(tmp_path):
    """End to end through the stand-in nvidia-smi: a b300 whose GPUs are In Progress fails ``fabric``."""
    from test_preflight import machine, standin_smi

    xml = tmp_path / "q.xml"
    xml.write_text(_with_states(B300_XML, ["In Progress"] * 8, status="N/A"))
    smi = standin_smi(tmp_path, xml, GPU / "derived" / "b300x8_topo.txt",
                      (GPU / "derived" / "b300x8_query_gpu.csv").read_text())
    root = machine(tmp_path, 8, (GPU / "h200x1_proc_driver_version.txt").read_text())
    r = pf.preflight(pf.expect_from("b300", None), smi, root=root)
    c = {x["name"]: x for x in r["checks"]}
    assert not r["ok"] and not c["fabric"]["ok"] and "In Progress" in c["fabric"]["detail"]
    assert c["interconnect"]["ok"]  # topo -m still shows NV18 everywhere: only the fabric check sees it


def _eight_h200() -> str:
    xml = H200X2_XML
    head, _, rest = xml.partition("<gpu ")
    gpus = "<gpu " + rest[: rest.rindex("</nvidia_smi_log>")]
    one = gpus[: gpus.index("</gpu>") + len("</gpu>")]
    return head + "\n".join([one] * 8) + "\n</nvidia_smi_log>\n"


@pytest.mark.parametrize("value", ["yes", 1, 0, "true"])
def test_the_field_is_a_boolean(value):
    assert field_problem("fabric_registration", value) is not None
    assert field_problem("fabric_registration", True) is None


def test_an_inventory_class_sets_it_and_a_pcie_class_may_not():
    classes, errors = resolve_host_classes({"h200x4": {"like": "h200x8", "gpu_count": 4},
                                            "gb_nvl": {"like": "b300", "gpu_count": 4, "fabric_registration": False}})
    assert not errors and classes["h200x4"].fabric_registration and not classes["gb_nvl"].fabric_registration
    _, errors = resolve_host_classes({"pciebox": {"like": "ct200", "fabric_registration": True}})
    assert [e.field for e in errors] == ["ddtree_host_classes.pciebox.fabric_registration"], errors
    assert HOST_CLASSES["b300"].as_dict()["fabric_registration"] is True  # plan.json carries it to the host
