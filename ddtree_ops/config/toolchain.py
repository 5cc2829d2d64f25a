"""Toolchain facts as data: CUDA toolkit (ptxas) per GPU arch, NVIDIA driver per toolkit,
NVIDIA's apt repository layout, and which ptxas each Triton release uses for which arch.

Validator (:mod:`.rules`), plan (:mod:`.plan`), the ``cuda_toolkit`` / ``triton`` roles and
``ddtree-ops check-ptxas`` all read these tables; nothing else hard-codes a version.

Sources
-------
* **ptxas per arch** (:data:`ARCHS`): measured with the real ptxas binaries of the PyPI
  wheels ``nvidia-cuda-nvcc-cu12==12.8.93``, ``nvidia-cuda-nvcc-cu12==12.9.86`` and
  ``nvidia-cuda-nvcc==13.0.88`` on an empty kernel (``.visible .entry k() { ret; }``):
  12.8 answers ``Value 'sm_103a' is not defined for option 'gpu-name'``; 12.9 and 13.0
  assemble ``.version 8.8`` / ``.target sm_103a``. ``.version 8.7`` does not support
  ``sm_103a`` (13.0: ``PTX .version 8.7 does not support .target sm_103a``) but does
  support ``sm_120a``, which 12.8 assembles; 12.8 refuses ``.version 8.8``
  (``Unsupported .version 8.8; current version is '8.7'``). ``sm_100a`` needs PTX 8.6
  (CUDA 12.8), ``sm_90a`` PTX 8.0 (CUDA 12.0). Also ``tests/fixtures/gpu/h200x2_topo_and_ptxas.txt``.
* **driver per toolkit** (:data:`CUDA_TOOLKITS`): NVIDIA CUDA Toolkit Release Notes,
  table "CUDA Toolkit and Corresponding Driver Versions" (Linux x86_64, GA release of each
  toolkit): 12.8 GA >= 570.26, 12.9 GA >= 575.51.03, 13.0 GA >= 580.65.06
  (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/, archive pages per version).
  Minor-version compatibility would let a 12.x toolkit run on an older 12.x driver, but
  PTX JIT of code built by a newer ptxas needs the toolkit's own driver, so we require it.
* **NVIDIA apt repository** (:data:`NVIDIA_REPO_URL`, :func:`nvidia_repo`): NVIDIA's
  network-repo install instructions (``cuda-keyring_1.1-1_all.deb`` from
  ``<base>/<distro><ver>/<arch>/``; a flat repository ``deb [signed-by=...] <url>/ /``;
  packages ``cuda-toolkit-X-Y`` installing into ``/usr/local/cuda-X.Y``).
* **Triton** (:data:`TRITONS`): read from the released wheels (``pip download --no-deps
  triton==V``, cp311 manylinux x86_64), ``triton/backends/nvidia/bin/`` (each binary's
  ``--version``), ``triton/backends/nvidia/compiler.py`` (``get_ptxas``) and
  ``triton/knobs.py`` (``env_nvidia_tool``):

  ========  ===============  =======================  ========================================
  Triton    bin/ptxas        bin/ptxas-blackwell      get_ptxas(arch)
  ========  ===============  =======================  ========================================
  3.3.1     12.4 (V12.4.99)  12.8 (V12.8.61)          ptxas-blackwell if arch >= 100; env key
                                                      ``TRITON_PTXAS-BLACKWELL_PATH`` (dash)
  3.4.0     12.8 (V12.8.93)  —                        always ptxas (``TRITON_PTXAS_PATH``)
  3.5.1     12.8 (V12.8.93)  —                        always ptxas (``TRITON_PTXAS_PATH``)
  3.6.0     12.8 (V12.8.93)  12.9 (V12.9.86)          ptxas-blackwell if arch >= 100
  3.7.1     12.8 (V12.8.93)  13.1 (V13.1.80)          ptxas-blackwell if arch >= 100
  3.8.0     12.9 (V12.9.86)  13.3 (V13.3.33)          ptxas-blackwell if arch >= 100
  3.9.0     12.9 (V12.9.86)  13.4 (V13.4.59)          ptxas-blackwell if arch >= 90
  ========  ===============  =======================  ========================================

  From 3.4 on ``knobs.env_nvidia_tool(binary)`` reads ``TRITON_<BINARY>_PATH`` with ``-``
  turned into ``_`` (``TRITON_PTXAS_PATH``, ``TRITON_PTXAS_BLACKWELL_PATH``), tries that
  path first and **silently falls back to the bundled binary** when the path does not
  answer ``--version`` (so a wrong override is invisible unless checked, see
  :mod:`ddtree_ops.host.ptxas`). ``TRITON_PTXAS_PATH`` does not change what Triton >= 3.6
  uses for Blackwell: there the variable is ``TRITON_PTXAS_BLACKWELL_PATH``. Triton 3.6.0
  on sm_103 therefore already works with its bundled ptxas-blackwell 12.9; Triton 3.4/3.5
  (ptxas 12.8 only) do not and need ``TRITON_PTXAS_PATH``.
"""

