"""``ddtree-ops preflight``: is this machine fit for the deployment, before anything changes?

Runs ON the GPU host (standard library only: the deploy play runs it there as a zipapp built
by :func:`build_zipapp`, with the host's ``python3``, before ddtree-ops is installed; the CLI
runs the same code). It reads the machine, compares it with a host class (the built-in table
:data:`ddtree_ops.config.hosts.HOST_CLASSES`, plus the class a ``plan.json`` defines in
``deployment.host_classes``: one of the inventory's ``ddtree_host_classes``) and, with a
``plan.json``, with one deployment (toolkit, ports, directories), and reports one check per fact.

Checks (stable names, in this order; each ``{name, ok, detail, remediation}``, plus
``skipped: true`` where the check does not apply):

``nvidia_smi``, ``host_class`` (no class given: which class the machine matches),
``gpu_count``, ``gpu_name``, ``compute_capability``, ``gpu_memory``, ``persistence_mode``,
``interconnect``, ``kernel_module``, ``driver``, ``pcie_acs``, ``iommu``, ``device_nodes``,
``fabric`` (classes with ``fabric_registration``),
``ptxas``, ``shm``, ``limits``, ``disk``, ``ports``, ``nccl`` (with ``--nccl-smoke``).

Every command runs with a total deadline and bounded output (:func:`run_bounded`); a missing
``nvidia-smi`` is a failed ``nvidia_smi`` check, not a traceback. Text quoted from a command or
a file (nvidia-smi, the NCCL child, ptxas, systemctl) is cleaned of terminal escapes and control
characters and its secret-looking values redacted (:func:`clean`) before it reaches a check.

Exit codes (:func:`main`): 0 every check passed, 1 a check failed, 2 usage error.

Over 600 lines: the preflight is one program shipped as a zipapp (:data:`ZIPAPP_MODULES`), each
check a function of the host facts gathered once; the runner, the scrubber and the plan fields
are already in :mod:`ddtree_ops._core` and :mod:`ddtree_ops.config.plan_fields`. Splitting the
checks by subsystem (GPU, driver, fabric, limits) is the next step.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import socket
import stat
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .._core.proc import run_bounded
from .._core.scrub import clean_text
from ..config.hosts import HOST_CLASSES, HostClass
from ..config.plan_fields import _VERSION, PlanFieldError, _shown
from ..config.plan_fields import plan_fields as _plan_fields
from ..config.toolchain import ARCHS, CUDA_TOOLKITS, at_least, plan_toolchain, version_key
from . import gpu_facts as gf
from .ports import check_port
from .ptxas import PtxasUsageError, assemble
from .toolkit import QUERY_COMMAND, DriverCheckError, parse_query_gpu

CHECK_NAMES = ("nvidia_smi", "host_class", "gpu_count", "gpu_name", "compute_capability", "gpu_memory",
               "persistence_mode", "interconnect", "kernel_module", "driver", "pcie_acs", "iommu", "device_nodes",
               "fabric", "ptxas", "shm", "limits", "disk", "ports", "nccl")
"""Every check name :func:`preflight` can report (``--skip`` takes these)."""


SHM_MIN_BYTES = 1 << 30
"""Least ``/dev/shm`` size: NCCL's shared-memory transport and PyTorch's multiprocessing put
their buffers there; NVIDIA's container guidance runs GPU jobs with ``--shm-size=1g --ulimit
memlock=-1``, and Docker's 64 MB default makes NCCL fail in ``ncclShmOpen`` (pytorch/tutorials
commit 0ba3e39)."""

SERVICE_MEMLOCK = "infinity"
"""The SGLang unit's ``LimitMEMLOCK`` (``ddtree_ops/templates/sglang.service.j2``)."""

SERVICE_NOFILE = 1048576
"""The SGLang unit's ``LimitNOFILE`` (``ddtree_ops/templates/sglang.service.j2``). The kernel refuses a
``RLIMIT_NOFILE`` above ``fs.nr_open`` (setrlimit(2) EPERM), so the unit fails to start where
``/proc/sys/fs/nr_open`` is lower."""

DISK_MIN_FREE_BYTES = 20 << 30
"""Least free space on the file systems of the model, state and cache directories: JIT caches
(Triton, FlashInfer, torch.compile) and logs of one SGLang service; a project choice, not a
vendor figure (the model itself is not downloaded by ddtree-ops)."""

NCCL_DEADLINE_S = 120.0
"""Default total seconds for the NCCL all-reduce smoke test (init + warm-up + timed runs)."""

ACS_FIX = ("disable PCIe ACS P2P redirect on the GPUs' upstream bridges (BIOS: ACS off; or at each boot "
           "`setpci -s <bridge> ECAP_ACS+6.w=0000` for every bridge above a GPU) and run the IOMMU in "
           "pass-through (kernel command line `iommu=pt`, with `intel_iommu=on` / `amd_iommu=on`), as NCCL's "
           "troubleshooting guide says for PCIe peer-to-peer")


MAX_DETAIL = 2000
"""Characters of a check's detail or remediation kept (longer ones end in ``…``)."""


def clean(text: str, limit: int = MAX_DETAIL) -> str:
    """``text`` made safe to print and to keep: :func:`ddtree_ops._core.scrub.clean_text` (the one
    scrubber: in the CLI it also knows the registered secrets), then cut to ``limit`` characters plus ``…``."""
    text = clean_text(text)
    return text if len(text) <= limit else text[:limit] + "…"


def _check(name: str, ok: bool, detail: str, remediation: str = "", skipped: bool = False) -> dict:
    """One check; ``detail`` and ``remediation`` go through :func:`clean` (they quote commands' output)."""
    c = {"name": name, "ok": ok, "detail": clean(detail), "remediation": "" if ok else clean(remediation)}
    if skipped:
        c["skipped"] = True
    return c


def _skip(name: str, why: str) -> dict:
    return _check(name, True, f"skipped: {why}", skipped=True)


@dataclass
class Expect:
    """What the machine is checked against.

    Attributes:
        host_class: the class, or None (then :func:`preflight` reports which class matches).
        classes: the host-class table the machine is matched against (the built-in one, plus the
            plan's ``deployment.host_classes``).
        toolchain: :func:`ddtree_ops.config.toolchain.plan_toolchain` of the deployment
            (``{}``: derive from the class, or from the GPUs seen when no class is given).
        ports: ``(port, allowed unit or None, bind address or None, inventory field)`` the deployment
            listens on (the HTTP port, the rendezvous port, the exporter port).
        dirs: directories whose file systems need :data:`DISK_MIN_FREE_BYTES` free.
        unit: the SGLang unit (its effective limits are read when it is loaded).
    """

    host_class: HostClass | None = None
    classes: dict[str, HostClass] = field(default_factory=lambda: dict(HOST_CLASSES))
    toolchain: dict = field(default_factory=dict)
    ports: list[tuple[int, str | None, str | None, str]] = field(default_factory=list)
    dirs: list[str] = field(default_factory=lambda: ["/var/cache"])
    unit: str | None = None


class PreflightUsageError(Exception):
    """Bad arguments or an unreadable plan (exit 2); the message is :func:`clean`-ed (it quotes
    paths and plan values)."""

    def __init__(self, message: str, field: str = "", value: object = None, rule: str = "") -> None:
        super().__init__(clean(message))
        self.field, self.value, self.rule = field, value, rule


