"""Host classes as data (``ddtree_ops/config/hosts.py``): the built-in table, the inventory's
``ddtree_host_classes`` merged over it (every field checked, one line per problem), and the way
the host's class reaches plan.json and the preflight on the host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO, base_hostvars

from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.hosts import (
    CLASS_FIELDS,
    HOST_CLASSES,
    HostClass,
    name_problem,
    resolve_host_classes,
)
from ddtree_ops.config.inventory import load_hostvars
from ddtree_ops.config.plandoc_model import PlanDoc, PlanDocError, load_plan
from ddtree_ops.config.toolchain import ARCHS
from ddtree_ops.host import preflight as pf
from ddtree_ops.render.files import plan_document, render_host
from ddtree_ops.sglang.expect import validated_from_plan

GPU = FIXTURES / "gpu"


def errors_of(hv: dict) -> list:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    return [f for f in exc.value.findings if f.level == "error"]


def h200(host_class: str = "h200x8", classes: dict | None = None, **server) -> dict:
    """A DFLASH deployment of SGLang 0.5.23 on an H200 class (tp over every GPU by default)."""
    hv = base_hostvars()
    hv.pop("ddtree_accepted_risks")
    hv["ddtree_host_class"] = host_class
    hv["ddtree_sglang"] = {"source": "pypi", "version": "0.5.23"}
    hv["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "z-lab/Kimi-K2.6-DFlash", "block_size": 8}
    hv["ddtree_server"] = {"tp_size": 8, "max_running_requests": 16, "attention_backend": "triton", **server}
    if classes is not None:
        hv["ddtree_host_classes"] = classes
    return hv


# ---------------------------------------------------------------- the built-in table

def test_b300_and_ct200_are_unchanged():
    """Every fact of the two classes the toolkit shipped with, as before the table grew."""
    b, c = HOST_CLASSES["b300"], HOST_CLASSES["ct200"]
    assert (b.gpu_name, b.gpu_count, b.arch, b.interconnect, b.gpu_memory_gib, b.min_cuda) == (
        "NVIDIA B300 SXM6", 8, "sm_103", "nvlink", 288, "12.9")
    assert (c.gpu_name, c.gpu_count, c.arch, c.interconnect, c.gpu_memory_gib, c.min_cuda) == (
        "NVIDIA RTX PRO 6000 Blackwell", 8, "sm_120", "pcie", 96, "12.8")
    for hc in (b, c):
        assert hc.gpu_name_match == "prefix" and hc.nvlink_bridge_peers == 0
    assert b.matches_name("NVIDIA B300 SXM6 AC") and c.matches_name("NVIDIA RTX PRO 6000 Blackwell Server Edition")


def test_every_built_in_entry_is_complete_consistent_and_sourced():
    table, problems = resolve_host_classes({n: h.as_dict() for n, h in HOST_CLASSES.items()})
    assert problems == [] and table == HOST_CLASSES  # each entry passes the operator's own rules
    for name, hc in HOST_CLASSES.items():
        assert name_problem(name) is None and hc.name == name
        assert hc.min_cuda == ARCHS[hc.arch].min_cuda, name  # the measured ptxas fact, not a second copy
        assert hc.source and ("datasheet" in hc.source or "specifications" in hc.source or "brief" in hc.source), name
        assert "compute-capability table" in hc.source, name


def test_hopper_entries():
    for name in ("h100x8", "h100pciex8", "h200x1", "h200x2", "h200x8", "h200nvlx8"):
        assert HOST_CLASSES[name].arch == "sm_90" and HOST_CLASSES[name].compute_cap == "9.0"
    assert [HOST_CLASSES[n].gpu_count for n in ("h200x1", "h200x2", "h200x8")] == [1, 2, 8]
    assert HOST_CLASSES["h200x1"].min_memory_mib <= 143771  # the real H200's fb_memory_usage/total
    assert HOST_CLASSES["h200x1"].min_memory_mib > 81559  # an H100 80GB is no H200
    assert HOST_CLASSES["h100x8"].min_memory_mib <= 81559
    # "NVIDIA H200" is the SXM part; the PCIe card is "NVIDIA H200 NVL": an exact name, not a prefix
    assert HOST_CLASSES["h200x8"].matches_name("NVIDIA H200")
    assert not HOST_CLASSES["h200x8"].matches_name("NVIDIA H200 NVL")
    assert HOST_CLASSES["h200nvlx8"].matches_name("NVIDIA H200 NVL")
    assert not HOST_CLASSES["h100pciex8"].matches_name("NVIDIA H100 NVL")
    assert (HOST_CLASSES["h100pciex8"].interconnect, HOST_CLASSES["h100pciex8"].nvlink_bridge_peers) == ("pcie", 1)
    assert (HOST_CLASSES["h200nvlx8"].interconnect, HOST_CLASSES["h200nvlx8"].nvlink_bridge_peers) == ("pcie", 3)


def test_a_built_in_hopper_class_validates_and_plans():
    v = validate_hostvars("h1", h200())
    assert v.deployment.host_class_def is HOST_CLASSES["h200x8"]
    assert v.plan.toolchain["arch"] == "sm_90" and v.plan.toolchain["target"] == "sm_90a"
    assert "host_classes" not in plan_document(v)["deployment"]  # a built-in class is not copied into plan.json
    [f] = errors_of(h200("h200x1"))
    assert f.field == "ddtree_server.tp_size" and "the 1 GPUs of a h200x1 host" in f.rule


# ---------------------------------------------------------------- ddtree_host_classes

H200X4 = {"h200x4": {"like": "h200x8", "gpu_count": 4, "source": "our 4-GPU H200 VMs (nvidia-smi, 2026-12-01)"}}


def test_an_operator_class_like_a_built_in_one():
    v = validate_hostvars("h1", h200("h200x4", H200X4, tp_size=4))
    hc = v.deployment.host_class_def
    assert (hc.name, hc.gpu_count, hc.gpu_name, hc.arch, hc.gpu_name_match) == (
        "h200x4", 4, "NVIDIA H200", "sm_90", "exact")
    [f] = errors_of(h200("h200x4", H200X4, tp_size=8))
    assert "the 4 GPUs of a h200x4 host" in f.rule
    units = {f.path.rsplit("/", 1)[-1]: f.content for f in render_host(v)}
    assert units["ddtree-sglang.service"].splitlines()[1] == "# Host h1 (h200x4: 4x NVIDIA H200, sm_90)"
    assert units["ddtree-nvidia-devices.service"].count("nvidia-modprobe -c=") == 3  # GPUs 1..3 (0 with -u)


def test_a_new_class_with_every_field():
    classes = {"lab_h100x2": {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 2, "arch": "sm_90",
                              "interconnect": "nvlink", "gpu_memory_gib": 80}}
    v = validate_hostvars("h1", h200("lab_h100x2", classes, tp_size=2))
    hc = v.deployment.host_class_def
    assert hc == HostClass("lab_h100x2", "NVIDIA H100 80GB HBM3", 2, "sm_90", "nvlink", 80, "12.0")


def test_an_entry_named_like_a_built_in_is_merged_over_it():
    hv = base_hostvars() | {"ddtree_host_classes": {"b300": {"gpu_memory_gib": 270}}}
    v = validate_hostvars("h1", hv)
    hc = v.deployment.host_class_def
    assert (hc.gpu_memory_gib, hc.gpu_count, hc.arch) == (270, 8, "sm_103")
    assert HOST_CLASSES["b300"].gpu_memory_gib == 288  # the built-in table itself is untouched
    assert plan_document(v)["deployment"]["host_classes"] == {"b300": hc.as_dict()}  # the host gets the override


def test_a_class_asking_for_a_newer_toolkit_raises_the_default_and_refuses_older_pins():
    classes = {"h200x4": {**H200X4["h200x4"], "min_cuda": "13.0"}}
    v = validate_hostvars("h1", h200("h200x4", classes, tp_size=4))
    assert v.plan.toolchain["cuda"] == "13.0"
    hv = h200("h200x4", classes, tp_size=4) | {"ddtree_toolchain": {"cuda": "12.9"}}
    [f] = errors_of(hv)
    assert (f.field, f.value) == ("ddtree_toolchain.cuda", "12.9")
    assert "the host class asks for CUDA 13.0 or newer" in f.rule and 'pin cuda: "13.0"' in f.fix


@pytest.mark.parametrize("classes, field, value, words", [
    ({"h200x4": {"like": "h200x8", "gpu_count": 0}}, "ddtree_host_classes.h200x4.gpu_count", 0, "integer 1..64"),
    ({"h200x4": {"like": "h200x8", "gpu_count": "4"}}, "ddtree_host_classes.h200x4.gpu_count", "4", "integer 1..64"),
    ({"h200x4": {"like": "h200x8", "gpu_count": True}}, "ddtree_host_classes.h200x4.gpu_count", True, "integer"),
    ({"h200x4": {"like": "h200x8", "arch": "sm_89"}}, "ddtree_host_classes.h200x4.arch", "sm_89", "ptxas facts"),
    ({"h200x4": {"like": "h200x8", "interconnect": "infiniband"}}, "ddtree_host_classes.h200x4.interconnect",
     "infiniband", "nvlink or pcie"),
    ({"h200x4": {"like": "h200x8", "min_cuda": 12.9}}, "ddtree_host_classes.h200x4.min_cuda", 12.9, "as a string"),
    ({"h200x4": {"like": "h200x8", "gpu_name": "NVIDIA H200\nExecStart=/bin/sh"}},
     "ddtree_host_classes.h200x4.gpu_name", "NVIDIA H200\nExecStart=/bin/sh", "as nvidia-smi prints it"),
    ({"h200x4": {"like": "h200x8", "gpu_name_match": "regex"}}, "ddtree_host_classes.h200x4.gpu_name_match", "regex",
     "prefix or exact"),
    ({"h200x4": {"like": "h200x8", "gpu_memory_gib": 141.5}}, "ddtree_host_classes.h200x4.gpu_memory_gib", 141.5,
     "integer 1..4096"),
    ({"h200x4": {"like": "h200x8", "gpu_cnt": 4}}, "ddtree_host_classes.h200x4.gpu_cnt", 4, "unknown setting"),
    ({"H200x4": {"like": "h200x8"}}, "ddtree_host_classes.H200x4", "H200x4", "lower-case"),
    ({"all": {"like": "h200x8"}}, "ddtree_host_classes.all", "all", "group name the inventory already uses"),
    ({"h200x4": "h200x8"}, "ddtree_host_classes.h200x4", "h200x8", "valid dictionary"),
])
def test_a_bad_field_is_one_line_naming_field_value_rule_and_fix(classes, field, value, words):
    [f] = errors_of(h200("h200x8", classes))
    assert (f.field, f.value) == (field, value) and words in f.rule and f.fix, f
    line = f.message()
    assert "\n" not in line and line.startswith(f"h1: {field} = ") and ". Fix: " in line


@pytest.mark.parametrize("classes, field, value, words, fix", [
    ({"h200x4": {"like": "h300x8", "gpu_count": 4}}, "ddtree_host_classes.h200x4.like", "h300x8",
     "names no host class", "h200x8"),
    ({"h200x4": {"gpu_name": "NVIDIA H200", "gpu_count": 4}}, "ddtree_host_classes.h200x4.arch", None,
     "required for a new class (missing: arch, interconnect, gpu_memory_gib)", "like: h200x8"),
    ({"h200x4": {"like": "h200x8", "min_cuda": "11.8"}}, "ddtree_host_classes.h200x4.min_cuda", "11.8",
     "older than the oldest CUDA whose ptxas knows sm_90a (12.0", "12.0 or newer"),
    ({"h200x4": {"like": "h200x8", "min_cuda": "14.0"}}, "ddtree_host_classes.h200x4.min_cuda", "14.0",
     "newer than every toolkit", "13.0"),
    ({"h200x4": {"like": "h200x8", "nvlink_bridge_peers": 1}}, "ddtree_host_classes.h200x4.nvlink_bridge_peers", 1,
     "0 on an nvlink class", "interconnect: pcie"),
    ({"h200x4": {"like": "h200nvlx8", "gpu_count": 2}}, "ddtree_host_classes.h200x4.nvlink_bridge_peers", 3,
     "below gpu_count (2)", "2-way: 1"),
    ({"a1": {"like": "a2"}, "a2": {"like": "a1"}}, "ddtree_host_classes.a2.like", "a1", "makes a loop", "built-in"),
])
def test_an_entry_that_does_not_resolve_is_one_line_too(classes, field, value, words, fix):
    errors = errors_of(h200("h200x8", classes))
    f = errors[0]
    assert (f.field, f.value) == (field, value) and words in f.rule and fix in f.fix, errors
    assert f.source == "ddtree_ops/config/hosts.py (the host-class table)"


def test_a_refused_class_is_not_also_called_unknown():
    [f] = errors_of(h200("h200x4", {"h200x4": {"like": "h200x8", "min_cuda": "11.8"}}, tp_size=4))
    assert f.field == "ddtree_host_classes.h200x4.min_cuda"
    [f] = errors_of(h200("h300x8"))
    assert f.field == "ddtree_host_class" and "h200x8" in f.fix and "ddtree_host_classes" in f.fix


def test_host_class_groups_know_the_inventory_s_classes():
    hv = h200("h200x8", H200X4) | {"group_names": ["h200x4", "sglang_servers"]}
    [f] = errors_of(hv)
    assert f.field == "ddtree_host_class" and "disagrees with the host's group h200x4" in f.rule


def test_an_inventory_with_its_own_class(tmp_path):
    """group_vars' ddtree_host_classes through Ansible's own loader: the group, validate, render."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(
        {"sglang_servers": {"children": {"h200x4": {"hosts": {"vm-01": {"ansible_host": "10.0.0.9"}}}}}}))
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump({"ddtree_host_classes": H200X4}))
    (inv / "group_vars" / "h200x4.yml").write_text(yaml.safe_dump(
        {k: v for k, v in h200("h200x4", tp_size=4).items()}))
    [(host, hv)] = load_hostvars(inv).items()
    v = validate_hostvars(host, hv)
    assert v.deployment.host_class_def.gpu_count == 4


