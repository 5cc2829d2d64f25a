"""CUDA toolkit host checks: the NVIDIA driver against the toolkit and against the pinned
SGLang wheel's CUDA dependencies, and the reboot guard.

The ``cuda_toolkit`` role runs ``nvidia-smi --query-gpu=driver_version,compute_cap
--format=csv,noheader`` on the host and hands the output to :func:`check_driver` on the
controller (action plugin ``ddtree_toolkit``), so the rule lives here, tested on outputs
read off real machines (``tests/fixtures/gpu/``).
"""

from __future__ import annotations

import csv
import email.parser
import io
import re
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..config.toolchain import CUDA_TOOLKITS, at_least

QUERY_FIELDS = ("driver_version", "compute_cap")
QUERY_COMMAND = ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader"]


class DriverCheckError(Exception):
    """The driver is missing, unreadable, too old for the toolkit, or the GPUs are not the
    host class' arch. ``str()`` is the one-line message for the operator."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it.

    Attributes:
        index: GPU index (order of the output).
        driver_version: e.g. ``580.159.04``.
        compute_cap: ``major.minor`` e.g. ``10.3``.
        name: product name when the output has it, else ``""``.
    """

    index: int
    driver_version: str
    compute_cap: str
    name: str = ""

    @property
    def arch(self) -> str:
        """``10.3`` -> ``sm_103``."""
        major, minor = self.compute_cap.split(".")
        return f"sm_{int(major)}{int(minor)}"