def plan_fields(plan: dict) -> dict:
    """:func:`ddtree_ops.config.plan_fields.plan_fields`. Raises PreflightUsageError."""
    try:
        return _plan_fields(plan)
    except PlanFieldError as exc:
        raise PreflightUsageError(str(exc), exc.field, exc.value, exc.rule) from None


def expect_from(host_class: str | None, plan: dict | None) -> Expect:
    """Build :class:`Expect` from ``--host-class`` and/or a plan document (``plan.json``,
    its fields checked by :func:`plan_fields`).

    Raises:
        PreflightUsageError: unknown class, a plan that is not ddtree-ops' ``plan.json``, or a
            class that contradicts the plan's.
    """
    e = Expect()
    if host_class is not None and not isinstance(host_class, str):
        raise PreflightUsageError(f"host class {_shown(host_class)}: use one of {', '.join(sorted(e.classes))}")
    if plan is not None:
        f = plan_fields(plan)
        e.toolchain, e.unit, name, e.classes = f["toolchain"], f["unit"], f["host_class"], f["classes"]
        bind = f["host"] or None
        e.ports = [(f["port"], e.unit, bind, "ddtree_server.port")]
        if f["rendezvous_port"] is not None:  # SGLang's TP ranks meet there on any address (--nccl-port)
            e.ports.append((f["rendezvous_port"], e.unit, None, "ddtree_server.nccl_port"))
        if f["dist_init_port"] is not None:  # the other nodes meet rank 0 there (--dist-init-addr)
            e.ports.append((f["dist_init_port"], e.unit, None, "ddtree_server.multinode.dist_init_port"))
        if f["exporter_port"] is not None:
            e.ports.append((f["exporter_port"], f["exporter_unit"], None, "ddtree_ops.exporter_port"))
        model = f["model_path"] or ""
        e.dirs = [p for p in (model if model.startswith("/") else "", f["state"], f["cache"]) if p]
        if host_class is not None and host_class != name:
            raise PreflightUsageError(f"--host-class {host_class[:200]!r} contradicts the plan's host_class {name!r}; "
                                      "give one of them")
        host_class = name
    if host_class is not None:
        if host_class not in e.classes:
            raise PreflightUsageError(f"host class {host_class[:200]!r}: use one of {', '.join(sorted(e.classes))} "
                                      "(a class of the inventory's ddtree_host_classes: give the deployment's --plan)")
        e.host_class = e.classes[host_class]
        if not e.toolchain:
            e.toolchain = plan_toolchain(e.host_class.arch, None, None, min_cuda=e.host_class.min_cuda)
    return e


@dataclass
class Facts:
    """What :func:`gather` read (or why it could not).

    Attributes:
        smi: ``nvidia-smi -q -x`` parsed, with compute capabilities merged from ``--query-gpu``.
        smi_error: why there is no ``smi`` (one line), else ``""``.
        topo: ``nvidia-smi topo -m`` parsed (None: not read; ``topo_error`` says why).
        module: ``/proc/driver/nvidia/version`` parsed (None: ``module_error`` says why).
        cap_error: why the compute capabilities are unknown (``--query-gpu`` failed or printed
            something else), else ``""``.
    """

    smi: gf.SmiReport | None = None
    smi_error: str = ""
    topo: gf.Topology | None = None
    topo_error: str = ""
    module: gf.KernelModule | None = None
    module_error: str = ""
    cap_error: str = ""


def _smi(nvidia_smi: str, args: list[str]) -> tuple[str, str]:
    """``(stdout, error)`` of one nvidia-smi call."""
    r = run_bounded([nvidia_smi, *args])
    if r.rc == 127:
        return "", f"{nvidia_smi} not found or not executable ({r.note})"
    if r.rc != 0 or r.note:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["no output"]
        return "", f"`nvidia-smi {' '.join(args)}` failed (rc {r.rc}{', ' + r.note if r.note else ''}: {last[0][:200]})"
    return r.stdout, ""


_CAP = re.compile(r"\d{1,2}\.\d{1,2}")
"""A compute capability as ``--query-gpu=compute_cap`` prints it (``9.0``, ``10.3``)."""


def gather(nvidia_smi: str = "nvidia-smi", proc: Path = Path("/proc")) -> Facts:
    """Read the GPU facts: ``nvidia-smi -q -x``, ``--query-gpu=driver_version,compute_cap``
    (:data:`ddtree_ops.host.toolkit.QUERY_COMMAND`), ``topo -m`` and the kernel module version."""
    f = Facts()
    text, f.smi_error = _smi(nvidia_smi, ["-q", "-x"])
    if not f.smi_error:
        try:
            f.smi = gf.parse_smi_xml(text)
        except gf.FactsError as exc:
            f.smi_error = str(exc)
    if f.smi is not None:
        q, qerr = _smi(nvidia_smi, QUERY_COMMAND[1:])
        f.cap_error = qerr
        try:
            caps = [g.compute_cap for g in parse_query_gpu(q)] if not qerr else []
        except DriverCheckError as exc:
            caps, f.cap_error = [], str(exc)
        bad = [c for c in caps if not _CAP.fullmatch(c)]
        if bad:  # compute capability is major.minor (10.3): else unknown
            caps, f.cap_error = [], f"--query-gpu printed compute_cap {bad[0][:40]!r}, not major.minor such as 10.3"
        if caps and len(caps) != len(f.smi.gpus):
            f.cap_error = f"--query-gpu listed {len(caps)} GPU(s), -q -x {len(f.smi.gpus)}"
        if len(caps) == len(f.smi.gpus):
            f.smi.gpus[:] = [
                gf.GpuFacts(**{**g.__dict__, "compute_cap": c}) for g, c in zip(f.smi.gpus, caps, strict=True)
            ]
        topo, f.topo_error = _smi(nvidia_smi, ["topo", "-m"])
        if not f.topo_error:
            try:
                f.topo = gf.parse_topo(topo)
            except gf.FactsError as exc:
                f.topo_error = str(exc)
    try:
        f.module = gf.parse_proc_version((proc / "driver/nvidia/version").read_text(errors="replace")[:4096])
    except OSError as exc:
        f.module_error = f"{proc}/driver/nvidia/version: {exc.strerror or exc} (the NVIDIA kernel module is not loaded)"
    except gf.FactsError as exc:
        f.module_error = str(exc)
    return f


def match_classes(smi: gf.SmiReport, topo: gf.Topology | None, topo_error: str = "",
                  classes: dict[str, HostClass] | None = None) -> dict[str, list[str]]:
    """For each host class of ``classes`` (default: the built-in table), the ways the machine
    differs from it (empty list: it matches)."""
    out = {}
    for name, hc in sorted((HOST_CLASSES if classes is None else classes).items()):
        out[name] = [c["detail"] for c in gpu_checks(hc, smi, topo, topo_error) if not c["ok"]]
    return out