# ---------------------------------------------------------------- plan.json and the preflight

def _custom_plan(tmp_path: Path, classes=None, host_class="h200x4", **server) -> tuple[dict, Path]:
    v = validate_hostvars("h1", h200(host_class, H200X4 if classes is None else classes, **{"tp_size": 4, **server}))
    doc = plan_document(v)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return doc, path


def test_plan_json_carries_the_host_s_own_class_only(tmp_path):
    classes = {**H200X4, "unused": {"like": "b300"}}
    doc, path = _custom_plan(tmp_path, classes)
    dep = doc["deployment"]
    assert list(dep)[list(dep).index("host_class") + 1] == "host_classes"
    assert list(dep["host_classes"]) == ["h200x4"] and list(dep["host_classes"]["h200x4"]) == list(CLASS_FIELDS)
    assert dep["host_classes"]["h200x4"]["gpu_count"] == 4
    typed = load_plan(path)
    assert typed.host_class == "h200x4" and typed.deployment.host_classes == dep["host_classes"]
    again = validated_from_plan(typed)  # probe-sglang re-validates the stored deployment
    assert again.deployment.host_class_def == validate_hostvars("h1", h200("h200x4", H200X4, tp_size=4)).deployment \
        .host_class_def
    e = pf.expect_from(None, pf.load_plan(str(path)))
    assert e.host_class.name == "h200x4" and e.host_class.gpu_count == 4 and "h200x4" in e.classes
    assert e.toolchain["target"] == "sm_90a"