def parse_query_gpu(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader]``.

    With a header line (``--format=csv``) the columns are taken from it (units such as
    `` [MiB]`` stripped), so any field order works; without one, ``fields`` names them.

    Raises:
        DriverCheckError: not CSV, no GPU lines, a line without driver_version / compute_cap,
            or an index that is not a number.
    """
    try:
        rows = [
            r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r and any(c.strip() for c in r)
        ]
    except csv.Error as exc:  # a field over csv.field_size_limit() (128 KiB), a NUL
        raise DriverCheckError(f"nvidia-smi --query-gpu output is not CSV ({exc})") from None
    if rows and "driver_version" in [c.strip() for c in rows[0]]:
        cols = [c.strip().split(" [")[0] for c in rows[0]]
        rows = rows[1:]
    else:
        cols = list(fields)
    if not rows:
        raise DriverCheckError("nvidia-smi listed no GPU")
    gpus = []
    for i, r in enumerate(rows):
        # not strict: a short line lacks a column and is refused below by the field it misses
        rec = dict(zip(cols, (c.strip() for c in r), strict=False))
        drv, cap = rec.get("driver_version", ""), rec.get("compute_cap", "")
        if not _dotted(drv) or not _dotted(cap):
            raise DriverCheckError(f"nvidia-smi line {i + 1} {','.join(r)!r}: expected driver_version,compute_cap "
                                   f"such as 580.65.06, 10.3")
        index = rec.get("index", str(i))
        if not re.fullmatch(r"\d{1,4}", index):
            raise DriverCheckError(f"nvidia-smi line {i + 1}: index {index[:40]!r} is not a GPU index (0, 1, ...)")
        gpus.append(Gpu(int(index), drv, cap, rec.get("name", "")))
    return gpus


def parse_smi_xml(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi -q -x`` (driver version is per host, compute capability is not in
    older outputs: then ``compute_cap`` is empty).

    Raises:
        DriverCheckError: not an nvidia_smi_log document.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise DriverCheckError(f"nvidia-smi -q -x output is not XML ({exc})") from None
    drv = (root.findtext("driver_version") or "").strip()
    if root.tag != "nvidia_smi_log" or not _dotted(drv):
        raise DriverCheckError("not an nvidia-smi -q -x document with a driver_version")
    out = []
    for i, g in enumerate(root.findall("gpu")):
        cap = ""
        major, minor = g.findtext("compute_cap/major"), g.findtext("compute_cap/minor")
        if major is not None and minor is not None:
            cap = f"{major.strip()}.{minor.strip()}"
        out.append(Gpu(i, drv, cap, (g.findtext("product_name") or "").strip()))
    return out


def _dotted(v: str) -> bool:
    try:
        return bool(v) and all(x.isdigit() for x in v.split("."))
    except AttributeError:
        return False


def check_driver(query_output: str, rc: int, cuda: str, arch: str | None = None, stderr: str = "",
                 min_driver: str | None = None, min_driver_reason: str = "") -> list[Gpu]:
    """The installed driver can run toolkit ``cuda``, on GPUs of ``arch``.

    Args:
        query_output: stdout of :data:`QUERY_COMMAND`.
        rc: its exit status (127: no nvidia-smi, i.e. no driver).
        stderr: its error output / Ansible's message.
        cuda: toolkit ``major.minor`` (key of :data:`CUDA_TOOLKITS`).
        arch: expected GPU arch (host class), e.g. ``sm_103``; None skips that check.
        min_driver: the plan's floor (``plan.toolchain.min_driver``: the larger of the
            toolkit's and the SGLang build's, e.g. 580.65.06 for a cu13 wheel on toolkit 12.8);
            the toolkit's alone when None. A higher of the two is required.
        min_driver_reason: why (``plan.toolchain.min_driver_reason``), shown when it fails.

    Returns:
        The GPUs.

    Raises:
        DriverCheckError: driver absent, unreadable, older than the toolkit's minimum
            (NVIDIA release notes, see :mod:`ddtree_ops.config.toolchain`), GPUs that
            disagree on the driver, or GPUs of another arch.
    """
    tk = CUDA_TOOLKITS[cuda]
    floor, why_floor, from_build = tk.min_driver, "NVIDIA CUDA release notes", False
    if min_driver:
        if not _dotted(str(min_driver)):
            raise DriverCheckError(f"min_driver {str(min_driver)[:40]!r} is not a dotted driver version. "
                                   "Fix: pass plan.toolchain.min_driver")
        if not at_least(floor, str(min_driver)):
            floor, from_build = str(min_driver), True
            why_floor = (min_driver_reason.strip()[:300] or "the pinned SGLang build's CUDA wheels need it")
    if rc != 0:
        why = "nvidia-smi is not installed" if rc == 127 else f"nvidia-smi failed (rc {rc}: {stderr.strip()[:200]})"
        raise DriverCheckError(f"no usable NVIDIA driver: {why}. CUDA {cuda} needs driver >= {floor} ({why_floor}). "
                               "Fix: install the NVIDIA driver (and reboot) before the toolkit")
    gpus = parse_query_gpu(query_output)
    drivers = sorted({g.driver_version for g in gpus})
    if len(drivers) > 1:
        raise DriverCheckError(f"GPUs report different drivers {drivers}: a driver upgrade is half done. Fix: reboot")
    if not at_least(drivers[0], floor):
        other = ("pin an SGLang build whose wheels need an older CUDA" if from_build
                 else "pin an older toolkit in ddtree_toolchain.cuda if the arch allows")
        raise DriverCheckError(
            f"NVIDIA driver {drivers[0]} is too old for CUDA {cuda} (needs >= {floor}, {why_floor}). "
            f"Fix: upgrade the driver to >= {floor}, or {other}"
        )
    if arch is not None:
        other = sorted({g.arch for g in gpus if g.arch != arch})
        if other:
            raise DriverCheckError(f"GPUs are {', '.join(other)} but the host class is {arch}. "
                                   "Fix: put the host in the group of its GPU class (ddtree_host_class)")
    return gpus


def reboot_decision(connection: str, host: str, managed_changed: bool, reboot_required: bool,
                    allowed: bool) -> tuple[bool, str]:
    """Whether the role may reboot the host now.

    A reboot happens only if all hold: the host asks for one (``/run/reboot-required``),
    a package the role manages changed in this run, the operator allowed it
    (``cuda_toolkit_reboot_allowed``), and the connection is not local (rebooting the
    controller, or a host reached without a network hop, would cut the play off).

    Returns:
        ``(reboot, reason)``; reason is one line for the play output.
    """
    local = connection == "local" or host in ("localhost", "127.0.0.1", "::1")
    if not reboot_required:
        return False, "no reboot required"
    if not managed_changed:
        return False, "a reboot is pending, but not because of a package this role changed: left to the operator"
    if local:
        return False, "a reboot is required, but the connection is local: never rebooting the machine running the play"
    if not allowed:
        return False, "a reboot is required; set cuda_toolkit_reboot_allowed: true to let the role reboot"
    return True, "rebooting: a package this role manages changed and the operator allowed it"


MAX_METADATA_BYTES = 4 << 20
"""Largest METADATA read from a wheel (SGLang 0.5.23's is ~10 KiB; a zip bomb stops here)."""

_DIST_INFO_METADATA = re.compile(r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+\.dist-info/METADATA$")


def wheel_requires(path: Path) -> tuple[str, list[str]]:
    """``(Name Version, Requires-Dist lines)`` of a wheel file or an installed ``*.dist-info``.

    Raises:
        DriverCheckError: not a readable wheel / dist-info, no single top-level METADATA,
            or METADATA over :data:`MAX_METADATA_BYTES`.
    """
    path = Path(path)
    try:
        if path.is_dir():
            meta = path / "METADATA"
            if meta.stat().st_size > MAX_METADATA_BYTES:
                raise DriverCheckError(f"{meta} is over {MAX_METADATA_BYTES} bytes")
            text = meta.read_text(errors="replace")
        else:
            with zipfile.ZipFile(path) as zf:
                metas = [i for i in zf.infolist() if _DIST_INFO_METADATA.match(i.filename)]
                if len(metas) != 1:
                    raise DriverCheckError(f"{path.name} has {len(metas)} top-level *.dist-info/METADATA (want 1)")
                if metas[0].file_size > MAX_METADATA_BYTES:
                    raise DriverCheckError(f"{path.name}: METADATA is over {MAX_METADATA_BYTES} bytes")
                with zf.open(metas[0]) as fh:
                    text = fh.read(MAX_METADATA_BYTES + 1).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile) as exc:
        raise DriverCheckError(f"cannot read the SGLang wheel metadata of {path.name}: {exc}") from None
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    return f"{msg.get('Name', '?')} {msg.get('Version', '?')}", [str(x) for x in msg.get_all("Requires-Dist") or []]


def check_build_driver(driver_version: str, wheel: Path) -> str:
    """The installed driver can run the CUDA wheels the SGLang ``wheel`` depends on (its
    ``Requires-Dist``: ``flashinfer_python[cu13]``, ``cuda-python>=13``, ... need a CUDA 13
    driver, >= 580.65.06, whatever toolkit is pinned; NVIDIA CUDA Toolkit Release Notes,
    table 3). The deploy-time twin of the plan's ``toolchain.min_driver``, which reads the
    versions table.

    Returns:
        A one-line summary.

    Raises:
        DriverCheckError: the driver is older, or the wheel cannot be read.
    """
    from ..config.build_table import cuda_major_of_requires

    if not _dotted(str(driver_version)):
        raise DriverCheckError(f"driver version {str(driver_version)[:40]!r} is not dotted numbers. "
                               "Fix: pass the driver_version the cuda_toolkit role's driver check reported")
    name, requires = wheel_requires(wheel)
    major, why = cuda_major_of_requires(requires)
    tk = CUDA_TOOLKITS.get(f"{major}.0") if major else None
    if tk is None:
        return f"{name}: no CUDA-major dependency known to this toolkit; driver {driver_version} not constrained by it"
    if not at_least(driver_version, tk.min_driver):
        raise DriverCheckError(
            f"NVIDIA driver {driver_version} is too old for {name}: its wheel depends on CUDA {major} packages "
            f"({', '.join(why)[:300]}), which need driver >= {tk.min_driver} (CUDA {tk.version} GA, NVIDIA CUDA "
            f"release notes) even with an older toolkit pinned. Fix: upgrade the driver to >= {tk.min_driver}, "
            "or pin an SGLang build whose wheels need an older CUDA")
    return f"{name} needs CUDA {major} (driver >= {tk.min_driver}): driver {driver_version} ok"