def gpu_checks(hc: HostClass, smi: gf.SmiReport, topo: gf.Topology | None, topo_error: str = "") -> list[dict]:
    """``gpu_count`` .. ``persistence_mode`` and ``interconnect`` of ``smi``/``topo`` against ``hc``."""
    g = smi.gpus
    names = sorted({x.name for x in g})
    caps = sorted({x.compute_cap or "unknown" for x in g})
    mem = min((x.memory_mib for x in g), default=0)
    off = [x.index for x in g if not x.persistence]
    fix_class = f"deploy this host with the host class it is (ddtree_host_class), or use a {hc.name} machine"
    checks = [
        _check(
            "gpu_count",
            len(g) == hc.gpu_count,
            f"{len(g)} GPU(s); {hc.name} has {hc.gpu_count}",
            f"{fix_class}; a GPU missing from nvidia-smi is a hardware or driver fault (dmesg, `nvidia-smi -q`)",
        ),
        _check(
            "gpu_name",
            bool(g) and all(hc.matches_name(x.name) for x in g),
            f"{', '.join(names) or 'no GPU'}; {hc.name} is {hc.gpu_name}{'*' if hc.gpu_name_match == 'prefix' else ''}",
            fix_class,
        ),
        _check(
            "compute_capability",
            caps == [hc.compute_cap],
            f"compute capability {', '.join(caps) or 'unknown'}; {hc.name} is {hc.compute_cap} ({hc.arch})",
            fix_class,
        ),
        _check(
            "gpu_memory",
            bool(g) and mem >= hc.min_memory_mib,
            f"least GPU memory {mem} MiB; {hc.name} needs >= {hc.min_memory_mib} MiB ({hc.gpu_memory_gib} GB)",
            fix_class,
        ),
        _check(
            "persistence_mode",
            bool(g) and not off,
            "persistence mode on for every GPU"
            if g and not off
            else f"persistence mode off on GPU {', '.join(map(str, off))}"
            if g
            else "no GPU",
            "enable it (`nvidia-smi -pm 1`, or run nvidia-persistenced): without it the driver tears the GPUs "
            "down between processes and SGLang's start pays the re-initialisation",
        ),
    ]
    checks.append(interconnect_check(hc, len(g), topo, topo_error))
    return checks


def interconnect_check(hc: HostClass, count: int, topo: gf.Topology | None, topo_error: str = "") -> dict:
    """``nvlink`` class: every GPU pair ``NV#``; ``pcie``: no GPU is ``NV#`` to more than
    :attr:`~ddtree_ops.config.hosts.HostClass.nvlink_bridge_peers` others (0: no pair is;
    bridges optional: a bridge-less machine passes too) (``topo -m``)."""
    if count < 2:
        return _check("interconnect", hc.gpu_count < 2, f"{count} GPU: no GPU pair to connect; {hc.name} is "
                      f"{hc.interconnect} between {hc.gpu_count} GPUs", f"use a {hc.name} machine")
    if topo is None:
        return _check("interconnect", False, f"nvidia-smi topo -m unreadable: {topo_error}",
                      "run `nvidia-smi topo -m` on the host and fix what it reports")
    kinds = sorted(topo.kinds())
    nv = [v for v in topo.links.values() if v.startswith("NV")]
    if hc.interconnect == "nvlink":
        ok = len(nv) == len(topo.links)
        detail = (f"GPU pairs: {', '.join(kinds)}; {hc.name} needs NVLink (NV#) between every pair"
                  + ("" if ok else f" ({len(topo.links) - len(nv)} of {len(topo.links)} ordered pairs are not)"))
        return _check("interconnect", ok, detail, "check the NVLink/NVSwitch fabric (`nvidia-smi nvlink -s`, "
                      "nvidia-fabricmanager running, `nvidia-smi -q` fabric state), or deploy as a PCIe class")
    if not hc.nvlink_bridge_peers:
        ok = not nv
        return _check("interconnect", ok, f"GPU pairs: {', '.join(kinds)}; {hc.name} is PCIe only "
                      "(PIX/PXB/PHB/NODE/SYS)", f"an NVLink machine is not a {hc.name}: use its own host class")
    peers: dict[int, int] = {}
    for (i, _j), v in topo.links.items():
        if v.startswith("NV"):
            peers[i] = peers.get(i, 0) + 1
    over = sorted(f"GPU{i} ({n})" for i, n in peers.items() if n > hc.nvlink_bridge_peers)
    return _check("interconnect", not over, f"GPU pairs: {', '.join(kinds)}; {hc.name} is PCIe with optional NVLink "
                  f"bridges (each GPU bridged to at most {hc.nvlink_bridge_peers} other"
                  f"{'s' if hc.nvlink_bridge_peers > 1 else ''})" + (f"; NVLink to more peers: {', '.join(over)}"
                                                                       if over else ""),
                  f"a machine whose GPUs share more NVLink peers is not a {hc.name}: use its own host class")