from __future__ import annotations

from dataclasses import dataclass

NVIDIA_REPO_URL = "https://developer.download.nvidia.com/compute/cuda/repos"
"""Base of NVIDIA's CUDA apt repositories (a mirror keeps the same layout below it)."""

KEYRING_PACKAGE = "cuda-keyring"
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
KEYRING_PATH = "/usr/share/keyrings/cuda-archive-keyring.gpg"

DEFAULT_CUDA = "13.0"
"""Toolkit installed unless ``ddtree_toolchain.cuda`` says otherwise (raised to the arch minimum)."""


@dataclass(frozen=True)
class ArchToolchain:
    """What ptxas must support for one GPU arch.

    Attributes:
        arch: ``sm_103`` etc. (as in :mod:`.hosts`).
        target: the arch-specific PTX target Triton compiles for (``sm_103a``).
        min_cuda: oldest toolkit whose ptxas assembles ``target``.
        ptx_version: PTX ISA that introduced ``target``; the smallest PTX that can name it,
            used by the assemble check.
    """

    arch: str
    target: str
    min_cuda: str
    ptx_version: str

    @property
    def number(self) -> int:
        """``sm_103`` -> 103 (Triton's ``arch`` / capability number)."""
        return int(self.arch.split("_", 1)[1])


ARCHS: dict[str, ArchToolchain] = {
    a.arch: a
    for a in (
        ArchToolchain("sm_90", "sm_90a", "12.0", "8.0"),
        ArchToolchain("sm_100", "sm_100a", "12.8", "8.6"),
        ArchToolchain("sm_103", "sm_103a", "12.9", "8.8"),
        ArchToolchain("sm_120", "sm_120a", "12.8", "8.7"),
    )
}


@dataclass(frozen=True)
class CudaToolkit:
    """One installable toolkit.

    Attributes:
        version: ``major.minor``.
        min_driver: oldest NVIDIA Linux driver for it (GA release notes).
    """

    version: str
    min_driver: str

    @property
    def package(self) -> str:
        """NVIDIA's apt package name, e.g. ``cuda-toolkit-13-0``."""
        return "cuda-toolkit-" + self.version.replace(".", "-")

    @property
    def home(self) -> str:
        """Install prefix of NVIDIA's packages, e.g. ``/usr/local/cuda-13.0``."""
        return f"/usr/local/cuda-{self.version}"

    @property
    def ptxas(self) -> str:
        return f"{self.home}/bin/ptxas"


CUDA_TOOLKITS: dict[str, CudaToolkit] = {
    t.version: t
    for t in (
        CudaToolkit("12.8", "570.26"),
        CudaToolkit("12.9", "575.51.03"),
        CudaToolkit("13.0", "580.65.06"),
    )
}