def standin_smi(tmp: Path, xml: Path, topo: Path, query: str) -> str:
    from test_preflight import standin_smi as real

    return real(tmp, xml, topo, query)


def test_the_preflight_matches_the_real_h200_against_a_class_of_the_plan(tmp_path):
    """An inventory class (a lab's name for the lent machine, like h200x1) reaches the preflight
    only through plan.json; the real 1x H200's nvidia-smi outputs pass it."""
    from test_preflight import machine

    classes = {"lab_h200": {"like": "h200x1", "source": "the lent 1x H200"}}
    doc, path = _custom_plan(tmp_path, classes, "lab_h200", tp_size=1)
    smi = standin_smi(tmp_path, GPU / "h200x1_nvidia_smi_q.xml", GPU / "h200x1_misc.txt",
                      (GPU / "h200x1_query_gpu.csv").read_text())
    root = machine(tmp_path, 1, (GPU / "h200x1_proc_driver_version.txt").read_text())
    e = pf.expect_from(None, doc)
    e.ports = []  # this machine's sockets are not the point here
    r = pf.preflight(e, smi, root=root)
    checks = {c["name"]: c for c in r["checks"]}
    bad = {n: c["detail"] for n, c in checks.items() if not c["ok"]}
    assert bad == {}, bad
    assert r["host_class"] == "lab_h200" and checks["host_class"]["detail"] == "machine matches lab_h200"
    assert r["matches"]["lab_h200"] == [] and r["matches"]["h200x1"] == [] and r["matches"]["h200x8"]
    with pytest.raises(pf.PreflightUsageError, match="a class of the inventory's ddtree_host_classes"):
        pf.expect_from("lab_h200", None)  # without the plan the preflight does not know it


