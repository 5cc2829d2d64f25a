#!/usr/bin/env python3
"""STAND-IN for NVIDIA's CUDA apt repository, for tests only (NVIDIA's is unreachable here).

Builds, once and cached by content under ``/var/cache/ddtree-ops/cuda-apt/<key>/``, a signed
flat apt repository laid out like NVIDIA's (``repos/debian12/x86_64/``: ``Packages``,
``Release``, ``InRelease``, ``Release.gpg``) whose packages carry NVIDIA's names:

* ``cuda-keyring`` 1.1-1: the repository key at ``/usr/share/keyrings/cuda-archive-keyring.gpg``
  and ``/etc/apt/sources.list.d/cuda-debian12-x86_64.list`` pointing at NVIDIA's real URL,
  as NVIDIA's keyring package does (the ``cuda_toolkit`` role rewrites the list to the
  configured mirror, here the stand-in).
* ``cuda-toolkit-12-8``, ``cuda-toolkit-12-9``, ``cuda-toolkit-13-0``: NOT toolkits. Each holds
  only the **real ptxas binary** of NVIDIA's PyPI wheel (``nvidia-cuda-nvcc-cu12==12.8.93``,
  ``nvidia-cuda-nvcc-cu12==12.9.86``, ``nvidia-cuda-nvcc==13.0.88``, sha256-pinned below) at
  ``/usr/local/cuda-X.Y/bin/ptxas``, plus a README saying it is a stand-in.

The signing key is generated once (``/var/cache/ddtree-ops/cuda-apt/gnupg``), not NVIDIA's.
Prints the repository root (serve it over HTTP; ``<root>/debian12/x86_64/`` is the repo).

Needs: dpkg-deb, apt-ftparchive (apt-utils), gpg, pip (for the wheels). Run as root.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ddtree_ops.sglang.wheelhouse import sha256_file  # the project venv has ddtree-ops

CACHE = Path(os.environ.get("DDTREE_CUDA_APT_CACHE", "/var/cache/ddtree-ops/cuda-apt"))
WHEELS = Path(os.environ.get("DDTREE_PTXAS_WHEELS", "/var/cache/ddtree-ops/ptxas-wheels"))
REPO_PATH = "debian12/x86_64"
NVIDIA_URL = "https://developer.download.nvidia.com/compute/cuda/repos"

# toolkit -> (pip requirement, wheel file, sha256, ptxas path inside the wheel, package version)
TOOLKITS = {
    "12.8": ("nvidia-cuda-nvcc-cu12==12.8.93",
             "nvidia_cuda_nvcc_cu12-12.8.93-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
             "2d6dc36fb7cb5ac9c0b8825bc13d193c35487a315664007287d0126531238011",
             "nvidia/cuda_nvcc/bin/ptxas", "12.8.93-1"),
    "12.9": ("nvidia-cuda-nvcc-cu12==12.9.86",
             "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
             "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0",
             "nvidia/cuda_nvcc/bin/ptxas", "12.9.86-1"),
    "13.0": ("nvidia-cuda-nvcc==13.0.88",
             "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
             "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
             "nvidia/cu13/bin/ptxas", "13.0.88-1"),
}
KEY_UID = "ddtree-ops CUDA apt STAND-IN (tests only) <cuda-standin@ddtree-ops.invalid>"


def run(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, **kw)


def wheel(version: str) -> Path:
    """The sha256-checked wheel of one toolkit (downloaded once into WHEELS)."""
    req, name, digest, _, _ = TOOLKITS[version]
    path = WHEELS / name
    if not path.exists():
        WHEELS.mkdir(parents=True, exist_ok=True)
        run(sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--platform", "manylinux2010_x86_64",
            "--python-version", "3.11", req, "-d", str(WHEELS))
    if sha256_file(path) != digest:
        raise SystemExit(f"cuda-apt-standin: {path} sha256 mismatch (expected {digest}); delete it and retry")
    return path


def gnupg_home() -> tuple[Path, str]:
    """The stand-in signing key (generated once); returns (GNUPGHOME, fingerprint)."""
    home = CACHE / "gnupg"
    if not (home / "fingerprint").exists():
        tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix="gnupg."))
        tmp.chmod(0o700)
        env = {**os.environ, "GNUPGHOME": str(tmp)}
        run("gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never",
            env=env, capture_output=True)
        out = run("gpg", "--batch", "--with-colons", "--list-keys", env=env, capture_output=True, text=True).stdout
        fpr = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))
        (tmp / "fingerprint").write_text(fpr + "\n")
        run("gpgconf", "--kill", "gpg-agent", env=env)  # its sockets live in tmp: stop it before the move
        os.replace(tmp, home) if not home.exists() else shutil.rmtree(tmp)
    return home, (home / "fingerprint").read_text().strip()


def build_deb(root: Path, name: str, version: str, arch: str, description: str, out: Path) -> Path:
    (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) // 1024
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: ddtree-ops tests "
        f"<cuda-standin@ddtree-ops.invalid>\n"
        f"Installed-Size: {size}\nSection: devel\nPriority: optional\nDescription: {description}\n"
        " STAND-IN built by ddtree-ops scripts/cuda_apt_standin.py for tests; not an NVIDIA package.\n"
    )
    deb = out / f"{name}_{version}_{arch}.deb"
    run("dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(deb), capture_output=True)
    return deb


def build(dest: Path, gnupg: Path) -> None:
    repo = dest / REPO_PATH
    repo.mkdir(parents=True)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    with tempfile.TemporaryDirectory(prefix="cuda-standin-") as t:
        tmp = Path(t)
        kr = tmp / "cuda-keyring"
        (kr / "usr/share/keyrings").mkdir(parents=True)
        (kr / "etc/apt/sources.list.d").mkdir(parents=True)
        key = run("gpg", "--batch", "--export", env=env, capture_output=True).stdout
        (kr / "usr/share/keyrings/cuda-archive-keyring.gpg").write_bytes(key)
        (kr / f"etc/apt/sources.list.d/cuda-{REPO_PATH.replace('/', '-')}.list").write_text(
            f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {NVIDIA_URL}/{REPO_PATH}/ /\n")
        (kr / "DEBIAN").mkdir()
        (kr / "DEBIAN/conffiles").write_text(f"/etc/apt/sources.list.d/cuda-{REPO_PATH.replace('/', '-')}.list\n")
        build_deb(kr, "cuda-keyring", "1.1-1", "all", "STAND-IN of NVIDIA's CUDA repository keyring", repo)
        for ver, (req, _, _, inner, pkgver) in TOOLKITS.items():
            root = tmp / f"tk-{ver}"
            bindir = root / f"usr/local/cuda-{ver}/bin"
            bindir.mkdir(parents=True)
            with zipfile.ZipFile(wheel(ver)) as z, z.open(inner) as src, open(bindir / "ptxas", "wb") as dst:
                shutil.copyfileobj(src, dst)
            (bindir / "ptxas").chmod(0o755)
            (root / f"usr/local/cuda-{ver}/README.ddtree-standin").write_text(
                f"STAND-IN for NVIDIA's cuda-toolkit-{ver.replace('.', '-')}: only bin/ptxas, the real binary from the "
                f"PyPI wheel {req}. Built for ddtree-ops tests.\n")
            build_deb(root, f"cuda-toolkit-{ver.replace('.', '-')}", pkgver, "amd64",
                      f"STAND-IN of CUDA Toolkit {ver} (real ptxas only)", repo)
        packages = run("apt-ftparchive", "packages", ".", cwd=repo, capture_output=True).stdout
        (repo / "Packages").write_bytes(packages)
        run("gzip", "-9kn", "Packages", cwd=repo)
        release = run("apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=ddtree-ops-standin",
                      "-o", "APT::FTPArchive::Release::Label=CUDA STAND-IN", "release", ".",
                      cwd=repo, capture_output=True).stdout
        (repo / "Release").write_bytes(release)
        run("gpg", "--batch", "--yes", "--clearsign", "-o", "InRelease", "Release", cwd=repo, env=env)
        run("gpg", "--batch", "--yes", "-abs", "-o", "Release.gpg", "Release", cwd=repo, env=env)


def main() -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        gnupg, fpr = gnupg_home()
        key = hashlib.sha256((Path(__file__).read_text() + fpr).encode()).hexdigest()[:12]
        dest = CACHE / key
        if not (dest / ".complete").exists():
            for v in TOOLKITS:
                wheel(v)
            tmp = CACHE / f"{key}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp, gnupg)
            (tmp / ".complete").write_text(fpr + "\n")
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
            run("gpgconf", "--kill", "gpg-agent", env={**os.environ, "GNUPGHOME": str(gnupg)})
            print(f"cuda-apt-standin: built {dest}", file=sys.stderr)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