@dataclass(frozen=True)
class TritonPtxas:
    """Which ptxas one Triton release bundles and picks (see the module table).

    Attributes:
        version: Triton release.
        ptxas_cuda: CUDA version of ``bin/ptxas``.
        blackwell_cuda: CUDA version of ``bin/ptxas-blackwell``, or None (not shipped).
        blackwell_from_arch: ``get_ptxas(arch)`` uses ptxas-blackwell for ``arch >=`` this.
        blackwell_env: variable naming an override for ptxas-blackwell.
    """

    version: str
    ptxas_cuda: str
    blackwell_cuda: str | None = None
    blackwell_from_arch: int = 100
    blackwell_env: str = "TRITON_PTXAS_BLACKWELL_PATH"

    def picks(self, arch_number: int) -> tuple[str, str, str]:
        """``(binary, cuda_version, env_var)`` Triton uses for ``arch_number`` (e.g. 103)."""
        if self.blackwell_cuda is not None and arch_number >= self.blackwell_from_arch:
            return "ptxas-blackwell", self.blackwell_cuda, self.blackwell_env
        return "ptxas", self.ptxas_cuda, "TRITON_PTXAS_PATH"


TRITONS: dict[str, TritonPtxas] = {
    t.version: t
    for t in (
        TritonPtxas("3.3.1", "12.4", "12.8", blackwell_env="TRITON_PTXAS-BLACKWELL_PATH"),
        TritonPtxas("3.4.0", "12.8"),
        TritonPtxas("3.5.1", "12.8"),
        TritonPtxas("3.6.0", "12.8", "12.9"),
        TritonPtxas("3.7.1", "12.8", "13.1"),
        TritonPtxas("3.8.0", "12.9", "13.3"),
        TritonPtxas("3.9.0", "12.9", "13.4", blackwell_from_arch=90),
    )
}


def version_key(v: str) -> tuple[int, ...]:
    """``"12.9"`` -> ``(12, 9)``; raises ValueError for anything else."""
    return tuple(int(x) for x in v.split("."))


def at_least(have: str, need: str) -> bool:
    """Dotted numeric comparison (``"580.65.06" >= "575.51.03"``)."""
    return version_key(have) >= version_key(need)


def default_cuda(arch: str | None, min_cuda: str | None = None) -> str:
    """The toolkit a host gets when ``ddtree_toolchain.cuda`` is unset: :data:`DEFAULT_CUDA`,
    or the arch's minimum (or the host class's ``min_cuda``, :mod:`.hosts`) if that is newer."""
    need = ARCHS[arch].min_cuda if arch in ARCHS else DEFAULT_CUDA
    return max(DEFAULT_CUDA, need, min_cuda or DEFAULT_CUDA, key=version_key)


@dataclass(frozen=True)
class NvidiaRepo:
    """NVIDIA's apt repository for one distro release and CPU arch.

    Attributes:
        path: below the base URL, e.g. ``debian12/x86_64``.
        list_file: the sources file NVIDIA's keyring package installs.
    """

    path: str

    @property
    def list_file(self) -> str:
        return f"/etc/apt/sources.list.d/cuda-{self.path.replace('/', '-')}.list"

    def url(self, base: str = NVIDIA_REPO_URL) -> str:
        return f"{base.rstrip('/')}/{self.path}/"


NVIDIA_DISTROS = {("ubuntu", "22.04"): "ubuntu2204", ("ubuntu", "24.04"): "ubuntu2404", ("debian", "12"): "debian12"}
NVIDIA_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}


def nvidia_repo(distribution: str, version: str, machine: str) -> NvidiaRepo:
    """Map Ansible facts (``ansible_distribution``, ``ansible_distribution_version``,
    ``ansible_architecture``) to NVIDIA's repository path.

    Debian point releases (``12.7``) map to ``debian12``.

    Raises:
        ValueError: distro or CPU arch NVIDIA does not publish a repository for (here).
    """
    dist = distribution.strip().lower()
    ver = version.strip()
    if dist == "debian":
        ver = ver.split(".")[0]
    name = NVIDIA_DISTROS.get((dist, ver))
    if name is None:
        known = ", ".join(f"{d} {v}" for d, v in NVIDIA_DISTROS)
        raise ValueError(f"no NVIDIA CUDA repository for {distribution} {version} (supported: {known})")
    cpu = NVIDIA_MACHINES.get(machine.strip().lower())
    if cpu is None:
        raise ValueError(f"no NVIDIA CUDA repository for CPU arch {machine} (supported: x86_64, aarch64)")
    return NvidiaRepo(f"{name}/{cpu}")


