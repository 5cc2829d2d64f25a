"""``cuda_toolkit`` and ``triton`` roles against a booted systemd test host.

NVIDIA's repository is unreachable here: ``scripts/cuda_apt_standin.py`` builds a signed
STAND-IN repository with NVIDIA's package names whose ``cuda-toolkit-X-Y`` packages hold
the real ptxas binaries of NVIDIA's PyPI wheels; ``scripts/testhost-standins.sh up`` (run by
test.sh) serves it on the test network at http://10.213.1.1:8765, inventory/test's
``cuda_toolkit_repo_url``. The host has no GPU: a stand-in ``nvidia-smi`` (same script)
prints the ``--query-gpu=driver_version,compute_cap --format=csv,noheader`` format with a
driver version each test chooses; the module restores the default one at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from hostutil import REPO_ROOT, ssh

pytestmark = pytest.mark.hosts

VENV_BIN = REPO_ROOT / ".venv" / "bin"
INVENTORY = REPO_ROOT / "inventory" / "test"
HOST = "ddt-th1"
GATEWAY = "10.213.1.1"
# where scripts/triton-venv.sh (test.sh's set-up) downloaded it
TRITON_WHEEL = (Path(os.environ.get("DDTREE_CACHE", "/var/cache/ddtree-ops")) / "ptxas-wheels"
                / "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
SNAPSHOT = (
    "find /etc/apt/sources.list.d /etc/apt/apt.conf.d /etc/profile.d /usr/local /usr/share/keyrings -maxdepth 2 "
    "\\( -type d -printf '%p/\\n' \\) -o -printf '%p %s %l\\n' | sort; "
    "sha256sum /etc/apt/sources.list.d/* 2>&1; "
    "dpkg-query -W -f='${Package} ${Status}\\n' 'cuda-*' 2>&1; dpkg --get-selections 'cuda-*'"
)


def play(playbook: str, *extra: dict, timeout: int = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(INVENTORY), "-l", HOST, playbook]
    for e in extra:
        argv += ["-e", json.dumps(e)]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


def flat(output: str) -> str:
    """Play output with whitespace runs collapsed (the YAML callback folds long messages)."""
    return " ".join(output.split())


def recap(output: str) -> dict[str, int]:
    m = re.search(rf"^{re.escape(HOST)}\s+:\s+(.*)$", output, re.M)
    assert m, output[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


STANDINS = REPO_ROOT / "scripts" / "testhost-standins.sh"
STANDIN_REPO_URL = "http://10.213.1.1:8765"   # inventory/test's cuda_toolkit_repo_url
DEFAULT_DRIVER = "580.159.04"


def set_driver(addr: str, driver: str | None, compute_cap: str = "10.3") -> None:
    """Set the host's STAND-IN nvidia-smi (8 GPUs, ``driver``; None: remove it) with the
    same script test.sh uses (``scripts/testhost-standins.sh nvidia-smi``)."""
    r = subprocess.run(["bash", str(STANDINS), "nvidia-smi", HOST, driver or "none", compute_cap],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr


def reset_toolkit(addr: str) -> None:
    """Remove what the cuda_toolkit role installs (an earlier deploy may have installed it)."""
    r = ssh(addr, "apt-mark unhold cuda-toolkit-13-0 >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive "
                  "apt-get purge -y -q 'cuda-toolkit-*' cuda-keyring >/dev/null 2>&1; "
                  "rm -f /usr/local/cuda /etc/profile.d/ddtree-cuda.sh /etc/apt/apt.conf.d/51ddtree-cuda-toolkit "
                  "/etc/apt/sources.list.d/cuda-*.list; dpkg-query -W 'cuda-*' 2>/dev/null | wc -l")
    assert r.stdout.strip() == "0", r.stdout + r.stderr


@pytest.fixture(scope="module")
def repo_url(hosts):
    """The stand-in NVIDIA repository that scripts/testhost-standins.sh serves (test.sh starts it)."""
    assert HOST in hosts, f"{HOST} is not up: {hosts}"
    r = subprocess.run(["curl", "-fsS", "-o", "/dev/null", f"{STANDIN_REPO_URL}/debian12/x86_64/Release"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"stand-in repo not served at {STANDIN_REPO_URL}: run scripts/testhost-standins.sh up"
    yield STANDIN_REPO_URL
    set_driver(hosts[HOST], DEFAULT_DRIVER)   # leave the host as test.sh prepared it


@pytest.fixture(scope="module")
def addr(hosts):
    return hosts[HOST]


def test_toolkit_older_than_arch_refused_before_any_change(repo_url, addr):
    set_driver(addr, "580.159.04")
    before = ssh(addr, SNAPSHOT).stdout
    r, _ = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url, "ddtree_toolchain": {"cuda": "12.8"}})
    assert r.returncode != 0
    assert "ddtree_toolchain.cuda = '12.8'" in r.stdout and "sm_103a" in r.stdout and "Fix:" in r.stdout, r.stdout[
        -3000:
    ]
    assert "Traceback" not in r.stdout + r.stderr
    assert recap(r.stdout)["changed"] == 0
    assert ssh(addr, SNAPSHOT).stdout == before


@pytest.mark.parametrize("driver,expect", [
    ("570.124.06", "NVIDIA driver 570.124.06 is too old for CUDA 13.0 (needs >= 580.65.06"),
    (None, "no usable NVIDIA driver: nvidia-smi is not installed"),
])
def test_driver_too_old_or_absent_refused(repo_url, addr, driver, expect):
    set_driver(addr, driver)
    before = ssh(addr, SNAPSHOT).stdout
    r, _ = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url})
    assert r.returncode != 0
    assert expect in r.stdout, r.stdout[-3000:]
    assert recap(r.stdout)["changed"] == 0
    assert ssh(addr, SNAPSHOT).stdout == before


def test_install_held_linked_profile_then_idempotent(repo_url, addr):
    set_driver(addr, "580.159.04")
    reset_toolkit(addr)
    first, t1 = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url})
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-2000:]
    assert recap(first.stdout)["changed"] > 0
    second, t2 = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url})
    print(f"\ncuda_toolkit: first run {t1:.1f} s, second run {t2:.1f} s")
    assert second.returncode == 0 and recap(second.stdout)["changed"] == 0, second.stdout[-4000:]
    assert ssh(addr, "dpkg --get-selections cuda-toolkit-13-0").stdout.split() == ["cuda-toolkit-13-0", "hold"]
    assert ssh(addr, "readlink /usr/local/cuda").stdout.strip() == "/usr/local/cuda-13.0"
    assert ssh(addr, "bash -lc 'command -v ptxas; echo $CUDA_HOME'").stdout.split() == [
        "/usr/local/cuda-13.0/bin/ptxas", "/usr/local/cuda-13.0"]
    assert '"cuda-toolkit-13-0";' in ssh(addr, "cat /etc/apt/apt.conf.d/51ddtree-cuda-toolkit").stdout
    lst = ssh(addr, "cat /etc/apt/sources.list.d/cuda-debian12-x86_64.list").stdout
    assert lst == f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {repo_url}/debian12/x86_64/ /\n"
    # apt verified the stand-in's signature (no [trusted=yes]); an upgrade is refused by the hold
    pol = ssh(addr, "apt-mark showhold; apt-get -s upgrade 2>&1 | grep -c '^Inst cuda' || true").stdout.split()
    assert pol == ["cuda-toolkit-13-0", "0"]
    assert "release 13.0" in ssh(addr, "/usr/local/cuda/bin/ptxas --version").stdout


def test_triton_role_real_ptxas_13_passes_12_8_fails(repo_url, addr):
    r = ssh(addr, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q cuda-toolkit-12-8 >/dev/null 2>&1; "
                  "/usr/local/cuda-12.8/bin/ptxas --version | tail -1")
    assert "cuda_12.8" in flat(r.stdout), r.stdout + r.stderr
    ok, _ = play("playbooks/triton.yml", {"triton_ptxas_path": "/usr/local/cuda-13.0/bin/ptxas"})
    assert ok.returncode == 0, ok.stdout[-4000:]
    assert "ptxas 13.0 (/usr/local/cuda-13.0/bin/ptxas) assembled .version 8.8 .target sm_103a" in flat(ok.stdout)
    bad, _ = play("playbooks/triton.yml", {"triton_ptxas_path": "/usr/local/cuda-12.8/bin/ptxas"})
    assert bad.returncode != 0
    assert "Value 'sm_103a' is not defined for option 'gpu-name'" in flat(bad.stdout), bad.stdout[-4000:]
    assert "Fix:" in flat(bad.stdout)


def test_triton_role_uses_tritons_own_pick_under_the_service_env(addr, tmp_path):
    """Real Triton 3.6.0 in a venv on the host: its own get_ptxas(103) under the rendered env."""
    if not TRITON_WHEEL.exists():
        pytest.fail(f"{TRITON_WHEEL} missing: run scripts/triton-venv.sh (scripts/test.sh does, before pytest)")
    from hostutil import ssh_options

    if (
        ssh(addr, "test -x /opt/triton-venv/bin/python && /opt/triton-venv/bin/python -c 'import triton'").returncode
        != 0
    ):
        cp = subprocess.run(["scp", *ssh_options(), str(TRITON_WHEEL), f"root@{addr}:/tmp/"], capture_output=True,
                            text=True, timeout=300)
        assert cp.returncode == 0, cp.stderr
        r = ssh(addr, f"python3 -m venv /opt/triton-venv && /opt/triton-venv/bin/pip install -q --no-index --no-deps "
                      f"/tmp/{TRITON_WHEEL.name} && rm /tmp/{TRITON_WHEEL.name}")
        assert r.returncode == 0, r.stdout + r.stderr
    venv = {"triton_python": "/opt/triton-venv/bin/python"}
    # Triton unpinned: the plan points both variables at the toolkit's ptxas; Triton uses it.
    r, _ = play("playbooks/triton.yml", venv)
    assert r.returncode == 0, r.stdout[-4000:]
    assert (
        "uses /usr/local/cuda-13.0/bin/ptxas for sm_103a (TRITON_PTXAS_BLACKWELL_PATH=/usr/local/cuda-13.0/bin/ptxas)"
        in flat(r.stdout)
    )
    assert recap(r.stdout)["changed"] == 0  # the check script was installed by the earlier triton run
    # Triton 3.6.0 pinned: no override needed, its bundled ptxas-blackwell (12.9) assembles sm_103a.
    r, _ = play("playbooks/triton.yml", venv, {"ddtree_toolchain": {"triton": "3.6.0"}})
    assert r.returncode == 0, r.stdout[-4000:]
    assert "backends/nvidia/bin/ptxas-blackwell for sm_103a (TRITON_PTXAS_BLACKWELL_PATH=unset)" in flat(r.stdout)
    assert "ptxas 12.9" in flat(r.stdout)
    # An operator override to the 12.8 ptxas is what the service would use: refused.
    r, _ = play(
        "playbooks/triton.yml",
        venv,
        {
            "ddtree_toolchain": {"triton": "3.6.0"},
            "ddtree_service": {
                "name": "sglang",
                "start_timeout_s": 300,
                "env": {"TRITON_PTXAS_BLACKWELL_PATH": "/usr/local/cuda-12.8/bin/ptxas"},
            },
        },
    )
    assert r.returncode != 0
    assert "Value 'sm_103a' is not defined for option 'gpu-name'" in flat(r.stdout), r.stdout[-4000:]


def test_killed_mid_install_then_rerun_converges(repo_url, addr):
    """dpkg is SIGKILLed while it extracts cuda-toolkit-13-0 (a watcher on the host kills it once
    ``ptxas.dpkg-new`` exists), the play fails, the package is left half-installed; the re-run repairs
    dpkg's state and converges, and the run after that is changed=0."""
    reset = ssh(
        addr,
        "apt-mark unhold cuda-toolkit-13-0 >/dev/null; DEBIAN_FRONTEND=noninteractive "
        "apt-get purge -y -q cuda-toolkit-13-0 >/dev/null 2>&1; dpkg-query -W cuda-toolkit-13-0; echo rc=$?",
    )
    assert "rc=1" in reset.stdout, reset.stdout
    watcher = ("rm -f /tmp/ddt-killed; nohup sh -c 'for i in $(seq 60000); do "
               "p=$(pgrep -f \"^/usr/bin/dpkg .*--unpack.*cuda-toolkit-13-0\"); "
               "if [ -n \"$p\" ] && [ -e /usr/local/cuda-13.0/bin/ptxas.dpkg-new ]; then "
               "kill -9 $p; echo $p > /tmp/ddt-killed; exit 0; fi; sleep 0.002; done' "
               ">/dev/null 2>&1 &")
    assert ssh(addr, watcher).returncode == 0
    r, _ = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url})
    killed = ssh(addr, "cat /tmp/ddt-killed").stdout.strip()
    state = ssh(addr, "dpkg-query -W -f='${db:Status-Abbrev}' cuda-toolkit-13-0; echo; dpkg --audit | head -3").stdout
    print(f"\nkilled dpkg pid {killed or '-'} mid-unpack; play rc={r.returncode}; dpkg state after: {state!r}")
    assert killed, "the watcher never saw dpkg unpack cuda-toolkit-13-0"
    assert r.returncode != 0 and state.startswith("iH"), state  # half-installed, dpkg --audit complains
    r, t = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url})
    assert r.returncode == 0, r.stdout[-5000:]
    print(f"re-run after kill converged in {t:.1f} s")
    assert ssh(addr, "dpkg --audit").stdout.strip() == ""
    assert ssh(addr, "dpkg --get-selections cuda-toolkit-13-0").stdout.split() == ["cuda-toolkit-13-0", "hold"]
    assert "release 13.0" in ssh(addr, "/usr/local/cuda/bin/ptxas --version").stdout
    again, _ = play("playbooks/toolkit.yml", {"cuda_toolkit_repo_url": repo_url})
    assert again.returncode == 0 and recap(again.stdout)["changed"] == 0, again.stdout[-4000:]