def test_the_zipapp_reads_the_plan_s_class_with_the_standard_library(tmp_path):
    _, path = _custom_plan(tmp_path)
    smi = standin_smi(tmp_path, GPU / "h200x2_nvidia_smi_q.xml", GPU / "h200x2_topo_and_ptxas.txt",
                      "580.159.04, 9.0\n" * 2)
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))
    r = subprocess.run([sys.executable, "-I", "-S", app, "--plan", str(path), "--nvidia-smi", smi, "--json"],
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(r.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert r.returncode == 1 and doc["host_class"] == "h200x4", r.stderr
    assert checks["gpu_count"]["detail"] == "2 GPU(s); h200x4 has 4" and checks["gpu_name"]["ok"]


@pytest.mark.parametrize("entry, field, words", [
    ({"gpu_count": 0}, "deployment.host_classes.h200x4.gpu_count", "integer 1..64"),
    ({"gpu_name": "NVIDIA H200", "gpu_count": 4}, "deployment.host_classes.h200x4.arch", "required for a new class"),
    ("x", "deployment.host_classes.h200x4", "must be an object"),
])
def test_a_hostile_class_in_plan_json_is_refused_by_both_readers_naming_the_field(tmp_path, entry, field, words):
    doc, _ = _custom_plan(tmp_path)
    doc["deployment"]["host_classes"]["h200x4"] = entry if not isinstance(entry, dict) else {
        k: v for k, v in {**doc["deployment"]["host_classes"]["h200x4"], **entry}.items()
        if not (words.startswith("required") and k not in entry)}
    with pytest.raises(pf.PreflightUsageError) as exc:
        pf.expect_from(None, doc)
    assert str(exc.value).startswith(f"--plan: {field} is ") and words in str(exc.value)
    assert "not a plan.json rendered by ddtree-ops" in str(exc.value)
    with pytest.raises(PlanDocError) as typed:
        PlanDoc.of(doc)
    assert typed.value.field == field and words in str(typed.value)


def test_plan_readers_ignore_a_newer_writer_s_class_field(tmp_path):
    doc, _ = _custom_plan(tmp_path)
    doc["deployment"]["host_classes"]["h200x4"]["nvlink_generation"] = 4
    assert pf.expect_from(None, doc).host_class.gpu_count == 4
    assert PlanDoc.of(doc).host_class == "h200x4"


def test_old_plan_documents_still_read():
    """Documents written before host classes were data (no deployment.host_classes) read as before."""
    for f in sorted((FIXTURES / "plan").glob("v1-*.json")):
        assert pf.expect_from(None, json.loads(f.read_text())).host_class.name in ("b300", "ct200")
        assert load_plan(f).host_class in ("b300", "ct200")


# ---------------------------------------------------------------- interconnect with NVLink bridges

def _topo(n: int, nv: set[tuple[int, int]]) -> str:
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\n"
    rows = []
    for i in range(n):
        cells = ["X" if i == j else ("NV12" if (min(i, j), max(i, j)) in nv else "SYS") for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + "\t0-15\n")
    return head + "".join(rows)


@pytest.mark.parametrize("nv, ok_pcie_bridged, ok_nvl", [
    (set(), True, True),  # no bridge at all: bridges are optional
    ({(0, 1), (2, 3), (4, 5), (6, 7)}, True, True),  # 2-way bridges
    ({(a, b) for g in (0, 4) for a in range(g, g + 4) for b in range(a + 1, g + 4)}, False, True),  # 4-way
])
def test_pcie_classes_take_optional_nvlink_bridges(nv, ok_pcie_bridged, ok_nvl):
    from ddtree_ops.host import gpu_facts as gf

    topo = gf.parse_topo(_topo(8, nv))
    assert pf.interconnect_check(HOST_CLASSES["h100pciex8"], 8, topo)["ok"] is ok_pcie_bridged
    assert pf.interconnect_check(HOST_CLASSES["h200nvlx8"], 8, topo)["ok"] is ok_nvl
    assert pf.interconnect_check(HOST_CLASSES["ct200"], 8, topo)["ok"] is (not nv)  # ct200: no NVLink at all
    assert not pf.interconnect_check(HOST_CLASSES["h200x8"], 8, topo)["ok"]  # an SXM board: every pair NV#


def test_inventory_h200_validates_plans_and_renders_for_the_lent_machine(monkeypatch):
    """inventory/h200: one H200 host, SGLang 0.5.17 from PyPI, the config-only tiny models of
    scripts/gpu-acceptance (their configs are read and agree with the inventory: block size 8)."""
    import shutil
    import tempfile

    from ddtree_ops.config.checkpoint import CheckpointReader, validate_with_checkpoints

    # the models where a unit can read them: not under /tmp (PrivateTmp), where a checkout or
    # pytest's tmp_path may live; /dev/shm is allowed (served from RAM)
    models = Path(tempfile.mkdtemp(prefix="ddtree-h200-models-", dir="/dev/shm"))
    try:
        shutil.copytree(REPO / "scripts/gpu-acceptance/models", models, dirs_exist_ok=True)
        monkeypatch.setenv("H200_MODELS_DIR", str(models))  # the inventory's override of the models' directory
        [(host, hv)] = load_hostvars(REPO / "inventory" / "h200").items()
        vc = validate_with_checkpoints(host, hv, CheckpointReader())  # what validate / plan / render run
    finally:
        shutil.rmtree(models, ignore_errors=True)
    d = vc.deployment
    assert (host, d.host_class, d.sglang.version, d.sglang.source) == ("h200-01", "h200x1", "0.5.17", "pypi")
    assert d.model.path == str(models / "tiny-llama")
    assert d.speculative.draft_model_path == str(models / "tiny-dflash")
    assert vc.plan.block_size == 8 and vc.warnings == []
    argv = next(f.content for f in render_host(vc) if f.path.endswith("/ddtree-sglang.service"))
    for flag in ("--tp-size 1", "--speculative-algorithm DFLASH", "--cuda-graph-max-bs-decode 16",
                 "--attention-backend triton", "--load-format dummy", f"--model-path {d.model.path} "):
        assert flag in argv, flag