def plan_toolchain(arch: str | None, cuda: str | None, triton: str | None,
                   build_cuda_major: int | None = None, build_reason: str = "", min_cuda: str | None = None) -> dict:
    """What a host's toolchain will be and which ptxas override the service env needs.

    Args:
        arch: host class arch (``sm_103``) or None when unknown (then nothing is derived).
        cuda: pinned toolkit, or None for :func:`default_cuda`.
        triton: pinned Triton release, or None when the venv decides.
        build_cuda_major: CUDA major the pinned SGLang build's wheel depends on (its
            ``Requires-Dist``: :data:`ddtree_ops.config.build_table.BUILD_REQUIRES_CUDA`), or None.
        build_reason: the dependencies that ask for it (shown in ``min_driver_reason``).
        min_cuda: the host class's oldest toolkit (:attr:`ddtree_ops.config.hosts.HostClass.min_cuda`,
            never older than the arch's); raises the default toolkit, None: the arch's.

    Returns:
        ``{arch, cuda, package, cuda_home, ptxas, min_driver, toolkit_min_driver,
        min_driver_reason, target, ptx_version, triton, triton_ptxas, triton_ptxas_cuda,
        ptxas_env, ptxas_reason}``; ``min_driver`` is the larger of the toolkit's GA driver
        and that of the first toolkit of ``build_cuda_major`` (a cu13 wheel needs a CUDA 13
        driver, >= 580.65.06, even with toolkit 12.8); ``ptxas_env`` maps
        the Triton variable(s) to the toolkit's ptxas when the ptxas Triton would pick is
        older than the arch needs (or, with Triton unpinned, both variables, since the
        toolkit's ptxas is the one known to be new enough). Empty dict for an unknown arch
        or toolkit (the rules report those). Deterministic; never raises.
    """
    a = ARCHS.get(arch or "")
    cuda = cuda or default_cuda(arch, min_cuda)
    tk = CUDA_TOOLKITS.get(cuda)
    if a is None or tk is None:
        return {}
    out = {
        "arch": a.arch,
        "cuda": tk.version,
        "package": tk.package,
        "cuda_home": tk.home,
        "ptxas": tk.ptxas,
        "min_driver": tk.min_driver,
        "toolkit_min_driver": tk.min_driver,
        "min_driver_reason": f"CUDA {tk.version} toolkit needs driver >= {tk.min_driver}",
        "target": a.target,
        "ptx_version": a.ptx_version,
        "triton": triton,
        "triton_ptxas": None,
        "triton_ptxas_cuda": None,
        "ptxas_env": {},
        "ptxas_reason": "",
    }
    btk = CUDA_TOOLKITS.get(f"{build_cuda_major}.0") if build_cuda_major else None
    if btk is not None and not at_least(tk.min_driver, btk.min_driver):
        out["min_driver"] = btk.min_driver
        out["min_driver_reason"] = (f"the SGLang build depends on CUDA {build_cuda_major} wheels ({build_reason}): "
                                    f"driver >= {btk.min_driver} (CUDA {btk.version} GA), above the "
                                    f"{tk.min_driver} of toolkit {tk.version}")
    t = TRITONS.get(triton or "")
    if triton is None:
        out["ptxas_env"] = {"TRITON_PTXAS_PATH": tk.ptxas, "TRITON_PTXAS_BLACKWELL_PATH": tk.ptxas}
        out["ptxas_reason"] = (f"Triton is not pinned: which ptxas it bundles is unknown, so Triton uses the "
                               f"toolkit's ptxas {tk.version} (>= {a.min_cuda} for {a.target})")
        return out
    if t is None:
        return out
    binary, bundled, env = t.picks(a.number)
    out["triton_ptxas"], out["triton_ptxas_cuda"] = binary, bundled
    if not at_least(bundled, a.min_cuda):
        out["ptxas_env"] = {env: tk.ptxas}
        out["ptxas_reason"] = (
            f"Triton {t.version} uses its bundled {binary} (CUDA {bundled}) for {a.arch}, "
            f"older than the {a.min_cuda} that {a.target} needs: {env} points at the toolkit's ptxas"
        )
    else:
        out["ptxas_reason"] = f"Triton {t.version}'s bundled {binary} (CUDA {bundled}) knows {a.target}"
    return out