def acs_iommu_checks(bus_ids: list[str], sys_root: Path = Path("/sys")) -> list[dict]:
    """``pcie_acs`` and ``iommu`` for the GPUs at ``bus_ids`` (nvidia-smi form).

    ``pcie_acs``: every PCIe bridge above a GPU (its sysfs path,
    ``/sys/bus/pci/devices/<bdf>`` resolved) has ACS P2P Request/Completion Redirect off
    (:func:`ddtree_ops.host.gpu_facts.acs_control` on its ``config``). ``iommu``: the GPUs'
    IOMMU groups are ``identity`` (pass-through) or there is no IOMMU group (IOMMU off).
    """
    redirect, unread, domains = [], [], {}
    for bus in bus_ids:
        try:
            bdf = gf.parse_bdf(bus)
        except gf.FactsError as exc:
            unread.append(str(exc))
            continue
        dev = sys_root / "bus/pci/devices" / bdf
        try:
            real = Path(os.path.realpath(dev))
        except OSError:
            real = dev
        if not real.exists():
            unread.append(f"{bdf}: not in {sys_root}/bus/pci/devices")
            continue
        for bridge in [p for p in real.parents if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", p.name)]:
            try:
                with open(bridge / "config", "rb") as fh:
                    cfg = fh.read(4096)
                ctrl = gf.acs_control(cfg)
            except (OSError, gf.FactsError) as exc:
                unread.append(f"{bridge.name}: {getattr(exc, 'strerror', None) or exc}")
                continue
            if ctrl is None and len(cfg) <= 256:
                unread.append(f"{bridge.name}: only {len(cfg)} bytes of config space readable (run as root)")
            elif ctrl is not None and ctrl & (gf.ACS_REQUEST_REDIRECT | gf.ACS_COMPLETION_REDIRECT):
                redirect.append(f"{bridge.name} (ACSCtl {ctrl:#06x}) above GPU {bdf}")
        try:
            group = Path(os.path.realpath(dev / "iommu_group"))
            domains[bdf] = (group / "type").read_text().strip() if (dev / "iommu_group").exists() else "none"
        except OSError:
            domains[bdf] = "unknown"
    if redirect:
        acs = _check("pcie_acs", False, f"ACS P2P redirect is on at {'; '.join(redirect)}: GPU peer traffic goes "
                     "through the root complex (NCCL hangs or crawls)", ACS_FIX)
    elif unread:
        acs = _check("pcie_acs", False, f"cannot read the GPUs' upstream bridges: {'; '.join(unread)[:400]}",
                     "run preflight as root (the PCIe extended configuration space is root-only)")
    else:
        acs = _check("pcie_acs", True, f"no ACS P2P redirect on the bridges above {len(bus_ids)} GPU(s)")
    translated = {b: t for b, t in domains.items() if t not in ("identity", "none")}
    iommu = _check("iommu", not translated,
                   "IOMMU off or pass-through for every GPU" if not translated else
                   f"IOMMU translates GPU DMA ({', '.join(f'{b}: {t}' for b, t in sorted(translated.items()))}): "
                   "PCIe peer-to-peer is redirected or refused", ACS_FIX)
    return [acs, iommu]


def device_node_check(count: int, dev: Path = Path("/dev")) -> dict:
    """``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and ``/dev/nvidia0..count-1`` are character devices."""
    want = ["nvidiactl", "nvidia-uvm", *[f"nvidia{i}" for i in range(count)]]
    missing = []
    for n in want:
        try:
            if not stat.S_ISCHR(os.stat(dev / n).st_mode):
                missing.append(f"{n} (not a character device)")
        except OSError:
            missing.append(n)
    return _check("device_nodes", not missing,
                  f"{dev}/{{{', '.join(want)}}} present" if not missing else f"missing in {dev}: {', '.join(missing)}",
                  "create them with `nvidia-modprobe -u -c=0` (and `-c=N` per GPU), as ddtree-nvidia-devices.service "
                  "does at boot once deployed; /dev/nvidia-uvm needs the nvidia_uvm module (`modprobe nvidia-uvm`)")


FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"
"""The systemd unit of NVIDIA's fabric manager (the ``nvidia-fabricmanager`` package)."""

FABRIC_FIX = ("start the fabric manager of the driver's exact version (`systemctl enable --now nvidia-fabricmanager`; "
              "its log: `journalctl -u nvidia-fabricmanager -b`); on NVLink5 boards (B200/B300) it needs the "
              "NVSwitches' InfiniBand stack too (`modprobe mlx5_ib ib_umad`, NVLSM); once it runs, every GPU "
              "should reach Fabric State Completed (`nvidia-smi -q | grep -A4 Fabric`), else reset them "
              "(`nvidia-smi -r`) or reboot. Until then CUDA fails with error 802 (system not yet initialized)")


def fabric_manager_state(systemctl: str = "systemctl") -> tuple[str, str]:
    """``(state, error)`` of :data:`FABRIC_MANAGER_UNIT`: ``state`` is ``active (running)``,
    ``failed (exit-code)``, ``not installed`` and the like (``systemctl show``'s LoadState /
    ActiveState / SubState / Result); ``error`` says why it could not be read (no systemd)."""
    r = run_bounded([systemctl, "show", FABRIC_MANAGER_UNIT, "-p", "LoadState", "-p", "ActiveState",
                     "-p", "SubState", "-p", "Result"], 10, 65536)
    props = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
    if r.rc != 0 or "LoadState" not in props:
        last = (r.stderr.strip() or r.note or f"rc {r.rc}").splitlines()[-1:] or ["no output"]
        return "", f"systemctl show {FABRIC_MANAGER_UNIT} failed: {last[0][:200]}"
    if props["LoadState"] == "not-found":
        return "not installed", ""
    state = f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')})"
    if props.get("ActiveState") == "failed" and props.get("Result") not in (None, "", "success"):
        state = f"failed ({props['Result']})"
    return clean(state, 80), ""


def fabric_check(hc: HostClass | None, smi: gf.SmiReport | None, systemctl: str = "systemctl") -> dict:
    """``fabric``: for a class with :attr:`~ddtree_ops.config.hosts.HostClass.fabric_registration`,
    every GPU's NVSwitch fabric registration (``nvidia-smi -q -x`` ``<fabric>``) must be
    ``Completed`` with status ``Success``, and the fabric manager's unit must not have failed.

    Sources: NVML ``nvmlGpuFabricInfo_t`` (state NOT_SUPPORTED / NOT_STARTED / IN_PROGRESS /
    COMPLETED; "status must be checked only if state returns complete"); NVIDIA/gpu-operator#2781
    (HGX B200: the fabric manager exited, the driver looked ready, every GPU stayed "In
    Progress" and CUDA failed with error 802). The fabric manager may run outside this machine
    (a hypervisor's service VM), so a missing unit fails only while a GPU is unregistered.
    """
    if hc is None or not hc.fabric_registration:
        why = f"{hc.name} needs no NVSwitch fabric registration" if hc else "no host class given"
        return _skip("fabric", why)
    if smi is None:
        return _check("fabric", False, "not checked: nvidia_smi failed", FABRIC_FIX)
    gpus = smi.fabric
    pending = [g for g in gpus if g.state != "Completed"]
    failed = [g for g in gpus if g.state == "Completed" and g.status != "Success"]
    fm, fm_error = fabric_manager_state(systemctl)
    fm_text = f"{FABRIC_MANAGER_UNIT}: {fm or fm_error}"
    problems = []
    if not gpus:
        problems.append("no GPU listed")
    if pending:
        states = sorted({g.state or "not reported" for g in pending})
        problems.append(f"fabric registration not completed on GPU {', '.join(str(g.index) for g in pending)} "
                        f"(State {' / '.join(states)})")
    if failed:
        problems.append("fabric registration failed on " + ", ".join(
            f"GPU {g.index} (Status {g.status or 'not reported'})" for g in failed))
    if fm.startswith("failed"):
        problems.append(f"the fabric manager failed ({fm})")
    elif problems and not fm.startswith("active"):
        problems.append(f"the fabric manager is {fm or 'unreadable'}")
    if problems:
        return _check("fabric", False, f"{'; '.join(problems)}; {fm_text}", FABRIC_FIX)
    cliques = sorted({g.clique for g in gpus if g.clique})
    return _check("fabric", True, f"{len(gpus)} GPU(s) registered (State Completed, Status Success"
                  + (f", clique {', '.join(cliques)[:80]}" if cliques else "") + f"); {fm_text}")


def driver_checks(facts: Facts, toolchain: dict, arch: str | None) -> list[dict]:
    """``kernel_module`` (loaded; open modules on Blackwell) and ``driver`` (>= the toolkit's floor,
    the same version in kernel and user space, the CUDA it supports >= the toolkit).

    Source for the open modules: NVIDIA, "NVIDIA Transitions Fully Towards Open-Source GPU Kernel
    Modules" (2024): Grace Hopper and Blackwell are supported by the open GPU kernel modules only.
    """
    out = []
    m, smi = facts.module, facts.smi
    if m is None:
        out.append(_check("kernel_module", False, facts.module_error,
                          "install the NVIDIA driver and load it (`modprobe nvidia`; reboot after a driver install)"))
    else:
        need_open = arch is not None and ARCHS.get(arch) is not None and ARCHS[arch].number >= 100
        ok = m.flavor == "open" or not need_open
        out.append(
            _check(
                "kernel_module",
                ok,
                f"{m.flavor} kernel module {m.version}"
                + (f"; {arch} (Blackwell) is supported by NVIDIA's open kernel modules only" if need_open else ""),
                "install the open kernel module flavour of the same driver (e.g. nvidia-open / "
                "`nvidia-driver-<ver>-open`) and reboot",
            )
        )
    drv = smi.driver_version if smi else ""
    problems = []
    if not drv:
        problems.append("no driver version (nvidia-smi unreadable)")
    floor = toolchain.get("min_driver")
    toolkit_floor = toolchain.get("toolkit_min_driver")
    # the plan raises the floor above the toolkit's when the SGLang build's wheels need a newer CUDA major
    # (plan_toolchain: cu13 wheels need a CUDA 13 driver whatever toolkit is pinned); then the build, not the
    # toolkit, is what the driver is too old for, and pinning another toolkit cannot help
    build_floor = bool(floor and toolkit_floor and floor != toolkit_floor)
    too_old = bool(drv and floor and not at_least(drv, floor))
    if too_old and build_floor:
        problems.append(f"driver {drv} is older than the SGLang build needs (>= {floor}: "
                        f"{toolchain.get('min_driver_reason') or 'its wheels need a newer CUDA'}); toolkit "
                        f"{toolchain.get('cuda')} alone would run on >= {toolkit_floor}, but the wheels bring "
                        "their own CUDA runtime")
    elif too_old:
        problems.append(f"driver {drv} is older than CUDA {toolchain.get('cuda')} needs (>= {floor}, NVIDIA CUDA "
                        "release notes)")
    if drv and m is not None and m.version != drv:
        problems.append(f"kernel module {m.version} but nvidia-smi (user space) {drv}: a driver upgrade is half done")
    cuda = toolchain.get("cuda")
    if drv and smi and cuda and _VERSION.fullmatch(smi.cuda_version) and not at_least(smi.cuda_version, cuda):
        problems.append(f"the driver supports CUDA {smi.cuda_version}, older than the pinned toolkit {cuda}")
    detail = "; ".join(problems) if problems else (
        f"driver {drv} (CUDA {smi.cuda_version or '?'})" + (f" >= {floor} for CUDA {cuda}" if floor else ""))
    fix = (f"install driver >= {floor or CUDA_TOOLKITS[max(CUDA_TOOLKITS, key=version_key)].min_driver} and reboot "
           "(a half-done upgrade needs the reboot)")
    if too_old and build_floor:
        fix += ("; the floor is the SGLang build's (its wheels' CUDA), so another ddtree_toolchain.cuda cannot lower "
                f"it: only an SGLang build whose wheels need a CUDA that driver {drv} supports can (ddtree_sglang."
                "version / source; the build's METADATA Requires-Dist names its CUDA)")
    else:
        fix += ", or pin an older toolkit in ddtree_toolchain.cuda if the arch allows"
    out.append(_check("driver", not problems, detail, fix))
    return out


def ptxas_check(toolchain: dict) -> dict:
    """The ptxas the service will use (the toolkit's, which the plan's ``TRITON_PTXAS_*`` point
    at) assembles the arch's target (:func:`ddtree_ops.host.ptxas.assemble`). Skipped when that
    toolkit is not installed yet (the ``cuda_toolkit`` role installs it; the ``triton`` role's
    check assembles with Triton's own choice after the install)."""
    path, target, ptx = toolchain.get("ptxas"), toolchain.get("target"), toolchain.get("ptx_version")
    env = toolchain.get("ptxas_env") or {}
    path = next(iter(env.values()), path) if env else path
    if not path or not target or not ptx:
        return _skip("ptxas", "no toolchain: give --host-class or --plan")
    if not os.path.exists(path):
        return _skip("ptxas", f"{path} is not installed yet (the cuda_toolkit role installs CUDA "
                              f"{toolchain.get('cuda')}); the triton role checks it after the install")
    try:
        r = assemble(path, target, ptx)
    except PtxasUsageError as exc:
        return _check("ptxas", False, str(exc), f"reinstall {toolchain.get('package') or 'the CUDA toolkit'}")
    return _check("ptxas", r["ok"], f"ptxas {r['version']} ({path}) "
                  + ("assembled" if r["ok"] else "cannot assemble")
                  + f" .version {ptx} .target {target}" + ("" if r["ok"] else f": {r['output'][:300]}"),
                  f"install CUDA >= {ARCHS[toolchain['arch']].min_cuda if toolchain.get('arch') in ARCHS else '?'} and "
                  "point TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH at its ptxas (ddtree_toolchain.cuda)")


def shm_check(size_bytes: int | None, path: str = "/dev/shm", error: str = "") -> dict:
    """``/dev/shm`` is at least :data:`SHM_MIN_BYTES`."""
    if size_bytes is None:
        return _check(
            "shm", False, f"{path}: {error or 'unreadable'}", "mount a tmpfs on /dev/shm (systemd does by default)"
        )
    return _check("shm", size_bytes >= SHM_MIN_BYTES,
                  f"{path} is {size_bytes / (1 << 20):.0f} MiB; NCCL and PyTorch need >= {SHM_MIN_BYTES >> 20} MiB",
                  f"enlarge it: `mount -o remount,size=16G {path}` now, and the size= option of its /etc/fstab "
                  "line (in a container: --shm-size=16g / --ipc=host)")


def limits_check(nr_open: int | None, unit_limits: dict | None = None, unit: str | None = None) -> dict:
    """``fs.nr_open`` admits :data:`SERVICE_NOFILE`; where the unit is already loaded (a redeploy),
    its effective ``LimitNOFILE`` >= :data:`SERVICE_NOFILE` and ``LimitMEMLOCK`` ``infinity``
    (:data:`SERVICE_MEMLOCK`; ``systemctl show``). A unit not loaded yet gets both from its file
    (systemd, as root, may raise any limit but ``nofile`` above ``fs.nr_open``)."""
    if nr_open is None:
        return _check("limits", False, "/proc/sys/fs/nr_open unreadable", "run preflight on the host itself")
    problems = []
    if nr_open < SERVICE_NOFILE:
        problems.append(f"fs.nr_open is {nr_open}, below the unit's LimitNOFILE={SERVICE_NOFILE}: the start fails")
    got = unit_limits or {}
    nofile, memlock = got.get("LimitNOFILE"), got.get("LimitMEMLOCK")
    if nofile and nofile != "infinity" and (not nofile.isdigit() or int(nofile) < SERVICE_NOFILE):
        problems.append(f"{unit} runs with LimitNOFILE={nofile[:40]}, below {SERVICE_NOFILE}")
    if memlock and memlock != SERVICE_MEMLOCK:
        problems.append(f"{unit} runs with LimitMEMLOCK={memlock[:40]}, not {SERVICE_MEMLOCK} (NCCL and CUDA pin "
                        "host memory)")
    shown = "".join(f"; {unit} {k}={v[:40]}" for k, v in sorted(got.items()))
    return _check("limits", not problems, "; ".join(problems) or
                  f"fs.nr_open {nr_open} admits LimitNOFILE={SERVICE_NOFILE}{shown}",
                  f"`sysctl -w fs.nr_open={SERVICE_NOFILE}` and persist it in /etc/sysctl.d/; a unit running with "
                  "other limits has a drop-in overriding LimitNOFILE/LimitMEMLOCK (`systemctl cat` it): remove it "
                  "and redeploy")


def disk_check(dirs: list[str], min_free: int | None = None) -> dict:
    """Each directory's file system (its nearest existing ancestor) has ``min_free`` bytes free
    (default :data:`DISK_MIN_FREE_BYTES`)."""
    need = DISK_MIN_FREE_BYTES if min_free is None else min_free
    seen, low, shown = set(), [], []
    for d in dirs:
        p = Path(d)
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
        except OSError as exc:
            low.append(f"{d}: {exc.strerror or exc}")
            continue
        key = st.f_fsid if hasattr(st, "f_fsid") else str(p)
        free = st.f_bavail * st.f_frsize
        if key in seen:
            continue
        seen.add(key)
        shown.append(f"{d} ({p}: {free / (1 << 30):.1f} GiB free)")
        if free < need:
            low.append(f"{d} has {free / (1 << 30):.1f} GiB free on {p}")
    return _check("disk", not low, ("; ".join(low) + f"; need >= {need / (1 << 30):g} GiB") if low else
                  f"{'; '.join(shown)}: >= {need / (1 << 30):g} GiB each",
                  "free space there (old caches: ~/.cache/flashinfer, Triton cache, journald) or move the "
                  "directories (ddtree_service paths) to a larger disk; a deployment that needs less sets "
                  "ddtree_service_preflight_disk_min_free_gib (--disk-min-free-gib)")


def _ip_or_none(host: str | None) -> str | None:
    """``host`` if it is an IP address; None (any address: the strictest check) for a host name."""
    try:
        return str(ipaddress.ip_address(host)) if host else None
    except ValueError:
        return None


def ports_check(ports: list[tuple], proc: Path = Path("/proc")) -> dict:
    """Each port is free or held by its own unit (:func:`ddtree_ops.host.ports.check_port`):
    ``(port, unit, host[, field])``, ``field`` the inventory field that sets it (named in the fix)."""
    if not ports:
        return _skip("ports", "no deployment given (--plan)")
    bad, good, fields = [], [], []
    for port, unit, host, *rest in ports:
        field_name = rest[0] if rest else None
        try:
            r = check_port(port, unit or "ddtree-unknown.service", proc, _ip_or_none(host), field_name)
        except ValueError as exc:
            bad.append(str(exc))
            continue
        (good if r.ok else bad).append(r.detail)
        if not r.ok and field_name:
            fields.append(field_name)
    return _check("ports", not bad, "; ".join(bad or good),
                  "stop the process holding the port or set another port in the inventory "
                  f"({' / '.join(fields) if fields else 'ddtree_server.port / ddtree_ops.exporter_port'})")


_NCCL_CHILD = r"""
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def work(rank, world, port, mib, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    y = torch.ones(1024, dtype=torch.float32, device="cuda")
    dist.all_reduce(y)
    ok = bool((y == world).all().item())
    x = torch.ones(mib << 18, dtype=torch.float32, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t = time.perf_counter(); n = 10
    for _ in range(n):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / n
    if rank == 0:
        q.put({"world": world, "bytes": x.numel() * 4, "seconds": dt, "correct": ok,
               "busbw_gbps": x.numel() * 4 * 2 * (world - 1) / world / dt / 1e9 if world > 1 else None,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__})
    dist.destroy_process_group()

if __name__ == "__main__":
    world, port, mib = (int(a) for a in sys.argv[1:4])
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(work, args=(world, port, mib, q), nprocs=world, join=True)
    print(json.dumps(q.get()))
"""


def nccl_check(python: str, gpus: int, deadline_s: float = NCCL_DEADLINE_S, mib: int = 64) -> dict:
    """All-reduce ``mib`` MiB with NCCL (``NCCL_NVLS_ENABLE=0``) over the GPUs ``python``'s torch
    sees (``torch.cuda.device_count()``, so ``CUDA_VISIBLE_DEVICES`` applies), in its own process
    group. ``deadline_s`` is the TOTAL for the torch probe and the all-reduce together; what
    runs past it is killed and the check fails (for the all-reduce the ACS/IOMMU fix is the
    remediation: a peer-to-peer path that hangs is the usual cause; for the probe, a CUDA
    init that hangs). Skipped (ok) only where ``python`` has no torch module or nvidia-smi
    lists no GPU (``gpus``); failed where the probe fails otherwise, torch sees no CUDA device
    although there are GPUs, or the child prints no result of the shape :func:`_nccl_result` reads.
    Both commands run through :func:`run_bounded` (their process group is killed after each); a
    process that ``setsid()``s away from it is out of reach (no cgroup: best effort)."""
    if gpus < 1:
        return _skip("nccl", "no GPU")
    end = time.monotonic() + deadline_s
    probe = run_bounded([python, "-c", "import torch, torch.distributed; print(torch.cuda.device_count())"],
                        deadline_s)
    last = (probe.stderr.strip().splitlines() or [probe.note or "no output"])[-1][:300]
    if probe.rc == 124:
        return _check("nccl", False, f"the torch probe of {python} (import torch; torch.cuda.device_count()) did not "
                      f"answer within the {deadline_s:g} s deadline (killed): CUDA initialisation hangs",
                      "run `nvidia-smi` and the probe by hand; a hung CUDA init is a driver/GPU fault (dmesg: Xid), "
                      "or raise --nccl-deadline on a slow file system")
    if probe.rc != 0 and re.search(r"No module named '?torch'?", probe.stderr):
        return _skip("nccl", f"no torch in {python} ({last[:160]})")
    if probe.rc != 0:
        return _check("nccl", False, f"the torch probe of {python} failed (rc {probe.rc}: {last})",
                      "give --nccl-python an interpreter whose torch imports (its error is above), or leave out "
                      "--nccl-smoke")
    seen = (probe.stdout.strip().splitlines() or [""])[-1].strip()
    if not re.fullmatch(r"\d{1,4}", seen) or int(seen) < 1:
        return _check("nccl", False, f"torch in {python} sees no CUDA device (device_count {seen[:40]!r}) on a host "
                      f"with {gpus} GPU(s)", "install a torch build for this CUDA driver (e.g. the cu130 wheels), and "
                      "check CUDA_VISIBLE_DEVICES and /dev/nvidia* permissions")
    gpus = int(seen)
    left = end - time.monotonic()
    if left <= 0.5:
        return _check("nccl", False, f"the torch probe used the whole {deadline_s:g} s deadline: no time left for "
                      "the all-reduce", "raise --nccl-deadline")
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    with tempfile.TemporaryDirectory(prefix="ddtree-nccl-") as tmp:
        script = Path(tmp) / "nccl_smoke.py"
        script.write_text(_NCCL_CHILD)
        with socket.socket() as s:  # a free loopback port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        r = run_bounded([python, str(script), str(gpus), str(port), str(mib)], left, env=env)
    if r.rc == 124:
        return _check("nccl", False, f"all-reduce over {gpus} GPU(s) did not finish in {deadline_s:g} s (killed)",
                      ACS_FIX)
    try:
        res = _nccl_result(json.loads((r.stdout.strip().splitlines() or [""])[-1]))
    except (ValueError, RecursionError):
        res = None
    if r.rc != 0 or res is None:
        last = (r.stderr.strip().splitlines() or [r.note or "no output"])[-1][:300]
        why = f"failed (rc {r.rc}): {last}" if r.rc != 0 else (
            f"printed no result of the expected shape ({{world, bytes, seconds, correct, busbw_gbps}}; last line "
            f"{(r.stdout.strip().splitlines() or [''])[-1][:200]!r})")
        return _check("nccl", False, f"all-reduce over {gpus} GPU(s) {why}",
                      "read the NCCL error above (NCCL_DEBUG=WARN); if it names P2P or SHM, " + ACS_FIX)
    if res["world"] != gpus:
        return _check("nccl", False, f"all-reduce over {gpus} GPU(s) reported {res['world']} rank(s): not every GPU "
                      "took part", "read the NCCL output (NCCL_DEBUG=WARN); a GPU missing from the ring is a driver "
                      "or link fault (nvidia-smi -q, dmesg: Xid)")
    bw = res["busbw_gbps"]
    return _check("nccl", res["correct"],
                  f"all-reduce of {res['bytes'] >> 20} MiB over {res['world']} GPU(s): {res['seconds'] * 1e3:.2f} ms"
                  + (f", bus bandwidth {bw:.1f} GB/s" if bw else "") + f" (NCCL {res['nccl']}, torch "
                  f"{res['torch']}, NCCL_NVLS_ENABLE=0)" + ("" if res["correct"] else "; WRONG SUM"),
                  "the all-reduce summed wrongly: a GPU or link fault; run nvidia-smi -q and dcgmi diag")


def _nccl_result(doc: object) -> dict:
    """The NCCL child's result line (:data:`_NCCL_CHILD`) checked for shape: ``world`` int 1..4096,
    ``bytes`` int >= 0, ``seconds`` finite number > 0, ``correct`` bool, ``busbw_gbps`` finite
    number >= 0 or null, ``nccl``/``torch`` strings (shortened to 40 characters; absent: ``?``).

    Raises:
        ValueError: anything else.
    """
    def num(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e300 and v == v

    if not isinstance(doc, dict):
        raise ValueError("not an object")
    world, size, secs, ok, bw = (doc.get(k) for k in ("world", "bytes", "seconds", "correct", "busbw_gbps"))
    if not (isinstance(world, int) and not isinstance(world, bool) and 1 <= world <= 4096):
        raise ValueError("world")
    if not (isinstance(size, int) and not isinstance(size, bool) and 0 <= size < 1 << 60):
        raise ValueError("bytes")
    if not (num(secs) and secs > 0) or not isinstance(ok, bool) or not (bw is None or (num(bw) and bw >= 0)):
        raise ValueError("seconds/correct/busbw_gbps")
    return {"world": world, "bytes": size, "seconds": float(secs), "correct": ok, "busbw_gbps": bw,
            **{k: str(doc.get(k, "?"))[:40] for k in ("nccl", "torch")}}


def _unit_limits(unit: str | None) -> dict | None:
    """``{LimitNOFILE, LimitMEMLOCK}`` of ``unit`` when systemd has it loaded, else None."""
    if not unit:
        return None
    r = run_bounded(
        ["systemctl", "show", unit, "-p", "LoadState", "-p", "LimitNOFILE", "-p", "LimitMEMLOCK"], 10, 65536
    )
    props = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
    if r.rc != 0 or props.get("LoadState") != "loaded":
        return None
    return {k: props[k] for k in ("LimitNOFILE", "LimitMEMLOCK") if k in props}


def preflight(expect: Expect, nvidia_smi: str = "nvidia-smi", skip: tuple[str, ...] = (),
              nccl_python: str | None = None, nccl_deadline_s: float = NCCL_DEADLINE_S,
              root: Path = Path("/"), disk_min_free: int | None = None) -> dict:
    """Run every check on this machine.

    Args:
        expect: what to check against (:func:`expect_from`).
        nvidia_smi: the nvidia-smi to run.
        skip: check names to report as skipped (the test host has no kernel module).
        nccl_python: run the NCCL smoke test with this interpreter's torch (None: not run).
        disk_min_free: bytes the ``disk`` check needs free (None: :data:`DISK_MIN_FREE_BYTES`).
        root: where ``proc/driver``, ``proc/sys``, ``sys`` and ``dev`` are read (``/``; tests give a
            tree). Ports are always checked against this machine's own ``/proc``.

    Returns:
        ``{ok, checks, host_class, matches, facts}``: ``matches`` maps each class to how the
        machine differs from it (``[]``: it matches); ``facts`` the GPUs, driver and links read.
    """
    facts = gather(nvidia_smi, root / "proc")
    smi, hc = facts.smi, expect.host_class
    checks: list[dict] = []
    checks.append(_check("nvidia_smi", smi is not None,
                         f"{len(smi.gpus)} GPU(s), driver {smi.driver_version}"
                         + (f"; compute capability unknown: {facts.cap_error[:300]}" if facts.cap_error else "")
                         if smi else facts.smi_error,
                         "install the NVIDIA driver (nvidia-smi comes with it) and reboot; if it is installed, "
                         "run `nvidia-smi` by hand and fix what it says"))
    matches = match_classes(smi, facts.topo, facts.topo_error, expect.classes) if smi else {}
    if hc is None:
        fits = [n for n, d in matches.items() if not d]
        why = " ".join(f"[not {n}: {' / '.join(d[:3])}]" for n, d in matches.items() if d)
        checks.append(_check("host_class", bool(fits), (f"matches {', '.join(fits)}" if fits else
                             f"matches no host class {why or '(no GPU facts)'}"),
                             f"deploy only to machines of a class ({', '.join(sorted(expect.classes))})"))
    else:
        fits = smi is not None and not matches.get(hc.name)
        checks.append(_check("host_class", fits, f"machine matches {hc.name}" if fits else
                             f"machine is not a {hc.name}: " + "; ".join(matches[hc.name])[:600] if smi else
                             "unknown: nvidia_smi failed",
                             f"deploy this host with the class it is, or use a {hc.name} machine"))
    arch = hc.arch if hc else None
    if arch is None and smi and smi.gpus and smi.gpus[0].compute_cap:
        major, minor = smi.gpus[0].compute_cap.split(".")
        arch = f"sm_{major}{minor}"
    toolchain = expect.toolchain or (plan_toolchain(arch, None, None) if arch in ARCHS else {})
    if smi is None:
        checks += [_check(n, False, "not checked: nvidia_smi failed")
                   for n in ("gpu_count", "gpu_name", "compute_capability", "gpu_memory", "persistence_mode",
                             "interconnect")]
    elif hc is not None:
        checks += gpu_checks(hc, smi, facts.topo, facts.topo_error)
    else:
        g = smi.gpus
        checks += [
            _check("gpu_count", bool(g), f"{len(g)} GPU(s)", "no GPU visible: check the driver"),
            _check("gpu_name", True, ", ".join(sorted({x.name for x in g})) or "none"),
            _check("compute_capability", True, ", ".join(sorted({x.compute_cap or "unknown" for x in g}))),
            _check("gpu_memory", True, f"least {min((x.memory_mib for x in g), default=0)} MiB per GPU"),
            _check("persistence_mode", all(x.persistence for x in g),
                   "on for every GPU" if all(x.persistence for x in g) else "off on some GPU",
                   "enable it (`nvidia-smi -pm 1` or nvidia-persistenced)"),
            _check("interconnect", facts.topo is not None or len(g) < 2,
                   (", ".join(sorted(set(facts.topo.links.values()))) or "single GPU") if facts.topo else
                   (facts.topo_error or "single GPU"), "run `nvidia-smi topo -m` and fix what it reports"),
        ]
    checks += driver_checks(facts, toolchain, arch)
    nvlink = hc.interconnect == "nvlink" if hc else bool(facts.topo and all(
        v.startswith("NV") for v in facts.topo.links.values()))
    if smi is None or len(smi.gpus) < 2:
        checks += [_skip("pcie_acs", "fewer than two GPUs: no peer-to-peer traffic"),
                   _skip("iommu", "fewer than two GPUs: no peer-to-peer traffic")]
    elif nvlink:
        checks += [_skip("pcie_acs", "NVLink host: GPU peer traffic does not cross PCIe bridges"),
                   _skip("iommu", "NVLink host: GPU peer traffic does not cross PCIe bridges")]
    else:
        checks += acs_iommu_checks([g.bus_id for g in smi.gpus], root / "sys")
    checks.append(device_node_check(len(smi.gpus) if smi else 0, root / "dev"))
    checks.append(fabric_check(hc, smi))
    checks.append(ptxas_check(toolchain))
    try:
        st = os.statvfs(root / "dev/shm")
        checks.append(shm_check(st.f_blocks * st.f_frsize, str(root / "dev/shm")))
    except OSError as exc:
        checks.append(shm_check(None, str(root / "dev/shm"), exc.strerror or str(exc)))
    try:
        nr_open = int((root / "proc/sys/fs/nr_open").read_text().strip())
    except (OSError, ValueError):
        nr_open = None
    checks.append(limits_check(nr_open, _unit_limits(expect.unit), expect.unit))
    checks.append(disk_check(expect.dirs, disk_min_free))
    checks.append(ports_check(expect.ports))  # the machine's own sockets, whatever ``root`` is
    if nccl_python is not None:
        checks.append(nccl_check(nccl_python, len(smi.gpus) if smi else 0, nccl_deadline_s))
    for c in checks:
        if c["name"] in skip and not c.get("skipped"):
            c.update(ok=True, skipped=True, remediation="", detail=f"skipped (--skip): {c['detail']}")
    return {
        "ok": all(c["ok"] for c in checks), "checks": checks, "host_class": hc.name if hc else None,
        "matches": matches,
        "facts": {"driver": smi.driver_version if smi else None, "cuda": clean(smi.cuda_version, 40) if smi else None,
                  "gpus": [{k: clean(v, 200) if isinstance(v, str) else v for k, v in g.__dict__.items()}
                           for g in smi.gpus] if smi else [],
                  "links": sorted(facts.topo.kinds()) if facts.topo else [],
                  "kernel_module": facts.module.__dict__ if facts.module else None},
    }


def load_plan(path: str) -> dict:
    """Read a ``plan.json`` (:func:`ddtree_ops._core.plandoc.load_plan_doc`). Raises PreflightUsageError."""
    from .._core.plandoc import PlanFileError, load_plan_doc

    try:
        doc = load_plan_doc(path)
    except PlanFileError as exc:
        raise PreflightUsageError(str(exc)) from None
    return doc


def disk_bytes(gib: float | None) -> int | None:
    """``--disk-min-free-gib`` in bytes (None: the default). Raises PreflightUsageError."""
    if gib is None:
        return None
    if not 0 <= gib <= 1 << 20:  # NaN fails too
        raise PreflightUsageError(f"--disk-min-free-gib {gib!r}: must be 0..{1 << 20} GiB")
    return int(gib * (1 << 30))


def parse_skip(names: list[str]) -> tuple[str, ...]:
    """Validate ``--skip`` names against :data:`CHECK_NAMES`. Raises PreflightUsageError."""
    bad = [n for n in names if n not in CHECK_NAMES]
    if bad:
        raise PreflightUsageError(f"--skip {bad[0][:200]!r}: not a check; use one of {', '.join(CHECK_NAMES)}")
    return tuple(names)


ZIPAPP_MODULES = ("__init__.py", "_core/__init__.py", "_core/bounded.py", "_core/plandoc.py", "_core/proc.py",
                  "_core/scrub.py", "_core/strictjson.py", "config/__init__.py", "config/hosts.py",
                  "config/plan_fields.py", "config/toolchain.py", "host/__init__.py", "host/gpu_facts.py",
                  "host/ports.py", "host/preflight.py", "host/ptxas.py", "host/toolkit.py")
"""The files of ``ddtree_ops`` the preflight imports (all standard-library only)."""


def build_zipapp(out: str) -> str:
    """Write a zipapp of the preflight (``python3 preflight.pyz --plan plan.json --json``) to ``out``.
    Deterministic bytes (fixed timestamps, sorted entries), so a redeploy sees no change."""
    pkg = Path(__file__).resolve().parent.parent
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("__main__.py", (1980, 1, 1, 0, 0, 0)),
                   "import sys\nfrom ddtree_ops.host.preflight import main\nsys.exit(main())\n")
        for rel in ZIPAPP_MODULES:
            z.writestr(zipfile.ZipInfo(f"ddtree_ops/{rel}", (1980, 1, 1, 0, 0, 0)), (pkg / rel).read_bytes())
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """The zipapp's entry point (the CLI's ``preflight`` command takes the same options).

    Exit codes: 0 fit, 1 a check failed, 2 usage error, 70 an unexpected error (a bug): with
    ``--json`` that too prints a JSON report (one failed ``internal`` check), never a traceback
    alone, as the deploy play reads stdout."""
    ap = argparse.ArgumentParser(prog="preflight", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-class", help=f"one of {', '.join(sorted(HOST_CLASSES))}, or a class the --plan defines "
                    "(default: report which matches)")
    ap.add_argument("--plan", help="the deployment's plan.json (host class, toolkit, ports, directories)")
    ap.add_argument("--nvidia-smi", default="nvidia-smi")
    ap.add_argument("--skip", action="append", default=[], help="report this check as skipped (repeatable)")
    ap.add_argument("--nccl-smoke", action="store_true", help="run the NCCL all-reduce smoke test")
    ap.add_argument("--nccl-python", default=sys.executable, help="interpreter with torch for --nccl-smoke")
    ap.add_argument("--nccl-deadline", type=float, default=NCCL_DEADLINE_S,
                    help="total seconds for the smoke test (torch probe + all-reduce); past it the check fails")
    ap.add_argument("--disk-min-free-gib", type=float, default=None,
                    help=f"GiB the disk check needs free (default {DISK_MIN_FREE_BYTES >> 30})")
    ap.add_argument("--json", action="store_true", dest="as_json")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        return _main(args)
    except Exception as exc:  # noqa: BLE001 - the last resort: a report the deploy play can read
        detail = clean(f"internal error: {type(exc).__name__}: {exc}", 400)
        if args.as_json:
            print(json.dumps({"ok": False, "checks": [{"name": "internal", "ok": False, "detail": detail,
                                                       "remediation": "report this as a ddtree-ops bug"}]}, indent=2,
                                                           allow_nan=False))
        else:
            print(f"FAIL internal: {detail}", file=sys.stderr)
        return 70


def _main(args: argparse.Namespace) -> int:
    try:
        if not 0 < args.nccl_deadline <= 3600:
            raise PreflightUsageError(f"--nccl-deadline {args.nccl_deadline}: must be > 0 and <= 3600 s")
        exp = expect_from(args.host_class, load_plan(args.plan) if args.plan else None)
        result = preflight(exp, args.nvidia_smi, parse_skip(args.skip),
                           args.nccl_python if args.nccl_smoke else None, args.nccl_deadline,
                           disk_min_free=disk_bytes(args.disk_min_free_gib))
    except PreflightUsageError as exc:
        result, rc = {"ok": False, "checks": [{"name": "usage", "ok": False, "detail": clean(str(exc))}]}, 2
    else:
        rc = 0 if result["ok"] else 1
    if args.as_json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        for c in result["checks"]:
            print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}"
                  + (f"\n     fix: {c['remediation']}" if c.get("remediation") else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
